"""``glassbox models list | info | fit | remove | folders`` from the outside: output, JSON, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.cli.main import main
from app.paths import Paths
from engine.fit import kv_cache_bytes
from engine.gguf import read_gguf_info
from engine.hardware import cpu_name

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "engine"))
from gguf_fixtures import build  # noqa: E402


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A profile whose bandwidth is already measured (so `fit` does not spend time measuring)."""
    home = tmp_path / "home"
    paths = Paths.resolve(home).ensure()
    record = {"gbps": 20.0, "measured_at": datetime.now(UTC).isoformat(), "cpu": cpu_name()}
    paths.bandwidth_cache.write_text(json.dumps(record))
    return home


def _models(home: Path) -> Path:
    return Paths.resolve(home).models


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------- info
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n", "this is a Git LFS pointer"),
        (build().data[:300], "model file is incomplete"),
        (b"GGUF" + (3).to_bytes(4, "little") + (2**64 - 1).to_bytes(8, "little") + bytes(8), "model file is malformed"),
    ],
    ids=["lfs", "truncated", "absurd-tensor-count"],
)
def test_info_on_a_bad_file_is_one_line_and_exit_1(tmp_path: Path, content: bytes, reason: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "app", "models", "info", str(bad), "--home", str(tmp_path / "home")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"glassbox: error: {bad}: {reason}")
    assert "Traceback" not in done.stderr


def test_info_human_and_json(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build().write(tmp_path / "tiny.gguf")
    code, out, _ = _run(capsys, "models", "info", str(model), "--home", str(home))
    assert code == 0
    assert "architecture:" in out
    assert "llama" in out
    assert "chat template:" in out
    assert "runs here:         yes" in out.splitlines()
    code, out, _ = _run(capsys, "models", "info", str(model), "--json", "--home", str(home))
    assert code == 0
    doc = json.loads(out)
    assert (doc["architecture"], doc["n_layers"], doc["file_type"]) == ("llama", 2, "F16")
    assert doc["has_chat_template"] is True


def test_info_escapes_control_characters_from_the_file(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gguf_fixtures import STRING, default_kvs, kv

    evil = kv("general.name", STRING, "evil\x1b[31m\nname")
    kvs = [k if b"general.name" not in k else evil for k in default_kvs()]
    model = build(kvs).write(tmp_path / "evil.gguf")
    code, out, _ = _run(capsys, "models", "info", str(model), "--home", str(home))
    assert code == 0
    assert "\x1b" not in out
    assert "name:              evil\\x1b[31m\\nname" in out.splitlines()


def test_info_by_library_name(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build().write(_models(home) / "tiny-model.gguf")
    code, out, _ = _run(capsys, "models", "info", "tiny-model", "--json", "--home", str(home))
    assert code == 0
    assert json.loads(out)["name"] == "Tiny Test"
    code, _, err = _run(capsys, "models", "info", "no-such-model", "--home", str(home))
    assert code == 1
    assert err.startswith("glassbox: error: no-such-model: ")


# ---------------------------------------------------------------------- list
def test_list_shows_models_errors_and_fit(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build().write(_models(home) / "tiny.gguf")
    (_models(home) / "page.gguf").write_text("<!DOCTYPE html><html></html>")
    code, out, _ = _run(capsys, "models", "list", "--json", "--home", str(home))
    assert code == 0
    doc = json.loads(out)
    by_name = {m["name"]: m for m in doc["models"]}
    assert set(by_name) == {"tiny.gguf", "page.gguf"}
    assert by_name["tiny.gguf"]["fit"]["verdict"] in ("gpu", "ram")
    assert by_name["tiny.gguf"]["owned"] is True
    assert by_name["page.gguf"]["fit"] is None
    assert "HTML page" in by_name["page.gguf"]["error"]
    assert doc["folders"][0]["owned"] is True
    code, out, _ = _run(capsys, "models", "list", "--home", str(home))
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "ARCH", "PARAMS", "QUANT", "SIZE", "CTX", "FIT", "WHERE"]
    assert any(r.startswith("tiny.gguf") and "llama" in r for r in rows)
    assert any(r.startswith("tiny.gguf") and " 34.0K " in r for r in rows)  # parameters
    assert any("page.gguf: this is an HTML page" in r for r in rows)


def test_list_empty_library(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "models", "list", "--home", str(home))
    assert code == 0
    assert "No models yet" in out


# ---------------------------------------------------------------------- fit
def test_fit_json_uses_the_estimator_and_cached_bandwidth(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build().write(tmp_path / "tiny.gguf")
    code, out, _ = _run(capsys, "models", "fit", str(model), "--n-ctx", "100", "--json", "--home", str(home))
    assert code == 0
    doc = json.loads(out)
    assert doc["n_ctx"] == 256  # padded like llama.cpp
    assert doc["kv_bytes"] == kv_cache_bytes(read_gguf_info(model), 256)
    assert doc["bandwidth_gbps"] == 20.0
    assert doc["verdict"] in ("gpu", "ram")
    assert "total_ram" in doc["hardware"]
    assert doc["unsupported"] is None
    code, out, _ = _run(capsys, "models", "fit", str(model), "--cache-type", "q8_0", "--json", "--home", str(home))
    assert code == 0
    assert json.loads(out)["kv_bytes"] < doc["kv_bytes"]  # 34 bytes per 32 values instead of 64


@pytest.mark.model
def test_fit_on_the_starter_model(home: Path, starter_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "models", "fit", str(starter_model), "--n-ctx", "4096", "--home", str(home))
    assert code == 0
    first, *rest = out.splitlines()
    assert first.startswith(("fits in RAM", "fits on GPU", "fits with partial offload"))
    text = "\n".join(rest)
    assert "KV cache:          72.0 MiB" in text
    assert "expected decode:" in text


@pytest.mark.model
def test_list_and_fit_know_a_vision_model_by_its_projector(
    home: Path, tiny_vision_model: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.fit import estimate_fit, projector_bytes
    from engine.hardware import probe_hardware

    folder = _models(home) / "owner" / "tiny-vision"
    folder.mkdir(parents=True)
    for path in tiny_vision_model:
        shutil.copy(path, folder / path.name)
    model, mmproj = (folder / p.name for p in tiny_vision_model)
    code, out, _ = _run(capsys, "models", "list", "--home", str(home))
    assert code == 0
    assert f"  {model.name}: sees images (projector {mmproj.name})" in out.splitlines()
    assert not any(line.startswith(f"  {mmproj.name}: sees") for line in out.splitlines())
    code, out, _ = _run(capsys, "models", "list", "--json", "--home", str(home))
    listed = {m["name"]: m for m in json.loads(out)["models"]}[model.name]
    info, proj = read_gguf_info(model), read_gguf_info(mmproj)
    assert listed["fit"]["projector_bytes"] == projector_bytes(proj) > proj.tensor_bytes
    # fit: the projector's memory in the weights, named on its own line, and in the JSON.
    code, out, _ = _run(capsys, "models", "fit", str(model), "--n-ctx", "512", "--json", "--home", str(home))
    doc = json.loads(out)
    alone = estimate_fit(info, probe_hardware(), 512)
    assert doc["mmproj"] == str(mmproj) and doc["projector_bytes"] == projector_bytes(proj)
    assert doc["weights_bytes"] == info.tensor_bytes + projector_bytes(proj)
    assert doc["total_bytes"] == alone.total_bytes + projector_bytes(proj)
    code, out, _ = _run(capsys, "models", "fit", str(model), "--n-ctx", "512", "--home", str(home))
    assert code == 0 and "+ projector " in out.splitlines()[0]
    assert any(line.startswith("projector:") and mmproj.name in line for line in out.splitlines())
    # info: the model sees images through its projector; the projector says what it reads.
    code, out, _ = _run(capsys, "models", "info", str(model), "--home", str(home))
    assert code == 0 and f"sees:              images (through {mmproj.name})" in out.splitlines()
    code, out, _ = _run(capsys, "models", "info", str(mmproj), "--home", str(home))
    assert code == 0 and "reads:             images" in out.splitlines()
    code, out, _ = _run(capsys, "models", "info", str(model), "--json", "--home", str(home))
    assert (json.loads(out)["sees"], json.loads(out)["mmproj"]) == ("images", str(mmproj))
    # A text model beside no projector: nothing said, nothing counted.
    alone_path = shutil.copy(model, home / "alone.gguf")
    code, out, _ = _run(capsys, "models", "fit", str(alone_path), "--n-ctx", "512", "--json", "--home", str(home))
    assert json.loads(out)["mmproj"] is None and json.loads(out)["projector_bytes"] == 0
    code, out, _ = _run(capsys, "models", "info", str(alone_path), "--home", str(home))
    assert "sees:              text only (no projector beside it)" in out.splitlines()


def test_fit_bad_usage_exits_2(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build().write(tmp_path / "tiny.gguf")
    with pytest.raises(SystemExit) as caught:
        main(["models", "fit", str(model), "--n-ctx", "0", "--home", str(home)])
    assert caught.value.code == 2
    with pytest.raises(SystemExit):
        main(["models", "fit", str(model), "--cache-type", "q3_k", "--home", str(home)])


# ---------------------------------------------------------------------- remove and folders
def test_remove_owned_only_and_asks_first(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = build().write(_models(home) / "mine.gguf")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    theirs = build(tensors=[("only", [32], 0)]).write(elsewhere / "theirs.gguf")
    assert _run(capsys, "models", "folders", "--add", str(elsewhere), "--home", str(home))[0] == 0
    # no terminal and no --yes: nothing is deleted
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # noqa: SIM115
    code, _, err = _run(capsys, "models", "remove", "mine", "--home", str(home))
    assert code == 1
    assert "confirm with --yes" in err
    assert mine.exists()
    code, _, err = _run(capsys, "models", "remove", "theirs", "--yes", "--home", str(home))
    assert code == 1
    assert "only deletes files it owns" in err
    assert theirs.exists()
    code, out, _ = _run(capsys, "models", "remove", "mine", "--yes", "--json", "--home", str(home))
    assert code == 0
    assert json.loads(out) == {"deleted": [str(mine)]}
    assert not mine.exists()


def test_remove_confirmation_on_a_terminal(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = build().write(_models(home) / "mine.gguf")

    class Tty:
        def __init__(self, answer: str) -> None:
            self.answer = answer

        def isatty(self) -> bool:
            return True

        def readline(self) -> str:
            return self.answer

    monkeypatch.setattr(sys, "stdin", Tty("n\n"))
    code, _, err = _run(capsys, "models", "remove", "mine", "--home", str(home))
    assert code == 1
    assert "Delete" in err
    assert mine.exists()
    monkeypatch.setattr(sys, "stdin", Tty("y\n"))
    code, out, _ = _run(capsys, "models", "remove", "mine", "--home", str(home))
    assert code == 0
    assert out.strip() == f"deleted {mine}"
    assert not mine.exists()


def test_folders_add_list_remove(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = tmp_path / "lmstudio"
    extra.mkdir()
    code, out, _ = _run(capsys, "models", "folders", "--add", str(extra), "--json", "--home", str(home))
    assert code == 0
    assert [f["path"] for f in json.loads(out)["folders"]][1:] == [str(extra)]
    extra.rmdir()
    code, out, _ = _run(capsys, "models", "folders", "--home", str(home))
    assert "unavailable" in out
    code, out, _ = _run(capsys, "models", "folders", "--remove", str(extra), "--json", "--home", str(home))
    assert len(json.loads(out)["folders"]) == 1
    code, _, err = _run(capsys, "models", "folders", "--add", str(tmp_path / "missing"), "--home", str(home))
    assert code == 1
    assert err == f"glassbox: error: {tmp_path / 'missing'}: no such folder\n"
