"""The model pool on real models: the starter (Gemma 3 270M) and a tiny Qwen 3 built in the test,
each in its own worker, resident together; requests interleaved; an idle unload seen happening;
LRU eviction under a small budget; the KV cache restored after a reload; one worker's crash not
touching the other.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from engine.errors import EngineCrashed
from engine.inference.events import Finished
from engine.inference.kv_cache import KvCacheConfig
from engine.inference.pool import ModelPool, PoolSettings, estimate_memory
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession

pytestmark = [pytest.mark.model, pytest.mark.slow]

GREEDY = GenerationParams(max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def models(starter_model: Path, tiny_model: Callable[[str], Path]) -> dict[str, Path]:
    return {"starter": starter_model, "tiny": tiny_model("qwen3")}


def _opener(models: dict[str, Path], n_ctx: int = 1024) -> Callable[[str], ChatSession | None]:
    def open_session(name: str) -> ChatSession | None:
        path = models.get(name)
        if path is None:
            return None
        return ChatSession(LoadParams(model_path=path, n_ctx=n_ctx, n_threads=2), reply_reserve=64)

    return open_session


@pytest.fixture
def make_pool(models: dict[str, Path]) -> Iterator[Callable[..., ModelPool]]:
    pools: list[ModelPool] = []

    def make(kv_cache: KvCacheConfig | None = None, **settings: object) -> ModelPool:
        pool = ModelPool(_opener(models), PoolSettings(**settings), kv_cache=kv_cache)  # type: ignore[arg-type]
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def _reply(pool: ModelPool, name: str, user: str, **lease: object) -> Finished:
    with pool.lease(name, **lease) as session:  # type: ignore[arg-type]
        assert isinstance(session, ChatSession)
        events = list(session.stream([], user, GREEDY))
    finished = events[-1]
    assert isinstance(finished, Finished)
    return finished


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def test_two_models_stay_resident_and_answer_interleaved_requests(make_pool: Callable[..., ModelPool]) -> None:
    pool = make_pool(memory_budget=8 << 30)
    first: dict[str, str] = {}
    for round_ in range(3):
        for name in ("starter", "tiny"):
            text = _reply(pool, name, "Say something about rivers.").text
            if round_ == 0:
                first[name] = text
            else:
                assert text == first[name]  # greedy: the same model answered, from the same state
    assert pool.loads == 2
    resident = {r.name: r for r in pool.resident()}
    assert set(resident) == {"starter", "tiny"}
    assert resident["starter"].pid != resident["tiny"].pid
    for r in resident.values():
        assert r.pid is not None and psutil.pid_exists(r.pid)
        assert r.requests == 3
        assert r.memory.weights > 0 and r.memory.kv > 0 and r.memory.compute > 0
    assert resident["starter"].memory.weights > 50 * resident["tiny"].memory.weights
    assert pool.evictions() == []


def test_one_workers_crash_leaves_the_other_model_answering(make_pool: Callable[..., ModelPool]) -> None:
    pool = make_pool(memory_budget=8 << 30)
    before = _reply(pool, "starter", "Name a colour.").text
    _reply(pool, "tiny", "Name a colour.")
    tiny_pid = next(r.pid for r in pool.resident() if r.name == "tiny")
    assert tiny_pid is not None
    os.kill(tiny_pid, signal.SIGKILL)
    _wait_for(lambda: not psutil.pid_exists(tiny_pid) or psutil.Process(tiny_pid).status() == psutil.STATUS_ZOMBIE)
    assert _reply(pool, "starter", "Name a colour.").text == before
    assert [r.name for r in pool.resident()] == ["starter"]
    eviction = pool.last_eviction("tiny")
    assert eviction is not None and eviction.cause == "crashed"
    assert _reply(pool, "tiny", "Name a colour.").reason in ("stop", "length")  # loaded again
    assert pool.loads == 3


def test_a_crash_during_a_request_is_that_requests_error_and_the_next_one_reloads(
    make_pool: Callable[..., ModelPool],
) -> None:
    pool = make_pool(memory_budget=8 << 30)
    _reply(pool, "tiny", "Hello")
    with pool.lease("tiny") as session:
        assert isinstance(session, ChatSession) and session.worker is not None
        pid = session.worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineCrashed):
            list(session.stream([], "Hello again", GREEDY))
    assert pool.last_eviction("tiny") is not None
    assert _reply(pool, "tiny", "Hello").reason in ("stop", "length")


def test_an_idle_model_is_unloaded_by_the_pools_own_thread(make_pool: Callable[..., ModelPool]) -> None:
    pool = make_pool(memory_budget=8 << 30, idle_unload_s=None, idle_per_model={"tiny": 0.5})
    _reply(pool, "starter", "Hi")
    _reply(pool, "tiny", "Hi")
    tiny_pid = next(r.pid for r in pool.resident() if r.name == "tiny")
    _wait_for(lambda: pool.last_eviction("tiny") is not None)
    eviction = pool.last_eviction("tiny")
    assert eviction is not None and eviction.cause == "idle"
    assert tiny_pid is not None and not psutil.pid_exists(tiny_pid)  # the worker process is gone
    assert [r.name for r in pool.resident()] == ["starter"]  # never unloaded when idle
    assert next(r for r in pool.resident()).unload_in_s is None


def test_the_least_recently_used_model_is_evicted_under_a_small_budget(
    make_pool: Callable[..., ModelPool], models: dict[str, Path]
) -> None:
    starter = estimate_memory(LoadParams(model_path=models["starter"], n_ctx=1024)).total
    tiny = estimate_memory(LoadParams(model_path=models["tiny"], n_ctx=1024)).total
    pool = make_pool(memory_budget=starter + tiny - 1)  # not both
    _reply(pool, "tiny", "One")
    _reply(pool, "starter", "Two")
    assert [r.name for r in pool.resident()] == ["starter"]
    eviction = pool.last_eviction("tiny")
    assert eviction is not None and eviction.cause == "memory" and "make room for starter" in eviction.reason
    _reply(pool, "tiny", "Three")
    assert [r.name for r in pool.resident()] == ["tiny"]
    assert pool.loads == 3


def test_the_prompt_is_saved_before_an_unload_and_restored_after_the_reload(
    make_pool: Callable[..., ModelPool], tmp_path: Path
) -> None:
    pool = make_pool(kv_cache=KvCacheConfig(tmp_path / "kv"), memory_budget=8 << 30)
    long_question = "Tell me about the river that runs past the old town. " * 20
    cold = _reply(pool, "starter", long_question)
    assert cold.stats.cached_tokens == 0 and cold.stats.prompt_tokens > 200
    assert pool.unload("starter")
    eviction = pool.last_eviction("starter")
    assert eviction is not None and eviction.kv_saved_bytes > 0
    warm = _reply(pool, "starter", long_question)
    assert pool.loads == 2
    # the whole prompt but its last token came from the state saved before the unload
    assert warm.stats.kv_restored_tokens == warm.stats.prompt_tokens - 1
    assert warm.stats.cached_tokens == warm.stats.prompt_tokens - 1
    assert warm.text == cold.text
    again = _reply(pool, "starter", long_question)  # the next turns reuse RAM as before
    assert again.stats.kv_restored_tokens == 0 and again.stats.cached_tokens == again.stats.prompt_tokens - 1
