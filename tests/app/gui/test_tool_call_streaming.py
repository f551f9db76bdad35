"""A reply that starts like a tool call (issue 28, major 3): while the model writes the call, the
window says "Writing a tool call… N tokens" with live decode numbers, never a stale "Reading the
prompt… N/N tokens"; once the reply turns out to be text, the text shows at once.

The engine's side (the parser releasing the text, ``CallProgress`` for each held token) is tested
in ``tests/engine/test_call_prefix.py``; here a session streams those events into the real window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, start_window

from app.gui.workers.chat_state import ChatState
from app.gui.workers.llm_worker import Coalescer
from app.paths import Paths
from engine.inference.events import CallProgress, Finished, PrefillProgress, Token, ToolCall
from tests.fake_backend import StreamCall

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

HELD = 24


class HeldCallSession(FakeSession):
    """Reads the prompt, writes HELD tokens of what looks like a call, waits for the test, then the
    text turns out to be no call: it streams."""

    go = threading.Event()

    def script(self, call: StreamCall) -> Iterator[Any]:
        yield PrefillProgress(17, 17)
        for n in range(1, HELD + 1):
            yield CallProgress(n)
            time.sleep(0.03)
        self.go.wait(10)
        text = '{"name": "add", "arguments": {"a": 1}}, "required": ["a"]'
        yield Token(text, 0)
        yield Token(" and so on.", 1)
        stats = self._stats(HELD + 2)
        yield stats
        yield Finished(reason="stop", stats=stats, text=text + " and so on.")

    def _stats(self, completion: int) -> Any:
        from engine.inference.events import Stats

        budget = {"system": 2, "history": 5, "current": 10, "reserve": 512, "free": self.request.n_ctx - 529}
        return Stats(n_ctx=self.request.n_ctx, prompt_tokens=17, completion_tokens=completion,
                     context_used=17 + completion, ttft_ms=10.0, decode_tps=40.0, template="fallback:chatml",
                     budget=budget)  # fmt: skip


def test_a_call_being_written_is_said_with_live_numbers_then_its_text_shows(
    qtbot: Any, paths: Paths, fake_model: Path
) -> None:
    HeldCallSession.go.clear()
    w = start_window(qtbot, paths, make_session=HeldCallSession)
    try:
        w.composer.edit.setPlainText("add one")
        w.composer.send_button.click()
        qtbot.waitUntil(lambda: w.composer.state_label.text().startswith("Writing a tool call…"), timeout=10000)
        assert "Reading the prompt" not in w.composer.state_label.text()

        def written() -> int:
            words = w.composer.state_label.text().split()
            return int(words[-2]) if words[-1].startswith("token") else 0

        # The count grows with the call (the last one or two may wait in the worker's 30 ms batch).
        qtbot.waitUntil(lambda: written() >= HELD - 2, timeout=10000)
        card = w.chat_view.cards[-1]
        qtbot.waitUntil(lambda: "Writing a tool call…" in card.body.text(), timeout=5000)  # the reply card says it too
        # The live numbers move while the call is written: a decode rate, the phase.
        qtbot.waitUntil(lambda: w.inspector.shown.get("phase", "").startswith("writing a tool call"), timeout=10000)
        assert w.inspector.metrics["decode_tps"].text().endswith("tok/s")
        assert w.chat.state is ChatState.GENERATING
        HeldCallSession.go.set()
        qtbot.waitUntil(lambda: not w.chat.busy, timeout=10000)
        assert '"required"' in w.chat_view.cards[-1].text
        assert "Writing a tool call" not in w.composer.state_label.text()
        assert "Writing a tool call" not in w.chat_view.cards[-1].body.text()
        # A call written (its tokens end with the ToolCall): the phase no longer says it is written.
        w.chat.call_progressed.emit(45)
        w.chat.call_progressed.emit(0)
        assert w.inspector.shown["phase"] == "held 45 tokens as a tool call"
    finally:
        HeldCallSession.go.set()
        w.shutdown()


def test_the_coalescer_counts_held_tokens_and_says_when_the_call_is_written() -> None:
    texts: list[tuple[str, int]] = []
    calls: list[int] = []
    stream = Coalescer(1, lambda _r, t, n: texts.append((t, n)), lambda _r, _t: None, lambda *_: None,
                       lambda _r, n: calls.append(n))  # fmt: skip
    for n in range(1, 4):
        stream.take(CallProgress(n))
    stream.flush()
    # Three tokens generated, no text yet, a call of three tokens (sent at most every 30 ms).
    assert {t for t, _ in texts} == {""} and sum(n for _, n in texts) == 3 and calls[-1] == 3
    stream.take(ToolCall("c1", "add", {}, "<tool_call>…</tool_call>"))
    stream.flush()
    assert calls[-1] == 0  # written
    stream.take(CallProgress(1))
    stream.take(Token("plain", 5))
    stream.flush()
    # The held token was text after all: no call is being written; every token was counted once.
    assert texts[-1][0] == "plain" and calls[-1] == 0 and sum(n for _, n in texts) == 5
