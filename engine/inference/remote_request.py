"""The body of a streamed ``/v1/chat/completions`` request, in OpenAI's terms (for :mod:`engine.inference.remote`).

What a turn asks for goes to the server as OpenAI documents it: the messages (the ``tool`` role with
its ``tool_call_id``, an assistant's ``tool_calls``), sampling, ``stop``, ``seed``, ``logit_bias``
(clamped to OpenAI's -100..100), ``logprobs``, a ``json_schema`` as ``response_format``, the tools
(:class:`~engine.inference.tools.ToolSpec`) and ``tool_choice``, the thinking switch as
``chat_template_kwargs.enable_thinking`` (llama.cpp, vLLM) and ``reasoning_effort`` as is. llama.cpp's
family (a server with a tokenizer endpoint) also gets ``top_k``, ``min_p``, ``repeat_penalty`` and a
GBNF ``grammar``; strict servers reject unknown fields, and a grammar for one of them is an
EngineError.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from engine.errors import EngineError
from engine.inference.context import Message
from engine.inference.reasoning import strip_reasoning
from engine.inference.runtime import GenerationParams
from engine.inference.tools import ToolSpec
from engine.media import Media


def chat_payload(
    model: str, messages: Sequence[Message], params: GenerationParams, *, llama_family: bool, base_url: str
) -> dict[str, Any]:
    """The request body for ``messages`` under ``params`` (streamed, with the usage chunk).

    Args:
        model: the model id to ask for.
        messages: the prompt's messages (system, history, the new user message).
        params: the sampling and the constraints.
        llama_family: the server is llama.cpp's or llama-cpp-python's (reads their extra fields).
        base_url: the server, for the error's message.

    Raises:
        EngineError: a GBNF grammar for a server outside llama.cpp's family.
    """
    payload: dict[str, Any] = {
        "model": model,
        "messages": [wire_message(m) for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if llama_family:
        # llama.cpp's family reads these too; strict servers (OpenAI's own) reject unknown fields.
        payload.update(top_k=params.top_k, min_p=params.min_p, repeat_penalty=params.repeat_penalty)
    for name in ("frequency_penalty", "presence_penalty"):  # OpenAI's own fields: every server reads them
        if getattr(params, name):
            payload[name] = getattr(params, name)
    if llama_family and (params.typical_p != 1.0 or params.mirostat):
        payload.update(typical_p=params.typical_p)
        if params.mirostat:
            payload.update(mirostat=params.mirostat, mirostat_tau=params.mirostat_tau, mirostat_eta=params.mirostat_eta)
    elif params.typical_p != 1.0 or params.mirostat:
        raise EngineError(f"{base_url}: typical_p and mirostat are llama.cpp's samplers; this server has neither")
    if params.seed is not None:
        payload["seed"] = params.seed
    if params.stop:
        payload["stop"] = list(params.stop)
    if params.logit_bias:
        # OpenAI's range is -100..100, and -100 bans the token (the engine bans with -inf).
        payload["logit_bias"] = {str(t): max(-100.0, min(100.0, b)) for t, b in params.logit_bias}
    if params.logprobs:
        payload.update(logprobs=True, top_logprobs=params.logprobs)
    if params.json_schema is not None:
        schema = json.loads(params.json_schema)
        if schema == {"type": "object"}:
            payload["response_format"] = {"type": "json_object"}
        else:
            payload["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    if params.grammar is not None:
        if not llama_family:
            raise EngineError(
                f"{base_url}: this server takes no GBNF grammar (only llama.cpp's family does); "
                "use a JSON schema instead"
            )
        payload["grammar"] = params.grammar
    return payload


def add_turn_options(
    payload: dict[str, Any],
    tools: Sequence[ToolSpec],
    choice: str,
    thinking: bool | None,
    reasoning_effort: str | None,
) -> None:
    """Adds the tools, the tool choice (normalized: ``auto``, ``none``, ``required`` or a function
    name) and the thinking switches to ``payload``. With ``none``, tools still go along when the
    history holds calls or results (a template needs them to render those), under ``tool_choice``
    ``none``."""
    if tools and choice != "none":
        payload["tools"] = [tool.as_openai() for tool in tools]
        payload["tool_choice"] = (
            choice if choice in ("auto", "required") else {"type": "function", "function": {"name": choice}}
        )
    elif any(m.get("tool_calls") or m.get("role") == "tool" for m in payload["messages"]) and tools:
        payload["tools"] = [tool.as_openai() for tool in tools]  # the calls in history need them
        payload["tool_choice"] = "none"
    if thinking is not None:
        payload["chat_template_kwargs"] = {"enable_thinking": thinking}
    if reasoning_effort is not None:
        payload["reasoning_effort"] = reasoning_effort


def wire_message(message: Message) -> dict[str, Any]:
    """One message in OpenAI's shape: an assistant's calls as ``tool_calls``, a tool's result with
    the ``tool_call_id`` it answers; an assistant's thinking left in its text by an older version
    is not sent back (engine/inference/reasoning.py); a user's images as ``image_url`` parts with
    ``data:`` URLs and clips as ``input_audio`` parts, before the text."""
    content = strip_reasoning(message.content) if message.role == "assistant" else message.content
    document: dict[str, Any] = {"role": message.role, "content": content}
    if message.media:
        text = [{"type": "text", "text": content}] if content else []
        document["content"] = [*(_media_part(m) for m in message.media), *text]
    if message.tool_calls:
        document["content"] = content or None
        document["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        document["tool_call_id"] = message.tool_call_id
        if message.name:
            document["name"] = message.name
    return document


def _media_part(media: Media) -> dict[str, Any]:
    """An attachment as an OpenAI content part (the bytes inline: nothing is fetched)."""
    encoded = base64.b64encode(media.data).decode("ascii")
    if media.kind == "image":
        return {"type": "image_url", "image_url": {"url": f"data:{media.media_type};base64,{encoded}"}}
    return {"type": "input_audio", "input_audio": {"data": encoded, "format": media.format}}
