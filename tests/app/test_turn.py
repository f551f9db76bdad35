"""The app's one turn (``app.turn.run_turn``) on the tests' fake backend: what reaches ``stream``, the
passages (given, retrieved, or left to the model), the agent loop's events and the turn's record."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.agent_history import TEXT_BREAK, Record, TextBreak
from app.knowledge_glue import SEARCH_KNOWLEDGE, Passages
from app.turn import TurnRequest, TurnTools, run_turn
from engine.agent.loop import Decision, ToolStep
from engine.errors import EngineError
from engine.inference.context import Message
from engine.inference.events import Event, Finished, Reasoning, Stats, Token, ToolCall
from engine.inference.kv_cache import KvKey
from engine.inference.runtime import GenerationParams
from engine.inference.tools import BUILTIN_SOURCE, ToolResult, ToolSpec
from engine.media import Media
from tests.fake_backend import FakeBackend, StreamCall

ADD = ToolSpec(
    "add",
    "Adds two numbers.",
    {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
    "calc",
)
SEARCH = ToolSpec(SEARCH_KNOWLEDGE, "Searches the knowledge bases.", {"type": "object", "properties": {}})


class Docs:
    """Ranked passages of ``words`` words each (the fake counts tokens as words)."""

    def __init__(self, n: int, words: int) -> None:
        self.n, self.words = n, words

    @property
    def count(self) -> int:
        return self.n

    def text(self, kept: int) -> str:
        return " ".join(f"[{i + 1}] " + "w " * self.words for i in range(kept))


def passages(n: int, words: int) -> Passages:
    return Passages(Docs(n, words), tuple({"n": i + 1, "path": f"doc{i + 1}.md"} for i in range(n)))


def image(name: str = "cat.png") -> Media:
    data = b"\x89PNG fake " + name.encode()
    return Media("image", "png", hashlib.sha256(data).hexdigest(), data, name, 2, 2)


@dataclass
class Reply:
    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    thinking: str = ""


class Scripted(FakeBackend):
    """Streams the scripted replies in order (then "done"), each word a Token."""

    def __init__(self, replies: list[Reply], n_ctx: int = 4096) -> None:
        super().__init__(n_ctx=n_ctx)
        self.replies = replies

    def script(self, call: StreamCall) -> Iterator[Event]:
        reply = self.replies.pop(0) if self.replies else Reply("done")
        if reply.thinking:
            yield Reasoning(reply.thinking)
        for i, word in enumerate(reply.text.split()):
            yield Token(word if i == 0 else " " + word, 1)
        yield from reply.calls
        stats = self.stats(call, completion_tokens=len(reply.text.split()))
        yield stats
        yield Finished(
            "stop",
            stats,
            reply.text,
            tool_calls=reply.calls,
            reasoning=reply.thinking,
            reasoning_tokens=len(reply.thinking.split()),
        )


@dataclass
class Toolset:
    """A turn's open tools (``app.turn.TurnToolset``): ``add`` and, when asked, the built-in search."""

    specs: list[ToolSpec]
    problems: list[str] = field(default_factory=list)
    allowed: set[str] = field(default_factory=set)
    ran: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def tools(self) -> list[ToolSpec]:
        return self.specs

    def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float, cancel: threading.Event | None = None
    ) -> ToolResult:
        self.ran.append((name, arguments))
        if name == "add":
            return ToolResult(str(arguments["a"] + arguments["b"]))
        return ToolResult("nothing found")

    def close(self) -> None:
        pass

    def always_allows(self, name: str) -> bool:
        return name in self.allowed

    def allow_always(self, name: str) -> None:
        self.allowed.add(name)


def add_call(a: int, b: int) -> ToolCall:
    return ToolCall(f"call_{a}_{b}", "add", {"a": a, "b": b}, "<add>")


def test_a_plain_turn_passes_every_option_to_stream_and_records_the_reply() -> None:
    backend = Scripted([Reply("Hello there", thinking="hmm")])
    history = (Message("user", "hi"), Message("assistant", "hello"))
    cancel = threading.Event()
    params = GenerationParams(temperature=0.2)
    request = TurnRequest(
        history,
        "how are you?",
        params,
        system="be brief",
        media=(image(),),
        offered=(ADD,),
        tool_choice="none",
        cache_key=("7", "12"),
        thinking=True,
        reasoning_effort="low",
        thinking_budget=64,
        cancel=cancel,
    )
    run = run_turn(backend, request)
    events = list(run)
    (call,) = backend.calls
    assert call.history == list(history) and call.user == "how are you?" and call.params == params
    assert call.system == "be brief" and call.media == request.media and call.cancel is cancel
    assert call.cache_key == KvKey("7", "12") and call.tool_names == ["add"] and call.tool_choice == "none"
    assert (call.thinking, call.reasoning_effort, call.thinking_budget) == (True, "low", 64)
    assert call.documents is None
    assert [type(e) for e in events] == [Reasoning, Token, Token, Stats, Finished]
    record = run.record
    assert record.finished is events[-1] and record.answer == "Hello there"
    assert record.messages == [Message("assistant", "Hello there")]
    assert record.agent.reasoning_done is not None and record.agent.reasoning_done["text"] == "hmm"
    stats = record.history_stats()
    assert stats["finish_reason"] == "stop" and stats["completion_tokens"] == 2
    assert record.sources == [] and record.passages is None


def test_the_passages_given_are_fitted_by_the_backend_and_the_sources_are_those_it_kept() -> None:
    # A 200-token window: the documents band (35%, 70 tokens) holds 2 passages of 30 words, not 5.
    backend = Scripted([Reply("See [1].")], n_ctx=200)
    given = passages(5, 30)
    asked: list[str] = []
    run = run_turn(backend, TurnRequest((), "what do my notes say?", None, passages=given, retrieve=asked.append))
    finished = [e for e in run if isinstance(e, Finished)][-1]
    (call,) = backend.calls
    assert asked == []  # passages given: nothing retrieved
    assert call.documents is not None and "[1]" in call.documents and "[5]" not in call.documents
    kept, dropped = finished.stats.documents_kept, finished.stats.documents_dropped
    assert kept >= 1 and dropped >= 1 and kept + dropped == 5
    assert run.record.sources == list(given.sources[:kept])
    assert run.record.history_stats()["documents_dropped"] == dropped


def test_without_passages_the_turn_retrieves_for_the_new_message() -> None:
    backend = Scripted([Reply("ok")])
    asked: list[str] = []

    def retrieve(query: str) -> Passages:
        asked.append(query)
        return passages(1, 3)

    run = run_turn(backend, TurnRequest((), "cats?", None, retrieve=retrieve))
    list(run)
    assert asked == ["cats?"]
    assert backend.calls[0].documents is not None and "[1]" in backend.calls[0].documents
    assert run.record.sources == [{"n": 1, "path": "doc1.md"}]


def test_a_model_that_searches_itself_gets_no_passages_up_front() -> None:
    backend = Scripted([Reply("I will answer without searching.")])
    asked: list[str] = []
    tools = TurnTools(Toolset([SEARCH, ADD]))
    run = run_turn(
        backend,
        TurnRequest((), "cats?", None, passages=passages(2, 3), retrieve=lambda q: asked.append(q), tools=tools),
    )
    list(run)
    assert asked == [] and backend.calls[0].documents is None and run.record.passages is None
    assert SEARCH.source == BUILTIN_SOURCE and backend.calls[0].tool_names == [SEARCH_KNOWLEDGE, "add"]


def test_the_loop_streams_every_generation_one_finished_and_records_each_step() -> None:
    backend = Scripted([Reply("Let me add.", (add_call(2, 3),), thinking="sum"), Reply("It is 5.")])
    toolset = Toolset([ADD], problems=["the weather server did not start"])
    asked: list[str] = []

    def approve(tool_call: ToolCall, spec: ToolSpec) -> Decision:
        asked.append(f"{spec.source}:{tool_call.name}")
        return "once"

    records: list[Record] = []
    request = TurnRequest(
        (), "what is 2+3?", None, media=(image(),), tools=TurnTools(toolset, approve, problems=("stale choice",))
    )
    run = run_turn(backend, request, records.append)
    events = list(run)

    assert asked == ["calc:add"] and toolset.ran == [("add", {"a": 2, "b": 3})]
    finished = [e for e in events if isinstance(e, Finished)]
    assert len(finished) == 1 and events[-1] is finished[0]  # one Finished, for the whole turn
    steps = [e for e in events if isinstance(e, ToolStep)]
    assert len(steps) == 1 and steps[0].call.name == "add" and steps[0].result.content == "5"
    breaks = [i for i, e in enumerate(events) if isinstance(e, TextBreak)]
    assert len(breaks) == 1 and events.index(steps[0]) < breaks[0]  # between the two generations' text
    text = "".join(e.text for e in events if isinstance(e, (Token, TextBreak)))
    assert text == "Let me add." + TEXT_BREAK + "It is 5." == finished[0].text
    assert finished[0].tool_calls == () and finished[0].reasoning == "sum"

    # Every generation saw the images with the user's message (the loop appends it once, with them).
    first, second = backend.calls
    assert first.user is None and first.history[-1] == Message("user", "what is 2+3?", media=request.media)
    assert second.history[0] == first.history[-1] and first.media == () and second.media == ()
    assert second.history[-1].role == "tool" and second.history[-1].content == "5"

    record = run.record
    assert record.answer == "It is 5." and record.steps == steps and not record.hit_step_limit
    assert [m.role for m in record.messages] == ["assistant", "tool", "assistant"]
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "problems" and records[0]["problems"] == ["the weather server did not start", "stale choice"]
    assert kinds.count("generation") == 2 and kinds.count("message") == 3
    assert record.agent.stats()  # what history saves with the reply holds the loop's records
    assert record.history_stats()["finish_reason"] == "stop"


def test_a_call_nobody_can_approve_is_refused_and_the_model_is_told() -> None:
    backend = Scripted([Reply("", (add_call(1, 1),)), Reply("I could not add.")])
    toolset = Toolset([ADD])
    run = run_turn(backend, TurnRequest((), "1+1?", None, tools=TurnTools(toolset)))  # no approver
    events = list(run)
    assert toolset.ran == []
    (step,) = [e for e in events if isinstance(e, ToolStep)]
    assert step.result.is_error
    assert backend.calls[1].history[-1].role == "tool" and backend.calls[1].history[-1].content == step.result.content
    assert run.record.answer == "I could not add."


def test_always_allowed_tools_run_without_asking() -> None:
    backend = Scripted([Reply("", (add_call(4, 4),)), Reply("8")])
    toolset = Toolset([ADD], allowed={"add"})

    def approve(tool_call: ToolCall, spec: ToolSpec) -> Decision:
        raise AssertionError("an allowed tool was asked about")

    list(run_turn(backend, TurnRequest((), "4+4?", None, tools=TurnTools(toolset, approve))))
    assert toolset.ran == [("add", {"a": 4, "b": 4})]


def test_a_loop_that_ends_without_a_reply_is_an_engine_error() -> None:
    class Silent(FakeBackend):
        def script(self, call: StreamCall) -> Iterator[Event]:
            return iter(())  # no Finished: a backend that broke its contract

    run = run_turn(Silent(), TurnRequest((), "hi", None, tools=TurnTools(Toolset([ADD]))))
    with pytest.raises(EngineError):
        list(run)


def test_nothing_runs_until_the_turn_is_iterated() -> None:
    backend = Scripted([Reply("ok")])
    asked: list[str] = []
    run = run_turn(backend, TurnRequest((), "hi", None, retrieve=lambda q: asked.append(q)))
    assert backend.calls == [] and asked == [] and run.record.finished is None
    list(run)
    assert len(backend.calls) == 1 and asked == ["hi"]
