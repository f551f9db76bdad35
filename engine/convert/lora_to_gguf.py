"""A PEFT LoRA adapter folder converted to a GGUF adapter, by llama.cpp's ``convert_lora_to_gguf.py``.

Contract: ARCHITECTURE.md, 'engine.convert.lora_to_gguf'.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.convert.hf_to_gguf import _forbid_code_execution, read_safetensors_header
from engine.convert.quantize import ChildOutcome, describe_exit, run_logged_child
from engine.cpu_backend import build_marker
from engine.errors import Cancelled, ModelFileError, QuantizeError
from engine.gguf import GgufInfo, read_gguf_info
from engine.lora import AdapterMismatch, check_adapter, read_adapter

__all__ = [
    "HF_ARCHITECTURES",
    "LoraConvertResult",
    "PeftAdapter",
    "base_config_from_gguf",
    "check_peft_folder",
    "convert_lora",
    "find_lora_converter",
]

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
"""What the converter writes the adapter's matrices as."""
SCRIPT = "convert_lora_to_gguf.py"
_PARTS = (SCRIPT, "conversion/", "gguf-py/")
_MAX_CONFIG_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 3600.0

HF_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma": ("GemmaForCausalLM", "gemma"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
}
"""GGUF architectures whose Hugging Face config :func:`base_config_from_gguf` can write: the
class and ``model_type`` transformers reads. Another base is given as its Hugging Face folder."""

_CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass(frozen=True)
class PeftAdapter:
    """A checked PEFT LoRA folder."""

    folder: Path
    rank: int
    alpha: float
    targets: tuple[str, ...]
    base_model: str | None
    n_tensors: int


@dataclass(frozen=True)
class LoraConvertResult:
    """A finished conversion."""

    path: Path
    source: Path
    base: Path
    architecture: str
    rank: int | None
    alpha: float
    n_tensors: int
    dst_bytes: int
    seconds: float
    checked_against: Path | None = None  # the GGUF the adapter was checked to fit

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("path", "source", "base", "checked_against"):
            out[key] = None if out[key] is None else str(out[key])
        return out


def check_peft_folder(folder: Path) -> PeftAdapter:
    """Checks a PEFT adapter folder before anything runs.

    Raises:
        ModelFileError: not a folder, no ``adapter_config.json`` (or not a LoRA's), pickle weights,
            no safetensors weights, or a bad safetensors header (one line naming the file).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFileError(folder, "not a folder: give the folder peft saved the adapter in")
    config_path = folder / "adapter_config.json"
    if not config_path.is_file():
        raise ModelFileError(folder, "no adapter_config.json: not a PEFT adapter folder")
    if config_path.stat().st_size > _MAX_CONFIG_BYTES:
        raise ModelFileError(config_path, "adapter_config.json is larger than 1 MiB")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFileError(config_path, f"adapter_config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ModelFileError(config_path, "adapter_config.json is not a JSON object")
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise ModelFileError(config_path, f"a {peft_type or 'non-LoRA'} adapter: only LoRA adapters convert to GGUF")
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        if (folder / "adapter_model.bin").exists():
            raise ModelFileError(
                folder,
                "the adapter's weights are pickle (adapter_model.bin), which can run code: save it as safetensors",
            )
        raise ModelFileError(folder, "no adapter_model.safetensors")
    header = read_safetensors_header(weights)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    targets = config.get("target_modules")
    base = config.get("base_model_name_or_path")
    return PeftAdapter(
        folder=folder,
        rank=int(rank) if isinstance(rank, int) else 0,
        alpha=float(alpha) if isinstance(alpha, (int, float)) else 0.0,
        targets=tuple(str(t) for t in targets) if isinstance(targets, list) else (),
        base_model=str(base) if isinstance(base, str) and base else None,
        n_tensors=header.n_tensors,
    )


def base_config_from_gguf(info: GgufInfo) -> dict[str, Any]:
    """The Hugging Face ``config.json`` the converter needs, written from a GGUF's header.

    Raises:
        QuantizeError: an architecture not in :data:`HF_ARCHITECTURES`, or a header without the
            sizes (give the base model's Hugging Face folder instead).
    """
    arch = info.architecture
    if arch not in HF_ARCHITECTURES:
        raise QuantizeError(
            f"{info.path}: cannot describe a {arch} model to the LoRA converter; give the base model's "
            "Hugging Face folder (its config.json) as --base instead"
        )
    hf_class, model_type = HF_ARCHITECTURES[arch]
    meta = info.metadata

    def number(key: str) -> Any:
        value = meta.get(f"{arch}.{key}")
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    config: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": model_type,
        "hidden_size": info.embedding_length,
        "num_hidden_layers": info.n_layers,
        "num_attention_heads": info.n_heads,
        "num_key_value_heads": info.n_kv_heads,
        "intermediate_size": number("feed_forward_length"),
        "max_position_embeddings": info.context_length,
        "head_dim": info.head_dim_k,
        "vocab_size": info.vocab_size,
        "rms_norm_eps": number("attention.layer_norm_rms_epsilon"),
        "rope_theta": number("rope.freq_base"),
        "tie_word_embeddings": info.tied_embeddings,
        "torch_dtype": "float32",
    }
    if number("attention.sliding_window") is not None:
        config["sliding_window"] = number("attention.sliding_window")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads") if not config[k]]
    if missing:
        raise QuantizeError(f"{info.path}: the header does not say the model's {', '.join(missing)}")
    return {k: v for k, v in config.items() if v is not None}


def find_lora_converter(cache: Path, override: Path | None = None) -> Path:
    """The ``convert_lora_to_gguf.py`` to run: in ``override`` (the script, or a llama.cpp folder
    holding it with ``conversion/`` and ``gguf-py/``), else unpacked from the installed build's
    sdist into ``cache``.

    Raises:
        QuantizeError: none found (one line saying what to pass).
    """
    if override is not None:
        script = override if override.name == SCRIPT else override / SCRIPT
        if not script.is_file():
            raise QuantizeError(f"{override}: no {SCRIPT} there (give a llama.cpp folder or the script)")
        return script
    marker = build_marker()
    version, key = (marker or {}).get("version"), (marker or {}).get("key")
    if not isinstance(version, str) or not isinstance(key, str):
        raise QuantizeError(
            f"llama.cpp's {SCRIPT} comes with the llama-cpp-python sdist of a build made by "
            "installers/llama_build.py, and this one was not: give a llama.cpp folder with --converter"
        )
    wheels = Path(os.environ.get("GLASSBOX_WHEEL_CACHE") or Path.home() / ".cache" / "glassbox-wheels")
    sdist = wheels / f"llama-cpp-python-{version}-{key}" / f"llama_cpp_python-{version}.tar.gz"
    target = cache / "llama-lora-converter" / f"{version}-{key}"
    script = target / SCRIPT
    if script.is_file() and (target / ".unpacked").is_file():
        return script
    if not sdist.is_file():
        raise QuantizeError(
            f"{sdist}: the llama-cpp-python sdist is not there (python installers/llama_build.py sdist "
            "fetches it), or give a llama.cpp folder with --converter"
        )
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=_made(cache / "llama-lora-converter")))
    try:
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                if member.name.startswith(prefix) and member.name[len(prefix) :].startswith(_PARTS):
                    member.name = member.name[len(prefix) :]
                    members.append(member)
            archive.extractall(staging, members=members, filter="data")
        if not (staging / SCRIPT).is_file():
            raise QuantizeError(f"{sdist}: this sdist has no {SCRIPT}")
        (staging / ".unpacked").write_text(str(sdist), encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    except (OSError, tarfile.TarError) as exc:
        raise QuantizeError(f"{sdist}: could not unpack the LoRA converter ({exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return script


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _lora_child(script: str, argv: list[str]) -> None:
    """Child side: llama.cpp's script as ``__main__``, its ``conversion/`` first on the path."""
    _forbid_code_execution()
    sys.path.insert(0, str(Path(script).parent))
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


def convert_lora(
    folder: Path,
    dst: Path,
    *,
    base: Path,
    converter: Path,
    outtype: str = "f16",
    cancel: threading.Event | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    overwrite: bool = False,
) -> LoraConvertResult:
    """Converts the PEFT adapter in ``folder`` to the GGUF adapter ``dst``.

    Args:
        folder: the PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``).
        dst: the output ``.gguf``; its folder must exist.
        base: the base model: its Hugging Face folder (``config.json``) or its GGUF (then the
            adapter is checked to fit it).
        converter: llama.cpp's ``convert_lora_to_gguf.py`` (:func:`find_lora_converter`).
        outtype: ``f32``, ``f16``, ``bf16`` or ``q8_0``.
        cancel: set it to stop; the child is terminated and no file is left.
        timeout: seconds before the conversion is killed.
        overwrite: replace an existing ``dst``.

    Raises:
        ModelFileError: the folder or the base is not what it should be.
        AdapterMismatch: the adapter written does not fit the base GGUF (nothing is kept).
        QuantizeError: bad type or destination, the converter failed, crashed or timed out.
        Cancelled: ``cancel`` was set.
    """
    folder, dst, base = Path(folder), Path(dst), Path(base)
    key = outtype.strip().lower()
    if key not in OUTTYPES:
        raise QuantizeError(f"unknown adapter type {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    peft = check_peft_folder(folder)
    if dst.suffix.lower() != ".gguf":
        raise QuantizeError(f"{dst}: the output file name must end in .gguf")
    if not dst.parent.is_dir():
        raise QuantizeError(f"{dst.parent}: the output folder does not exist")
    if dst.exists() and not overwrite:
        raise QuantizeError(f"{dst}: already exists; choose another name or remove it first")
    base_gguf: Path | None = None
    if base.is_dir():
        if not (base / "config.json").is_file():
            raise ModelFileError(base, "no config.json: give the base model's Hugging Face folder or its GGUF")
    else:
        info = read_gguf_info(base)
        if info.metadata.get("general.type") == "adapter":
            raise ModelFileError(base, "this is a LoRA adapter, not the base model")
        base_gguf = base
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=".glassbox-lora-", dir=dst.parent))
    try:
        base_dir = base
        if base_gguf is not None:
            base_dir = work / "base"
            base_dir.mkdir()
            (base_dir / "config.json").write_text(json.dumps(base_config_from_gguf(info)), encoding="utf-8")
        tmp = work / "adapter.gguf"
        argv = ["--outtype", key, "--outfile", str(tmp), "--base", str(base_dir.resolve()), str(folder.resolve())]
        try:
            outcome = run_logged_child(
                _lora_child, (str(converter), argv), cancel=cancel, timeout=timeout, env=_CHILD_ENV, keep_lines=60
            )
        except TimeoutError:
            raise QuantizeError(f"{folder}: conversion took longer than {timeout:g} s and was stopped") from None
        except Cancelled:
            raise Cancelled(f"{folder}: conversion cancelled; no file was written") from None
        if outcome.exitcode != 0 or not tmp.is_file():
            raise QuantizeError(_failure(folder, outcome))
        try:
            adapter = read_adapter(tmp)
        except ModelFileError as exc:
            raise QuantizeError(f"{folder}: the converter wrote an unreadable adapter ({exc.reason})") from None
        if base_gguf is not None:
            try:
                check_adapter(tmp, base_gguf)
            except AdapterMismatch as exc:  # said of the file the user asked for
                raise AdapterMismatch(dst, exc.base, exc.reason) from None
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    return LoraConvertResult(
        path=dst,
        source=folder,
        base=base,
        architecture=adapter.architecture,
        rank=adapter.rank or peft.rank or None,
        alpha=adapter.alpha,
        n_tensors=len(adapter.targets) * 2,
        dst_bytes=dst.stat().st_size,
        seconds=time.perf_counter() - started,
        checked_against=base_gguf,
    )


def _failure(folder: Path, outcome: ChildOutcome) -> str:
    if outcome.crashed:
        return f"{folder}: the conversion process crashed ({describe_exit(outcome.exitcode)}); no file was written"
    if outcome.error and "custom code" in outcome.error:
        return f"{folder}: conversion failed: the base model needs custom Python code, which Glassbox never runs"
    for line in reversed(outcome.log):
        text = line.split(":", 2)[-1].strip() if line.startswith(("ERROR:", "CRITICAL:")) else ""
        if text:
            return f"{folder}: conversion failed: {text}"
    return f"{folder}: conversion failed: {outcome.error or describe_exit(outcome.exitcode)}"
