"""The model pool's policy, on fake sessions and a clock the test moves: what loads, what waits,
what is evicted and why, idle unloads and keep_alive, the per-model queue, a crashed worker.

The real models (two resident at once, a crash, the KV cache restored after a reload) are in
``test_pool_models.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.errors import Cancelled, EngineError, ModelLoadError
from engine.fit import ModelMemory
from engine.inference.kv_cache import KvCacheConfig, KvKey
from engine.inference.pool import KEEP_DEFAULT, ModelBusy, ModelPool, PoolSettings, UnknownModel
from engine.inference.runtime import LoadParams

MIB = 1 << 20


class FakeWorker:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.alive = True
        self.info = None


class FakeSession:
    """A session whose load and close are counted; ``gate`` holds a load until the test opens it."""

    pids = 1000

    def __init__(self, name: str, size_mib: int, log: list[str]) -> None:
        self.name = name
        self.load_params = LoadParams(model_path=Path(f"/models/{name}.gguf"), n_ctx=512)
        self.size = size_mib * MIB
        self.log = log
        self._worker: FakeWorker | None = None
        self.gate: threading.Event | None = None
        self.fail: Exception | None = None
        self.parked: list[KvKey] = []

    @property
    def worker(self) -> FakeWorker | None:
        return self._worker

    def load(self, cancel: threading.Event | None = None) -> object:
        self.log.append(f"load {self.name}")
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.fail is not None:
            raise self.fail
        FakeSession.pids += 1
        self._worker = FakeWorker(FakeSession.pids)
        return object()

    def park(self, config: KvCacheConfig, key: KvKey) -> int:
        self.parked.append(key)
        return 1234

    def close(self) -> None:
        if self._worker is not None:
            self.log.append(f"close {self.name}")
        self._worker = None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pool(
    sizes: dict[str, int], *, clock: Clock | None = None, kv: KvCacheConfig | None = None, **settings: object
) -> tuple[ModelPool, dict[str, FakeSession], list[str]]:
    log: list[str] = []
    sessions: dict[str, FakeSession] = {}

    def open_session(name: str) -> FakeSession | None:
        if name not in sizes:
            return None
        sessions[name] = FakeSession(name, sizes[name], log)
        return sessions[name]

    def estimate(params: LoadParams) -> ModelMemory:
        return ModelMemory(sizes[params.model_path.stem] * MIB, 0, 0, 0)

    pool = ModelPool(
        open_session,  # type: ignore[arg-type]
        PoolSettings(**settings),  # type: ignore[arg-type]
        kv_cache=kv,
        clock=clock or Clock(),
        reaper=False,
        estimate=estimate,
    )
    return pool, sessions, log


def _wait_for(condition: Callable[[], bool]) -> None:
    """Until ``condition`` holds (another thread's progress), failing after 30 s."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


def _use(pool: ModelPool, name: str, keep_alive: float | None = KEEP_DEFAULT) -> None:
    with pool.lease(name, keep_alive=keep_alive):
        pass


def test_models_load_on_first_request_and_stay_resident_together() -> None:
    pool, _sessions, log = _pool({"a": 100, "b": 100}, memory_budget=1000 * MIB)
    for name in ("a", "b", "a", "b", "a"):
        _use(pool, name)
    assert log == ["load a", "load b"]
    assert pool.loads == 2
    assert {r.name for r in pool.resident()} == {"a", "b"}
    assert [r.name for r in pool.resident()] == ["a", "b"]  # the most recently used first
    assert all(r.state == "ready" for r in pool.resident())
    assert {r.name: r.requests for r in pool.resident()} == {"a": 3, "b": 2}


def test_an_unknown_name_is_refused_without_loading_anything() -> None:
    pool, _, log = _pool({"a": 100})
    with pytest.raises(UnknownModel, match="'nope'"):
        _use(pool, "nope")
    assert log == []


def test_the_least_recently_used_idle_model_makes_room_under_the_budget() -> None:
    pool, _sessions, log = _pool({"a": 400, "b": 400, "c": 400}, memory_budget=1000 * MIB)
    clock = pool._clock
    _use(pool, "a")
    clock.now += 1  # type: ignore[attr-defined]
    _use(pool, "b")
    clock.now += 1  # type: ignore[attr-defined]
    _use(pool, "a")  # b is now the least recently used
    clock.now += 1  # type: ignore[attr-defined]
    _use(pool, "c")
    assert log == ["load a", "load b", "close b", "load c"]
    assert {r.name for r in pool.resident()} == {"a", "c"}
    eviction = pool.last_eviction("b")
    assert eviction is not None and eviction.cause == "memory"
    assert "make room for c" in eviction.reason and "1000 MiB budget" in eviction.reason.replace("1000.0", "1000")


def test_at_most_max_resident_models_are_loaded() -> None:
    pool, _, log = _pool({"a": 1, "b": 1, "c": 1}, memory_budget=1000 * MIB, max_resident=2)
    for name in ("a", "b", "c"):
        _use(pool, name)
    assert log == ["load a", "load b", "close a", "load c"]
    eviction = pool.last_eviction("a")
    assert eviction is not None and eviction.cause == "max_resident" and "at most 2" in eviction.reason


def test_a_model_alone_over_the_budget_is_still_loaded() -> None:
    pool, _, log = _pool({"big": 5000}, memory_budget=1000 * MIB)
    _use(pool, "big")
    assert log == ["load big"]


def test_a_model_answering_is_never_evicted_the_load_waits_for_it() -> None:
    pool, _sessions, log = _pool({"a": 600, "b": 600}, memory_budget=1000 * MIB, queue_wait_s=30)
    inside = threading.Event()
    leave = threading.Event()

    def hold_a() -> None:
        with pool.lease("a"):
            inside.set()
            assert leave.wait(30)

    holder = threading.Thread(target=hold_a)
    holder.start()
    assert inside.wait(30)
    loaded_b = threading.Event()

    def use_b() -> None:
        _use(pool, "b")
        loaded_b.set()

    second = threading.Thread(target=use_b)
    second.start()
    _wait_for(lambda: any(r.name == "b" and r.state == "loading" for r in pool.resident()))
    # b waits for room while a answers (it cannot go on before a leaves): a is not closed.
    assert log == ["load a"] and not loaded_b.is_set()
    leave.set()
    holder.join(30)
    second.join(30)
    assert loaded_b.is_set()
    assert log == ["load a", "close a", "load b"]


def test_a_load_that_cannot_make_room_in_time_is_busy() -> None:
    pool, _, log = _pool({"a": 600, "b": 600}, memory_budget=1000 * MIB, queue_wait_s=0, retry_after_s=7)
    with pool.lease("a"), pytest.raises(ModelBusy, match="all answering") as caught:  # b may not wait
        _use(pool, "b")
    assert caught.value.retry_after_s == 7
    assert log == ["load a"]


def test_requests_for_a_loading_model_wait_for_that_one_load() -> None:
    pool, _sessions, log = _pool({"a": 10})
    gate = threading.Event()
    first_started = threading.Event()
    original_open = pool._open

    def open_gated(name: str) -> object:
        session = original_open(name)
        session.gate = gate  # type: ignore[union-attr]
        return session

    pool._open = open_gated  # type: ignore[assignment]
    served: list[int] = []

    def request(i: int) -> None:
        with pool.lease("a"):
            served.append(i)
            first_started.set()

    threads = [threading.Thread(target=request, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    _wait_for(lambda: pool.resident() != [] and pool.resident()[0].waiting == 3)
    assert [r.state for r in pool.resident()] == ["loading"]  # one loads, three wait for it
    assert not first_started.is_set()
    gate.set()
    for t in threads:
        t.join(30)
    assert sorted(served) == [0, 1, 2, 3]
    assert log == ["load a"]
    assert pool.loads == 1


def test_a_failed_load_is_the_answer_of_every_request_that_waited_for_it() -> None:
    pool, _sessions, log = _pool({"a": 10})
    gate = threading.Event()
    original_open = pool._open

    def open_failing(name: str) -> object:
        session = original_open(name)
        session.gate = gate  # type: ignore[union-attr]
        session.fail = ModelLoadError("/models/a.gguf: llama.cpp could not load it")  # type: ignore[union-attr]
        return session

    pool._open = open_failing  # type: ignore[assignment]
    errors: list[str] = []

    def request() -> None:
        try:
            _use(pool, "a")
        except ModelLoadError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=request) for _ in range(3)]
    for t in threads:
        t.start()
    _wait_for(lambda: pool.resident() != [] and pool.resident()[0].waiting == 2)
    gate.set()
    for t in threads:
        t.join(30)
    assert errors == ["/models/a.gguf: llama.cpp could not load it"] * 3
    assert log == ["load a"]  # one attempt for the three
    assert pool.resident() == []


def test_past_the_queue_a_request_is_busy_with_retry_after() -> None:
    pool, _, _ = _pool({"a": 10}, queue_depth=2, retry_after_s=3)
    inside = threading.Event()
    leave = threading.Event()
    waiting = []

    def hold() -> None:
        with pool.lease("a"):
            inside.set()
            assert leave.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    for _ in range(2):  # two may wait
        t = threading.Thread(target=_use, args=(pool, "a"))
        t.start()
        waiting.append(t)
    _wait_for(lambda: pool.resident()[0].waiting == 2)
    with pytest.raises(ModelBusy, match="at most 2 may wait") as caught:
        _use(pool, "a")
    assert caught.value.retry_after_s == 3
    leave.set()
    holder.join(30)
    for t in waiting:
        t.join(30)
    assert pool.resident()[0].requests == 3  # the refused one never ran


def test_a_waiting_request_cancelled_leaves_the_queue() -> None:
    pool, _, _ = _pool({"a": 10})
    inside, leave, cancel = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with pool.lease("a"):
            inside.set()
            assert leave.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    cancel.set()
    with pytest.raises(Cancelled), pool.lease("a", cancel=cancel):
        pass
    leave.set()
    holder.join(30)
    assert pool.resident()[0].waiting == 0


def test_idle_models_unload_after_their_idle_time_and_say_so() -> None:
    clock = Clock()
    pool, _, log = _pool({"a": 10, "b": 10, "c": 10}, clock=clock, idle_unload_s=60, idle_per_model={"c": None})
    for name in ("a", "b", "c"):
        _use(pool, name)
    clock.now += 30
    _use(pool, "b")
    resident = {r.name: r for r in pool.resident()}
    assert resident["a"].unload_in_s == pytest.approx(30)
    assert resident["b"].unload_in_s == pytest.approx(60)
    assert resident["c"].unload_in_s is None  # never
    assert pool.sweep() == []
    clock.now += 31
    assert pool.sweep() == ["a"]
    assert log[-1] == "close a"
    eviction = pool.last_eviction("a")
    assert eviction is not None and eviction.cause == "idle" and "1 min 0 s without a request" in eviction.reason
    clock.now += 3600
    assert pool.sweep() == ["b"]
    assert {r.name for r in pool.resident()} == {"c"}


def test_keep_alive_zero_unloads_after_the_reply_and_other_values_replace_the_idle_time() -> None:
    clock = Clock()
    pool, _, log = _pool({"a": 10, "b": 10}, clock=clock, idle_unload_s=60)
    _use(pool, "a", keep_alive=0)
    assert log == ["load a", "close a"]
    eviction = pool.last_eviction("a")
    assert eviction is not None and eviction.cause == "keep_alive"
    _use(pool, "b", keep_alive=600)
    clock.now += 120
    assert pool.sweep() == []
    _use(pool, "b", keep_alive=None)  # never
    clock.now += 10**6
    assert pool.sweep() == []
    assert pool.keep_s("b") is None


def test_a_model_is_unloaded_on_request_and_its_prompt_parked_for_the_next_load(tmp_path: Path) -> None:
    kv = KvCacheConfig(tmp_path / "kv")
    pool, sessions, log = _pool({"a": 10, "b": 10}, kv=kv)
    _use(pool, "a")
    _use(pool, "b")
    assert pool.unload("a") is True
    assert pool.unload("a") is False
    assert sessions["a"].parked == [KvKey("glassbox-pool", "a")]
    eviction = pool.last_eviction("a")
    assert eviction is not None and eviction.cause == "request" and eviction.kv_saved_bytes == 1234
    assert pool.unload_all() == ["b"]
    assert pool.resident() == []
    _use(pool, "a")
    assert log == ["load a", "load b", "close a", "close b", "load a"]


def test_a_crashed_worker_is_recorded_and_loaded_again_without_touching_the_others() -> None:
    pool, sessions, log = _pool({"a": 10, "b": 10})
    _use(pool, "a")
    _use(pool, "b")
    worker = sessions["a"].worker
    assert worker is not None
    worker.alive = False
    assert {r.name for r in pool.resident()} == {"b"}
    eviction = pool.last_eviction("a")
    assert eviction is not None and eviction.cause == "crashed"
    _use(pool, "a")
    assert log == ["load a", "load b", "load a"]
    assert {r.name for r in pool.resident()} == {"a", "b"}


def test_a_closed_pool_unloads_everything_and_refuses_requests() -> None:
    pool, _, log = _pool({"a": 10})
    _use(pool, "a")
    pool.close()
    assert log == ["load a", "close a"]
    with pytest.raises(EngineError, match="closed"):
        _use(pool, "a")


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_resident"):
        PoolSettings(max_resident=0)
