"""The tests' one fake chat backend: a complete ``engine.inference.backends.ChatBackend``.

mypy checks it against the protocol like the real backends (``make lint`` runs mypy on this file;
the assignment at the end is the proof), so a test can never drive the app with a backend that
lacks a keyword the engine's backends take. A test's own backend subclasses :class:`FakeBackend`
and writes only its :meth:`FakeBackend.script`: what one generation streams for the
:class:`StreamCall` it was asked, which records every argument of ``stream``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Self

from engine.inference.context import (
    DEFAULT_DOCUMENTS_WINDOW,
    NO_DOCUMENTS,
    Message,
    OverflowPolicy,
    RankedDocuments,
    fit_documents,
)
from engine.inference.events import Event, Finished, Stats, Token
from engine.inference.kv_cache import KvKey
from engine.inference.runtime import GenerationParams, ModelInfo
from engine.inference.session import PromptView
from engine.inference.tools import ToolSpec
from engine.media import Media

if TYPE_CHECKING:
    from engine.inference.backends import LocalBackend
    from engine.inference.remote import RemoteInfo


@dataclass(frozen=True)
class StreamCall:
    """The arguments of one ``stream`` call; ``documents`` is the block the documents band kept of
    the passages given (fitted as the engine fits them: ``engine.inference.context.fit_documents``
    with this backend's window and counter), ``documents_kept`` and ``documents_dropped`` its counts."""

    history: list[Message]
    user: str | None
    params: GenerationParams
    system: str | None = None
    documents: str | None = None
    cancel: threading.Event | None = field(default=None, compare=False)
    cache_key: KvKey | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    thinking: bool | None = None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None
    media: tuple[Media, ...] = ()
    documents_kept: int = 0
    documents_dropped: int = 0

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools offered."""
        return [spec.name for spec in self.tools]

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


def fake_model_info(n_ctx: int = 4096, n_vocab: int = 100, path: str = "fake.gguf") -> ModelInfo:
    """What a fake local model reports on ``load``."""
    return ModelInfo(
        path=path,
        architecture="fake",
        n_ctx=n_ctx,
        n_ctx_train=2048,
        n_vocab=n_vocab,
        n_params=1000,
        model_bytes=123_456_789,
        n_layers=2,
        n_gpu_layers=0,
        gpu_offload_supported=False,
        bos_token=None,
        eos_token=None,
        add_bos=False,
        chat_template=None,
    )


class FakeBackend:
    """Answers every turn from :meth:`script`, records each call in :attr:`calls`.

    Args:
        n_ctx: the window it reports.
        n_vocab: the vocabulary it reports (None: it does not say, as a server).
        model_id: its server name ("" for a local file).
        thinking_controls: the template switches it says it has.
        info: what ``load`` reports (a fake local ``ModelInfo`` by default).

    Tokens are counted as words (:meth:`count_text`); ``result_room`` cannot be measured (None),
    as for a server; ``local`` is None unless a subclass has local features.
    """

    overflow_policy: OverflowPolicy = "rolling"
    reply_reserve: int = 512

    def __init__(
        self,
        *,
        n_ctx: int = 4096,
        n_vocab: int | None = 100,
        model_id: str = "",
        thinking_controls: frozenset[str] = frozenset(),
        info: ModelInfo | RemoteInfo | None = None,
    ) -> None:
        self.calls: list[StreamCall] = []
        self.closed = False
        self.loads = 0
        self._n_ctx = n_ctx
        self._n_vocab = n_vocab
        self._model_id = model_id
        self._thinking_controls = thinking_controls
        self._info = info

    # what the model is ----------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_vocab(self) -> int | None:
        return self._n_vocab

    @property
    def thinking_controls(self) -> frozenset[str]:
        return self._thinking_controls

    @property
    def local(self) -> LocalBackend | None:
        return None

    @property
    def info(self) -> ModelInfo | RemoteInfo:
        return self._info if self._info is not None else fake_model_info(self._n_ctx, self._n_vocab or 100)

    # lifetime -------------------------------------------------------------------------------
    def load(self, cancel: threading.Event | None = None) -> ModelInfo | RemoteInfo:
        self.loads += 1
        return self.info

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # tokens ---------------------------------------------------------------------------------
    def count_text(self, text: str) -> int:
        return len(text.split())

    def prompt_view(self) -> PromptView:
        return PromptView([], [])

    def result_room(
        self,
        messages: Sequence[Message],
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
    ) -> int | None:
        return None

    # generation -----------------------------------------------------------------------------
    def stream(
        self,
        history: Sequence[Message],
        user: str | None,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        cancel: threading.Event | None = None,
        cache_key: KvKey | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
        thinking_budget: int | None = None,
        media: Sequence[Media] = (),
    ) -> Iterator[Event]:
        window = self._n_ctx or DEFAULT_DOCUMENTS_WINDOW
        fit = fit_documents(documents, window, self.count_text) if documents is not None else NO_DOCUMENTS
        call = StreamCall(
            list(history),
            user,
            params or GenerationParams(),
            system,
            fit.text,
            cancel,
            cache_key,
            tuple(tools),
            tool_choice,
            thinking,
            reasoning_effort,
            thinking_budget,
            tuple(media),
            fit.kept,
            fit.dropped,
        )
        self.calls.append(call)
        return _with_documents(self.script(call), fit.kept, fit.dropped)

    def script(self, call: StreamCall) -> Iterator[Event]:
        """What one generation streams: by default "ok" and its Stats (a subclass writes its own)."""
        stats = self.stats(call, completion_tokens=1)
        yield Token("ok", 1)
        yield stats
        yield Finished("stop", stats, "ok")

    def stats(self, call: StreamCall, completion_tokens: int = 0, **fields: object) -> Stats:
        """Stats for a reply to ``call``: the window, prompt tokens counted as words."""
        words = sum(self.count_text(m.content) for m in call.history) + self.count_text(call.user or "")
        base: dict[str, object] = {
            "n_ctx": self._n_ctx,
            "prompt_tokens": words + 1,
            "completion_tokens": completion_tokens,
            "context_used": words + 1 + completion_tokens,
        }
        base.update(fields)
        return Stats(**base)  # type: ignore[arg-type]


def _with_documents(events: Iterator[Event], kept: int, dropped: int) -> Iterator[Event]:
    """A script's events with the documents band's counts in its Stats, as the engine reports them."""
    for event in events:
        if isinstance(event, Stats) and (kept or dropped):
            event = dataclasses.replace(event, documents_kept=kept, documents_dropped=dropped)
        elif isinstance(event, Finished) and (kept or dropped):
            stats = dataclasses.replace(event.stats, documents_kept=kept, documents_dropped=dropped)
            event = dataclasses.replace(event, stats=stats)
        yield event


if TYPE_CHECKING:
    from engine.inference.backends import ChatBackend

    _fake: type[ChatBackend] = FakeBackend  # mypy: the fake keeps the protocol, keyword for keyword
