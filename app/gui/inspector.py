"""The inspector: what the model is doing, live (issue 5, "our signature").

* Context map: a stacked bar of the context window (system, documents, history, current message,
  reply reserve, free) with token counts.
* Speed: prefill and decode tokens per second, a live decode chart, time to first token, tokens
  reused from the KV cache.
* Memory: KV cache and weights, the models in memory against the machine's RAM, and the memory
  wall: decode bandwidth against this machine's (tokens per second <= bandwidth / model size).
* Tokens: the last prompt as the model saw it, in coloured pieces with their ids on hover; with a
  LoRA adapter, the last reply compared with the base model (:mod:`app.gui.compare_view`).

The painted pieces are in :mod:`app.gui.inspector_widgets`; nothing here computes more than a few numbers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.gui.display_text import plain_label, plain_tooltip, shown_lines
from app.gui.inspector_terms import OPTIONAL_SEGMENTS, SEGMENTS, WALL_EXPLANATION, format_tps
from app.gui.theme import LIGHT, ThemeColors
from app.gui.window_layout import ElidedLabel, make_wrapping, set_wrapped_text
from engine.units import format_bytes, format_duration

if TYPE_CHECKING:
    from typing import TypeAlias

    from app.gui.workers.resident_models import ResidentState
    from engine.cpu_backend import BackendInfo
    from engine.inference.base_compare import BaseComparison
    from engine.inference.events import Stats

    # A turn's stats: the engine's, live, or the dict a stored reply keeps (``Stats.to_dict``).
    # A type only (the window's first frame builds this panel before any engine event exists).
    StatsLike: TypeAlias = Stats | Mapping[str, object]

__all__ = ["InspectorPanel"]


COMPARING = "Comparing with the base model: two greedy replies…"
"""What the Tokens tab says while a comparison runs."""


class PromptLike(Protocol):
    """The last prompt (``engine.inference.session.PromptView``); ``app.gui.workers.speculative.TokensView``
    adds the reply (``reply_ids``, ``reply_pieces``, ``reply_drafted``)."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def pieces(self) -> Sequence[str]: ...


def _get(stats: StatsLike, key: str) -> object:
    if isinstance(stats, Mapping):
        return stats.get(key)
    return getattr(stats, key, None)


def _as_int(value: object) -> int:
    """A count from stats: 0 when missing or empty."""
    return int(value) if isinstance(value, (int, float, str)) and value else 0


def _int(stats: StatsLike, key: str) -> int:
    return _as_int(_get(stats, key))


def _float(stats: StatsLike, key: str) -> float:
    value = _get(stats, key)
    return float(value) if isinstance(value, (int, float, str)) and value else 0.0


def _opt_float(stats: StatsLike, key: str, keep_zero: bool = False) -> float | None:
    """A number from stats, None when missing (and when zero, unless ``keep_zero``)."""
    value = _get(stats, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value or keep_zero else None


def _entries(value: object) -> list[Mapping[str, object]]:
    """An agent loop's entries, as stored (a list of dicts); anything else is no loop."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        return []
    return [entry for entry in value if isinstance(entry, Mapping)]


def _explain_label(text: str = "", name: str = "explain") -> QLabel:
    """A wrapping line of the inspector: it breaks anywhere (a long URL too), never widens the
    panel, and keeps a long text whole in its tooltip (``window_layout.set_wrapped_text``)."""
    label = make_wrapping(plain_label())
    label.setObjectName(name)
    set_wrapped_text(label, text)
    return label


def _metric(label: str) -> tuple[QLabel, QLabel]:
    """A big value (one line: elided, the whole of it in its tooltip) over its wrapping caption."""
    value = ElidedLabel("—", min_chars=4)
    value.setObjectName("metricValue")
    value.setAccessibleName(label)
    caption = _explain_label(label, "metricLabel")
    return value, caption


def _say(label: QLabel, text: str) -> None:
    """Puts ``text`` in an inspector label: a wrapping one breaks it anywhere (and keeps it whole
    in its tooltip), an eliding one elides it."""
    if label.wordWrap():
        set_wrapped_text(label, text)
    else:
        label.setText(text)


def _read_part(budget: Mapping[str, int], read: int) -> dict[str, int]:
    """The bands of a prompt of which only ``read`` tokens were read, in the order they are read
    (the reply reserve is not used; the rest of the window is free)."""
    out: dict[str, int] = {}
    left = read
    total = sum(budget.values())
    for key, _label in SEGMENTS:
        if key in ("reserve", "free") or key not in budget:
            continue
        out[key] = min(budget[key], left)
        left -= out[key]
    out["reserve"] = 0
    out["free"] = max(total - read, 0)
    return out


def _stopped_in_prefill(stats: StatsLike) -> bool:
    """A reply stopped while the prompt was read: nothing was generated."""
    return _get(stats, "finish_reason") == "cancelled" and not _int(stats, "completion_tokens")


def _server(stats: StatsLike) -> str | None:
    """The server a remote reply came from (its template is ``remote:URL``), else None."""
    template = _get(stats, "template")
    if isinstance(template, str) and template.startswith("remote:"):
        return template.removeprefix("remote:") or "the server"
    return None


_CONTENTS = frozenset(
    {
        *("metrics", "metric_captions", "context_summary", "context_bar", "legend_labels", "legend_rows"),
        *("reserve_label", "evicted_label", "restore_label", "draft_label", "media_label", "adapter_label"),
        *("chart", "loop_timeline", "phase_label", "wall_title", "wall", "wall_explanation", "ceiling_label"),
        *("remote_note", "cpu_label", "resident_label", "tokens_view", "tokens_caption", "tokens_legend"),
        *("compare_summary", "compare_view", "tokens_stack", "compare_legend"),
    }
)
"""The attributes :meth:`InspectorPanel.ensure_contents` makes."""


class InspectorPanel(QFrame):
    """The side panel. Every number shown is kept in ``shown`` (for tests and screenshots)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("inspector")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setMinimumWidth(320)
        self.shown: dict[str, str] = {}
        self.colors = LIGHT
        self._live: list[float] = []
        self._last_sample: tuple[float, int] | None = None
        self.model_bytes: int | None = None
        self.machine_bandwidth: float | None = None
        self.n_ctx: int | None = None
        self.kv_allocated: int | None = None
        self.reply_limit: int | None = None  # max tokens of the next (or running) reply
        self.live = False
        self.server: str | None = None  # the server of the loaded model, when it is remote
        self._turn_shown = False  # a turn's numbers are shown (not only the loaded model's)
        self._cpu_text = ""  # the CPU line set at load, before any note of a reply
        self._contents_built = False

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self._build_header(outer)
        self.tabs = QTabWidget()
        outer.addWidget(self.tabs, 1)
        # The tabs' contents (about half the window's widgets) are built after the window's first
        # frame (ensure_contents), or when one of them is first used: a measured start-up cost.
        # Built now: the tabs themselves, and the Compare buttons a controller connects to.
        self._live_scroll = QScrollArea()
        self._live_scroll.setWidgetResizable(True)
        self._live_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self._live_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.tabs.addTab(self._live_scroll, "Live")
        self.tokens_page = QWidget()
        self._tokens_layout = QVBoxLayout(self.tokens_page)
        self._tokens_layout.setContentsMargins(8, 8, 8, 8)
        self._build_compare_row(self._tokens_layout)
        self.tabs.addTab(self.tokens_page, "Tokens")

    def ensure_contents(self) -> None:
        """Builds the Live and Tokens tabs' contents, once."""
        if self._contents_built:
            return
        self._contents_built = True
        self.metrics: dict[str, QLabel] = {}
        self.metric_captions: dict[str, QLabel] = {}
        self._live_scroll.setWidget(self._build_live_page())
        self._build_tokens_page(self._tokens_layout)
        self.set_colors(self.colors)

    def __getattr__(self, name: str) -> object:
        # Only reached for an attribute not set yet: a widget of the tabs, asked for before they
        # were built (a call before the first frame, a test), builds them.
        if name in _CONTENTS and not self.__dict__.get("_contents_built", True):
            self.ensure_contents()
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ layout
    def _build_header(self, outer: QVBoxLayout) -> None:
        """The title and whose numbers these are."""
        title = plain_label("INSPECTOR")
        title.setObjectName("sectionTitle")
        title.setContentsMargins(14, 12, 14, 0)
        outer.addWidget(title)
        # Whose numbers these are: this reply live, the last reply of this chat, or none yet. The
        # numbers of another turn are never shown as if they were live.
        self.freshness = _explain_label("No reply yet in this chat")
        self.freshness.setContentsMargins(14, 0, 14, 0)
        self.freshness.setAccessibleName("Inspector shows")
        outer.addWidget(self.freshness)

    def _build_live_page(self) -> QWidget:
        """The Live tab's contents (it scrolls them): the context window, speed and memory sections."""
        live = QWidget()
        lay = QVBoxLayout(live)
        lay.setContentsMargins(14, 8, 14, 14)
        lay.setSpacing(8)
        self._build_context_section(lay)
        self._build_speed_section(lay)
        self._build_memory_section(lay)
        lay.addStretch(1)
        return live

    def _build_context_section(self, lay: QVBoxLayout) -> None:
        """The context map: the stacked bar, its legend, the reply reserve and evictions."""
        from app.gui.inspector_widgets import ContextBar  # lazy: start-up (after the first frame: ensure_contents)

        lay.addWidget(self._section("CONTEXT WINDOW"))
        self.context_summary = _explain_label("no turn yet", "metricLabel")
        lay.addWidget(self.context_summary)
        self.context_bar = ContextBar()
        lay.addWidget(self.context_bar)
        lay.addLayout(self._build_legend())
        self.reserve_label = _explain_label()
        lay.addWidget(self.reserve_label)
        self.evicted_label = _explain_label()
        lay.addWidget(self.evicted_label)

    def _build_legend(self) -> QGridLayout:
        """One row per segment of the window: its swatch, its name, its tokens."""
        legend = QGridLayout()
        legend.setHorizontalSpacing(10)
        legend.setVerticalSpacing(2)
        self.legend_labels: dict[str, QLabel] = {}
        self.legend_rows: dict[str, tuple[QLabel, QLabel, QLabel]] = {}
        for i, (key, label) in enumerate(SEGMENTS):
            swatch = plain_label("■")
            swatch.setObjectName(f"swatch_{key}")
            name = _explain_label(label, "legendName")
            value = plain_label("—")
            value.setAlignment(Qt.AlignmentFlag.AlignRight)
            self.legend_labels[key] = value
            legend.addWidget(swatch, i, 0)
            legend.addWidget(name, i, 1)
            legend.addWidget(value, i, 2)
            self.legend_rows[key] = (swatch, name, value)
            if key in OPTIONAL_SEGMENTS:
                for widget in self.legend_rows[key]:
                    widget.setVisible(False)
        legend.setColumnStretch(1, 1)
        legend.setColumnMinimumWidth(0, 16)
        return legend

    def _metric_grid(self, metrics: Sequence[tuple[str, str]]) -> QGridLayout:
        """Two metrics a row, each a value over its caption; the values go in ``self.metrics``."""
        grid = QGridLayout()
        grid.setVerticalSpacing(0)
        for i, (key, label) in enumerate(metrics):
            value, caption = _metric(label)
            self.metrics[key] = value
            self.metric_captions[key] = caption
            grid.addWidget(value, (i // 2) * 2, i % 2)
            grid.addWidget(caption, (i // 2) * 2 + 1, i % 2)
        return grid

    def _build_speed_section(self, lay: QVBoxLayout) -> None:
        """Speeds, the KV restore and draft lines, the live chart, the loop timeline, the phase."""
        from app.gui.agent_timeline import LoopTimelineWidget  # lazy: start-up (after the first frame: ensure_contents)
        from app.gui.inspector_widgets import SpeedChart  # lazy: start-up (as above)

        lay.addWidget(self._section("SPEED"))
        lay.addLayout(
            self._metric_grid(
                (
                    ("decode_tps", "decode tok/s"),
                    ("prefill_tps", "prefill tok/s"),
                    ("ttft_ms", "time to first token"),
                    ("cached_tokens", "reused from KV cache"),
                )
            )
        )
        # A turn that restored its KV cache from disk, and speculative decoding's acceptance.
        self.restore_label = _explain_label()
        self.restore_label.setVisible(False)
        lay.addWidget(self.restore_label)
        self.draft_label = _explain_label()
        self.draft_label.setVisible(False)
        lay.addWidget(self.draft_label)
        # A turn with images: encoding is its own phase, before the prefill and the decode.
        self.media_label = _explain_label()
        self.media_label.setObjectName("mediaPhase")
        self.media_label.setVisible(False)
        self.adapter_label = _explain_label()  # the chat's LoRA adapters, and what changing them cost
        self.adapter_label.setVisible(False)
        lay.addWidget(self.media_label)
        lay.addWidget(self.adapter_label)
        self.chart = SpeedChart()
        lay.addWidget(self.chart)
        self.loop_timeline = LoopTimelineWidget()  # a turn with tool calls: its steps (app/gui/agent_timeline.py)
        lay.addWidget(self.loop_timeline)
        self.phase_label = _explain_label("")
        lay.addWidget(self.phase_label)

    def _build_memory_section(self, lay: QVBoxLayout) -> None:
        """Weights, KV cache, bandwidths, the memory wall and the CPU code."""
        from app.gui.inspector_widgets import WallMeter  # lazy: start-up (after the first frame: ensure_contents)

        lay.addWidget(self._section("MEMORY"))
        lay.addLayout(
            self._metric_grid(
                (
                    ("model_bytes", "model weights"),
                    ("kv_cache_bytes", "KV cache (allocated)"),
                    ("bandwidth_gbps", "decode bandwidth"),
                    ("machine_bandwidth_gbps", "machine bandwidth"),
                )
            )
        )
        self.wall_title = plain_label("Memory wall")
        self.wall_title.setObjectName("metricLabel")
        lay.addWidget(self.wall_title)
        self.wall = WallMeter()
        lay.addWidget(self.wall)
        self.wall_explanation = _explain_label(WALL_EXPLANATION)
        lay.addWidget(self.wall_explanation)
        self.ceiling_label = _explain_label()
        lay.addWidget(self.ceiling_label)
        # A remote model's weights and KV cache are in its server's memory: this machine's numbers
        # (its bandwidth, the wall, the ceiling) say nothing about it, and are hidden.
        self.remote_note = _explain_label()
        self.remote_note.setVisible(False)
        lay.addWidget(self.remote_note)
        # The instructions the decoder runs on are part of its speed: which of llama.cpp's CPU
        # variants this machine got, and what it uses.
        self.cpu_label = _explain_label()
        self.cpu_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.cpu_label)
        # The other models kept loaded (Settings: Models kept loaded): what each holds.
        self.resident_label = _explain_label()
        self.resident_label.setVisible(False)
        lay.addWidget(self.resident_label)

    def _build_compare_row(self, tl: QVBoxLayout) -> None:
        """The Tokens tab's Compare with base, Stop and Show the prompt buttons."""
        # Compare with base (a chat with a LoRA adapter): the last reply decoded greedily with the
        # adapter and without it, shown in place of the prompt until the prompt is asked for again.
        row = QHBoxLayout()
        self.compare_button = QPushButton("Compare with base")
        self.compare_button.setObjectName("compareBaseButton")
        self.compare_button.setEnabled(False)
        self.compare_stop = QPushButton("Stop")
        self.compare_stop.setVisible(False)
        self.compare_back = QPushButton("Show the prompt")
        self.compare_back.setVisible(False)
        self.compare_back.clicked.connect(self.show_prompt_tokens)
        row.addWidget(self.compare_button)
        row.addWidget(self.compare_stop)
        row.addWidget(self.compare_back)
        row.addStretch(1)
        tl.addLayout(row)

    def _build_tokens_page(self, tl: QVBoxLayout) -> None:
        """The Tokens tab: the last prompt (and reply) in coloured pieces, around the Compare row."""
        from app.gui.inspector_widgets import TokensView  # lazy: start-up (after the first frame: ensure_contents)

        self.tokens_view = TokensView()
        self.tokens_caption = _explain_label("The last prompt, exactly as the model saw it. Hover a piece for its id.")
        tl.insertWidget(0, self.tokens_caption)  # above the Compare row
        self.compare_summary = _explain_label()
        self.compare_summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.compare_summary.setVisible(False)
        tl.addWidget(self.compare_summary)
        # lazy: start-up (+45 ms: engine.inference.base_compare, decoding and the projector's modules)
        from app.gui.compare_view import CompareView

        self.compare_view = CompareView()
        self.tokens_stack = QStackedWidget()
        self.tokens_stack.addWidget(self.tokens_view)
        self.tokens_stack.addWidget(self.compare_view)
        tl.addWidget(self.tokens_stack, 1)
        self.tokens_legend = QLabel("")  # the reply's tints: accepted draft tokens, decoded ones
        self.tokens_legend.setTextFormat(Qt.TextFormat.RichText)  # its tints, drawn in HTML
        self.tokens_legend.setObjectName("tokensLegend")
        self.tokens_legend.setWordWrap(True)
        self.tokens_legend.setVisible(False)
        tl.addWidget(self.tokens_legend)
        self.compare_legend = QLabel("")  # the comparison's tints
        self.compare_legend.setTextFormat(Qt.TextFormat.RichText)
        self.compare_legend.setWordWrap(True)
        self.compare_legend.setVisible(False)
        tl.addWidget(self.compare_legend)

    def _section(self, text: str) -> QLabel:
        label = plain_label(text)
        label.setObjectName("sectionTitle")
        label.setContentsMargins(0, 6, 0, 0)
        return label

    # ------------------------------------------------------------------ theme
    def set_colors(self, colors: ThemeColors) -> None:
        self.colors = colors
        if not self._contents_built:
            return  # ensure_contents paints them in these colours
        for widget in (self.context_bar, self.chart, self.wall):
            widget.colors = colors
            widget.update()
        self.loop_timeline.set_colors(colors)
        for key, _ in SEGMENTS:
            swatch = self.findChild(QLabel, f"swatch_{key}")
            if swatch is not None:
                swatch.setStyleSheet(f"color: {colors.segment(key)}; font-size: 13pt;")
        self.tokens_view.dark = self.compare_view.dark = colors.name == "dark"
        if self.tokens_view.token_ids or self.tokens_view.reply_ids:
            self.tokens_view.rerender()
        if self.compare_view.comparison is not None:
            self.compare_view.rerender()
        self.tokens_legend.setText(self.tokens_view.legend_html())
        self.compare_legend.setText(self.compare_view.legend_html())

    # ------------------------------------------------------------------ data
    def _show(self, key: str, text: str, label: QLabel | None = None) -> None:
        self.shown[key] = text
        target = label if label is not None else self.metrics.get(key)
        if target is not None:
            _say(target, text)

    def set_model(
        self, model_bytes: int | None, n_ctx: int | None, machine_bandwidth: float | None, server: str | None = None
    ) -> None:
        """A model was loaded: its weights, window size and the machine's bandwidth, or, for a
        model on ``server``, that its memory is the server's. The numbers of a turn are left to
        :meth:`set_stats` and :meth:`clear_turn` (the window shows the open chat's again)."""
        self.server = server
        self.model_bytes = None if server else model_bytes
        self.machine_bandwidth = machine_bandwidth
        self.n_ctx = n_ctx or None
        if server:
            self.kv_allocated = None
        self._show_memory_of_model()

    def _show_memory_of_model(self) -> None:
        """The memory section before a turn: the loaded model's weights, its KV cache, this
        machine's bandwidth and the ceiling they set (or, for a remote model, that they are the server's)."""
        self._show_backend(self.server)
        if self.server:
            return
        self._show("model_bytes", format_bytes(self.model_bytes) if self.model_bytes else "—")
        self._show("kv_cache_bytes", format_bytes(self.kv_allocated) if self.kv_allocated else "—")
        self._show("bandwidth_gbps", "—")
        bandwidth = self.machine_bandwidth
        self._show("machine_bandwidth_gbps", f"{bandwidth:.1f} GB/s" if bandwidth else "not measured")
        self.wall.set_values(None, bandwidth)
        self.shown["wall_ratio"] = "—"
        if self.model_bytes and bandwidth:
            ceiling = bandwidth * 1e9 / self.model_bytes
            self._show("ceiling", f"Ceiling for this model on this machine: ≈ {ceiling:.0f} tok/s.", self.ceiling_label)
        else:
            self._show("ceiling", "", self.ceiling_label)

    def set_resident(self, state: ResidentState) -> None:
        """Every model in memory against this machine's RAM: their sum as the fit estimator counts
        it (weights, KV cache, compute buffers: what llama.cpp reserves, an upper bound) beside
        what their worker processes hold now (measured), then the chat's model and each one kept
        loaded beside it with its parts, the time until its idle unload, and why the last one to
        go was unloaded."""
        lines = []
        everything = ([state.chat] if state.chat is not None else []) + list(state.models)
        if everything:
            total = sum(k.memory.total for k in everything)
            count = f"{len(everything)} models" if len(everything) > 1 else "1 model"
            line = f"In memory: {count}, {format_bytes(total)} reserved (estimated)"
            if state.machine_ram:
                line += f" of {format_bytes(state.machine_ram)} RAM"
            if state.rss is not None:
                line += f"; their workers hold {format_bytes(state.rss)} now"
            lines.append(line)
        for kept in everything:
            m = kept.memory
            whose = "this chat's" if kept is state.chat else "kept loaded"
            line = (
                f"{kept.label} ({whose}): {format_bytes(m.total)} ({format_bytes(m.weights)} weights, "
                f"{format_bytes(m.kv)} KV cache, {format_bytes(m.compute)} compute buffers)"
            )
            if kept.unload_in_s is not None and kept is not state.chat:
                line += f", unloaded if unused for {format_duration(kept.unload_in_s)} more"
            lines.append(line)
        if state.last_unloaded:
            lines.append(f"Last unloaded: {state.last_unloaded}")
        self._show("resident", "\n".join(lines), self.resident_label)
        self.resident_label.setVisible(bool(lines))

    def _show_backend(self, server: str | None) -> None:
        """Shows the memory section of a local model, or hides it for a model on ``server``."""
        remote = server is not None
        for key in ("model_bytes", "kv_cache_bytes", "bandwidth_gbps", "machine_bandwidth_gbps"):
            self.metrics[key].setVisible(not remote)
            self.metric_captions[key].setVisible(not remote)
        for widget in (self.wall_title, self.wall, self.wall_explanation, self.ceiling_label, self.cpu_label):
            widget.setVisible(not remote)
        self.remote_note.setVisible(remote)
        if remote:
            note = (
                f"This model runs on {server}: its weights and KV cache are in the server's memory, so this "
                "machine's bandwidth, memory wall and ceiling do not apply."
            )
            self._show("remote", note, self.remote_note)
            for key in ("model_bytes", "kv_cache_bytes", "bandwidth_gbps", "machine_bandwidth_gbps"):
                self.shown[key] = "on the server"
            self.shown["wall_ratio"] = "—"
        else:
            self.shown.pop("remote", None)

    def set_cpu_backend(self, backend: BackendInfo | None, note: str | None = None) -> None:
        """The CPU code llama.cpp runs (``engine.cpu_backend.BackendInfo``; None: not known)."""
        if backend is None:
            self._show("cpu_backend", "", self.cpu_label)
            return
        features = " ".join(f for f in backend.features if "=" not in f)
        text = f"CPU code: {backend.label}" + (f" — {features}" if features else "")
        if backend.gpu:
            text += f". GPU: {', '.join(backend.gpu)}"
        held = [f"{tag} ({why})" for tag, why in backend.skipped]
        if held:
            text += f". Not used: {'; '.join(held)}"
        if note:
            text += f". {note}"
        self._cpu_text = text
        self._show("cpu_backend", text, self.cpu_label)
        self.cpu_label.setToolTip(plain_tooltip(text))

    def _show_cpu_note(self, stats: StatsLike) -> None:
        """What the CPU code did during the reply (it crashed and the reply went on on another
        variant): said under the CPU line, whose variant it makes stale."""
        note = str(_get(stats, "cpu_note") or "")
        if not note:
            return
        text = f"{self._cpu_text}. {note[:1].upper()}{note[1:]}" if self._cpu_text else note
        self._show("cpu_backend", text, self.cpu_label)
        self.cpu_label.setToolTip(plain_tooltip(text))

    def set_machine_bandwidth(self, gbps: float) -> None:
        """The machine's measured memory bandwidth arrived (probed after the first load)."""
        self.machine_bandwidth = gbps
        if not self.server and not self._turn_shown:
            self._show_memory_of_model()
        elif not self.server:
            self._show("machine_bandwidth_gbps", f"{gbps:.1f} GB/s")

    def set_kv_allocation(self, kv_bytes: int | None) -> None:
        """The KV cache the loaded model allocated (known at load, before any turn)."""
        self.kv_allocated = kv_bytes
        if kv_bytes and not self.server and not self._turn_shown:
            self._show("kv_cache_bytes", format_bytes(kv_bytes))
            tokens = f"{self.n_ctx:,}" if self.n_ctx else "the"
            self.metrics["kv_cache_bytes"].setToolTip(f"{format_bytes(kv_bytes)} allocated for {tokens} tokens")

    def set_reply_limit(self, max_tokens: int | None) -> None:
        """The max tokens of the open chat's replies (its sampling): what a reply may use."""
        self.reply_limit = max_tokens

    def clear_turn(self, why: str = "No reply yet in this chat") -> None:
        """Forgets the last turn's numbers (a new chat, a deleted one, another model): dashes, an
        empty window map, and the memory section of the loaded model."""
        self.live = False
        self._turn_shown = False
        self.loop_timeline.set_entries([])
        self._show("freshness", why, self.freshness)
        for key in ("decode_tps", "prefill_tps", "ttft_ms", "cached_tokens"):
            self._show(key, "—")
            self.metrics[key].setToolTip("")
        window = f"{self.n_ctx:,} tokens in the window" if self.n_ctx else "no turn yet"
        self._show("context_used", window, self.context_summary)
        self.context_bar.set_budget({"free": self.n_ctx} if self.n_ctx else {})
        for key, _ in SEGMENTS:
            value = (f"{self.n_ctx:,}" if key == "free" else "0") if self.n_ctx else "—"
            self._show(f"budget.{key}", value, self.legend_labels[key])
        for key in OPTIONAL_SEGMENTS:
            for widget in self.legend_rows[key]:
                widget.setVisible(False)
        self._show("reply_may_use", "", self.reserve_label)
        self._show("evicted", "", self.evicted_label)
        self.restore_label.setVisible(False)
        self.media_label.setVisible(False)
        self.draft_label.setVisible(False)
        self.chart.set_samples([])
        self._show("phase", "", self.phase_label)
        self._show_memory_of_model()

    def set_stats(self, stats: StatsLike | None, saved: bool = False) -> None:
        """Shows a turn's stats (``engine.inference.events.Stats`` or its dict, which a stored
        reply keeps with its ``finish_reason``).

        Args:
            stats: the stats.
            saved: they are a stored reply's (a chat opened), not the reply that just ran; the speed
                chart, which only a live reply has, is then cleared.
        """
        if stats is None:
            return
        if saved and isinstance(stats, Mapping):  # a stored reply: its loop, if it had one (live: set_loop)
            self.loop_timeline.set_entries(_entries(stats.get("loop")))
        self.live = False
        self._turn_shown = True
        if saved:
            self.chart.set_samples([])
        why = "The last reply in this chat (saved)" if saved else "The reply that just finished"
        self._show("freshness", why, self.freshness)
        self._show_context(stats)
        stopped = _stopped_in_prefill(stats)
        self._show("decode_tps", "—" if stopped else format_tps(_opt_float(stats, "decode_tps")))
        self._show_prefill_speed(stats, stopped)
        self._show("ttft_ms", "—" if stopped else f"{_float(stats, 'ttft_ms'):.0f} ms")
        self.metrics["ttft_ms"].setToolTip("Stopped before the first token" if stopped else "")
        self._show("cached_tokens", f"{_int(stats, 'cached_tokens')} / {_int(stats, 'prompt_tokens')}")
        self._show_restore(stats)
        self._show_draft(stats)
        self._show_media(stats)
        self._show_adapters(stats)
        self._show_cpu_note(stats)
        self._show_memory(stats)
        template = _get(stats, "template")
        self._show("phase", f"template: {'' if template is None else template}", self.phase_label)

    def _show_adapters(self, stats: StatsLike) -> None:
        """The LoRA adapters the reply ran with, and the prompt tokens read again because they changed."""
        adapters = _get(stats, "adapters")
        recomputed = _int(stats, "recomputed_tokens")
        if not adapters and not recomputed:
            self._show("adapters", "", self.adapter_label)
            self.adapter_label.setVisible(False)
            return
        text = f"LoRA adapters: {adapters}" if adapters else "No LoRA adapter (the base model)"
        if recomputed:
            text += f" · changed since the last reply: {recomputed:,} cached prompt tokens read again"
        self._show("adapters", text, self.adapter_label)
        self.adapter_label.setVisible(True)

    def _show_media(self, stats: StatsLike) -> None:
        """The images' phase of the timeline: encode, then prefill, then decode."""
        tokens = _int(stats, "media_tokens")
        dropped = _int(stats, "media_dropped")
        if not tokens and not dropped:
            self.media_label.setVisible(False)
            return
        parts = []
        if tokens:
            encoded = _int(stats, "media_encoded")
            if encoded:
                encode = f"encode {_float(stats, 'encode_ms'):.0f} ms"
            else:
                encode = "images read from the KV cache (not encoded again)"
            parts.append(
                f"Images: {tokens:,} tokens · {encode} → prefill {_float(stats, 'prefill_ms'):.0f} ms"
                f" → decode {_float(stats, 'decode_ms'):.0f} ms"
            )
        if dropped:
            parts.append(f"{dropped} earlier image{'s' if dropped > 1 else ''} left out: this model cannot see images")
        self.media_label.setText("\n".join(parts))
        self.media_label.setVisible(True)

    def _show_prefill_speed(self, stats: StatsLike, stopped: bool) -> None:
        """The prefill speed; a reply stopped while reading the prompt reads fewer tokens than it
        planned, so its speed is what it read (past the reused ones) over the time it took."""
        if not stopped:
            self._show("prefill_tps", format_tps(_opt_float(stats, "prefill_tps")))
            return
        read = max(_int(stats, "context_used") - _int(stats, "cached_tokens"), 0)
        seconds = _float(stats, "prefill_ms") / 1000
        self._show("prefill_tps", format_tps(read / seconds) if read and seconds > 0 else "—")

    def _show_context(self, stats: StatsLike) -> None:
        """The context map of a finished turn: its bands, the summary, the reserve, evictions."""
        raw_budget = _get(stats, "budget")
        raw: Mapping[str, object] = raw_budget if isinstance(raw_budget, Mapping) else {}
        # A remote backend adds flags (``estimated``, ``n_ctx_unknown``): not parts of the window.
        budget = {key: _as_int(raw[key]) for key, _ in SEGMENTS if key in raw}
        n_ctx = _int(stats, "n_ctx")
        prompt = _int(stats, "prompt_tokens")
        window = "an unknown window size" if raw.get("n_ctx_unknown") else f"{n_ctx}"
        if _stopped_in_prefill(stats):
            # Stopped while reading the prompt: the map shows what was read, in the order it is read.
            read = min(_int(stats, "context_used"), prompt) if _get(stats, "context_used") is not None else 0
            budget = _read_part(budget, read)
            summary = f"Stopped while reading the prompt: {read:,} of {prompt:,} tokens read; no reply was written"
        else:
            # What the window holds after the reply: the prompt and every token of the reply (the
            # engine's context_used leaves out the last token, never fed back).
            used = prompt + _int(stats, "completion_tokens") if prompt else _int(stats, "context_used")
            summary = f"{used} of {window} tokens used"
        if raw.get("estimated"):
            summary += " (estimated: the server has no tokenizer endpoint)"
        if budget:
            self.context_bar.set_budget(budget)
            for key, _ in SEGMENTS:
                self._show(f"budget.{key}", str(int(budget.get(key, 0))), self.legend_labels[key])
            for key in OPTIONAL_SEGMENTS:
                for widget in self.legend_rows[key]:
                    widget.setVisible(bool(budget.get(key)))
        self._show("context_used", summary, self.context_summary)
        self._show_reserve(budget, prompt, n_ctx)
        evicted = _int(stats, "evicted_messages")
        self.shown["evicted_messages"] = str(evicted)
        self._show(
            "evicted",
            f"⚠ {evicted} older message{'s' if evicted != 1 else ''} evicted to fit (rolling window)"
            if evicted
            else "",
            self.evicted_label,
        )

    def _show_memory(self, stats: StatsLike) -> None:
        """Weights, the KV cache, the bandwidths, the memory wall and the ceiling of a finished
        turn; a remote reply's are its server's (hidden, said so)."""
        server = _server(stats)
        self._show_backend(server)
        if server is not None:
            return
        model_bytes = _opt_float(stats, "model_bytes") or (float(self.model_bytes) if self.model_bytes else None)
        self._show("model_bytes", format_bytes(model_bytes) if model_bytes else "—")
        kv_used = _opt_float(stats, "kv_used_bytes", keep_zero=True)
        kv_total = _opt_float(stats, "kv_cache_bytes")
        self._show("kv_cache_bytes", format_bytes(kv_total) if kv_total else "—")
        self.shown["kv_used_bytes"] = format_bytes(kv_used)
        self.metrics["kv_cache_bytes"].setToolTip(f"{format_bytes(kv_used)} in use by this conversation")
        achieved = _float(stats, "bandwidth_gbps")
        machine = _opt_float(stats, "machine_bandwidth_gbps") or self.machine_bandwidth
        self._show("bandwidth_gbps", f"{achieved:.1f} GB/s" if achieved else "—")
        self._show("machine_bandwidth_gbps", f"{float(machine):.1f} GB/s" if machine else "not measured")
        self.wall.set_values(achieved or None, float(machine) if machine else None)
        ratio = self.wall.ratio
        self.shown["wall_ratio"] = f"{ratio * 100:.0f}%" if ratio is not None else "—"
        decode = _float(stats, "decode_tps")
        if machine and model_bytes and decode:
            ceiling = float(machine) * 1e9 / (model_bytes + (kv_used or 0.0))
            text = (
                f"Ceiling ≈ {ceiling:.0f} tok/s on this machine; achieved {decode:.1f} tok/s "
                f"({decode / ceiling * 100:.0f}% of it)."
            )
        elif machine and model_bytes:
            text = f"Ceiling for this model on this machine: ≈ {float(machine) * 1e9 / model_bytes:.0f} tok/s."
        else:
            text = ""
        self._show("ceiling", text, self.ceiling_label)

    def _show_reserve(self, budget: Mapping[str, int], prompt: int, n_ctx: int) -> None:
        """What a reply may use: its max tokens, within the window left after the prompt. The
        reserve is only the part kept free for it (at most a quarter of a small window)."""
        reserve = int(budget.get("reserve", 0))
        if not n_ctx or not budget:
            self._show("reply_may_use", "", self.reserve_label)
            return
        room = max(n_ctx - prompt, 0)
        limit = self.reply_limit
        may_use = min(limit, room) if limit else room
        text = f"A reply may use up to {may_use:,} tokens"
        if limit:
            text += f" (this chat's max tokens {limit:,}"
            text += f", {room:,} left in the window)" if room < limit else ")"
        text += f"; {min(reserve, may_use):,} of them are kept free for it (the reply reserve)."
        self._show("reply_may_use", text, self.reserve_label)
        self.shown["reply_may_use"] = str(may_use)

    def _show_restore(self, stats: StatsLike) -> None:
        restored = _int(stats, "kv_restored_tokens")
        restore_ms = _float(stats, "kv_restore_ms")
        if not restored:
            self.restore_label.setVisible(False)
            self.shown.pop("kv_restored", None)
            return
        text = f"restored {restored:,} tokens from disk in {restore_ms:.0f} ms"
        prefill_tps = _float(stats, "prefill_tps")
        if prefill_tps > 0:
            text += f" (prefill would take {format_duration(restored / prefill_tps)})"
        self.shown["kv_restored"] = text
        _say(self.restore_label, "KV cache " + text)
        self.restore_label.setVisible(True)

    def _show_draft(self, stats: StatsLike) -> None:
        drafted = _int(stats, "draft_tokens")
        accepted = _int(stats, "accepted_tokens")
        note = str(_get(stats, "speculation_note") or "")
        if not drafted and not note:
            self.draft_label.setVisible(False)
            self.shown.pop("draft", None)
            return
        completion = _int(stats, "completion_tokens")
        # Each pass of the model reads every weight once and yields its accepted drafts plus one.
        passes = max(completion - accepted, 1)
        text = (
            f"Speculative decoding: {accepted / drafted * 100:.0f}% of drafted tokens accepted "
            f"({accepted:,} of {drafted:,}); {completion / passes:.2f} tokens per weight read"
            if drafted
            else note[:1].upper() + note[1:]
        )
        restores = _int(stats, "draft_restores")
        if restores:
            text += f"; {restores:,} rejected drafts undone by restoring the model's recurrent state"
        self.shown["draft"] = text
        _say(self.draft_label, text)
        self.draft_label.setVisible(True)

    # ------------------------------------------------------------------ live
    def begin_generation(self) -> None:
        """A reply starts: the last turn's numbers give way to dashes until this one's arrive."""
        self.live = True
        self._turn_shown = True
        self._live = []
        self._last_sample = None
        self.chart.set_samples([])
        self.loop_timeline.set_entries([])
        self._show("freshness", "Live: this reply", self.freshness)
        for key in ("decode_tps", "prefill_tps", "ttft_ms", "cached_tokens"):
            self._show(key, "…")
            self.metrics[key].setToolTip("")
        if not self.server:
            self._show("bandwidth_gbps", "…")
        self._show("context_used", "this turn's numbers come when the reply ends", self.context_summary)
        self.restore_label.setVisible(False)
        self.media_label.setVisible(False)
        self.draft_label.setVisible(False)
        self._show("evicted", "", self.evicted_label)
        self.wall.set_values(None, self.machine_bandwidth)
        self._show("phase", "reading the prompt…", self.phase_label)

    def set_loop(self, entries: Sequence[Mapping[str, object]] | None) -> None:
        """The running turn's agent loop so far (generations and tool calls, in order)."""
        self.loop_timeline.set_entries(list(entries or []))

    def set_phase(self, text: str) -> None:
        """What the running reply is doing, in the line under the chart."""
        self._show("phase", text, self.phase_label)

    def set_prefill(self, done: int, total: int) -> None:
        self._show("phase", f"reading the prompt: {done:,} / {total:,} tokens", self.phase_label)

    def live_sample(self, tokens: int, writing_call: bool = False) -> None:
        """Called ~4 times a second while generating with the tokens generated so far (those of a
        tool call being written too: ``writing_call``)."""
        now = time.perf_counter()
        if self._last_sample is not None:
            then, before = self._last_sample
            if now > then and tokens > before:
                rate = (tokens - before) / (now - then)
                self._live.append(rate)
                self.chart.set_samples(self._live)
                self.metrics["decode_tps"].setText(f"{rate:.1f} tok/s")
                noun = f"token{'s' if tokens != 1 else ''}"
                phase = f"writing a tool call: {tokens:,} {noun}" if writing_call else f"generating: {tokens:,} {noun}"
                self._show("phase", phase, self.phase_label)
        self._last_sample = (now, tokens)

    # ------------------------------------------------------------------ compare with base
    def set_compare_state(self, available: str | None, running: bool) -> None:
        """The Compare button: enabled when ``available`` is None (else its tooltip says why not);
        Stop shown while a comparison runs."""
        self.compare_button.setEnabled(available is None and not running)
        self.compare_button.setToolTip(
            plain_tooltip(
                "Decode the last reply's prompt greedily with the chat's LoRA adapter and without it, "
                "and mark where the two replies part"
                if available is None
                else available
            )
        )
        self.compare_button.setText("Comparing…" if running else "Compare with base")
        self.compare_stop.setVisible(running)
        if running:
            self._show("compare", COMPARING, self.compare_summary)
            self.compare_summary.setVisible(True)
        elif self.shown.get("compare") == COMPARING:  # it ended without a result to show (it failed)
            self._show("compare", "", self.compare_summary)
            self.compare_summary.setVisible(self.tokens_stack.currentWidget() is self.compare_view)

    def show_comparison(self, comparison: BaseComparison | None, elapsed_ms: float = 0.0) -> None:
        """Shows a comparison in place of the prompt (None: it was stopped)."""
        if comparison is None:
            self._show("compare", "Comparison stopped.", self.compare_summary)
            self.compare_summary.setVisible(True)
            return
        lines = [comparison.summary() + "."]
        moved = comparison.move_line()
        if moved:
            lines.append(moved + ".")
        cost = f"Two greedy replies of at most {max(len(comparison.adapted), len(comparison.base))} tokens"
        cost += f" in {format_duration(elapsed_ms / 1000)}" if elapsed_ms > 0 else ""
        if not comparison.restored:
            cost += "; the chat's KV cache could not be kept, its next reply reads the prompt again"
        lines.append(cost + ". Hover a piece for its probabilities.")
        self._show("compare", shown_lines("\n".join(lines)), self.compare_summary)
        self.compare_summary.setVisible(True)
        self.compare_view.set_comparison(comparison)
        self.tokens_stack.setCurrentWidget(self.compare_view)
        self.compare_back.setVisible(True)
        self.tokens_caption.setVisible(False)
        self.tokens_legend.setVisible(False)
        self.compare_legend.setVisible(True)
        self.tabs.setCurrentWidget(self.tokens_page)

    def show_prompt_tokens(self) -> None:
        """Back to the last prompt's tokens (the comparison is kept until the next one)."""
        self.tokens_stack.setCurrentWidget(self.tokens_view)
        self.compare_back.setVisible(False)
        self.compare_summary.setVisible(False)
        self.compare_legend.setVisible(False)
        self.tokens_caption.setVisible(True)
        self.tokens_legend.setVisible(bool(self.tokens_view.reply_ids))

    def set_prompt_view(self, view: PromptLike) -> None:
        """Shows the last prompt (and the reply after it, when the view has one) on the Tokens tab."""
        self.show_prompt_tokens()
        ids = list(view.token_ids or [])
        pieces = list(view.pieces or [])
        # app.gui.workers.speculative.TokensView adds the reply; a bare PromptView has none.
        reply_ids: list[int] = list(getattr(view, "reply_ids", []) or [])
        drafted: list[bool] = list(getattr(view, "reply_drafted", []) or [])
        self.tokens_view.set_tokens(
            ids,
            pieces,
            reply_ids=reply_ids,
            reply_pieces=[str(piece) for piece in getattr(view, "reply_pieces", []) or []],
            reply_drafted=drafted,
        )
        reply = ""
        if reply_ids:
            reply = f", then the reply: {len(reply_ids)} tokens, {sum(drafted)} of them accepted from a draft"
        self.tokens_caption.setText(
            f"The last prompt, exactly as the model saw it: {len(ids)} tokens{reply}. Hover a piece for its id."
        )
        self.tokens_legend.setVisible(bool(reply_ids))
