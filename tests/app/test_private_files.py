"""A user's data is readable by that user alone: the data folders are 0700, every file that can hold a
key is 0600 (backups included), older loose ones are made private at start (and the log says so
once), and an API key never reaches a log file.

The tests run under an ordinary umask (022), where new files are 0644 and new folders 0755 unless
Glassbox asks for less.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from app.cli.main import main
from app.paths import Paths
from app.server.http import start_server
from app.settings import Settings, load_settings, save_settings
from engine.inference.endpoints import EndpointStore
from tests.app.server.serve_support import ScriptedBackend
from tests.disk_support import file_mode, usual_umask  # noqa: F401 - a fixture pytestmark names

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits"),
    pytest.mark.usefixtures("usual_umask"),
]

KEY = "sk-glassbox-secret-7f3a9c"
WRONG_KEY = "sk-wrong-secret-0042aa"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _folders(paths: Paths) -> tuple[Path, ...]:
    return (paths.data, paths.cache, paths.config, paths.logs, paths.models, paths.knowledge)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ----------------------------------------------------------------------------- folders


def test_ensure_creates_every_folder_owner_only(home: Path) -> None:
    paths = Paths.resolve(home).ensure()
    modes = {str(folder.relative_to(home)): file_mode(folder) for folder in _folders(paths)}
    assert modes == {
        "data": 0o700,
        "cache": 0o700,
        "config": 0o700,
        "logs": 0o700,
        "data/models": 0o700,
        "data/knowledge": 0o700,
    }


def test_ensure_makes_loose_folders_owner_only_once_and_says_so(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = Paths.resolve(home)
    for folder in _folders(paths):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)  # as an older Glassbox left them
    with caplog.at_level(logging.WARNING):
        paths.ensure()
    assert {file_mode(folder) for folder in _folders(paths)} == {0o700}
    said = _warnings(caplog)
    for folder in _folders(paths):
        assert f"{folder}: other users could read it (mode 755); made it owner-only (700)" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        paths.ensure()
    assert _warnings(caplog) == []  # once: nothing left to change, nothing to say


# ----------------------------------------------------------------------------- settings


def test_settings_file_is_owner_only_even_without_a_key(home: Path) -> None:
    paths = Paths.resolve(home).ensure()
    save_settings(Settings(), paths.settings_file)
    assert file_mode(paths.settings_file) == 0o600
    save_settings(Settings(api_server_key=KEY), paths.settings_file)
    assert file_mode(paths.settings_file) == 0o600
    assert [p.name for p in paths.config.iterdir()] == ["settings.json"]  # no temporary file left


def test_copy_of_a_damaged_settings_file_is_owner_only(home: Path) -> None:
    paths = Paths.resolve(home).ensure()
    damaged = '{"api_server_key": "' + KEY + '", "n_ctx": "not a number"'  # cut short: not JSON
    paths.settings_file.write_text(damaged)
    older = paths.config / "settings.json.bad"  # the one copy older versions kept
    older.write_text("an older damaged copy")
    older.chmod(0o644)
    loaded = load_settings(paths.settings_file)
    [backup] = paths.config.glob("settings.json.*.bad")
    assert loaded.warning is not None and str(backup) in loaded.warning
    assert KEY not in loaded.warning
    assert backup.read_text() == damaged
    assert older.read_text() == "an older damaged copy"
    assert file_mode(backup) == file_mode(older) == 0o600
    assert file_mode(paths.settings_file) == 0o600


def test_loose_settings_and_backup_are_made_owner_only_when_read(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = Paths.resolve(home).ensure()
    paths.settings_file.write_text(json.dumps({"schema_version": 1, "api_server_key": KEY}))
    backup = paths.config / "settings.json.20260101-120000.bad"
    backup.write_text(json.dumps({"api_server_key": KEY}))
    for path in (paths.settings_file, backup):
        path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert load_settings(paths.settings_file).settings.api_server_key == KEY
    assert (file_mode(paths.settings_file), file_mode(backup)) == (0o600, 0o600)
    said = _warnings(caplog)
    assert f"{paths.settings_file}: other users could read it (mode 644); made it owner-only (600)" in said
    assert f"{backup}: other users could read it (mode 644); made it owner-only (600)" in said


# ----------------------------------------------------------------------------- endpoints


def test_endpoints_file_is_owner_only_and_an_older_loose_one_is_fixed(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = Paths.resolve(home).ensure()
    file = paths.config / "endpoints.json"
    EndpointStore(file).add("http://10.1.2.3:8080", name="lab", api_key=KEY)
    assert file_mode(file) == 0o600
    file.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert EndpointStore(file).get("lab").api_key == KEY
    assert file_mode(file) == 0o600
    assert f"{file}: other users could read it (mode 644); made it owner-only (600)" in _warnings(caplog)


# ----------------------------------------------------------------------------- keys and logs


@pytest.fixture
def log_file(home: Path) -> Iterator[Path]:
    """Everything logged, at every level, goes to a file in the logs folder while the test runs."""
    paths = Paths.resolve(home).ensure()
    file = paths.logs / "glassbox.log"
    handler = logging.FileHandler(file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield file
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()


def test_api_keys_never_reach_the_log_files(home: Path, log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = Paths.resolve(home)
    handle = start_server(paths, port=0, api_key=KEY, backend=ScriptedBackend())
    try:
        # The CLI with a key: a refused one, an accepted one, then the saved one used again.
        assert main(["endpoints", "--home", str(home), "add", handle.url, "--api-key", WRONG_KEY]) == 1
        assert main(["endpoints", "--home", str(home), "add", handle.url, "--api-key", KEY, "--name", "me"]) == 0
        assert main(["endpoints", "--home", str(home), "models", "me", "--json"]) == 0
        assert main(["endpoints", "--home", str(home), "list"]) == 0
        # The server with a key: a turn with it, and a request with a wrong one.
        client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key=KEY, max_retries=0, timeout=30)
        reply = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hello"}])
        assert reply.choices[0].message.content == "hello"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{handle.url}/v1", api_key=WRONG_KEY, max_retries=0, timeout=30).models.list()
    finally:
        handle.stop()
    printed = capsys.readouterr()
    logged = {p: p.read_text(encoding="utf-8", errors="replace") for p in paths.logs.rglob("*") if p.is_file()}
    assert log_file in logged and "HTTP Request" in logged[log_file]  # the run was logged, requests and all
    for text in (*logged.values(), printed.out, printed.err):
        assert KEY not in text
        assert WRONG_KEY not in text
    assert KEY in (paths.config / "endpoints.json").read_text()  # it was used and saved, just never logged
