"""``glassbox ps``, ``glassbox unload``, ``glassbox chat --lora`` and ``glassbox models
convert-lora`` from outside, as a user runs them (the server itself in this process)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from engine.inference.pool import PoolSettings
from tests.engine.lora_fixtures import write_gguf_lora, write_peft_adapter

pytestmark = pytest.mark.model


def glassbox(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


class OneMore:
    def __init__(self, tiny: Path) -> None:
        self.tiny = tiny

    def find(self, name: str) -> Path | None:
        return self.tiny if name == "tiny" else None

    def names(self) -> list[str]:
        return ["tiny"]


@pytest.fixture
def server(starter_model: Path, tiny_model: Callable[[str], Path], tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_server(
        Paths.resolve(tmp_path / "served"),
        port=0,
        model_path=starter_model,
        n_ctx=512,
        catalog=OneMore(tiny_model("qwen3")),
        pool_settings=PoolSettings(memory_budget=8 << 30),
        aliases={"gpt-4o": "tiny"},
    )
    yield handle
    handle.stop()


@pytest.mark.slow
def test_ps_lists_the_resident_models_and_unload_unloads_them(server: ServerHandle, tmp_path: Path) -> None:
    home = tmp_path / "home"
    import openai

    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    api.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    listed = glassbox("ps", "--url", server.url, "--json", home=home)
    assert listed.returncode == 0, listed.stderr
    models = {m["name"]: m for m in json.loads(listed.stdout)["models"]}
    assert set(models) == {server.model, "tiny"}
    for model in models.values():
        assert model["state"] == "ready" and psutil.pid_exists(model["pid"])
        assert model["memory"]["total"] == sum(model["memory"][k] for k in ("weights", "kv", "compute", "overhead"))
        assert model["rss"] > 0  # measured from the worker process
        assert model["unload_in_s"] <= model["keep_s"]
    table = glassbox("ps", "--url", f"{server.url}/v1", home=home)
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split()[:3] == ["NAME", "STATE", "MEMORY"]
    assert "tiny" in table.stdout and "memory:" in table.stdout
    done = glassbox("unload", "gpt-4o", "--url", server.url, home=home)
    assert (done.returncode, done.stdout) == (0, "unloaded tiny\n")
    again = glassbox("unload", "tiny", "--url", server.url, home=home)
    assert again.stdout == "nothing to unload: tiny is not loaded\n"
    everything = glassbox("unload", "--all", "--url", server.url, "--json", home=home)
    assert json.loads(everything.stdout) == {"unloaded": [server.model]}
    after = json.loads(glassbox("ps", "--url", server.url, "--json", home=home).stdout)
    assert after["models"] == []
    assert [(e["name"], e["cause"]) for e in after["evictions"]] == [("tiny", "request"), (server.model, "request")]
    unknown = glassbox("unload", "nope", "--url", server.url, home=home)
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1 and "nope" in unknown.stderr


def test_ps_without_a_server_is_one_line(tmp_path: Path) -> None:
    result = glassbox("ps", "--url", "http://127.0.0.1:9", home=tmp_path / "home", timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("glassbox: error: http://127.0.0.1:9: no glassbox serve answers there")
    assert result.stderr.count("\n") == 1
    usage = glassbox("unload", "--url", "http://127.0.0.1:9", home=tmp_path / "home", timeout=60)
    assert usage.returncode == 1 and "give a model name or --all" in usage.stderr


def test_chat_lora_scale_zero_is_the_base_and_one_is_not(starter_model: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    lora = write_gguf_lora(tmp_path / "style.gguf", starter_model, strength=1.0)
    mismatched = write_gguf_lora(tmp_path / "llama.gguf", starter_model, architecture="llama")
    common = ["chat", "--model", str(starter_model), "--prompt", "Hello", "--temperature", "0", "--max-tokens", "8"]

    def reply(*extra: str) -> dict:  # type: ignore[type-arg]
        result = glassbox(*common, *extra, "--json", "--no-kv-cache", home=home)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]

    base = reply()
    zero = reply("--lora", f"{lora}:0")
    one = reply("--lora", str(lora))
    assert zero["text"] == base["text"] and zero["adapters"] == ""
    assert one["text"] != base["text"] and one["adapters"] == "style.gguf:1"
    refused = glassbox(*common, "--lora", str(mismatched), home=home)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"glassbox: error: {mismatched}: does not fit {starter_model}: it is for the llama architecture, "
        "the model is gemma3\n"
    )
    not_a_file = glassbox(*common, "--lora", "nothing-here:0.5", home=home)
    assert not_a_file.returncode == 1 and "no such adapter file" in not_a_file.stderr


@pytest.mark.slow
def test_models_convert_lora_writes_an_adapter_the_library_lists(
    starter_model: Path, llama_cpp_source: Path, tmp_path: Path
) -> None:
    from engine.convert.lora_to_gguf import base_config_from_gguf
    from engine.library import read_model_info

    home = tmp_path / "home"
    models = Paths.resolve(home).models
    models.mkdir(parents=True)
    shutil.copyfile(starter_model, models / "gemma.gguf")
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "config.json").write_text(json.dumps(base_config_from_gguf(read_model_info(starter_model))))
    peft = write_peft_adapter(tmp_path / "my-style", config, strength=0.05)
    convert = ["models", "convert-lora", str(peft), "--base", "gemma", "--converter", str(llama_cpp_source)]
    result = glassbox(*convert, "--json", home=home)
    assert result.returncode == 0, result.stderr
    done = json.loads(result.stdout)
    assert done["path"] == str(models / "my-style-lora-f16.gguf")
    assert done["checked_against"] == str(models / "gemma.gguf")
    listing = json.loads(glassbox("models", "list", "--json", home=home).stdout)
    entries = listing["models"] if isinstance(listing, dict) else listing
    adapter = next(e for e in entries if e["name"] == "my-style-lora-f16.gguf")
    assert adapter["kind"] == "adapter" and adapter["base_model"] == "gemma"
    refused = glassbox("chat", "--model", "my-style-lora-f16", "--prompt", "hi", home=home)
    assert refused.returncode == 1 and "a LoRA adapter" in refused.stderr
