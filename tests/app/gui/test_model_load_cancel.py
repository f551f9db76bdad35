"""Load while a model loads (issue 28, minor): the button is Cancel, and what happened is said; an
older load's answer never speaks for a newer one (the trial saw "Loaded … in 6.5 s" beside "No
model loaded")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, start_window

from app.gui.workers.chat_state import ModelState
from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


class SlowLoads:
    """Sessions whose load of ``slow.gguf`` waits for Cancel (or for ``release``, ignoring Cancel
    when ``stubborn``): a load in progress, as a big model's is."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.stubborn = False

    def __call__(self, request: Any, bandwidth: float | None) -> Any:
        owner = self

        class Session(FakeSession):
            def load(self, cancel: threading.Event | None = None) -> Any:
                if Path(self.request.model_path).name == "slow.gguf":
                    owner.started.set()
                    while not owner.release.wait(0.02):
                        if cancel is not None and cancel.is_set() and not owner.stubborn:
                            from engine.errors import Cancelled

                            raise Cancelled("the load was cancelled")
                return super().load(cancel)

        return Session(request, bandwidth)


@pytest.fixture
def models(paths: Paths, fake_model: Path) -> tuple[Path, Path]:
    slow = paths.models / "slow.gguf"
    slow.write_bytes(fake_model.read_bytes())
    return fake_model, slow


def test_load_is_cancel_while_a_model_loads_and_says_what_happened(
    qtbot: Any, paths: Paths, models: tuple[Path, Path]
) -> None:
    fast, slow = models
    loads = SlowLoads()
    w = start_window(qtbot, paths, make_session=loads, model=fast)
    try:
        button = w.header.model_bar.load_button
        width = button.width()
        w.model_control.load_model(slow)
        qtbot.waitUntil(loads.started.is_set, timeout=5000)
        assert w.chat.model_state is ModelState.LOADING
        assert button.text() == "Cancel" and "slow" in button.toolTip()
        assert button.width() == width  # Load, Eject and Cancel take the same room
        messages: list[str] = []
        w.statusBar().messageChanged.connect(messages.append)
        button.click()
        qtbot.waitUntil(lambda: w.chat.model_state is ModelState.NONE, timeout=5000)
        assert button.text() == "Load"
        assert any("Loading slow was cancelled" in m for m in messages), messages
        assert "cancelled" in w.composer.state_label.text() and "press Load" in w.composer.state_label.text()
        assert not any(m.startswith("Loaded") for m in messages)
    finally:
        loads.release.set()
        w.shutdown()


def test_a_cancel_that_comes_too_late_still_leaves_no_model(
    qtbot: Any, paths: Paths, models: tuple[Path, Path]
) -> None:
    fast, slow = models
    loads = SlowLoads()
    loads.stubborn = True  # the load does not see Cancel and finishes
    w = start_window(qtbot, paths, make_session=loads, model=fast)
    try:
        w.model_control.load_model(slow)
        qtbot.waitUntil(loads.started.is_set, timeout=5000)
        w.header.model_bar.load_button.click()  # Cancel
        loads.release.set()
        qtbot.waitUntil(lambda: w.chat.model_state is ModelState.NONE and not w.chat.busy, timeout=5000)
        slow_session = next(s for s in w.sessions if Path(s.request.model_path) == slow)
        qtbot.waitUntil(lambda: slow_session.closed, timeout=5000)  # the late model was closed again
        assert w.chat.loaded is None
    finally:
        loads.release.set()
        w.shutdown()


@pytest.mark.parametrize("stubborn", [False, True], ids=["the older load is cancelled", "it finishes anyway"])
def test_an_older_loads_answer_never_speaks_for_a_newer_one(
    qtbot: Any, paths: Paths, models: tuple[Path, Path], stubborn: bool
) -> None:
    fast, slow = models
    loads = SlowLoads()
    loads.stubborn = stubborn
    w = start_window(qtbot, paths, make_session=loads, model=fast)
    try:
        w.model_control.load_model(slow)
        qtbot.waitUntil(loads.started.is_set, timeout=5000)
        states: list[ModelState] = []
        w.chat.model_state_changed.connect(lambda state, _detail: states.append(state))
        w.model_control.load_model(fast)  # the user picked another model meanwhile
        loads.release.set()
        qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=5000)
        slow_session = next(s for s in w.sessions if Path(s.request.model_path) == slow)
        qtbot.waitUntil(lambda: slow_session.closed, timeout=5000)  # the worker closed it for the newer load
        assert w.chat.loaded is not None and w.chat.loaded.path == fast
        assert states.count(ModelState.LOADED) == 1 and ModelState.NONE not in states  # no "No model loaded"
        assert w.header.model_status.text() == "● Loaded"
    finally:
        loads.release.set()
        w.shutdown()
