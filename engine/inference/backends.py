"""What the app needs from a chat backend, local or remote (ARCHITECTURE.md, "Engine events").

:class:`~engine.inference.session.ChatSession` (a GGUF in a local worker process) and
:class:`~engine.inference.remote.RemoteSession` (a model on an OpenAI-compatible server) both satisfy
:class:`ChatBackend`; what only a local model has is :class:`LocalBackend`, reached through
``ChatBackend.local`` (None for a server). The assignments at the end make mypy prove both
sessions keep the shape, keyword for keyword; the tests' shared fake is checked the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from engine.inference.adapters import LoraAdapter
from engine.inference.context import Message, OverflowPolicy, RankedDocuments
from engine.inference.events import Event, PrefillProgress
from engine.inference.kv_cache import KvKey
from engine.inference.runtime import GenerationParams, ModelInfo
from engine.inference.session import PromptView
from engine.inference.tools import ToolSpec
from engine.media import Media

if TYPE_CHECKING:
    from engine.inference.base_compare import BaseComparison
    from engine.inference.projector import MediaInfo
    from engine.inference.remote import RemoteInfo
    from engine.inference.templates import ChatTemplate


class LocalBackend(Protocol):
    """What only a model in a local worker process has (``ChatSession.local`` is the session)."""

    backend_note: str | None
    """One line when the load had to fall back (a CPU variant that crashed, AMX refused)."""
    machine_bandwidth_gbps: float | None
    """This machine's measured memory bandwidth, reported in Stats (set once it is measured)."""

    @property
    def template(self) -> ChatTemplate | None:
        """The chat template chosen at load (None before)."""
        ...

    @property
    def worker_pid(self) -> int | None:
        """The inference worker's process id (None while none runs)."""
        ...

    @property
    def worker_alive(self) -> bool:
        """Whether its worker process runs (False before the load and after a crash)."""
        ...

    def kill_worker(self, timeout: float = 1.0) -> None:
        """Ends the worker process now (the last resort at exit; the next call starts another)."""
        ...

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        """A text's tokens (llama.cpp's ``/tokenize``): special tokens parsed unless ``special`` is
        false, a BOS first when ``add_bos`` and the model wants one."""
        ...

    def token_bytes(self, tokens: Sequence[int]) -> list[bytes]:
        """The bytes of each token, special tokens as their text (llama.cpp's ``/detokenize``)."""
        ...

    @property
    def adapters(self) -> tuple[LoraAdapter, ...]:
        """The LoRA adapters the next turns run with (empty: the base model)."""
        ...

    def set_adapters(self, adapters: Sequence[LoraAdapter]) -> None:
        """Runs the next turns with ``adapters``, without reloading the model (engine.inference.adapters);
        raises AdapterMismatch or ModelFileError for a file that does not fit."""
        ...

    def tokenize_prompt(self, text: str) -> list[int]:
        """A raw prompt's tokens as the model reads it (a BOS first where the model wants one)."""
        ...

    def compare_base(
        self,
        history: Sequence[Message],
        user: str | None,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        cancel: threading.Event | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
        media: Sequence[Media] = (),
        progress: Callable[[PrefillProgress], None] | None = None,
    ) -> BaseComparison:
        """The reply to ``user`` decoded greedily with the adapters and without them, the state put
        back after (engine.inference.base_compare); raises ``Cancelled`` when stopped first."""
        ...

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        """The text of each token."""
        ...

    def complete(
        self,
        prompt: str | Sequence[int],
        params: GenerationParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Generates from a raw prompt: no chat template, no tools, no reply shaping."""
        ...

    def media_info(self, media: Sequence[Media]) -> list[MediaInfo]:
        """What each image or clip costs this model (the projector's own count), before a send.
        Raises ``engine.media.MediaError`` when the model cannot see it (no projector)."""
        ...


@runtime_checkable
class ChatBackend(Protocol):
    """A model that answers chat turns with a stream of typed events.

    ``stream`` ends with :class:`~engine.inference.events.Finished` (preceded by
    :class:`~engine.inference.events.Stats`); it raises the engine's typed errors. ``load`` is
    idempotent and reports what it loaded.
    """

    overflow_policy: OverflowPolicy
    """``"rolling"`` drops the oldest turns that do not fit; ``"refuse"`` raises ContextOverflow."""
    reply_reserve: int
    """Tokens kept free for the reply."""

    @property
    def model_id(self) -> str:
        """The name a server knows the model by ("" for a local file)."""
        ...

    @property
    def n_ctx(self) -> int:
        """The context window in tokens; 0 while unknown (not loaded, or a server that does not say)."""
        ...

    @property
    def n_vocab(self) -> int | None:
        """The vocabulary size (to check ``logit_bias``); None where the backend does not say."""
        ...

    @property
    def thinking_controls(self) -> frozenset[str]:
        """The template's thinking switches (``enable_thinking``, ``reasoning_effort``...)."""
        ...

    @property
    def local(self) -> LocalBackend | None:
        """The local model's own features, or None for a model on a server."""
        ...

    def load(self, cancel: threading.Event | None = None) -> ModelInfo | RemoteInfo:
        """Makes the model ready (loads it, or checks the server offers it)."""
        ...

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
        """Generates the reply to ``user`` after ``history`` (``user=None``: continues the last
        turn, after a ``tool`` message).

        ``documents`` are the retrieved passages, best first, not fitted: the backend's documents
        band keeps the best that fit its window (the Stats say how many it kept and dropped);
        ``cache_key`` names the conversation's saved KV cache (ignored where none is kept);
        ``tools`` are offered under ``tool_choice`` (``auto``, ``none``, ``required`` or a function
        name); ``thinking`` and ``reasoning_effort`` are the template's switches;
        ``thinking_budget`` caps the thinking in tokens (a backend that cannot raises EngineError);
        ``media`` are the images and clips attached to ``user`` (a local model without a projector
        raises :class:`~engine.media.MediaError`; a server gets them as content parts).
        """
        ...

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
        """Tokens left in the window after ``messages`` and the reply reserve (negative: they do
        not fit); None where the backend cannot measure the prompt (a server's template)."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens of a plain text (estimated for servers without a tokenizer)."""
        ...

    def prompt_view(self) -> PromptView:
        """The last prompt's tokens and their text (empty where the backend does not show them)."""
        ...

    def close(self) -> None:
        """Releases the model or the connection."""
        ...

    def __enter__(self) -> Self:
        """The backend itself; leaving the ``with`` closes it."""
        ...

    def __exit__(self, *exc: object) -> None:
        """Closes the backend."""
        ...


if TYPE_CHECKING:
    from engine.inference.remote import RemoteSession
    from engine.inference.session import ChatSession

    # Never run: mypy proves here that both sessions satisfy the protocols, keyword for keyword.
    _local: type[ChatBackend] = ChatSession
    _local_features: type[LocalBackend] = ChatSession
    _remote: type[ChatBackend] = RemoteSession
