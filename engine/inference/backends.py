"""What the app needs from a chat backend, local or remote.

:class:`~engine.inference.session.ChatSession` (a GGUF in a local worker process) and
:class:`~engine.inference.remote.RemoteSession` (a model on an OpenAI-compatible server) both satisfy
:class:`ChatBackend` structurally, so the chat adapter, the CLI, the agent loop
(:mod:`engine.agent.loop`) and ``glassbox serve`` can hold either and stream the same events
(:mod:`engine.inference.events`) from it. The assignments at the end of this module make mypy prove it: a
backend whose ``stream`` drops or renames a keyword fails ``mypy engine``.

What only a local model has (raw-prompt ``complete``, ``result_room``, the worker) is not part of
the Protocol; callers that use it check for it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from engine.inference.context import Message
from engine.inference.events import Event
from engine.inference.kv_cache import KvKey
from engine.inference.runtime import GenerationParams
from engine.inference.session import PromptView
from engine.inference.tools import ToolSpec


@runtime_checkable
class ChatBackend(Protocol):
    """A model that answers chat turns with a stream of typed events.

    ``stream`` ends with :class:`~engine.inference.events.Finished` (preceded by
    :class:`~engine.inference.events.Stats`); it raises the engine's typed errors. ``load`` is idempotent and
    reports what it loaded (a ``ModelInfo`` locally, a ``RemoteInfo`` for a server).
    """

    def load(self, cancel: threading.Event | None = None) -> object:
        """Makes the model ready (loads it, or checks the server offers it)."""
        ...

    def stream(
        self,
        history: Sequence[Message],
        user: str | None,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: str | None = None,
        cancel: threading.Event | None = None,
        cache_key: KvKey | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
        thinking_budget: int | None = None,
    ) -> Iterator[Event]:
        """Generates the reply to ``user`` after ``history`` (``user=None``: continues the last
        turn, after a ``tool`` message).

        ``cache_key`` names the conversation's saved KV cache (a server keeps its own);
        ``tools`` are offered under ``tool_choice`` (``auto``, ``none``, ``required`` or a function
        name); ``thinking`` and ``reasoning_effort`` are the template's switches;
        ``thinking_budget`` caps the thinking in tokens (a backend that cannot raises EngineError).
        """
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

    # Never run: mypy proves here that both sessions satisfy ChatBackend, keyword for keyword.
    _local: type[ChatBackend] = ChatSession
    _remote: type[ChatBackend] = RemoteSession
