"""A model's multimodal projector (``mmproj``): finding it next to the model, and what it can do.

Contract: ARCHITECTURE.md, 'engine.mmproj'.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from engine.errors import ModelFileError
from engine.gguf import GgufInfo, read_gguf_info

__all__ = ["ProjectorFacts", "find_projector", "is_projector_name", "projector_problem", "read_projector"]

_TYPE_RANK: Final = ("f16", "bf16", "f32", "q8_0")
# Projectors whose image tokens take 2-D positions (M-RoPE): the worker does not place them yet.
MROPE_PROJECTORS: Final = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "youtuvl", "glm4v"})


@dataclass(frozen=True)
class ProjectorFacts:
    """What a projector file says about itself (its header only).

    Attributes:
        path: the file.
        vision: it reads images.
        audio: it reads audio.
        projector_type: ``gemma3``, ``idefics3``, ``qwen2.5vl_merger``, ``ultravox``, ...
        image_size: the side of the image its vision encoder reads (0 without vision).
        max_side: the longest side worth handing it (images are scaled down to it), or None.
        max_pixels: the most pixels worth handing it, or None.
        projection_dim: the width of the embeddings it makes (the language model's).
        file_size: bytes on disk.
        tensor_bytes: its weights' bytes (loaded beside the model).
        header: the header it was read from (``engine.fit.projector_bytes`` counts its memory).
    """

    path: Path
    vision: bool
    audio: bool
    projector_type: str
    image_size: int
    max_side: int | None
    max_pixels: int | None
    projection_dim: int
    file_size: int
    tensor_bytes: int
    header: GgufInfo | None = field(default=None, compare=False, repr=False)

    @property
    def sees(self) -> str:
        """``"images"``, ``"audio"`` or ``"images and audio"``."""
        return " and ".join(k for k, on in (("images", self.vision), ("audio", self.audio)) if on)

    @property
    def mrope(self) -> bool:
        """Its image tokens take 2-D positions (Qwen2-VL and its kin): not run here yet."""
        return self.projector_type in MROPE_PROJECTORS


def is_projector_name(name: str) -> bool:
    """Whether a file name is a projector's by the Hub's naming (``mmproj`` in it, a GGUF)."""
    lowered = name.lower()
    return lowered.endswith(".gguf") and "mmproj" in lowered


def read_projector(path: Path | str, info: GgufInfo | None = None) -> ProjectorFacts:
    """The projector's facts from its header (``info`` when it was read already).

    Raises:
        ModelFileError: not a GGUF, malformed, or not a projector (with what it is instead).
    """
    path = Path(path)
    info = info if info is not None else read_gguf_info(path)
    meta = info.metadata
    if info.architecture != "clip" and meta.get("general.type") != "mmproj":
        raise ModelFileError(path, f"not a vision projector (mmproj): its architecture is {info.architecture}")
    vision = bool(meta.get("clip.has_vision_encoder"))
    audio = bool(meta.get("clip.has_audio_encoder"))
    if not vision and not audio:
        raise ModelFileError(path, "a projector with neither a vision nor an audio encoder")
    kind = str(meta.get("clip.vision.projector_type") or meta.get("clip.projector_type") or "")
    if not kind and audio:
        kind = str(meta.get("clip.audio.projector_type") or "")
    image_size = _int(meta.get("clip.vision.image_size"))
    preproc = _int(meta.get("clip.vision.preproc_image_size"))
    max_pixels = _int(meta.get("clip.vision.image_max_pixels")) or None
    max_side: int | None = preproc or None
    if max_side is None and max_pixels is None and image_size:
        max_side = image_size  # a fixed-size encoder: nothing larger is read
    width = _int(meta.get("clip.vision.projection_dim")) or _int(meta.get("clip.audio.projection_dim"))
    return ProjectorFacts(
        path=path,
        vision=vision,
        audio=audio,
        projector_type=kind,
        image_size=image_size,
        max_side=max_side,
        max_pixels=max_pixels,
        projection_dim=width,
        file_size=info.file_size,
        tensor_bytes=info.tensor_bytes,
        header=info,
    )


def projector_problem(facts: ProjectorFacts, model: GgufInfo) -> str | None:
    """Why this projector cannot go with ``model`` (one line), or None when it can."""
    width = model.embedding_length
    if facts.projection_dim and width and facts.projection_dim != width:
        return (
            f"{facts.path.name} is the projector of another model: it makes embeddings of width "
            f"{facts.projection_dim}, {model.name or 'the model'} reads {width}"
        )
    return None


def find_projector(model: Path, candidates: Iterable[Path] | None = None) -> Path | None:
    """The projector that goes with ``model`` by the Hub's naming: a file with ``mmproj`` in its
    name in the model's folder (``candidates``, when given, instead of listing the folder).

    Among several, the one whose name shares the longest run of words with the model's wins, then
    the best type (F16, BF16, F32, Q8_0, then others), then the name. A split model's parts share
    one projector (the name is read without ``-00001-of-00003``)."""
    if candidates is None:
        try:
            candidates = [p for p in model.parent.iterdir() if is_projector_name(p.name) and p.is_file()]
        except OSError:
            return None
    found = [p for p in candidates if is_projector_name(p.name) and p.parent == model.parent and p != model]
    if not found:
        return None
    words = _words(re.sub(r"-\d{5}-of-\d{5}$", "", model.name.removesuffix(".gguf")))

    def rank(path: Path) -> tuple[int, int, str]:
        theirs = _words(path.name.removesuffix(".gguf"))
        shared = sum(1 for word in theirs if word in words and word != "mmproj")
        kind = next((i for i, t in enumerate(_TYPE_RANK) if t in theirs), len(_TYPE_RANK))
        return (-shared, kind, path.name)

    return min(found, key=rank)


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[-_. ]+", name.lower()) if w]


def _int(value: object) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0
