"""Will it fit? Memory needed by a GGUF model at a context length, against this machine.

Contract: ARCHITECTURE.md, 'engine.fit'.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from engine.gguf import GgufInfo
from engine.gguf_format import GGML_TYPES
from engine.hardware import GpuInfo, HardwareInfo
from engine.units import format_bytes

__all__ = [
    "CACHE_TYPES",
    "FitEstimate",
    "ModelMemory",
    "auto_gpu_layers",
    "compute_buffer_bytes",
    "decode_bytes_per_token",
    "estimate_fit",
    "estimate_fit_from_size",
    "expected_decode_tps",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "layer_kv_bytes",
    "memory_budget",
    "model_memory",
    "projector_bytes",
    "swa_layers",
]

GIB = 1 << 30
MIB = 1 << 20
RAM_RESERVE_MIN = int(1.5 * GIB)
RAM_RESERVE_SHARE = 0.10
VRAM_RESERVE = GIB // 2
OVERHEAD_BYTES = 150 * MIB
N_UBATCH = 512
CTX_PAD = 256  # llama.cpp pads n_ctx (and the SWA cache) to a multiple of 256
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")

# Sliding-window layer patterns of the pinned llama.cpp (src/models/*.cpp, load_swa_pattern):
# arch -> (n_pattern, dense_first). Layer il is SWA when il % n < n - 1 (or il % n != 0 when the
# dense layer comes first).
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "gpt-oss": (2, False),
    "llama4": (4, False),
    "exaone4": (4, False),
    "olmo2": (4, False),
    "smallthinker": (4, True),
}

Verdict = Literal["gpu", "partial", "ram", "no"]


@dataclass(frozen=True)
class FitEstimate:
    """The answer to "will it fit", with its numbers (bytes).

    ``gpu_layers`` is what ``--gpu-layers auto`` uses: 0 (CPU only), N (the last N layers on the
    GPU), or ``n_layers + 1`` (every layer and the output layer). ``approximate`` is True when the
    estimate had only a file size, not a header.
    """

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    total_bytes: int
    verdict: Verdict
    gpu_layers: int
    message: str
    expected_decode_tps: float | None
    overhead_bytes: int = OVERHEAD_BYTES
    n_ctx: int = 0
    cache_type: str = "f16"
    ram_budget: int = 0
    vram_budget: int = 0
    gpu_bytes: int = 0
    approximate: bool = False
    projector_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class ModelMemory:
    """What one loaded model takes (bytes): the parts :func:`estimate_fit` adds up."""

    weights: int
    kv: int
    compute: int
    overhead: int = OVERHEAD_BYTES

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready dict, with the total."""
        return {**asdict(self), "total": self.total}


# ---------------------------------------------------------------------- KV cache
def _cache_bytes(n_elements: int, cache_type: str) -> int:
    wanted = cache_type.upper()
    for name, block, size in GGML_TYPES.values():
        if name == wanted and cache_type in CACHE_TYPES:
            return -(-n_elements // block) * size
    raise ValueError(f"unknown KV cache type {cache_type!r} (one of {', '.join(CACHE_TYPES)})")


def swa_layers(info: GgufInfo) -> list[bool]:
    """Which layers use sliding-window attention (all False when the model has no window)."""
    n_layers = info.n_layers or 0
    if not info.sliding_window:
        return [False] * n_layers
    if info.sliding_window_pattern:
        pattern = list(info.sliding_window_pattern[:n_layers])
        return pattern + [False] * (n_layers - len(pattern))
    explicit = info.metadata.get(f"{info.architecture}.attention.sliding_window_pattern")
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        n, dense_first = explicit, False
    elif info.architecture in SWA_PATTERNS:
        n, dense_first = SWA_PATTERNS[info.architecture]
    else:
        return [False] * n_layers  # unknown: count every layer as global (over-estimates)
    if dense_first:
        return [n == 0 or i % n != 0 for i in range(n_layers)]
    return [n == 0 or i % n < n - 1 for i in range(n_layers)]


def _layer_token_bytes(info: GgufInfo, cache_type: str) -> list[int]:
    """KV bytes one token adds to each layer's cache."""
    n_layers = info.n_layers or 0
    arch = info.architecture
    lora = info.metadata.get(f"{arch}.attention.kv_lora_rank")
    if isinstance(lora, int) and not isinstance(lora, bool) and lora > 0:
        rope = info.metadata.get(f"{arch}.rope.dimension_count")
        rope_dims = rope if isinstance(rope, int) and not isinstance(rope, bool) else 64
        return [_cache_bytes(lora + rope_dims, cache_type)] * n_layers
    k_dim, v_dim = info.head_dim_k or 0, info.head_dim_v or 0
    heads = info.kv_heads_per_layer or [info.n_kv_heads or 0] * n_layers
    heads = (heads + [heads[-1] if heads else 0] * n_layers)[:n_layers]
    return [_cache_bytes(h * k_dim, cache_type) + _cache_bytes(h * v_dim, cache_type) for h in heads]


def layer_kv_bytes(
    info: GgufInfo, n_ctx: int, cache_type: str = "f16", *, swa_full: bool = True, n_ubatch: int = N_UBATCH
) -> list[int]:
    """KV cache bytes of each layer for ``n_ctx`` cells (see :func:`kv_cache_bytes`)."""
    n_ctx = max(0, n_ctx)
    window = info.sliding_window or 0
    swa_cells = min(n_ctx, _pad(window + n_ubatch, CTX_PAD)) if window and not swa_full else n_ctx
    return [
        per_token * (swa_cells if is_swa else n_ctx)
        for per_token, is_swa in zip(_layer_token_bytes(info, cache_type), swa_layers(info), strict=True)
    ]


def kv_cache_bytes(
    info: GgufInfo, n_ctx: int, cache_type: str = "f16", *, swa_full: bool = True, n_ubatch: int = N_UBATCH
) -> int:
    """Bytes of the KV cache for ``n_ctx`` cells (pass llama.cpp's padded ``n_ctx`` for the
    allocation, or the tokens in use for what a conversation occupies).

    Args:
        info: the model's header.
        n_ctx: cells (tokens).
        cache_type: ``f16`` (default), ``q8_0``, ``q4_0``... (:data:`CACHE_TYPES`).
        swa_full: whether sliding-window layers keep a full-size cache (llama-cpp-python's
            default); when False they keep ``pad256(min(n_ctx, window + n_ubatch))`` cells.
        n_ubatch: the micro-batch size (it sizes the SWA cache).

    Raises:
        ValueError: unknown ``cache_type``.
    """
    return sum(layer_kv_bytes(info, n_ctx, cache_type, swa_full=swa_full, n_ubatch=n_ubatch))


def kv_bytes_per_token(info: GgufInfo, cache_type: str = "f16") -> int:
    """KV bytes one token adds across all layers, as long as no sliding window is full.

    It is the rate at which the cache in use grows (a full-size SWA cache, llama-cpp-python's
    default, keeps growing at this rate for the whole context).
    """
    return sum(_layer_token_bytes(info, cache_type))


# ---------------------------------------------------------------------- buffers and decode
def compute_buffer_bytes(info: GgufInfo, n_ctx: int, *, n_ubatch: int = N_UBATCH, flash_attn: bool = False) -> int:
    """Compute plus output buffers llama.cpp reserves (see the module docstring for the formula)."""
    n_tokens = min(n_ubatch, max(1, n_ctx))
    vocab = info.vocab_size or 32000
    embd = info.embedding_length or 0
    ff = _meta_int(info, f"{info.architecture}.feed_forward_length") or 4 * embd
    heads = info.n_heads or 0
    logits = n_tokens * vocab * 4
    scores = 0 if flash_attn else n_tokens * _pad(n_ctx, CTX_PAD) * heads * 4
    activations = n_tokens * (4 * embd + 2 * ff) * 4
    hidden = 2 * n_tokens * embd * 4
    output = vocab * 4
    # The graph allocator reuses memory between stages: the peak is the larger stage.
    return max(logits, scores + activations) + hidden + output


def decode_bytes_per_token(info: GgufInfo) -> int:
    """Weight bytes the decoder reads per token: all tensors but the token-embedding lookup table
    (unless it doubles as the output head), and only the active share of the experts."""
    weights = info.tensor_bytes
    if not info.tied_embeddings:
        weights -= info.embedding_bytes
    if info.expert_bytes and info.expert_count and info.expert_used_count:
        unused = info.expert_bytes * (info.expert_count - info.expert_used_count) // info.expert_count
        weights -= max(0, unused)
    return max(weights, 1)


def expected_decode_tps(
    info: GgufInfo, n_ctx_used: int, bandwidth_gbps: float, cache_type: str = "f16", *, swa_full: bool = True
) -> float:
    """Tokens per second the memory bandwidth allows: bandwidth / (weights + KV read per token)."""
    per_token = decode_bytes_per_token(info) + kv_cache_bytes(info, n_ctx_used, cache_type, swa_full=swa_full)
    return bandwidth_gbps * 1e9 / per_token


def model_memory(
    info: GgufInfo,
    n_ctx: int,
    cache_type: str = "f16",
    *,
    swa_full: bool = True,
    n_ubatch: int = N_UBATCH,
    draft: GgufInfo | None = None,
    projector: GgufInfo | None = None,
) -> ModelMemory:
    """The weights, KV cache, compute buffers and overhead of ``info`` loaded at ``n_ctx`` (padded
    to 256 like llama.cpp), with a draft model and a projector beside it counted in the weights.

    Raises:
        ValueError: unknown ``cache_type`` or ``n_ctx < 1``.
    """
    if n_ctx < 1:
        raise ValueError(f"context length must be at least 1, not {n_ctx}")
    cells = _pad(n_ctx, CTX_PAD)
    kv = kv_cache_bytes(info, cells, cache_type, swa_full=swa_full, n_ubatch=n_ubatch)
    weights = info.tensor_bytes
    if draft is not None:
        weights += draft_model_bytes(draft, n_ctx, cache_type, swa_full=swa_full)
    if projector is not None:
        weights += projector_bytes(projector)
    return ModelMemory(weights, kv, compute_buffer_bytes(info, cells, n_ubatch=n_ubatch))


def memory_budget(hw: HardwareInfo) -> int:
    """The bytes models may take on this machine now: the RAM that :func:`estimate_fit` counts as
    usable (free RAM less the reserve) plus the usable VRAM of GPUs the build can offload to."""
    gpus = _gpus(hw)
    if any(g.unified_memory for g in gpus):
        return _ram_budget(hw)  # the GPU's memory is the RAM
    return _ram_budget(hw) + _vram_budget(gpus)


# ---------------------------------------------------------------------- verdict
def _ram_budget(hw: HardwareInfo) -> int:
    reserve = max(RAM_RESERVE_MIN, int(hw.total_ram * RAM_RESERVE_SHARE))
    return max(0, hw.available_ram - reserve)


def _gpus(hw: HardwareInfo) -> list[GpuInfo]:
    return hw.gpus if hw.gpu_offload_supported else []


def _vram_budget(gpus: list[GpuInfo]) -> int:
    # llama.cpp's default split puts whole layers on every GPU, in proportion to free memory.
    return sum(max(0, g.free_vram - VRAM_RESERVE) for g in gpus)


def estimate_fit(
    info: GgufInfo,
    hw: HardwareInfo,
    n_ctx: int,
    cache_type: str = "f16",
    bandwidth_gbps: float | None = None,
    *,
    swa_full: bool = True,
    n_ubatch: int = N_UBATCH,
    draft: GgufInfo | None = None,
    projector: GgufInfo | None = None,
) -> FitEstimate:
    """Whether ``info`` runs at ``n_ctx`` on ``hw``: on the GPU, partly offloaded, in RAM, or not.

    Args:
        info: the model's header.
        hw: the machine (see :func:`engine.hardware.probe_hardware`).
        n_ctx: the context length the user asks for (padded to 256 like llama.cpp).
        cache_type: KV cache type (:data:`CACHE_TYPES`).
        bandwidth_gbps: measured RAM bandwidth, for the expected decode speed (None: no speed).
        swa_full: see :func:`kv_cache_bytes`.
        n_ubatch: the micro-batch size the runtime uses.
        draft: the header of a draft model for speculative decoding, loaded beside the model with
            the same context (its weights, KV cache and buffers are counted in the weights).
        projector: the header of the model's multimodal projector (mmproj), loaded beside it
            (:func:`projector_bytes`, counted in the weights too).

    Raises:
        ValueError: unknown ``cache_type`` or ``n_ctx < 1``.
    """
    if n_ctx < 1:
        raise ValueError(f"context length must be at least 1, not {n_ctx}")
    cells = _pad(n_ctx, CTX_PAD)
    layer_kv = layer_kv_bytes(info, cells, cache_type, swa_full=swa_full, n_ubatch=n_ubatch)
    kv = sum(layer_kv)
    compute = compute_buffer_bytes(info, cells, n_ubatch=n_ubatch)
    weights = info.tensor_bytes
    if draft is not None:  # the draft model runs on the same device as the model's weights
        weights += draft_model_bytes(draft, n_ctx, cache_type, swa_full=swa_full)
    mmproj = projector_bytes(projector) if projector is not None else 0
    weights += mmproj
    total = weights + kv + compute + OVERHEAD_BYTES
    ram = _ram_budget(hw)
    gpus = _gpus(hw)
    unified = any(g.unified_memory for g in gpus)
    vram = min(_vram_budget(gpus), ram) if unified else _vram_budget(gpus)
    n_layers = len(info.layer_bytes)
    parts = f"weights {format_bytes(weights - mmproj)}"
    if mmproj:
        parts += f" + projector {format_bytes(mmproj)}"
    parts += f" + KV cache {format_bytes(kv)} + buffers {format_bytes(compute)}"
    full_speed = None
    if bandwidth_gbps is not None and bandwidth_gbps > 0:
        full_speed = expected_decode_tps(info, cells, bandwidth_gbps, cache_type, swa_full=swa_full)

    def result(verdict: Verdict, layers: int, on_gpu: int, speed: float | None, message: str) -> FitEstimate:
        return FitEstimate(
            weights_bytes=weights,
            kv_bytes=kv,
            compute_bytes=compute,
            total_bytes=total,
            verdict=verdict,
            gpu_layers=layers,
            message=message,
            expected_decode_tps=speed,
            n_ctx=cells,
            cache_type=cache_type,
            ram_budget=ram,
            vram_budget=vram,
            gpu_bytes=on_gpu,
            projector_bytes=mmproj,
        )

    if gpus and n_layers:
        # Everything but the token-embedding table (it stays on the CPU) plus the GPU's buffers.
        gpu_total = weights - info.embedding_bytes + (info.embedding_bytes if info.tied_embeddings else 0)
        gpu_total += kv + compute
        cpu_rest = info.embedding_bytes + OVERHEAD_BYTES
        if gpu_total <= vram and cpu_rest <= (ram - gpu_total if unified else ram):
            need = f"needs {format_bytes(gpu_total)} of {format_bytes(vram)} usable VRAM"
            return result("gpu", n_layers + 1, gpu_total, None, f"fits on GPU: {need} ({parts})")
        on_gpu = 0
        for n in range(1, n_layers + 1):
            if _top_layers_bytes(info, layer_kv, n) + compute > vram:
                break
            on_gpu = n
        if on_gpu:
            offloaded = _top_layers_bytes(info, layer_kv, on_gpu)
            gpu_bytes = offloaded + compute
            cpu_bytes = total - offloaded
            if cpu_bytes <= (ram - gpu_bytes if unified else ram):
                # The CPU's share of the bytes read per token sets the pace; the GPU part is fast.
                cpu_share = max(1, weights + kv - offloaded) / (weights + kv)
                speed = None if full_speed is None else full_speed / cpu_share
                return result(
                    "partial",
                    on_gpu,
                    gpu_bytes,
                    speed,
                    f"fits with partial offload ({on_gpu} of {n_layers} layers on the GPU): "
                    f"{format_bytes(gpu_bytes)} VRAM + {format_bytes(cpu_bytes)} RAM ({parts})"
                    f"{_speed(speed)}",
                )
    note = ""
    if hw.gpus and not hw.gpu_offload_supported:
        note = "; this llama.cpp build has no GPU offload (rebuild llama-cpp-python with CUDA/Metal/Vulkan)"
    if total <= ram:
        return result(
            "ram",
            0,
            0,
            full_speed,
            f"fits in RAM: needs {format_bytes(total)} of {format_bytes(ram)} usable ({parts})"
            f"{_speed(full_speed)}{note}",
        )
    with_vram = f" and {format_bytes(vram)} VRAM" if gpus else ""
    return result(
        "no",
        0,
        0,
        None,
        f"won't fit: needs {format_bytes(total)} ({parts}), {format_bytes(ram)} RAM usable"
        f"{with_vram}; try a smaller quantization or context{note}",
    )


def draft_model_bytes(draft: GgufInfo, n_ctx: int, cache_type: str = "f16", *, swa_full: bool = True) -> int:
    """The memory a draft model for speculative decoding takes beside its target: its weights, its
    own KV cache at the target's context, and its compute buffers (it evaluates in 256-token
    batches; see engine.inference.speculative.DraftModel)."""
    cells = _pad(n_ctx, CTX_PAD)
    kv = sum(layer_kv_bytes(draft, cells, cache_type, swa_full=swa_full, n_ubatch=256))
    return draft.tensor_bytes + kv + compute_buffer_bytes(draft, cells, n_ubatch=256)


def projector_bytes(projector: GgufInfo) -> int:
    """A multimodal projector's memory: its weights and its encoder's activations for one image
    (see the module docstring); audio encoders are counted by their weights and a 30 s window."""
    meta = projector.metadata
    size = _meta_int(projector, "clip.vision.image_size")
    patch = _meta_int(projector, "clip.vision.patch_size")
    activations = 0
    if size and patch:
        patches = (size // patch) ** 2
        n_embd = _meta_int(projector, "clip.vision.embedding_length") or 0
        n_ff = _meta_int(projector, "clip.vision.feed_forward_length") or 0
        activations = patches * (8 * n_embd + 2 * n_ff) * 4
    if meta.get("clip.has_audio_encoder"):
        n_embd = _meta_int(projector, "clip.audio.embedding_length") or 0
        n_ff = _meta_int(projector, "clip.audio.feed_forward_length") or 0
        activations = max(activations, 1500 * (8 * n_embd + 2 * n_ff) * 4)  # whisper: 1,500 frames in 30 s
    return projector.tensor_bytes + activations


def _top_layers_bytes(info: GgufInfo, layer_kv: list[int], n: int) -> int:
    """Weights and KV cache of the last ``n`` layers (llama.cpp offloads from the top)."""
    first = len(info.layer_bytes) - n
    return sum(info.layer_bytes[first:]) + sum(layer_kv[first:])


def auto_gpu_layers(
    info: GgufInfo,
    n_ctx: int,
    hw: HardwareInfo,
    cache_type: str = "f16",
    *,
    draft: GgufInfo | None = None,
    projector: GgufInfo | None = None,
) -> int:
    """``gpu_layers="auto"``: as many layers as fit in VRAM (0 without GPU offload).

    The one computation every front end uses (``app.compose.resolve_gpu_layers``). Pass the header
    of every part of a split model (``engine.library.read_model_info``), and the headers of a draft
    model and of a projector that load beside it (their memory goes where the model's layers go:
    the projector's encoder is offloaded whenever layers are).
    """
    return estimate_fit(info, hw, n_ctx, cache_type, draft=draft, projector=projector).gpu_layers


def estimate_fit_from_size(file_size: int, hw: HardwareInfo, bandwidth_gbps: float | None = None) -> FitEstimate:
    """A rough verdict from a file size alone (a repo listing, before any header is read).

    The KV cache is unknown, so it is left out (the message says so); buffers are taken as 5% of
    the weights plus 256 MiB. ``gpu_layers`` is 0: the layer count is unknown, so this is not for
    ``--gpu-layers auto``. Use :func:`estimate_fit` as soon as a header is available.
    """
    compute = file_size // 20 + 256 * MIB
    total = file_size + compute + OVERHEAD_BYTES
    ram = _ram_budget(hw)
    gpus = _gpus(hw)
    vram = _vram_budget(gpus)
    speed = bandwidth_gbps * 1e9 / file_size if bandwidth_gbps and file_size > 0 else None
    common: dict[str, Any] = {
        "weights_bytes": file_size,
        "kv_bytes": 0,
        "compute_bytes": compute,
        "total_bytes": total,
        "ram_budget": ram,
        "vram_budget": vram,
        "approximate": True,
    }
    caveat = " (from the file size; the KV cache is not included)"
    if gpus and total <= vram:
        return FitEstimate(
            **common,
            verdict="gpu",
            gpu_layers=0,
            expected_decode_tps=None,
            message=f"likely fits on GPU: about {format_bytes(total)}{caveat}",
        )
    if gpus and vram > compute and total - vram + compute <= ram:
        return FitEstimate(
            **common,
            verdict="partial",
            gpu_layers=0,
            expected_decode_tps=speed,
            message=f"likely fits with partial offload: about {format_bytes(total)}{caveat}",
        )
    if total <= ram:
        return FitEstimate(
            **common,
            verdict="ram",
            gpu_layers=0,
            expected_decode_tps=speed,
            message=f"likely fits in RAM: about {format_bytes(total)}{caveat}{_speed(speed)}",
        )
    return FitEstimate(
        **common,
        verdict="no",
        gpu_layers=0,
        expected_decode_tps=None,
        message=f"won't fit: about {format_bytes(total)}, {format_bytes(ram)} usable{caveat}",
    )


def _speed(tps: float | None) -> str:
    return "" if tps is None else f"; about {tps:.0f} tokens/s by memory bandwidth"


def _meta_int(info: GgufInfo, key: str) -> int | None:
    value = info.metadata.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pad(value: int, to: int) -> int:
    return -(-value // to) * to
