"""``glassbox models quantize | convert | quant-types``: make smaller models, and check their quality.

``convert --quantize TYPE`` converts a Hugging Face checkpoint and quantizes it in one step.

Progress goes to stderr (a one-line counter on a terminal); ``--json`` prints one JSON document on
stdout. Outputs go to the models folder unless ``--out`` says otherwise, so the library lists them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from app.cli.commands._output import add_json_flag, positive_int, print_json
from app.cli.commands.model_resolver import open_library, resolve_model
from app.paths import Paths, resource_path
from engine.errors import EngineError
from engine.units import format_bytes


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    quant = sub.add_parser("quantize", parents=[common], help="quantize a GGUF model to a smaller type")
    quant.add_argument("src", metavar="SRC", help="an F32/F16/BF16 GGUF: a path or a name in the models folder")
    quant.add_argument(
        "--type",
        dest="qtype",
        required=True,
        metavar="TYPE",
        help="quantization type, e.g. Q4_K_M (see `glassbox models quant-types`)",
    )
    quant.add_argument("--out", metavar="DST", help="output .gguf (default: the models folder)")
    quant.add_argument(
        "--allow-requantize", action="store_true", help="accept an already quantized source (quality suffers)"
    )
    quant.add_argument(
        "--check-quality",
        action="store_true",
        help="compare the perplexity of source and result on a short shipped text",
    )
    quant.add_argument("--threads", type=positive_int, help="CPU threads (default: all)")
    quant.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    add_json_flag(quant)
    quant.set_defaults(handler=run_quantize)

    conv = sub.add_parser(
        "convert", parents=[common], help="convert a Hugging Face safetensors checkpoint folder to GGUF"
    )
    conv.add_argument("hf_dir", metavar="HF_DIR", help="folder with config.json, tokenizer and *.safetensors")
    kind = conv.add_mutually_exclusive_group()
    kind.add_argument("--outtype", choices=["f16", "bf16", "q8_0"], help="output type (default f16)")
    kind.add_argument(
        "--quantize",
        metavar="TYPE",
        help="convert to F16 (BF16 for a bfloat16 checkpoint), then quantize to TYPE, e.g. Q4_K_M",
    )
    conv.add_argument(
        "--keep-intermediate", action="store_true", help="with --quantize: keep the F16/BF16 conversion as well"
    )
    conv.add_argument("--threads", type=positive_int, help="CPU threads for quantizing (default: all)")
    conv.add_argument("--out", metavar="DST", help="output .gguf (default: the models folder)")
    conv.add_argument("--timeout", type=positive_int, default=3 * 3600, help="seconds before giving up (default 3 h)")
    conv.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    add_json_flag(conv)
    conv.set_defaults(handler=run_convert)

    lora = sub.add_parser("convert-lora", parents=[common], help="convert a PEFT LoRA adapter folder to a GGUF adapter")
    lora.add_argument(
        "peft_dir", metavar="PEFT_DIR", help="folder with adapter_config.json and adapter_model.safetensors"
    )
    lora.add_argument(
        "--base",
        required=True,
        metavar="MODEL",
        help="the base model: a GGUF (path or library name; the adapter is checked against it) or its "
        "Hugging Face folder (config.json)",
    )
    lora.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"], default="f16", help="(default f16)")
    lora.add_argument("--out", metavar="DST", help="output .gguf (default: the models folder, PEFT_DIR's name)")
    lora.add_argument(
        "--converter",
        metavar="DIR",
        help="a llama.cpp folder holding convert_lora_to_gguf.py (default: the pinned one)",
    )
    lora.add_argument("--timeout", type=positive_int, default=3600, help="seconds before giving up (default 1 h)")
    lora.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    add_json_flag(lora)
    lora.set_defaults(handler=run_convert_lora)

    types = sub.add_parser("quant-types", parents=[common], help="list the quantization types on offer")
    add_json_flag(types)
    types.set_defaults(handler=run_quant_types)


class _Progress:
    """A one-line counter on stderr, on a terminal only, at most ten updates a second."""

    def __init__(self, verb: str) -> None:
        self._verb = verb
        self._tty = sys.stderr.isatty()
        self._last = 0.0
        self._shown = False

    def show(self, done: int, total: int, label: str, *, force: bool = False) -> None:
        self.line(f"{self._verb} {done}/{total} {label}", force=force)

    def line(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self._tty or (not force and now - self._last < 0.1):
            return
        self._last = now
        sys.stderr.write(f"\r\x1b[K{text}"[:200])
        sys.stderr.flush()
        self._shown = True

    def end(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")


def perplexity_text_path() -> Path:
    """The shipped quality-check text (``resources/perplexity.txt``), frozen app included."""

    return resource_path("perplexity.txt")


def _record(paths: Paths, path: Path, **fields: str) -> None:
    """Notes in the library's manifest where a new model came from; a failure is only a warning."""

    try:
        open_library(paths).record_provenance(path, **fields)
    except (EngineError, OSError, ValueError) as exc:
        sys.stderr.write(f"glassbox: warning: could not record where {path.name} came from: {exc}\n")


def run_quantize(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+42 ms)
    from engine.convert.quantize import (
        QuantizeProgress,
        default_output_path,
        find_quant_type,
        quantize_model,
        size_change,
    )

    src = resolve_model(args.src, paths)
    qt = find_quant_type(args.qtype)
    dst = Path(args.out).expanduser() if args.out else default_output_path(src, qt.name, paths.models)
    bar = _Progress(f"quantizing to {qt.name}:")

    def on_progress(p: QuantizeProgress) -> None:
        bar.show(p.done_tensors, p.total_tensors, p.tensor_name, force=p.done_tensors == p.total_tensors)

    try:
        result = quantize_model(
            src,
            dst,
            qt.name,
            allow_requantize=args.allow_requantize,
            threads=args.threads,
            progress=on_progress,
            overwrite=args.overwrite,
        )
    finally:
        bar.end()
    _record(paths, result.path, quantized_from=str(result.source.resolve()), source="quantized")
    document: dict[str, object] = result.to_dict()
    quality = None
    if args.check_quality:
        # lazy: start-up (+60 ms)
        from engine.convert.perplexity import quality_check

        text = perplexity_text_path().read_text(encoding="utf-8")
        if sys.stderr.isatty():
            sys.stderr.write("measuring perplexity of source and result...\n")
        quality = quality_check(
            src, result.path, text, qtype=result.qtype, threads=args.threads, size_ratio=result.ratio
        )
        document["quality"] = quality.to_dict()
    if args.json:
        print_json(document)
        return 0
    _say(f"wrote {result.path}")
    sizes = f"{format_bytes(result.src_bytes)} -> {format_bytes(result.dst_bytes)}"
    _say(f"{result.qtype}: {size_change(result.ratio)} ({sizes}) in {result.seconds:.1f} s")
    if quality is not None:
        ppl = f"{quality.source_perplexity:.2f} -> {quality.result_perplexity:.2f}"
        _say(f"{quality.summary()} (perplexity {ppl})")  # the same words as --json's summary
    return 0


def run_convert(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+64 ms)
    from engine.convert.hf_to_gguf import ConvertProgress, convert_checkpoint, default_convert_path

    if args.quantize:
        return _run_convert_and_quantize(args, paths)
    outtype = args.outtype or "f16"
    folder = Path(args.hf_dir).expanduser()
    dst = Path(args.out).expanduser() if args.out else default_convert_path(folder, outtype, paths.models)
    bar = _Progress("converting:")

    def on_progress(p: ConvertProgress) -> None:
        bar.show(p.done, p.total, f"{p.phase} {p.label}")

    try:
        result = convert_checkpoint(
            folder,
            dst,
            outtype=outtype,
            progress=on_progress,
            timeout=float(args.timeout),
            overwrite=args.overwrite,
        )
    finally:
        bar.end()
    _record(paths, result.path, source=f"converted from {result.source.resolve()}")
    if args.json:
        print_json(result.to_dict())
        return 0
    _say(f"wrote {result.path}")
    _say(
        f"{result.architecture} -> GGUF {result.outtype}: {result.n_tensors} tensors, "
        f"{format_bytes(result.dst_bytes)}, in {result.seconds:.1f} s"
    )
    return 0


def run_convert_lora(args: argparse.Namespace, paths: Paths) -> int:
    """``models convert-lora PEFT_DIR --base MODEL``: llama.cpp's converter, then the check."""
    # lazy: start-up (+56 ms)
    from engine.convert.lora_to_gguf import convert_lora, find_lora_converter

    folder = Path(args.peft_dir).expanduser()
    base = Path(args.base).expanduser()
    if not base.exists() and "/" not in args.base and "\\" not in args.base:
        entry = open_library(paths).find(args.base)
        if entry is not None:
            base = Path(entry.path)
    dst = (
        Path(args.out).expanduser() if args.out else paths.models / f"{folder.resolve().name}-lora-{args.outtype}.gguf"
    )
    dst.parent.mkdir(parents=True, exist_ok=True)
    converter = find_lora_converter(paths.cache, Path(args.converter).expanduser() if args.converter else None)
    if not args.json:
        _say(f"converting {folder} with {converter}")
    result = convert_lora(
        folder,
        dst,
        base=base,
        converter=converter,
        outtype=args.outtype,
        timeout=float(args.timeout),
        overwrite=args.overwrite,
    )
    _record(
        paths,
        result.path,
        source=f"converted from {folder.resolve()}",
        base_model=base.stem if base.suffix else base.name,
    )
    if args.json:
        print_json(result.to_dict())
        return 0
    _say(f"wrote {result.path}")
    checked = f", checked against {result.checked_against.name}" if result.checked_against else ""
    _say(
        f"LoRA for {result.architecture}: rank {result.rank}, alpha {result.alpha:g}, {result.n_tensors} tensors, "
        f"{format_bytes(result.dst_bytes)}, in {result.seconds:.1f} s{checked}"
    )
    return 0


def _run_convert_and_quantize(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+44 ms)
    from engine.convert.hf_to_gguf import PipelineProgress, convert_and_quantize

    bar = _Progress("")

    def on_progress(p: PipelineProgress) -> None:
        bar.line(f"{p.step}/{p.steps} {p.text} {p.label}", force=p.done == p.total)

    try:
        result = convert_and_quantize(
            Path(args.hf_dir).expanduser(),
            args.quantize,
            dst=Path(args.out).expanduser() if args.out else None,
            out_folder=paths.models,
            keep_intermediate=args.keep_intermediate,
            library=open_library(paths),
            threads=args.threads,
            progress=on_progress,
            timeout=float(args.timeout),
            overwrite=args.overwrite,
        )
    finally:
        bar.end()
    for warning in result.warnings:
        sys.stderr.write(f"glassbox: warning: {warning}\n")
    if args.json:
        print_json(result.to_dict())
        return 0
    _say(f"wrote {result.path}")
    if result.intermediate is not None:
        _say(f"kept {result.intermediate}")
    steps = [result.architecture]
    if result.intermediate_type is not None:
        steps.append(
            f"{result.intermediate_type} ({format_bytes(result.intermediate_bytes)}, {result.convert_seconds:.1f} s)"
        )
        steps.append(f"{result.qtype} ({format_bytes(result.dst_bytes)}, {result.quantize_seconds:.1f} s)")
    else:
        steps.append(f"{result.qtype} ({format_bytes(result.dst_bytes)}, {result.convert_seconds:.1f} s)")
    _say(f"{' -> '.join(steps)}: {result.n_tensors} tensors in {result.seconds:.1f} s")
    return 0


def run_quant_types(args: argparse.Namespace, _paths: Paths) -> int:
    # lazy: start-up (+31 ms)
    from engine.convert.quantize import quant_types

    types = quant_types()
    if args.json:
        print_json([qt.to_dict() for qt in types])
        return 0
    _say(f"{'TYPE':<10} {'BITS/W':>6}  {'':<14} DESCRIPTION")
    for qt in types:
        note = "needs imatrix" if qt.needs_imatrix else ""
        _say(f"{qt.name:<10} {qt.bits_per_weight:>6.2f}  {note:<14} {qt.description}")
    return 0
