"""How the LLM worker opens a model: the session factory and the steps around a load.

Everything here runs on the ``glassbox-llm`` thread (never on the GUI's): ``"auto"`` GPU layers are
resolved here because the hardware probe imports llama.cpp and runs ``nvidia-smi``; the breadcrumb
marks a load in progress so the next launch can tell what crashed; the machine's memory bandwidth is
probed once, after the first load. The inference child runs at the GUI's priority: it leaves a core
free while decoding (``engine.inference.runtime.default_threads``), and a niced worker lost most of
the CPU to any busy program (``tests/bench/bench_threads.py``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from app.compose import (
    BackendOptions,
    LoadSettings,
    load_params,
    model_key,
    open_local,
    projector_for,
    resolve_gpu_layers,
)
from engine.atomic import write_text_atomic

if TYPE_CHECKING:
    from app.compose import RemoteModel
    from app.gui.workers.llm_requests import LoadRequest
    from engine.inference.backends import ChatBackend
    from engine.inference.kv_cache import KvCacheConfig

log = logging.getLogger(__name__)

SessionFactory = Callable[["LoadRequest", "float | None"], "ChatBackend"]
"""Builds a (not yet loaded) session for a load request and the machine's bandwidth; tests inject fakes."""


def default_session_factory(request: LoadRequest, bandwidth: float | None) -> ChatBackend:
    """Builds the real engine session (imports the engine lazily; llama_cpp stays in the child)."""

    if not isinstance(request.model_path, Path):
        raise TypeError(f"{request.model_path}: a remote model has no local session")
    load = LoadSettings(
        request.n_ctx, request.n_threads, request.n_gpu_layers, request.draft_model_path, request.mmproj_path
    )
    options = BackendOptions(
        overflow_policy=request.overflow_policy,
        reply_reserve=request.reply_reserve,
        machine_bandwidth_gbps=bandwidth,
        backend_state=request.backend_state,
        kv_cache=kv_cache_config(request),
    )
    return open_local(load_params(request.model_path, load), options)


def resolve_layers(request: LoadRequest) -> LoadRequest:
    """``request`` with ``n_gpu_layers="auto"`` replaced by the count (computed once per load)."""
    if request.n_gpu_layers != "auto":
        return request

    mmproj = request.mmproj_path
    if mmproj == "auto":  # found once, counted here and loaded as is
        mmproj = projector_for(request.model_path) if isinstance(request.model_path, Path) else None
    layers = resolve_gpu_layers("auto", request.model_path, request.n_ctx, request.draft_model_path, mmproj)
    return replace(request, n_gpu_layers=layers, mmproj_path=mmproj)


def kv_cache_config(request: LoadRequest) -> KvCacheConfig | None:
    """The engine's KvCacheConfig for a load, or None when chats' KV caches are not saved."""
    if request.kv_cache_dir is None or request.kv_cache_max_bytes <= 0:
        return None
    # lazy: start-up (+13 ms)
    from engine.inference.kv_cache import KvCacheConfig

    return KvCacheConfig(request.kv_cache_dir, request.kv_cache_max_bytes)


def measure_bandwidth(cache: Path | None) -> float | None:
    """The machine's memory bandwidth in GB/s from the cached probe, or None when unavailable."""
    if cache is None:
        return None
    try:
        # lazy: start-up (+24 ms)
        from engine.hardware import cached_memory_bandwidth
    except ImportError:
        return None
    try:
        return float(cached_memory_bandwidth(cache))
    except (OSError, ValueError) as exc:
        log.warning("memory bandwidth probe failed: %s", exc)
        return None


def write_breadcrumb(path: Path, what: str, target: Path | RemoteModel) -> None:
    """Records risky work about to start, so the next launch can tell what crashed."""

    document = {"attempting": what, "path": model_key(target), "at": time.time()}
    write_text_atomic(path, json.dumps(document), durable=False)  # cheap to lose: no fsync, as before


def clear_breadcrumb(path: Path) -> None:
    """Removes the breadcrumb: the risky work ended (well or with a handled error)."""
    path.unlink(missing_ok=True)
