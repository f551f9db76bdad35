"""A turn's thinking options in the terms of the model's own chat template.

Contract: ARCHITECTURE.md, 'engine.inference.thinking_settings'.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from engine.errors import EngineError
from engine.inference.reasoning import EFFORTS

if TYPE_CHECKING:
    from engine.inference.templates import ChatTemplate

OFF_VALUES = ("none", "no_think", "off", "disabled", "minimal")
"""Effort values that mean no thinking at all."""
EFFORT_SWITCHES = ("reasoning_effort", "thinking_effort", "reasoning_strength")
ON_OFF_BOOLS = ("enable_thinking", "thinking", "reasoning")


class Switch(Protocol):
    """A switch a template reads (``engine.inference.template_switches.Switch`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def values(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class ThinkingSettings:
    """What to render a turn with.

    Attributes:
        enable_thinking: the template's ``enable_thinking``, or None.
        reasoning_effort: its ``reasoning_effort`` (one of ``low``/``medium``/``high``), or None.
        switches: any other switch of the template by name (``thinking``, ``thinking_mode``,
            ``thinking_budget``, an effort of the template's own...).
    """

    enable_thinking: bool | None = None
    reasoning_effort: str | None = None
    switches: dict[str, object] = field(default_factory=dict)


def _find(names: Collection[str], switches: Sequence[Switch], name: str) -> Switch | None:
    found = next((s for s in switches if s.name == name), None)
    return found if found is not None or name not in names else _Named(name)


@dataclass(frozen=True)
class _Named:
    """A switch known by its name only (a template whose switches were found by their names)."""

    name: str
    kind: str = ""
    values: tuple[str, ...] = ()


def _effort_switch(names: Collection[str], switches: Sequence[Switch]) -> Switch | None:
    for name in EFFORT_SWITCHES:
        found = _find(names, switches, name)
        if found is not None:
            return found
    return None


def _text_value(switch: Switch, on: bool) -> str | None:
    """The value of a text switch meaning on or off (``enabled``/``disabled``, ``on``/``off``)."""
    words = ("enabled", "on", "true", "yes") if on else ("disabled", "off", "false", "no")
    return next((value for value in switch.values if value.lower() in words), None)


def thinking_controls_of(names: Collection[str], switches: Sequence[Switch]) -> frozenset[str]:
    """What a front end may offer for this template, in Glassbox's terms: ``enable_thinking`` (it can
    switch thinking on and off, under whatever name) and ``reasoning_effort`` (an effort level)."""
    found: set[str] = set()
    try:
        thinking_settings(names, switches, thinking=False)
        found.add("enable_thinking")
    except EngineError:
        pass
    if _effort_switch(names, switches) is not None:
        found.add("reasoning_effort")
    return frozenset(found)


def template_controls(template: ChatTemplate) -> frozenset[str]:
    """What a front end may offer for a loaded model's template (:func:`thinking_controls_of`)."""
    return thinking_controls_of(template.thinking, template.switches)


def thinking_settings(
    names: Collection[str],
    switches: Sequence[Switch],
    *,
    thinking: bool | None = None,
    reasoning_effort: str | None = None,
    thinking_budget: int | None = None,
) -> ThinkingSettings:
    """The template's values for a turn's thinking options (see the module docstring).

    Args:
        names: the names of the switches the template reads.
        switches: the switches themselves, with their kinds and values, where known.
        thinking: on, off, or None (the template's default).
        reasoning_effort: an effort level, or None.
        thinking_budget: the most thinking tokens, or None.

    Raises:
        EngineError: the template has no switch for what was asked, or not that effort.
    """
    enable: bool | None = None
    effort: str | None = None
    extra: dict[str, object] = {}
    effort_switch = _effort_switch(names, switches)
    if reasoning_effort is not None:
        if effort_switch is None:
            raise EngineError("this model's chat template has no reasoning_effort switch")
        allowed = tuple(dict.fromkeys([*EFFORTS, *(v for v in effort_switch.values if v.lower() not in OFF_VALUES)]))
        if reasoning_effort not in allowed:
            raise EngineError(f"reasoning_effort must be one of {', '.join(allowed)}, not {reasoning_effort!r}")
        if effort_switch.name == "reasoning_effort" and reasoning_effort in EFFORTS:
            effort = reasoning_effort
        else:
            extra[effort_switch.name] = reasoning_effort
    if thinking is not None:
        found = False
        for name in ON_OFF_BOOLS:
            switch = _find(names, switches, name)
            if switch is None or switch.kind not in ("", "bool"):
                continue
            found = True
            if name == "enable_thinking":
                enable = thinking
            else:
                extra[name] = thinking
        for name in ("thinking_mode", "thinking_option"):
            switch = _find(names, switches, name)
            value = _text_value(switch, thinking) if switch is not None else None
            if value is not None:
                extra[name] = value
                found = True
        budget_switch = _find(names, switches, "thinking_budget")
        if budget_switch is not None and budget_switch.kind in ("", "number") and not thinking:
            extra["thinking_budget"] = 0
            found = True
        if effort_switch is not None and reasoning_effort is None:
            off = next((v for v in effort_switch.values if v.lower() in OFF_VALUES), None)
            if off is not None:
                found = True
                if not thinking:
                    extra[effort_switch.name] = off
                else:  # a template whose default effort is none: an effort that thinks
                    on = [v for v in effort_switch.values if v.lower() not in OFF_VALUES]
                    extra[effort_switch.name] = "high" if "high" in on else on[0] if on else "high"
        if not found:
            raise EngineError("this model's chat template has no thinking switch (enable_thinking)")
    if thinking_budget is not None and thinking is not False:
        budget_switch = _find(names, switches, "thinking_budget")
        if budget_switch is not None and budget_switch.kind in ("", "number"):
            extra["thinking_budget"] = thinking_budget
    if "reasoning_effort" in extra and extra["reasoning_effort"] in EFFORTS:
        effort = str(extra.pop("reasoning_effort"))
    return ThinkingSettings(enable_thinking=enable, reasoning_effort=effort, switches=extra)
