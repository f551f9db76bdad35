"""Quantization in a child process, and the perplexity quality check, on tiny models written here."""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import shutil
import signal
import threading
from collections import namedtuple
from pathlib import Path

import pytest
from tiny_models import generate_in_subprocess, tensor_count, tensor_names, write_tiny_llama_gguf

from engine.convert.perplexity import QualityReport, perplexity, quality_check
from engine.convert.quantize import (
    QuantizeProgress,
    default_output_path,
    find_quant_type,
    quant_types,
    quantize_model,
)
from engine.errors import Cancelled, ModelFileError, QuantizeError
from engine.gguf import read_gguf_info

SHIPPED_TEXT = Path(__file__).resolve().parents[2] / "resources" / "perplexity.txt"
# A third of the shipped text keeps the test quick (the tiny vocabulary is nearly one token per byte).
TEXT = SHIPPED_TEXT.read_text(encoding="utf-8")[:1000]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="module")
def tiny_f32(models_dir: Path) -> Path:
    return write_tiny_llama_gguf(models_dir / "tiny-F32.gguf", dtype="F32")


@pytest.fixture(scope="module")
def tiny_f16(models_dir: Path) -> Path:
    return write_tiny_llama_gguf(models_dir / "tiny-F16.gguf", dtype="F16", seed=1)


@pytest.fixture(scope="module")
def bigger_f16(models_dir: Path) -> Path:
    """About 40 MB: slow enough (a second or so) that a cancel or a kill lands mid-way."""
    return write_tiny_llama_gguf(models_dir / "bigger-F16.gguf", dtype="F16", n_embd=512, n_ff=1536, n_layer=6)


@pytest.fixture(scope="module")
def tiny_q8(tiny_f32: Path, models_dir: Path) -> Path:
    return quantize_model(tiny_f32, models_dir / "tiny-Q8_0.gguf", "Q8_0", threads=2).path


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    assert "Traceback" not in text
    return text


# --------------------------------------------------------------------------- the type table


def test_quant_types_lists_what_the_build_offers() -> None:
    import llama_cpp.llama_cpp as native

    types = {qt.name: qt for qt in quant_types()}
    for name in ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q4_0", "Q3_K_M", "Q2_K", "IQ4_XS"):
        assert name in types, name
        assert types[name].available, name
    for name in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "IQ3_XXS", "Q2_K_S"):
        assert types[name].needs_imatrix, name
        assert not types[name].available, name
    for qt in types.values():
        constant = "LLAMA_FTYPE_ALL_F32" if qt.name == "F32" else f"LLAMA_FTYPE_MOSTLY_{qt.name}"
        assert getattr(native, constant) == qt.ftype
    assert types["Q8_0"].bits_per_weight > types["Q6_K"].bits_per_weight > types["Q4_K_M"].bits_per_weight
    assert types["Q4_K_M"].bits_per_weight > types["Q3_K_M"].bits_per_weight > types["Q2_K"].bits_per_weight


def test_find_quant_type_accepts_aliases_and_lists_choices_for_unknown() -> None:
    assert find_quant_type("q4_k").name == "Q4_K_M"
    assert find_quant_type(" q5-k-s ").name == "Q5_K_S"
    with pytest.raises(QuantizeError) as err:
        find_quant_type("Q7_Z")
    assert "Q7_Z" in _one_line(err.value)
    assert "Q4_K_M" in str(err.value)


def test_default_output_path_replaces_a_type_suffix(tmp_path: Path) -> None:
    assert default_output_path(Path("/m/gemma-2b-F16.gguf"), "Q4_K_M") == Path("/m/gemma-2b-Q4_K_M.gguf")
    assert default_output_path(Path("/m/llama.q8_0.gguf"), "Q6_K", tmp_path) == tmp_path / "llama-Q6_K.gguf"
    assert default_output_path(Path("/m/phi.gguf"), "Q8_0").name == "phi-Q8_0.gguf"


# --------------------------------------------------------------------------- quantizing


@pytest.mark.model
def test_quantize_f32_to_q8_0_then_generate(tiny_f32: Path, tmp_path: Path) -> None:
    events: list[QuantizeProgress] = []
    dst = tmp_path / "out.gguf"
    result = quantize_model(tiny_f32, dst, "q8_0", threads=2, progress=events.append)

    assert result.path == dst
    assert result.qtype == "Q8_0"
    assert result.source_type == "F32"
    info = read_gguf_info(dst)
    assert info.file_type == "Q8_0"
    assert info.n_tensors == tensor_count(2)
    assert 3.0 < result.ratio < 4.0  # 32 bits -> 8.5 bits per weight, norms stay F32
    assert result.dst_bytes == dst.stat().st_size
    # Per-tensor progress, parsed from llama.cpp's log in the parent: every tensor, in order.
    assert [e.done_tensors for e in events] == list(range(1, tensor_count(2) + 1))
    assert {e.total_tensors for e in events} == {tensor_count(2)}
    assert {e.tensor_name for e in events} == set(tensor_names(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf"]  # no temp file left

    out = generate_in_subprocess(dst)
    assert out["tokens"] == 5


@pytest.mark.model
def test_quantize_f16_to_q4_k_m_then_generate(tiny_f16: Path, tmp_path: Path) -> None:
    result = quantize_model(tiny_f16, tmp_path / "q4.gguf", "Q4_K_M", threads=2)
    assert read_gguf_info(result.path).file_type == "Q4_K_M"
    assert result.ratio > 2.5  # 16 bits -> about 5 bits per weight (the small output tensors are Q6_K)
    assert generate_in_subprocess(result.path)["tokens"] == 5


@pytest.mark.model
def test_quantized_source_needs_allow_requantize(tiny_q8: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantizeError) as err:
        quantize_model(tiny_q8, tmp_path / "re.gguf", "Q4_K_M")
    message = _one_line(err.value)
    assert message.startswith(f"{tiny_q8}: already quantized (Q8_0)")
    assert list(tmp_path.iterdir()) == []

    result = quantize_model(tiny_q8, tmp_path / "re.gguf", "Q4_K_M", allow_requantize=True, threads=2)
    assert read_gguf_info(result.path).file_type == "Q4_K_M"


@pytest.mark.model
def test_a_split_source_is_quantized_whole(tmp_path: Path) -> None:
    write_tiny_llama_gguf(tmp_path / "split-F16.gguf", dtype="F16", split_max_tensors=8)
    parts = sorted(tmp_path.iterdir())
    assert [p.name for p in parts] == [f"split-F16-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    dst = default_output_path(parts[0], "Q8_0")
    assert dst.name == "split-Q8_0.gguf"

    result = quantize_model(parts[0], dst, "Q8_0", threads=1)
    assert read_gguf_info(dst).n_tensors == tensor_count(2)
    assert result.src_bytes == sum(p.stat().st_size for p in parts)
    with pytest.raises(QuantizeError, match=r"part of a split model; quantize its first part \(split-F16-00001"):
        quantize_model(parts[1], tmp_path / "x.gguf", "Q8_0")


@pytest.mark.model
def test_a_llama_cpp_failure_is_reported_verbatim(tmp_path: Path) -> None:
    src = write_tiny_llama_gguf(tmp_path / "odd-F16.gguf", dtype="F16", arch="nonsense")
    with pytest.raises(QuantizeError) as err:
        quantize_model(src, tmp_path / "o.gguf", "Q8_0", threads=1)
    assert _one_line(err.value) == (
        f"{src}: quantization to Q8_0 failed before the first tensor: unknown model architecture: 'nonsense'"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd-F16.gguf"]


def test_imatrix_types_are_refused_up_front(tiny_f32: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match="IQ2_XXS needs an importance matrix"):
        quantize_model(tiny_f32, tmp_path / "x.gguf", "IQ2_XXS")


def test_bad_sources_and_destinations_are_one_line_errors(tiny_f32: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a model" * 10)
    with pytest.raises(ModelFileError) as err:
        quantize_model(junk, tmp_path / "o.gguf", "Q8_0")
    assert _one_line(err.value).startswith(str(junk))
    with pytest.raises(ModelFileError):
        quantize_model(tmp_path / "missing.gguf", tmp_path / "o.gguf", "Q8_0")

    with pytest.raises(QuantizeError, match="output folder does not exist"):
        quantize_model(tiny_f32, tmp_path / "no" / "such" / "o.gguf", "Q8_0")
    with pytest.raises(QuantizeError, match=r"must end in \.gguf"):
        quantize_model(tiny_f32, tmp_path / "o.bin", "Q8_0")
    existing = tmp_path / "exists.gguf"
    existing.write_bytes(b"keep me")
    with pytest.raises(QuantizeError, match="already exists"):
        quantize_model(tiny_f32, existing, "Q8_0")
    assert existing.read_bytes() == b"keep me"
    with pytest.raises(QuantizeError, match="overwrite the source"):
        quantize_model(tiny_f32, tiny_f32, "Q8_0", overwrite=True)


def test_not_enough_space_is_checked_before_starting(
    tiny_f32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(QuantizeError) as err:
        quantize_model(tiny_f32, tmp_path / "o.gguf", "Q8_0")
    assert re.search(r"not enough free space \(needs about [\d.]+ MiB, 4.0 KiB free\)", _one_line(err.value))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.model
def test_cancel_terminates_the_child_and_leaves_no_file(bigger_f16: Path, tmp_path: Path) -> None:
    others = _children()
    src = bigger_f16
    cancel = threading.Event()
    seen: list[int] = []

    def on_progress(p: QuantizeProgress) -> None:
        seen.append(p.done_tensors)
        cancel.set()

    with pytest.raises(Cancelled) as err:
        quantize_model(src, tmp_path / "c.gguf", "Q4_K_M", threads=1, cancel=cancel, progress=on_progress)
    assert "no file was written" in _one_line(err.value)
    assert seen
    assert max(seen) < tensor_count(6)  # stopped mid-way, not after the last tensor
    assert list(tmp_path.iterdir()) == []
    assert _children() <= others  # our child is gone (other tests' workers may still run)


@pytest.mark.model
def test_a_killed_child_is_reported_with_its_signal(bigger_f16: Path, tmp_path: Path) -> None:
    others = _children()

    def kill_child(p: QuantizeProgress) -> None:
        if p.done_tensors == 1:
            for pid in _children() - others:  # only the quantization child, not other tests' workers
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(QuantizeError) as err:
        quantize_model(bigger_f16, tmp_path / "k.gguf", "Q6_K", threads=1, progress=kill_child)
    message = _one_line(err.value)
    assert message.startswith(f"{bigger_f16}: the quantization process crashed after ")
    assert re.search(rf"crashed after \d+ of {tensor_count(6)} tensors", message)
    assert "(killed by SIGKILL (out of memory?)); no file was written" in message
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- perplexity


@pytest.mark.model
def test_perplexity_and_quality_check(tiny_f32: Path, tiny_q8: Path) -> None:
    ppl = perplexity(tiny_f32, TEXT, n_ctx=128, threads=1)
    # A random model is close to uniform over its 416 tokens.
    assert math.isfinite(ppl)
    assert 50 < ppl < 5000

    report = quality_check(tiny_f32, tiny_q8, TEXT, qtype="Q8_0", n_ctx=128, threads=1)
    assert report.source_perplexity == pytest.approx(ppl, rel=1e-6)  # deterministic on one machine
    assert abs(report.perplexity_change_pct) < 2.0  # Q8_0 is nearly lossless
    assert re.fullmatch(r"Q8_0: \d+\.\dx smaller, perplexity [+-]\d+\.\d%", report.summary())


@pytest.mark.model
def test_perplexity_reports_its_progress_as_it_scores(tiny_f32: Path) -> None:
    """The quality check's bar moves with the tokens scored (issue 28: it sat at 0% for ~50 s)."""
    seen: list[tuple[int, int]] = []
    ppl = perplexity(tiny_f32, TEXT, n_ctx=128, threads=1, on_progress=lambda done, total: seen.append((done, total)))
    assert math.isfinite(ppl)
    totals = {total for _done, total in seen}
    assert len(totals) == 1 and len(seen) >= 3  # one per batch of 64 tokens
    (total,) = totals
    done = [d for d, _t in seen]
    assert done == sorted(done) and done[-1] == total and done[0] < total


def test_quality_report_summary_format() -> None:
    report = QualityReport("Q4_K_M", 3.62, 10.0, 10.41)
    assert report.summary() == "Q4_K_M: 3.6x smaller, perplexity +4.1%"
    assert report.to_dict()["summary"] == report.summary()


def test_quality_report_summary_of_a_larger_result_says_larger() -> None:
    """A result bigger than its source (say, F16 from a Q8_0) reads as the CLI text does, in --json too."""
    report = QualityReport("F16", 0.5, 10.0, 10.0)
    assert report.summary() == "F16: 2.0x larger, perplexity +0.0%"
    assert "smaller" not in report.to_dict()["summary"]
    assert QualityReport("Q8_0", 1.01, 10.0, 10.1).summary() == "Q8_0: about the same size, perplexity +1.0%"


def test_perplexity_rejects_bad_input(tmp_path: Path) -> None:
    from engine.errors import EngineError, ModelLoadError

    with pytest.raises(EngineError, match="needs some text"):
        perplexity(tmp_path / "m.gguf", "   ")
    with pytest.raises(ModelLoadError):
        perplexity(tmp_path / "missing.gguf", "some text")


def test_sweep_removes_only_work_files_of_dead_processes(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from engine.convert.quantize import sweep_work_files

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = int(dead.stdout)
    alive_pid = os.getpid()
    stale = [
        tmp_path / f"model-Q4_K_M.gguf.tmp-{dead_pid}",
        tmp_path / f".glassbox-convert-{dead_pid}-140.tmp",
        tmp_path / f".tiny-Q4_K_M.F16-{dead_pid}-140.gguf",
    ]
    kept = [
        tmp_path / f"model-Q8_0.gguf.tmp-{alive_pid}",  # its writer still runs
        tmp_path / "model-Q4_K_M.gguf",  # a model
        tmp_path / f".notes-{dead_pid}-1.gguf",  # not a name Glassbox writes
        tmp_path / f"draft.tmp-{dead_pid}",
    ]
    old = 1_000_000_000
    for path in stale + kept:
        path.write_bytes(b"x" * 10)
        os.utime(path, (old, old))
    # Too recent to touch: a pid check cannot see a writer on another machine (a shared folder).
    fresh = tmp_path / f"fresh.gguf.tmp-{dead_pid}"
    fresh.write_bytes(b"x")

    removed = sweep_work_files(tmp_path)

    assert sorted(removed) == sorted(stale)
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept) and fresh.exists()
    assert sweep_work_files(tmp_path / "missing") == []
