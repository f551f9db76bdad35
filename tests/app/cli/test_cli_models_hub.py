"""``glassbox models search | files | download`` from outside, against the loopback fake Hub."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from hub_server import FakeHub, random_bytes

from app.cli.commands.models_hub import ProgressPrinter
from engine.hub.transfer import DownloadProgress

ROOT = Path(__file__).resolve().parents[3]
REPO = "acme/tiny-GGUF"
VISION_REPO = "vera/see-GGUF"
Q4 = random_bytes(2 * 2**20 + 7, 1)
PARTS = [random_bytes(300_000, 10 + i) for i in range(3)]
# Names a Hub answer may carry: a right-to-left override (``…gguf.exe`` disguised), terminal controls.
HOSTILE_REPO = "mallory/photo\u202eFUGG.exe"
HOSTILE_CLEAR = "mallory/x\x1b[2J\x1b]0;pwned\x07-GGUF"
HOSTILE_FILE = "tiny\u202egpj\x9b2J-Q4_0.gguf"


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(
            REPO,
            {
                "tiny-Q4_K_M.gguf": Q4,
                "big/tiny-F16-00001-of-00003.gguf": PARTS[0],
                "big/tiny-F16-00002-of-00003.gguf": PARTS[1],
                "big/tiny-F16-00003-of-00003.gguf": PARTS[2],
                "mmproj-tiny-f16.gguf": b"projector",
            },
            downloads=9,
            likes=4,
        )
        server.add_repo(
            VISION_REPO,
            {
                "see-Q4_K_M.gguf": b"m" * 64,
                "mmproj-see-F32.gguf": b"3" * 40,
                "mmproj-see-F16.gguf": b"1" * 20,
                "mmproj-see-BF16.gguf": b"b" * 20,
            },
        )
        server.add_repo("acme/other-GGUF", {"o-Q8_0.gguf": b"x" * 10}, downloads=99)
        server.add_repo("acme/pickled", {"pytorch_model.bin": b"pickle"})
        server.add_repo("acme/broken-split-GGUF", {"s-00001-of-00002.gguf": b"a"})
        server.add_repo(HOSTILE_REPO, {"x-Q4_0.gguf": b"x"}, downloads=1)
        server.add_repo(HOSTILE_CLEAR, {"x-Q4_0.gguf": b"x"}, downloads=0)
        server.add_repo("names/names-GGUF", {HOSTILE_FILE: b"x" * 10, "ok-Q8_0.gguf": b"y" * 10})
        server.add_repo(
            "loras/style-lora-GGUF",
            {"style-lora-f16.gguf": b"a" * 10},
            tags=["lora", "base_model:adapter:google/gemma-3-270m"],
            downloads=3,
        )
        server.add_repo("loras/pirate-lora-GGUF", {"p.gguf": b"p"}, tags=["lora"], card_data={"base_model": "x/y"})
        yield server


def glassbox(*args: str, home: Path, endpoint: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": endpoint, "PYTHONUNBUFFERED": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("glassbox: error: ")
    assert "Traceback" not in result.stderr
    return lines[0]


def test_download_json_prints_path_and_sha256(hub: FakeHub, tmp_path: Path) -> None:
    result = glassbox("models", "download", REPO, "tiny-Q4_K_M.gguf", "--json", home=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    path = Path(document["path"])
    assert path == tmp_path / "data" / "models" / "acme" / "tiny-GGUF" / "tiny-Q4_K_M.gguf"
    assert document["sha256"] == hashlib.sha256(Q4).hexdigest()
    assert path.read_bytes() == Q4
    assert document["revision"] == hub.repos[REPO].commit
    # progress goes to stderr, never to stdout
    assert "downloading tiny-Q4_K_M.gguf" in result.stderr
    assert "done tiny-Q4_K_M.gguf" in result.stderr
    assert not list(path.parent.glob("*.partial*"))
    # provenance for the model library: repo, commit and sha256
    manifest = json.loads((tmp_path / "data" / "models" / "manifest.json").read_text(encoding="utf-8"))
    (record,) = manifest["models"].values()
    assert (record["repo"], record["revision"], record["sha256"]) == (REPO, document["revision"], document["sha256"])


def test_download_of_a_split_model_fetches_every_part_and_the_mmproj(hub: FakeHub, tmp_path: Path) -> None:
    result = glassbox(
        "models",
        "download",
        REPO,
        "big/tiny-F16.gguf",
        "--with-mmproj",
        "--json",
        "--to",
        str(tmp_path / "out"),
        home=tmp_path,
        endpoint=hub.url,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    names = [Path(f["path"]).name for f in document["files"]]
    assert names == [
        "tiny-F16-00001-of-00003.gguf",
        "tiny-F16-00002-of-00003.gguf",
        "tiny-F16-00003-of-00003.gguf",
        "mmproj-tiny-f16.gguf",
    ]
    assert document["path"] == str(tmp_path / "out" / "big" / "tiny-F16-00001-of-00003.gguf")
    for part, data in zip(document["files"], PARTS, strict=False):
        assert Path(part["path"]).read_bytes() == data


def test_with_mmproj_fetches_the_one_projector_a_load_picks(hub: FakeHub, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = glassbox(
        "models", "download", VISION_REPO, "see-Q4_K_M.gguf", "--with-mmproj", "--json", "--to", str(out),
        home=tmp_path, endpoint=hub.url,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [Path(f["path"]).name for f in json.loads(result.stdout)["files"]] == [
        "see-Q4_K_M.gguf",
        "mmproj-see-F16.gguf",
    ]
    assert sorted(p.name for p in out.iterdir()) == ["mmproj-see-F16.gguf", "see-Q4_K_M.gguf"]
    listing = glassbox("models", "files", VISION_REPO, home=tmp_path, endpoint=hub.url)
    assert listing.returncode == 0, listing.stderr
    assert any(line.startswith("see-Q4_K_M.gguf") and line.endswith("mmproj-see-F16.gguf (of 3)")
               for line in listing.stdout.splitlines())  # fmt: skip
    document = json.loads(glassbox("models", "files", VISION_REPO, "--json", home=tmp_path, endpoint=hub.url).stdout)
    assert document["choices"][0]["projector"] == "mmproj-see-F16.gguf"


def test_download_finds_a_model_in_the_models_pages_old_folder(hub: FakeHub, tmp_path: Path) -> None:
    """Before one layout the Models page saved to models/owner__repo/: a file there is found, not fetched again."""
    old = tmp_path / "data" / "models" / "acme__tiny-GGUF"
    old.mkdir(parents=True)
    (old / "tiny-Q4_K_M.gguf").write_bytes(Q4)
    before = len(hub.requests)
    result = glassbox("models", "download", REPO, "tiny-Q4_K_M.gguf", "--json", home=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    assert Path(json.loads(result.stdout)["path"]) == old / "tiny-Q4_K_M.gguf"
    assert not [p for _m, p, _h in hub.requests[before:] if p.startswith("/cdn/")]  # verified in place
    assert not (tmp_path / "data" / "models" / "acme").exists()


def test_download_human_output_names_the_file(hub: FakeHub, tmp_path: Path) -> None:
    result = glassbox("models", "download", "acme/other-GGUF", "o-Q8_0.gguf", home=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    path, sha = result.stdout.split("  sha256 ")
    assert Path(path).read_bytes() == b"x" * 10
    assert sha.strip() == hashlib.sha256(b"x" * 10).hexdigest()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("acme/tiny-GGUF", "nope.gguf"), "nope.gguf: no such file in acme/tiny-GGUF"),
        (("acme/tiny-GGUF", "../evil.gguf"), "unsafe file name"),
        (("acme/tiny-GGUF", "C:\\evil.gguf"), "unsafe file name"),
        (("nobody/nothing", "x.gguf"), "nobody/nothing: no such repository/file"),
        (("acme/pickled", "pytorch_model.bin"), "contains only pickle weights (unsafe to load)"),
        (("acme/broken-split-GGUF", "s.gguf"), "s.gguf: part 2 of 2 is missing in acme/broken-split-GGUF"),
        (("not a repo", "x.gguf"), "not a Hugging Face repository id"),
    ],
)
def test_download_errors_are_one_line_with_exit_1(
    hub: FakeHub, tmp_path: Path, args: tuple[str, str], expected: str
) -> None:
    assert expected in one_line_error(glassbox("models", "download", *args, home=tmp_path, endpoint=hub.url))


def test_download_when_offline_says_so(tmp_path: Path) -> None:
    with FakeHub() as server:
        endpoint = server.url
    line = one_line_error(glassbox("models", "download", REPO, "tiny-Q4_K_M.gguf", home=tmp_path, endpoint=endpoint))
    assert f"offline: cannot reach {endpoint}" in line


def test_search_json_and_table(hub: FakeHub, tmp_path: Path) -> None:
    result = glassbox("models", "search", "acme", "--json", home=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [r["id"] for r in document["results"]] == ["acme/other-GGUF", "acme/tiny-GGUF", "acme/broken-split-GGUF"]
    assert document["results"][1]["likes"] == 4
    table = glassbox("models", "search", "acme", "--sort", "likes", "--limit", "1", home=tmp_path, endpoint=hub.url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["REPOSITORY", "DOWNLOADS", "LIKES", "UPDATED"]
    assert lines[1].split()[0] == "acme/tiny-GGUF"
    assert len(lines) == 2


def test_search_adapters_lists_each_with_its_base(hub: FakeHub, tmp_path: Path) -> None:
    result = glassbox("models", "search", "lora", "--adapters", "--json", home=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [(r["id"], r["base_model"]) for r in document["results"]] == [
        ("loras/style-lora-GGUF", "google/gemma-3-270m"),
        ("loras/pirate-lora-GGUF", "x/y"),
    ]
    table = glassbox("models", "search", "--base", "google/gemma-3-270m", home=tmp_path, endpoint=hub.url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["ADAPTER", "BASE", "MODEL", "DOWNLOADS", "LIKES"]
    assert lines[1].split()[:2] == ["loras/style-lora-GGUF", "google/gemma-3-270m"] and len(lines) == 2
    assert "say what to search for" in one_line_error(glassbox("models", "search", home=tmp_path, endpoint=hub.url))


def test_search_bad_usage_exits_2(hub: FakeHub, tmp_path: Path) -> None:
    result = glassbox("models", "search", "x", "--sort", "stars", home=tmp_path, endpoint=hub.url)
    assert result.returncode == 2
    assert "glassbox: error:" in result.stderr


def test_files_lists_quants_groups_and_mmproj(hub: FakeHub, tmp_path: Path) -> None:
    result = glassbox("models", "files", REPO, "--json", home=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    choices = {c["name"]: c for c in document["choices"]}
    assert set(choices) == {"tiny-Q4_K_M.gguf", "big/tiny-F16.gguf"}
    assert choices["big/tiny-F16.gguf"]["total_size"] == 900_000
    assert choices["big/tiny-F16.gguf"]["quant"] == "F16"
    assert [m["filename"] for m in choices["tiny-Q4_K_M.gguf"]["mmproj"]] == ["mmproj-tiny-f16.gguf"]
    table = glassbox("models", "files", REPO, home=tmp_path, endpoint=hub.url)
    assert table.returncode == 0, table.stderr
    assert "big/tiny-F16.gguf" in table.stdout
    assert "Q4_K_M" in table.stdout
    assert "2.0 MiB" in table.stdout
    header = table.stdout.splitlines()[1].split()
    assert header == ["FILE", "QUANT", "SIZE", "PARTS", "FIT", "MMPROJ"]
    assert "RAM" in table.stdout or "GPU" in table.stdout  # a 2 MiB model fits anywhere


def test_download_refuses_a_model_too_big_for_the_machine_unless_forced(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main as cli
    from app.cli.commands import models_hub
    from engine.fit import FitEstimate

    def too_big(paths: object) -> object:
        message = "won't fit: about 2 MiB, 1 MiB usable"
        return lambda size: FitEstimate(size, 0, 0, size, "no", 0, message, None)

    monkeypatch.setattr(models_hub, "fit_checker", too_big)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    args = ["models", "download", REPO, "tiny-Q4_K_M.gguf", "--home", str(tmp_path), "--json"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "glassbox: error: tiny-Q4_K_M.gguf: won't fit: about 2 MiB, 1 MiB usable; pass --force" in err
    assert not list((tmp_path / "data" / "models").rglob("*.gguf*"))
    assert cli.main([*args, "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["sha256"] == hashlib.sha256(Q4).hexdigest()


def test_progress_printer_redraws_on_a_terminal() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=True)
    printer(DownloadProgress("m.gguf", 0, 100, 0.0, None, "connecting", 1))
    printer(DownloadProgress("m.gguf", 50, 100, 2048.0, 25.0, "downloading", 2, ""))
    printer(DownloadProgress("m.gguf", 100, 100, 0.0, None, "done", 2))
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 3
    assert " 50.0% (50 B of 100 B)  2.0 KiB/s  25 s left  attempt 2" in text  # the words the GUI uses
    assert text.endswith("\n")


def _no_terminal_control(text: str) -> None:
    for ch in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert ch not in text, (ch, text)


def test_search_escapes_the_controls_in_repository_names(hub: FakeHub, tmp_path: Path) -> None:
    table = glassbox("models", "search", "mallory", home=tmp_path, endpoint=hub.url)
    assert table.returncode == 0, table.stderr
    _no_terminal_control(table.stdout)
    assert "mallory/photo\\u202eFUGG.exe" in table.stdout
    assert "mallory/x\\x1b[2J\\x1b]0;pwned\\x07-GGUF" in table.stdout
    document = glassbox("models", "search", "mallory", "--json", home=tmp_path, endpoint=hub.url)
    _no_terminal_control(document.stdout)
    assert {r["id"] for r in json.loads(document.stdout)["results"]} == {HOSTILE_REPO, HOSTILE_CLEAR}


def test_files_escapes_the_controls_in_file_names(hub: FakeHub, tmp_path: Path) -> None:
    table = glassbox("models", "files", "names/names-GGUF", home=tmp_path, endpoint=hub.url)
    assert table.returncode == 0, table.stderr
    _no_terminal_control(table.stdout + table.stderr)
    assert "tiny\\u202egpj\\x9b2J-Q4_0.gguf" in table.stdout
    document = glassbox("models", "files", "names/names-GGUF", "--json", home=tmp_path, endpoint=hub.url)
    _no_terminal_control(document.stdout)
    assert HOSTILE_FILE in {c["name"] for c in json.loads(document.stdout)["choices"]}
