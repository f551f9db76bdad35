"""The KV cache saved with each chat: llama.cpp's sequence state on disk, keyed by conversation.

Contract: ARCHITECTURE.md, 'engine.inference.kv_cache'.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from engine.atomic import PRIVATE_FILE_MODE, PRIVATE_FOLDER_MODE, write_bytes_atomic

if TYPE_CHECKING:
    from engine.inference.seq_memory import Checkpoint

log = logging.getLogger(__name__)

MAGIC: Final = b"GBKV-CACHE\n"
FORMAT_VERSION: Final = 1
SUFFIX: Final = ".kv"
DEFAULT_MAX_BYTES: Final = 4 * 2**30
"""The default size cap of the saved caches (4 GiB, as Settings' default ``kv_cache_max_gb``)."""
MIN_GAIN_TOKENS: Final = 16
"""A saved state is loaded only when it saves prefilling at least this many tokens."""
_HEADER_MAX: Final = 64 * 1024
_LEN = struct.Struct("<I")
_WINDOW: Final = 1024 * 1024
_STALE_TMP_S: Final = 3600.0


# ----------------------------------------------------------------------------- keys and identity
@dataclass(frozen=True)
class KvKey:
    """Which saved cache a turn belongs to.

    Args:
        conversation: the conversation (its history id, as text).
        branch: the branch within it (in the app: the id of the reply the turn writes; a later
            turn of the same branch supersedes it). Empty for a conversation without branches.
    """

    conversation: str
    branch: str = ""


@dataclass(frozen=True)
class KvCacheConfig:
    """Where the saved caches live and how much room they may take (``max_bytes`` 0: none saved)."""

    folder: Path
    max_bytes: int = DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class KvRequest:
    """What the parent tells the worker before a turn (crosses the pipe: plain, picklable).

    Args:
        config: the folder and the cap.
        key: the conversation and branch.
        template: the chat template's identity (source, name and a digest of its text).
    """

    config: KvCacheConfig
    key: KvKey
    template: str


@dataclass(frozen=True)
class KvIdentity:
    """What a saved state is valid for; a file with any other identity is removed, never loaded."""

    model: str
    n_ctx: int
    cache_type: str
    template: str
    runtime: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_fingerprint(path: Path) -> str:
    """A cheap, stable identity of a model file's content (the module docstring says what it covers).

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        digest.update(str(size).encode())
        for offset in sorted({0, max(size // 2 - _WINDOW // 2, 0), max(size - _WINDOW, 0)}):
            fh.seek(offset)
            digest.update(fh.read(_WINDOW))
    return f"{size}:{digest.hexdigest()[:32]}"


def _name_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ----------------------------------------------------------------------------- the store
@dataclass(frozen=True)
class KvEntry:
    """A saved cache whose header matched (the state itself is checked when it is loaded)."""

    path: Path
    tokens: list[int]
    state_bytes: int
    offset: int
    digest: str
    file_id: tuple[int, int] = (0, 0)  # (device, inode) as read: a file replaced since is not this entry


class KvCacheStore:
    """The folder of saved caches: save, find, load, evict, clear. Safe to share between threads.

    Args:
        folder: where the files live (created owner-only on the first save).
        max_bytes: the size cap; the least recently used files go first.
    """

    def __init__(self, folder: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self._lock = threading.RLock()

    def path_for(self, key: KvKey) -> Path:
        return self.folder / f"{_name_hash(key.conversation)}-{_name_hash(key.branch)}{SUFFIX}"

    def files(self) -> list[Path]:
        """Every saved cache file (any conversation, any identity)."""
        try:
            return sorted(p for p in self.folder.iterdir() if p.suffix == SUFFIX and p.is_file())
        except OSError:
            return []

    def usage(self) -> tuple[int, int]:
        """``(files, bytes)`` of the saved caches."""
        sizes = [_size(p) for p in self.files()]
        return len(sizes), sum(sizes)

    def clear(self) -> int:
        """Removes every saved cache (and leftover temporary files); returns the bytes freed."""
        freed = 0
        with self._lock:
            try:
                names = list(self.folder.iterdir())
            except OSError:
                return 0
            for path in names:
                if path.suffix == SUFFIX or (path.name.startswith(".") and path.name.endswith(".tmp")):
                    size = _size(path)
                    if _remove(path, None):
                        freed += size
        return freed

    def remove_conversation(self, conversation: str) -> int:
        """Removes every saved cache of one conversation (it was deleted: its tokens go with it);
        returns the bytes freed."""
        freed = 0
        with self._lock:
            for path in self._conversation_files(conversation):
                size = _size(path)
                if _remove(path, "its conversation was deleted"):
                    freed += size
        return freed

    # saving ---------------------------------------------------------------------------
    def save(self, key: KvKey, identity: KvIdentity, tokens: Sequence[int], state: bytes | bytearray) -> int:
        """Writes one conversation branch's state atomically, then supersedes and evicts.

        Returns:
            The bytes written (0 when the cap is 0 or the file alone is over the cap).

        Raises:
            OSError: the folder or the file could not be written (the old file, if any, is intact).
        """
        if self.max_bytes <= 0 or not tokens:
            return 0
        token_bytes = struct.pack(f"<{len(tokens)}i", *tokens)
        digest = hashlib.sha256(token_bytes)
        digest.update(state)
        header = json.dumps(
            {
                "version": FORMAT_VERSION,
                "identity": identity.to_dict(),
                "conversation": key.conversation,
                "branch": key.branch,
                "n_tokens": len(tokens),
                "state_bytes": len(state),
                "sha256": digest.hexdigest(),
                "saved_at": time.time(),
            },
            sort_keys=True,
        ).encode("utf-8")
        path = self.path_for(key)
        with self._lock:
            self.folder.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
            parts = (MAGIC, _LEN.pack(len(header)), header, token_bytes, state)
            write_bytes_atomic(path, parts, mode=PRIVATE_FILE_MODE)
            written = _size(path)
            self._supersede(path, key, identity, tokens)
            self._evict(keep=path)
            return written if path.exists() else 0

    def _supersede(self, path: Path, key: KvKey, identity: KvIdentity, tokens: Sequence[int]) -> None:
        """Removes this conversation's other files whose tokens are a prefix of ``tokens``: whatever
        they could restore, the new file restores too (it is loaded whole and cut back)."""
        for other in self._conversation_files(key.conversation):
            if other == path:
                continue
            entry = self.read_header(other, identity)
            if entry is not None and common_prefix(entry.tokens, tokens) == len(entry.tokens):
                _remove(other, "superseded by a later turn of the same branch")

    def _evict(self, keep: Path) -> None:
        """Least recently used first, until the folder fits the cap; ``keep`` goes last."""
        files = []
        for path in self.files():
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((path == keep, st.st_mtime, st.st_size, path))
        total = sum(size for _, _, size, _ in files)
        for _, _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            reason = "over the size cap on its own" if path == keep else "least recently used, over the size cap"
            if _remove(path, reason):
                total -= size
        self._sweep_tmp()

    def _sweep_tmp(self) -> None:
        """Temporary files left by a worker killed mid-write (old enough not to be in use)."""
        now = time.time()
        with contextlib.suppress(OSError):
            for path in self.folder.iterdir():
                if path.name.startswith(".") and path.name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        if now - path.stat().st_mtime > _STALE_TMP_S:
                            path.unlink()

    # finding and loading --------------------------------------------------------------
    def _conversation_files(self, conversation: str) -> list[Path]:
        prefix = f"{_name_hash(conversation)}-"
        return [p for p in self.files() if p.name.startswith(prefix)]

    def read_header(self, path: Path, identity: KvIdentity) -> KvEntry | None:
        """The entry in ``path`` if its header is sound and its identity matches; otherwise the file
        is removed (a mismatch or damage, logged) and None returned. Never reads the state."""
        try:
            with path.open("rb") as fh:
                found = _parse_header(fh, path, identity)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("%s: saved KV cache unreadable (%s); ignored", path, exc.strerror or exc)
            return None
        if isinstance(found, str):
            self._reject(path, found)  # closed first: Windows cannot remove an open file
            return None
        return found

    def best_match(self, conversation: str, identity: KvIdentity, tokens: Sequence[int]) -> tuple[KvEntry, int] | None:
        """This conversation's saved cache sharing the longest prefix with ``tokens``, and its length."""
        best: tuple[KvEntry, int] | None = None
        with self._lock:
            for path in self._conversation_files(conversation):
                entry = self.read_header(path, identity)
                if entry is None:
                    continue
                common = common_prefix(entry.tokens, tokens)
                if common and (best is None or common > best[1]):
                    best = (entry, common)
        return best

    def load_state(self, entry: KvEntry) -> bytearray | None:
        """The entry's state, checked against its digest; a damaged file is removed (None). A load
        marks the file as recently used."""
        with self._lock:
            try:
                with entry.path.open("rb") as fh:
                    st = os.fstat(fh.fileno())
                    if (st.st_dev, st.st_ino) != entry.file_id:
                        return None  # rewritten since its header was read (a newer turn): not damage
                    fh.seek(entry.offset)
                    token_bytes = fh.read(4 * len(entry.tokens))
                    state = bytearray(entry.state_bytes)
                    got = fh.readinto(state)
            except OSError as exc:
                log.warning("%s: saved KV cache unreadable (%s); ignored", entry.path, exc.strerror or exc)
                return None
            if got != entry.state_bytes:
                self._reject(entry.path, "shorter than its header says (truncated)")
                return None
            digest = hashlib.sha256(token_bytes)
            digest.update(state)
            stored = list(struct.unpack(f"<{len(entry.tokens)}i", token_bytes))
            if digest.hexdigest() != entry.digest or stored != entry.tokens:
                self._reject(entry.path, "checksum mismatch (corrupt)")
                return None
            with contextlib.suppress(OSError):
                os.utime(entry.path)
            return state

    def remove(self, path: Path, reason: str) -> None:
        """Removes one saved cache, saying why in the log."""
        with self._lock:
            _remove(path, reason)

    def _reject(self, path: Path, reason: str) -> None:
        _remove(path, reason)


def _parse_header(fh: Any, path: Path, identity: KvIdentity) -> KvEntry | str:
    """The entry of an open cache file, or why it must not be loaded."""
    st = os.fstat(fh.fileno())
    size = st.st_size
    head = fh.read(len(MAGIC) + _LEN.size)
    if len(head) < len(MAGIC) + _LEN.size or not head.startswith(MAGIC):
        return "not a saved KV cache (bad magic)"
    (header_len,) = _LEN.unpack(head[len(MAGIC) :])
    if header_len > _HEADER_MAX:
        return f"header of {header_len} bytes (corrupt)"
    try:
        header = json.loads(fh.read(header_len).decode("utf-8"))
        n_tokens, state_bytes = int(header["n_tokens"]), int(header["state_bytes"])
        digest, saved = str(header["sha256"]), header["identity"]
        version = int(header["version"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "unreadable header (corrupt)"
    if version != FORMAT_VERSION:
        return f"format version {version}, not {FORMAT_VERSION}"
    if saved != identity.to_dict():
        return f"saved for another model or settings ({_differs(saved, identity)})"
    if not 0 < n_tokens <= identity.n_ctx or state_bytes <= 0:
        return f"{n_tokens} tokens / {state_bytes} state bytes (corrupt)"
    offset = len(MAGIC) + _LEN.size + header_len
    expected = offset + 4 * n_tokens + state_bytes
    if size != expected:
        return f"{size} bytes, its header says {expected} (truncated or corrupt)"
    tokens = list(struct.unpack(f"<{n_tokens}i", fh.read(4 * n_tokens)))
    return KvEntry(path, tokens, state_bytes, offset, digest, (st.st_dev, st.st_ino))


def _differs(saved: Any, identity: KvIdentity) -> str:
    if not isinstance(saved, dict):
        return "no identity"
    fields = [k for k, v in identity.to_dict().items() if saved.get(k) != v]
    return "other " + ", ".join(fields) if fields else "other identity"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _remove(path: Path, reason: str | None) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("%s: could not remove the saved KV cache (%s)", path, exc.strerror or exc)
        return False
    if reason is not None:
        log.info("%s: saved KV cache removed: %s", path, reason)
    return True


# ----------------------------------------------------------------------------- the worker's side
def cache_type(llm: Any) -> str:
    """What in a context's settings changes the layout or the values of its KV cells."""
    p = llm.context_params
    return (
        f"k{p.type_k}/v{p.type_v} fa{p.flash_attn_type} swa_full{int(p.swa_full)} unified{int(p.kv_unified)}"
        f" rope{p.rope_freq_base:g}x{p.rope_freq_scale:g}"
    )


def snapshot_seq(llm: Any) -> bytearray:
    """Sequence 0's state of a ``llama_cpp.Llama`` (a copy of its KV cells)."""
    # lazy: start-up (+5 ms)
    import ctypes

    # lazy: heavy (llama_cpp)
    import llama_cpp

    ctx = llm._ctx.ctx
    size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
    state = bytearray(size)
    buffer = (ctypes.c_uint8 * size).from_buffer(state)
    written = int(llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0))
    del buffer  # release the export before the bytearray may be resized
    if written != size:
        del state[written:]
    return state


def state_size(llm: Any) -> int:
    """The bytes :func:`snapshot_seq` would copy (computed by llama.cpp without copying)."""
    # lazy: heavy (llama_cpp)
    import llama_cpp

    return int(llama_cpp.llama_state_seq_get_size(llm._ctx.ctx, 0))


def restore_seq(llm: Any, state: bytearray, tokens: Sequence[int]) -> bool:
    """Replaces the context's KV cache with ``state`` (made for ``tokens``); False when llama.cpp
    refused it (the cache is then empty)."""
    # lazy: start-up (+5 ms)
    import ctypes

    # lazy: heavy (llama_cpp)
    import llama_cpp

    llm._ctx.kv_cache_clear()
    llm.n_tokens = 0
    buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
    loaded = int(llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, buffer, len(state), 0))
    del buffer
    # A state llama.cpp accepts must also hold exactly the positions of its tokens (0 .. n-1).
    if loaded == 0 or int(llama_cpp.llama_memory_seq_pos_max(llm._ctx.memory, 0)) != len(tokens) - 1:
        llm._ctx.kv_cache_clear()
        return False
    llm.input_ids[: len(tokens)] = tokens
    llm.n_tokens = len(tokens)
    return True


class SeqCachePersistence:
    """The inference worker's saved-cache logic for one loaded ``llama_cpp.Llama``.

    Per turn: :meth:`configure` (from the parent's request, or None: off), :meth:`restore` before
    the prefix reuse, :meth:`result_fields` for the result, :meth:`save` after the result was sent.

    Args:
        model_path: the loaded model file (fingerprinted once, on first use).
        n_ctx: the usable context window.
        projector_path: the model's projector, when one is loaded: its fingerprint joins the
            model's, so a state holding image chunks is never restored under another projector.
    """

    def __init__(self, model_path: Path, n_ctx: int, projector_path: Path | None = None) -> None:
        self.model_path = model_path
        self.projector_path = projector_path
        self.n_ctx = n_ctx
        self.request: KvRequest | None = None
        self.restored_tokens = 0
        self.restore_ms = 0.0
        self.saved_bytes = 0
        self._fingerprint: str | None = None
        self._store: KvCacheStore | None = None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glassbox-kv-save")
        # The LoRA adapters the context computes with (engine.inference.adapters), as a digest:
        # part of the identity, so a state is restored only for the adapters it was made with.
        self.adapters = ""
        self._latest: dict[str, tuple[int, list[int]]] = {}  # per conversation: the newest queued save
        self._generation = 0

    def configure(self, request: KvRequest | None) -> None:
        self.request = request
        if request is None:
            return
        cfg = request.config
        if self._store is None or self._store.folder != cfg.folder or self._store.max_bytes != cfg.max_bytes:
            self._store = KvCacheStore(cfg.folder, cfg.max_bytes)

    def identity(self, llm: Any) -> KvIdentity | None:
        if self.request is None:
            return None
        if self._fingerprint is None:
            try:
                self._fingerprint = model_fingerprint(self.model_path)
                if self.projector_path is not None:
                    self._fingerprint += f"+mmproj:{model_fingerprint(self.projector_path)}"
            except OSError as exc:
                log.warning("%s: cannot fingerprint the model (%s); KV caches not saved", self.model_path, exc)
                return None
        # lazy: heavy (llama_cpp)
        import llama_cpp

        cache = cache_type(llm) + (f" lora{self.adapters}" if self.adapters else "")
        return KvIdentity(self._fingerprint, self.n_ctx, cache, self.request.template, llama_cpp.__version__)

    def restore(self, llm: Any, tokens: Sequence[int], in_ram: int | None = None, trimmable: bool = True) -> None:
        """Loads this conversation's saved state when it covers more of ``tokens`` than the KV cache
        in RAM does (by at least :data:`MIN_GAIN_TOKENS`). Never raises: on an unexpected failure
        the KV cache is emptied (the turn then prefills everything) and the cause logged.

        Args:
            llm: the ``llama_cpp.Llama``.
            tokens: the new prompt.
            in_ram: how many of ``tokens`` the memory in RAM keeps (None: its common prefix).
            trimmable: the memory can be cut to any prefix; a recurrent one cannot, so a saved
                state is only worth loading when all of its tokens begin the new prompt.
        """
        self.restored_tokens, self.restore_ms, self.saved_bytes = 0, 0.0, 0
        try:
            self._restore(llm, tokens, in_ram, trimmable)
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation; the turn goes on
            log.warning("restoring the saved KV cache failed: %s", exc)
            self.restored_tokens = 0
            llm._ctx.kv_cache_clear()
            llm.n_tokens = 0

    def _restore(self, llm: Any, tokens: Sequence[int], in_ram: int | None, trimmable: bool) -> None:
        request, store = self.request, self._store
        if request is None or store is None or not 1 < len(tokens) < self.n_ctx:
            return
        started = time.perf_counter()
        if in_ram is None:
            in_ram = common_prefix(llm.input_ids[: llm.n_tokens].tolist(), tokens)
        identity = self.identity(llm)
        if identity is None:
            return
        found = store.best_match(request.key.conversation, identity, tokens)
        if found is None:
            return
        entry, common = found
        usable = min(common, len(tokens) - 1)
        if not trimmable and usable < len(entry.tokens):
            return  # a recurrent state cannot be cut back to the shared prefix
        if usable - in_ram < MIN_GAIN_TOKENS:
            return
        state = store.load_state(entry)
        if state is None:
            return
        if not restore_seq(llm, state, entry.tokens):
            store.remove(entry.path, "llama.cpp refused the state")
            return
        self.restored_tokens = usable
        self.restore_ms = (time.perf_counter() - started) * 1000

    def result_fields(self, llm: Any, cached_tokens: int, checkpoint: Checkpoint | None = None) -> dict[str, Any]:
        """``kv_restored_tokens``, ``kv_restore_ms`` and ``kv_saved_bytes`` for this turn's result
        (``checkpoint``: the state :meth:`save` will write instead of the context's)."""
        restored = min(self.restored_tokens, cached_tokens)
        saving = self.request is not None and self.request.config.max_bytes > 0 and llm.n_tokens > 0
        try:
            if checkpoint is not None:
                self.saved_bytes = len(checkpoint.state) + 4 * checkpoint.n_tokens if saving else 0
            else:
                self.saved_bytes = state_size(llm) + 4 * int(llm.n_tokens) if saving else 0
            if self.request is not None and self.saved_bytes > self.request.config.max_bytes:
                self.saved_bytes = 0  # over the cap on its own: not even copied
        except Exception as exc:  # noqa: BLE001 - never fail a finished turn for the cache
            log.warning("sizing the KV state failed: %s", exc)
            self.saved_bytes = 0
        return {
            "kv_restored_tokens": restored,
            "kv_restore_ms": round(self.restore_ms, 2) if restored else 0.0,
            "kv_saved_bytes": self.saved_bytes,
        }

    def save(self, llm: Any, checkpoint: Checkpoint | None = None) -> None:
        """Copies the sequence's state now (or takes ``checkpoint``'s, a whole state with its
        tokens) and writes it on the background thread. Never raises: a failed save costs only the
        next start's prefill (logged)."""
        request, store = self.request, self._store
        if request is None or store is None or not self.saved_bytes:
            return
        try:
            identity = self.identity(llm)
            if identity is None:
                return
            if checkpoint is not None and checkpoint.full and checkpoint.tokens is not None:
                tokens, state = list(checkpoint.tokens), bytearray(checkpoint.state)
            else:
                tokens = llm.input_ids[: llm.n_tokens].tolist()
                state = snapshot_seq(llm)
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation; the turn is done
            log.warning("saving the KV cache failed: %s", exc)
            return
        self._generation += 1
        generation = self._generation
        key = request.key
        self._latest[key.conversation] = (generation, tokens)

        def write() -> None:
            newest, newest_tokens = self._latest[key.conversation]
            if newest != generation and newest_tokens[: len(tokens)] == tokens:
                return  # a later turn of this branch is queued: it would supersede this file at once
            try:
                store.save(key, identity, tokens, state)
            except OSError as exc:
                log.warning("%s: saving the KV cache failed (%s)", store.folder, exc.strerror or exc)

        self._writer.submit(write)

    def close(self) -> None:
        """Finishes the queued write and stops the writer thread."""
        self._writer.shutdown(wait=True)
