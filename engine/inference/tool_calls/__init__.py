"""Streaming parsers of the tool-call formats that model families write.

A model asks for a tool by writing a call in its family's format; the parsers read the reply as it
streams and split it into text (which streams on as usual) and :class:`ParsedCall` objects (each
emitted once, when the call is complete). The formats, as the chat templates published with
llama.cpp write them (``FORMATS`` in :mod:`.formats` holds each one's markup):

JSON arguments (:mod:`.json_calls`)
    ``hermes`` ``<tool_call>{"name", "arguments"}</tool_call>`` (Qwen 2.5/3, QwQ, Hermes 2/3, MiMo,
    Granite 4, Bielik, Reka); ``llama3`` a bare ``{"name", "parameters"}`` or ``<|python_tag|>``
    (Llama 3.1-3.3; 3.2's ``[f(a=1)]``); ``mistral`` ``[TOOL_CALLS][{...}]`` and
    ``[TOOL_CALLS]NAME[CALL_ID]id[ARGS]{...}``; ``deepseek`` ``<｜tool▁calls▁begin｜>...`` (V3, R1,
    V3.1); ``kimi_k2`` ``<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}``;
    ``functionary_v31`` ``<function=NAME>{...}</function>``; ``firefunction`` `` functools[...]``;
    ``cohere`` ``<|START_ACTION|>[...]<|END_ACTION|>`` (Command R7B, Command A); ``command_r_plus``
    ``Action:`` and a JSON fence; ``nemotron`` ``<TOOLCALL>[...]``; ``apriel`` and ``minimax_m1``
    ``<tool_calls>[...]``; ``granite`` ``<|tool_call|>[...]`` (3.3); ``gigachat``; ``apertus``
    ``<|tools_prefix|>[{"NAME": {...}}]``; ``solar``.
Arguments between tags, typed by the tool's schema (:mod:`.xml_calls`)
    ``qwen_xml`` ``<tool_call><function=NAME><parameter=KEY>...`` (Qwen3-Coder, Qwen3.5, Nemotron 3,
    StepFun); ``seed_xml`` the same inside ``<seed:tool_call>``; ``glm``
    ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>`` (GLM 4.5-4.7, Spark, Ling,
    Laguna); ``hunyuan``; ``minimax_m2`` ``<minimax:tool_call><invoke name=...><parameter name=...>``;
    ``dsml`` the same in DeepSeek V3.2/V4's ``<｜DSML｜...>`` tags; ``minimax_m3``; ``minicpm``.
Python and Gemma syntax (:mod:`.python_calls`)
    ``lfm2`` ``<|tool_call_start|>[f(a=1)]<|tool_call_end|>``; ``gemma4``
    ``<|tool_call>call:NAME{k:<|"|>v<|"|>}<tool_call|>``; ``gemma`` a ``tool_code`` fence.
Whole-reply structures
    ``harmony`` (gpt-oss) and ``muse`` (:mod:`engine.inference.harmony`), ``kimi_k3``
    (:mod:`.kimi_k3`), ``functionary_v32`` (:mod:`.functionary`): their splitters also separate the
    thinking.
``json``
    the generic fallback, and the format of grammar-constrained calls and of the fallback tool
    prompt in :mod:`engine.inference.tool_prompt`: a reply that is one JSON object
    ``{"name", "arguments"}`` (also fenced, or a list, or ``{"tool_calls": [...]}``), and Hermes
    blocks.

Which format a template writes is found from the template's own rendering of a call
(:func:`detect_family`, :mod:`.detect`).

Public API: :class:`ToolCallParser` (``feed(text) -> list[Piece]``, ``finish() -> list[Piece]``),
:func:`parse_tool_calls` (a whole text at once), :func:`detect_family`, :data:`FAMILIES`,
:data:`FORMATS`, :func:`call_markers` (every control token the formats use).
"""

from __future__ import annotations

from engine.inference.tool_calls.call import (
    INCOMPLETE,
    MAX_CALL_CHARS,
    ParsedCall,
    Piece,
    Schemas,
    SplitPiece,
    partial_suffix,
)
from engine.inference.tool_calls.detect import detect_family
from engine.inference.tool_calls.formats import FAMILIES, FORMATS, CallFormat, Family
from engine.inference.tool_calls.json_calls import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_SEP,
    LLAMA_PYTHON_TAG,
    MISTRAL_CALLS,
)
from engine.inference.tool_calls.kimi_k3 import MARKERS as KIMI_K3_MARKERS
from engine.inference.tool_calls.stream import ToolCallParser, parse_tool_calls


def call_markers() -> tuple[str, ...]:
    """Every control token the call formats use (a vocabulary may hold each as one special token)."""
    found = [marker for fmt in FORMATS.values() for marker in fmt.all_markers()]
    return tuple(dict.fromkeys([*found, *KIMI_K3_MARKERS, ">>>"]))


__all__ = [
    "DS_CALLS_BEGIN",
    "DS_CALLS_END",
    "DS_CALL_BEGIN",
    "DS_CALL_END",
    "DS_SEP",
    "FAMILIES",
    "FORMATS",
    "INCOMPLETE",
    "LLAMA_PYTHON_TAG",
    "MAX_CALL_CHARS",
    "MISTRAL_CALLS",
    "CallFormat",
    "Family",
    "ParsedCall",
    "Piece",
    "Schemas",
    "SplitPiece",
    "ToolCallParser",
    "call_markers",
    "detect_family",
    "parse_tool_calls",
    "partial_suffix",
]
