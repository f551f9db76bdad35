"""The will-it-fit estimator: hand-computed numbers for the starter model, llama.cpp's own figures,
and the verdict logic on fake machines."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.fit import (
    CTX_PAD,
    OVERHEAD_BYTES,
    VRAM_RESERVE,
    auto_gpu_layers,
    compute_buffer_bytes,
    decode_bytes_per_token,
    estimate_fit,
    estimate_fit_from_size,
    expected_decode_tps,
    kv_bytes_per_token,
    kv_cache_bytes,
    layer_kv_bytes,
    swa_layers,
)
from engine.gguf import GgufInfo, read_gguf_info
from engine.hardware import GpuInfo, HardwareInfo

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture(scope="module")
def gemma(starter_model: Path) -> GgufInfo:
    return read_gguf_info(starter_model)


def machine(ram_gib: float = 32, gpus: list[GpuInfo] | None = None, offload: bool = True) -> HardwareInfo:
    return HardwareInfo(
        total_ram=int(ram_gib * GIB),
        available_ram=int(ram_gib * GIB * 0.9),
        cpu_count_physical=8,
        cpu_count_logical=16,
        cpu_name="Test CPU",
        gpu_offload_supported=offload,
        gpus=gpus or [],
    )


def nvidia(free_bytes: int) -> GpuInfo:
    return GpuInfo("Test GPU", "nvidia", free_bytes + GIB, free_bytes)


# ---------------------------------------------------------------------- KV cache, by hand
@pytest.mark.model
def test_starter_kv_cache_by_hand(gemma: GgufInfo) -> None:
    # Gemma 3 270M: 18 layers, 1 KV head, key and value heads of 256, f16 (2 bytes)
    per_layer_token = 1 * (256 + 256) * 2
    assert kv_bytes_per_token(gemma) == 18 * per_layer_token == 18_432
    assert kv_cache_bytes(gemma, 4096) == 18 * 4096 * per_layer_token  # full-size SWA (the default)
    # With a windowed SWA cache: layers 5, 11, 17 are global; the 15 others keep
    # pad256(min(4096, 512 + 512)) = 1024 cells.
    assert swa_layers(gemma) == [i % 6 < 5 for i in range(18)]
    windowed = (3 * 4096 + 15 * 1024) * per_layer_token
    assert kv_cache_bytes(gemma, 4096, swa_full=False) == windowed
    assert kv_cache_bytes(gemma, 512, swa_full=False) == kv_cache_bytes(gemma, 512)
    # quantized caches: 256 values = 8 blocks of 32 (q8_0: 34 bytes a block, q4_0: 18)
    assert kv_bytes_per_token(gemma, "q8_0") == 18 * 2 * 8 * 34
    assert kv_bytes_per_token(gemma, "q4_0") == 18 * 2 * 8 * 18
    assert sum(layer_kv_bytes(gemma, 100)) == kv_cache_bytes(gemma, 100)


@pytest.mark.model
def test_starter_fit_in_ram(gemma: GgufInfo) -> None:
    est = estimate_fit(gemma, machine(ram_gib=16), 4096, bandwidth_gbps=10.0)
    assert est.verdict == "ram"
    assert est.gpu_layers == 0
    assert est.weights_bytes == gemma.tensor_bytes == 246_587_904
    assert est.kv_bytes == 4096 * 18_432
    assert est.total_bytes == est.weights_bytes + est.kv_bytes + est.compute_bytes + OVERHEAD_BYTES
    # decode reads the (tied) embedding as the output head, so all weights, plus the KV cache
    assert decode_bytes_per_token(gemma) == gemma.tensor_bytes
    expected = 10e9 / (gemma.tensor_bytes + 4096 * 18_432)
    assert est.expected_decode_tps == pytest.approx(expected)
    assert "fits in RAM" in est.message
    assert "tokens/s" in est.message
    assert est.to_dict()["verdict"] == "ram"


@pytest.mark.model
def test_starter_buffers_by_hand(gemma: GgufInfo) -> None:
    # logits for a 512-token micro-batch over a 262,144-token vocabulary dominate
    logits = 512 * 262_144 * 4
    assert compute_buffer_bytes(gemma, 4096) == logits + 2 * 512 * 640 * 4 + 262_144 * 4
    # with a huge context the attention scores would take over
    assert compute_buffer_bytes(gemma, 1 << 20) > logits


@pytest.mark.model
def test_context_length_is_padded_like_llama_cpp(gemma: GgufInfo) -> None:
    assert estimate_fit(gemma, machine(), 1000).n_ctx == 1024
    assert estimate_fit(gemma, machine(), 1000).kv_bytes == kv_cache_bytes(gemma, 1024)
    assert CTX_PAD == 256


# ---------------------------------------------------------------------- llama.cpp's own figures
_LOAD = textwrap.dedent(
    """
    import sys
    from engine.cpu_backend import load_backends
    load_backends()  # the portable build's CPU code, as the worker loads it
    from llama_cpp import Llama
    llm = Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=2, verbose=True,
                swa_full=sys.argv[3] == "1")
    print("N_CTX", llm.n_ctx(), file=sys.stderr)
    """
)


def _llama_log(model: Path, n_ctx: int, swa_full: bool) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(model), str(n_ctx), "1" if swa_full else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def _mib(pattern: str, log: str) -> float:
    values = [float(v) for v in re.findall(pattern, log)]
    assert values, f"{pattern!r} not in llama.cpp's log"
    return sum(values) * MIB


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("swa_full", [True, False])
def test_kv_and_buffers_match_llama_cpp(gemma: GgufInfo, starter_model: Path, swa_full: bool) -> None:
    pytest.importorskip("llama_cpp")
    n_ctx = 4096
    log = _llama_log(starter_model, n_ctx, swa_full)
    kv_logged = _mib(r"llama_kv_cache: size =\s*([\d.]+) MiB", log)
    ours = kv_cache_bytes(gemma, n_ctx, swa_full=swa_full)
    assert ours == pytest.approx(kv_logged, rel=0.10)
    buffers_logged = _mib(r"compute buffer size =\s*([\d.]+) MiB", log) + _mib(
        r"output buffer size =\s*([\d.]+) MiB", log
    )
    assert compute_buffer_bytes(gemma, n_ctx) == pytest.approx(buffers_logged, rel=0.05)


# ---------------------------------------------------------------------- verdicts on fake machines
def _synthetic(layers: int = 32, layer_bytes: int = 200 * MIB, other: int = 500 * MIB) -> GgufInfo:
    """A 7B-class shape: 32 layers, 8 KV heads of 128."""
    total = layers * layer_bytes + other
    return GgufInfo(
        path=Path("synthetic.gguf"),
        file_size=total + 10 * MIB,
        version=3,
        architecture="llama",
        name="S",
        n_params=7_000_000_000,
        n_layers=layers,
        n_heads=32,
        n_kv_heads=8,
        head_dim_k=128,
        head_dim_v=128,
        embedding_length=4096,
        context_length=8192,
        sliding_window=None,
        file_type="Q4_K_M",
        chat_template=None,
        bos_token=None,
        eos_token=None,
        n_tensors=291,
        tensor_data_offset=10 * MIB,
        tensor_bytes=total,
        layer_bytes=[layer_bytes] * layers,
        other_bytes=other,
        expert_count=None,
        metadata={"llama.feed_forward_length": 14336},
        embedding_bytes=other // 2,
        tied_embeddings=False,
        vocab_size=128256,
    )


def test_no_gpu_fits_in_ram() -> None:
    info = _synthetic()
    est = estimate_fit(info, machine(ram_gib=32), 8192)
    assert est.verdict == "ram"
    assert est.gpu_layers == 0
    assert est.kv_bytes == 32 * 8192 * 8 * (128 + 128) * 2  # 1 GiB
    assert auto_gpu_layers(info, 8192, machine(ram_gib=32)) == 0
    assert est.expected_decode_tps is None  # no bandwidth given


def test_big_gpu_takes_everything() -> None:
    info = _synthetic()
    hw = machine(gpus=[nvidia(24 * GIB)])
    est = estimate_fit(info, hw, 8192)
    assert est.verdict == "gpu"
    assert est.gpu_layers == 33  # 32 layers + the output layer
    assert est.gpu_bytes <= est.vram_budget == 24 * GIB - VRAM_RESERVE
    assert auto_gpu_layers(info, 8192, hw) == 33
    assert "fits on GPU" in est.message


def test_small_gpu_gives_partial_offload_with_the_layers_that_fit() -> None:
    info = _synthetic()
    n_ctx = 8192
    per_layer = 200 * MIB + kv_cache_bytes(info, n_ctx) // 32
    compute = compute_buffer_bytes(info, n_ctx)
    free = VRAM_RESERVE + compute + 10 * per_layer + per_layer // 2  # room for exactly 10 layers
    est = estimate_fit(info, machine(ram_gib=32, gpus=[nvidia(free)]), n_ctx, bandwidth_gbps=50)
    assert est.verdict == "partial"
    assert est.gpu_layers == 10
    assert "10 of 32 layers" in est.message
    assert est.gpu_bytes == compute + 10 * per_layer
    # the GPU's share speeds decoding up compared with RAM only
    ram_only = estimate_fit(info, machine(ram_gib=32), n_ctx, bandwidth_gbps=50)
    assert est.expected_decode_tps is not None
    assert ram_only.expected_decode_tps is not None
    assert est.expected_decode_tps > ram_only.expected_decode_tps


def test_gpu_too_small_for_one_layer_falls_back_to_ram() -> None:
    est = estimate_fit(_synthetic(), machine(ram_gib=32, gpus=[nvidia(VRAM_RESERVE + 10 * MIB)]), 8192)
    assert est.verdict == "ram"
    assert est.gpu_layers == 0


def test_gpu_without_offload_support_is_not_used_and_says_why() -> None:
    est = estimate_fit(_synthetic(), machine(gpus=[nvidia(24 * GIB)], offload=False), 4096)
    assert est.verdict == "ram"
    assert "no GPU offload" in est.message


def test_huge_model_wont_fit() -> None:
    huge = _synthetic(layers=80, layer_bytes=2 * GIB)
    est = estimate_fit(huge, machine(ram_gib=32, gpus=[nvidia(8 * GIB)]), 4096)
    assert est.verdict == "no"
    assert est.gpu_layers == 0
    assert "won't fit" in est.message
    assert "smaller quantization" in est.message


def test_reserve_keeps_room_for_the_system() -> None:
    info = _synthetic()
    need = estimate_fit(info, machine(), 4096).total_bytes
    hw = HardwareInfo(
        total_ram=need + GIB,
        available_ram=need + GIB,
        cpu_count_physical=4,
        cpu_count_logical=4,
        cpu_name="x",
        gpu_offload_supported=False,
    )
    assert estimate_fit(info, hw, 4096).verdict == "no"  # 1 GiB spare is less than the 1.5 GiB reserve
    roomy = dataclasses.replace(hw, available_ram=need + 2 * GIB, total_ram=need + 2 * GIB)
    assert estimate_fit(info, roomy, 4096).verdict == "ram"


def test_apple_unified_memory_counts_one_pool() -> None:
    info = _synthetic()
    apple = GpuInfo("Apple M2", "apple", int(32 * GIB * 0.66), int(28 * GIB * 0.66), unified_memory=True)
    est = estimate_fit(info, machine(ram_gib=32, gpus=[apple]), 4096)
    assert est.verdict == "gpu"
    assert est.vram_budget <= est.ram_budget


def test_longer_context_is_slower_and_moe_reads_only_active_experts() -> None:
    info = _synthetic()
    assert expected_decode_tps(info, 8192, 100) < expected_decode_tps(info, 512, 100)
    moe = dataclasses.replace(info, expert_count=8, expert_used_count=2, expert_bytes=info.tensor_bytes // 2)
    assert decode_bytes_per_token(moe) == decode_bytes_per_token(info) - (info.tensor_bytes // 2) * 6 // 8
    assert expected_decode_tps(moe, 512, 100) > expected_decode_tps(info, 512, 100)


def test_per_layer_kv_heads_and_mla() -> None:
    hybrid = dataclasses.replace(_synthetic(layers=4), kv_heads_per_layer=[8, 0, 8, 0])
    assert kv_cache_bytes(hybrid, 100) == 2 * 100 * 8 * 256 * 2
    mla = dataclasses.replace(
        _synthetic(layers=2),
        architecture="deepseek2",
        metadata={"deepseek2.attention.kv_lora_rank": 512, "deepseek2.rope.dimension_count": 64},
    )
    assert kv_bytes_per_token(mla) == 2 * (512 + 64) * 2


def test_explicit_swa_pattern_from_the_file_wins() -> None:
    pattern = [True, False, True, True]
    info = dataclasses.replace(_synthetic(layers=4), sliding_window=128, sliding_window_pattern=pattern)
    assert swa_layers(info) == [True, False, True, True]
    assert kv_cache_bytes(info, 4096, swa_full=False) < kv_cache_bytes(info, 4096)
    unknown = dataclasses.replace(_synthetic(layers=4), architecture="mystery", sliding_window=128)
    assert swa_layers(unknown) == [False] * 4  # unknown pattern: counted as global (over-estimates)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown KV cache type"):
        kv_cache_bytes(_synthetic(), 100, "q3_k")
    with pytest.raises(ValueError, match="at least 1"):
        estimate_fit(_synthetic(), machine(), 0)


def test_estimate_from_file_size_only() -> None:
    est = estimate_fit_from_size(4 * GIB, machine(ram_gib=16), bandwidth_gbps=40)
    assert est.approximate
    assert est.verdict == "ram"
    assert est.kv_bytes == 0
    assert "KV cache is not included" in est.message
    assert est.expected_decode_tps == pytest.approx(40e9 / (4 * GIB))
    assert estimate_fit_from_size(40 * GIB, machine(ram_gib=16)).verdict == "no"
    assert estimate_fit_from_size(4 * GIB, machine(gpus=[nvidia(24 * GIB)])).verdict == "gpu"
