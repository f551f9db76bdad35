"""Audio clips in a turn, on a tiny random-weight Qwen2-Audio model and its Whisper-style projector
built by llama.cpp's converter in the test (tests/engine/tiny_audio.py): a clip costs what mtmd
counts (750 tokens a 30-second window), it is encoded and read like an image, and a clip the
decoder refuses, or one on a projector that reads only images (and an image on this one), is one
line. Answers are noise; the numbers are exact."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.inference.context import Message
from engine.inference.events import Finished
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from engine.media import Media, MediaError, read_media
from tests.engine import media_fixtures as fx
from tests.engine.tiny_audio import WINDOW_TOKENS

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def hearing(tiny_audio_model: tuple[Path, Path]) -> Iterator[ChatSession]:
    model, mmproj = tiny_audio_model
    load = LoadParams(model_path=model, mmproj_path=mmproj, n_ctx=4096, n_batch=512, n_threads=2)
    with ChatSession(load, reply_reserve=16) as session:
        session.load()
        yield session


def _mtmd_count(model: Path, mmproj: Path, media: Media) -> int:
    """mtmd itself, in this process: the clip's bytes through its own helper and tokenizer."""
    import llama_cpp
    from llama_cpp import mtmd_cpp as m

    from engine.cpu_backend import load_backends

    assert load_backends().error is None
    llm = llama_cpp.Llama(str(model), n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=2, verbose=False)
    params = m.mtmd_context_params_default()
    params.use_gpu, params.warmup, params.print_timings = False, False, False
    ctx = m.mtmd_init_from_file(str(mmproj).encode(), llm._model.model, params)
    try:
        data = (ctypes.c_uint8 * len(media.data)).from_buffer_copy(media.data)
        bitmap = m.mtmd_helper_bitmap_init_from_buf(ctx, data, len(media.data), False)
        assert bitmap and m.mtmd_bitmap_is_audio(bitmap)
        chunks = m.mtmd_input_chunks_init()
        text = m.mtmd_default_marker()
        inp = m.mtmd_input_text(text, len(text), False, True)
        assert m.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        count = sum(
            int(m.mtmd_input_chunk_get_n_tokens(m.mtmd_input_chunks_get(chunks, i)))
            for i in range(m.mtmd_input_chunks_size(chunks))
            if m.mtmd_input_chunk_get_type(m.mtmd_input_chunks_get(chunks, i)) == m.MTMD_INPUT_CHUNK_TYPE_AUDIO
        )
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        return count
    finally:
        m.mtmd_free(ctx)
        llm.close()


def test_a_clip_costs_what_mtmd_counts(hearing: ChatSession, tiny_audio_model: tuple[Path, Path]) -> None:
    assert hearing.info is not None and hearing.info.projector is not None
    assert (hearing.info.projector.audio, hearing.info.projector.vision) == (True, False)
    short = read_media(fx.wav_bytes(2.0), name="tone.wav")
    long = read_media(fx.wav_bytes(45.0), name="long.wav")
    stereo = read_media(fx.wav_bytes(1.0, rate=44_100, channels=2), name="stereo.wav")
    infos = hearing.media_info([short, long, stereo])
    assert [(i.tokens, i.chunks) for i in infos] == [(WINDOW_TOKENS, 1), (2 * WINDOW_TOKENS, 2), (WINDOW_TOKENS, 1)]
    assert infos[1].tokens == _mtmd_count(*tiny_audio_model, long)  # the projector's own count


def test_a_clip_in_a_turn_is_encoded_once_and_counted_in_its_band(hearing: ChatSession) -> None:
    clip = read_media(fx.wav_bytes(3.0), name="tone.wav")
    params = GenerationParams(temperature=0.0, max_tokens=4)
    events = list(hearing.stream([], "What do you hear?", params, media=(clip,)))
    done = next(e for e in events if isinstance(e, Finished))
    stats = done.stats
    assert stats.media_tokens == WINDOW_TOKENS and stats.budget["media"] == WINDOW_TOKENS
    assert stats.media_encoded == 1 and stats.encode_ms > 0
    assert sum(stats.budget.values()) == stats.n_ctx
    history = [Message("user", "What do you hear?", media=(clip,)), Message("assistant", done.text)]
    again = next(e for e in hearing.stream(history, "Again?", params) if isinstance(e, Finished))
    assert again.stats.media_encoded == 0 and again.stats.cached_tokens > WINDOW_TOKENS  # kept in the KV cache


def test_what_the_decoder_or_the_projector_refuses_is_one_line(hearing: ChatSession) -> None:
    mp3 = read_media(fx.mp3_bytes(200), name="silence.mp3")
    (info,) = hearing.media_info([mp3])
    assert info.tokens == WINDOW_TOKENS
    header_only = read_media(fx.flac_bytes(2.0), name="cut.flac")  # passes the header check, no audio frames
    with pytest.raises(MediaError) as info_flac:
        hearing.media_info([header_only])
    assert str(info_flac.value) == "cut.flac: llama.cpp could not read this audio"
    picture = read_media(fx.good_image("png", (16, 16)), name="dot.png")
    with pytest.raises(MediaError) as info_png:
        hearing.media_info([picture])
    assert str(info_png.value) == "dot.png: this model's projector reads audio, not images"
