"""The multimodal projector in the inference worker: llama.cpp's libmtmd over the loaded model.

Contract: ARCHITECTURE.md, 'engine.inference.projector'.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from engine.errors import EngineError, ModelLoadError
from engine.media import Media, MediaError
from engine.media_decode import DecodedImage, decode_image
from engine.mmproj import ProjectorFacts, read_projector

__all__ = [
    "MediaInfo",
    "Projector",
    "ProjectorInfo",
    "is_placeholder",
    "placeholder_run",
]

MAX_ENTRIES: Final = 16
"""Media kept ready in the worker (their preprocessed pixels); older ones are read again when needed."""
_MASK: Final = 0x3FFFFFFF


def placeholder_run(digest: str, chunk: int, n: int) -> list[int]:
    """The placeholder tokens of chunk ``chunk`` of the media with SHA-256 ``digest``: ``n``
    negative ints, each 30 bits of a hash of the media, the chunk and the position."""
    raw = hashlib.shake_128(f"{digest}:{chunk}".encode()).digest(4 * n)
    return [-(2 + (int.from_bytes(raw[4 * i : 4 * i + 4], "little") & _MASK)) for i in range(n)]


def is_placeholder(token: int) -> bool:
    """Whether a token of a prompt stands for a position of an image or a clip."""
    return token < -1


@dataclass(frozen=True)
class ProjectorInfo:
    """What the worker reports about its projector (in ``ModelInfo.projector``)."""

    path: str
    vision: bool
    audio: bool
    projector_type: str
    max_side: int | None
    max_pixels: int | None
    non_causal: bool
    audio_rate: int


@dataclass(frozen=True)
class MediaInfo:
    """One media item as the projector reads it.

    Attributes:
        digest: its SHA-256.
        tokens: the positions its image or audio chunks take: mtmd's own count.
        expansion: its whole expansion, in tokens (``tokens`` plus mtmd's wrapping text tokens).
        chunks: how many image or audio chunks (a tiled image has several).
        width, height: the image handed to the projector (after scaling); 0 for audio.
        note: what was done to it ("scaled down from ..."), or "".
    """

    digest: str
    tokens: int
    expansion: int
    chunks: int
    width: int = 0
    height: int = 0
    note: str = ""


@dataclass
class _Entry:
    info: MediaInfo
    tokens: list[int]  # the expansion: text tokens and placeholder runs
    chunks: list[tuple[int, int, Any]]  # (offset in tokens, length, owned mtmd chunk)


class Projector:
    """One ``mtmd_context`` over a loaded ``llama_cpp.Llama`` (child side; one owner, one thread).

    Args:
        llm: the loaded model.
        path: the projector file (its header was checked by the parent).
        n_threads: the encoder's threads (None: llama.cpp's default).
        n_batch: the model's micro-batch: a projector with non-causal image attention needs a
            whole image in one.
        use_gpu: offload the encoder when the build can.

    Raises:
        ModelLoadError: llama.cpp refused the projector, or it is one the worker cannot run.
    """

    def __init__(self, llm: Any, path: Path, n_threads: int | None, n_batch: int, use_gpu: bool) -> None:
        # lazy: heavy (llama_cpp)
        from llama_cpp import mtmd_cpp

        self._m = mtmd_cpp
        self.facts: ProjectorFacts = read_projector(path)
        if self.facts.mrope:
            raise ModelLoadError(
                f"{path}: a {self.facts.projector_type} projector places image tokens in 2-D positions "
                "(M-RoPE), which Glassbox does not run yet; load the model without it"
            )
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.warmup = False  # the first image pays it, not every load
        if n_threads:
            params.n_threads = n_threads
        self._llm = llm
        self._n_batch = n_batch
        self._ctx = mtmd_cpp.mtmd_init_from_file(str(path).encode(), llm._model.model, params)
        if not self._ctx:
            raise ModelLoadError(f"{path}: llama.cpp could not load this projector (mmproj) for this model")
        self.vision = bool(mtmd_cpp.mtmd_support_vision(self._ctx))
        self.audio = bool(mtmd_cpp.mtmd_support_audio(self._ctx))
        self.non_causal = bool(mtmd_cpp.mtmd_decode_use_non_causal(self._ctx, None))
        if mtmd_cpp.mtmd_decode_use_mrope(self._ctx):
            self.close()
            raise ModelLoadError(f"{path}: this projector's image tokens take 2-D positions (M-RoPE), not run here yet")
        self.audio_rate = int(mtmd_cpp.mtmd_get_audio_sample_rate(self._ctx)) if self.audio else 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._starts: dict[int, list[tuple[_Entry, int]]] = {}
        self.encode_ms = 0.0  # the time the encoder took since the last reset_counters()
        self.encoded = 0

    def info(self) -> ProjectorInfo:
        return ProjectorInfo(
            str(self.facts.path),
            self.vision,
            self.audio,
            self.facts.projector_type,
            self.facts.max_side,
            self.facts.max_pixels,
            self.non_causal,
            self.audio_rate,
        )

    # media -----------------------------------------------------------------------------------
    def add(self, media: Media) -> MediaInfo:
        """Reads one image or clip (once: a digest already here is answered from memory).

        Raises:
            MediaError: this projector does not read its kind, or it cannot be decoded or tokenized.
        """
        entry = self._entries.get(media.digest)
        if entry is not None:
            self._entries.move_to_end(media.digest)
            return entry.info
        m = self._m
        width = height = 0
        note = ""
        if media.kind == "image":
            if not self.vision:
                raise MediaError(media.name, "this model's projector reads audio, not images")
            why = _limit_words(self.facts)
            decoded = _decode(media, self.facts, why)
            width, height, note = decoded.width, decoded.height, decoded.note
            pixels = (ctypes.c_uint8 * len(decoded.rgb)).from_buffer_copy(decoded.rgb)
            bitmap = m.mtmd_bitmap_init(width, height, pixels)
        else:
            if not self.audio:
                raise MediaError(media.name, "this model's projector reads images, not audio")
            data = (ctypes.c_uint8 * len(media.data)).from_buffer_copy(media.data)
            bitmap = m.mtmd_helper_bitmap_init_from_buf(self._ctx, data, len(media.data), False)
        if not bitmap:
            raise MediaError(media.name, f"llama.cpp could not read this {media.kind}")
        try:
            m.mtmd_bitmap_set_id(bitmap, media.digest[:32].encode())
            entry = self._tokenize(media, bitmap, width, height, note)
        finally:
            m.mtmd_bitmap_free(bitmap)
        self._entries[media.digest] = entry
        for offset, _length, _chunk in entry.chunks:
            self._starts.setdefault(entry.tokens[offset], []).append((entry, offset))
        while len(self._entries) > MAX_ENTRIES:
            self._drop(next(iter(self._entries)))
        return entry.info

    def _tokenize(self, media: Media, bitmap: Any, width: int, height: int, note: str) -> _Entry:
        m = self._m
        chunks = m.mtmd_input_chunks_init()
        if not chunks:
            raise MemoryError("mtmd_input_chunks_init")
        owned: list[tuple[int, int, Any]] = []
        try:
            part = m.mtmd_input_part(None, bitmap)
            parts = (ctypes.POINTER(m.mtmd_input_part) * 1)(ctypes.pointer(part))
            result = m.mtmd_tokenize_from_parts(self._ctx, chunks, parts, 1, False)
            if result != 0:
                raise MediaError(media.name, f"llama.cpp could not tokenize this {media.kind} (error {result})")
            tokens: list[int] = []
            total = 0
            for index in range(m.mtmd_input_chunks_size(chunks)):
                chunk = m.mtmd_input_chunks_get(chunks, index)
                kind = m.mtmd_input_chunk_get_type(chunk)
                if kind == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    tokens.extend(int(ids[i]) for i in range(n.value))
                    continue
                length = int(m.mtmd_input_chunk_get_n_tokens(chunk))
                positions = int(m.mtmd_input_chunk_get_n_pos(chunk))
                if positions != length:
                    raise MediaError(media.name, f"its {length} tokens take {positions} positions (not run here yet)")
                if self.non_causal and length > self._n_batch:
                    raise MediaError(
                        media.name,
                        f"it takes {length} tokens, more than the batch of {self._n_batch} this model was "
                        "loaded with (its projector reads a whole image at once): raise the batch size",
                    )
                copy = m.mtmd_input_chunk_copy(chunk)
                if not copy:
                    raise MemoryError("mtmd_input_chunk_copy")
                owned.append((len(tokens), length, copy))
                tokens.extend(placeholder_run(media.digest, len(owned) - 1, length))
                total += length
        except BaseException:
            for _offset, _length, copy in owned:
                m.mtmd_input_chunk_free(copy)
            raise
        finally:
            m.mtmd_input_chunks_free(chunks)
        if not owned:
            raise MediaError(media.name, f"llama.cpp made no {media.kind} tokens of it")
        info = MediaInfo(media.digest, total, len(tokens), len(owned), width, height, note)
        return _Entry(info, tokens, owned)

    def expansion(self, digest: str) -> list[int] | None:
        """The tokens the media stands for in a prompt (None: not read here, or dropped since)."""
        entry = self._entries.get(digest)
        if entry is None:
            return None
        self._entries.move_to_end(digest)
        return list(entry.tokens)

    def _drop(self, digest: str) -> None:
        entry = self._entries.pop(digest)
        for offset, _length, chunk in entry.chunks:
            start = entry.tokens[offset]
            kept = [pair for pair in self._starts.get(start, []) if pair[0] is not entry]
            if kept:
                self._starts[start] = kept
            else:
                self._starts.pop(start, None)
            self._m.mtmd_input_chunk_free(chunk)

    # prefill ---------------------------------------------------------------------------------
    def chunk_at(self, tokens: Any, at: int) -> tuple[int, Any] | None:
        """The media chunk whose placeholder run starts at ``tokens[at]``: (its length, the chunk);
        None when no chunk read here has that run (a prompt holding media this worker lost)."""
        for entry, offset in self._starts.get(int(tokens[at]), []):
            chunk_offset, length, chunk = next(c for c in entry.chunks if c[0] == offset)
            run = entry.tokens[chunk_offset : chunk_offset + length]
            if len(tokens) - at >= length and [int(t) for t in tokens[at : at + length]] == run:
                return length, chunk
        return None

    def evaluate(self, chunk: Any, n_past: int) -> int:
        """Encodes a media chunk and reads its embeddings into the KV cache at ``n_past``.

        Returns:
            llama.cpp's status: 0 when done, else what the decode returned (2: aborted by Stop).

        Raises:
            EngineError: the encoder failed.
        """
        m = self._m
        started = time.perf_counter()
        if m.mtmd_encode_chunk(self._ctx, chunk) != 0:
            raise EngineError("llama.cpp's projector could not encode the image")
        self.encode_ms += (time.perf_counter() - started) * 1000
        self.encoded += 1
        embeddings = m.mtmd_get_output_embd(self._ctx)
        new_n_past = ctypes.c_int32(0)
        return int(
            m.mtmd_helper_decode_image_chunk(
                self._ctx,
                self._llm._ctx.ctx,
                chunk,
                embeddings,
                n_past,
                0,
                self._n_batch,
                ctypes.byref(new_n_past),
                m.mtmd_helper_post_decode_callback(),
                None,
            )
        )

    def reset_counters(self) -> None:
        self.encode_ms = 0.0
        self.encoded = 0

    def close(self) -> None:
        for digest in list(self._entries):
            self._drop(digest)
        if self._ctx:
            self._m.mtmd_free(self._ctx)
            self._ctx = None


def _limit_words(facts: ProjectorFacts) -> str:
    if facts.max_side and facts.max_pixels:
        return f"the projector reads at most {facts.max_side} pixels a side, {facts.max_pixels / 1e6:.1f} megapixels"
    if facts.max_side:
        return f"the projector reads at most {facts.max_side} pixels a side"
    if facts.max_pixels:
        return f"the projector reads at most {facts.max_pixels / 1e6:.1f} megapixels"
    return ""


def _decode(media: Media, facts: ProjectorFacts, why: str) -> DecodedImage:
    return decode_image(media, max_side=facts.max_side, max_pixels=facts.max_pixels, why=why)
