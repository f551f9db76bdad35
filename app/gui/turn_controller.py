"""The turn controller: what a chat turn shows while it runs and after.

It builds each turn's context (the chat's system prompt and sampling, speculative decoding, its
knowledge bases, tools and thinking), sends, regenerates, streams the reply into the transcript,
keeps the composer's state line and the inspector's numbers (live, or a chat's saved ones), and
shows the KV cache a loaded model allocated. Every collaborator is given in the constructor; the
main window only builds it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import shiboken6
from PySide6.QtCore import QObject, QTimer, Slot

from app.gui.attachments import cost_texts, remember
from app.gui.conversation_settings import conversation_adapters, conversation_sampling
from app.gui.reply_links import open_source
from app.gui.tasks import run_in_background
from app.gui.window_services import while_alive
from app.gui.workers.chat_state import ChatState, ModelState, TurnContext
from app.gui.workers.model_routing import parse_remote_model
from app.gui.workers.speculative import speculative_mode
from engine.media import MediaError

if TYPE_CHECKING:
    from PySide6.QtWidgets import QWidget

    from app.gui.chat_tools_menu import ChatToolsController
    from app.gui.chat_view import ChatView
    from app.gui.composer import Composer
    from app.gui.inspector import InspectorPanel
    from app.gui.sidebar import Sidebar
    from app.gui.window_services import Notices, SettingsStore
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.history_reads import DisplayMessage
    from app.gui.workers.llm_requests import LoadedModel
    from engine.history_schema import Conversation
    from engine.inference.projector import MediaInfo

log = logging.getLogger(__name__)

NOT_FIT = "This image does not fit the context window: remove it or start a new chat."
BUSY_STATES = (ChatState.PROCESSING_PROMPT, ChatState.GENERATING, ChatState.RETRIEVING, ChatState.CANCELLING)


class TurnController(QObject):
    """Sends turns and shows them: the transcript, the composer's state, the inspector.

    Args:
        chat: the chat adapter.
        chat_view: the transcript.
        composer: the composer (its send is connected here).
        inspector: the inspector panel.
        sidebar: the chat list (the open chat is marked in it).
        tools: the chat's Tools switch (its tools and thinking go with each turn).
        settings: the window's settings (sampling presets, the default system prompt).
        notices: the error banner and the status bar.
        window: the parent; its title names the open chat.
    """

    def __init__(
        self,
        *,
        chat: ChatAdapter,
        chat_view: ChatView,
        composer: Composer,
        inspector: InspectorPanel,
        sidebar: Sidebar,
        tools: ChatToolsController,
        settings: SettingsStore,
        notices: Notices,
        window: QWidget,
    ) -> None:
        super().__init__(window)
        self.chat = chat
        self.chat_view = chat_view
        self.composer = composer
        self.inspector = inspector
        self.sidebar = sidebar
        self.tools = tools
        self.settings = settings
        self.notices = notices
        self.window = window
        self._closed = False
        self._inspector_reply: int | None = None  # the reply whose numbers the inspector shows
        self._streaming_reply: int | None = None  # the reply receiving text (its sources go to its card)
        self._call_tokens = 0  # the tokens of the tool call the model is writing now (0: none)
        self._live_timer = QTimer(self)
        self._live_timer.setInterval(250)
        self._live_timer.timeout.connect(self._on_live_timer_timeout)
        self._wire()

    def _wire(self) -> None:
        chat = self.chat
        chat.state_changed.connect(self._on_chat_state_changed)
        chat.conversation_opened.connect(self._on_chat_conversation_opened)
        chat.reply_started.connect(self._on_chat_reply_started)
        chat.reply_delta.connect(self._on_chat_reply_delta)
        chat.prefill_progressed.connect(self._on_chat_prefill_progressed)
        chat.reply_finished.connect(self._on_chat_reply_finished)
        chat.stats_updated.connect(self.inspector.set_stats)
        chat.model_loaded.connect(self._on_chat_model_loaded)
        chat.prompt_view_updated.connect(self.inspector.set_prompt_view)
        chat.bandwidth_measured.connect(self.inspector.set_machine_bandwidth)
        chat.sources_found.connect(self._on_chat_sources_found)
        chat.loop_updated.connect(self._on_chat_loop_updated)
        chat.call_progressed.connect(self._on_chat_call_progressed)
        self.composer.send_requested.connect(self._on_composer_send_requested)
        self.composer.stop_requested.connect(chat.turns.stop)
        self.composer.attachments_changed.connect(self.measure_attachments)
        self.composer.attachment_failed.connect(self.notices.show_error)
        chat.media_measured.connect(self._on_chat_media_measured)
        chat.media_not_saved.connect(self._on_chat_media_not_saved)
        chat.model_loaded.connect(self.measure_attachments)
        self.chat_view.edit_requested.connect(self.composer.begin_edit)
        self.chat_view.edit_requested.connect(self._on_chat_view_edit_requested)
        self.chat_view.regenerate_requested.connect(self._on_chat_view_regenerate_requested)
        self.chat_view.branch_requested.connect(chat.conversations.select_branch)
        self.chat_view.source_activated.connect(self._on_chat_view_source_activated)

    def shutdown(self) -> None:
        """Stops the live numbers; later background answers are dropped."""
        self._closed = True
        self._live_timer.stop()

    def _alive(self) -> bool:
        return not self._closed and shiboken6.isValid(self.inspector)

    # ------------------------------------------------------------------ sending
    def turn_context(self) -> TurnContext:
        """What the next turn of the open chat is sent with (and the inspector's reply limit)."""
        # lazy: start-up (+128 ms)
        from engine.inference.runtime import GenerationParams

        settings = self.settings.current
        conv = self.chat.conversation
        conv_settings = dict(getattr(conv, "settings", None) or {})
        preset = conversation_sampling(settings, conv_settings)
        system = getattr(conv, "system_prompt", None)
        if system is None:
            system = settings.default_system_prompt or None
        params = GenerationParams(
            max_tokens=preset.max_tokens,
            temperature=preset.temperature,
            top_k=preset.top_k,
            top_p=preset.top_p,
            min_p=preset.min_p,
            repeat_penalty=preset.repeat_penalty,
            seed=preset.seed,
            speculative=speculative_mode(self.chat.loaded, settings),  # app/gui/workers/speculative.py
        )
        kbs = tuple(getattr(conv, "knowledge_bases", None) or ())
        self.inspector.set_reply_limit(params.max_tokens)
        tools, thinking, budget = self.tools.turn_options()
        return TurnContext(
            system=system,
            params=params,
            knowledge_bases=kbs,
            tools=tools,
            thinking=thinking,
            thinking_budget=budget,
            adapters=conversation_adapters(conv_settings),
        )

    @Slot(str, object)
    def _on_composer_send_requested(self, text: str, editing: int | None) -> None:
        media = self.composer.attachments.media
        if not self.chat.turns.send(text, self.turn_context(), edit_of=editing, media=media):
            self.notices.show_error("The model is not ready yet.")
            return
        self.composer.sent()

    # ------------------------------------------------------------------ attachments (app/gui/attachments.py)
    @Slot()
    def measure_attachments(self, *_args: object) -> None:
        """Asks the model what the composer's attachments cost (the chips say "…" meanwhile)."""
        media = self.composer.attachments.media
        self.composer.attachments.set_costs({})
        if not media:
            self.composer.set_attachment_block("")
            return
        self.chat.model.measure_media(media)

    @Slot(object)
    def _on_chat_media_measured(self, answer: object) -> None:
        media = self.composer.attachments.media
        loaded = self.chat.loaded
        if not media:
            return
        if loaded is None:
            self.composer.attachments.set_costs(
                {m.digest: ("no model", "load a model to count it", False) for m in media}
            )
            self.composer.set_attachment_block("")
            return
        if answer is None:  # a server counts them itself
            self.composer.attachments.set_costs(
                {m.digest: ("sent as is", "the server counts it", False) for m in media}
            )
            self.composer.set_attachment_block("")
            return
        problem = None
        infos: dict[str, MediaInfo] = {}
        if isinstance(answer, MediaError):
            problem = answer.reason
        elif isinstance(answer, BaseException):
            problem = str(answer)
        elif isinstance(answer, list):
            infos = {info.digest: info for info in answer}
            remember(tokens={digest: info.tokens for digest, info in infos.items()})
        costs = cost_texts(media, infos, problem, self._media_room(loaded))
        self.composer.attachments.set_costs(costs)
        if isinstance(answer, MediaError) and loaded.info.kind == "local" and loaded.info.projector is None:
            # Blind: the remedy in this window's terms (the engine's line names the CLI's).
            what = "images or audio" if any(m.kind == "audio" for m in media) else "images"
            self.composer.set_attachment_block(
                f"This model cannot see {what}: it has no projector (mmproj). Choose one in Models → Projector"
            )
        elif problem is not None:
            self.composer.set_attachment_block(problem[:1].upper() + problem[1:])
        elif any(text == "does not fit" for text, _tip, _bad in costs.values()):
            self.composer.set_attachment_block(
                "This image does not fit the context window: remove it or start a new chat."
            )
        else:
            self.composer.set_attachment_block("")

    def _media_room(self, loaded: LoadedModel) -> int | None:
        """The tokens the window has for images however much history is dropped: the window less
        the reply's reserve and what is pinned (the system prompt, documents, tools) at the last turn."""
        n_ctx = loaded.info.n_ctx or 0
        if n_ctx <= 0:
            return None
        stats = next((m.stats for m in reversed(self.chat.thread_messages) if m.role == "assistant" and m.stats), None)
        budget = (stats or {}).get("budget") or {}
        pinned = sum(int(budget.get(key, 0) or 0) for key in ("system", "documents", "tools"))
        reserve = int(budget.get("reserve", 0) or 0) or min(512, n_ctx // 4)
        text = len(self.composer.edit.toPlainText()) // 3 + 16  # the message and its headers, roughly
        return n_ctx - reserve - pinned - text

    @Slot(object)
    def _on_chat_media_not_saved(self, media: object) -> None:
        self.composer.attachments.add_sources([(m.name, m.data) for m in media])  # type: ignore[attr-defined]

    @Slot(int, str)
    def _on_chat_view_edit_requested(self, message_id: int, _text: str) -> None:
        """An edited message keeps its images: they come back to the composer with its text."""
        edited = next((m for m in self.chat.thread_messages if m.id == message_id), None)
        self.composer.attachments.clear()
        if edited is not None and edited.media:
            self.composer.attachments.add_sources([(m.name, m.data) for m in edited.media])

    @Slot(int)
    def _on_chat_view_regenerate_requested(self, message_id: int) -> None:
        self.chat.turns.regenerate(message_id, self.turn_context())

    def regenerate_last(self) -> None:
        """Regenerates the open thread's last reply."""
        for message in reversed(self.chat.thread_messages):
            if message.role == "assistant":
                self.chat.turns.regenerate(message.id, self.turn_context())
                return

    # ------------------------------------------------------------------ showing
    @Slot(object, object)
    def _on_chat_conversation_opened(self, conversation: Conversation | None, messages: list[DisplayMessage]) -> None:
        self.show_conversation(conversation, messages)

    def show_conversation(self, conversation: Conversation | None, messages: list[DisplayMessage]) -> None:
        """Shows an opened chat: its thread, its title, and its saved numbers (never the last turn's)."""
        stats = messages[-1].stats if messages and messages[-1].role == "assistant" else None
        evicted = int((stats or {}).get("evicted_messages", 0) or 0)
        self.chat_view.set_thread(messages, evicted=evicted)
        self.sidebar.set_current(conversation.id if conversation is not None else None)
        title = getattr(conversation, "title", "") or "New chat"
        self.window.setWindowTitle(f"{title} — Glassbox")
        if not self.chat.busy:
            last_id = messages[-1].id if messages else None
            if last_id is None or last_id != self._inspector_reply:
                # Another chat (or branch): its saved numbers, said so, or none; never the last turn's.
                self._inspector_reply = None
                self.show_saved_numbers(messages)

    def show_saved_numbers(self, messages: Sequence[DisplayMessage] | None = None) -> None:
        """The inspector shows the open chat's last reply, saved (or none), with this chat's max
        tokens: never a mix of another chat's, another model's or the last turn's numbers."""
        if messages is None:
            messages = self.chat.thread_messages
        conv_settings = dict(getattr(self.chat.conversation, "settings", None) or {})
        self.inspector.set_reply_limit(conversation_sampling(self.settings.current, conv_settings).max_tokens)
        stats = messages[-1].stats if messages and messages[-1].role == "assistant" else None
        if stats:
            self.inspector.set_stats(stats, saved=True)
        else:
            self.inspector.clear_turn()

    @Slot(int)
    def _on_chat_reply_started(self, reply_id: int) -> None:
        self.chat_view.begin_stream(reply_id)
        self._streaming_reply = reply_id
        self._inspector_reply = reply_id
        self.inspector.begin_generation()
        self._call_tokens = 0
        self._live_timer.start()

    @Slot(str, int)
    def _on_chat_reply_delta(self, text: str, _count: int) -> None:
        self.chat_view.append_stream(text)

    @Slot(int, int)
    def _on_chat_prefill_progressed(self, done: int, total: int) -> None:
        self.inspector.set_prefill(done, total)
        self.composer.set_state_text(f"Reading the prompt… {done}/{total} tokens")

    @Slot(object)
    def _on_chat_reply_finished(self, _outcome: object) -> None:
        self._end_stream()

    def _end_stream(self) -> None:
        self._streaming_reply = None
        self.chat_view.end_stream()

    @Slot(object)
    def _on_chat_sources_found(self, sources: Sequence[Mapping[str, object]]) -> None:
        card = self.chat_view.card_for(self._streaming_reply) if self._streaming_reply is not None else None
        if card is not None:
            card.set_sources(sources)

    @Slot(object)
    def _on_chat_loop_updated(self, _loop: object) -> None:
        """A message of the running turn was recorded (a step's text with its calls, a call's
        result): the transcript puts the streamed text and the cards in the order they happened."""
        record = self.chat.turns.live_agent_record(self._streaming_reply)
        if record is not None:
            self.chat_view.set_live_agent(record)

    @Slot(int)
    def _on_chat_call_progressed(self, tokens: int) -> None:
        """The model writes a tool call (its markup is held back until it is one, or turns out to
        be text): said in the composer's state line and on the reply card, with its tokens."""
        written, self._call_tokens = self._call_tokens, tokens
        if not tokens and written:  # it is written (or was text after all): the phase is not left at it
            self.inspector.set_phase(f"held {written:,} token{'s' if written != 1 else ''} as a tool call")
        note = f"Writing a tool call… {tokens:,} token{'s' if tokens != 1 else ''}" if tokens else ""
        self.chat_view.set_stream_note(note)
        if tokens:
            self.composer.set_state_text(note)
        elif self.chat.state is ChatState.GENERATING:
            self.composer.set_state_text(ChatState.GENERATING.value + "…")

    @Slot()
    def _on_live_timer_timeout(self) -> None:
        tokens, _elapsed, _first = self.chat.turns.live_tokens()
        self.inspector.live_sample(tokens, writing_call=self._call_tokens > 0)

    @Slot(object)
    def _on_chat_state_changed(self, state: ChatState) -> None:
        self.composer.set_busy(state in BUSY_STATES and self.chat.busy)
        if state is ChatState.IDLE:
            self._live_timer.stop()
            self._end_stream()
            if self.chat.model_state is ModelState.LOADED:
                self.composer.set_state_text("")
        elif state is not ChatState.LOADING_MODEL:
            self.composer.set_state_text(state.value + "…")

    @Slot(object)
    def _on_chat_view_source_activated(self, source: Mapping[str, object]) -> None:
        if not open_source(source):
            self.notices.show_error(f"Could not open {source.get('path', 'the file')}")

    @Slot(object)
    def _on_chat_model_loaded(self, loaded: LoadedModel) -> None:
        """The KV cache the model allocated, from its header (off the GUI thread: a big vocabulary
        takes tens of ms to read); shown before the first turn."""

        if not self.chat.busy:  # the numbers shown were of the model before: the chat's saved ones again
            self._inspector_reply = None
            self.show_saved_numbers()
        n_ctx = loaded.info.n_ctx
        path = loaded.path
        if not isinstance(path, Path) or parse_remote_model(path) is not None or not n_ctx:
            return

        def estimate() -> int:
            # lazy: start-up (+61 ms)
            from engine.fit import kv_cache_bytes
            from engine.gguf import read_gguf_info

            return int(kv_cache_bytes(read_gguf_info(path), n_ctx))

        def show(kv_bytes: int) -> None:
            if self.chat.loaded is not None and self.chat.loaded.path == path:
                self.inspector.set_kv_allocation(kv_bytes)

        run_in_background(
            estimate,
            while_alive(self._alive, show),  # the window may close before the answer
            lambda exc: log.info("KV size unknown for %s: %s", path, exc),
        )
