"""What a quantization will write, tensor by tensor, before it runs.

Contract: ARCHITECTURE.md, 'engine.convert.quant_estimate'.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.gguf import GgufInfo
from engine.gguf_format import GGML_TYPES
from engine.gguf_tensors import TensorShape, read_tensor_shapes

__all__ = ["QuantEstimate", "TensorShape", "estimate_quantized", "read_tensor_shapes"]

_TYPE_IDS = {name: type_id for type_id, (name, _block, _bytes) in GGML_TYPES.items()}

# The ggml type most tensors get, per llama-quantize file type (llama_model_quantize_impl).
_DEFAULT_TYPE = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q8_0": "Q8_0",
    "Q6_K": "Q6_K",
    "Q5_K_M": "Q5_K",
    "Q5_K_S": "Q5_K",
    "Q5_1": "Q5_1",
    "Q5_0": "Q5_0",
    "Q4_K_M": "Q4_K",
    "Q4_K_S": "Q4_K",
    "Q4_1": "Q4_1",
    "Q4_0": "Q4_0",
    "IQ4_NL": "IQ4_NL",
    "IQ4_XS": "IQ4_XS",
    "MXFP4_MOE": "MXFP4",
    "Q3_K_L": "Q3_K",
    "Q3_K_M": "Q3_K",
    "Q3_K_S": "Q3_K",
    "IQ3_M": "IQ3_S",
    "IQ3_S": "IQ3_S",
    "IQ3_XS": "IQ3_S",
    "IQ3_XXS": "IQ3_XXS",
    "Q2_K": "Q2_K",
    "Q2_K_S": "Q2_K",
    "IQ2_M": "IQ2_S",
    "IQ2_S": "IQ2_S",
    "IQ2_XS": "IQ2_XS",
    "IQ2_XXS": "IQ2_XXS",
    "Q2_0": "Q2_0",
    "IQ1_M": "IQ1_M",
    "IQ1_S": "IQ1_S",
    "Q1_0": "Q1_0",
    "TQ2_0": "TQ2_0",
    "TQ1_0": "TQ1_0",
}
_UNQUANTIZED = frozenset({"F32", "F16", "BF16"})
_LOW_BIT = frozenset({"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS"})
# A row that is not a multiple of the chosen type's block falls back (llama_tensor_get_type).
_FALLBACK = {
    "TQ1_0": "Q4_0",
    "TQ2_0": "Q4_0",
    "IQ2_XXS": "IQ4_NL",
    "IQ2_XS": "IQ4_NL",
    "IQ2_S": "IQ4_NL",
    "IQ3_XXS": "IQ4_NL",
    "IQ3_S": "IQ4_NL",
    "IQ1_S": "IQ4_NL",
    "IQ1_M": "IQ4_NL",
    "Q2_K": "IQ4_NL",
    "Q3_K": "IQ4_NL",
    "IQ4_XS": "IQ4_NL",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}
# Tensors the quantizer copies as they are (besides 1-D ones and norms).
_KEPT_NAMES = (
    "ffn_gate_inp.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d.weight",
    "shortconv.conv.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
)
_BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class QuantEstimate:
    """What quantizing to ``qtype`` writes.

    Attributes:
        qtype: the llama-quantize type name.
        file_bytes: the expected size of the output file (header and padding included).
        info: the header of the file to be (sizes per layer, embedding and experts), for
            :func:`engine.fit.estimate_fit` and :func:`engine.fit.decode_bytes_per_token`.
        type_bytes: tensor bytes per ggml type name, e.g. ``{"Q4_K": ..., "Q8_0": ...}``.
    """

    qtype: str
    file_bytes: int
    info: GgufInfo
    type_bytes: dict[str, int]


def _nbytes(type_name: str, n_elements: int) -> int:
    _name, block, block_bytes = GGML_TYPES[_TYPE_IDS[type_name]]
    return n_elements // block * block_bytes


def _block(type_name: str) -> int:
    return GGML_TYPES[_TYPE_IDS[type_name]][1]


def _quantized(t: TensorShape) -> bool:
    """Whether llama.cpp's quantizer converts this tensor (else it is copied as it is)."""
    name = t.name
    dims = list(t.dims)
    while len(dims) > 1 and dims[-1] == 1:  # ggml_n_dims: trailing dimensions of 1 do not count
        dims.pop()
    if not name.endswith("weight") or len(dims) < 2 or "_norm.weight" in name:
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(kept in name for kept in _KEPT_NAMES)


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class _Chooser:
    """``llama_tensor_get_type`` for one file type, walking the tensors in file order."""

    def __init__(self, qtype: str, shapes: Sequence[TensorShape], info: GgufInfo) -> None:
        self.qtype = qtype
        self.has_output = any(t.name == "output.weight" for t in shapes)
        heads, kv_heads = info.n_heads or 0, info.n_kv_heads or 0
        self.n_gqa = heads // kv_heads if heads and kv_heads else 1
        self.n_expert = info.expert_count or 0
        self.n_attn_v = sum(
            1 for t in shapes if any(k in t.name for k in ("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight"))
        )
        self.n_ffn_down = sum(1 for t in shapes if "ffn_down" in t.name) or 1
        self.i_attn_v = 0
        self.i_ffn_down = 0

    def choose(self, t: TensorShape, new: str) -> str:
        q, name = self.qtype, t.name
        nx = t.dims[0]
        if name == "output.weight" or (not self.has_output and name == "token_embd.weight"):
            if q == "MXFP4_MOE" or nx % _block(new):
                new = "Q8_0"
            elif q in _LOW_BIT - {"IQ3_XXS"}:
                new = "Q5_K"
            elif new != "Q8_0":
                new = "Q6_K"
        elif q == "MXFP4_MOE":
            new = "MXFP4" if len(t.dims) > 2 and t.dims[2] > 1 else "Q8_0"
        elif name in ("token_embd.weight", "per_layer_token_embd.weight"):
            if q in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
                new = "Q2_K"
            elif q in ("IQ2_S", "IQ2_M", "IQ3_S", "IQ3_M"):
                new = "IQ3_S"
            elif q in ("TQ1_0", "TQ2_0"):
                new = "Q4_K"
        elif "attn_v.weight" in name:
            new = self._attn_v(new)
        elif "attn_output.weight" in name and self.n_expert != 8:
            new = {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}.get(q, new)
        elif "attn_output.weight" in name and q in (
            "Q2_K",
            "IQ3_XXS",
            "Q3_K_S",
            "Q3_K_M",
            "IQ4_NL",
            "Q4_K_S",
            "Q4_K_M",
            "IQ3_S",
            "IQ3_M",
            "IQ4_XS",
        ):
            new = "Q5_K"
        elif "attn_qkv.weight" in name:
            new = {"Q3_K_M": "Q4_K", "Q3_K_L": "Q4_K", "IQ3_M": "Q4_K", "Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}.get(q, new)
        elif "ffn_down" in name:
            new = self._ffn_down(new)
        if nx % _block(new):
            fallback = _FALLBACK.get(new)
            new = fallback if fallback is not None and nx % _block(fallback) == 0 else "F16"
        return new

    def _attn_v(self, new: str) -> str:
        q, i, n = self.qtype, self.i_attn_v, self.n_attn_v
        self.i_attn_v += 1
        if q == "Q2_K":
            new = "Q4_K" if self.n_gqa >= 4 else "Q3_K"
        elif (q == "Q2_K_S" and self.n_gqa >= 4) or q == "IQ3_M" or (q in ("IQ3_XS", "IQ3_S") and self.n_gqa >= 4):
            new = "Q4_K"
        elif q == "IQ3_XXS":
            new = "Q4_K" if self.n_gqa >= 4 else "IQ3_S"
        elif q == "Q3_K_M":
            new = "Q5_K" if i < 2 else "Q4_K"
        elif q == "Q3_K_L" or (q in ("IQ4_NL", "IQ4_XS") and self.n_gqa >= 4):
            new = "Q5_K"
        elif q in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
            new = "Q6_K"
        elif q == "Q4_K_S" and i < 4:
            new = "Q5_K"
        return "Q8_0" if self.n_expert == 8 else new

    def _ffn_down(self, new: str) -> str:
        q, i, n = self.qtype, self.i_ffn_down, self.n_ffn_down
        self.i_ffn_down += 1
        if q == "Q2_K":
            return "Q3_K"
        if q == "Q2_K_S":
            return "Q4_K" if i < n // 8 else new
        if q == "IQ3_XXS":
            return "Q4_K" if i < n // 8 else "Q3_K"
        if q == "Q3_K_M":
            return "Q5_K" if i < n // 16 else "Q4_K"
        if q == "IQ3_M" and i < n // 8:
            return "Q4_K"
        if q == "Q3_K_L":
            return "Q5_K"
        if q in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
            return "Q6_K"
        if q in ("IQ4_NL", "IQ4_XS", "Q4_K_S") and i < n // 8:
            return "Q5_K"
        return new


def estimate_quantized(info: GgufInfo, shapes: Sequence[TensorShape], qtype: str) -> QuantEstimate:
    """The file that quantizing the model of ``info``/``shapes`` to ``qtype`` writes.

    Args:
        info: the source's header (:func:`read_tensor_shapes`).
        shapes: the source's tensors, in file order.
        qtype: a llama-quantize type name, e.g. ``"Q4_K_M"``.

    Raises:
        ValueError: an unknown ``qtype``.
    """
    default = _DEFAULT_TYPE.get(qtype)
    if default is None or default not in _TYPE_IDS:
        raise ValueError(f"unknown quantization type {qtype!r}")
    chooser = _Chooser(qtype, shapes, info)
    align = max(info.alignment, 1)
    total = padding = 0
    embedding = expert = other = 0
    layer_bytes = [0] * len(info.layer_bytes)
    type_bytes: dict[str, int] = {}
    for t in shapes:
        current = GGML_TYPES[t.ggml_type][0]
        new = current
        if _quantized(t):
            new = default if qtype in _UNQUANTIZED else chooser.choose(t, default)
        nbytes = _nbytes(new, t.n_elements)
        padding += -nbytes % align
        type_bytes[new] = type_bytes.get(new, 0) + nbytes
        total += nbytes
        if t.name == "token_embd.weight":
            embedding = nbytes
        if "_exps" in t.name:
            expert += nbytes
        m = _BLOCK.match(t.name)
        if m is not None and int(m.group(1)) < len(layer_bytes):
            layer_bytes[int(m.group(1))] += nbytes
        else:
            other += nbytes
    file_bytes = info.tensor_data_offset + total + padding
    future = dataclasses.replace(
        info,
        file_size=file_bytes,
        file_type=qtype,
        tensor_bytes=total,
        layer_bytes=layer_bytes,
        other_bytes=other,
        embedding_bytes=embedding,
        expert_bytes=expert,
    )
    return QuantEstimate(qtype, file_bytes, future, type_bytes)
