"""Every tensor's name, shape and type from a GGUF header, read by the safe parser.

:class:`engine.gguf.GgufInfo` keeps only per-layer sums (it is cached in the library's manifest,
so it stays small). What needs each tensor's shape reads it here: the quantization estimate
(:mod:`engine.convert.quant_estimate`) and the LoRA adapter check (:mod:`engine.lora`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from engine import gguf as _gguf
from engine.errors import ModelFileError
from engine.gguf import GgufInfo
from engine.gguf_reader import HeaderReader
from engine.library import merge_split_infos, split_parts

__all__ = ["TensorShape", "parse_tensor_shapes_prefix", "read_tensor_shapes"]


@dataclass(frozen=True)
class TensorShape:
    """One tensor of a GGUF header: its name, dimensions (``ne[0]`` first) and ggml type id."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


class _ShapeParser(_gguf._Parser):
    """The safe header parser, keeping each tensor's dimensions as well.

    WORKAROUND: :class:`engine.gguf.GgufInfo` keeps only per-layer sums (it is cached in the
    library's manifest, so it stays small); the quantization estimate and the adapter check need
    every tensor's shape. The tensor records are checked by the parser first, then read again from
    the same bytes.
    """

    def __init__(self, reader: HeaderReader, path: Path, file_size: int, prefix_only: bool) -> None:
        super().__init__(reader, path, file_size, prefix_only)
        self.shapes: list[TensorShape] = []

    def _read_tensor_infos(self, n_tensors: int, alignment: int) -> list[tuple[str, int, int, int]]:
        start = self.r.pos
        rows = super()._read_tensor_infos(n_tensors, alignment)
        end = self.r.pos
        self.r.pos = start
        for _ in range(n_tensors):
            name = self.r.string(_gguf.MAX_TENSOR_NAME * 4, "a tensor name")
            n_dims = self.r.u32()
            dims = tuple(self.r.u64() for _ in range(n_dims))
            ttype = self.r.u32()
            self.r.u64()  # the offset, checked above
            self.shapes.append(TensorShape(name, dims, ttype))
        self.r.pos = end
        return rows


def _read_one(path: Path) -> tuple[GgufInfo, list[TensorShape]]:
    info, parser = _gguf._read_file(path, _ShapeParser)
    return info, parser.shapes


def parse_tensor_shapes_prefix(prefix: bytes, file_size: int, source: str) -> tuple[GgufInfo, list[TensorShape]]:
    """The header and every tensor's shape from the first bytes of a (remote) file, as
    :func:`engine.gguf.parse_gguf_prefix` reads them (an HTTP range request before a download).

    Raises:
        GgufHeaderNeedsMoreBytes: the header goes past ``prefix`` (``needed`` says how far).
        ModelFileError: the header is bad.
    """
    info, parser = _gguf._parse(
        io.BytesIO(prefix), file_size, Path(source), prefix_only=True, prefix_len=len(prefix), parser_class=_ShapeParser
    )
    return info, parser.shapes


def read_tensor_shapes(path: Path | str) -> tuple[GgufInfo, list[TensorShape]]:
    """The header and every tensor's shape and type, all parts of a split model included.

    Raises:
        ModelFileError: a missing part or a bad header (as :func:`engine.gguf.read_gguf_info`).
    """
    path = Path(path)
    parts = split_parts(path)
    if parts is None or path != parts[0]:
        return _read_one(path)
    infos: list[GgufInfo] = []
    shapes: list[TensorShape] = []
    for i, part in enumerate(parts, start=1):
        if not part.exists():
            raise ModelFileError(path, f"part {i} of {len(parts)} is missing ({part.name})")
        info, part_shapes = _read_one(part)
        infos.append(info)
        shapes += part_shapes
    return merge_split_infos(infos), shapes
