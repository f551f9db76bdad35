"""Anthropic's ``/v1/messages``: a reply ended by one of the request's ``stop_sequences`` answers
``stop_reason: "stop_sequence"`` and the string that matched, whole and streamed (raw HTTP: the
``anthropic`` package is not installed), while OpenAI's chat completions keep ``finish_reason:
"stop"``. Over a scripted backend that stops where the engine would and reports the stop string as
the engine does (``Finished.stop_sequence``: tests/engine/test_stop_sequence.py covers the engine)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from engine.inference.events import Event, Finished, Token
from engine.inference.runtime import GenerationParams
from tests.app.server.serve_support import KEY, ScriptedBackend, client, post
from tests.fake_backend import StreamCall

TEMPLATE_STOP = "<|im_end|>"


class StoppingBackend(ScriptedBackend):
    """The scripted reply (the user's words reversed), cut at the earliest of the request's stop
    strings and of the template's (``TEMPLATE_STOP``, which a chat turn adds to them), reporting it."""

    def __init__(self) -> None:
        super().__init__()
        self.template_text = ""  # said after the reply, as a model's end-of-turn text

    def script(self, call: StreamCall) -> Iterator[Event]:
        stops = (*call.params.stop, TEMPLATE_STOP)
        events = list(super().script(call))
        text = "".join(event.text for event in events if isinstance(event, Token)) + self.template_text
        hits = [(text.find(stop), stop) for stop in stops if stop in text]
        cut = min(hits) if hits else None
        kept = text[: cut[0]] if cut else text
        said = False
        for event in events:
            if isinstance(event, (Token, Finished)) and not said:
                said = True
                yield Token(kept, 0)  # the reply up to the stop string, as the engine shows it
            if isinstance(event, Finished) and cut is not None:
                yield dataclasses.replace(event, reason="stop", text=kept, stop_sequence=cut[1])
            elif not isinstance(event, Token):
                yield event


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerHandle, StoppingBackend]]:
    backend = StoppingBackend()
    with start_server(Paths.resolve(tmp_path / "home"), port=0, api_key=KEY, backend=backend) as handle:
        yield handle, backend


def _messages(handle: ServerHandle, body: dict[str, Any]) -> tuple[int, Any]:
    return post(handle, "/v1/messages", {"model": "fake-model", "max_tokens": 50, **body})


USER = [{"role": "user", "content": "one two three four"}]  # the reply: "four three two one"


def test_a_stop_sequence_that_matched_is_the_stop_reason(served: tuple[ServerHandle, StoppingBackend]) -> None:
    handle, backend = served
    status, body = _messages(handle, {"messages": USER, "stop_sequences": ["never", " two"]})
    assert status == 200, body
    assert body["stop_reason"] == "stop_sequence" and body["stop_sequence"] == " two"
    assert body["content"] == [{"type": "text", "text": "four three"}]
    assert backend.calls[-1].params.stop == ("never", " two")


def test_a_reply_that_ends_without_one_is_end_turn_or_max_tokens(
    served: tuple[ServerHandle, StoppingBackend],
) -> None:
    handle, backend = served
    status, body = _messages(handle, {"messages": USER, "stop_sequences": ["never"]})
    assert (status, body["stop_reason"], body["stop_sequence"]) == (200, "end_turn", None)
    # The template's end-of-turn text is a stop string of the engine's, not one the request asked for.
    backend.template_text = TEMPLATE_STOP
    status, body = _messages(handle, {"messages": USER, "stop_sequences": ["never"]})
    assert (status, body["stop_reason"], body["stop_sequence"]) == (200, "end_turn", None)
    assert body["content"][0]["text"] == "four three two one"
    backend.template_text = ""
    status, body = _messages(handle, {"messages": USER, "max_tokens": 2, "stop_sequences": ["one"]})
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None  # "one" came after the cut


def test_the_streamed_message_delta_carries_the_stop_sequence(
    served: tuple[ServerHandle, StoppingBackend],
) -> None:
    handle, _ = served
    status, events = _messages(handle, {"messages": USER, "stop_sequences": ["three"], "stream": True})
    assert status == 200
    kinds = [event.event for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    start = events[0].data["message"]
    assert start["stop_reason"] is None and start["stop_sequence"] is None
    delta = next(event.data for event in events if event.event == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "three"}
    text = "".join(event.data["delta"]["text"] for event in events if event.event == "content_block_delta")
    assert text == "four "
    status, events = _messages(handle, {"messages": USER, "stop_sequences": ["nope"], "stream": True})
    delta = next(event.data for event in events if event.event == "message_delta")
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_chat_completions_keep_finish_reason_stop(served: tuple[ServerHandle, StoppingBackend]) -> None:
    handle, _ = served
    reply = client(handle).chat.completions.create(model="fake-model", messages=USER, stop=[" two"])  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content == "four three"
    assert "stop_sequence" not in json.dumps(reply.model_dump())


def test_the_backend_cuts_where_the_engine_would(served: tuple[ServerHandle, StoppingBackend]) -> None:
    """The scripted backend itself: what it streams and reports, so the tests above test the server."""
    _, backend = served
    events = list(backend.stream([], "a b c", GenerationParams(stop=("b",))))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.stop_sequence == "b" and finished.text == "c "


@pytest.fixture(scope="module")
def real(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A server over the real starter model (a base model: the mechanics, not the answer)."""
    home = Paths.resolve(tmp_path_factory.mktemp("serve-messages-stop"))
    handle = start_server(home, port=0, model_path=starter_model, n_ctx=1024)
    yield handle
    handle.stop()


@pytest.mark.model
def test_the_real_engine_reports_the_stop_sequence(real: ServerHandle) -> None:
    """The whole path: the worker's stop matcher, the session, the server. Greedy, so the reply
    with a stop sequence is the reply without one, cut where that sequence first appears."""
    question = [{"role": "user", "content": "Name three colours of the rainbow."}]
    ask: dict[str, Any] = {"max_tokens": 24, "temperature": 0.0, "messages": question}  # the model served
    status, free = post(real, "/v1/messages", ask)
    assert status == 200, free
    text = free["content"][-1]["text"]
    words = [word for word in text.split() if len(word) >= 3]
    assert free["stop_reason"] in ("end_turn", "max_tokens") and free["stop_sequence"] is None
    assert len(words) >= 2, text
    stop = words[1]
    status, cut = post(real, "/v1/messages", {**ask, "stop_sequences": ["zzqqxx", stop]})
    assert status == 200, cut
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("stop_sequence", stop)
    assert stop not in cut["content"][-1]["text"]
    status, events = post(real, "/v1/messages", {**ask, "stop_sequences": [stop], "stream": True})
    delta = next(event.data for event in events if event.event == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
