"""What the app needs from a chat backend, local or remote.

:class:`~engine.session.ChatSession` (a GGUF in a local worker process) and
:class:`~engine.remote.RemoteSession` (a model on an OpenAI-compatible server) both satisfy
:class:`ChatBackend` structurally, so the chat adapter, the CLI and ``glassbox serve`` can hold either
and stream the same events (:mod:`engine.events`) from it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.context import Message
from engine.events import Event
from engine.runtime import GenerationParams


@runtime_checkable
class ChatBackend(Protocol):
    """A model that answers chat turns with a stream of typed events.

    ``stream`` ends with :class:`~engine.events.Finished` (preceded by
    :class:`~engine.events.Stats`); it raises the engine's typed errors. ``load`` is idempotent and
    reports what it loaded (a ``ModelInfo`` locally, a ``RemoteInfo`` for a server).
    """

    def load(self, cancel: threading.Event | None = None) -> object:
        """Makes the model ready (loads it, or checks the server offers it)."""
        ...

    def stream(
        self,
        history: Sequence[Message],
        user: str,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Generates the reply to ``user`` after ``history``."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens of a plain text (estimated for servers without a tokenizer)."""
        ...

    def close(self) -> None:
        """Releases the model or the connection."""
        ...


if TYPE_CHECKING:
    from engine.remote import RemoteSession
    from engine.session import ChatSession


def _both_backends_conform(local: ChatSession, remote: RemoteSession) -> tuple[ChatBackend, ChatBackend]:
    """Never called: mypy proves here that both sessions satisfy :class:`ChatBackend`."""
    return local, remote
