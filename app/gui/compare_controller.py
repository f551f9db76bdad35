"""The compare controller: the inspector's "Compare with base" for the open chat's last reply
(``app.gui.workers.chat_compare``), enabled only while the chat has a LoRA adapter applied and a
reply to compare, and the comparison shown in the Tokens tab when it comes back. Every collaborator
is given in the constructor; the main window only builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot

if TYPE_CHECKING:
    from PySide6.QtWidgets import QWidget

    from app.gui.inspector import InspectorPanel
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.chat_state import TurnContext
    from app.gui.workers.history_reads import DisplayMessage
    from app.gui.workers.llm_requests import CompareOutcome


class CompareController(QObject):
    """Drives the inspector's comparison with the base model.

    Args:
        chat: the chat adapter (its ``compare`` part runs the comparison).
        inspector: the inspector panel (its Compare and Stop buttons, its Tokens tab).
        turn_context: the open chat's next turn context (its sampling, system prompt, adapters).
        window: the parent.
    """

    def __init__(
        self,
        *,
        chat: ChatAdapter,
        inspector: InspectorPanel,
        turn_context: Callable[[], TurnContext],
        window: QWidget,
    ) -> None:
        super().__init__(window)
        self.chat = chat
        self.inspector = inspector
        self.turn_context = turn_context
        self._shown_reply: int | None = None  # the reply whose comparison the inspector shows
        inspector.compare_button.clicked.connect(self._on_compare_clicked)
        chat.conversation_opened.connect(self._on_chat_conversation_opened)
        inspector.compare_stop.clicked.connect(chat.compare.stop)
        chat.comparison_finished.connect(self._on_chat_comparison_finished)
        for signal in (
            chat.comparison_changed,
            chat.state_changed,
            chat.conversation_opened,
            chat.conversation_updated,
            chat.model_state_changed,
            chat.reply_finished,
        ):
            signal.connect(self.refresh)
        self.refresh()

    @Slot()
    def refresh(self, *_args: object) -> None:
        """Enables Compare when the open chat's last reply can be compared (its tooltip says why not)."""
        compare = self.chat.compare
        self.inspector.set_compare_state(compare.unavailable(self.turn_context), compare.running)

    @Slot()
    def _on_compare_clicked(self) -> None:
        self.chat.compare.start(self.turn_context())

    @Slot(object)
    def _on_chat_comparison_finished(self, outcome: CompareOutcome) -> None:
        if outcome.reply_id not in {m.id for m in self.chat.thread_messages}:
            return  # another chat (or branch) is open now: not its reply
        self.inspector.show_comparison(outcome.comparison, outcome.elapsed_ms)
        if outcome.comparison is not None:
            self._shown_reply = outcome.reply_id

    @Slot(object, object)
    def _on_chat_conversation_opened(self, _conversation: object, messages: list[DisplayMessage]) -> None:
        """Another chat or branch: the comparison of a reply it does not show goes."""
        if self._shown_reply is not None and self._shown_reply not in {m.id for m in messages}:
            self._shown_reply = None
            self.inspector.show_prompt_tokens()
