"""A chat turn, from the saved question to the saved reply (ARCHITECTURE.md, "a chat turn").

1. The question and a pending reply row are saved first (:mod:`app.gui.workers.chat_send`).
2. With knowledge bases attached, the knowledge worker searches on its own thread
   (:class:`~app.gui.workers.chat_retrieval.PassageRetriever`); Stop meanwhile ends the turn.
3. The request goes to the LLM worker with the passages as data; the engine's documents band keeps
   the best that fit, and the outcome says how many of the lowest-ranked it dropped.
4. Coalesced text streams back, is shown and checkpointed; on finish, stop or error the reply is
   saved (partial if stopped) with its stats and the sources of the passages it was given.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import QObject, Slot

from app.agent_history import model_history
from app.gui.tasks import describe_error
from app.gui.workers.chat_reply import ReplyTurn, final_reply
from app.gui.workers.chat_retrieval import Retrieved, model_searches
from app.gui.workers.chat_send import (
    ProgressBox,
    Question,
    Saved,
    report_send_failure,
    save_question,
    save_regeneration,
)
from app.gui.workers.chat_state import ChatState, TurnContext
from app.gui.workers.history_disk import is_unreadable
from app.gui.workers.llm_requests import GenerateRequest, GenerationOutcome
from app.knowledge_glue import kept_sources
from app.turn import TurnRequest

if TYPE_CHECKING:
    from app.gui.workers.chat_adapter import ChatAdapter
    from engine.inference.events import Stats
    from engine.media import Media


class TurnRunner(QObject):
    """Runs the chat's turns, one at a time.

    Args:
        chat: the adapter (history, worker commands, the open conversation, signals).
    """

    def __init__(self, chat: ChatAdapter) -> None:
        super().__init__(chat)
        self._chat = chat
        self.turn: ReplyTurn | None = None
        self._ids = itertools.count(1)

    def current(self, request_id: int) -> ReplyTurn | None:
        """The running turn when ``request_id`` is its request (a late signal gets None)."""
        turn = self.turn
        return turn if turn is not None and turn.request.request_id == request_id else None

    # ------------------------------------------------------------------ starting
    def send(self, text: str, context: TurnContext, edit_of: int | None = None, media: tuple[Media, ...] = ()) -> bool:
        """Saves the user message (with its images) and a pending reply, then generates (False:
        cannot start)."""
        chat = self._chat
        text = text.strip()
        if (not text and not media) or self.turn is not None or chat.loaded is None:
            return False
        parent: int | Literal["leaf"] | None = "leaf"
        if edit_of is not None:
            edited = next((m for m in chat.thread_messages if m.id == edit_of), None)
            parent = edited.parent_id if edited is not None else "leaf"
        question = Question(text, edit_of, chat.conversation, chat.loaded.label, parent, media)
        box = ProgressBox()

        def failed(exc: BaseException) -> None:
            self._end_placeholder()
            report_send_failure(chat, exc, question, box.latest)

        self._begin_placeholder()
        size = len(text.encode("utf-8", "replace")) + sum(len(m.data) for m in media)
        chat.history.call(save_question(question, box), lambda r: self._start(r, context), failed, size_hint=size)
        return True

    def regenerate(self, reply_id: int, context: TurnContext) -> bool:
        """Generates a new sibling of an assistant reply (the old one stays reachable)."""
        chat = self._chat
        if self.turn is not None or chat.loaded is None or chat.conversation is None:
            return False
        reply = next((m for m in chat.thread_messages if m.id == reply_id), None)
        if reply is None or reply.role != "assistant" or reply.parent_id is None:
            return False
        save = save_regeneration(chat.conversation.id, reply.parent_id, chat.loaded.label)
        self._begin_placeholder()
        chat.history.call(save, lambda r: self._start(r, context), self._on_regeneration_save_failed)
        return True

    def _begin_placeholder(self) -> None:
        # Busy at once, so a double Enter cannot start two turns while the save is queued.
        self.turn = ReplyTurn(GenerateRequest(0, TurnRequest((), "", None)), -1, -1, time.perf_counter())
        self._chat.set_state(ChatState.PROCESSING_PROMPT)

    def _end_placeholder(self) -> None:
        self.turn = None
        self._chat.set_state(ChatState.IDLE)

    def _on_regeneration_save_failed(self, exc: BaseException) -> None:
        self._end_placeholder()
        self._chat.error_occurred.emit(f"Could not save the message: {describe_error(exc)}")
        if is_unreadable(exc):
            self._chat.history_unreadable.emit(describe_error(exc))

    def _start(self, saved: Saved, context: TurnContext) -> None:
        chat = self._chat
        conversation, reply_id, messages = saved
        placeholder = self.turn
        chat.show_thread(conversation, messages)
        chat.refresh_conversations()
        if placeholder is None:  # stopped before the save came back: keep the question, mark the reply
            chat.replies.cancel_unstarted(conversation.id, reply_id)
            return
        # messages ends with [..., user, pending reply]; history is everything before the user turn.
        ask = TurnRequest(
            # A reply made with tools: its calls and results too; a user message its images.
            history=model_history(messages[:-2], lambda row: getattr(row, "media", ())),
            user=messages[-2].content,
            media=messages[-2].media,
            params=context.params,
            system=context.system,
            cache_key=(str(conversation.id), str(reply_id)),  # the KV cache saved with the chat
            thinking=context.thinking,
            thinking_budget=context.thinking_budget,
            cancel=placeholder.request.cancel,
        )
        request = GenerateRequest(next(self._ids), ask, context.tools)
        turn = ReplyTurn(request, conversation.id, reply_id, time.perf_counter())
        self.turn = turn
        chat.reply_started.emit(reply_id)
        if request.cancel.is_set():
            self.finish("cancelled", "", None)
        elif context.knowledge_bases and chat.retriever_factory is not None:
            self._retrieve(turn, context)
        else:
            self._submit(turn)

    # ------------------------------------------------------------------ retrieval (knowledge thread)
    def _retrieve(self, turn: ReplyTurn, context: TurnContext) -> None:
        chat = self._chat
        assert chat.retriever_factory is not None
        turn.retrieving = True
        chat.set_state(ChatState.RETRIEVING)
        retriever = chat.retriever_factory(context.knowledge_bases)
        retriever.retrieve(
            turn.request.turn.user or "",
            lambda found: self._on_retrieved(turn, found),
            lambda exc: self._on_retrieval_failed(turn, exc),
            skip=model_searches(context.tools),
        )

    def _on_retrieved(self, turn: ReplyTurn, found: Retrieved) -> None:
        if self.turn is not turn or not turn.retrieving:
            return  # stopped meanwhile: the turn already ended
        if found.passages is not None:
            turn.sources = list(found.passages.sources)
            turn.request = replace(turn.request, turn=replace(turn.request.turn, passages=found.passages))
            self._chat.sources_found.emit(list(found.passages.sources))
        self._submit(turn)

    def _on_retrieval_failed(self, turn: ReplyTurn, exc: BaseException) -> None:
        if self.turn is not turn or not turn.retrieving:
            return
        self._chat.error_occurred.emit(f"Documents not used: {describe_error(exc)}")
        self._submit(turn)

    def _submit(self, turn: ReplyTurn) -> None:
        turn.retrieving = False
        if turn.request.cancel.is_set():
            self.finish("cancelled", "", None)
            return
        self._chat.set_state(ChatState.PROCESSING_PROMPT)
        self._chat.generate_requested.emit(turn.request)

    def stop(self) -> None:
        """Stops the running turn: sets its cancel event directly (CONTRIBUTING.md rule 9)."""
        chat, turn = self._chat, self.turn
        if turn is None:
            return
        turn.request.cancel.set()
        if turn.reply_id < 0:
            self._end_placeholder()  # the save is still queued; _start sees the stop
        elif turn.retrieving:
            self.finish("cancelled", "", None)  # the LLM worker was never asked: end it here
        elif chat.state is not ChatState.IDLE:
            chat.set_state(ChatState.CANCELLING)

    # ------------------------------------------------------------------ the worker's signals
    @Slot(int, int, int)
    def on_prefill(self, request_id: int, done: int, total: int) -> None:
        """Prompt evaluation progress."""
        if self.current(request_id) is not None:
            self._chat.prefill_progressed.emit(done, total)

    @Slot(int, str, int)
    def on_tokens(self, request_id: int, text: str, count: int) -> None:
        """Coalesced text of the running reply: shown, and checkpointed every second."""
        turn = self.current(request_id)
        if turn is None:
            return
        if turn.first_token_at is None:
            turn.first_token_at = time.perf_counter()
            if self._chat.state is ChatState.PROCESSING_PROMPT:
                self._chat.set_state(ChatState.GENERATING)
        turn.text.append(text)
        turn.tokens += count
        self._chat.reply_delta.emit(text, count)
        self._chat.replies.tick(turn)

    @Slot(int, int)
    def on_call_progress(self, request_id: int, tokens: int) -> None:
        """The model writes a tool call (``tokens`` so far; 0: it stopped writing one)."""
        turn = self.current(request_id)
        if turn is not None:
            turn.call_tokens = tokens
            self._chat.call_progressed.emit(tokens)

    @Slot(object)
    def on_finished(self, outcome: GenerationOutcome) -> None:
        """The generation ended (stop, length or cancelled): save the reply with its stats."""
        turn = self.current(outcome.request_id)
        if turn is None:
            return
        chat = self._chat
        chat.last_stats = outcome.stats
        # With the reason, as a saved reply keeps it: the inspector says a reply stopped in prefill was.
        chat.stats_updated.emit({**outcome.stats.to_dict(), "finish_reason": outcome.reason})
        turn.agent.reasoning_done = outcome.reasoning
        dropped = outcome.stats.documents_dropped
        if turn.request.turn.passages is not None:
            turn.sources = kept_sources(turn.request.turn.passages, outcome.stats)
        if dropped:
            chat.notice_posted.emit(
                f"{dropped} of the passages found did not fit the context window and were left out."
            )
        self.finish(outcome.reason, outcome.text, outcome.stats)
        chat.reply_finished.emit(outcome)

    @Slot(int, object)
    def on_failed(self, request_id: int, exc: BaseException) -> None:
        """The generation failed: the text so far is saved, the error shown."""
        turn = self.current(request_id)
        if turn is None:
            return
        from engine.errors import EngineCrashed

        message = describe_error(exc)
        self.finish("error", turn.reply_text, None, error=message)
        if isinstance(exc, EngineCrashed) and not exc.will_repeat:
            self._chat.error_occurred.emit(f"{message}. Send again to restart the model.")
        else:
            self._chat.error_occurred.emit(message)

    # ------------------------------------------------------------------ the end
    def finish(self, reason: str, text: str, stats: Stats | None, error: str | None = None) -> None:
        """Ends the running turn and saves its reply."""
        turn = self.turn
        assert turn is not None
        self.turn = None
        turn.retrieving = False
        self._chat.replies.finish(turn, final_reply(turn, reason, text, stats, error))
        self._chat.set_state(ChatState.IDLE)

    def finish_at_shutdown(self) -> None:
        """A turn still open once the worker stopped is saved as partial."""
        if self.turn is not None and self.turn.reply_id >= 0:
            self.finish("cancelled", self.turn.reply_text, None)
        self.turn = None
