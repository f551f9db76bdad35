"""Both backends keep :class:`engine.inference.backends.ChatBackend`'s shape (mypy proves the types in
engine/inference/backends.py; this checks the names, kinds and defaults at run time too), and what the remote
one cannot do is refused, not ignored."""

from __future__ import annotations

import inspect

import pytest

from engine.errors import EngineError
from engine.inference.backends import ChatBackend
from engine.inference.remote import RemoteSession
from engine.inference.session import ChatSession

METHODS = ("load", "stream", "result_room", "count_text", "prompt_view", "close", "__enter__", "__exit__")
PROPERTIES = ("model_id", "n_ctx", "n_vocab", "thinking_controls", "local")


@pytest.mark.parametrize("backend", [ChatSession, RemoteSession])
@pytest.mark.parametrize("method", METHODS)
def test_each_backend_takes_every_keyword_of_the_protocol(backend: type, method: str) -> None:
    wanted = inspect.signature(getattr(ChatBackend, method)).parameters
    given = inspect.signature(getattr(backend, method)).parameters
    for name, parameter in wanted.items():
        assert name in given, f"{backend.__name__}.{method} has no {name!r}"
        assert given[name].kind == parameter.kind, f"{backend.__name__}.{method}: {name!r} is {given[name].kind}"
        assert given[name].default == parameter.default, f"{backend.__name__}.{method}: {name!r} default"
    extra = [n for n, p in given.items() if n not in wanted and p.default is inspect.Parameter.empty]
    assert extra == [], f"{backend.__name__}.{method} needs more than the protocol gives: {extra}"


@pytest.mark.parametrize("backend", [ChatSession, RemoteSession])
@pytest.mark.parametrize("name", PROPERTIES)
def test_each_backend_says_what_the_model_is(backend: type, name: str) -> None:
    assert isinstance(getattr(backend, name, None), property), f"{backend.__name__}.{name} is not a property"


def test_what_a_remote_model_cannot_say_is_said_so() -> None:
    session = RemoteSession("http://127.0.0.1:9", "m")  # never contacted
    try:
        assert session.local is None and session.n_vocab is None and session.n_ctx == 0
        assert session.thinking_controls == frozenset() and session.model_id == "m"
        assert session.result_room([], None) is None  # the server's template: not measured here
    finally:
        session.close()


def test_a_remote_backend_refuses_a_thinking_budget_with_one_line() -> None:
    session = RemoteSession("http://127.0.0.1:9", "m")  # never contacted: refused before any request
    try:
        with pytest.raises(EngineError, match=r"^http://127\.0\.0\.1:9: a thinking budget needs a local model"):
            list(session.stream([], "hi", thinking_budget=64))
    finally:
        session.close()
