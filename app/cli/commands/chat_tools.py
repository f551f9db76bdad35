"""``glassbox chat``'s tools, structured output and thinking switch (its ``--tools`` side).

``--tools NAME[,NAME...]|builtin|all`` offers the built-in tools and the MCP servers of
``mcp.json`` (``app.tool_setup``) to the model; each turn then runs the agent loop
(``engine.agent.loop``): a call on the allow list runs, any other is asked about on an interactive
terminal (``y`` once, ``a`` always, anything else no), and refused with a clear line on stderr
when there is no terminal to ask, unless ``--yes``. ``--tool-choice auto|required|none|FUNCTION``
(``required`` and a function name constrain the first reply to a valid call), ``--max-steps N``
rounds of calls, ``--tool-timeout S`` per call. ``--json-schema FILE`` constrains every reply to
the schema; ``--thinking on|off`` sets the model's thinking switch where its template has one, and
``--thinking N`` caps the thinking at N tokens (local models only: with ``--endpoint`` it is a usage
error, before any conversation is created).

With ``--json`` each turn's document gains ``"tool_calls"`` (``name``, ``arguments``, ``result``,
``ms``, ``tokens``, and ``approval``, ``is_error``, ``truncated``, ``source``) and
``"reasoning"`` (``text``, ``tokens``, ``ms``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.commands._output import positive_int
from app.paths import Paths
from engine.display import printable

if TYPE_CHECKING:
    from app.agent_history import AgentRecord
    from engine.agent.loop import AgentResult, Decision, ToolStep
    from engine.inference.backends import ChatBackend
    from engine.inference.context import Message, RankedDocuments
    from engine.inference.events import Event, Finished, ToolCall
    from engine.inference.kv_cache import KvKey
    from engine.inference.runtime import GenerationParams
    from engine.inference.tools import ToolSpec
    from engine.media import Media

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
    from engine.errors import EngineError

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
        from app.tool_setup import open_tools
        from engine.agent.loop import Agent

        self.args = args
        self.toolset = open_tools(
            args.tools, paths, knowledge_bases=args.kb, count_text=session.count_text, chroma_url=args.chroma_url
        )
        try:
            specs = self.toolset.tools()
            for problem in self.toolset.problems:
                print(f"glassbox: warning: {printable(problem)}", file=sys.stderr)
            allow = {spec.name for spec in specs if self.toolset.always_allows(spec.name)}
            self.agent = Agent(
                session,
                [self.toolset],
                approve=self._approve,
                allow=allow,
                on_allow=self.toolset.allow_always,
                max_steps=args.max_steps,
                timeout_s=args.tool_timeout,
            )
        except BaseException:
            self.toolset.close()
            raise
        self._interactive = sys.stdin.isatty()

    @property
    def offers_search(self) -> bool:
        """Whether the model searches the knowledge bases itself (so no passages are added)."""
        from app.tool_setup import SEARCH_KNOWLEDGE

        return any(spec.name == SEARCH_KNOWLEDGE for spec in self.agent.specs)

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

    def answer(
        self,
        history: list[Message],
        user: str,
        params: GenerationParams | None,
        system: str | None,
        documents: RankedDocuments | None,
        quiet: bool,
        cache_key: KvKey | None = None,
        progress: Callable[[str, AgentRecord], None] | None = None,
        media: Sequence[Media] = (),
    ) -> ToolTurn:
        """Runs one turn through the agent loop. Ctrl-C stops it.

        Args:
            cache_key: the turn's key for the KV cache saved with the chat; every generation of the
                loop (the ones after a tool result too) saves and restores under it.
            progress: told ``(text so far, record)`` after each new message of the loop (the
                assistant's calls, each result, the answer), to save it as it happens
                (``ChatLog.save_progress``); the record is an ``app.agent_history.AgentRecord``.

        Returns:
            The turn: the agent's result, its record and its text as the app saves it.
        """
        from app.agent_history import reasoning_dict

        cancel = threading.Event()
        recorder = _TurnRecorder(progress)
        self.agent.on_step = recorder.on_step
        extra: dict[str, Any] = {"cache_key": cache_key} if cache_key is not None else {}
        if media:
            extra["media"] = tuple(media)
        options = thinking_options(self.args)
        run = self.agent.run(
            history,
            user,
            params,
            system=system,
            documents=documents,
            cancel=cancel,
            tool_choice=self.args.tool_choice,
            thinking=options.pop("thinking", None),
            **options,
            **extra,
        )
        events = iter(run)
        try:
            for event in events:
                recorder.take(event)
                if not quiet:
                    _show(event)
        except KeyboardInterrupt:
            cancel.set()
            for event in events:
                recorder.take(event)
        result = run.result
        if result.reasoning:
            recorder.record.reasoning_done = reasoning_dict(
                result.reasoning, result.reasoning_tokens, result.reasoning_ms
            )
        if not quiet:
            self._show_end(result)
        return ToolTurn(result, recorder.record, recorder.shown.text)

    def _show_end(self, result: AgentResult) -> None:
        sys.stdout.write("\n")
        if result.finished is not None and result.finished.reason == "cancelled":
            print("[stopped]", file=sys.stderr)
        if result.hit_step_limit:
            print(
                f"[{self.args.max_steps} rounds of tool calls: the model had to answer without calling one]",
                file=sys.stderr,
            )


class _TurnRecorder:
    """What one turn of the loop adds to the reply as it happens: its text, thinking and record."""

    def __init__(self, progress: Callable[[str, AgentRecord], None] | None) -> None:
        from app.agent_history import AgentRecord, ReplyText

        self.record = AgentRecord()
        self.shown = ReplyText()
        self.rounds = 0
        self._progress = progress

    def on_step(self, message: Message, step: ToolStep | None) -> None:
        from app.agent_history import message_record

        self.record.add(message_record(message, step))
        if self._progress is not None:
            self._progress(self.shown.text, self.record)

    def take(self, event: Event | ToolStep) -> None:
        from app.agent_history import generation_record
        from engine.inference.events import Finished, Reasoning, Token

        if isinstance(event, Token):
            self.shown.add(event.text)
        elif isinstance(event, Reasoning):
            self.record.reasoning.append(event.text)
        elif isinstance(event, Finished):
            self.rounds += 1
            self.record.add(generation_record(self.rounds, event))
            self.shown.end_generation()


def _show(event: Event | ToolStep) -> None:
    """Prints an event of the loop: the answer on stdout, the thinking and the calls on stderr."""
    from engine.agent.loop import ToolStep
    from engine.inference.events import Finished, Reasoning, Token

    if isinstance(event, Token):
        sys.stdout.write(event.text)
        sys.stdout.flush()
    elif isinstance(event, Reasoning):
        sys.stderr.write(event.text)
    elif isinstance(event, ToolStep):
        _print_step(event)
    elif isinstance(event, Finished) and event.stats.cpu_note:
        print(f"\nglassbox: note: {printable(event.stats.cpu_note)}", file=sys.stderr)  # said once, on its reply


@dataclass
class ToolTurn:
    """One turn of the agent loop in ``glassbox chat``.

    Attributes:
        result: the ``engine.agent.loop.AgentResult``.
        record: the ``app.agent_history.AgentRecord`` saved in the reply's stats.
        saved_text: every generation's text, as the app saves and shows the reply.
    """

    result: AgentResult
    record: AgentRecord
    saved_text: str

    @property
    def text(self) -> str:
        """The final answer (``--json``'s ``text``)."""
        return str(self.result.text)

    @property
    def finished(self) -> Finished | None:
        return self.result.finished

    @property
    def messages(self) -> list[Message]:
        """The messages the loop added (what the next turn's history gets)."""
        return list(self.result.messages)


def _print_step(step: ToolStep) -> None:
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


def turn_extras(finished: Finished | None, outcome: ToolTurn | None) -> dict[str, object]:
    """What ``--json`` adds to a turn: its tool calls and its thinking (``outcome``: the turn with
    ``--tools``, else None)."""
    from app.agent_history import reasoning_dict

    if outcome is not None:
        result = outcome.result
        return {
            "tool_calls": [step_document(step) for step in result.steps],
            "reasoning": reasoning_dict(result.reasoning, result.reasoning_tokens, result.reasoning_ms),
        }
    assert finished is not None  # a turn without tools always ends in its Finished
    return {
        "tool_calls": [],
        "reasoning": reasoning_dict(finished.reasoning, finished.reasoning_tokens, finished.reasoning_ms),
    }
