"""Images through ``glassbox serve``, with the official ``openai`` and ``anthropic`` clients, on the
tiny vision model built in the test with its projector beside it (tests/engine/tiny_vision.py):
``image_url`` data URLs and Anthropic ``image`` blocks are read, URLs are never fetched (a 400), a
bad image or a model without a projector is a 400 naming it, and a remote backend passes images on."""

from __future__ import annotations

import base64
import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from engine.inference.events import Finished
from engine.inference.remote import RemoteSession
from engine.inference.runtime import GenerationParams
from engine.media import read_media
from tests.engine.media_fixtures import wav_bytes
from tests.engine.tiny_audio import WINDOW_TOKENS
from tests.engine.tiny_vision import IMAGE_TOKENS

pytestmark = pytest.mark.model

KEY = "test-key-0123456789"
MODEL = "gemma3-vision-F32"  # the served model's id: its file's name


def _png(size: tuple[int, int] = (48, 40), colour: tuple[int, int, int] = (10, 200, 90)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def _data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _folder(tmp: Path, files: tuple[Path, ...]) -> Path:
    tmp.mkdir(parents=True)
    for path in files:
        shutil.copy(path, tmp / path.name)
    return tmp / files[0].name


@pytest.fixture(scope="module")
def vision_server(
    tiny_vision_model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("serve-vision")
    model = _folder(root / "models", tiny_vision_model)
    with start_server(Paths.resolve(root / "home"), port=0, api_key=KEY, model_path=model, n_ctx=512) as handle:
        yield handle


def _openai(handle: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{handle.url}/v1", api_key=KEY, max_retries=0)


def _ask(client: openai.OpenAI, content: Any, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0, **extra
    )


def test_an_image_url_data_part_is_seen_and_counted(vision_server: ServerHandle) -> None:
    client = _openai(vision_server)
    text_only = _ask(client, "What is in this image?")
    with_image = _ask(
        client,
        [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": _data_url(_png()), "detail": "auto"}},
        ],
    )
    assert with_image.choices[0].message.content is not None
    # The image's 16 tokens, its two markers (<start_of_image>, <end_of_image>) and its line break.
    added = with_image.usage.prompt_tokens - text_only.usage.prompt_tokens
    assert IMAGE_TOKENS + 2 <= added <= IMAGE_TOKENS + 4
    streamed = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(_png())}}]}],
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens >= IMAGE_TOKENS


@pytest.mark.parametrize(
    ("url", "code", "words"),
    [
        ("https://example.com/cat.png", "unsupported_image_url", "does not fetch images from URLs"),
        ("data:image/png;base64,@@@not base64@@@", "invalid_value", "not valid base64"),
        (_data_url(b"<!DOCTYPE html><html></html>"), "invalid_image", "this is an HTML page, not an image"),
        (_data_url(_png()[:60]), "invalid_image", "the PNG file is truncated"),
        ("data:image/png,rawbytes", "invalid_value", "only base64 data: URLs are read"),
    ],
    ids=["https", "bad-base64", "html", "truncated", "not-base64-url"],
)
def test_what_cannot_be_read_is_a_400_naming_the_part(
    vision_server: ServerHandle, url: str, code: str, words: str
) -> None:
    client = _openai(vision_server)
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}])
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == code
    assert words in error["message"] and error["message"].startswith("messages[0].content[1].image_url")


def test_an_anthropic_image_block_is_seen_and_a_url_source_refused(vision_server: ServerHandle) -> None:
    client = anthropic.Anthropic(base_url=vision_server.url, api_key=KEY, max_retries=0)
    image = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(_png()).decode()}
    reply = client.messages.create(
        model=MODEL,
        max_tokens=4,
        messages=[{"role": "user", "content": [{"type": "image", "source": image}, {"type": "text", "text": "What?"}]}],
    )
    text = client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "What?"}])

    def prompt(usage: Any) -> int:  # Anthropic counts the tokens read from the KV cache apart
        return int(usage.input_tokens + (usage.cache_read_input_tokens or 0))

    assert prompt(reply.usage) - prompt(text.usage) >= IMAGE_TOKENS
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}],
                }
            ],
        )
    assert "does not fetch images from URLs" in str(info.value)


def test_a_model_without_a_projector_answers_400_naming_it(
    tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    model = _folder(tmp_path / "blind", (tiny_vision_model[0],))
    with start_server(Paths.resolve(tmp_path / "home"), port=0, api_key=KEY, model_path=model, n_ctx=512) as handle:
        client = _openai(handle)
        with pytest.raises(openai.BadRequestError) as info:
            _ask(client, [{"type": "image_url", "image_url": {"url": _data_url(_png())}}])
        message = info.value.body["message"]  # type: ignore[index]
        assert "this model cannot see images" in message and model.name in message
        assert _ask(client, "still answers text").choices[0].message.content is not None


def test_serve_loads_the_projector_chosen_by_hand_in_the_library(
    tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    from engine.library import ModelLibrary

    model = _folder(tmp_path / "alone", (tiny_vision_model[0],))
    projector = tmp_path / "projectors" / "vision-encoder.gguf"  # not beside it: only the choice finds it
    projector.parent.mkdir()
    shutil.copy(tiny_vision_model[1], projector)
    paths = Paths.resolve(tmp_path / "home").ensure()
    library = ModelLibrary(paths.models, manifest_path=paths.models_manifest, folders_file=paths.model_folders)
    library.set_projector(model, projector)  # what the Models page's Projector does
    with start_server(paths, port=0, api_key=KEY, model_path=model, n_ctx=512) as handle:
        client = _openai(handle)
        text_only = _ask(client, "What is in this image?")
        with_image = _ask(
            client,
            [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": _data_url(_png())}},
            ],
        )
        assert with_image.usage.prompt_tokens - text_only.usage.prompt_tokens >= IMAGE_TOKENS


def test_a_remote_backend_passes_images_on(vision_server: ServerHandle) -> None:
    remote = RemoteSession(vision_server.url, None, KEY)
    image = read_media(_png(), name="green.png")
    with remote:
        remote.load()
        events = list(remote.stream([], "What?", GenerationParams(max_tokens=4, temperature=0), media=(image,)))
        plain = list(remote.stream([], "What?", GenerationParams(max_tokens=4, temperature=0)))
    seen = next(e for e in events if isinstance(e, Finished))
    text = next(e for e in plain if isinstance(e, Finished))
    # The server's own count of the prompt (it has the projector): the image's tokens are in it.
    assert seen.stats.prompt_tokens - text.stats.prompt_tokens >= IMAGE_TOKENS
    assert seen.stats.budget.get("estimated") == 1  # here the image's cost was a guess


def test_serve_takes_an_input_audio_part(tiny_audio_model: tuple[Path, Path], tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    for path in tiny_audio_model:
        shutil.copy(path, folder / path.name)
    model = folder / tiny_audio_model[0].name
    with start_server(Paths.resolve(tmp_path / "home"), port=0, api_key=KEY, model_path=model, n_ctx=2048) as handle:
        client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key=KEY, max_retries=0)
        clip = base64.b64encode(wav_bytes(1.0)).decode()
        reply = client.chat.completions.create(
            model=model.stem,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}},
                        {"type": "text", "text": "What is it?"},
                    ],
                }
            ],
            max_tokens=2,
            temperature=0,
        )
        assert reply.usage is not None and reply.usage.prompt_tokens > WINDOW_TOKENS
