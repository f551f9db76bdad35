"""Every chat template llama.cpp publishes gets the call parser of the format it writes, or none.

The templates are read from the pinned llama-cpp-python sdist (``llama_cpp_source``). Each is
rendered by transformers' reference renderer with a conversation in which the assistant called a
probe tool, and :func:`~engine.inference.tool_calls.detect_family` is given that rendering, as
:func:`~engine.inference.templates.select_template` gives it Glassbox's own. The expected format of
each template was read from the template itself; the test also checks that the format's markers
are in the template or its rendering, so no template falls into a parser of another format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.inference.reasoning import THINK_FORMATS, detect_thinking
from engine.inference.templates import select_template
from engine.inference.tool_calls import FORMATS, detect_family

PROBE = "glassbox_probe_tool"
VALUE = "glassbox-probe-value"
ASK = "Look up the word."
RESULT = "glassbox probe result 7491"
TOOL = {
    "type": "function",
    "function": {
        "name": PROBE,
        "description": "Looks up a word.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "description": "The word."}},
            "required": ["word"],
        },
    },
}

# template file -> (call format, thinking format); None: the template renders no calls Glassbox reads
EXPECTED: dict[str, tuple[str | None, str]] = {
    "Apertus-8B-Instruct.jinja": ("apertus", "apertus"),
    "Apriel-1.6-15b-Thinker-fixed.jinja": ("apriel", "apriel"),
    "Bielik-11B-v3.0-Instruct.jinja": ("hermes", "think"),
    "ByteDance-Seed-OSS.jinja": ("seed_xml", "seed"),
    "Cohere2MoE.jinja": ("cohere", "cohere"),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": ("command_r_plus", "think"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("cohere", "cohere"),
    "GLM-4.6.jinja": ("glm", "think"),
    "GLM-4.7-Flash.jinja": ("glm", "think"),
    "GigaChat3-10B-A1.8B.jinja": ("gigachat", "think"),
    "GigaChat3.1-10B-A1.8B.jinja": ("gigachat", "think"),
    "HuggingFaceTB-SmolLM3-3B.jinja": (None, "think"),
    "Kimi-K2-Instruct.jinja": ("kimi_k2", "think"),
    "Kimi-K2-Thinking.jinja": ("kimi_k2", "think"),
    "Kimi-K3.jinja": ("kimi_k3", "think"),
    "LFM2-8B-A1B.jinja": ("lfm2", "think"),
    "LFM2.5-8B-A1B.jinja": ("lfm2", "think"),
    "LFM2.5-Instruct.jinja": ("lfm2", "think"),
    "MiMo-VL.jinja": ("hermes", "think"),
    "MiniMax-M1.jinja": ("minimax_m1", "think"),
    "MiniMax-M2.jinja": ("minimax_m2", "think"),
    "MiniMax-M3.jinja": ("minimax_m3", "minimax_m3"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("mistral", "think"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("qwen_xml", "think"),
    "NVIDIA-Nemotron-Nano-v2.jinja": ("nemotron", "think"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("hermes", "think"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("hermes", "think"),
    "Qwen-QwQ-32B.jinja": ("hermes", "think"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes", "think"),
    "Qwen-Qwen3-0.6B.jinja": ("hermes", "think"),
    "Qwen3-Coder.jinja": ("qwen_xml", "think"),
    "Qwen3.5-4B.jinja": ("qwen_xml", "think"),
    "Reka-Edge.jinja": ("hermes", "think"),
    "Spark2.5.jinja": ("glm", "think"),
    "StepFun3.5-Flash.jinja": ("qwen_xml", "think"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("deepseek", "think"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("deepseek", "think"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek", "think"),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("dsml", "think"),
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": ("dsml", "think"),
    "deepseek-ai-DeepSeek-V4.jinja": ("dsml", "think"),
    "fireworks-ai-llama-3-firefunction-v2.jinja": ("firefunction", "think"),
    "google-gemma-2-2b-it.jinja": (None, "think"),
    "google-gemma-4-31B-it-interleaved.jinja": ("gemma4", "gemma4"),
    "google-gemma-4-31B-it.jinja": ("gemma4", "gemma4"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("granite", "granite"),
    "ibm-granite-granite-4.0.jinja": ("hermes", "think"),
    "ibm-granite-granite-4.1.jinja": ("hermes", "think"),
    "inclusionai-ling-3.0-flash.jinja": ("glm", "think"),
    "llama-cpp-deepseek-r1.jinja": ("deepseek", "think"),
    "llama-cpp-rwkv-world.jinja": (None, "think"),
    "meetkai-functionary-medium-v3.1.jinja": ("functionary_v31", "think"),
    "meetkai-functionary-medium-v3.2.jinja": ("functionary_v32", "think"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3", "think"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3", "think"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("llama3", "think"),
    "microsoft-Phi-3.5-mini-instruct.jinja": (None, "think"),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("mistral", "mistral"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", "think"),
    "moonshotai-Kimi-K2.jinja": ("kimi_k2", "think"),
    "muse-glimmer.jinja": ("muse", "think"),
    "openai-gpt-oss-120b.jinja": ("harmony", "think"),
    "openbmb-MiniCPM5-1B.jinja": ("minicpm", "think"),
    "poolside-Laguna-S-2.1.jinja": ("glm", "think"),
    "poolside-Laguna-XS-2.1.jinja": ("glm", "think"),
    "poolside-Laguna-XS.2.jinja": ("glm", "think"),
    "tencent-Hy3.jinja": ("hunyuan", "hunyuan"),
    "unsloth-Apriel-1.5.jinja": ("apriel", "apriel"),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("mistral", "think"),
    "upstage-Solar-Open-100B.jinja": ("solar", "solar"),
}


def _templates() -> list[str]:
    return sorted(EXPECTED)


def _reference_rendering(source: str) -> str | None:
    """transformers' rendering of the probe call, from the question to the result; None if it
    cannot render one (a template that wants arguments as text is given them so)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    for arguments in ({"word": VALUE}, json.dumps({"word": VALUE})):
        call = {"id": "call00001", "type": "function", "function": {"name": PROBE, "arguments": arguments}}
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": RESULT, "tool_call_id": "call00001", "name": PROBE},
        ]
        try:
            rendered = render_jinja_template(
                [messages], tools=[TOOL], chat_template=source, add_generation_prompt=True, bos_token="<s>"
            )[0][0]
        except Exception:  # noqa: BLE001 - a template the reference cannot render with this shape
            continue
        _, ask, tail = rendered.rpartition(ASK)
        if ask and RESULT in tail:
            return tail.split(RESULT)[0]
    return None


def test_the_table_lists_every_published_template(llama_cpp_source: Path) -> None:
    found = sorted(p.name for p in (llama_cpp_source / "models" / "templates").glob("*.jinja"))
    assert found == _templates()


@pytest.mark.parametrize("name", _templates())
def test_each_template_gets_the_parser_of_the_format_it_writes(llama_cpp_source: Path, name: str) -> None:
    source = (llama_cpp_source / "models" / "templates" / name).read_text(encoding="utf-8")
    rendered = _reference_rendering(source)
    family, think = EXPECTED[name]
    found = detect_family(source, rendered=rendered, probe_name=PROBE, probe_arguments={"word": VALUE})
    assert found == family
    assert detect_thinking(source, rendered) == think
    seen = source + (rendered or "")
    if family is not None:
        fmt = FORMATS[family]
        markers = [m.strip() for block in fmt.blocks for m in (block.open, block.close) if m]
        signed = any(all(marker in seen for marker in signature) for signature in fmt.signatures)
        assert signed or any(marker in seen for marker in markers), f"no {family} marker in {name}"
    spec = THINK_FORMATS[think]
    assert think == "think" or all(marker in seen for marker in spec.signatures[:1])


@pytest.mark.parametrize("name", _templates())
def test_select_template_gives_the_same_format_or_the_fallback_prompt(llama_cpp_source: Path, name: str) -> None:
    source = (llama_cpp_source / "models" / "templates" / name).read_text(encoding="utf-8")
    template = select_template(source, "llama", "<s>", "</s>")
    family, think = EXPECTED[name]
    if template.supports_tools:
        assert template.tool_family == family  # never another format's parser
    if family is None:
        assert not template.supports_tools  # the fallback JSON prompt, a format Glassbox reads
    if template.source == "gguf":
        assert template.think_format == think
