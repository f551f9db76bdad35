"""``glassbox models list | info | fit | projector | remove | folders``: the local model library.

Human output is an aligned table or ``key: value`` lines on stdout; ``--json`` prints one JSON
document instead. Bad input raises an ``EngineError``, which ``app.cli.main`` prints as one line,
``glassbox: error: <file>: <reason>``, exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.commands._output import add_json_flag, positive_int, print_json
from app.cli.commands.model_resolver import open_library, resolve_model
from app.paths import Paths
from engine.cpu_backend import load_backends_for
from engine.display import printable
from engine.errors import ModelFileError
from engine.fit import CACHE_TYPES, estimate_fit
from engine.gguf import read_gguf_info, unsupported_reason
from engine.hardware import cached_memory_bandwidth, probe_hardware
from engine.units import format_bytes

if TYPE_CHECKING:
    from engine.fit import FitEstimate
    from engine.gguf import GgufInfo
    from engine.hardware import HardwareInfo
    from engine.library import LibraryEntry

DEFAULT_FIT_CTX = 4096


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Adds the library subcommands to the ``models`` group."""
    listing = sub.add_parser("list", parents=[common], help="the models in the library, with a fit verdict")
    add_json_flag(listing)
    listing.set_defaults(handler=run_list)

    info = sub.add_parser("info", parents=[common], help="what a GGUF file's header says (never loads it)")
    info.add_argument("path", metavar="PATH", help="a .gguf file, or the name of a model in the library")
    add_json_flag(info)
    info.set_defaults(handler=run_info)

    fit = sub.add_parser("fit", parents=[common], help="will this model fit on this machine, and how fast")
    fit.add_argument("path", metavar="PATH", help="a .gguf file, or the name of a model in the library")
    fit.add_argument(
        "--n-ctx",
        type=positive_int,
        metavar="N",
        help=f"context length (default: {DEFAULT_FIT_CTX}, or the model's if smaller)",
    )
    fit.add_argument("--cache-type", default="f16", choices=_cache_types(), help="KV cache type")
    add_json_flag(fit)
    fit.set_defaults(handler=run_fit)

    projector = sub.add_parser(
        "projector", parents=[common], help="the vision projector (mmproj) a model loads: show or choose it"
    )
    projector.add_argument("model", metavar="MODEL", help="a .gguf file, or the name of a model in the library")
    projector.add_argument("file", metavar="FILE", nargs="?", help="the projector to load with it from now on")
    projector.add_argument("--auto", action="store_true", help="back to the one found beside the model")
    add_json_flag(projector)
    projector.set_defaults(handler=run_projector)

    remove = sub.add_parser("remove", parents=[common], help="delete a model from the models folder")
    remove.add_argument("name", metavar="NAME", help="file name, name without .gguf, label or path")
    remove.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    add_json_flag(remove)
    remove.set_defaults(handler=run_remove)

    folders = sub.add_parser("folders", parents=[common], help="show, add or remove library folders")
    folders.add_argument("--add", metavar="DIR", action="append", default=[], help="index DIR in place")
    folders.add_argument("--remove", metavar="DIR", action="append", default=[], help="stop indexing DIR")
    add_json_flag(folders)
    folders.set_defaults(handler=run_folders)


# ---------------------------------------------------------------------- handlers
def run_list(args: argparse.Namespace, paths: Paths) -> int:
    """``models list``."""
    # lazy: start-up (+52 ms)
    from engine.convert.quantize import sweep_work_files

    for stale in sweep_work_files(paths.models):
        print(f"glassbox: removed {stale}, left by a quantization or conversion that was killed", file=sys.stderr)
    library = open_library(paths)
    entries = library.scan()
    hw = probe_hardware()
    fits = {e.path: _entry_fit(e, hw) for e in entries}
    if args.json:
        print_json(
            {
                "models": [{**e.to_dict(), "fit": _fit_dict(fits[e.path])} for e in entries],
                "folders": [f.to_dict() for f in library.folders()],
            }
        )
        return 0
    if not entries:
        _out(f"No models yet in {library.models_dir}. Try: glassbox models search QUERY")
    else:
        rows = [["NAME", "ARCH", "PARAMS", "QUANT", "SIZE", "CTX", "FIT", "WHERE"]]
        for e in entries:
            where = "models" if e.owned else str(e.folder)
            rows.append(
                [
                    e.label,
                    e.architecture or "-",
                    _params(e.params),
                    e.quant or "-",
                    _size(e.size),
                    str(e.context_length or "-"),
                    _fit_word(fits[e.path], e),
                    where,
                ]
            )
        _out(_table(rows))
        for e in entries:
            if e.error:
                _out(_clean(f"  {e.name}: {e.error}"))
            if e.duplicates:
                _out(_clean(f"  {e.name}: also at {', '.join(str(p) for p in e.duplicates)}"))
            if e.projector is not None and e.sees:
                _out(_clean(f"  {e.name}: sees {e.sees} (projector {e.projector.name})"))
    for folder in library.folders():
        if not folder.available:
            _out(f"folder unavailable: {folder.path}")
    return 0


def run_info(args: argparse.Namespace, paths: Paths) -> int:
    """``models info PATH``: a projector says what it reads; a chat model what it sees, and through
    which projector."""
    info = _read(args.path, paths)
    sees, projector = _seeing(info, paths)
    if args.json:
        print_json({**info.to_dict(), "sees": sees, "mmproj": str(projector) if projector else None})
        return 0
    lines = _info_lines(info)
    where = next(i for i, (key, _v) in enumerate(lines) if key == "runs here")
    if info.architecture == "clip":
        lines.insert(where, ("reads", sees or "nothing it can use here"))
    elif projector is not None:
        lines.insert(where, ("sees", f"{sees} (through {projector.name})"))
    elif _is_chat(info):
        lines.insert(where, ("sees", "text only (no projector beside it)"))
    _out(_key_values(lines))
    return 0


def _seeing(info: GgufInfo, paths: Paths) -> tuple[str, Path | None]:
    """What ``info`` reads if it is a projector (``("images", None)``), or what a chat model sees and
    the projector it loads (chosen by hand in the library, else the one beside it); ``""`` for none."""
    # lazy: start-up (+14 ms)
    from app.compose import projector_choice, projector_for
    from engine.mmproj import read_projector

    try:
        if info.architecture == "clip":
            return read_projector(info.path, info).sees, None
        if not _is_chat(info):
            return "", None
        chosen = projector_choice(Path(info.path), paths)
        projector = projector_for(Path(info.path)) if chosen == "auto" else chosen
        return (read_projector(projector).sees, projector) if projector is not None else ("", None)
    except ModelFileError:
        return "", None


def _is_chat(info: GgufInfo) -> bool:
    # lazy: start-up (+18 ms)
    from engine.library import model_kind

    return model_kind(info) == "chat"


def run_fit(args: argparse.Namespace, paths: Paths) -> int:
    """``models fit PATH``."""

    info = _read(args.path, paths)
    unsupported = unsupported_reason(info)
    n_ctx = args.n_ctx or min(DEFAULT_FIT_CTX, info.context_length or DEFAULT_FIT_CTX)
    load_backends_for(paths.cpu_backend_state)  # first: the variant the worker will run is the one shown
    hw = probe_hardware()
    try:
        bandwidth: float | None = cached_memory_bandwidth(paths.bandwidth_cache)
    except (OSError, MemoryError):
        bandwidth = None
    # lazy: start-up (+11 ms)
    from app.compose import projector_choice, projector_for

    chosen = projector_choice(Path(info.path), paths)  # by hand in the library, else the one beside it
    projector_path = projector_for(Path(info.path)) if chosen == "auto" else chosen
    projector = _projector_info(projector_path)
    try:
        estimate = estimate_fit(info, hw, n_ctx, args.cache_type, bandwidth, projector=projector)
    except ValueError as exc:
        raise ModelFileError(info.path, str(exc)) from None
    if args.json:
        print_json(
            {
                "path": str(info.path),
                **estimate.to_dict(),
                "mmproj": str(projector_path) if projector is not None else None,
                "bandwidth_gbps": bandwidth,
                "unsupported": unsupported,
                "hardware": hw.to_dict(),
            }
        )
        return 0
    _out(estimate.message)
    if unsupported:
        _out(f"but: {unsupported}")
    lines = _fit_lines(info, estimate, hw, bandwidth)
    if projector is not None and projector_path is not None:
        counted = f"{_size(estimate.projector_bytes)} ({projector_path.name}, counted in the weights)"
        lines.insert(3, ("projector", counted))
    _out(_key_values(lines))
    return 0


def run_projector(args: argparse.Namespace, paths: Paths) -> int:
    """``models projector MODEL [FILE | --auto]``: what the Models page's Projector does."""
    # lazy: start-up (+23 ms)
    from engine.library import read_model_info

    if args.file and args.auto:
        raise ModelFileError(args.file, "give a projector FILE or --auto, not both")
    model = resolve_model(args.model, paths, for_chat=True)
    library = open_library(paths)
    if args.file or args.auto:
        library.set_projector(model, Path(args.file).expanduser() if args.file else None)
    sees, projector = _seeing(read_model_info(model), paths)
    chosen = library.chosen_projector(model) is not None
    if args.json:
        print_json({"model": str(model), "mmproj": str(projector) if projector else None, "sees": sees,
                    "chosen": chosen})  # fmt: skip
    elif projector is None:
        _out(f"{model.name}: text only (no projector beside it; choose one: glassbox models projector MODEL FILE)")
    else:
        how = "chosen by hand" if chosen else "found beside it"
        _out(f"{model.name}: sees {sees} through {projector} ({how})")
    return 0


def run_remove(args: argparse.Namespace, paths: Paths) -> int:
    """``models remove NAME``: only files inside the models folder."""

    library = open_library(paths)
    entry = library.find(args.name)
    if entry is None:
        raise ModelFileError(args.name, "no such model in the library (see glassbox models list)")
    if not args.yes:
        if not sys.stdin.isatty():
            raise ModelFileError(entry.path, "not deleted: confirm with --yes (no terminal to ask on)")
        sys.stderr.write(f"Delete {entry.path} ({_size(entry.size)})? [y/N] ")
        sys.stderr.flush()
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            sys.stderr.write("glassbox: nothing deleted\n")
            return 1
    deleted = library.remove(args.name)
    if args.json:
        print_json({"deleted": [str(p) for p in deleted]})
    else:
        for path in deleted:
            _out(f"deleted {path}")
    return 0


def run_folders(args: argparse.Namespace, paths: Paths) -> int:
    """``models folders [--add DIR] [--remove DIR]``."""
    library = open_library(paths)
    for folder in args.add:
        library.add_folder(Path(folder))
    for folder in args.remove:
        library.remove_folder(Path(folder))
    statuses = library.folders()
    if args.json:
        print_json({"folders": [f.to_dict() for f in statuses]})
        return 0
    rows = [["FOLDER", "KIND", "STATUS"]]
    for f in statuses:
        kind = "models (owned)" if f.owned else "added"
        rows.append([str(f.path), kind, "ok" if f.available else "unavailable"])
    _out(_table(rows))
    return 0


# ---------------------------------------------------------------------- helpers
def _read(spec: str, paths: Paths) -> GgufInfo:
    """A path, else a library name (a path that exists always wins); all parts of a split model."""
    # lazy: start-up (+21 ms)
    from engine.library import read_model_info

    path = Path(spec).expanduser()
    if path.exists() or path.suffix.lower() == ".gguf" or "/" in spec or "\\" in spec:
        return read_model_info(path)
    entry = open_library(paths).find(spec)
    if entry is None:
        raise ModelFileError(spec, "no such file, and no model by that name in the library")
    return read_model_info(entry.path)


def _entry_fit(entry: LibraryEntry, hw: HardwareInfo) -> FitEstimate | None:
    if entry.info is None or not entry.available:
        return None

    n_ctx = min(DEFAULT_FIT_CTX, entry.info.context_length or DEFAULT_FIT_CTX)
    try:
        projector = entry.projector_facts.header if entry.projector_facts is not None else None
        return estimate_fit(entry.info, hw, n_ctx, projector=projector)
    except ValueError:
        return None


def _projector_info(path: Path | None) -> GgufInfo | None:
    """The header of a model's projector, counted in its fit (None: no projector, or unreadable)."""
    if path is None:
        return None

    try:
        return read_gguf_info(path)
    except ModelFileError:
        return None


def _fit_dict(estimate: FitEstimate | None) -> dict[str, object] | None:
    return None if estimate is None else estimate.to_dict()


def _fit_word(estimate: FitEstimate | None, entry: LibraryEntry) -> str:
    if not entry.available:
        return "unavailable"
    if entry.error or estimate is None:
        return "error"
    if entry.kind == "embedding":
        return "embedder"  # not a chat model: chat and serve refuse it
    if entry.kind == "projector":
        return "mmproj"
    if entry.kind == "adapter":
        return "LoRA"
    if entry.info is not None and unsupported_reason(entry.info):
        return "unsupported"
    if estimate.verdict == "partial":
        return f"partial ({estimate.gpu_layers})"
    return {"gpu": "GPU", "ram": "RAM", "no": "won't fit"}[estimate.verdict]


def _info_lines(info: GgufInfo) -> list[tuple[str, str]]:
    unsupported = unsupported_reason(info)
    heads = "-" if info.n_heads is None else f"{info.n_heads} (KV {info.n_kv_heads})"
    dims = "-" if info.head_dim_k is None else f"{info.head_dim_k} / {info.head_dim_v}"
    template = "no (a default is used)"
    if info.chat_template:
        template = f"yes ({len(info.chat_template)} characters)"
    lines = [
        ("file", str(info.path)),
        ("size", f"{_size(info.file_size)} ({info.file_size} bytes)"),
        ("format", f"GGUF v{info.version}"),
        ("name", info.name or "-"),
        ("architecture", info.architecture),
        ("parameters", f"{_params(info.n_params)} ({info.n_params})"),
        ("quantization", info.file_type),
        ("layers", str(info.n_layers if info.n_layers is not None else "-")),
        ("attention heads", heads),
        ("head dims (K / V)", dims),
        ("embedding length", str(info.embedding_length or "-")),
        ("context length", str(info.context_length or "-")),
        ("sliding window", str(info.sliding_window or "-")),
        ("vocabulary", str(info.vocab_size or "-")),
        ("chat template", template),
        ("BOS / EOS", f"{info.bos_token or '-'} / {info.eos_token or '-'}"),
        ("tensors", f"{info.n_tensors} ({_size(info.tensor_bytes)} from byte {info.tensor_data_offset})"),
        ("runs here", f"no: {unsupported}" if unsupported else "yes"),
    ]
    if info.expert_count:
        lines.append(("experts", f"{info.expert_used_count or '?'} of {info.expert_count} per token"))
    lines += [("note", note) for note in info.notes]  # what the bounded reader left out, and why
    return lines


def _fit_lines(info: GgufInfo, est: FitEstimate, hw: HardwareInfo, bandwidth: float | None) -> list[tuple[str, str]]:
    gpus = ", ".join(f"{g.name} ({_size(g.free_vram)} free)" for g in hw.gpus) or "none"
    lines = [
        ("model", f"{info.path.name} ({info.architecture}, {_params(info.n_params)}, {info.file_type})"),
        ("context", f"{est.n_ctx} tokens, KV cache {est.cache_type}"),
        ("weights", _size(est.weights_bytes)),
        ("KV cache", _size(est.kv_bytes)),
        ("compute buffers", _size(est.compute_bytes)),
        ("overhead", _size(est.overhead_bytes)),
        ("total", _size(est.total_bytes)),
        ("RAM usable", f"{_size(est.ram_budget)} (of {_size(hw.total_ram)}, less a reserve for the system)"),
        ("GPUs", gpus + ("" if hw.gpu_offload_supported else "; this llama.cpp build has no GPU offload")),
        ("GPU layers (auto)", str(est.gpu_layers)),
    ]
    if est.cache_type not in ("f32", "f16", "bf16"):
        lines.append(("note", "llama.cpp needs flash attention for a quantized V cache"))
    if hw.cpu_backend is not None:
        lines.append(("CPU code", _cpu_code(hw.cpu_backend)))
    if bandwidth:
        lines.append(("memory bandwidth", f"{bandwidth:.1f} GB/s (measured)"))
    if est.expected_decode_tps is not None:
        lines.append(("expected decode", f"about {est.expected_decode_tps:.1f} tokens/s (memory-bound)"))
    return lines


def _cpu_code(backend: dict[str, Any]) -> str:
    """E.g. ``AVX-512 (zen4): AVX2 AVX512 ...; not used: sapphirerapids (AMX not yet proven ...)``."""
    if backend.get("error"):
        return f"none: {backend['error']}"
    features = " ".join(f for f in backend.get("features", []) if "=" not in f)
    text = f"{backend.get('label')}: {features}" if features else str(backend.get("label"))
    skipped = "; ".join(f"{s['variant']} ({s['why']})" for s in backend.get("skipped", []))
    return f"{text}; not used: {skipped}" if skipped else text


def _cache_types() -> Sequence[str]:
    return CACHE_TYPES


def _params(n: int | None) -> str:
    """A human parameter count: ``"268M"``, ``"7.2B"``."""
    if n is None:
        return "-"
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:.{0 if value >= 100 else 1}f}{unit}"
    return str(n)


def _size(n: int) -> str:
    return format_bytes(n)


def _clean(text: str) -> str:
    """Escapes control and bidi characters: names and tokens come from untrusted files and must not
    drive the terminal (ANSI escapes), break lines or reorder them (``engine.display.printable``)."""

    return printable(text)


def _table(rows: list[list[str]]) -> str:
    rows = [[_clean(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)


def _key_values(lines: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in lines) + 1
    return "\n".join(f"{(k + ':').ljust(width)} {_clean(v)}" for k, v in lines)


def _out(text: str) -> None:
    """Prints ``text``, each of its lines with control and bidi characters escaped."""
    sys.stdout.write("\n".join(_clean(line) for line in text.split("\n")) + "\n")
