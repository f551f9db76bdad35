"""The history as the chat view reads it: stored messages with their place among their siblings.

:func:`display_thread` runs on the ``glassbox-history`` thread (through ``HistoryService.call``)
and returns frozen :class:`DisplayMessage` snapshots, which the GUI thread then shows (‹ 1/2 ›
navigation between the branches of a reply).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.history import HistoryStore


@dataclass(frozen=True)
class DisplayMessage:
    """A stored message plus its place among its siblings (for ‹ 1/2 › navigation)."""

    id: int
    parent_id: int | None
    role: str
    content: str
    state: str
    stats: dict[str, Any] | None
    sources: list[dict[str, Any]] | None
    model: str | None
    error: str | None
    sibling_ids: tuple[int, ...]

    @property
    def sibling_index(self) -> int:
        """0-based position of this message among its siblings."""
        return self.sibling_ids.index(self.id) if self.id in self.sibling_ids else 0

    @property
    def sibling_count(self) -> int:
        return max(len(self.sibling_ids), 1)


def display_thread(store: HistoryStore, conversation_id: int) -> list[DisplayMessage]:
    """The current branch of a conversation with sibling information (runs on the history thread)."""
    out: list[DisplayMessage] = []
    for message in store.thread(conversation_id):
        siblings = tuple(s.id for s in store.siblings(message.id))
        out.append(
            DisplayMessage(
                id=message.id,
                parent_id=message.parent_id,
                role=message.role,
                content=message.content,
                state=message.state,
                stats=message.stats,
                sources=message.sources,
                model=message.model,
                error=message.error,
                sibling_ids=siblings or (message.id,),
            )
        )
    return out
