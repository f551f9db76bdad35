"""The KV cache saved with each chat (engine.inference.kv_cache): the store without a model, then the worker
saving a turn and a new worker process restoring it on the starter model."""

from __future__ import annotations

import dataclasses
import os
import stat
import struct
import threading
import time
from pathlib import Path

import pytest

from engine.inference import kv_cache
from engine.inference.kv_cache import (
    MAGIC,
    KvCacheConfig,
    KvCacheStore,
    KvIdentity,
    KvKey,
    common_prefix,
    model_fingerprint,
)

IDENTITY = KvIdentity(model="123:abc", n_ctx=4096, cache_type="k1/v1 fa-1", template="gguf:gguf:00", runtime="0.3.36")
KEY = KvKey("7", "41")


def _state(n: int, fill: int = 7) -> bytes:
    return bytes((fill + i) % 256 for i in range(n))


def _saved(store: KvCacheStore, key: KvKey = KEY, tokens: list[int] | None = None, state: bytes | None = None) -> Path:
    tokens = tokens if tokens is not None else list(range(1, 101))
    written = store.save(key, IDENTITY, tokens, state if state is not None else _state(5000))
    assert written > 0
    path = store.path_for(key)
    assert path.stat().st_size == written
    return path


# ----------------------------------------------------------------------------- the store
def test_a_saved_state_comes_back_exactly(tmp_path: Path) -> None:
    store = KvCacheStore(tmp_path / "kv")
    tokens = [5, 9, 2, 2, 40_000, 3]
    path = _saved(store, tokens=tokens, state=_state(12345))
    found = store.best_match("7", IDENTITY, [5, 9, 2, 2, 11, 12])
    assert found is not None
    entry, common = found
    assert (entry.path, entry.tokens, common) == (path, tokens, 4)
    assert bytes(store.load_state(entry) or b"") == _state(12345)
    if os.name == "posix":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_another_conversation_finds_nothing(tmp_path: Path) -> None:
    store = KvCacheStore(tmp_path)
    _saved(store)
    assert store.best_match("8", IDENTITY, list(range(1, 101))) is None
    assert store.best_match("7", IDENTITY, [999, 1, 2]) is None  # no common prefix


@pytest.mark.parametrize("field", ["model", "n_ctx", "cache_type", "template", "runtime"])
def test_a_cache_for_another_model_or_settings_is_removed_not_loaded(tmp_path: Path, field: str) -> None:
    store = KvCacheStore(tmp_path)
    path = _saved(store)
    value = getattr(IDENTITY, field)
    other = dataclasses.replace(IDENTITY, **{field: value + 1 if isinstance(value, int) else value + "-other"})
    assert store.best_match("7", other, list(range(1, 101))) is None
    assert not path.exists()


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[:-100]))
    elif how == "state byte flipped":
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "token changed":
        header_len = struct.unpack("<I", data[len(MAGIC) : len(MAGIC) + 4])[0]
        data[len(MAGIC) + 4 + header_len + 4 * 50] ^= 0x01  # still a prefix match: found, then checked
        path.write_bytes(bytes(data))
    elif how == "header garbage":
        data[len(MAGIC) + 6 : len(MAGIC) + 30] = b"\x00" * 24
        path.write_bytes(bytes(data))
    elif how == "bad magic":
        path.write_bytes(b"GGUF" + bytes(data[4:]))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "grown":
        path.write_bytes(bytes(data) + b"extra")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["truncated", "state byte flipped", "token changed", "header garbage", "bad magic", "empty", "grown"]
)
def test_a_corrupt_or_truncated_cache_is_removed_not_loaded(tmp_path: Path, how: str) -> None:
    store = KvCacheStore(tmp_path)
    path = _saved(store)
    _damage(path, how)
    found = store.best_match("7", IDENTITY, list(range(1, 101)))
    state = store.load_state(found[0]) if found is not None else None
    assert state is None
    assert not path.exists()


def test_least_recently_used_files_go_first_under_the_cap(tmp_path: Path) -> None:
    one = _saved(KvCacheStore(tmp_path), KvKey("1"), [1, 2, 3])
    size = one.stat().st_size
    store = KvCacheStore(tmp_path, max_bytes=2 * size + 10)
    two = _saved(store, KvKey("2"), [1, 2, 3])
    past = time.time() - 100
    os.utime(one, (past, past))
    os.utime(two, (past + 10, past + 10))
    found = store.best_match("1", IDENTITY, [1, 2, 3])
    assert found is not None and store.load_state(found[0]) is not None  # a restore is a use
    three = _saved(store, KvKey("3"), [1, 2, 3])
    assert one.exists() and three.exists() and not two.exists()
    assert store.usage() == (2, one.stat().st_size + three.stat().st_size)


def test_a_state_bigger_than_the_cap_is_not_kept(tmp_path: Path) -> None:
    store = KvCacheStore(tmp_path, max_bytes=1000)
    assert store.save(KEY, IDENTITY, [1, 2], _state(5000)) == 0
    assert store.files() == []
    assert KvCacheStore(tmp_path, max_bytes=0).save(KEY, IDENTITY, [1, 2], _state(10)) == 0
    assert store.files() == []


def test_a_later_turn_of_the_branch_supersedes_the_earlier_one(tmp_path: Path) -> None:
    store = KvCacheStore(tmp_path)
    first = _saved(store, KvKey("7", "10"), list(range(50)))
    sibling = _saved(store, KvKey("7", "11"), [*range(40), *range(100, 120)])  # a regenerated reply
    later = _saved(store, KvKey("7", "12"), list(range(80)))
    assert not first.exists()
    assert sibling.exists() and later.exists()
    found = store.best_match("7", IDENTITY, [*range(40), *range(100, 130)])
    assert found is not None and found[0].path == sibling and found[1] == 60


def test_clear_removes_every_saved_cache(tmp_path: Path) -> None:
    store = KvCacheStore(tmp_path / "kv")
    paths = [_saved(store, KvKey(str(i))) for i in range(3)]
    stray = tmp_path / "kv" / f".{paths[0].name}.abc.tmp"
    stray.write_bytes(b"half")
    other = tmp_path / "kv" / "notes.txt"
    other.write_text("kept")
    total = sum(p.stat().st_size for p in paths) + 4
    assert store.clear() == total
    assert store.usage() == (0, 0)
    assert not stray.exists() and other.exists()
    assert KvCacheStore(tmp_path / "missing").clear() == 0


def test_a_deleted_conversation_takes_its_saved_caches_with_it(tmp_path: Path) -> None:
    store = KvCacheStore(tmp_path)
    mine = [_saved(store, KvKey("7", b), [int(b), 1]) for b in ("1", "2")]
    other = _saved(store, KvKey("70", "1"))
    sizes = sum(p.stat().st_size for p in mine)
    assert store.remove_conversation("7") == sizes
    assert not any(p.exists() for p in mine) and other.exists()
    assert store.remove_conversation("7") == 0


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = KvCacheStore(tmp_path)
    path = _saved(store, tokens=[1, 2, 3])
    before = path.read_bytes()

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kv_cache.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        store.save(KEY, IDENTITY, [1, 2, 3, 4], _state(100))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_model_fingerprint_follows_the_content_not_the_name_or_mtime(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(3 * 1024 * 1024))
    first = model_fingerprint(model)
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(model.read_bytes())
    os.utime(copy, (1, 1))
    assert model_fingerprint(copy) == first
    data = bytearray(model.read_bytes())
    data[len(data) // 2] = 1  # the middle window
    model.write_bytes(bytes(data))
    assert model_fingerprint(model) != first


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_reads_during_a_background_write_see_the_old_or_the_new_file(tmp_path: Path) -> None:
    store = KvCacheStore(tmp_path)
    _saved(store, tokens=list(range(100)), state=_state(200_000, 1))
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            found = store.best_match("7", IDENTITY, list(range(100)))
            if found is None:
                errors.append("not found")
            elif store.load_state(found[0]) is None and not store.path_for(KEY).exists():
                errors.append("a good file was removed")

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(20):
        store.save(KEY, IDENTITY, list(range(100)), _state(200_000, i))
    stop.set()
    reader.join()
    assert errors == []
    found = store.best_match("7", IDENTITY, list(range(100)))
    assert found is not None and store.load_state(found[0]) == bytearray(_state(200_000, 19))


# ----------------------------------------------------------------------------- the worker, for real
@pytest.fixture(scope="module")
def kv_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-cache")


def _session(model: Path, folder: Path | None) -> object:
    from engine.inference.runtime import LoadParams
    from engine.inference.session import ChatSession

    config = KvCacheConfig(folder) if folder is not None else None
    return ChatSession(LoadParams(model_path=model, n_ctx=2048, n_threads=2), kv_cache=config)


DOCUMENT = " ".join(
    f"Item {i}: the valve on line {i % 7} was checked at {i % 24:02d}:00 and found in order." for i in range(40)
)


def _turn(session: object, history: list[object], user: str, key: KvKey | None) -> object:
    from engine.inference.events import Finished
    from engine.inference.runtime import GenerationParams

    params = GenerationParams(temperature=0.0, max_tokens=12, repeat_penalty=1.0)
    finished = [e for e in session.stream(history, user, params, cache_key=key) if isinstance(e, Finished)]  # type: ignore[attr-defined]
    assert len(finished) == 1
    return finished[0]


@pytest.fixture(scope="module")
def first_turn(starter_model: Path, kv_home: Path) -> tuple[object, Path]:
    """Turn 1 of conversation 7 in one worker process; the process ends (its write finishes)."""
    session = _session(starter_model, kv_home)
    with session:  # type: ignore[attr-defined]
        done = _turn(session, [], f"Read this log. {DOCUMENT}", KvKey("7", "1"))
    return done, kv_home


@pytest.mark.model
def test_a_finished_turn_is_saved_to_disk(first_turn: tuple[object, Path]) -> None:
    done, folder = first_turn
    stats = done.stats  # type: ignore[attr-defined]
    store = KvCacheStore(folder)
    files, size = store.usage()
    assert files == 1
    assert stats.kv_saved_bytes > 0 and abs(size - stats.kv_saved_bytes) < 4096  # the header is small
    assert stats.kv_restored_tokens == 0 and stats.kv_restore_ms == 0.0


@pytest.mark.model
def test_a_new_process_restores_the_saved_prefix_and_replies_the_same(
    starter_model: Path, first_turn: tuple[object, Path]
) -> None:
    from engine.inference.context import Message

    done, folder = first_turn
    history = [Message("user", f"Read this log. {DOCUMENT}"), Message("assistant", done.text)]  # type: ignore[attr-defined]
    question = "Which line was checked at 05:00?"
    warm_session = _session(starter_model, folder)
    with warm_session:  # type: ignore[attr-defined]
        warm = _turn(warm_session, history, question, KvKey("7", "2"))
        # The same continuation from cold: the worker's RAM emptied, no cache key.
        warm_session.worker.reset_cache()  # type: ignore[attr-defined]
        cold = _turn(warm_session, history, question, None)
    ws, cs = warm.stats, cold.stats  # type: ignore[attr-defined]
    assert cs.kv_restored_tokens == 0 and cs.cached_tokens == 0
    assert ws.kv_restored_tokens >= done.stats.prompt_tokens - 1  # type: ignore[attr-defined]
    assert ws.cached_tokens >= ws.kv_restored_tokens > 0
    assert ws.kv_restore_ms > 0
    assert ws.prompt_tokens - ws.cached_tokens < 64  # only the new turn was prefilled
    assert warm.text == cold.text  # type: ignore[attr-defined]
    # The second turn superseded the first (its tokens extend them).
    assert KvCacheStore(folder).usage()[0] == 1


@pytest.mark.model
def test_a_state_llama_cpp_refuses_is_removed_and_the_turn_prefills(starter_model: Path, tmp_path: Path) -> None:
    from engine.inference.context import Message

    folder = tmp_path / "kv"
    session = _session(starter_model, folder)
    with session:  # type: ignore[attr-defined]
        first = _turn(session, [], f"Read this log. {DOCUMENT}", KvKey("9", "1"))
    [path] = KvCacheStore(folder).files()
    # Rewrite it with a sound header and digest but a state llama.cpp cannot read.
    store = KvCacheStore(folder)
    identity = _identity_of(path)
    entry = store.read_header(path, identity)
    assert entry is not None
    store.save(KvKey("9", "1"), identity, entry.tokens, _state(entry.state_bytes))
    history = [Message("user", f"Read this log. {DOCUMENT}"), Message("assistant", first.text)]  # type: ignore[attr-defined]
    again = _session(starter_model, folder)
    with again:  # type: ignore[attr-defined]
        done = _turn(again, history, "Which line?", KvKey("9", "2"))
    assert done.stats.kv_restored_tokens == 0 and done.stats.cached_tokens == 0  # type: ignore[attr-defined]
    assert done.reason in ("stop", "length")  # type: ignore[attr-defined]
    assert not path.exists()  # refused, so removed; this turn saved its own
    assert [p.name for p in store.files()] == [store.path_for(KvKey("9", "2")).name]


def _identity_of(path: Path) -> KvIdentity:
    import json

    data = path.read_bytes()
    (header_len,) = struct.unpack("<I", data[len(MAGIC) : len(MAGIC) + 4])
    header = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + header_len])
    return KvIdentity(**header["identity"])


@pytest.mark.model
def test_a_turn_decoded_with_prompt_lookup_is_saved_whole(starter_model: Path, tmp_path: Path) -> None:
    """Speculative decoding trims the KV cells of rejected drafts: the saved state must hold exactly
    the tokens it names, or a new process would refuse it."""
    from engine.inference.context import Message
    from engine.inference.events import Finished
    from engine.inference.runtime import GenerationParams

    folder = tmp_path / "kv"
    params = GenerationParams(temperature=0.0, max_tokens=24, repeat_penalty=1.0, speculative="lookup")
    user = f"Repeat this log exactly. {DOCUMENT}"
    with _session(starter_model, folder) as session:  # type: ignore[attr-defined]
        events = list(session.stream([], user, params, cache_key=KvKey("4", "1")))
    first = events[-1]
    assert isinstance(first, Finished) and first.stats.accepted_tokens > 0
    history = [Message("user", user), Message("assistant", first.text)]
    with _session(starter_model, folder) as session:  # type: ignore[attr-defined]
        again = _turn(session, history, "And again?", KvKey("4", "2"))
    assert again.stats.kv_restored_tokens >= first.stats.prompt_tokens  # type: ignore[attr-defined]


class _FakeLlm:
    """What SeqCachePersistence reads of a Llama between turns: the tokens in its KV cache."""

    def __init__(self, tokens: list[int]) -> None:
        import numpy as np

        self.input_ids = np.zeros(4096, dtype=np.intc)
        self.input_ids[: len(tokens)] = tokens
        self.n_tokens = len(tokens)


def test_a_queued_save_a_later_turn_extends_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.inference.kv_cache import KvRequest, SeqCachePersistence

    monkeypatch.setattr(kv_cache, "snapshot_seq", lambda llm: bytearray(_state(100 + llm.n_tokens)))
    monkeypatch.setattr(kv_cache, "state_size", lambda llm: 100 + llm.n_tokens)
    monkeypatch.setattr(SeqCachePersistence, "identity", lambda self, llm: IDENTITY)
    gate = threading.Event()
    written: list[tuple[str, str]] = []
    real_save = KvCacheStore.save

    def slow_save(store: KvCacheStore, key: KvKey, identity: KvIdentity, tokens: list[int], state: bytes) -> int:
        gate.wait(10)  # the disk is slow: the first write holds the queue
        written.append((key.conversation, key.branch))
        return real_save(store, key, identity, tokens, state)

    monkeypatch.setattr(KvCacheStore, "save", slow_save)
    saver = SeqCachePersistence(tmp_path / "model.gguf", 4096)
    config = KvCacheConfig(tmp_path / "kv")
    turns = [
        ("9", "1", [1, 2, 3]),  # being written while the others queue
        ("7", "1", list(range(1, 30))),  # extended by the next turn of its branch: skipped
        ("7", "2", list(range(1, 60))),
        ("8", "1", list(range(1, 30))),  # another conversation: written
    ]
    for conversation, branch, tokens in turns:
        saver.configure(KvRequest(config, KvKey(conversation, branch), "t"))
        llm = _FakeLlm(tokens)
        assert saver.result_fields(llm, 0)["kv_saved_bytes"] == 100 + 5 * len(tokens)
        saver.save(llm)
    gate.set()
    saver.close()
    assert written == [("9", "1"), ("7", "2"), ("8", "1")]
    assert KvCacheStore(tmp_path / "kv").usage()[0] == 3
