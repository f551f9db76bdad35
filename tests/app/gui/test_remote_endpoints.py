"""Remote endpoints and the local API server in the desktop app (fake sessions, offscreen Qt).

* the model picker lists a saved endpoint's models (``list_models`` monkeypatched), and choosing
  one routes a turn through a (fake) remote session;
* the "Add endpoint" dialog checks the server before saving, and says why it cannot;
* the "Local API server" setting starts ``glassbox serve`` over the loaded (fake) session on a free
  port and stops it again;
* the inspector shows a remote session's "estimated" context map.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window
from PySide6.QtCore import Qt

import engine.inference.remote
from app import compose
from app.gui.endpoints_dialog import AddEndpointDialog, list_remote_models
from app.gui.workers.chat_state import ChatState, ModelState
from app.gui.workers.llm_requests import LoadRequest
from app.gui.workers.model_routing import RoutingSessionFactory, model_label, parse_remote_model
from app.paths import Paths
from app.settings import Settings, load_settings, save_settings
from engine.errors import EngineError
from engine.history import HistoryStore
from engine.inference.endpoints import EndpointStore
from engine.inference.events import Stats
from engine.inference.remote import RemoteModel

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def fake_list_models(offered: dict[str, list[str]]) -> Any:
    """``list_models`` that answers from ``{url: [model ids]}`` and refuses unknown URLs."""

    def list_models(base_url: str, api_key: str | None = None, timeout: float = 15.0) -> list[RemoteModel]:
        if base_url not in offered:
            raise EngineError(f"cannot reach {base_url}: connection refused")
        return [RemoteModel(i, "owner", 2048) for i in offered[base_url]]

    return list_models


@pytest.fixture
def endpoints(paths: Paths) -> EndpointStore:
    store = EndpointStore(paths.config / "endpoints.json")
    store.add("http://10.9.8.7:8000", name="lab", api_key="sk-lab-secret-0001")
    return store


def test_remote_model_references_round_trip() -> None:
    model = compose.RemoteModel("lab", "org/Model-7B:q4")
    assert parse_remote_model(compose.model_key(model)) == ("lab", "org/Model-7B:q4")
    assert parse_remote_model(Path("glassbox-remote/lab/org%2FModel-7B%3Aq4")) == ("lab", "org/Model-7B:q4")  # older
    assert model_label(model) == "org/Model-7B:q4 · lab (remote)"
    assert parse_remote_model(Path("/models/fake-model.gguf")) is None


def test_routing_factory_builds_a_remote_session_for_a_saved_endpoint(endpoints: EndpointStore) -> None:
    made: list[tuple[Any, str]] = []
    local: list[Any] = []

    def remote(endpoint: Any, model_id: str, request: LoadRequest) -> Any:
        made.append((endpoint, model_id))
        return FakeSession(request, None)

    factory = RoutingSessionFactory(endpoints.path, lambda r, b: local.append(r) or FakeSession(r, b), remote)
    session = factory(LoadRequest(model_path=compose.RemoteModel("lab", "m-1")), None)
    assert made[0][0].url == "http://10.9.8.7:8000" and made[0][0].api_key == "sk-lab-secret-0001"
    assert made[0][1] == "m-1"
    assert factory.last_session is session and not local
    factory(LoadRequest(model_path=Path("/x/local.gguf")), None)
    assert len(local) == 1
    with pytest.raises(EngineError, match="gone: no saved endpoint"):
        factory(LoadRequest(model_path=compose.RemoteModel("gone", "m")), None)


def test_real_remote_session_is_built_from_the_endpoint(endpoints: EndpointStore) -> None:
    factory = RoutingSessionFactory(endpoints.path)
    session = factory(LoadRequest(model_path=compose.RemoteModel("lab", "m-1"), overflow_policy="refuse"), None)
    try:
        assert isinstance(session, engine.inference.remote.RemoteSession)
        assert session.model == "m-1" and session.base_url.startswith("http://10.9.8.7:8000")
        assert session.overflow_policy == "refuse"
    finally:
        session.close()


def test_list_remote_models_reports_unreachable_endpoints(
    endpoints: EndpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoints.add("http://10.0.0.1:1", name="down")
    monkeypatch.setattr(engine.inference.remote, "list_models", fake_list_models({"http://10.9.8.7:8000": ["a", "b"]}))
    found, problems = list_remote_models(endpoints.path)
    assert found == [compose.RemoteModel("lab", "a"), compose.RemoteModel("lab", "b")]
    assert len(problems) == 1 and problems[0].startswith("down: cannot reach")


@pytest.fixture
def window(
    qtbot: Any, paths: Paths, fake_model: Path, endpoints: EndpointStore, monkeypatch: pytest.MonkeyPatch
) -> Any:
    monkeypatch.setattr(
        engine.inference.remote, "list_models", fake_list_models({"http://10.9.8.7:8000": ["big-model"]})
    )
    remote_sessions: list[FakeSession] = []

    def remote(endpoint: Any, model_id: str, request: LoadRequest) -> FakeSession:
        session = FakeSession(request, None, reply=f"Remote {model_id} at {endpoint.url} says hi")
        remote_sessions.append(session)
        return session

    w = make_window(paths, lambda r, b: FakeSession(r, b), probe_bandwidth=False)
    w.chat.sessions.remote = remote
    w.remote_sessions = remote_sessions
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=5000)
    yield w
    w.shutdown()


def picker_entries(w: Any) -> list[str]:
    return [w.header.model_bar.picker.itemText(i) for i in range(w.header.model_bar.picker.count())]


def test_picker_lists_remote_models_and_a_turn_goes_through_the_remote_session(qtbot: Any, window: Any) -> None:
    qtbot.waitUntil(lambda: "big-model · lab (remote)" in picker_entries(window), timeout=5000)
    entries = picker_entries(window)
    assert entries[0] == "fake-model", "local models first"
    index = entries.index("big-model · lab (remote)")
    window.header.model_bar.picker.setCurrentIndex(index)
    window.header.model_bar.picker.activated.emit(index)
    qtbot.waitUntil(
        lambda: window.chat.model_state is ModelState.LOADED and window.chat.loaded.label.endswith("(remote)"),
        timeout=5000,
    )
    assert window.chat.model.session() is window.remote_sessions[0]
    window.composer.edit.setPlainText("Hello remote")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.chat.busy and window.chat.state is ChatState.IDLE, timeout=5000)
    qtbot.waitUntil(lambda: window.chat.thread_messages[-1].state != "pending", timeout=5000)
    assert window.remote_sessions[0].calls[0].user == "Hello remote"
    assert window.chat_view.cards[-1].text == "Remote big-model at http://10.9.8.7:8000 says hi"
    assert window.settings.last_model == compose.model_key(compose.RemoteModel("lab", "big-model"))
    assert compose.LEGACY_REMOTE_ROOT not in window.settings.last_model  # the old pseudo path is never written


def test_a_chat_remembers_its_remote_model_and_says_when_its_endpoint_no_longer_lists_it(
    qtbot: Any, window: Any, paths: Paths
) -> None:
    qtbot.waitUntil(lambda: "big-model · lab (remote)" in picker_entries(window), timeout=5000)
    big, old = compose.RemoteModel("lab", "big-model"), compose.RemoteModel("lab", "old-model")
    with HistoryStore(paths.history_db) as store:
        listed = store.create_conversation("Remote chat", model=compose.model_key(big))
        unlisted = store.create_conversation("Older remote chat", model=compose.model_key(old))
    offer = window.header.model_bar.chat_model
    window.chat.conversations.open(listed.id)
    qtbot.waitUntil(offer.isVisible, timeout=5000)
    assert offer.text.text() == "This chat used big-model · lab (remote)."
    assert window.chat.loaded.path != big and not window.remote_sessions  # nothing was asked of the server
    offer.load_button.click()
    qtbot.waitUntil(lambda: window.chat.loaded is not None and window.chat.loaded.path == big, timeout=5000)
    assert not offer.isVisible() and len(window.remote_sessions) == 1
    window.chat.conversations.open(unlisted.id)
    qtbot.waitUntil(offer.isVisible, timeout=5000)
    assert offer.text.text() == "This chat used old-model · lab (remote), its endpoint does not list it now."
    assert not offer.load_button.isVisible() and window.chat.loaded.path == big


def test_add_endpoint_dialog_checks_then_saves(qtbot: Any, paths: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.inference.remote, "list_models", fake_list_models({"http://127.0.0.1:9999": ["x", "y"]}))
    store_file = paths.config / "endpoints.json"
    dialog = AddEndpointDialog(store_file)
    qtbot.addWidget(dialog)
    dialog.url.setText("ftp://nowhere")
    dialog.check_and_save()
    assert "not an http:// or https:// URL" in dialog.status.text()
    dialog.url.setText("http://127.0.0.1:1234/v1")
    dialog.check_and_save()
    qtbot.waitUntil(lambda: "cannot reach" in dialog.status.text(), timeout=5000)
    assert not store_file.exists() or EndpointStore(store_file).all() == []
    dialog.url.setText("http://127.0.0.1:9999/v1/")
    dialog.name.setText("box")
    dialog.api_key.setText("sk-box-key-123456")
    with qtbot.waitSignal(dialog.accepted, timeout=5000):
        dialog.check_and_save()
    assert dialog.model_ids == ["x", "y"]
    saved = EndpointStore(store_file).get("box")
    assert (saved.url, saved.api_key) == ("http://127.0.0.1:9999", "sk-box-key-123456")


def get_json(url: str, key: str | None = None) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_server_setting_starts_and_stops_the_local_api(qtbot: Any, window: Any, paths: Paths) -> None:
    remote = window.api_server
    window.settings = window.settings.model_copy(
        update={"api_server_enabled": True, "api_server_port": 0, "api_server_key": "glassbox-test-key-1"}
    )
    remote.apply_settings()
    qtbot.waitUntil(lambda: remote.server_url is not None, timeout=10000)
    url = remote.server_url
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert url in remote.server_status.text()
    models = get_json(f"{url}/models", "glassbox-test-key-1")
    assert models["data"], models
    with pytest.raises(urllib.error.HTTPError) as refused:
        get_json(f"{url}/models", "wrong-key-wrong-key")
    assert refused.value.code == 401
    assert remote._server_backend is window.chat.model.session()

    window.settings = window.settings.model_copy(update={"api_server_enabled": False})
    remote.apply_settings()
    assert remote.server_url is None
    with pytest.raises(urllib.error.URLError):
        get_json(f"{url}/models", "glassbox-test-key-1")


def test_server_stops_when_the_window_closes(qtbot: Any, window: Any) -> None:
    window.settings = window.settings.model_copy(update={"api_server_enabled": True, "api_server_port": 0})
    window.api_server.apply_settings()
    qtbot.waitUntil(lambda: window.api_server.server_url is not None, timeout=10000)
    url = window.api_server.server_url
    assert get_json(f"{url}/models")["data"]
    window.shutdown()
    with pytest.raises(urllib.error.URLError):
        get_json(f"{url}/models")


def test_server_settings_round_trip_and_key_makes_file_private(paths: Paths) -> None:
    settings = Settings(api_server_enabled=True, api_server_port=0, api_server_key="k" * 20)
    save_settings(settings, paths.settings_file)
    assert paths.settings_file.stat().st_mode & 0o077 == 0
    loaded = load_settings(paths.settings_file).settings
    assert (loaded.api_server_enabled, loaded.api_server_port, loaded.api_server_key) == (True, 0, "k" * 20)


def test_inspector_shows_estimated_remote_budget(qtbot: Any, window: Any) -> None:
    budget = {"system": 5, "history": 0, "current": 25, "reserve": 512, "free": 1506, "estimated": 1}
    stats = Stats(n_ctx=2048, prompt_tokens=30, completion_tokens=5, context_used=35, budget=budget)
    window.inspector.set_stats(stats)
    assert set(window.inspector.context_bar.budget) <= {"system", "documents", "history", "current", "reserve", "free"}
    assert window.inspector.shown["context_used"].startswith("35 of 2048 tokens used (estimated")


def test_real_remote_session_end_to_end_in_the_window(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    from tests.engine.test_remote import ScriptedServer, delta, models_route, sse

    server = ScriptedServer(
        {
            "/v1/models": models_route("served-model"),
            "/v1/chat/completions": lambda body: (200, sse(delta("Over "), delta("the wire."), delta(finish="stop"))),
        }
    )
    try:
        EndpointStore(paths.config / "endpoints.json").add(server.url, name="box", api_key="sk-box-key-0042")
        w = make_window(paths, lambda r, b: FakeSession(r, b), probe_bandwidth=False)
        qtbot.addWidget(w)
        w.show()
        w.start()
        qtbot.waitUntil(lambda: "served-model · box (remote)" in picker_entries(w), timeout=10000)
        qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=5000)
        index = picker_entries(w).index("served-model · box (remote)")
        w.header.model_bar.picker.setCurrentIndex(index)
        w.header.model_bar.picker.activated.emit(index)
        qtbot.waitUntil(lambda: w.chat.loaded is not None and w.chat.loaded.label.endswith("(remote)"), timeout=10000)
        w.composer.edit.setPlainText("Ping")
        qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
        qtbot.waitUntil(
            lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state == "complete", timeout=10000
        )
        assert w.chat_view.cards[-1].text == "Over the wire."
        body, headers = next((b, h) for p, b, h in server.requests if p == "/v1/chat/completions")
        assert body["model"] == "served-model" and body["messages"][-1]["content"] == "Ping"
        assert headers.get("Authorization") == "Bearer sk-box-key-0042"
        qtbot.waitUntil(lambda: "tokens used" in w.inspector.shown.get("context_used", ""), timeout=5000)
    finally:
        if "w" in locals():
            w.shutdown()
        server.close()


def test_server_follows_the_loaded_model(qtbot: Any, window: Any) -> None:
    remote = window.api_server
    window.settings = window.settings.model_copy(update={"api_server_enabled": True, "api_server_port": 0})
    remote.apply_settings()
    qtbot.waitUntil(lambda: remote.server_url is not None, timeout=10000)
    first = remote.server
    qtbot.waitUntil(lambda: "big-model · lab (remote)" in picker_entries(window), timeout=5000)
    window.model_control.load_model(compose.RemoteModel("lab", "big-model"))
    qtbot.waitUntil(
        lambda: bool(window.remote_sessions) and remote._server_backend is window.remote_sessions[0], timeout=10000
    )
    assert remote.server is not first
    with pytest.raises(urllib.error.URLError):
        get_json(f"{first.url}/v1/models")
    assert get_json(f"{remote.server_url}/models")["data"]
    window.chat.model.unload()
    qtbot.waitUntil(lambda: remote.server is None, timeout=5000)
    assert remote.server_status.text() == "API server: waiting for a model"


def test_settings_dialog_edits_the_server_section(qtbot: Any) -> None:
    from app.gui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(Settings(), server_url="http://127.0.0.1:8123/v1")
    qtbot.addWidget(dialog)
    assert dialog.server_url.text() == "Running at http://127.0.0.1:8123/v1"
    assert not dialog.server_enabled.isChecked()
    dialog.server_enabled.setChecked(True)
    dialog.server_port.setValue(9001)
    dialog.server_key.setText("  secret-key-0001 ")
    result = dialog.result_settings()
    assert (result.api_server_enabled, result.api_server_port, result.api_server_key) == (True, 9001, "secret-key-0001")
    dialog.server_key.setText("")
    assert dialog.result_settings().api_server_key is None
