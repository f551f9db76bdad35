"""The agent loop and the KV cache saved with each chat, on the starter model: the generation after a
tool result runs under the turn's ``cache_key``, reuses the first generation's prefix (whether the
first step was ``auto`` or forced a call, and at the step limit), and the tool turn's state is
restored from disk by a new worker process.

The starter is a base model: the test's backend makes its first generation call ``add`` (the model
generated under ``tool_choice="auto"``, so the prompt is the one a model that called would have) and
drops any call after it, so the loop always has exactly two generations.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.agent.loop import Agent
from engine.inference.context import Message
from engine.inference.events import Event, Finished, ToolCall
from engine.inference.kv_cache import KvCacheConfig, KvCacheStore, KvKey
from engine.inference.tool_prompt import choice_note
from engine.inference.tools import ToolResult, ToolSpec

pytestmark = pytest.mark.model

ADD = ToolSpec(
    "add",
    "Adds two integers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
    "test",
)
DOCUMENT = " ".join(f"Entry {i}: crate {i % 11} left the dock at {i % 24:02d}:30." for i in range(30))


class Adder:
    def tools(self) -> list[ToolSpec]:
        return [ADD]

    def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float, cancel: threading.Event | None = None
    ) -> ToolResult:
        return ToolResult(str(arguments["a"] + arguments["b"]))

    def close(self) -> None:
        pass


class CallsOnce:
    """The real session; its first generation ends with a call to ``add``, the others with none."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.keys: list[Any] = []

    def count_text(self, text: str) -> int:
        return int(self.session.count_text(text))

    def result_room(self, messages: Sequence[Message], params: Any = None, **turn: Any) -> int:
        return int(self.session.result_room(messages, params, **turn))

    def stream(self, history: Sequence[Message], user: str | None, params: Any = None, **kw: Any) -> Iterator[Event]:
        self.keys.append(kw.get("cache_key"))
        calls = (ToolCall("call-1", "add", {"a": 2, "b": 3}, ""),) if len(self.keys) == 1 else ()
        for event in self.session.stream(history, user, params, **kw):
            if isinstance(event, ToolCall):
                continue
            if isinstance(event, Finished):
                yield from calls
                event = dataclasses.replace(event, tool_calls=calls, reason="stop")
            yield event


def _session(model: Path, folder: Path) -> Any:
    from engine.inference.runtime import LoadParams
    from engine.inference.session import ChatSession

    return ChatSession(LoadParams(model_path=model, n_ctx=2048, n_threads=2), kv_cache=KvCacheConfig(folder))


def test_the_step_after_a_tool_result_reuses_the_prefix_and_the_tool_turn_is_restored_by_a_new_process(
    starter_model: Path, tmp_path: Path
) -> None:
    from engine.inference.runtime import GenerationParams

    folder = tmp_path / "kv"
    params = GenerationParams(temperature=0.0, max_tokens=12, repeat_penalty=1.0)
    question = f"Read this log, then add 2 and 3. {DOCUMENT}"
    with _session(starter_model, folder) as session:
        backend = CallsOnce(session)
        agent = Agent(backend, [Adder()], allow={"add"}, max_steps=4)
        run = agent.run([], question, params, cache_key=KvKey("3", "10"))
        first, second = [event for event in run if isinstance(event, Finished)]
    assert backend.keys == [KvKey("3", "10")] * 2  # the continuation (user=None) ran under the turn's key
    assert [step.result.content for step in run.result.steps] == ["5"]
    # The second generation started from the first one's KV cache in RAM: only the call and its
    # result were prefilled.
    assert second.stats.cached_tokens >= first.stats.prompt_tokens - 1
    assert second.stats.prompt_tokens - second.stats.cached_tokens < 64
    assert second.stats.kv_saved_bytes > 0
    assert KvCacheStore(folder).usage()[0] == 1  # the turn's last state superseded its first

    # A new worker process continues the chat after the tool turn: its state comes from disk.
    history = [Message("user", question), *run.result.messages]
    with _session(starter_model, folder) as later:
        [done] = [
            e
            for e in later.stream(history, "Thanks. And 4 and 5?", params, tools=[ADD], cache_key=KvKey("3", "11"))
            if isinstance(e, Finished)
        ]
    assert done.stats.kv_restored_tokens >= second.stats.prompt_tokens - 1  # past the call and its result
    assert done.stats.prompt_tokens - done.stats.cached_tokens < 64


@pytest.fixture(scope="module")
def plain_session(starter_model: Path) -> Iterator[Any]:
    """One worker for the prefix tests (no KV cache on disk: the reuse measured is the RAM's)."""
    from engine.inference.runtime import LoadParams
    from engine.inference.session import ChatSession

    with ChatSession(LoadParams(model_path=starter_model, n_ctx=2048, n_threads=2)) as session:
        yield session


@pytest.mark.parametrize(
    ("tool_choice", "max_steps"),
    [("auto", 4), ("add", 4), ("required", 4), ("auto", 1)],
    ids=["auto", "named", "required", "step-limit"],
)
def test_the_step_after_a_tool_result_reuses_the_previous_steps_prompt(
    plain_session: Any, tool_choice: str, max_steps: int
) -> None:
    from engine.inference.runtime import GenerationParams

    params = GenerationParams(temperature=0.0, max_tokens=12, repeat_penalty=1.0)
    backend = CallsOnce(plain_session)
    agent = Agent(backend, [Adder()], allow={"add"}, max_steps=max_steps)
    run = agent.run([], f"Read this log, then add 2 and 3. {DOCUMENT}", params, tool_choice=tool_choice)
    first, second = [event for event in run if isinstance(event, Finished)]
    assert [step.result.content for step in run.result.steps] == ["5"]
    assert run.result.hit_step_limit == (max_steps == 1)
    # Only what a forced first step added at its end (the fallback prompt's "You must call ..." and
    # the reply header after it) is not reused; nothing before it changed.
    note = choice_note(tool_choice, native=plain_session.template.supports_tools)
    margin = plain_session.count_text(f"\n\n{note}") + 8 if note else 1
    assert second.stats.cached_tokens >= first.stats.prompt_tokens - margin
    assert second.stats.prompt_tokens - second.stats.cached_tokens < 64 + margin  # the call and its result
