"""``glassbox chat --image FILE`` from outside, on the tiny vision model built in the test
(tests/engine/tiny_vision.py) with its projector beside it: the cost said before the turn, the
image kept with the conversation and sent again when it is continued in another process, and
every bad file or a blind model one line."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine import media_fixtures as fx
from tests.engine.tiny_vision import IMAGE_TOKENS

pytestmark = pytest.mark.model


def glassbox(*args: str, home: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _chat(model: Path, home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return glassbox(
        "chat", "--model", str(model), "--temperature", "0", "--max-tokens", "6", "--n-ctx", "512", *extra, home=home
    )


@pytest.fixture
def vision_folder(tiny_vision_model: tuple[Path, Path], tmp_path: Path) -> Path:
    """The model and its projector side by side, as a download puts them."""
    folder = tmp_path / "models" / "owner" / "tiny-vision"
    folder.mkdir(parents=True)
    for path in tiny_vision_model:
        shutil.copy(path, folder / path.name)
    return folder / tiny_vision_model[0].name


def _png(tmp_path: Path, name: str = "cat.png", size: tuple[int, int] = (48, 40)) -> Path:
    from PIL import Image

    image = Image.new("RGB", size, (200, 30, 90))
    out = io.BytesIO()
    image.save(out, "PNG")
    path = tmp_path / name
    path.write_bytes(out.getvalue())
    return path


def test_an_image_is_counted_sent_saved_and_sent_again_on_continue(vision_folder: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    image = _png(tmp_path, size=(200, 120))
    first = _chat(vision_folder, home, "--image", str(image), "--prompt", "What is it?", "--json")
    assert first.returncode == 0, first.stderr
    turn = json.loads(first.stdout.splitlines()[-1])
    (cost,) = turn["media"]
    assert (cost["name"], cost["tokens"], cost["width"], cost["height"]) == ("cat.png", IMAGE_TOKENS, 64, 38)
    assert cost["note"] == "scaled down from 200×120 to 64×38 (the projector reads at most 64 pixels a side)"
    assert turn["media_tokens"] == IMAGE_TOKENS and turn["budget"]["media"] == IMAGE_TOKENS
    assert turn["media_encoded"] == 1 and turn["encode_ms"] > 0
    stored = list((home / "data" / "media").rglob("*.png"))  # kept by content, with the conversation
    assert len(stored) == 1 and stored[0].read_bytes() == image.read_bytes()
    # Another process continues the conversation: the image goes again, from the data folder,
    # and the chat's saved KV cache already holds it (nothing encoded again).
    again = _chat(vision_folder, home, "--conversation", str(turn["conversation_id"]), "--prompt", "More?", "--json")
    assert again.returncode == 0, again.stderr
    follow = json.loads(again.stdout.splitlines()[-1])
    assert follow["media_tokens"] == IMAGE_TOKENS and "media" not in follow
    assert follow["kv_restored_tokens"] > 0 and follow["media_encoded"] == 0
    # Without --json the cost is said on stderr before the reply.
    plain = _chat(vision_folder, tmp_path / "home2", "--image", str(image), "--prompt", "What is it?")
    assert plain.returncode == 0, plain.stderr
    assert f"[cat.png: {IMAGE_TOKENS} tokens (PNG 200×120; scaled down from 200×120 to 64×38" in plain.stderr


def test_bad_images_and_a_blind_model_are_one_line(
    vision_folder: Path, tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    page = tmp_path / "page.png"
    page.write_bytes(b"<!DOCTYPE html><html><body>not found</body></html>")
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(fx.png_bomb())
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(fx.good_image("jpeg", (64, 64))[:300])
    cases = [
        (page, f"glassbox: error: {page}: this is an HTML page, not an image (a saved web page?)"),
        (bomb, f"glassbox: error: {bomb}: the image is 50,000×50,000 pixels; at most 16,384 a side"),
        (cut, f"glassbox: error: {cut}: the JPEG file is truncated"),
        (tmp_path / "missing.png", f"glassbox: error: {tmp_path / 'missing.png'}: no such file"),
    ]
    for path, line in cases:
        result = _chat(vision_folder, home, "--image", str(path), "--prompt", "hi")
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().startswith(line) and len(result.stderr.strip().splitlines()) == 1
    blind = tmp_path / "blind" / tiny_vision_model[0].name
    blind.parent.mkdir()
    shutil.copy(tiny_vision_model[0], blind)
    result = _chat(blind, home, "--image", str(_png(tmp_path)), "--prompt", "hi")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"glassbox: error: cat.png: this model cannot see images: {blind.name} was loaded without a projector "
        "(mmproj); download its mmproj (glassbox models download --with-mmproj), choose one "
        "(glassbox models projector MODEL FILE) or choose a vision model"
    )


def test_a_projector_chosen_by_hand_in_the_library_is_the_one_loaded(
    tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    from app.cli.commands.model_resolver import open_library
    from app.paths import Paths

    home = tmp_path / "home"
    paths = Paths.resolve(home).ensure()
    model = paths.models / "alone" / tiny_vision_model[0].name
    model.parent.mkdir(parents=True)
    shutil.copy(tiny_vision_model[0], model)
    projector = tmp_path / "projectors" / "vision-encoder.gguf"  # not beside it, not the Hub's naming
    projector.parent.mkdir()
    shutil.copy(tiny_vision_model[1], projector)
    image = _png(tmp_path)
    blind = _chat(model, home, "--image", str(image), "--prompt", "hi")
    assert blind.returncode == 1 and "this model cannot see images" in blind.stderr
    shown = glassbox("models", "projector", str(model), home=home)
    assert shown.returncode == 0 and shown.stdout.startswith(f"{model.name}: text only (no projector beside it")
    wrong = glassbox("models", "projector", str(model), str(model), home=home)  # a model is not a projector
    assert wrong.returncode == 1
    reason = "not a vision projector (mmproj): its architecture is gemma3"
    assert wrong.stderr.strip() == f"glassbox: error: {model}: {reason}"
    chosen = glassbox("models", "projector", str(model), str(projector), home=home)  # the Models page's Projector
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.strip() == f"{model.name}: sees images through {projector} (chosen by hand)"
    assert open_library(paths).chosen_projector(model) == projector
    seeing = _chat(model, home, "--image", str(image), "--prompt", "What is it?", "--json")
    assert seeing.returncode == 0, seeing.stderr
    turn = json.loads(seeing.stdout.splitlines()[-1])
    assert turn["media"][0]["tokens"] == IMAGE_TOKENS and turn["media_encoded"] == 1
    fit = glassbox("models", "fit", str(model), "--n-ctx", "512", "--json", home=home)
    assert fit.returncode == 0, fit.stderr
    assert json.loads(fit.stdout)["mmproj"] == str(projector) and json.loads(fit.stdout)["projector_bytes"] > 0
    back = glassbox("models", "projector", str(model), "--auto", "--json", home=home)
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout) == {"model": str(model), "mmproj": None, "sees": "", "chosen": False}
