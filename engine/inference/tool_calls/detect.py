"""Which call format a chat template writes, from the template itself.

The template's own rendering of a call decides: the template renders a conversation in which the
assistant called a probe tool (:func:`engine.inference.templates.select_template` does, to see
whether it renders tools at all), and the format whose parser reads that probe call back from the
rendering, name and arguments alike, is the one the model was trained on. When several read it
(a Hermes block is also a bare JSON object), the one whose markers the template holds wins.

Contract: ARCHITECTURE.md, 'engine.inference.tool_calls.detect'.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from engine.inference.tool_calls.call import ParsedCall, call_from_object
from engine.inference.tool_calls.formats import FORMATS, CallFormat, Family
from engine.inference.tool_calls.functionary import SEPARATOR
from engine.inference.tool_calls.kimi_k3 import parse_calls as kimi_k3_calls
from engine.inference.tool_calls.xml_calls import atem

_SCAN_LIMIT = 4096
"""How far past an opening marker a call that runs to the end of the reply is looked for."""


def detect_family(
    template_text: str | None,
    architecture: str = "",
    *,
    rendered: str | None = None,
    probe_name: str = "",
    probe_arguments: Mapping[str, Any] | None = None,
) -> Family | None:
    """The call format a template writes (see the module docstring).

    Args:
        template_text: the model's Jinja chat template.
        architecture: ``general.architecture``; unused (the template decides, not the architecture).
        rendered: the template's rendering of a conversation where the assistant called
            ``probe_name`` with ``probe_arguments`` (and the call's result followed); None when it
            could not render one.
        probe_name: the probe call's function.
        probe_arguments: the probe call's arguments (one of them a string found nowhere else in
            the rendering, so that a rendering that shows it is known to show the call).

    Returns:
        The family, or None when the template's calls are in no format Glassbox reads (or it has
        no template).
    """
    del architecture
    text = template_text or ""
    if not text.strip():
        return None
    if rendered and probe_name:
        arguments = dict(probe_arguments or {})
        readers = [fmt for fmt in FORMATS.values() if _reads(fmt, rendered, probe_name, arguments)]
        if readers:
            return next((fmt.name for fmt in readers if _signed(fmt, text)), readers[0].name)
        if _shows_call(rendered, arguments):
            return None  # the template writes its calls in a syntax no parser here reads
    return next((fmt.name for fmt in FORMATS.values() if _signed(fmt, text)), None)


def _signed(fmt: CallFormat, template_text: str) -> bool:
    return any(all(marker in template_text for marker in signature) for signature in fmt.signatures)


def _shows_call(rendered: str, arguments: Mapping[str, Any]) -> bool:
    """Whether the rendering holds the probe's string arguments (so the template renders calls)."""
    strings = [value for value in arguments.values() if isinstance(value, str) and len(value) >= 8]
    return bool(strings) and all(value in rendered for value in strings)


def _reads(fmt: CallFormat, rendered: str, name: str, arguments: dict[str, Any]) -> bool:
    """Whether the format's parser reads the probe call back from the rendering."""
    schemas = {name: {"type": "object", "properties": {key: {} for key in arguments}}}
    return any(call.name == name and call.arguments == arguments for call in _calls(fmt, rendered, name, schemas))


def _calls(fmt: CallFormat, rendered: str, name: str, schemas: Mapping[str, Any]) -> Iterator[ParsedCall]:
    if fmt.kind == "harmony":
        yield from _harmony_calls(rendered, name)
    elif fmt.kind == "muse":
        marker = f"to={name}<|message|>"
        for at in _occurrences(rendered, marker):
            body = rendered[at + len(marker) :].split("<|eot|>")[0].split("<|eom|>")[0].strip()
            body = body.removeprefix("<atem:function_calls>").split("</atem:function_calls>")[0]
            found = atem(body, body, schemas)
            if isinstance(found, list):
                yield from found
    elif fmt.kind == "kimi_k3":
        for at in _occurrences(rendered, "<|open|>tools<|sep|>"):
            body = rendered[at + len("<|open|>tools<|sep|>") :].split("<|close|>tools<|sep|>")[0]
            yield from kimi_k3_calls(body, schemas) or ()
    elif fmt.kind == "functionary_v32":
        for at in _occurrences(rendered, f"{SEPARATOR}{name}\n"):
            start = at + len(SEPARATOR) + len(name) + 1
            yield from _json_objects_at(rendered, start, name)
    else:
        for block in fmt.blocks:
            yield from _block_calls(block, rendered, schemas)
        if fmt.bare is not None:
            for at in _occurrences(rendered, "{"):
                found = _json_at(rendered, at)
                call = call_from_object(found, "") if found is not None else None
                if call is not None:
                    yield call


def _block_calls(block: Any, rendered: str, schemas: Mapping[str, Any]) -> Iterator[ParsedCall]:
    for at in _occurrences(rendered, block.open):
        start = at if block.keep_open else at + len(block.open)
        if block.close is not None:
            end = rendered.find(block.close, start + (len(block.open) if block.keep_open else 0))
            while end >= 0:
                found = block.parse(rendered[start:end], "", schemas)
                if isinstance(found, list):
                    yield from found
                    break
                end = rendered.find(block.close, end + 1)
            continue
        # A call that runs to the end of the reply: the shortest text after the marker that parses.
        window = rendered[start : start + _SCAN_LIMIT]
        for cut in range(1, len(window) + 1):
            if window[cut - 1] in "}])\n" or cut == len(window):
                found = block.parse(window[:cut], "", schemas)
                if isinstance(found, list):
                    yield from found
                    break


def _harmony_calls(rendered: str, name: str) -> Iterator[ParsedCall]:
    marker = f"to=functions.{name}"
    for at in _occurrences(rendered, marker):
        message = rendered.find("<|message|>", at)
        if message < 0:
            continue
        yield from _json_objects_at(rendered, message + len("<|message|>"), name)


def _json_objects_at(text: str, at: int, name: str) -> Iterator[ParsedCall]:
    found = _json_at(text, at)
    if isinstance(found, dict):
        yield ParsedCall(name, found, "")


def _json_at(text: str, at: int) -> Any:
    try:
        value, _ = json.JSONDecoder().raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
    except (json.JSONDecodeError, RecursionError, IndexError):
        return None
    return value


def _occurrences(text: str, marker: str) -> Iterator[int]:
    at = text.find(marker)
    while at >= 0:
        yield at
        at = text.find(marker, at + 1)
