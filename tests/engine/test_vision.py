"""Images in a chat turn on a tiny random-weight Gemma 3 vision model and its projector, both made
by llama.cpp's converter in the test (tests/engine/tiny_vision.py). The answers are noise; what is
checked is exact: an image costs what mtmd counts, the prompt is mtmd's own tokenization, encoding
is its own phase, the KV cache keeps an image only for that image, the chat's KV cache on disk
restores image chunks (llama.cpp can, for this model: measured here), and every failure is one line
with the worker (never the test process) taking a crash."""

from __future__ import annotations

import ctypes
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineCrashed, ModelLoadError
from engine.inference.context import Message
from engine.inference.events import Finished, PrefillProgress
from engine.inference.kv_cache import KvCacheConfig, KvCacheStore, KvKey
from engine.inference.projector import is_placeholder
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from engine.media import Media, MediaError, read_media
from tests.engine import media_fixtures as fx
from tests.engine.tiny_vision import IMAGE_TOKENS

pytestmark = pytest.mark.model

QUESTION = "What is in this image?"


def _image(seed: int, size: tuple[int, int] = (48, 40), name: str = "") -> Media:
    from PIL import Image

    image = Image.new("RGB", size)
    image.putdata([((x * 31 + seed * 77) % 256, (y * 17 + seed * 5) % 256, (x * y + seed) % 256)
                   for y in range(size[1]) for x in range(size[0])])  # fmt: skip
    import io

    out = io.BytesIO()
    image.save(out, "PNG")
    return read_media(out.getvalue(), name=name or f"image-{seed}.png")


def _session(model: Path, mmproj: Path | None, kv: Path | None = None) -> ChatSession:
    return ChatSession(
        LoadParams(model_path=model, mmproj_path=mmproj, n_ctx=512, n_batch=64, n_threads=2),
        kv_cache=KvCacheConfig(kv) if kv is not None else None,
        reply_reserve=16,
    )


def _greedy(session: ChatSession) -> GenerationParams:
    """Greedy, 12 tokens, the end-of-turn tokens banned (a random model picks them anywhere)."""
    assert session.worker is not None
    eog = session.worker.tokenize("<eos><end_of_turn>", special=True)
    return GenerationParams(temperature=0.0, max_tokens=12, logit_bias=tuple((t, float("-inf")) for t in eog))


def _turn(session: ChatSession, history: list[Message], user: str, media: tuple[Media, ...] = (), **kw: Any) -> Any:
    session.load()
    events = list(session.stream(history, user, _greedy(session), media=media, **kw))
    finished = [e for e in events if isinstance(e, Finished)]
    assert len(finished) == 1
    return finished[0], events


@pytest.fixture(scope="module")
def vision(tiny_vision_model: tuple[Path, Path]) -> Iterator[ChatSession]:
    model, mmproj = tiny_vision_model
    with _session(model, mmproj) as session:
        session.load()
        yield session


def _reference_chunks(model: Path, mmproj: Path, prompt: str, media: Media) -> list[tuple[str, Any]]:
    """mtmd itself, in this process: the whole prompt tokenized by ``mtmd_tokenize`` with mtmd's
    own marker and a bitmap of the image's pixels: ``("text", ids)`` and ``("image", n_tokens)``."""
    import llama_cpp
    from llama_cpp import mtmd_cpp as m

    from engine.cpu_backend import load_backends
    from engine.media_decode import decode_image

    assert load_backends().error is None
    llm = llama_cpp.Llama(str(model), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2, verbose=False)
    params = m.mtmd_context_params_default()
    params.use_gpu, params.warmup, params.print_timings = False, False, False
    ctx = m.mtmd_init_from_file(str(mmproj).encode(), llm._model.model, params)
    try:
        decoded = decode_image(media)
        pixels = (ctypes.c_uint8 * len(decoded.rgb)).from_buffer_copy(decoded.rgb)
        bitmap = m.mtmd_bitmap_init(decoded.width, decoded.height, pixels)
        chunks = m.mtmd_input_chunks_init()
        text = prompt.encode()
        inp = m.mtmd_input_text(text, len(text), False, True)
        assert m.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        out: list[tuple[str, Any]] = []
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                out.append(("text", [int(ids[j]) for j in range(n.value)]))
            else:
                out.append(("image", int(m.mtmd_input_chunk_get_n_tokens(chunk))))
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        return out
    finally:
        m.mtmd_free(ctx)
        llm.close()


def test_an_image_costs_what_mtmd_counts_and_the_prompt_is_mtmds_own(
    vision: ChatSession, tiny_vision_model: tuple[Path, Path]
) -> None:
    image = _image(1)
    (info,) = vision.media_info([image])
    assert (info.tokens, info.chunks, info.width, info.height, info.note) == (IMAGE_TOKENS, 1, 48, 40, "")
    assert info.expansion == IMAGE_TOKENS + 2  # <start_of_image> ... <end_of_image>
    finished, _events = _turn(vision, [], QUESTION, (image,))
    prompt = vision.last_prompt
    # The reference: the prompt rendered with mtmd's marker where Glassbox puts its own.
    assert vision.template is not None
    rendered = vision.template.render([{"role": "user", "content": f"<__media__>\n{QUESTION}"}])
    reference = _reference_chunks(*tiny_vision_model, rendered, image)
    flat: list[int | None] = []
    for kind, value in reference:
        flat += value if kind == "text" else [None] * value
    assert [None if is_placeholder(t) else t for t in prompt] == flat
    assert sum(1 for t in prompt if is_placeholder(t)) == IMAGE_TOKENS == sum(v for k, v in reference if k == "image")
    stats = finished.stats
    assert stats.media_tokens == IMAGE_TOKENS and stats.budget["media"] == IMAGE_TOKENS
    assert sum(v for k, v in stats.budget.items() if k not in ("estimated",)) == stats.n_ctx
    assert stats.prompt_tokens == len(prompt)


def test_encoding_is_its_own_phase_before_the_prefill(vision: ChatSession) -> None:
    vision.worker.reset_cache()  # type: ignore[union-attr]
    finished, events = _turn(vision, [], QUESTION, (_image(2),))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    encoding = [e for e in progress if e.encoding]
    assert [e.encoding for e in encoding] == [IMAGE_TOKENS]
    at = progress.index(encoding[0])
    assert progress[at + 1].done == encoding[0].done + IMAGE_TOKENS  # the image read in one step
    stats = finished.stats
    assert stats.media_encoded == 1 and stats.encode_ms > 0
    # The timeline: encode, then the rest of the prefill, then the first token.
    assert stats.ttft_ms + 0.02 >= stats.encode_ms + stats.prefill_ms


def test_a_follow_up_reuses_the_image_and_another_image_never_does(
    vision: ChatSession, tiny_vision_model: tuple[Path, Path]
) -> None:
    first, second = _image(3), _image(4)
    vision.worker.reset_cache()  # type: ignore[union-attr]
    done, _ = _turn(vision, [], QUESTION, (first,))
    history = [Message("user", QUESTION, media=(first,)), Message("assistant", done.text)]
    follow, _ = _turn(vision, history, "And the colours?")
    image_end = next(i for i, t in enumerate(vision.last_prompt) if is_placeholder(t)) + IMAGE_TOKENS
    assert follow.stats.media_encoded == 0 and follow.stats.cached_tokens > image_end  # read once
    # The same question about another image in the same place: the cache stops where the image starts.
    other, _ = _turn(vision, [], QUESTION, (second,))
    image_start = next(i for i, t in enumerate(vision.last_prompt) if is_placeholder(t))
    assert other.stats.media_encoded == 1 and other.stats.cached_tokens == image_start
    model, mmproj = tiny_vision_model
    with _session(model, mmproj) as cold:
        fresh, _ = _turn(cold, [], QUESTION, (second,))
    assert other.text == fresh.text  # nothing of the first image was left in the cache
    assert done.text != other.text or first.digest != second.digest


def test_the_saved_kv_cache_restores_image_chunks_in_a_new_process(
    tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    model, mmproj = tiny_vision_model
    image = _image(5)
    kv = tmp_path / "kv"
    with _session(model, mmproj, kv) as first:
        done, _ = _turn(first, [], QUESTION, (image,), cache_key=KvKey("c1", "b1"))
    assert done.stats.kv_saved_bytes > 0 and KvCacheStore(kv).usage()[0] == 1
    history = [Message("user", QUESTION, media=(image,)), Message("assistant", done.text)]
    with _session(model, mmproj, kv) as warm_session:
        warm, _ = _turn(warm_session, history, "Describe it again.", cache_key=KvKey("c1", "b2"))
        image_end = next(i for i, t in enumerate(warm_session.last_prompt) if is_placeholder(t)) + IMAGE_TOKENS
    with _session(model, mmproj) as cold_session:
        cold, _ = _turn(cold_session, history, "Describe it again.")
    # llama.cpp restores the image's KV cells for this model: nothing is encoded again.
    assert warm.stats.kv_restored_tokens > image_end and warm.stats.media_encoded == 0
    assert cold.stats.media_encoded == 1
    assert warm.text == cold.text


def test_a_saved_cache_never_comes_back_under_another_projector(
    tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    model, mmproj = tiny_vision_model
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(model, folder / model.name)
    other = folder / mmproj.name
    data = bytearray(mmproj.read_bytes())
    data[-8] ^= 0x01  # the last tensor's bytes: the same header, another projector
    other.write_bytes(bytes(data))
    image = _image(6)
    kv = tmp_path / "kv"
    with _session(model, mmproj, kv) as first:
        _turn(first, [], QUESTION, (image,), cache_key=KvKey("c2", "b"))
    with _session(folder / model.name, other, kv) as second:
        again, _ = _turn(second, [], QUESTION, (image,), cache_key=KvKey("c2", "b"))
    assert again.stats.kv_restored_tokens == 0 and again.stats.media_encoded == 1


def test_a_model_without_a_projector_says_it_cannot_see(tiny_vision_model: tuple[Path, Path]) -> None:
    model, _ = tiny_vision_model
    image = _image(7, name="cat.png")
    with _session(model, None) as blind:
        blind.load()
        with pytest.raises(MediaError) as info:
            list(blind.stream([], QUESTION, media=(image,)))
        assert str(info.value).startswith(
            f"cat.png: this model cannot see images: {model.name} was loaded without a projector (mmproj)"
        )
        # Earlier images in the history are left out, and counted; the text goes on.
        history = [Message("user", QUESTION, media=(image,)), Message("assistant", "noise")]
        finished, _ = _turn(blind, history, "Go on.")
        assert finished.stats.media_dropped == 1 and finished.stats.budget["media"] == 0
        assert not any(is_placeholder(t) for t in blind.last_prompt)


def test_a_bad_image_is_one_line_and_the_chat_goes_on(vision: ChatSession) -> None:
    broken = read_media(fx.png_corrupt_data(), name="broken.png")
    pid = vision.worker.pid  # type: ignore[union-attr]
    with pytest.raises(MediaError) as info:
        list(vision.stream([], QUESTION, media=(broken,)))
    assert str(info.value).startswith("broken.png: the image cannot be decoded (")
    finished, _ = _turn(vision, [], QUESTION, (_image(8),))
    assert finished.reason == "length" and vision.worker.pid == pid  # type: ignore[union-attr]


def test_a_decoder_crash_ends_the_worker_not_the_caller(
    tiny_vision_model: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, mmproj = tiny_vision_model
    crashing = _image(9)
    monkeypatch.setenv("GLASSBOX_TEST_CRASH_ON_MEDIA", crashing.digest)
    with _session(model, mmproj) as session:
        session.load()
        with pytest.raises(EngineCrashed) as info:
            list(session.stream([], QUESTION, media=(crashing,)))
        assert "the conversation is safe" in str(info.value)
        finished, _ = _turn(session, [], QUESTION, (_image(10),))  # a fresh worker
        assert finished.reason == "length" and finished.stats.media_encoded == 1


def test_stop_while_an_image_is_read_leaves_no_half_image(vision: ChatSession) -> None:
    import threading

    image = _image(11)
    vision.worker.reset_cache()  # type: ignore[union-attr]
    cancel = threading.Event()
    vision.load()
    events = []
    # A long reply, so Stop (set as the image is read; the worker sees it within a poll) lands
    # before the reply could end by itself, wherever the worker is by then.
    long = _greedy(vision).model_copy(update={"max_tokens": 400})
    for event in vision.stream([], QUESTION, long, media=(image,), cancel=cancel):
        events.append(event)
        if isinstance(event, PrefillProgress) and event.encoding:
            cancel.set()
    finished = [e for e in events if isinstance(e, Finished)]
    assert finished and finished[0].reason == "cancelled"
    again, _ = _turn(vision, [], QUESTION, (image,))
    image_start = next(i for i, t in enumerate(vision.last_prompt) if is_placeholder(t))
    # The cache kept the image whole or not at all: a reuse ends before it or after it, never inside.
    kept = again.stats.cached_tokens
    assert kept <= image_start or kept >= image_start + IMAGE_TOKENS
    assert again.stats.media_encoded == (1 if kept <= image_start else 0)
    with _session(*_paths(vision)) as cold:
        fresh, _ = _turn(cold, [], QUESTION, (image,))
    assert again.text == fresh.text


def _paths(session: ChatSession) -> tuple[Path, Path | None]:
    return session.load_params.model_path, session.load_params.mmproj_path


def test_a_projector_of_another_model_is_refused_before_llama_cpp_sees_it(
    starter_model: Path, tiny_vision_model: tuple[Path, Path]
) -> None:
    _, mmproj = tiny_vision_model
    with pytest.raises(ModelLoadError) as info:
        ChatSession(LoadParams(model_path=starter_model, mmproj_path=mmproj))
    assert "is the projector of another model: it makes embeddings of width 64" in str(info.value)
    assert "reads 640" in str(info.value)


def test_a_scaled_image_says_so_and_costs_the_same(vision: ChatSession) -> None:
    big = _image(12, (200, 120), name="wide.png")
    (info,) = vision.media_info([big])
    assert (info.width, info.height, info.tokens) == (64, 38, IMAGE_TOKENS)
    assert info.note == "scaled down from 200×120 to 64×38 (the projector reads at most 64 pixels a side)"


def test_an_audio_clip_on_a_vision_projector_is_refused_in_one_line(vision: ChatSession) -> None:
    clip = read_media(fx.wav_bytes(0.5), name="tone.wav")
    with pytest.raises(MediaError) as info:
        vision.media_info([clip])
    assert str(info.value) == "tone.wav: this model's projector reads images, not audio"
