"""When the inspector's Compare with base may run (``app.gui.workers.chat_compare``): a local model,
an adapter above scale 0, no tools or documents, no reply running, a finished reply to a question;
each refusal says why in one line, and a refused start asks nothing of the worker."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.gui.workers.chat_compare import BaseComparer
from app.gui.workers.chat_state import ChatSignals, TurnContext
from app.gui.workers.history_reads import DisplayMessage
from engine.inference.runtime import GenerationParams

pytestmark = pytest.mark.gui


def _message(id_: int, role: str, state: str = "complete") -> DisplayMessage:
    return DisplayMessage(id_, id_ - 1 or None, role, f"{role} {id_}", state, None, None, None, None, (id_,))


def test_compare_is_offered_only_for_a_finished_reply_with_an_adapter_applied(qtbot: Any) -> None:
    chat = ChatSignals()
    comparer = BaseComparer(chat)
    sent: list[object] = []
    chat.compare_requested.connect(sent.append)
    adapted = TurnContext(system=None, params=GenerationParams(), adapters=((Path("a.gguf"), 1.0),))

    assert comparer.unavailable(adapted) == "Needs a local model loaded"
    chat.loaded = SimpleNamespace(info=SimpleNamespace(kind="remote"))  # type: ignore[assignment]
    assert comparer.unavailable(adapted) == "Needs a local model loaded"
    chat.loaded = SimpleNamespace(info=SimpleNamespace(kind="local"))  # type: ignore[assignment]
    assert comparer.unavailable(adapted) == "No reply to compare yet"
    chat.thread_messages = [_message(1, "user"), _message(2, "assistant", "pending")]
    assert comparer.unavailable(adapted) == "No reply to compare yet"
    chat.thread_messages = [_message(1, "user"), _message(2, "assistant")]
    at_zero = TurnContext(system=None, params=GenerationParams(), adapters=((Path("a.gguf"), 0.0),))
    assert "no LoRA adapter applied" in (comparer.unavailable(at_zero) or "")
    with_kb = TurnContext(system=None, params=GenerationParams(), knowledge_bases=("notes",), adapters=adapted.adapters)
    assert "without tools or documents" in (comparer.unavailable(with_kb) or "")
    chat.busy = True
    assert comparer.unavailable(adapted) == "Wait for the reply to finish"
    assert not comparer.start(adapted) and not sent
    chat.busy = False

    assert comparer.unavailable(adapted) is None
    assert comparer.start(adapted)
    (request,) = sent
    assert request.reply_id == 2 and request.turn.user == "user 1" and request.turn.history == ()  # type: ignore[attr-defined]
    assert comparer.running and comparer.unavailable(adapted) == "A comparison is running"
    comparer.stop()
    assert request.cancel.is_set()  # type: ignore[attr-defined]
