"""The images and clips of the chat history, one file per content: ``<folder>/<aa>/<sha256><suffix>``.

A message in the history holds :class:`~engine.media.MediaRef` records; the bytes live here, named
by their SHA-256, so an image attached to several messages (an edit, a regenerated reply, another
chat) is one file, and a reopened chat reads exactly the bytes that were sent. :meth:`MediaStore.put`
writes atomically (temporary sibling, fsync, rename), owner-only like the history; :meth:`load`
reads a file back through :func:`engine.media.load_media` (the same checks as an attachment) and
checks its digest, so a file changed or truncated on disk is refused in one line, never sent.
:meth:`sweep` removes the files no message refers to any more (a deleted chat's), and stray
temporary files.

Core code: the folder is passed in (CONTRIBUTING.md rule 7).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from engine.atomic import PRIVATE_FILE_MODE, PRIVATE_FOLDER_MODE, write_bytes_atomic
from engine.media import Media, MediaError, MediaRef, load_media

__all__ = ["MediaStore"]

log = logging.getLogger(__name__)
_STALE_TMP_S = 3600.0


class MediaStore:
    """The content-addressed files of attachments. Safe to share between threads (each write is a
    rename; two writers of one digest write the same bytes).

    Args:
        folder: where the files live (``Paths.media_dir``; created owner-only on the first write).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, ref: MediaRef | Media) -> Path:
        """Where the bytes of ``ref`` are (or would be) kept."""
        return self.folder / ref.digest[:2] / f"{ref.digest}{ref.suffix}"

    def put(self, media: Media) -> MediaRef:
        """Keeps ``media``'s bytes (once per content) and returns its reference.

        Raises:
            OSError: the folder or the file could not be written (nothing half written stays).
        """
        target = self.path(media)
        with contextlib.suppress(OSError):
            if target.stat().st_size == len(media.data):
                return media.ref
        target.parent.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.folder, PRIVATE_FOLDER_MODE)
        write_bytes_atomic(target, (media.data,), mode=PRIVATE_FILE_MODE)
        return media.ref

    def load(self, ref: MediaRef) -> Media:
        """The attachment ``ref`` names, read and checked again.

        Raises:
            MediaError: the file is gone, or its bytes are not the ones that were attached.
        """
        path = self.path(ref)
        shown = ref.name or path.name
        if not path.is_file():
            raise MediaError(shown, f"its file is missing from the data folder ({path})")
        media = load_media(path, name=ref.name)
        if media.digest != ref.digest:
            raise MediaError(shown, f"its file in the data folder was changed since it was attached ({path})")
        return media

    def digests(self) -> set[str]:
        """Every digest with a file here."""
        found: set[str] = set()
        with contextlib.suppress(OSError):
            for sub in self.folder.iterdir():
                if sub.is_dir() and len(sub.name) == 2:
                    with contextlib.suppress(OSError):
                        found.update(p.name.split(".", 1)[0] for p in sub.iterdir() if not p.name.startswith("."))
        return found

    def sweep(self, keep: Iterable[str]) -> int:
        """Removes every file whose digest is not in ``keep`` (and temporary files an hour old);
        returns how many files went."""
        wanted = set(keep)
        removed = 0
        now = time.time()
        with contextlib.suppress(OSError):
            for sub in list(self.folder.iterdir()):
                if not sub.is_dir() or len(sub.name) != 2:
                    continue
                for path in list(sub.iterdir()):
                    stale = path.name.startswith(".") and path.name.endswith(".tmp")
                    try:
                        if stale and now - path.stat().st_mtime < _STALE_TMP_S:
                            continue
                        if stale or path.name.split(".", 1)[0] not in wanted:
                            path.unlink()
                            removed += 1
                    except OSError as exc:
                        log.warning("%s: could not remove an attachment no chat uses (%s)", path, exc.strerror or exc)
                with contextlib.suppress(OSError):
                    sub.rmdir()  # only when empty
        return removed
