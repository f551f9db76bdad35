"""Streaming parsers of the tool-call formats that model families write.

Contract: ARCHITECTURE.md, 'engine.inference.tool_calls'.
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
