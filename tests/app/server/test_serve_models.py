"""``glassbox serve`` and the library: a request naming another chat model of the library loads it
beside the one served (the model pool); a name the library does not have is a 404; a model that
fails to load is an error, and the other models go on answering. The starter model, copied under
other names, stands for the library's models. (Two different models resident at once, aliases,
keep_alive, the queue and the adapters: ``test_serve_pool.py``.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import openai
import pytest

from app.cli.commands.serve import LibraryCatalog
from app.paths import Paths
from app.server.http import start_server

pytestmark = [pytest.mark.model, pytest.mark.slow]  # three model loads


class Catalog:
    """Two names: one a copy of the starter model, one a file that is not a model."""

    def __init__(self, folder: Path, starter: Path) -> None:
        self.other = folder / "other-model.gguf"
        shutil.copyfile(starter, self.other)
        self.broken = folder / "broken.gguf"
        self.broken.write_bytes(b"GGUF" + b"\0" * 64)
        self.asked: list[str] = []

    def find(self, name: str) -> Path | None:
        self.asked.append(name)
        return {"other-model": self.other, "broken": self.broken}.get(name)

    def names(self) -> list[str]:
        return ["other-model", "broken"]


def test_a_library_model_is_loaded_when_asked_for(starter_model: Path, tmp_path: Path) -> None:
    catalog = Catalog(tmp_path, starter_model)
    handle = start_server(
        Paths.resolve(tmp_path / "home"), port=0, model_path=starter_model, n_ctx=512, catalog=catalog
    )
    try:
        api = openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=120)
        first = handle.model
        assert [m.id for m in api.models.list().data] == [first, "other-model", "broken"]
        ask = [{"role": "user", "content": "Hello"}]
        reply = api.chat.completions.create(model="other-model", messages=ask, max_tokens=2, temperature=0)  # type: ignore[arg-type]
        assert reply.model == "other-model"
        loaded = {m.id: m.model_extra["loaded"] for m in api.models.list().data if m.model_extra}
        assert loaded == {first: True, "other-model": True, "broken": False}  # both resident
        with pytest.raises(openai.NotFoundError) as caught:
            api.chat.completions.create(model="../etc/passwd", messages=ask)  # type: ignore[arg-type]
        assert caught.value.code == "model_not_found"
        assert "../etc/passwd" not in catalog.asked  # a path is never looked up
        with pytest.raises(openai.APIStatusError) as failed:
            api.chat.completions.create(model="broken", messages=ask, max_tokens=2)  # type: ignore[arg-type]
        assert failed.value.status_code in (400, 500, 503)
        again = api.chat.completions.create(model=first, messages=ask, max_tokens=2, temperature=0)  # type: ignore[arg-type]
        assert again.model == first and again.choices[0].message.content is not None
    finally:
        handle.stop()


def test_the_cli_catalog_is_the_librarys_chat_models(starter_model: Path, tmp_path: Path) -> None:
    paths = Paths.resolve(tmp_path / "home")
    paths.models.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(starter_model, paths.models / "tiny-chat.gguf")
    catalog = LibraryCatalog(paths)
    assert "tiny-chat" in catalog.names()
    assert catalog.find("tiny-chat") == paths.models / "tiny-chat.gguf"
    assert catalog.find("no-such-model") is None


def test_stopping_during_a_model_load_leaves_no_worker(starter_model: Path, tmp_path: Path) -> None:
    """A request that asked for another model, stopped while (or just after) it loads: stop()
    returns, the client is answered, and no inference worker outlives the server."""
    import threading
    import time

    import psutil

    catalog = Catalog(tmp_path, starter_model)
    handle = start_server(
        Paths.resolve(tmp_path / "home"), port=0, model_path=starter_model, n_ctx=512, catalog=catalog
    )
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    api = openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=60)
    answers: list[object] = []

    def ask() -> None:
        try:
            answers.append(
                api.chat.completions.create(
                    model="other-model", messages=[{"role": "user", "content": "hi"}], max_tokens=64
                )
            )
        except openai.APIError as exc:
            answers.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while "other-model" not in catalog.asked and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    stopper = threading.Thread(target=handle.stop, daemon=True)
    stopper.start()
    # A hang guard, not a speed target: stop() takes ~1 s here; 30 s is far past that on any machine.
    stopper.join(30)
    assert not stopper.is_alive(), "stop() hung during the model load"
    thread.join(30)
    assert answers, "the client got no answer"
    time.sleep(0.5)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    assert [p for p in left if p.status() != psutil.STATUS_ZOMBIE] == []
