"""The local models the LLM worker keeps loaded beside the chat's, so that switching back to one
is instant (Settings → "Models kept loaded"; 1, the default, keeps none).

Runs on the ``glassbox-llm`` thread only (no lock). A model leaves, least recently used first, when
more are kept than the setting allows or when, with the one about to load, their memory (the fit
estimator's, as ``engine.inference.pool`` counts it) would exceed what the machine has free
(``engine.fit.memory_budget``, probed then) plus what the kept models hold. A kept
model whose worker died is closed when it is asked for, and the load goes on as if it were not kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.compose import LoadSettings, load_params
from engine.errors import EngineError

if TYPE_CHECKING:
    from app.compose import RemoteModel
    from app.gui.workers.llm_requests import LoadedModel, LoadRequest
    from engine.fit import ModelMemory
    from engine.inference.backends import ChatBackend

log = logging.getLogger(__name__)

MemoryOf = Callable[["LoadRequest"], "ModelMemory | None"]
"""A model's memory for its load request (None: unknown, the model is not kept)."""


@dataclass
class Kept:
    """One model kept loaded: the request that loaded it, its session and what its load said."""

    request: LoadRequest
    session: ChatBackend
    loaded: LoadedModel
    memory: ModelMemory
    since: float = 0.0  # when it was last the chat's (the resident set's clock)


@dataclass(frozen=True)
class KeptModel:
    """A model kept loaded, as the window shows it: its name, its memory (the fit estimator's),
    the seconds until its idle unload (None: never) and the model (its file: what the picker and a
    chat's remembered model name)."""

    label: str
    memory: ModelMemory
    unload_in_s: float | None
    model: Path | RemoteModel


@dataclass(frozen=True)
class ResidentState:
    """What the worker says after each change (``resident_changed``): the models kept loaded,
    most recently used first, and why the last one to go was unloaded (None: none went yet); the
    chat's own model (None: none, or a remote one), this machine's RAM and what the models' worker
    processes hold in it now (their resident set, measured; None: not measured)."""

    models: tuple[KeptModel, ...] = ()
    last_unloaded: str | None = None
    chat: KeptModel | None = None
    machine_ram: int = 0
    rss: int | None = None
    names: tuple[str, ...] = field(init=False)
    kept: tuple[Path | RemoteModel, ...] = field(init=False)
    """The models themselves, in the same order (choosing one of them is a switch)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(m.label for m in self.models))
        object.__setattr__(self, "kept", tuple(m.model for m in self.models))


def _same_load(a: LoadRequest, b: LoadRequest) -> bool:
    """The same model loaded the same way (the parameters that change what is loaded)."""
    return (
        a.model_path,
        a.n_ctx,
        a.n_threads,
        a.n_gpu_layers,
        a.overflow_policy,
        a.reply_reserve,
        a.draft_model_path,
        a.mmproj_path,
        a.kv_cache_dir,
        a.kv_cache_max_bytes,
    ) == (
        b.model_path,
        b.n_ctx,
        b.n_threads,
        b.n_gpu_layers,
        b.overflow_policy,
        b.reply_reserve,
        b.draft_model_path,
        b.mmproj_path,
        b.kv_cache_dir,
        b.kv_cache_max_bytes,
    )


def _alive(session: ChatBackend) -> bool:
    local = session.local
    return local is not None and local.worker_alive


class ResidentModels:
    """The models kept loaded besides the chat's, least recently used first.

    Args:
        memory_of: a model's memory for its load request (default: the fit estimator's).
        budget: the memory free now (default: the machine's, probed each time a model is kept
            beside a load).
        clock: the monotonic clock of the idle times (tests pass their own).
    """

    def __init__(
        self,
        memory_of: MemoryOf | None = None,
        budget: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._memory_of = memory_of or estimated_memory
        self._budget = budget or machine_budget
        self._clock = clock
        self.idle_s: float | None = None  # a kept model's idle time before it is unloaded (None: never)
        self._kept: list[Kept] = []
        self._last: str | None = None  # why the last model to go went (an Eject forgets it)
        self.closed: list[str] = []  # the labels of the models let go, and why (for the log and tests)

    def memory_of(self, request: LoadRequest) -> ModelMemory | None:
        """The memory a model takes loaded by ``request`` (None: unknown; it is not kept)."""
        return self._memory_of(request)

    def labels(self) -> list[str]:
        """The models kept, most recently used first (for the model bar)."""
        return [k.loaded.label for k in reversed(self._kept)]

    def state(self, chat: KeptModel | None = None, others: Sequence[ChatBackend] = ()) -> ResidentState:
        """The models kept, their memory and idle countdown, most recently used first, and why the
        last one went (the worker's ``resident_changed``: the model bar names them, the inspector
        shows their memory), with ``chat`` (the chat's model) and the resident memory of every
        model's worker, the kept ones' and ``others``' (the chat's session)."""
        now = self._clock()
        idle = self.idle_s
        models = tuple(
            KeptModel(
                k.loaded.label, k.memory, None if idle is None else max(0.0, k.since + idle - now), k.request.model_path
            )
            for k in reversed(self._kept)
        )
        import psutil  # lazy: start-up (psutil: about 30 ms measured, not needed before a model loads)

        sessions = [*others, *self.sessions()]
        return ResidentState(models, self._last, chat, psutil.virtual_memory().total, workers_rss(sessions))

    def sweep(self) -> bool:
        """Unloads the kept models idle longer than :attr:`idle_s`; says whether one went."""
        idle = self.idle_s
        if idle is None:
            return False
        now = self._clock()
        gone = [k for k in self._kept if now - k.since >= idle]
        for kept in gone:
            self._kept.remove(kept)
            self._close(kept, f"unused for {_minutes(idle)}")
        return bool(gone)

    def take(self, request: LoadRequest) -> Kept | None:
        """The kept model ``request`` loads, taken out of the set (None: it is not kept, or its
        worker died: then it is closed)."""
        for kept in self._kept:
            if _same_load(kept.request, request):
                self._kept.remove(kept)
                if _alive(kept.session):
                    return kept
                self._close(kept, "its worker process died")
                return None
        return None

    def keep(self, kept: Kept | None, limit: int, coming: LoadRequest | None) -> None:
        """Keeps ``kept`` (the chat's model until now) if ``limit`` allows, then lets the least
        recently used go while more than ``limit - 1`` are kept or, with ``coming`` (the model about
        to load), their memory would exceed the budget."""
        if kept is not None:
            if limit > 1 and _alive(kept.session):
                kept.since = self._clock()
                self._kept.append(kept)
            else:
                self._close(kept, "Settings keep no other model loaded" if limit <= 1 else "its worker process died")
        need = 0
        if coming is not None and self._kept:
            known = self._memory_of(coming)
            need = known.total if known is not None else 0
        # what is free now, plus what the kept models hold (letting them go frees it)
        budget = self._budget() + sum(k.memory.total for k in self._kept) if self._kept else 0
        while self._kept and (
            len(self._kept) > max(limit - 1, 0) or sum(k.memory.total for k in self._kept) + need > budget
        ):
            oldest = self._kept[0]
            why = "more than the models kept loaded" if len(self._kept) > limit - 1 else "memory for the next one"
            self._kept.remove(oldest)
            self._close(oldest, why)

    def sessions(self) -> list[ChatBackend]:
        return [k.session for k in self._kept]

    def close_all(self, why: str = "unloaded") -> None:
        while self._kept:
            self._close(self._kept.pop(), why)
        self._last = None

    def _close(self, kept: Kept, why: str) -> None:
        self._last = f"{kept.loaded.label}: {why}"
        self.closed.append(self._last)
        log.info("unloading %s: %s", kept.loaded.label, why)
        try:
            kept.session.close()
        except Exception as exc:  # noqa: BLE001 - closing must never raise into the worker's slot
            log.warning("closing %s failed: %s", kept.loaded.label, exc)


def workers_rss(sessions: Sequence[ChatBackend]) -> int | None:
    """What the local models' worker processes hold in RAM now (their resident set, ``psutil``;
    the weights' pages count once read, the reserved buffers once touched); None when none runs."""
    import psutil  # lazy: start-up (psutil: about 30 ms measured, not needed before a model loads)

    total = 0
    counted = False
    for session in sessions:
        local = session.local
        pid = local.worker_pid if local is not None else None
        if pid is None:
            continue
        try:
            total += psutil.Process(pid).memory_info().rss
            counted = True
        except (psutil.Error, OSError):
            continue  # it ended meanwhile
    return total if counted else None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def estimated_memory(request: LoadRequest) -> ModelMemory | None:
    """The fit estimator's memory for a local model's load (None for a remote one or an unreadable
    file: it is not kept)."""
    if not isinstance(request.model_path, Path):
        return None
    from engine.inference.pool import estimate_memory  # lazy: start-up (+110 ms: the inference engine)

    mmproj = request.mmproj_path if isinstance(request.mmproj_path, Path) else None
    load = LoadSettings(request.n_ctx, request.n_threads, 0, request.draft_model_path, mmproj)
    try:
        return estimate_memory(load_params(request.model_path, load))
    except (EngineError, OSError, ValueError) as exc:
        log.info("the memory of %s is unknown: %s", request.model_path, exc)
        return None


def machine_budget() -> int:
    """The RAM and VRAM free now, less the fit estimator's reserve (``engine.fit.memory_budget``)."""
    # lazy: start-up (+30 ms: the hardware probe)
    from engine.fit import memory_budget
    from engine.hardware import probe_hardware

    return memory_budget(probe_hardware())
