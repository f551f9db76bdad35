"""The agent loop with a scripted backend and fake tool providers: approval, limits, stop, history."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.agent.loop import Agent, Decision, ToolStep
from engine.errors import EngineCrashed, EngineError
from engine.inference.context import TRUNCATION_MARKER, Message
from engine.inference.events import Event, Finished, Stats, Token, ToolCall
from engine.inference.tools import ToolResult, ToolSpec
from tests.fake_backend import FakeBackend, StreamCall

ADD = ToolSpec(
    "add",
    "Adds two numbers.",
    {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
)
ECHO = ToolSpec("echo", "Says it back.", {"type": "object", "properties": {"text": {"type": "string"}}}, "srv")


@dataclass
class Reply:
    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    reason: str = "stop"


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(f"id{name}{len(arguments)}", name, arguments, f"<{name}>")


class ScriptedBackend(FakeBackend):
    """Streams scripted replies; records what each generation was given. The room for results is
    not measured (``result_room`` is None): the loop estimates it from the last generation's stats."""

    def __init__(self, replies: list[Reply], n_ctx: int = 4096, used: int = 100, crash_at: int | None = None) -> None:
        super().__init__(n_ctx=n_ctx)
        self.replies = replies
        self.used = used
        self.crash_at = crash_at
        self.seen: list[dict[str, Any]] = []

    def script(self, call: StreamCall) -> Iterator[Event]:
        self.seen.append({"history": call.history, "user": call.user, "tools": call.tools, "choice": call.tool_choice})
        if self.crash_at == len(self.seen):
            raise EngineCrashed(-9, "generation", "killed")
        reply = self.replies.pop(0) if self.replies else Reply("done")
        for word in reply.text.split(" "):
            yield Token(word, 1)
        yield from reply.calls
        stats = Stats(n_ctx=self.n_ctx, context_used=self.used, budget={"reserve": 100})
        yield stats
        yield Finished(reason=reply.reason, stats=stats, text=reply.text, tool_calls=reply.calls)  # type: ignore[arg-type]


@dataclass
class FakeProvider:
    specs: list[ToolSpec]
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    behaviour: str = "answer"
    started: threading.Event = field(default_factory=threading.Event)

    def tools(self) -> list[ToolSpec]:
        return self.specs

    def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float, cancel: threading.Event | None = None
    ) -> ToolResult:
        self.calls.append((name, arguments))
        self.started.set()
        if self.behaviour == "hang":  # ignores both the timeout and the cancel
            time.sleep(30)
        if self.behaviour == "wait-cancel":
            assert cancel is not None
            cancel.wait(10)
            return ToolResult("stopped", is_error=True)
        if self.behaviour == "raise":
            raise RuntimeError("the server\nfell over")
        if self.behaviour == "huge":
            return ToolResult("word " * 5000)
        if name == "add":
            return ToolResult(str(arguments["a"] + arguments["b"]))
        return ToolResult(str(arguments.get("text", "")))

    def close(self) -> None:
        pass


def approver(*answers: Decision) -> tuple[list[str], Any]:
    asked: list[str] = []
    queue = list(answers)

    def approve(tool_call: ToolCall, spec: ToolSpec) -> Decision:
        asked.append(tool_call.name)
        return queue.pop(0)

    return asked, approve


def run_all(agent: Agent, user: str | None = "what is 2+3?", **kwargs: Any) -> tuple[list[Any], Any]:
    run = agent.run([], user, **kwargs)
    events = list(run)
    return events, run.result


def test_allowed_call_runs_and_its_result_reaches_the_next_generation() -> None:
    backend = ScriptedBackend([Reply("", (call("add", a=2, b=3),)), Reply("It is 5.")])
    provider = FakeProvider([ADD])
    saved: list[tuple[Message, ToolStep | None]] = []
    asked, approve = approver("once")
    agent = Agent(backend, [provider], approve=approve, on_step=lambda m, s: saved.append((m, s)))
    events, result = run_all(agent)
    assert provider.calls == [("add", {"a": 2, "b": 3})]
    assert asked == ["add"]
    second = backend.seen[1]
    assert second["user"] is None  # continued without a new user message
    assert [m.role for m in second["history"]] == ["user", "assistant", "tool"]
    tool_message = second["history"][-1]
    assert (tool_message.content, tool_message.tool_call_id, tool_message.name) == ("5", "idadd2", "add")
    assert second["history"][1].tool_calls == (call("add", a=2, b=3),)
    assert result.text == "It is 5."
    [step] = result.steps
    assert step.approval == "allowed" and step.ran and step.tokens == 1
    assert [type(e).__name__ for e in events].count("ToolStep") == 1
    # history handed over as it happened: the call, its result (with its step), the answer
    assert [(m.role, s is not None) for m, s in saved] == [("assistant", False), ("tool", True), ("assistant", False)]
    assert [m for m, _ in saved] == result.messages


def test_denied_call_never_runs_and_the_refusal_goes_back_to_the_model() -> None:
    backend = ScriptedBackend([Reply("", (call("add", a=1, b=1),)), Reply("I could not compute it.")])
    provider = FakeProvider([ADD])
    _, approve = approver("deny")
    _, result = run_all(Agent(backend, [provider], approve=approve))
    assert provider.calls == []
    [step] = result.steps
    assert step.approval == "denied" and not step.ran and step.result.is_error
    assert step.ms == 0  # a call that did not run took no time
    refusal = backend.seen[1]["history"][-1]
    assert refusal.role == "tool" and "denied" in refusal.content


def test_without_an_approver_no_call_runs() -> None:
    backend = ScriptedBackend([Reply("", (call("add", a=1, b=1),)), Reply("ok")])
    provider = FakeProvider([ADD])
    _, result = run_all(Agent(backend, [provider]))
    assert provider.calls == [] and result.steps[0].approval == "denied"


def test_always_allow_asks_once_and_updates_the_allow_list() -> None:
    backend = ScriptedBackend(
        [
            Reply("", (call("add", a=1, b=1),)),
            Reply("", (call("add", a=2, b=2),)),
            Reply("done"),
        ]
    )
    provider = FakeProvider([ADD])
    asked, approve = approver("always")
    remembered: list[str] = []
    allow: set[str] = set()
    agent = Agent(backend, [provider], approve=approve, allow=allow, on_allow=remembered.append)
    _, result = run_all(agent)
    assert asked == ["add"] and remembered == ["add"] and allow == {"add"}
    assert [s.approval for s in result.steps] == ["always", "allow-listed"]
    assert len(provider.calls) == 2


def test_allow_listed_tool_runs_without_asking() -> None:
    backend = ScriptedBackend([Reply("", (call("echo", text="hi"),)), Reply("said")])
    provider = FakeProvider([ECHO])
    asked, approve = approver()
    _, result = run_all(Agent(backend, [provider], approve=approve, allow={"echo"}))
    assert asked == [] and provider.calls == [("echo", {"text": "hi"})]
    assert result.steps[0].source == "srv"


def test_unknown_tool_and_bad_arguments_are_errors_without_approval() -> None:
    backend = ScriptedBackend(
        [
            Reply("", (call("rm_rf", path="/"), call("add", a="two", b=3))),
            Reply("sorry"),
        ]
    )
    provider = FakeProvider([ADD])
    asked, approve = approver("once", "once")
    _, result = run_all(Agent(backend, [provider], approve=approve))
    assert asked == [] and provider.calls == []
    unknown, invalid = result.steps
    assert unknown.approval == "unknown-tool" and "no tool named 'rm_rf'" in unknown.result.content
    assert invalid.approval == "invalid-arguments" and "a: 'two' is not of type 'number'" in invalid.result.content


def test_a_tool_that_ignores_its_timeout_is_abandoned() -> None:
    backend = ScriptedBackend([Reply("", (call("echo", text="x"),)), Reply("it hung")])
    provider = FakeProvider([ECHO], behaviour="hang")
    started = time.monotonic()
    _, result = run_all(Agent(backend, [provider], allow={"echo"}, timeout_s=0.3))
    # A hang guard, not a speed target: the tool hangs 30 s; the agent goes on after its 0.3 s
    # timeout (about 0.35 s here); 15 s is over 40x that and still half the hang.
    assert time.monotonic() - started < 15
    assert "did not answer within 0.3 s" in result.steps[0].result.content
    assert result.text == "it hung"  # the chat goes on


def test_a_failing_tool_is_an_error_result_and_the_loop_goes_on() -> None:
    backend = ScriptedBackend([Reply("", (call("echo", text="x"),)), Reply("it failed")])
    _, result = run_all(Agent(backend, [FakeProvider([ECHO], behaviour="raise")], allow={"echo"}))
    step = result.steps[0]
    assert step.result.is_error and step.result.content == "error: echo failed: the server fell over"
    assert result.text == "it failed"


def test_stop_during_a_call_ends_the_run_and_answers_every_call() -> None:
    backend = ScriptedBackend([Reply("", (call("echo", text="a"), call("add", a=1, b=2))), Reply("never")])
    provider = FakeProvider([ECHO, ADD], behaviour="wait-cancel")
    cancel = threading.Event()
    agent = Agent(backend, [provider], allow={"echo", "add"})
    threading.Thread(target=lambda: (provider.started.wait(5), cancel.set()), daemon=True).start()
    _, result = run_all(agent, cancel=cancel)
    assert len(backend.seen) == 1  # no further generation
    assert [s.call.name for s in result.steps] == ["echo", "add"]
    assert result.steps[1].approval == "cancelled" and provider.calls == [("echo", {"text": "a"})]
    assert [m.role for m in result.messages] == ["assistant", "tool", "tool"]


def test_a_stopped_reply_with_calls_runs_none_of_them() -> None:
    backend = ScriptedBackend([Reply("", (call("add", a=1, b=2),), reason="cancelled")])
    provider = FakeProvider([ADD])
    _, result = run_all(Agent(backend, [provider], allow={"add"}))
    assert provider.calls == [] and result.steps[0].approval == "cancelled"


def test_step_limit_ends_with_a_generation_that_keeps_the_tools_but_runs_no_call() -> None:
    backend = ScriptedBackend([Reply("", (call("add", a=1, b=1),)) for _ in range(5)])
    provider = FakeProvider([ADD])
    _, result = run_all(Agent(backend, [provider], allow={"add"}, max_steps=2))
    assert len(provider.calls) == 2 and result.rounds == 2 and result.hit_step_limit
    # the same tools every step (the prompt prefix stays), the last one under "none"
    assert [len(seen["tools"]) for seen in backend.seen] == [1, 1, 1]
    assert [seen["choice"] for seen in backend.seen] == [None, None, "none"]  # None: the backend's auto
    # a backend that returns a call anyway: it is not run and not kept
    assert len(backend.seen) == 3 and result.messages[-1].tool_calls == ()


def test_forced_choice_applies_to_the_first_generation_only() -> None:
    backend = ScriptedBackend([Reply("", (call("add", a=1, b=1),)), Reply("2")])
    _, result = run_all(Agent(backend, [FakeProvider([ADD])], allow={"add"}), tool_choice="add")
    assert [seen["choice"] for seen in backend.seen] == ["add", "auto"]
    assert result.text == "2"


def test_a_result_too_large_for_the_window_is_cut_with_a_marker() -> None:
    backend = ScriptedBackend([Reply("", (call("echo", text="x"),)), Reply("long")], n_ctx=1000, used=600)
    _, result = run_all(Agent(backend, [FakeProvider([ECHO], behaviour="huge")], allow={"echo"}))
    step = result.steps[0]
    room = 1000 - 600 - 100 - 32
    assert step.truncated and step.tokens <= room
    assert step.result.content.startswith("word word")
    assert TRUNCATION_MARKER.split(":")[0] in step.result.content
    assert "of 5000 tokens kept" in step.result.content


def test_a_crash_mid_loop_keeps_what_was_already_handed_over() -> None:
    backend = ScriptedBackend([Reply("", (call("add", a=2, b=2),))], crash_at=2)
    saved: list[Message] = []
    agent = Agent(backend, [FakeProvider([ADD])], allow={"add"}, on_step=lambda m, s: saved.append(m))
    run = agent.run([], "2+2?")
    with pytest.raises(EngineCrashed):
        list(run)
    assert [m.role for m in saved] == ["assistant", "tool"] and saved[1].content == "4"


def test_tools_with_the_same_name_from_two_providers_are_refused() -> None:
    with pytest.raises(EngineError, match="offered twice"):
        Agent(ScriptedBackend([]), [FakeProvider([ADD]), FakeProvider([ADD])])


def test_bad_limits_are_refused() -> None:
    with pytest.raises(EngineError, match="max_steps"):
        Agent(ScriptedBackend([]), [], max_steps=0)
    with pytest.raises(EngineError, match="timeout"):
        Agent(ScriptedBackend([]), [], timeout_s=0)
