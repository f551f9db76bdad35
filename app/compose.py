"""The composition root: how every front end (the window, ``glassbox chat``, ``glassbox serve``)
turns settings or flags and a model into a chat backend. Qt-free; it imports the engine lazily.

Contract: ARCHITECTURE.md, 'app.compose'.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import quote, unquote

if TYPE_CHECKING:
    from app.paths import Paths
    from app.settings import Settings
    from engine.inference.backends import ChatBackend
    from engine.inference.endpoints import Endpoint
    from engine.inference.runtime import LoadParams

__all__ = [
    "LEGACY_REMOTE_ROOT",
    "REMOTE_PREFIX",
    "BackendOptions",
    "GpuLayers",
    "LoadSettings",
    "LocalModel",
    "ModelRef",
    "RemoteModel",
    "auto_gpu_layers_for",
    "find_endpoint",
    "load_params",
    "load_settings_from",
    "model_key",
    "model_ref",
    "open_backend",
    "open_local",
    "open_remote",
    "open_remote_session",
    "parse_gpu_layers",
    "projector_choice",
    "projector_for",
    "resolve_gpu_layers",
]

log = logging.getLogger(__name__)

GpuLayers = int | Literal["auto"]
"""Layers to offload to the GPU: a count (0: CPU only, -1: all), or "auto" (as many as fit)."""


# ---------------------------------------------------------------------------- model references


@dataclass(frozen=True)
class LocalModel:
    """A model file on this machine (the first part of a split model)."""

    path: Path

    @property
    def name(self) -> str:
        """The file name."""
        return self.path.name


@dataclass(frozen=True)
class RemoteModel:
    """A model on a saved OpenAI-compatible endpoint (``engine.inference.endpoints``).

    Not to be confused with ``engine.inference.remote.RemoteModel``, one entry of a server's
    ``/v1/models`` listing.

    Attributes:
        endpoint: the saved endpoint's name.
        model_id: the server's model id ("" lets the server choose its first model).
    """

    endpoint: str
    model_id: str

    @property
    def name(self) -> str:
        """The model id (what a label or a log line shows)."""
        return self.model_id


ModelRef = LocalModel | RemoteModel
"""What a front end loads: a local file or a model on a saved endpoint."""

REMOTE_PREFIX = "remote:"
"""How :func:`model_key` writes a :class:`RemoteModel`: ``remote:ENDPOINT/QUOTED_MODEL_ID``."""

LEGACY_REMOTE_ROOT = "glassbox-remote"
"""The first part of the pseudo path ``glassbox-remote/ENDPOINT/MODEL`` that older versions wrote
for a remote model (the model picker, ``settings.last_model``); read, never written."""


def model_key(model: Path | ModelRef) -> str:
    """The text that stands for ``model`` in the model picker and in ``settings.last_model``.

    A local model's key is its path, as before; a remote one's is ``remote:ENDPOINT/MODEL_ID``
    (the id percent-quoted: ids hold ``/`` and ``:``). :func:`model_ref` reads it back.
    """
    if isinstance(model, RemoteModel):
        return f"{REMOTE_PREFIX}{quote(model.endpoint, safe='')}/{quote(model.model_id, safe='')}"
    return str(model.path if isinstance(model, LocalModel) else model)


def model_ref(value: str | Path | ModelRef) -> ModelRef:
    """The reference ``value`` stands for: a :func:`model_key`, a file path, the legacy
    ``glassbox-remote/ENDPOINT/MODEL`` pseudo path, or a reference already."""
    if isinstance(value, (LocalModel, RemoteModel)):
        return value
    text = str(value)
    if text.startswith(REMOTE_PREFIX):
        endpoint, sep, model_id = text[len(REMOTE_PREFIX) :].partition("/")
        if sep and endpoint:
            return RemoteModel(unquote(endpoint), unquote(model_id))
    parts = Path(text).parts
    if len(parts) == 3 and parts[0] == LEGACY_REMOTE_ROOT:
        return RemoteModel(parts[1], unquote(parts[2]))
    return LocalModel(value if isinstance(value, Path) else Path(text))


# ---------------------------------------------------------------------------- load parameters


@dataclass(frozen=True)
class LoadSettings:
    """How to load a local model, from Settings or a command's flags.

    Attributes:
        n_ctx: the context window.
        n_threads: CPU threads (None: llama.cpp decides).
        gpu_layers: layers to offload, or "auto" (resolved by :func:`resolve_gpu_layers`).
        draft_model: the draft model for speculative decoding, loaded beside it (None: none).
        mmproj: the multimodal projector loaded beside it: a file, "auto" (the one next to the
            model that fits it: :func:`projector_for`) or None (none: text only).
    """

    n_ctx: int = 4096
    n_threads: int | None = None
    gpu_layers: GpuLayers = 0
    draft_model: Path | None = None
    mmproj: Path | Literal["auto"] | None = "auto"


def load_settings_from(settings: Settings, model: Path) -> LoadSettings:
    """The window's :class:`LoadSettings` for ``model``: Settings' context, threads, GPU layers and
    the draft model chosen for it (``settings.draft_models``)."""
    draft = settings.draft_models.get(str(model))
    return LoadSettings(
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        gpu_layers=settings.gpu_layers,
        draft_model=Path(draft) if draft else None,
    )


def parse_gpu_layers(text: str) -> GpuLayers:
    """``--gpu-layers N|auto``.

    Raises:
        ValueError: neither a number nor ``auto`` (the message names the flag).
    """
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--gpu-layers must be a number or 'auto', not {text!r}") from None


def auto_gpu_layers_for(model: Path, n_ctx: int, draft: Path | None = None, mmproj: Path | None = None) -> int:
    """As many layers of ``model`` as fit in this machine's VRAM at ``n_ctx`` (0 on a CPU-only
    build, or when it cannot tell: the estimate is advisory, the CPU always works).

    Reads every part of a split model (``engine.library.read_model_info``) and counts a draft
    model and a projector that exist beside it; probes the hardware (slow: never on the GUI thread).
    """
    try:
        # lazy: start-up (+191 ms)
        from engine import hardware
        from engine.fit import auto_gpu_layers
        from engine.gguf import read_gguf_info
        from engine.library import read_model_info

        hw = hardware.probe_hardware()
        if not hw.gpu_offload_supported:
            return 0
        draft_info = read_model_info(draft) if draft is not None and draft.is_file() else None
        projector = read_gguf_info(mmproj) if mmproj is not None and mmproj.is_file() else None
        return auto_gpu_layers(read_model_info(model), n_ctx, hw, draft=draft_info, projector=projector)
    except Exception as exc:  # noqa: BLE001 - the estimate is advisory; CPU always works
        log.info("auto GPU layers unavailable for %s: %s", model, exc)
        return 0


def resolve_gpu_layers(
    spec: GpuLayers, model: Path | ModelRef, n_ctx: int, draft: Path | None = None, mmproj: Path | None = None
) -> int:
    """The layer count a load uses: ``spec`` itself, or for "auto" :func:`auto_gpu_layers_for`
    (0 for a remote model, which loads nothing here)."""
    if spec != "auto":
        return int(spec)
    ref = model_ref(model)
    if isinstance(ref, RemoteModel):
        return 0
    return auto_gpu_layers_for(ref.path, n_ctx, draft, mmproj)


def projector_for(model: Path) -> Path | None:
    """The projector (``mmproj``) next to ``model`` that fits it, by the Hub's naming
    (``engine.mmproj.find_projector``); None when there is none (or none that fits: each
    candidate's header is read and matched to the model's)."""
    # lazy: start-up (+72 ms)
    from engine.errors import ModelFileError
    from engine.library import read_model_info
    from engine.mmproj import find_projector, is_projector_name, projector_problem, read_projector

    try:
        candidates = [p for p in model.parent.iterdir() if is_projector_name(p.name) and p.is_file()]
        if not candidates:
            return None
        info = read_model_info(model)
    except (OSError, ModelFileError):
        return None
    fitting = []
    for path in candidates:
        try:
            if projector_problem(read_projector(path), info) is None:
                fitting.append(path)
        except ModelFileError as exc:
            log.info("%s: not used as a projector: %s", path, exc.reason)
    return find_projector(model, fitting)


def projector_choice(model: Path, paths: Paths) -> Path | Literal["auto"]:
    """The projector to load beside ``model``: the one chosen by hand in the profile's library
    (``engine.library.ModelLibrary.set_projector``: the Models page's Projector), read from its
    manifest without a scan; else "auto" (the one found beside it: :func:`projector_for`)."""
    # lazy: start-up (+48 ms)
    from engine.library import ModelLibrary

    library = ModelLibrary(paths.models, manifest_path=paths.models_manifest, folders_file=paths.model_folders)
    return library.chosen_projector(model) or "auto"


def load_params(model: Path, load: LoadSettings) -> LoadParams:
    """The engine's ``LoadParams`` for ``model`` (GPU layers resolved: see :func:`resolve_gpu_layers`;
    the projector found next to it unless ``load.mmproj`` says otherwise)."""
    # lazy: start-up (+301 ms: pydantic)
    from engine.inference.runtime import LoadParams

    mmproj = projector_for(model) if load.mmproj == "auto" else load.mmproj
    return LoadParams(
        model_path=model,
        n_ctx=load.n_ctx,
        n_threads=load.n_threads,
        n_gpu_layers=resolve_gpu_layers(load.gpu_layers, model, load.n_ctx, load.draft_model, mmproj),
        draft_model_path=load.draft_model,
        mmproj_path=mmproj,
    )


# ---------------------------------------------------------------------------- backends


@dataclass(frozen=True)
class BackendOptions:
    """How a backend treats a conversation, whichever model it runs.

    Attributes:
        overflow_policy: "rolling" (drop the oldest turns) or "refuse" (``ContextOverflow``).
        reply_reserve: tokens kept free for the reply.
        machine_bandwidth_gbps: the machine's memory bandwidth, for Stats (local only).
        backend_state: this machine's CPU-variant verdicts (``engine.cpu_backend``; local only).
        kv_cache: an ``engine.inference.kv_cache.KvCacheConfig`` (None: chats' KV caches not saved).
        n_ctx: a remote model's window, when the server's own is not to be trusted (None: ask it).
    """

    overflow_policy: str = "rolling"
    reply_reserve: int = 512
    machine_bandwidth_gbps: float | None = None
    backend_state: Path | None = None
    kv_cache: Any = None
    n_ctx: int | None = None


def open_local(params: LoadParams, options: BackendOptions) -> ChatBackend:
    """A ``ChatSession`` for ``params`` (not loaded yet; the engine stays in its worker process)."""
    # lazy: start-up (+517 ms: pydantic, jinja2)
    from engine.inference.session import ChatSession

    return ChatSession(
        params,
        machine_bandwidth_gbps=options.machine_bandwidth_gbps,
        overflow_policy=cast("Any", options.overflow_policy),
        reply_reserve=options.reply_reserve,
        backend_state=options.backend_state,
        kv_cache=options.kv_cache,
    )


def find_endpoint(endpoints_file: Path | None, name: str) -> Endpoint:
    """The saved endpoint called ``name``.

    Raises:
        EngineError: no endpoints file, or none by that name (one line naming it).
    """
    # lazy: start-up (+20 ms)
    from engine.errors import EngineError
    from engine.inference.endpoints import EndpointStore

    if endpoints_file is None:
        raise EngineError(f"{name}: no saved endpoints in this window")
    return EndpointStore(endpoints_file).get(name)


def open_remote_session(endpoint: Endpoint, model_id: str, options: BackendOptions) -> ChatBackend:
    """A ``RemoteSession`` for ``model_id`` on ``endpoint`` ("": the server's first model)."""
    # lazy: start-up (+580 ms: rich, pydantic)
    from engine.inference.remote import RemoteSession

    return RemoteSession(
        endpoint.url,
        model_id or None,
        endpoint.api_key,
        n_ctx=options.n_ctx,
        overflow_policy=cast("Any", options.overflow_policy),
        reply_reserve=options.reply_reserve,
    )


def open_remote(model: RemoteModel, endpoints_file: Path | None, options: BackendOptions) -> ChatBackend:
    """The ``RemoteSession`` for ``model``. Raises EngineError for an endpoint no longer saved."""
    return open_remote_session(find_endpoint(endpoints_file, model.endpoint), model.model_id, options)


def open_backend(
    model: ModelRef,
    load: LoadSettings,
    options: BackendOptions,
    endpoints_file: Path | None,
) -> ChatBackend:
    """The backend ``model`` names, not loaded yet: a local session loaded with ``load``, or a
    remote one on its saved endpoint (``load`` does not apply to it).

    Raises:
        EngineError: a remote model whose endpoint is not saved.
    """
    if isinstance(model, RemoteModel):
        return open_remote(model, endpoints_file, options)
    return open_local(load_params(model.path, load), options)
