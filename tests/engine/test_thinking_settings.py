"""A turn's thinking options in each template's own switches (engine/inference/thinking_settings.py).

The switches are written as the template's own syntax names them (the variable, its kind, the
strings it compares it with), for the templates llama.cpp publishes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.inference.thinking_settings import (
    ThinkingSettings,
    template_controls,
    thinking_controls_of,
    thinking_settings,
)


@dataclass(frozen=True)
class S:
    name: str
    kind: str = "bool"
    values: tuple[str, ...] = ()


QWEN3 = (S("enable_thinking"),)
DEEPSEEK_V4 = (S("thinking"), S("enable_thinking"), S("reasoning_effort", "text", ("max",)))
KIMI_K3 = (S("thinking"), S("thinking_effort", "text", ("low", "high", "max")))
MINIMAX_M3 = (S("thinking_mode", "text", ("enabled", "disabled", "adaptive")),)
SEED_OSS = (S("thinking_budget", "number"),)
HUNYUAN = (S("reasoning_effort", "text", ("high", "low", "no_think")),)
GPT_OSS = (S("reasoning_effort", "text"),)
COMMAND_A = (S("reasoning"), S("reasoning_effort", "text", ("none",)))
LING = (S("enable_thinking"), S("thinking_option", "text", ("on", "off")))


def _names(switches: tuple[S, ...]) -> frozenset[str]:
    return frozenset(s.name for s in switches)


@pytest.mark.parametrize(
    ("switches", "thinking", "expected"),
    [
        (QWEN3, False, ThinkingSettings(enable_thinking=False)),
        (DEEPSEEK_V4, True, ThinkingSettings(enable_thinking=True, switches={"thinking": True})),
        (KIMI_K3, False, ThinkingSettings(switches={"thinking": False})),
        (MINIMAX_M3, True, ThinkingSettings(switches={"thinking_mode": "enabled"})),
        (MINIMAX_M3, False, ThinkingSettings(switches={"thinking_mode": "disabled"})),
        (SEED_OSS, False, ThinkingSettings(switches={"thinking_budget": 0})),
        (HUNYUAN, False, ThinkingSettings(switches={"reasoning_effort": "no_think"})),
        (HUNYUAN, True, ThinkingSettings(reasoning_effort="high")),
        (COMMAND_A, False, ThinkingSettings(switches={"reasoning": False, "reasoning_effort": "none"})),
        (LING, False, ThinkingSettings(enable_thinking=False, switches={"thinking_option": "off"})),
    ],
)
def test_thinking_on_or_off_in_the_templates_own_switch(
    switches: tuple[S, ...], thinking: bool, expected: ThinkingSettings
) -> None:
    assert thinking_settings(_names(switches), switches, thinking=thinking) == expected


def test_efforts_go_to_the_templates_effort_switch_with_its_own_values() -> None:
    assert thinking_settings(_names(GPT_OSS), GPT_OSS, reasoning_effort="low") == ThinkingSettings(
        reasoning_effort="low"
    )
    assert thinking_settings(_names(DEEPSEEK_V4), DEEPSEEK_V4, reasoning_effort="max") == ThinkingSettings(
        switches={"reasoning_effort": "max"}
    )
    assert thinking_settings(_names(KIMI_K3), KIMI_K3, reasoning_effort="high") == ThinkingSettings(
        switches={"thinking_effort": "high"}
    )
    with pytest.raises(EngineError, match="reasoning_effort must be one of low, medium, high, max"):
        thinking_settings(_names(DEEPSEEK_V4), DEEPSEEK_V4, reasoning_effort="extreme")
    with pytest.raises(EngineError, match="no reasoning_effort switch"):
        thinking_settings(_names(QWEN3), QWEN3, reasoning_effort="low")


def test_a_budget_reaches_a_template_that_reads_one() -> None:
    assert thinking_settings(_names(SEED_OSS), SEED_OSS, thinking_budget=512) == ThinkingSettings(
        switches={"thinking_budget": 512}
    )
    assert thinking_settings(_names(QWEN3), QWEN3, thinking_budget=512) == ThinkingSettings()  # Glassbox caps it


def test_a_template_without_a_switch_says_so_and_offers_none() -> None:
    with pytest.raises(EngineError, match="no thinking switch"):
        thinking_settings(frozenset(), (), thinking=True)
    assert thinking_controls_of(frozenset(), ()) == frozenset()
    assert thinking_controls_of(_names(KIMI_K3), KIMI_K3) == {"enable_thinking", "reasoning_effort"}
    assert thinking_controls_of(_names(MINIMAX_M3), MINIMAX_M3) == {"enable_thinking"}
    assert thinking_controls_of(_names(GPT_OSS), GPT_OSS) == {"reasoning_effort"}  # no effort means "off"


def test_switches_known_by_name_only() -> None:
    names = frozenset({"enable_thinking", "reasoning_effort"})
    assert thinking_settings(names, (), thinking=True, reasoning_effort="medium") == ThinkingSettings(
        enable_thinking=True, reasoning_effort="medium"
    )


def test_a_loaded_templates_controls(llama_cpp_source: Path) -> None:
    from engine.inference.templates import select_template

    folder = llama_cpp_source / "models" / "templates"
    qwen3 = select_template((folder / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8"), "qwen3", "", "")
    assert template_controls(qwen3) == {"enable_thinking"}
    oss = select_template((folder / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8"), "gpt-oss", "", "")
    assert template_controls(oss) == {"reasoning_effort"}
    llama = select_template(
        (folder / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(encoding="utf-8"), "llama", "", ""
    )
    assert template_controls(llama) == frozenset()
