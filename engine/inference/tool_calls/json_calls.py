"""Body parsers of the formats whose arguments are JSON: the text between a call's opening and
closing markers (or up to the end of the reply) becomes calls.

Each function takes ``(body, raw)``: ``body`` the text inside the markup, ``raw`` the whole markup
(kept as the call's ``raw`` when it holds one call), and returns calls, ``INCOMPLETE`` or None
(see :mod:`engine.inference.tool_calls.call`).
"""

from __future__ import annotations

import json
import re

from engine.inference.tool_calls.call import (
    INCOMPLETE,
    Parsed,
    ParsedCall,
    arguments_object,
    calls_from_json,
    open_json,
    single_raw,
)
from engine.inference.tool_calls.python_calls import python_calls

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"

MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"
LLAMA_PYTHON_TAG = "<|python_tag|>"

KIMI_SECTION_BEGIN = "<|tool_calls_section_begin|>"
KIMI_SECTION_END = "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN = "<|tool_call_begin|>"
KIMI_ARGS_BEGIN = "<|tool_call_argument_begin|>"
KIMI_CALL_END = "<|tool_call_end|>"

SOLAR_CALL_BEGIN = "<|tool_call:begin|>"
SOLAR_NAME = "<|tool_call:name|>"
SOLAR_ARGS = "<|tool_call:args|>"
SOLAR_CALL_END = "<|tool_call:end|>"

_FENCE = re.compile(r"```(?:json)?\s*\n?(.*?)\n?\s*```", re.DOTALL)


def json_block(body: str, raw: str) -> Parsed:
    """One or more JSON call objects (or a list of them): Hermes, Nemotron, Apriel, Cohere, ..."""
    return calls_from_json(body, raw)


def name_keyed_block(body: str, raw: str) -> Parsed:
    """Apertus: ``[{"NAME": {arguments}}, ...]``."""
    return calls_from_json(body, raw, name_as_key=True)


def fenced_json(body: str, raw: str) -> Parsed:
    """JSON calls, perhaps inside a Markdown fence (Command R+'s ``Action:`` block)."""
    text = body.strip()
    fenced = _FENCE.fullmatch(text)
    if fenced:
        return calls_from_json(fenced.group(1), raw)
    if text.startswith("```"):
        return INCOMPLETE if "```" not in text[3:] else None
    return calls_from_json(text, raw)


def llama_tagged(body: str, raw: str) -> Parsed:
    """After Llama's ``<|python_tag|>``: JSON calls, or a Python call (a built-in tool's)."""
    found = calls_from_json(body, raw)
    if isinstance(found, list):
        return found
    pythonic = python_calls(body, raw)
    return pythonic if isinstance(pythonic, list) else found


def functionary_v31(body: str, raw: str) -> Parsed:
    """Functionary v3.1: ``<function=NAME>{arguments}</function>`` (the body is ``NAME>{...}``)."""
    name, sep, arguments_text = body.partition(">")
    name = name.strip()
    if not sep:
        return INCOMPLETE if re.fullmatch(r"[\w.\-]*", name) else None
    if not re.fullmatch(r"[\w.\-]+", name):
        return None
    arguments = arguments_object(arguments_text.strip())
    if arguments is None:
        return INCOMPLETE if open_json(arguments_text.strip()) else None
    return [ParsedCall(name, arguments, raw)]


def python_tag_code(body: str, raw: str) -> Parsed:
    """Functionary v3.1's ``<|python_tag|>code``: a call of the ``python`` tool with that code."""
    code = body.strip()
    return [ParsedCall("python", {"code": code}, raw)] if code else None


def mistral(body: str, raw: str) -> Parsed:
    """After ``[TOOL_CALLS]`` (to the end of the reply): a JSON list (v3 tokenizers), or
    ``NAME[ARGS]{...}`` / ``NAME[CALL_ID]id[ARGS]{...}``, several separated by ``[TOOL_CALLS]``
    (read in order, so an argument may hold ``[TOOL_CALLS]`` itself)."""
    decoder = json.JSONDecoder()
    calls: list[ParsedCall] = []
    at, end = 0, len(body)
    while True:
        while at < end and body[at] in " \t\r\n":
            at += 1
        if at >= end:
            break
        if body.startswith(MISTRAL_CALLS, at):
            at += len(MISTRAL_CALLS)
            continue
        start = at
        try:
            if body[at] == "[":
                value, at = decoder.raw_decode(body, at)
                found = calls_from_json(json.dumps(value), body[start:at])
                if not isinstance(found, list):
                    return None
                calls.extend(found)
                continue
            args_at = body.find(MISTRAL_ARGS, at)
            if args_at < 0:
                return INCOMPLETE if re.fullmatch(r"[\w.\-]*(\[CALL_ID\]\w*)?", body[at:].strip()) else None
            name = body[at:args_at].split(MISTRAL_CALL_ID)[0].strip()
            at = args_at + len(MISTRAL_ARGS)
            at += len(body[at:]) - len(body[at:].lstrip())
            value, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            return INCOMPLETE if open_json(body[at:].strip()) else None
        except RecursionError:
            return None
        arguments = arguments_object(value)
        if not re.fullmatch(r"[\w.\-]+", name) or arguments is None:
            return None
        calls.append(ParsedCall(name, arguments, MISTRAL_CALLS + body[start:at]))
    return single_raw(calls, raw) if calls else None


_DS_CALL = re.compile(
    re.escape(DS_CALL_BEGIN) + r"(.*?)" + re.escape(DS_SEP) + r"(.*?)" + re.escape(DS_CALL_END), re.DOTALL
)


def deepseek(body: str, raw: str) -> Parsed:
    """DeepSeek V3/R1 (``function<sep>NAME\\n```json\\n{...}\\n```), V3.1 (``NAME<sep>{...}``)."""
    calls: list[ParsedCall] = []
    rest = body
    for match in _DS_CALL.finditer(body):
        head, text = match.group(1).strip(), match.group(2)
        if head == "function":
            name, _, text = text.partition("\n")
        else:
            name = head
        text = text.strip()
        fenced = _FENCE.fullmatch(text)
        arguments = arguments_object(fenced.group(1) if fenced else text)
        if not name.strip() or arguments is None:
            return None
        calls.append(ParsedCall(name.strip(), arguments, match.group(0)))
        rest = rest.replace(match.group(0), "", 1)
    if rest.strip():
        return INCOMPLETE if DS_CALL_BEGIN in rest else None
    return single_raw(calls, raw) if calls else None


_KIMI_ID = re.compile(r"\s*(?:functions\.)?([\w.\-]+?)(?::\d+)?\s*")


def kimi_k2(body: str, raw: str) -> Parsed:
    """Kimi K2: ``<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|>``
    for each call, read in order (the closing markers may be missing; an argument may hold them)."""
    decoder = json.JSONDecoder()
    text = body.strip().removeprefix(KIMI_SECTION_BEGIN).removesuffix(KIMI_SECTION_END)
    calls: list[ParsedCall] = []
    at = 0
    while True:
        at += len(text[at:]) - len(text[at:].lstrip())
        if at >= len(text):
            break
        if not text.startswith(KIMI_CALL_BEGIN, at):
            return None
        start = at
        args_at = text.find(KIMI_ARGS_BEGIN, at)
        if args_at < 0:
            return INCOMPLETE
        match = _KIMI_ID.fullmatch(text, at + len(KIMI_CALL_BEGIN), args_at)
        if match is None:
            return None
        at = args_at + len(KIMI_ARGS_BEGIN)
        at += len(text[at:]) - len(text[at:].lstrip())
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return INCOMPLETE if not text[at:].strip() or open_json(text[at:].strip()) else None
        except RecursionError:
            return None
        arguments = arguments_object(value)
        if arguments is None:
            return None
        rest = text[at:].lstrip()
        at = len(text) - len(rest)
        if rest.startswith(KIMI_CALL_END):
            at += len(KIMI_CALL_END)
        calls.append(ParsedCall(match.group(1), arguments, text[start:at]))
    return single_raw(calls, raw) if calls else None


def solar(body: str, raw: str) -> Parsed:
    """Solar Open: ``<|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{...}<|tool_call:end|>``."""
    calls: list[ParsedCall] = []
    parts = body.split(SOLAR_CALL_BEGIN)
    if parts[0].strip():
        return None
    for part in parts[1:]:
        _, sep, rest = part.partition(SOLAR_NAME)
        name, sep2, args_text = rest.partition(SOLAR_ARGS)
        if not sep or not sep2:
            return INCOMPLETE
        args_text, _, _ = args_text.partition(SOLAR_CALL_END)
        arguments = arguments_object(args_text.strip())
        if not name.strip() or arguments is None:
            return INCOMPLETE if open_json(args_text.strip()) else None
        calls.append(ParsedCall(name.strip(), arguments, SOLAR_CALL_BEGIN + part))
    return single_raw(calls, raw) if calls else None


def bare_json(body: str, raw: str) -> Parsed:
    """A reply that is only calls: JSON (perhaps fenced) or, for Llama 3.2, a Python-style list."""
    text = body.strip()
    fenced = _FENCE.fullmatch(text)
    if fenced:
        text = fenced.group(1)
    found = calls_from_json(text, raw)
    if isinstance(found, list):
        return found
    pythonic = python_calls(text, raw) if text.startswith("[") else None
    return pythonic if isinstance(pythonic, list) else None


def python_or_json(body: str, raw: str) -> Parsed:
    """Gemma's ``tool_code`` block: Python calls, or JSON ones."""
    pythonic = python_calls(body, raw)
    if isinstance(pythonic, list):
        return pythonic
    found = calls_from_json(body, raw)
    return found if isinstance(found, list) else pythonic
