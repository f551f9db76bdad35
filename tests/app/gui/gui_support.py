"""GUI test helpers shared by several test files: a fake engine session (llm's MockModel style)
and the main window factory. Imported by name (``from gui_support import ...``): test files must
not import ``conftest``, which is ambiguous when several folders have one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app.paths import Paths
from app.settings import Settings
from engine.inference.events import Finished, PrefillProgress, Stats, Token
from engine.inference.runtime import ModelInfo
from engine.inference.session import PromptView
from tests.fake_backend import FakeBackend, StreamCall, fake_model_info


class FakeSession(FakeBackend):
    """Streams a canned reply word by word; honours cancel; records what it was asked
    (``calls``: each ``stream``'s arguments, ``tests.fake_backend.StreamCall``).

    Args:
        request: the LoadRequest it was made for (its ``n_ctx`` is the window).
        bandwidth: the machine's bandwidth the worker passed.
        reply: the text to stream (split on spaces).
        delay_s: pause between tokens.
    """

    def __init__(self, request: Any, bandwidth: float | None, reply: str = "", delay_s: float = 0.0) -> None:
        super().__init__(n_ctx=request.n_ctx)
        self.request = request
        self.bandwidth = bandwidth
        self.reply = reply or "Hello from the fake model. It streams a few words."
        self.delay_s = delay_s

    @property
    def info(self) -> ModelInfo:
        return fake_model_info(self.request.n_ctx, path=str(self.request.model_path))

    def script(self, call: StreamCall) -> Iterator[Any]:
        yield PrefillProgress(5, 10)
        yield PrefillProgress(10, 10)
        words = self.reply.split(" ")
        sent: list[str] = []
        reason = "stop"
        for i, word in enumerate(words):
            if call.cancelled:
                reason = "cancelled"
                break
            piece = word if i == 0 else " " + word
            sent.append(piece)
            yield Token(piece, i)
            if self.delay_s:
                time.sleep(self.delay_s)
        stats = Stats(
            n_ctx=self.request.n_ctx,
            prompt_tokens=42,
            cached_tokens=7,
            completion_tokens=len(sent),
            context_used=42 + len(sent),
            evicted_messages=0,
            ttft_ms=12.5,
            prefill_ms=20.0,
            decode_ms=100.0,
            prefill_tps=1750.0,
            decode_tps=88.25,
            kv_cache_bytes=4 * 2**20,
            kv_used_bytes=2**20,
            model_bytes=123_456_789,
            bandwidth_gbps=11.0,
            machine_bandwidth_gbps=20.0,
            template="fallback:chatml",
            budget={
                "system": 10,
                "documents": 0,
                "history": 20,
                "current": 12,
                "reserve": 512,
                "free": self.request.n_ctx - 554,
            },
        )
        yield stats
        yield Finished(reason=reason, stats=stats, text="".join(sent))  # type: ignore[arg-type]

    def prompt_view(self) -> PromptView:
        return PromptView([1, 2, 3], ["<bos>", "Hello", " world"])


def make_window(paths: Paths, factory: Any = None, settings: Settings | None = None, **kwargs: Any) -> Any:
    from app.gui.main_window import MainWindow

    return MainWindow(paths, settings or Settings(theme="light"), session_factory=factory, **kwargs)


def start_window(
    qtbot: Any,
    paths: Paths,
    make_session: Callable[[Any, float | None], Any] = FakeSession,
    model: Path | None = None,
    settings: Settings | None = None,
) -> Any:
    """Builds, shows and starts a main window on ``paths`` and waits until its model is loaded.

    Args:
        qtbot: the test's qtbot (it closes the window at the end).
        paths: the home.
        make_session: called with ``(request, bandwidth)`` for each engine session; every session
            made is kept in order in the window's ``sessions``.
        model: loaded when the window did not load a model by itself at start.
        settings: the window's settings (default: light theme, the rest default).

    Returns:
        The window; the test calls ``shutdown()`` when done.
    """
    from app.gui.workers.chat_state import ModelState

    sessions: list[Any] = []

    def factory(request: Any, bandwidth: float | None) -> Any:
        session = make_session(request, bandwidth)
        sessions.append(session)
        return session

    w = make_window(paths, factory, settings, probe_bandwidth=False)
    w.sessions = sessions
    qtbot.addWidget(w)
    w.show()
    w.start()
    if model is not None and w.chat.model_state is not ModelState.LOADED:
        w.model_control.load_model(model)
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=30000)
    return w


def send(qtbot: Any, w: Any, text: str, timeout_ms: int = 5000) -> None:
    """Types ``text`` into the composer, presses Return, and waits until the turn has ended and its
    reply is no longer pending."""
    from PySide6.QtCore import Qt

    from app.gui.workers.chat_state import ChatState

    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=timeout_ms)
    qtbot.waitUntil(
        lambda: w.chat.thread_messages and w.chat.thread_messages[-1].state != "pending", timeout=timeout_ms
    )


def transfer_buttons(panel: Any, row: int = 0) -> Any:
    """The Pause/Cancel/Resume/Discard buttons of row ``row`` of the Models page's download list."""
    from app.gui.discover_panel import TransferButtonsWidget

    widget = panel.queue.cellWidget(row, 4)
    assert isinstance(widget, TransferButtonsWidget)
    return widget
