"""What one turn asks of the template and the sampler: tools, tool choice, thinking.

Contract: ARCHITECTURE.md, 'engine.inference.turn'.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import EngineError
from engine.inference.context import Message
from engine.inference.events import Event
from engine.inference.reasoning import opened_in_prompt
from engine.inference.reply import Generate, ReplyShaper, format_markers, shaped, within_thinking_budget
from engine.inference.thinking_settings import thinking_settings
from engine.inference.tool_calls.kimi_k3 import prompt_section
from engine.inference.tool_prompt import call_schema
from engine.inference.tools import ToolSpec, check_tools, normalize_tool_choice

if TYPE_CHECKING:
    from engine.inference.runtime import GenerationParams, WorkerResult
    from engine.inference.templates import ChatTemplate


@dataclass(frozen=True)
class TurnShape:
    """A turn's validated options (build it with :func:`shape_turn`).

    Attributes:
        tools: the tools given (with ``none`` rendered only where the conversation holds calls or
            results, and never parsed for).
        choice: the tool choice (``auto``, ``none``, ``required`` or a function name).
        json_schema: the call schema the reply is constrained to (JSON text), or None.
        enable_thinking: the template's ``enable_thinking``, or None to leave it be.
        reasoning_effort: the template's ``reasoning_effort`` (``low``/``medium``/``high``), or None.
        switches: the template's other switches the turn sets (``thinking``, ``thinking_mode``,
            ``thinking_budget``, an effort of its own...: engine/inference/thinking_settings.py).
        thinking_budget: the most thinking tokens, or None for no cap.
    """

    template: ChatTemplate
    tools: tuple[ToolSpec, ...] = ()
    choice: str = "none"
    json_schema: str | None = None
    enable_thinking: bool | None = None
    reasoning_effort: str | None = None
    switches: tuple[tuple[str, object], ...] = ()
    thinking_budget: int | None = None

    def render(
        self, messages: Sequence[Message], *, with_tools: bool = True, add_generation_prompt: bool = True
    ) -> str:
        """The prompt for ``messages`` (ending with the assistant header, unless not
        ``add_generation_prompt``)."""
        return self.template.render(
            [m.template_dict() for m in messages],
            add_generation_prompt,
            tools=self.tools if with_tools else (),
            tool_choice=self.choice if with_tools else "none",
            enable_thinking=self.enable_thinking,
            reasoning_effort=self.reasoning_effort,
            switches=dict(self.switches),
        )

    def tools_tokens(self, count_prompt: Callable[[str], int]) -> int:
        """What the tool definitions add to a prompt: a one-message prompt counted with and without them."""
        if not self.tools:
            return 0
        probe = [Message("user", "?")]
        return max(count_prompt(self.render(probe)) - count_prompt(self.render(probe, with_tools=False)), 0)

    def params(self, params: GenerationParams) -> GenerationParams:
        """The sampling parameters, with the call schema when the choice forces a call."""
        if self.json_schema is None:
            return params
        return params.model_copy(update={"json_schema": self.json_schema})

    def shaper(self, prompt: str, specials: Mapping[int, str] | None = None) -> ReplyShaper:
        """A fresh reply shaper for the prompt that was rendered (``specials``: the vocabulary's
        marker tokens, engine/inference/reply.py's :func:`~engine.inference.reply.special_markers`)."""
        template = self.template
        names = [tool.name for tool in self.tools]
        schemas = {tool.name: tool.parameters for tool in self.tools}
        think = template.think_format
        syntax = template.tool_family if template.supports_tools else None
        family = template.tool_family if self.tools and self.choice != "none" else None
        # Only the template's own markers are put back: elsewhere one may be a silent control token.
        relevant = format_markers(think, (syntax, family), template.harmony)
        marks = {i: m for i, m in (specials or {}).items() if m in relevant}
        if self.json_schema is not None:
            return ReplyShaper(family="json", tool_names=names, thinking=False, specials=marks, schemas=schemas)
        if syntax == "kimi_k3":
            started = prompt_section(prompt) == "think"
        else:
            started = opened_in_prompt(prompt, think)
        return ReplyShaper(
            family=family,
            harmony=template.harmony,
            tool_names=names,
            think_started=started,
            specials=marks,
            schemas=schemas,
            think_format=think,
            syntax=syntax,
        )

    def generate(
        self,
        generate: Generate,
        tokens: Sequence[int],
        params: GenerationParams,
        cancel: threading.Event | None,
        shaper: ReplyShaper,
        tokenize: Callable[[str], list[int]],
    ) -> Generator[Event, None, WorkerResult]:
        """The worker's generation, shaped, within the thinking budget when there is one."""
        if self.thinking_budget is None or self.json_schema is not None:
            return shaped(generate(tokens, params, cancel), shaper)
        return within_thinking_budget(generate, tokens, params, cancel, shaper, self.thinking_budget, tokenize)


def shape_turn(
    template: ChatTemplate,
    params: GenerationParams,
    *,
    tools: Sequence[ToolSpec] = (),
    tool_choice: str | None = None,
    thinking: bool | None = None,
    reasoning_effort: str | None = None,
    thinking_budget: int | None = None,
) -> TurnShape:
    """Validates a turn's options (see the module docstring).

    Raises:
        EngineError: an unknown or impossible tool choice, a bad tool list, a thinking switch the
            template does not have, an unknown effort, or a forced call with the caller's own
            grammar or schema.
    """
    choice = normalize_tool_choice(tool_choice, tools)
    offered = tuple(tools)
    check_tools(offered)
    schema: dict[str, Any] | None = call_schema(offered, choice)
    if schema is not None and (params.json_schema is not None or params.grammar is not None):
        raise EngineError(
            f"tool_choice {choice!r} constrains the reply itself: it cannot be combined with a json_schema or grammar"
        )
    settings = thinking_settings(
        template.thinking,
        template.switches,
        thinking=thinking,
        reasoning_effort=reasoning_effort,
        thinking_budget=thinking_budget,
    )
    if thinking_budget is not None and (isinstance(thinking_budget, bool) or thinking_budget < 0):
        raise EngineError(f"the thinking budget must be a number of tokens (0 or more), not {thinking_budget!r}")
    if thinking_budget is not None and thinking is False:
        raise EngineError("a thinking budget was given with thinking switched off")
    return TurnShape(
        template=template,
        tools=offered,
        choice=choice,
        json_schema=json.dumps(schema) if schema is not None else None,
        enable_thinking=settings.enable_thinking,
        reasoning_effort=settings.reasoning_effort,
        switches=tuple(settings.switches.items()),
        thinking_budget=thinking_budget,
    )
