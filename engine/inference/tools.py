"""Tools a model may call: their typed description, their results, and who runs them.

A :class:`ToolSpec` is what the model is shown (rendered through its chat template, see
:mod:`engine.inference.tool_prompt`); a :class:`ToolProvider` runs calls (the built-in tools and each MCP
server are providers, in ``app/``); a :class:`ToolResult` is what goes back into the context as a
``tool`` message. The engine never imports a provider's implementation: this module is the
structural contract (CONTRIBUTING.md rule 4).

``tool_choice`` follows OpenAI's values: ``"auto"`` (the model chooses), ``"none"`` (no tools
offered), ``"required"`` (the model must call one) or the name of one function (it must call that
one). :func:`normalize_tool_choice` validates it against the tools offered.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from engine.errors import EngineError

TOOL_CHOICES = ("auto", "none", "required")
"""The keyword values of ``tool_choice``; any other value names one function."""

BUILTIN_SOURCE = "builtin"
"""The ``source`` of the tools Glassbox itself provides (``engine.agent.builtin_tools``)."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool offered to the model.

    Attributes:
        name: the function name the model calls (letters, digits, ``_``, ``-``, ``.``).
        description: what it does, for the model.
        parameters: the JSON schema of its arguments (``{"type": "object", ...}``).
        source: :data:`BUILTIN_SOURCE` or the name of the MCP server that offers it.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    source: str = BUILTIN_SOURCE

    def as_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry (``{"type": "function", "function": {...}}``) that chat
        templates expect in their ``tools`` variable."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolResult:
    """What a call returned: text for the model, and whether it is an error message."""

    content: str
    is_error: bool = False


@runtime_checkable
class ToolProvider(Protocol):
    """Runs tools: the built-ins, or one MCP server (implemented in ``app/``)."""

    def tools(self) -> list[ToolSpec]:
        """The tools this provider offers now."""
        ...

    def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        cancel: threading.Event | None = None,
    ) -> ToolResult:
        """Runs one call; returns its result (an error result, not an exception, for a tool that
        failed, timed out or was cancelled)."""
        ...

    def close(self) -> None:
        """Releases what the provider holds (child processes, connections)."""
        ...


def normalize_tool_choice(tool_choice: str | None, tools: Sequence[ToolSpec]) -> str:
    """Checks ``tool_choice`` against the tools offered.

    Args:
        tool_choice: ``"auto"``, ``"none"``, ``"required"``, a function name, or ``None``
            (``"auto"`` when tools are offered, else ``"none"``).
        tools: the tools offered.

    Returns:
        The choice; ``"none"`` when no tools are offered and the choice allows it.

    Raises:
        EngineError: ``required`` or a named function without tools, or a name not offered.
    """
    choice = tool_choice or ("auto" if tools else "none")
    if not tools:
        if choice in ("auto", "none"):
            return "none"
        raise EngineError(f"tool_choice {choice!r} needs tools, and none are offered")
    if choice in TOOL_CHOICES:
        return choice
    names = [tool.name for tool in tools]
    if choice not in names:
        raise EngineError(f"tool_choice {choice!r} is not one of the tools offered ({', '.join(names)})")
    return choice


def check_tools(tools: Sequence[ToolSpec]) -> None:
    """Refuses tool lists a template cannot render unambiguously.

    Raises:
        EngineError: a name is empty or repeated, or a schema is not a JSON object schema or is
            refused by :func:`engine.inference.tool_schema.schema_problem` (too large or deep, a
            remote or endless ``$ref``, a bad pattern).
    """
    # lazy: start-up (+6 ms)
    from engine.inference.tool_schema import schema_problem

    seen: set[str] = set()
    for tool in tools:
        if not tool.name or any(c.isspace() for c in tool.name):
            raise EngineError(f"tool {tool.name!r}: a tool name must be non-empty and have no spaces")
        if tool.name in seen:
            raise EngineError(f"tool {tool.name!r}: offered twice (two providers have a tool of that name)")
        seen.add(tool.name)
        if not isinstance(tool.parameters, dict) or tool.parameters.get("type", "object") != "object":
            raise EngineError(f"tool {tool.name!r}: parameters must be a JSON schema of type object")
        problem = schema_problem(tool.parameters)
        if problem is not None:
            raise EngineError(f"tool {tool.name!r}: {problem}")
