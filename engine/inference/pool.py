"""Several models resident at once: a pool of chat sessions, each model in its own worker process.

A model is loaded on the first request that names it (:meth:`ModelPool.lease`); requests for a
model that is loading wait for that load (never a second one). Each model answers one request at
a time; at most :attr:`PoolSettings.queue_depth` more may wait for it, and a request past that, or
one that waited :attr:`PoolSettings.queue_wait_s`, gets :class:`ModelBusy` (a server's 503 with
``Retry-After``). Loads are one at a time.

Contract: ARCHITECTURE.md, 'engine.inference.pool'.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar

from engine.errors import Cancelled, EngineError
from engine.fit import ModelMemory, memory_budget, model_memory
from engine.gguf import read_gguf_info
from engine.hardware import probe_hardware
from engine.inference.kv_cache import KvCacheConfig, KvKey
from engine.inference.runtime import InferenceWorker, LoadParams, ModelInfo
from engine.library import read_model_info
from engine.units import format_bytes, format_duration

log = logging.getLogger(__name__)

__all__ = [
    "KEEP_DEFAULT",
    "Eviction",
    "ModelBusy",
    "ModelPool",
    "PoolSettings",
    "PooledSession",
    "Resident",
    "UnknownModel",
    "estimate_memory",
]

KEEP_DEFAULT = -1.0
"""``keep_alive`` of a request that does not set one: the model keeps its idle time."""
POOL_KEY = "glassbox-pool"
"""The conversation name under which the pool saves a model's prompt before unloading it."""
_POLL_S = 0.1
MAX_EVICTIONS = 64

EvictionCause = Literal["idle", "memory", "max_resident", "keep_alive", "request", "crashed", "closed"]


class ModelBusy(EngineError):
    """A model has too many requests waiting, or a request waited too long: try again later.

    Args:
        model: the model's name.
        message: one line saying why.
        retry_after_s: when to try again (a server's ``Retry-After``).
    """

    def __init__(self, model: str, message: str, retry_after_s: int) -> None:
        self.model = model
        self.retry_after_s = retry_after_s
        super().__init__(message)


class UnknownModel(EngineError):
    """A request named a model the pool cannot open."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no model called {name[:200]!r}")


class PooledSession(Protocol):
    """What the pool needs of a session (:class:`engine.inference.session.ChatSession` is one)."""

    load_params: LoadParams

    @property
    def worker(self) -> InferenceWorker | None: ...

    def load(self, cancel: threading.Event | None = None) -> ModelInfo: ...

    def park(self, config: KvCacheConfig, key: KvKey) -> int: ...

    def close(self) -> None: ...


S = TypeVar("S", bound=PooledSession)


@dataclass(frozen=True)
class PoolSettings:
    """How the pool decides what stays resident.

    Attributes:
        max_resident: most models loaded at once.
        idle_unload_s: seconds a model stays loaded with no request (None: until evicted).
        idle_per_model: that setting for some models, by name (None: never unloaded when idle).
        memory_budget: bytes the resident models may take (None: what the machine has free when
            the pool first loads, :func:`engine.fit.memory_budget`).
        queue_depth: requests that may wait for one model while it answers another.
        queue_wait_s: how long a request waits for its model before it is refused.
        retry_after_s: what a refused request is told to wait.
    """

    max_resident: int = 3
    idle_unload_s: float | None = 300.0
    idle_per_model: Mapping[str, float | None] = field(default_factory=dict)
    memory_budget: int | None = None
    queue_depth: int = 8
    queue_wait_s: float = 120.0
    retry_after_s: int = 5

    def __post_init__(self) -> None:
        if self.max_resident < 1:
            raise ValueError("max_resident must be at least 1")
        if self.queue_depth < 0:
            raise ValueError("queue_depth cannot be negative")


@dataclass(frozen=True)
class Eviction:
    """Why a model left the pool.

    Attributes:
        name: the model.
        cause: ``idle``, ``memory`` (room for another under the budget), ``max_resident``,
            ``keep_alive`` (a request's keep_alive of 0), ``request`` (unloaded by a user),
            ``crashed`` (its worker died) or ``closed`` (the pool stopped).
        reason: one line for a person.
        at: when (``time.time()``).
        kv_saved_bytes: the prompt's KV state saved before it left (0: none).
    """

    name: str
    cause: EvictionCause
    reason: str
    at: float
    kv_saved_bytes: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cause": self.cause,
            "reason": self.reason,
            "at": self.at,
            "kv_saved_bytes": self.kv_saved_bytes,
        }


@dataclass(frozen=True)
class Resident:
    """One model in the pool, as :meth:`ModelPool.resident` sees it.

    Attributes:
        name: the model's name.
        path: its file.
        state: ``loading``, ``ready`` (idle), ``busy`` (answering) or ``unloading`` (leaving:
            its prompt being saved, its worker stopping; it still holds its memory).
        memory: the fit estimator's weights, KV cache, compute buffers and overhead.
        pid: its worker process (None while loading).
        n_ctx: its context window.
        gpu_layers: layers offloaded to a GPU.
        loaded_at: when it became resident (``time.time()``; None while loading).
        idle_s: seconds since its last request ended.
        unload_in_s: seconds until its idle unload (None: never, or while requests use it).
        keep_s: its idle time (None: never unloaded when idle).
        requests: requests it answered since it was loaded.
        waiting: requests waiting for it.
    """

    name: str
    path: Path
    state: Literal["loading", "ready", "busy", "unloading"]
    memory: ModelMemory
    pid: int | None
    n_ctx: int
    gpu_layers: int
    loaded_at: float | None
    idle_s: float
    unload_in_s: float | None
    keep_s: float | None
    requests: int
    waiting: int

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": str(self.path),
            "state": self.state,
            "memory": self.memory.to_dict(),
            "pid": self.pid,
            "n_ctx": self.n_ctx,
            "gpu_layers": self.gpu_layers,
            "loaded_at": self.loaded_at,
            "idle_s": round(self.idle_s, 3),
            "unload_in_s": None if self.unload_in_s is None else round(self.unload_in_s, 3),
            "keep_s": self.keep_s,
            "requests": self.requests,
            "waiting": self.waiting,
        }


_State = Literal["unloaded", "loading", "ready", "unloading"]


class _Entry(Generic[S]):
    def __init__(self, name: str, session: S, memory: ModelMemory) -> None:
        self.name = name
        self.session = session
        self.memory = memory
        self.state: _State = "unloaded"
        self.running = False
        self.queued = 0  # the request running plus those waiting
        self.last_used = 0.0
        self.loaded_at: float | None = None
        self.requests = 0
        self.keep: float | Literal["default"] | None = "default"  # a request's keep_alive
        self.attempt = 0  # loads started
        self.failure: tuple[int, BaseException] | None = None  # the last load that failed, and why

    def alive(self) -> bool:
        worker = self.session.worker
        return worker is not None and worker.alive


class ModelPool(Generic[S]):
    """Models loaded by name, kept while they are used and the memory allows.

    Args:
        open_session: a new, unloaded session for a model name, or None when there is no such
            model (the pool raises :class:`UnknownModel`).
        settings: what stays resident (:class:`PoolSettings`).
        kv_cache: where a model's prompt is saved before it is unloaded (None: not saved).
        clock: the monotonic clock (tests pass their own).
        reaper: run the thread that unloads idle models (tests call :meth:`sweep` instead).
        estimate: a model's memory from its load parameters (the fit estimator's by default).
    """

    def __init__(
        self,
        open_session: Callable[[str], S | None],
        settings: PoolSettings | None = None,
        *,
        kv_cache: KvCacheConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        reaper: bool = True,
        estimate: Callable[[LoadParams], ModelMemory] | None = None,
    ) -> None:
        self._open = open_session
        self._estimate = estimate or estimate_memory
        self.settings = settings or PoolSettings()
        self.kv_cache = kv_cache
        self._clock = clock
        self._cond = threading.Condition()
        self._entries: dict[str, _Entry[S]] = {}
        self._loading: str | None = None
        self._closed = False
        self._budget = self.settings.memory_budget
        self._evictions: deque[Eviction] = deque(maxlen=MAX_EVICTIONS)
        self.loads = 0  # loads done since the pool started (a load waited for is not a second one)
        self._reaper: threading.Thread | None = None
        if reaper:
            self._reaper = threading.Thread(target=self._reap, name="glassbox-pool", daemon=True)
            self._reaper.start()

    # ---------------------------------------------------------------------------- requests
    @contextlib.contextmanager
    def lease(
        self,
        name: str,
        *,
        cancel: threading.Event | None = None,
        keep_alive: float | None = KEEP_DEFAULT,
    ) -> Iterator[S]:
        """The session of model ``name``, loaded if needed, for one request.

        The request has the model to itself inside the ``with``; when it leaves, the model's idle
        time starts. ``keep_alive``: seconds the model then stays loaded with no request (0: unloaded
        at once when no other request waits; None: never unloaded when idle; :data:`KEEP_DEFAULT`:
        its setting), kept for the requests that follow, as Ollama does.

        Raises:
            UnknownModel: no model is called ``name``.
            ModelBusy: too many requests wait for it, or this one waited too long.
            Cancelled: ``cancel`` was set while waiting or loading.
            ModelFileError, ModelLoadError, EngineCrashed: the model cannot be loaded.
        """
        entry = self._acquire(name, cancel)
        try:
            yield entry.session
        finally:
            self._release(entry, keep_alive)

    def session(self, name: str) -> S:
        """The session of ``name``, opened but not loaded (what a caller reads before its request:
        the load parameters, the header). Raises UnknownModel, or the header's ModelFileError."""
        with self._cond:
            self._check_open()
            return self._entry(name).session

    def _entry(self, name: str) -> _Entry[S]:
        entry = self._entries.get(name)
        if entry is None:
            session = self._open(name)
            if session is None:
                raise UnknownModel(name)
            params = session.load_params
            try:
                memory = self._estimate(params)
            except (EngineError, ValueError):
                session.close()
                raise
            entry = self._entries[name] = _Entry(name, session, memory)
        return entry

    def _acquire(self, name: str, cancel: threading.Event | None) -> _Entry[S]:
        settings = self.settings
        deadline = self._clock() + settings.queue_wait_s
        with self._cond:
            self._check_open()
            entry = self._entry(name)
            if entry.queued > settings.queue_depth:
                raise ModelBusy(
                    name,
                    f"{name}: {entry.queued} requests already use or wait for this model (at most "
                    f"{settings.queue_depth} may wait); try again later",
                    settings.retry_after_s,
                )
            entry.queued += 1
        try:
            with self._cond:
                waited_for: int | None = None  # the load this request saw running
                while True:
                    self._check_open()
                    if cancel is not None and cancel.is_set():
                        raise Cancelled("the request was cancelled while it waited for its model")
                    if entry.state == "ready" and not entry.running and not entry.alive():
                        self._crashed(entry)
                    if entry.state == "ready" and not entry.running:
                        entry.running = True
                        return entry
                    failure = entry.failure
                    if entry.state == "unloaded" and failure is not None and failure[0] == waited_for:
                        raise failure[1]  # the load it waited for failed: the same answer, not a second load
                    if entry.state == "loading":
                        waited_for = entry.attempt
                    if entry.state == "unloaded" and self._loading is None:
                        self._loading = name
                        entry.state = "loading"
                        entry.attempt += 1
                        break
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        raise ModelBusy(
                            name,
                            f"{name}: waited {format_duration(settings.queue_wait_s)} for the model; try again later",
                            settings.retry_after_s,
                        )
                    self._cond.wait(min(remaining, _POLL_S))
            return self._load(entry, cancel, deadline)
        except BaseException:
            with self._cond:
                entry.queued -= 1
                self._cond.notify_all()
            raise

    def _load(self, entry: _Entry[S], cancel: threading.Event | None, deadline: float) -> _Entry[S]:
        """Makes room and loads ``entry`` (this thread holds the pool's one load)."""
        try:
            self._make_room(entry, cancel, deadline)
            entry.session.load(cancel)
        except BaseException as exc:
            with self._cond:
                entry.state = "unloaded"
                entry.failure = None if isinstance(exc, (Cancelled, ModelBusy)) else (entry.attempt, exc)
                self._loading = None
                self._cond.notify_all()
            entry.session.close()
            raise
        with self._cond:
            self.loads += 1
            entry.state = "ready"
            entry.running = True
            entry.loaded_at = time.time()
            entry.requests = 0
            entry.last_used = self._clock()
            self._loading = None
            self._cond.notify_all()
        return entry

    def _release(self, entry: _Entry[S], keep_alive: float | None) -> None:
        unload = False
        with self._cond:
            entry.running = False
            entry.queued -= 1
            entry.requests += 1
            entry.last_used = self._clock()
            if keep_alive is None or keep_alive >= 0:
                entry.keep = keep_alive
            if entry.state == "ready" and not entry.alive():
                self._crashed(entry)
            elif keep_alive == 0 and entry.queued == 0 and entry.state == "ready":
                entry.state = "unloading"
                unload = True
            self._cond.notify_all()
        if unload:
            self._unload(entry, "keep_alive", "unloaded after its reply: the request's keep_alive was 0")

    # ---------------------------------------------------------------------------- making room
    @property
    def budget(self) -> int | None:
        """The memory the resident models may take (None until the first load measures it)."""
        return self._budget

    def _budget_now(self) -> int:
        if self._budget is None:
            self._budget = memory_budget(probe_hardware())
        return self._budget

    def _make_room(self, entry: _Entry[S], cancel: threading.Event | None, deadline: float) -> None:
        """Unloads the least recently used idle models while ``entry`` would not fit beside the
        others under the budget or the count; waits for busy ones, up to ``deadline``."""
        budget = self._budget_now()
        need = entry.memory.total
        while True:
            with self._cond:
                others = [e for e in self._entries.values() if e is not entry and e.state != "unloaded"]
                used = sum(e.memory.total for e in others)
                over_memory = used + need > budget
                over_count = len(others) + 1 > self.settings.max_resident
                if not over_memory and not over_count:
                    return
                idle = [e for e in others if e.state == "ready" and not e.running and e.queued == 0]
                if idle:
                    victim = min(idle, key=lambda e: e.last_used)
                    victim.state = "unloading"
                elif not others:
                    return  # alone, it is loaded even over the budget: the estimate is an upper bound
                else:
                    if cancel is not None and cancel.is_set():
                        raise Cancelled("the request was cancelled while it waited for its model")
                    if self._clock() >= deadline:
                        raise ModelBusy(
                            entry.name,
                            f"{entry.name}: the models in memory are all answering; try again later",
                            self.settings.retry_after_s,
                        )
                    self._cond.wait(_POLL_S)
                    continue
            if over_memory:
                cause: EvictionCause = "memory"
                reason = (
                    f"unloaded to make room for {entry.name} ({format_bytes(need)}): with it the models would "
                    f"take {format_bytes(used + need)} of the {format_bytes(budget)} budget"
                )
            else:
                cause = "max_resident"
                reason = (
                    f"unloaded to make room for {entry.name}: at most {self.settings.max_resident} "
                    "models may be loaded at once"
                )
            self._unload(victim, cause, reason)

    def _unload(self, entry: _Entry[S], cause: EvictionCause, reason: str) -> None:
        """Saves the prompt the worker holds, stops it (outside the pool's lock) and records why."""
        saved = 0
        if self.kv_cache is not None and cause != "crashed":
            saved = entry.session.park(self.kv_cache, KvKey(POOL_KEY, entry.name))
        entry.session.close()
        with self._cond:
            entry.state = "unloaded"
            entry.loaded_at = None
            self._evictions.append(Eviction(entry.name, cause, reason, time.time(), saved))
            self._cond.notify_all()

    def _crashed(self, entry: _Entry[S]) -> None:
        """Called under the lock, for a ready model no request uses: its worker died. The dead
        worker is reaped by the session's next load."""
        entry.state = "unloaded"
        entry.loaded_at = None
        self._evictions.append(
            Eviction(entry.name, "crashed", "its worker process died; the next request loads it again", time.time())
        )
        self._cond.notify_all()

    # ---------------------------------------------------------------------------- idle unloads
    def keep_s(self, name: str) -> float | None:
        """The idle time of ``name``: its last request's keep_alive, its setting, or the default."""
        entry = self._entries.get(name)
        if entry is not None and entry.keep != "default":
            return entry.keep
        if name in self.settings.idle_per_model:
            return self.settings.idle_per_model[name]
        return self.settings.idle_unload_s

    def sweep(self) -> list[str]:
        """Unloads the models idle for their idle time; returns their names."""
        now = self._clock()
        due: list[_Entry[S]] = []
        with self._cond:
            for entry in self._entries.values():
                if entry.state == "ready" and not entry.running and not entry.alive():
                    self._crashed(entry)
                    continue
                keep = self.keep_s(entry.name)
                if entry.state != "ready" or entry.running or entry.queued or keep is None:
                    continue
                if now - entry.last_used >= keep:
                    entry.state = "unloading"
                    due.append(entry)
        for entry in due:
            keep = self.keep_s(entry.name)
            self._unload(entry, "idle", f"unloaded after {format_duration(keep or 0)} without a request")
        return [e.name for e in due]

    def _reap(self) -> None:
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: self._closed, 1.0):
                    return
            try:
                self.sweep()
            except Exception:
                log.exception("the model pool's idle unload failed")

    # ---------------------------------------------------------------------------- control and views
    def unload(self, name: str, reason: str = "unloaded by request") -> bool:
        """Unloads ``name`` now (after the request it is answering). False when it is not loaded.

        Raises:
            ModelBusy: requests still wait for it.
        """
        with self._cond:
            entry = self._entries.get(name)
            if entry is None or entry.state in ("unloaded", "unloading"):
                return False
            while entry.running or entry.state == "loading":
                self._cond.wait(_POLL_S)
            if entry.state != "ready":
                return False
            if entry.queued:
                raise ModelBusy(name, f"{name}: requests wait for this model; it stays loaded", 1)
            entry.state = "unloading"
        self._unload(entry, "request", reason)
        return True

    def unload_all(self, reason: str = "unloaded by request") -> list[str]:
        """Unloads every model no request waits for; returns their names."""
        done = []
        for name in list(self._entries):
            with contextlib.suppress(ModelBusy):
                if self.unload(name, reason):
                    done.append(name)
        return done

    def is_resident(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and entry.state in ("ready", "loading")

    def resident(self) -> list[Resident]:
        """The models loaded, loading or unloading, most recently used first."""
        now = self._clock()
        out: list[Resident] = []
        with self._cond:
            for entry in self._entries.values():
                if entry.state == "ready" and not entry.running and not entry.alive():
                    self._crashed(entry)
                if entry.state == "unloaded":
                    continue
                keep = self.keep_s(entry.name)
                idle = now - entry.last_used if entry.state == "ready" else 0.0
                busy = entry.running or entry.queued > 0
                state: Literal["loading", "ready", "busy", "unloading"] = (
                    "busy" if entry.state == "ready" and busy else entry.state
                )
                worker = entry.session.worker
                info = worker.info if worker is not None else None
                params = entry.session.load_params
                out.append(
                    Resident(
                        name=entry.name,
                        path=params.model_path,
                        state=state,
                        memory=entry.memory,
                        pid=worker.pid if worker is not None and state not in ("loading", "unloading") else None,
                        n_ctx=info.n_ctx if info is not None else params.n_ctx,
                        gpu_layers=params.n_gpu_layers,
                        loaded_at=entry.loaded_at,
                        idle_s=idle,
                        unload_in_s=None if keep is None or state != "ready" else max(0.0, keep - idle),
                        keep_s=keep,
                        requests=entry.requests,
                        waiting=max(0, entry.queued - (1 if entry.running or entry.state == "loading" else 0)),
                    )
                )
        out.sort(key=lambda r: (r.state == "ready", r.idle_s))  # loading and busy first, then the most recent
        return out

    def evictions(self) -> list[Eviction]:
        """Why models left the pool, oldest first (the last :data:`MAX_EVICTIONS`)."""
        with self._cond:
            return list(self._evictions)

    def last_eviction(self, name: str) -> Eviction | None:
        """Why ``name`` last left the pool, or None."""
        with self._cond:
            return next((e for e in reversed(self._evictions) if e.name == name), None)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the model pool is closed")

    def close(self) -> None:
        """Unloads every model (each after the request it answers) and stops the idle thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for entry in list(self._entries.values()):
            with self._cond:
                while entry.running or entry.state == "loading":
                    self._cond.wait(_POLL_S)
                if entry.state != "ready":
                    entry.session.close()
                    continue
                entry.state = "unloading"
            self._unload(entry, "closed", "the model pool stopped")
        if self._reaper is not None:
            self._reaper.join(5.0)

    def __enter__(self) -> ModelPool[S]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def estimate_memory(params: LoadParams) -> ModelMemory:
    """The fit estimator's memory for a model loaded with ``params`` (split models read whole; a
    draft model and a projector beside it counted in the weights)."""
    info = read_model_info(params.model_path)
    draft = read_model_info(params.draft_model_path) if params.draft_model_path is not None else None
    projector = read_gguf_info(params.mmproj_path) if params.mmproj_path is not None else None
    return model_memory(info, params.n_ctx, n_ubatch=params.n_batch, draft=draft, projector=projector)
