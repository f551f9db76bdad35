"""``glassbox chat``'s tools, structured output and thinking switch (its ``--tools`` side).

Contract: ARCHITECTURE.md, 'app.cli.commands.chat_tools'.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.agent_history import reasoning_dict
from app.cli.commands._output import positive_int
from app.paths import Paths
from app.turn import TurnRecord, TurnTools
from engine.display import printable
from engine.errors import EngineError
from engine.inference.tools import check_tools

if TYPE_CHECKING:
    from engine.agent.loop import Decision, ToolStep
    from engine.inference.backends import ChatBackend
    from engine.inference.events import ToolCall
    from engine.inference.tools import ToolSpec

PREVIEW_CHARS = 300


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tool, schema and thinking options of ``glassbox chat``."""
    parser.add_argument(
        "--tools",
        metavar="NAME[,NAME...]",
        help="offer tools to the model: MCP servers by name (glassbox mcp list), 'builtin', "
        "'all', or a built-in's name",
    )
    parser.add_argument(
        "--tool-choice",
        metavar="auto|required|none|FUNCTION",
        help="auto (default with --tools): the model chooses; required: it must call one; "
        "FUNCTION: it must call that one; none: no tools",
    )
    parser.add_argument("--yes", action="store_true", help="run the model's tool calls without asking")
    parser.add_argument(
        "--max-steps",
        type=positive_int,
        default=8,
        help="rounds of tool calls per turn before the model must answer (default 8)",
    )
    parser.add_argument(
        "--tool-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the longest one tool call may run (default 60)",
    )
    parser.add_argument("--json-schema", metavar="FILE", help="constrain every reply to this JSON schema")
    parser.add_argument(
        "--thinking",
        type=_thinking,
        metavar="on|off|TOKENS",
        help="the model's thinking switch (on, off: only models whose template has one), "
        "or a budget: at most TOKENS of thinking, then the model must answer",
    )


def check_arguments(args: argparse.Namespace) -> str | None:
    """A usage problem with the tool options (exit code 2), or None."""
    if args.tool_choice is not None and not args.tools:
        return "--tool-choice needs --tools"
    if args.tool_timeout <= 0:
        return "--tool-timeout must be positive"
    if getattr(args, "endpoint", None) is not None and thinking_options(args).get("thinking_budget") is not None:
        return (
            "--thinking TOKENS (a thinking budget) needs a local model: a server decodes on its own; "
            "use --thinking on or off with --endpoint"
        )
    return None


def read_json_schema(path: str) -> str:
    """The text of a ``--json-schema`` file, checked to be a JSON object.

    Raises:
        EngineError: the file cannot be read or is not a JSON object (one line naming it).
    """

    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineError(f"{file}: cannot read the JSON schema ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineError(f"{file}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(schema, dict):
        raise EngineError(f"{file}: a JSON schema must be a JSON object")
    return json.dumps(schema)


def _thinking(value: str) -> bool | int:
    if value in ("on", "off"):
        return value == "on"
    try:
        budget = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--thinking takes on, off or a number of tokens, not {value!r}") from None
    if budget < 0:
        raise argparse.ArgumentTypeError(f"--thinking budget must be 0 or more tokens, not {budget}")
    return budget


def thinking_options(args: argparse.Namespace) -> dict[str, Any]:
    """``stream`` keywords for ``--thinking``: the switch (``thinking``) or the budget (``thinking_budget``)."""
    if args.thinking is None:
        return {}
    if isinstance(args.thinking, bool):
        return {"thinking": args.thinking}
    return {"thinking_budget": args.thinking}


class ChatTools:
    """The tools of one ``glassbox chat`` run, and the agent that uses them.

    Args:
        args: the parsed options.
        paths: the data folders.
        session: the loaded ChatSession.
    """

    def __init__(self, args: argparse.Namespace, paths: Paths, session: ChatBackend) -> None:
        # lazy: start-up (+42 ms)
        from app.tool_setup import open_tools

        self.args = args
        self.toolset = open_tools(
            args.tools, paths, knowledge_bases=args.kb, count_text=session.count_text, chroma_url=args.chroma_url
        )
        try:
            specs = self.toolset.tools()
            for problem in self.toolset.problems:
                print(f"glassbox: warning: {printable(problem)}", file=sys.stderr)
            check_tools(specs)  # two tools of one name, an unusable schema: before any conversation starts
        except BaseException:
            self.toolset.close()
            raise
        self._interactive = sys.stdin.isatty()

    @property
    def turn_tools(self) -> TurnTools:
        """The tools of a turn: the open ToolSet, approved on the terminal, with the limits asked."""
        return TurnTools(self.toolset, self._approve, self.args.max_steps, self.args.tool_timeout)

    def close(self) -> None:
        self.toolset.close()

    def __enter__(self) -> ChatTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _approve(self, call: ToolCall, spec: ToolSpec) -> Decision:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        if self.args.yes:
            return "once"
        if not self._interactive:
            print(
                f"glassbox: tool call {call.name} refused: not approved (no terminal to ask; pass --yes to run "
                "tool calls without asking)",
                file=sys.stderr,
            )
            return "deny"
        print(f"\n{printable(f'[tool call] {call.name} ({spec.source}) {arguments}')}", file=sys.stderr)
        print("Allow? [y]es once, [a]lways, [N]o: ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer in ("a", "always"):
            return "always"
        return "once" if answer in ("y", "yes") else "deny"


def print_step(step: ToolStep) -> None:
    """One call of the loop, on stderr: its arguments, how it went, a preview of its result."""
    arguments = json.dumps(step.call.arguments, ensure_ascii=False)
    preview = " ".join(step.result.content.split())
    if len(preview) > PREVIEW_CHARS:
        preview = preview[:PREVIEW_CHARS] + "..."
    what = "ran" if step.ran else step.approval
    line = (
        f"[tool {step.call.name} {arguments}: {what}, {step.ms:.0f} ms, {step.tokens} tokens"
        f"{', truncated' if step.truncated else ''}] {preview}"
    )
    print(f"\n{printable(line)}", file=sys.stderr)


def step_document(step: ToolStep) -> dict[str, object]:
    """One call in ``--json``."""
    return {
        "name": step.call.name,
        "arguments": step.call.arguments,
        "result": step.result.content,
        "ms": step.ms,
        "tokens": step.tokens,
        "approval": step.approval,
        "is_error": step.result.is_error,
        "truncated": step.truncated,
        "source": step.source,
    }


def turn_extras(record: TurnRecord) -> dict[str, object]:
    """What ``--json`` adds to a turn: its tool calls and its thinking."""

    finished = record.finished
    assert finished is not None  # a turn that did not finish raised instead
    return {
        "tool_calls": [step_document(step) for step in record.steps],
        "reasoning": reasoning_dict(finished.reasoning, finished.reasoning_tokens, finished.reasoning_ms),
    }
