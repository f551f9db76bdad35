"""Models kept loaded in the window (issue 26; Settings' ``models_kept_loaded``): the LLM worker on
the real engine keeps the chat's model loaded beside the next one, so choosing it again is a
switch (the same worker process, no load); the least recently used goes past the count or when the
next would not fit; one unused past Settings' idle time is unloaded, its countdown said before; a
kept model whose worker died is loaded again; Eject unloads them all. The window's model bar lists
what is kept, the inspector their memory, and the status bar says a switch was one."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from gui_support import make_window

from app.gui.workers.chat_state import ModelState
from app.gui.workers.llm_loading import default_session_factory
from app.gui.workers.llm_requests import GenerateRequest, LoadedModel, LoadRequest
from app.gui.workers.llm_worker import SWEEP_MS, LlmWorker
from app.gui.workers.model_routing import model_label
from app.gui.workers.resident_models import ResidentModels, ResidentState, workers_rss
from app.paths import Paths
from app.settings import Settings
from app.turn import TurnRequest
from engine.inference.pool import estimate_memory
from engine.inference.runtime import GenerationParams, LoadParams
from engine.units import format_bytes

pytestmark = [pytest.mark.model]

GREEDY = GenerationParams(max_tokens=6, temperature=0.0)


class Recorder:
    """The worker's signals, and the sessions its factory built."""

    def __init__(self, worker: LlmWorker) -> None:
        self.loaded: list[LoadedModel] = []
        self.failed: list[BaseException] = []
        self.resident: list[ResidentState] = []
        self.texts: list[str] = []
        worker.model_loaded.connect(self.loaded.append)
        worker.model_load_failed.connect(self.failed.append)
        worker.resident_changed.connect(self.resident.append)
        worker.generation_finished.connect(lambda outcome: self.texts.append(outcome.text))
        worker.generation_failed.connect(lambda _rid, exc: self.failed.append(exc))


@pytest.fixture
def make_worker(qapp: Any) -> Iterator[Callable[..., tuple[LlmWorker, Recorder, list[Any]]]]:
    workers: list[LlmWorker] = []

    def make(**resident: Any) -> tuple[LlmWorker, Recorder, list[Any]]:
        built: list[Any] = []

        def factory(request: LoadRequest, bandwidth: float | None) -> Any:
            session = default_session_factory(request, bandwidth)
            built.append(session)
            return session

        worker = LlmWorker(factory)
        if resident:
            worker._resident = ResidentModels(**resident)
        workers.append(worker)
        return worker, Recorder(worker), built

    yield make
    for worker in workers:
        worker._on_shutdown_requested()


def _request(path: Path, keep: int) -> LoadRequest:
    label = path.stem
    return LoadRequest(model_path=path, n_ctx=512, reply_reserve=64, label=label, keep_loaded=keep, mmproj_path=None)


def _pid(session: Any) -> int:
    pid = session.local.worker_pid
    assert pid is not None
    return int(pid)


def _dead(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 30
    while not _dead(pid):
        assert time.monotonic() < deadline, f"worker {pid} still running"
        time.sleep(0.05)


def _names(rec: Recorder) -> list[str]:
    """The models the worker said it keeps loaded, last time."""
    return list(rec.resident[-1].names)


def _reply(worker: LlmWorker, rec: Recorder) -> str:
    worker._on_generate_requested(GenerateRequest(1, TurnRequest((), "Name a river.", GREEDY)))
    assert not rec.failed, rec.failed
    return rec.texts[-1]


def test_a_model_kept_loaded_is_switched_to_without_a_load(
    make_worker: Callable[..., Any], starter_model: Path, tiny_model: Callable[[str], Path]
) -> None:
    tiny = tiny_model("qwen3")
    worker, rec, built = make_worker()
    worker._on_load_requested(_request(starter_model, 2))
    first = _reply(worker, rec)
    starter_pid = _pid(built[0])
    worker._on_load_requested(_request(tiny, 2))
    assert not rec.failed, rec.failed
    assert _names(rec) == [starter_model.stem]  # kept beside the tiny one
    memory = rec.resident[-1].models[0].memory  # the fit estimator's, for the starter at this context
    expected = estimate_memory(LoadParams(model_path=starter_model, n_ctx=512))
    assert memory == expected and memory.weights > 100 * 2**20 and memory.kv > 0
    assert not _dead(starter_pid)
    tiny_pid = _pid(built[1])
    worker._on_load_requested(_request(starter_model, 2))
    assert len(built) == 2  # nothing was loaded: the kept session is the chat's again
    switched = rec.loaded[-1]
    assert switched.kept and not rec.loaded[0].kept and switched.label == starter_model.stem
    assert switched.info == rec.loaded[0].info
    assert _names(rec) == [tiny.stem]
    assert _pid(built[0]) == starter_pid and not _dead(tiny_pid)
    assert _reply(worker, rec) == first  # the same model answers, greedy
    worker._on_unload_requested()  # Eject: every model
    assert _names(rec) == []
    _wait_dead(starter_pid)
    _wait_dead(tiny_pid)


def test_with_one_model_kept_the_last_one_is_closed_as_before(
    make_worker: Callable[..., Any], starter_model: Path, tiny_model: Callable[[str], Path]
) -> None:
    tiny = tiny_model("qwen3")
    worker, rec, built = make_worker()
    worker._on_load_requested(_request(starter_model, 1))
    starter_pid = _pid(built[0])
    worker._on_load_requested(_request(tiny, 1))
    _wait_dead(starter_pid)
    assert _names(rec) == []
    worker._on_load_requested(_request(starter_model, 1))
    assert len(built) == 3 and not rec.loaded[-1].kept  # loaded again


def test_the_least_recently_used_goes_past_the_count_and_when_the_next_would_not_fit(
    make_worker: Callable[..., Any], starter_model: Path, tiny_model: Callable[[str], Path]
) -> None:
    qwen, llama = tiny_model("qwen3"), tiny_model("llama3")
    worker, rec, built = make_worker()
    pids = []
    for path in (starter_model, qwen, llama):
        worker._on_load_requested(_request(path, 2))
        pids.append(_pid(built[-1]))
    assert not rec.failed, rec.failed
    assert _names(rec) == [qwen.stem]  # two kept at most: the starter went
    _wait_dead(pids[0])
    assert not _dead(pids[1])
    assert worker._resident.closed == [f"{starter_model.stem}: more than the models kept loaded"]

    tight, rec, built = make_worker(budget=lambda: 0)  # nothing free: the next never fits beside one
    tight._on_load_requested(_request(starter_model, 3))
    starter_pid = _pid(built[0])
    tight._on_load_requested(_request(qwen, 3))
    assert not rec.failed, rec.failed
    assert _names(rec) == []
    assert tight._resident.closed == [f"{starter_model.stem}: memory for the next one"]
    _wait_dead(starter_pid)


def test_a_kept_model_whose_worker_died_is_loaded_again(
    make_worker: Callable[..., Any], starter_model: Path, tiny_model: Callable[[str], Path]
) -> None:
    tiny = tiny_model("qwen3")
    worker, rec, built = make_worker()
    worker._on_load_requested(_request(starter_model, 2))
    first = _reply(worker, rec)
    worker._on_load_requested(_request(tiny, 2))
    starter_pid = _pid(built[0])
    os.kill(starter_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while built[0].local.worker.alive:  # reaped once all its threads are gone, not at once
        assert time.monotonic() < deadline, "the killed worker never ended"
        time.sleep(0.05)
    worker._on_load_requested(_request(starter_model, 2))
    assert not rec.failed, rec.failed
    assert len(built) == 3 and not rec.loaded[-1].kept
    assert _pid(built[2]) != starter_pid
    assert f"{starter_model.stem}: its worker process died" in worker._resident.closed
    assert _names(rec) == [tiny.stem]
    assert _reply(worker, rec) == first


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_kept_model_unused_past_its_idle_time_is_unloaded_and_the_countdown_said(
    make_worker: Callable[..., Any], starter_model: Path, tiny_model: Callable[[str], Path]
) -> None:
    tiny = tiny_model("qwen3")
    clock = Clock()
    worker, rec, built = make_worker(clock=clock)
    worker._on_load_requested(replace(_request(starter_model, 2), kept_idle_s=300.0))
    starter_pid = _pid(built[0])
    worker._on_load_requested(replace(_request(tiny, 2), kept_idle_s=300.0))
    assert [m.unload_in_s for m in rec.resident[-1].models] == [300.0]
    assert worker._sweeper is not None and worker._sweeper.interval() == SWEEP_MS
    clock.now += 120
    worker._sweep_kept()  # what the worker's timer runs
    counting = rec.resident[-1]
    assert counting.names == (starter_model.stem,)
    assert counting.models[0].unload_in_s == 180.0 and counting.last_unloaded is None
    assert not _dead(starter_pid)
    clock.now += 180
    worker._sweep_kept()
    gone = rec.resident[-1]
    assert gone.names == () and gone.last_unloaded == f"{starter_model.stem}: unused for 5 min"
    _wait_dead(starter_pid)
    count = len(rec.resident)
    worker._sweep_kept()  # nothing kept, nothing to say
    assert len(rec.resident) == count
    assert not _dead(_pid(built[1]))  # the chat's own model is never unloaded for idling

    never, rec, built = make_worker(clock=clock)  # Settings: never
    never._on_load_requested(replace(_request(starter_model, 2), kept_idle_s=None))
    never._on_load_requested(replace(_request(tiny, 2), kept_idle_s=None))
    clock.now += 10**6
    never._sweep_kept()
    assert rec.resident[-1].names == (starter_model.stem,) and rec.resident[-1].models[0].unload_in_s is None


@pytest.mark.gui
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_the_model_bar_lists_the_kept_models_and_a_switch_says_so(
    qtbot: Any, paths: Paths, starter_model: Path, tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    for path in (starter_model, tiny_model("qwen3")):
        (folder / path.name).symlink_to(path)
    starter, tiny = folder / starter_model.name, folder / tiny_model("qwen3").name
    settings = Settings(
        theme="light", models_dir=folder, n_ctx=512, reply_reserve=64, models_kept_loaded=2, auto_load_model=False
    )
    w = make_window(paths, None, settings, probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    try:
        loads: list[LoadedModel] = []
        w.chat.model_loaded.connect(loads.append)
        w.model_control.load_model(starter)
        qtbot.waitUntil(lambda: len(loads) == 1, timeout=120_000)
        bar = w.header.model_bar
        assert not bar.resident.isVisible()
        w.model_control.load_model(tiny)
        qtbot.waitUntil(lambda: len(loads) == 2, timeout=120_000)
        assert w.chat.model_state is ModelState.LOADED
        assert bar.resident.isVisible() and bar.resident.text() == "+1 loaded"
        assert f"Kept loaded: {model_label(starter)} " in bar.resident.toolTip()
        memory = w.inspector.shown["resident"]
        first = memory.splitlines()[0]
        assert first.startswith("In memory: 2 models, ") and " reserved (estimated)" in first
        assert f" of {format_bytes(psutil.virtual_memory().total)} RAM; their workers hold " in first
        assert f"{model_label(starter)} (kept loaded): " in memory and f"{loads[-1].label} (this chat's): " in memory
        assert "weights" in memory and "KV cache" in memory and "compute buffers" in memory
        w.model_control.load_model(starter)
        qtbot.waitUntil(lambda: len(loads) == 3, timeout=30_000)
        assert loads[-1].kept and loads[-1].path == starter
        assert bar.resident.text() == "+1 loaded" and f"Kept loaded: {tiny.stem} " in bar.resident.toolTip()
        assert w.statusBar().currentMessage().startswith(f"Switched to {model_label(starter)} in ")
        w.chat.model.unload()  # Eject
        qtbot.waitUntil(lambda: w.chat.loaded is None, timeout=30_000)
        qtbot.waitUntil(lambda: not bar.resident.isVisible(), timeout=10_000)
        assert w.inspector.shown["resident"] == ""
    finally:
        w.shutdown()


class _Local:
    def __init__(self, pid: int | None) -> None:
        self.worker_pid = pid


class _Session:
    def __init__(self, pid: int | None) -> None:
        self.local = _Local(pid)


def test_the_workers_resident_memory_is_measured_and_none_without_a_worker() -> None:
    me = psutil.Process().memory_info().rss
    measured = workers_rss([_Session(os.getpid()), _Session(None)])  # type: ignore[list-item]
    assert measured is not None and 0.8 * me <= measured <= 1.25 * me
    assert workers_rss([_Session(None)]) is None  # type: ignore[list-item]
    twice = workers_rss([_Session(os.getpid()), _Session(os.getpid())])  # type: ignore[list-item]
    assert twice is not None and 1.6 * me <= twice <= 2.5 * me
