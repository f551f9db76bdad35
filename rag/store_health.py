"""Is the local Chroma folder readable? Checked in a killable child process, cached by a fingerprint.

Contract: ARCHITECTURE.md, 'rag.store_health'.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rag.errors import KnowledgeBaseError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
SQLITE_NAME = "chroma.sqlite3"
_FINGERPRINT_VERSION = 1
_DAMAGED_INFIX = ".damaged-"

# hnswlib's header.bin as Chroma's fork writes it (format 1): version, offsetLevel0,
# max_elements, cur_element_count, size_data_per_element, label_offset, offsetData, maxlevel,
# enterpoint_node, maxM, maxM0, M, mult, ef_construction.
_HEADER = struct.Struct("<i6QiI3QdQ")

ChildTarget = Callable[[Connection, str], None]
Fingerprint = dict[str, list[int]]


@dataclass(frozen=True)
class StoreRecovery:
    """What happened to a damaged store: why it was judged damaged and where it was moved."""

    reason: str
    moved_to: Path


# ------------------------------------------------------------------ fingerprint


def fingerprint_path(folder: Path) -> Path:
    """The JSON file beside ``folder`` that remembers its last good fingerprint."""
    return folder.with_name(folder.name + ".healthy.json")


def fingerprint(folder: Path) -> Fingerprint:
    """``relative name -> [size, mtime_ns]`` of every file under ``folder`` (empty if none)."""
    found: Fingerprint = {}
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(top, name)
            try:
                st = path.stat()
            except OSError:
                continue  # vanished meanwhile: the fingerprint then simply does not match
            found[path.relative_to(folder).as_posix()] = [st.st_size, st.st_mtime_ns]
    return found


def remember_healthy(folder: Path) -> None:
    """Records ``folder``'s current fingerprint as good (written atomically; errors are logged)."""
    target = fingerprint_path(folder)
    temp = target.with_name(target.name + ".tmp")
    try:
        temp.write_text(json.dumps({"version": _FINGERPRINT_VERSION, "files": fingerprint(folder)}), encoding="utf-8")
        os.replace(temp, target)
    except OSError as exc:
        log.warning("%s: could not record the index check (%s)", target, exc.strerror or exc)


def forget_healthy(folder: Path) -> None:
    """Drops the remembered fingerprint, so the next check runs the child."""
    with contextlib.suppress(FileNotFoundError):
        fingerprint_path(folder).unlink()


def known_healthy(folder: Path) -> bool:
    """True when ``folder`` is missing, empty, or exactly as it was when last found good: then
    :func:`check_store` would return None without a child, and opening the store can wait."""
    current = fingerprint(folder)
    return not current or _known_healthy(folder, current)


def _known_healthy(folder: Path, current: Fingerprint) -> bool:
    try:
        saved: Any = json.loads(fingerprint_path(folder).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and saved.get("version") == _FINGERPRINT_VERSION and saved.get("files") == current


# ------------------------------------------------------------------ checks


def file_problem(folder: Path) -> str | None:
    """Cheap checks in this process: the SQLite file exists, and every HNSW segment's header is
    sane and its ``data_level0.bin`` as long as the header says.

    Returns:
        None, or a one-line reason naming the file.
    """
    segments = sorted(p.parent for p in folder.glob("*/header.bin"))
    if segments and not (folder / SQLITE_NAME).is_file():
        return f"{SQLITE_NAME} is missing"
    for segment in segments:
        problem = _segment_problem(segment)
        if problem is not None:
            return f"{segment.name}/{problem}"
    return None


def _segment_problem(segment: Path) -> str | None:
    try:
        header = (segment / "header.bin").read_bytes()
        data_size = (segment / "data_level0.bin").stat().st_size
    except FileNotFoundError as exc:
        return f"{Path(str(exc.filename)).name} is missing"
    except OSError as exc:
        return f"{Path(str(exc.filename or segment)).name} cannot be read ({exc.strerror or exc})"
    if len(header) < _HEADER.size:
        return f"header.bin is truncated ({len(header)} bytes)"
    (version, offset_level0, max_elements, count, per_element, label_offset, offset_data, _maxlevel,
     _enterpoint, max_m, max_m0, m, _mult, ef_construction) = _HEADER.unpack_from(header)  # fmt: skip
    sane = (
        version == 1
        and offset_level0 == 0
        and 0 < m == max_m
        and max_m0 == 2 * m
        and offset_data == 4 * max_m0 + 4
        and label_offset == per_element - 8
        and label_offset > offset_data
        and (label_offset - offset_data) % 4 == 0
        and count <= max_elements
        and ef_construction > 0
    )
    if not sane:
        return "header.bin is not a valid HNSW header"
    if data_size == 0 or data_size % per_element or data_size < count * per_element:
        return f"data_level0.bin is truncated ({data_size} bytes for {count} vectors)"
    return None


def _probe_main(conn: Connection, folder: str) -> None:
    """The child: opens the store and reads every collection; replies ``("ok"|"error", reason)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the parent's to handle; it kills us
    conn.send(("ready", None))
    try:
        _probe(Path(folder))
    # Whatever chromadb raises on a damaged folder is the answer, not a bug to propagate.
    except Exception as exc:  # noqa: BLE001
        conn.send(("error", " ".join(str(exc).split())[:300] or type(exc).__name__))
    else:
        conn.send(("ok", None))
    conn.close()


def _probe(folder: Path) -> None:
    # lazy: heavy (chromadb); start-up (+95 ms: numpy)
    import chromadb
    import numpy as np
    from chromadb.config import Settings

    client = chromadb.PersistentClient(
        path=str(folder), settings=Settings(anonymized_telemetry=False, allow_reset=False)
    )
    for collection in client.list_collections():
        count = collection.count()
        got = collection.get(limit=1, include=["embeddings"])
        if count == 0:
            continue
        embeddings = got.get("embeddings")
        if embeddings is None or len(embeddings) == 0:
            raise KnowledgeBaseError(f"collection {collection.name} holds {count} vectors but returns none")
        vector = np.asarray(embeddings[0], dtype=np.float32).reshape(1, -1)
        dimension = (collection.metadata or {}).get("dimension")
        if dimension is not None and vector.shape[1] != dimension:
            raise KnowledgeBaseError(
                f"collection {collection.name} returns {vector.shape[1]}-d vectors, not {dimension}"
            )
        found = collection.query(query_embeddings=vector, n_results=min(count, 10), include=["distances"])
        if not found["ids"] or not found["ids"][0]:
            raise KnowledgeBaseError(f"collection {collection.name} holds {count} vectors but a query finds none")


def probe(folder: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, target: ChildTarget = _probe_main) -> str | None:
    """Opens the store in a spawned child and reads every collection, killing it past ``timeout_s``.

    Args:
        folder: the Chroma folder.
        timeout_s: the time the child has, after it started, to open and read the store.
        target: the child's function, module-level (tests pass ones that hang or crash).

    Returns:
        None when the store answered, else a one-line reason. A child that could not even start
        is not the store's fault: that is logged and None returned.
    """
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    process = ctx.Process(target=target, args=(child_conn, str(folder)), name="glassbox-index-check", daemon=True)
    try:
        process.start()
    except OSError as exc:
        log.warning("%s: the index check could not start (%s)", folder, exc)
        return None
    child_conn.close()
    try:
        return _await_verdict(parent_conn, process, timeout_s, folder)
    finally:
        parent_conn.close()
        if process.is_alive():
            process.kill()
        process.join(5)
        if process.exitcode is not None:
            process.close()


def _await_verdict(
    conn: Connection, process: multiprocessing.process.BaseProcess, timeout_s: float, folder: Path
) -> str | None:
    try:
        # The handshake tells "the child never came up" apart from "the store hangs or crashes it".
        if not conn.poll(max(timeout_s, DEFAULT_TIMEOUT_S)):
            log.warning("%s: the index check did not start", folder)
            return None
        conn.recv()
    except (EOFError, OSError):
        process.join(2)
        log.warning("%s: the index check did not start (%s)", folder, _exit_text(process.exitcode))
        return None
    deadline = time.monotonic() + timeout_s
    try:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            return f"the check timed out (after {timeout_s:g} s)"
        status, reason = conn.recv()
    except (EOFError, OSError):
        process.join(2)
        return f"the check crashed ({_exit_text(process.exitcode)})"
    return None if status == "ok" else f"chroma index unreadable: {reason}"


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def check_store(folder: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, target: ChildTarget = _probe_main) -> str | None:
    """Checks a local Chroma folder, skipping the child while the folder is as last found good.

    Args:
        folder: the Chroma folder (missing or empty is healthy).
        timeout_s: the child's time limit.
        target: the child's function (tests only).

    Returns:
        None when healthy, else a one-line reason such as ``"chroma index unreadable: ..."``,
        ``"the check crashed (killed by SIGSEGV)"`` or ``"the check timed out (after 60 s)"``.
    """
    current = fingerprint(folder)
    if not current or _known_healthy(folder, current):
        return None
    problem = file_problem(folder)
    if problem is not None:
        return f"chroma index unreadable: {problem}"
    reason = probe(folder, timeout_s=timeout_s, target=target)
    if reason is None:
        remember_healthy(folder)  # after the child: opening the store may have touched its files
    return reason


# ------------------------------------------------------------------ recovery


def set_aside(folder: Path) -> Path:
    """Moves a damaged folder to ``<name>.damaged-<UTC time>`` beside it, keeping only that copy.

    Returns:
        Where it went.

    Raises:
        KnowledgeBaseError: it cannot be moved (the caller must not use it then).
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = folder.with_name(f"{folder.name}{_DAMAGED_INFIX}{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}{_DAMAGED_INFIX}{stamp}-{n}")
    try:
        folder.rename(target)
    except OSError as exc:
        raise KnowledgeBaseError(f"{folder}: the damaged index cannot be moved aside ({exc.strerror or exc})") from exc
    forget_healthy(folder)
    for older in folder.parent.glob(f"{folder.name}{_DAMAGED_INFIX}*"):
        if older == target:
            continue
        if older.is_dir():
            shutil.rmtree(older, onerror=_log_rmtree_error)
        else:
            older.unlink(missing_ok=True)
    return target


def _log_rmtree_error(_fn: object, path: str, exc_info: Any) -> None:
    log.warning("%s: could not delete an old damaged index (%s)", path, exc_info[1])


def recover_if_damaged(
    folder: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, target: ChildTarget = _probe_main
) -> StoreRecovery | None:
    """Checks the folder and, when damaged, moves it aside so a fresh store can be built there.

    Returns:
        None when healthy, else the reason and where the damaged folder went.

    Raises:
        KnowledgeBaseError: damaged, and it cannot be moved aside.
    """
    reason = check_store(folder, timeout_s=timeout_s, target=target)
    if reason is None:
        return None
    log.warning("%s: %s; moving it aside and rebuilding", folder, reason)
    return StoreRecovery(reason, set_aside(folder))


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "StoreRecovery",
    "check_store",
    "file_problem",
    "fingerprint",
    "fingerprint_path",
    "forget_healthy",
    "probe",
    "recover_if_damaged",
    "remember_healthy",
    "set_aside",
]
