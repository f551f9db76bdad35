"""The history as the chat view reads it: stored messages with their place among their siblings.

:func:`display_thread` runs on the ``glassbox-history`` thread (through ``HistoryService.call``)
and returns frozen :class:`DisplayMessage` snapshots, which the GUI thread then shows (‹ 1/2 ›
navigation between the branches of a reply). A user message's images are read back there too,
from the data folder's ``media/`` (``engine.media_store``; a file gone or changed is left out and
named in ``media_missing``), so the GUI thread never reads a file.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.media import MediaError

if TYPE_CHECKING:
    from engine.history import HistoryStore
    from engine.media import Media, MediaRef

log = logging.getLogger(__name__)
_CACHE_LIMIT = 64 * 2**20
_cache: OrderedDict[str, Media] = OrderedDict()  # digest -> media read lately (the history thread's)


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
    media: tuple[Media, ...] = ()
    media_missing: tuple[str, ...] = ()  # what could not be read back, one line each

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
    folder = media_folder(store.path)
    for message in store.thread(conversation_id):
        siblings = tuple(s.id for s in store.siblings(message.id))
        media, missing = read_media_refs(folder, message.media)
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
                media=media,
                media_missing=missing,
            )
        )
    return out


def media_folder(history_db: Path) -> Path:
    """The attachments' folder beside the history (``app.paths.Paths.media``)."""
    return history_db.parent / "media"


def read_media_refs(folder: Path, refs: tuple[MediaRef, ...]) -> tuple[tuple[Media, ...], tuple[str, ...]]:
    """The attachments a message names, read back and checked (a few recent ones kept in memory)."""
    if not refs:
        return (), ()
    # lazy: start-up (+3 ms)
    from engine.media_store import MediaStore

    store = MediaStore(folder)
    loaded: list[Media] = []
    missing: list[str] = []
    for ref in refs:
        cached = _cache.get(ref.digest)
        if cached is not None:
            _cache.move_to_end(ref.digest)
            loaded.append(cached)
            continue
        try:
            media = store.load(ref)
        except MediaError as exc:
            log.warning("%s", exc)
            missing.append(str(exc))
            continue
        loaded.append(media)
        _cache[ref.digest] = media
        while sum(len(m.data) for m in _cache.values()) > _CACHE_LIMIT and len(_cache) > 1:
            _cache.popitem(last=False)
    return tuple(loaded), tuple(missing)
