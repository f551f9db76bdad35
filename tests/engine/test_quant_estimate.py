"""The per-tensor size estimate of a quantization, against what llama.cpp really writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import write_tiny_llama_gguf

from engine.convert.quant_estimate import estimate_quantized, read_tensor_shapes
from engine.convert.quantize import expected_bytes, find_quant_type, quantize_model, size_change
from engine.errors import ModelFileError
from engine.fit import decode_bytes_per_token
from engine.gguf import read_gguf_info


@pytest.fixture(scope="module")
def tiny_f16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("estimate")
    # n_embd 320 is not a multiple of the K-quant block (256): the fallbacks are exercised too.
    return write_tiny_llama_gguf(folder / "odd-F16.gguf", dtype="F16", n_embd=320, n_ff=768, n_layer=4)


def test_shapes_come_from_the_header(tiny_f16: Path) -> None:
    info, shapes = read_tensor_shapes(tiny_f16)
    assert info == read_gguf_info(tiny_f16)
    assert len(shapes) == info.n_tensors
    embd = next(t for t in shapes if t.name == "token_embd.weight")
    assert embd.dims[0] == 320
    assert sum(t.n_elements for t in shapes) == info.n_params


def test_a_bad_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(ModelFileError) as err:
        read_tensor_shapes(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ModelFileError, match=r"no such file|cannot"):
        read_tensor_shapes(tmp_path / "missing.gguf")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M", "Q4_0", "Q6_K"])
def test_the_estimate_matches_what_llama_cpp_writes(tiny_f16: Path, tmp_path: Path, qtype: str) -> None:
    info, shapes = read_tensor_shapes(tiny_f16)
    estimate = estimate_quantized(info, shapes, qtype)
    result = quantize_model(tiny_f16, tmp_path / f"out-{qtype}.gguf", qtype, threads=2)
    real = read_gguf_info(result.path)
    # The tensors: exact; the file: the header differs only by the file-type key and padding.
    assert estimate.info.tensor_bytes == real.tensor_bytes, (qtype, estimate.type_bytes)
    assert abs(estimate.file_bytes - result.dst_bytes) <= 64
    assert expected_bytes(tiny_f16, find_quant_type(qtype)) == estimate.file_bytes


@pytest.mark.model
def test_the_starter_q4_k_m_is_estimated_at_its_real_size(starter_model: Path) -> None:
    """The issue's case: bits per weight said 156.6 MiB for a 241.4 MiB file (the 262,144 x 640
    embedding table is Q8_0, since 640 is not a multiple of 256)."""
    info, shapes = read_tensor_shapes(starter_model)
    estimate = estimate_quantized(info, shapes, "Q4_K_M")
    real = starter_model.stat().st_size
    assert abs(estimate.file_bytes - real) / real < 0.005
    assert estimate.type_bytes["Q8_0"] > 160 * 2**20  # the embedding table
    naive = find_quant_type("Q4_K_M").estimate_bytes(info.n_params)
    assert naive < 0.7 * real  # what the old estimate said
    # The decoder reads the tied embedding table as the output head: speed follows the real bytes.
    assert decode_bytes_per_token(estimate.info) == decode_bytes_per_token(info)


def test_unknown_type_is_refused(tiny_f16: Path) -> None:
    info, shapes = read_tensor_shapes(tiny_f16)
    with pytest.raises(ValueError, match="unknown quantization type"):
        estimate_quantized(info, shapes, "Q9_X")


def test_size_change_wording() -> None:
    assert size_change(3.62) == "3.6x smaller"
    assert size_change(0.5) == "2.0x larger"
    assert size_change(1.01) == "about the same size"
