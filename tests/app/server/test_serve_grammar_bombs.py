"""``glassbox serve`` answers grammar and JSON-schema bombs with a 400 naming the field and the limit, from
the official ``openai`` client, and goes on serving (engine.inference.grammar_bounds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from tests.engine.test_grammar_bounds import GRAMMAR_BOMBS, INVALID_GRAMMARS, SCHEMA_BOMBS

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def served(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    home = Paths.resolve(tmp_path_factory.mktemp("serve-bombs"))
    handle = start_server(home, port=0, model_path=starter_model, n_ctx=1024)
    yield handle
    handle.stop()


@pytest.fixture
def api(served: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=120)


ASK = [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize("name", list(SCHEMA_BOMBS))
def test_a_json_schema_bomb_is_a_400_naming_the_limit(api: openai.OpenAI, served: ServerHandle, name: str) -> None:
    schema, message = SCHEMA_BOMBS[name]
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model=served.model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "bomb", "schema": json.loads(schema)}},
        )
    assert caught.value.status_code == 400
    assert message.split(": ", 1)[1] in str(caught.value)


# The size bomb is the server's own limit first (test_serve_hostile); every other one reaches the engine.
BOMBS = [grammar for name, (grammar, _) in GRAMMAR_BOMBS.items() if name != "size"]


@pytest.mark.parametrize("grammar", BOMBS + [g for g in INVALID_GRAMMARS if g.strip()])
def test_a_grammar_bomb_or_an_invalid_grammar_is_a_400_with_the_reason(
    api: openai.OpenAI, served: ServerHandle, grammar: str
) -> None:
    expected = dict(GRAMMAR_BOMBS.values()).get(grammar) or INVALID_GRAMMARS[grammar]
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model=served.model,
            messages=ASK,
            max_tokens=8,
            extra_body={"grammar": grammar},  # type: ignore[arg-type]
        )
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    assert expected.split("grammar: ", 1)[1] in body["message"]  # complete, with the place or the limit
    assert body.get("param") == "grammar"


def test_the_server_goes_on_after_the_bombs(api: openai.OpenAI, served: ServerHandle) -> None:
    for grammar in BOMBS:
        with pytest.raises(openai.BadRequestError):
            api.completions.create(model=served.model, prompt="Hello", max_tokens=4, extra_body={"grammar": grammar})
    reply = api.chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "Is the sky blue?"}],
        max_tokens=4,
        temperature=0.0,
        extra_body={"grammar": 'root ::= "yes" | "no"'},
    )
    assert reply.choices[0].message.content in ("yes", "no")
