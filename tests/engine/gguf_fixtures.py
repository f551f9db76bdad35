"""Writers for tiny GGUF files, valid and malformed, used by the GGUF, fit and library tests.

The byte-level writer below (``build``) is deliberately independent of the ``gguf`` package so a
test can break any single field; ``write_with_gguf_package`` writes a valid file the official way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# GGUF value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_FMT = {
    UINT8: "<B",
    INT8: "<b",
    UINT16: "<H",
    INT16: "<h",
    UINT32: "<I",
    INT32: "<i",
    FLOAT32: "<f",
    BOOL: "<B",
    UINT64: "<Q",
    INT64: "<q",
    FLOAT64: "<d",
}
# ggml types used here: (elements per block, bytes per block)
F32, F16, Q4_0, Q8_0 = 0, 1, 2, 8
_BLOCKS = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34)}

TOKENS = ["<unk>", "<s>", "</s>", "hello", "world", "a", "b", "c"]
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return u64(len(raw)) + raw


def value(vtype: int, v: Any) -> bytes:
    """Encodes one value; for ARRAY, ``v`` is ``(element_type, [items])``."""
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        etype, items = v
        return u32(etype) + u64(len(items)) + b"".join(value(etype, i) for i in items)
    return struct.pack(_FMT[vtype], v)


def kv(key: str, vtype: int, v: Any) -> bytes:
    return gstr(key) + u32(vtype) + value(vtype, v)


def tensor_info(name: str, dims: Sequence[int], ttype: int, offset: int) -> bytes:
    return gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(ttype) + u64(offset)


def nbytes(dims: Sequence[int], ttype: int) -> int:
    n = 1
    for d in dims:
        n *= d
    block, size = _BLOCKS[ttype]
    return n // block * size


def pad(n: int, alignment: int = 32) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass
class Built:
    """A GGUF image and where its sections start, for truncation and patching tests."""

    data: bytes
    kv_start: int
    tensor_info_start: int
    data_start: int

    def write(self, path: Path) -> Path:
        path.write_bytes(self.data)
        return path


def default_kvs(n_layers: int = 2, arch: str = "llama") -> list[bytes]:
    return [
        kv("general.architecture", STRING, arch),
        kv("general.name", STRING, "Tiny Test"),
        kv("general.file_type", UINT32, 1),
        kv(f"{arch}.block_count", UINT32, n_layers),
        kv(f"{arch}.context_length", UINT32, 128),
        kv(f"{arch}.embedding_length", UINT32, 64),
        kv(f"{arch}.attention.head_count", UINT32, 4),
        kv(f"{arch}.attention.head_count_kv", UINT32, 2),
        kv("tokenizer.ggml.model", STRING, "llama"),
        kv("tokenizer.ggml.tokens", ARRAY, (STRING, TOKENS)),
        kv("tokenizer.ggml.scores", ARRAY, (FLOAT32, [0.0] * len(TOKENS))),
        kv("tokenizer.ggml.bos_token_id", UINT32, 1),
        kv("tokenizer.ggml.eos_token_id", UINT32, 2),
        kv("tokenizer.chat_template", STRING, TEMPLATE),
    ]


def default_tensors(n_layers: int = 2) -> list[tuple[str, list[int], int]]:
    tensors: list[tuple[str, list[int], int]] = [("token_embd.weight", [64, len(TOKENS)], F16)]
    for i in range(n_layers):
        tensors += [
            (f"blk.{i}.attn_norm.weight", [64], F32),
            (f"blk.{i}.attn_q.weight", [64, 64], F16),
            (f"blk.{i}.attn_k.weight", [64, 32], F16),
            (f"blk.{i}.attn_v.weight", [64, 32], F16),
            (f"blk.{i}.ffn_up.weight", [64, 128], Q8_0),
        ]
    tensors += [("output_norm.weight", [64], F32), ("output.weight", [64, len(TOKENS)], Q4_0)]
    return tensors


def build(
    kvs: Sequence[bytes] | None = None,
    tensors: Sequence[tuple[str, Sequence[int], int]] | None = None,
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
    offsets: Sequence[int] | None = None,
    raw_tensor_infos: bytes | None = None,
) -> Built:
    """Writes a GGUF image; every count and offset can be overridden to break it.

    Tensor data is zeros of the right size, each tensor padded to ``alignment``; ``offsets``
    replaces the computed offsets. ``raw_tensor_infos`` replaces the tensor-info section.
    """
    kvs = default_kvs() if kvs is None else list(kvs)
    tensors = default_tensors() if tensors is None else list(tensors)
    head = magic + u32(version) + u64(len(tensors) if n_tensors is None else n_tensors)
    head += u64(len(kvs) if n_kv is None else n_kv)
    kv_start = len(head)
    body = head + b"".join(kvs)
    info_start = len(body)
    computed: list[int] = []
    at = 0
    for _name, dims, ttype in tensors:
        computed.append(at)
        at += pad(nbytes(dims, ttype), alignment) if ttype in _BLOCKS else alignment
    use = list(offsets) if offsets is not None else computed
    if raw_tensor_infos is not None:
        body += raw_tensor_infos
    else:
        body += b"".join(tensor_info(n, d, t, o) for (n, d, t), o in zip(tensors, use, strict=True))
    data_start = pad(len(body), alignment)
    body += b"\0" * (data_start - len(body)) + b"\0" * at
    return Built(body, kv_start, info_start, data_start)


def write_with_gguf_package(path: Path, *, arch: str = "llama", n_layers: int = 2, ctx: int = 128) -> Path:
    """A valid tiny model written by the official ``gguf`` writer (F32 weights)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("Tiny Package Model")
    writer.add_block_count(n_layers)
    writer.add_context_length(ctx)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((len(TOKENS), 32), dtype=np.float32))
    for i in range(n_layers):
        writer.add_tensor(f"blk.{i}.attn_q.weight", rng.standard_normal((32, 32), dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rng.standard_normal((64, 32), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
