"""Grammar and JSON-schema bombs (engine.inference.grammar_bounds): refused before llama.cpp or the
schema converter sees them, in one complete line naming the limit; llama.cpp's own reason, with a line
and a column, for a grammar it refuses; the worker alive and free afterwards. llama.cpp's own grammar
tests and grammars (from the sdist) are the reference for what parses."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineError
from engine.inference.grammar_bounds import (
    MAX_GRAMMAR_ALTERNATIVES,
    MAX_GRAMMAR_CHARS,
    MAX_GRAMMAR_EXPANSION,
    MAX_GRAMMAR_NESTING,
    MAX_SCHEMA_CHOICES,
    MAX_SCHEMA_REPETITION,
    MAX_SCHEMA_TOTAL,
    check_grammar,
    check_json_schema,
    describe_parse_error,
)
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams


def _string(**limits: Any) -> str:
    return json.dumps({"type": "object", "properties": {"s": {"type": "string", **limits}}, "required": ["s"]})


SCHEMA_BOMBS = {
    "maxLength": (
        _string(maxLength=100_000),
        f"json_schema: maxLength 100,000 at properties.s is more than a grammar can enforce here "
        f"(the limit is {MAX_SCHEMA_REPETITION:,})",
    ),
    "maxItems": (
        json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 100_000}),
        "json_schema: maxItems 100,000 is more than a grammar can enforce here "
        f"(the limit is {MAX_SCHEMA_REPETITION:,})",
    ),
    "enum": (
        json.dumps({"type": "string", "enum": [f"value-{i}" for i in range(10_000)]}),
        f"json_schema: enum has 10,000 entries (the limit is {MAX_SCHEMA_CHOICES:,})",
    ),
    "pattern": (
        _string(pattern="^(a{100}){100}$"),
        "json_schema: the pattern at properties.s repeats 10,000 times in all, more than a grammar can enforce "
        f"here (the limit is {MAX_SCHEMA_REPETITION:,})",
    ),
    "total": (
        json.dumps(
            {"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 1000} for i in range(25)}}
        ),
        f"json_schema: its lengths, counts and choices add up to more than {MAX_SCHEMA_TOTAL:,} "
        "(the limit of one schema)",
    ),
}

_MANY = "root ::= " + " | ".join(f'"{i}"' for i in range(1000))
_BAR = [i for i, ch in enumerate(_MANY) if ch == "|"][MAX_GRAMMAR_ALTERNATIVES - 1]

GRAMMAR_BOMBS = {
    "a 10^9 repetition": (
        'root ::= "a"{1000000000}',
        "grammar: a repetition of 1,000,000,000 (the limit is 2,000, llama.cpp's) at line 1, column 13",
    ),
    "nested repetitions": (
        'root ::= (("a"{0,1000}){0,1000}){0,1000}',
        "grammar: a repetition of 1,000 of an item that holds 1,001 rules (their product is over 2,000, "
        "llama.cpp's limit) at line 1, column 24",
    ),
    "repetitions nested through rules": (
        'root ::= b{0,1999}\nb ::= c{0,1999}\nc ::= "x"{0,1999}',
        f"grammar: its counted repetitions, nested through rules, describe texts longer than {MAX_GRAMMAR_EXPANSION:,} "
        f"characters (the limit is {MAX_GRAMMAR_EXPANSION:,}); no reply is that long, and checking such a grammar "
        "holds the model for minutes a token",
    ),
    "40,000 nested groups": (
        "root ::= " + "(" * 40_000 + '"a"' + ")" * 40_000,
        f"grammar: groups nested 1,025 deep (the limit is {MAX_GRAMMAR_NESTING:,}) at line 1, column 1034",
    ),
    "alternatives": (
        _MANY,
        f"grammar: more than {MAX_GRAMMAR_ALTERNATIVES:,} alternatives in one rule or group (the limit is "
        f"{MAX_GRAMMAR_ALTERNATIVES:,}) at line 1, column {_BAR + 1}",  # at the "|" that opens one too many
    ),
    "size": ('root ::= "' + "a" * MAX_GRAMMAR_CHARS + '"', f"(the limit is {MAX_GRAMMAR_CHARS:,})"),
}

INVALID_GRAMMARS = {
    'root ::= "a" | ( "b"': "grammar: expecting ')' at line 1, column 21",
    'root ::= ( "a"\n  | "b"\n': "grammar: expecting ')' at line 3, column 1",
    "root ::= foo": "grammar: Undefined rule identifier 'foo' at line 1, column 10",
    'root ::= "\\q"': "grammar: unknown escape at line 1, column 11",
    'root ::= "\\x4"': "grammar: expecting 2 hex chars at line 1, column 13",
    'root := "a"': "grammar: expecting ::= at line 1, column 6",
    'root ::= "a" )': "grammar: expecting newline or end at line 1, column 14",
    "root ::= *": "grammar: expecting preceding item to */+/?/{ at line 1, column 10",
    'root ::= "a"{x}': "grammar: expecting an int at line 1, column 14",
    'other ::= "a"': "grammar: there is no rule named root (the reply starts at root ::= ...) at line 1, column 1",
    'root ::= "unclosed': "grammar: unexpected end of input at line 1, column 10",
    "root ::= [a-": "grammar: unexpected end of input at line 1, column 10",
    "   \n ": "grammar: it is empty",
}


def _one_complete_line(message: str) -> None:
    assert "\n" not in message and "…" not in message
    assert len(message) < 400
    assert message.rstrip()[-1] in ")'0123456789ntk"  # ends a sentence or a place, never mid-word


@pytest.mark.parametrize("name", list(SCHEMA_BOMBS))
def test_a_json_schema_bomb_is_refused_before_the_converter_runs(name: str) -> None:
    schema, message = SCHEMA_BOMBS[name]
    with pytest.raises(EngineError) as caught:
        check_json_schema(schema)
    assert str(caught.value) == message
    _one_complete_line(str(caught.value))


@pytest.mark.parametrize("name", list(GRAMMAR_BOMBS))
def test_a_grammar_bomb_is_refused_before_llama_cpp_parses_it(name: str) -> None:
    grammar, message = GRAMMAR_BOMBS[name]
    with pytest.raises(EngineError) as caught:
        check_grammar(grammar)
    assert message in str(caught.value)
    _one_complete_line(str(caught.value))


@pytest.mark.parametrize("grammar", list(INVALID_GRAMMARS))
def test_an_invalid_grammar_says_why_and_where(grammar: str) -> None:
    with pytest.raises(EngineError) as caught:
        check_grammar(grammar)
    assert str(caught.value) == INVALID_GRAMMARS[grammar]


def test_large_but_ordinary_schemas_and_grammars_pass() -> None:
    fields = {f"f{i}": {"type": "string", "maxLength": 1000} for i in range(19)}
    fields["list"] = {"type": "array", "items": {"type": "string", "maxLength": 200}, "maxItems": 500}
    check_json_schema(json.dumps({"type": "object", "properties": fields}))
    check_json_schema(_string(pattern=r"^[a-z]{1,64}@[a-z]{1,255}\.[a-z]{2,12}$"))
    check_json_schema(json.dumps({"type": "string", "enum": [f"country-{i}" for i in range(MAX_SCHEMA_CHOICES)]}))
    check_grammar('root ::= "a"{0,5000}')  # llama.cpp reads an upper bound over 2,000 as none
    check_grammar('root ::= item ("," item)*\nitem ::= [a-z]{1,1999}')
    check_grammar("root ::= " + "(" * MAX_GRAMMAR_NESTING + '"a"' + ")" * MAX_GRAMMAR_NESTING)
    check_grammar("root ::= " + " | ".join(f'"{i}"' for i in range(MAX_GRAMMAR_ALTERNATIVES)))


def test_llama_cpps_reason_is_one_line_with_a_place_instead_of_the_rest_of_the_grammar() -> None:
    grammar = 'root ::= "a" | ( "b"\nnext ::= "c"'
    rest = grammar[grammar.index("\nnext") :]
    said = f"parse: error parsing grammar: expecting ')' at {rest}\n\n{grammar}\n"
    assert describe_parse_error(said, grammar) == "expecting ')' at line 1, column 21"
    said = "llama_grammar_init_impl: noise\nunsupported grammar, left recursion detected for nonterminal at index 0\n"
    assert (
        describe_parse_error(said, grammar) == "unsupported grammar, left recursion detected for nonterminal at index 0"
    )
    assert describe_parse_error("", grammar) is None


# ---------------------------------------------------------------------- llama.cpp as the reference


def _llama_grammars(source: Path) -> list[tuple[str, str]]:
    """The grammars of llama.cpp's parser and integration tests, and its grammars/ folder."""
    found: list[tuple[str, str]] = []
    for name in ("test-grammar-parser.cpp", "test-grammar-integration.cpp"):
        text = (source / "tests" / name).read_text(encoding="utf-8")
        found += [(name, g) for g in re.findall(r'R"""\((.*?)\)"""', text, re.DOTALL) if "::=" in g]
    found += [(path.name, path.read_text(encoding="utf-8")) for path in sorted((source / "grammars").glob("*.gbnf"))]
    return found


@pytest.fixture(scope="module")
def vocab(starter_model: Path) -> Iterator[Any]:
    llama_cpp = pytest.importorskip("llama_cpp")
    from engine.cpu_backend import load_backends

    backend = load_backends()
    assert backend.error is None, backend.error
    llm = llama_cpp.Llama(str(starter_model), n_ctx=64, vocab_only=True, verbose=False)
    try:
        yield llm._model.vocab
    finally:
        llm.close()


@pytest.mark.model
def test_what_llama_cpp_parses_parses_here_and_what_it_refuses_is_refused(llama_cpp_source: Path, vocab: Any) -> None:
    import llama_cpp

    from engine.inference.sampling import _with_stderr

    grammars = _llama_grammars(llama_cpp_source)
    assert len(grammars) > 40  # the tests and the folder were found
    left_recursive = 0
    for where, grammar in grammars:
        sampler, said = _with_stderr(lambda g=grammar: llama_cpp.llama_sampler_init_grammar(vocab, g.encode(), b"root"))
        theirs = bool(sampler)
        if sampler:
            llama_cpp.llama_sampler_free(sampler)
        try:
            check_grammar(grammar)
            ours = True
        except EngineError:
            ours = False
        if not theirs and ours and "left recursion" in said:
            left_recursive += 1  # llama.cpp's own check after parsing: its reason reaches the user (below)
            continue
        assert ours == theirs, (where, grammar[:200], said[:200])
    assert left_recursive >= 3  # test-grammar-integration's left-recursion cases


# ---------------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def worker(starter_model: Path) -> Iterator[InferenceWorker]:
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=512, n_threads=2, n_batch=256)) as w:
        w.start()
        yield w


def _generate(worker: InferenceWorker, params: GenerationParams) -> Any:
    gen = worker.generate(worker.tokenize("Hello", add_bos=True), params)
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value


@pytest.mark.model
@pytest.mark.slow
def test_every_bomb_through_the_worker_is_one_line_and_the_worker_goes_on(worker: InferenceWorker) -> None:
    pid = worker.pid
    cases = [GenerationParams(max_tokens=4, json_schema=schema) for schema, _ in SCHEMA_BOMBS.values()]
    cases += [GenerationParams(max_tokens=4, grammar=grammar) for grammar, _ in GRAMMAR_BOMBS.values()]
    cases += [GenerationParams(max_tokens=4, grammar=grammar) for grammar in INVALID_GRAMMARS if grammar.strip()]
    cases.append(GenerationParams(max_tokens=4, grammar='root ::= "a" | root "a"'))  # llama.cpp's own refusal
    said = []
    for params in cases:
        with pytest.raises(EngineError) as caught:
            _generate(worker, params)
        message = str(caught.value)
        assert message.startswith(("grammar: ", "json_schema: ")), message
        _one_complete_line(message)
        said.append(message)
    assert said[-1] == "grammar: unsupported grammar, left recursion detected for nonterminal at index 0"
    assert worker.alive and worker.pid == pid  # the same worker, never crashed
    done = _generate(worker, GenerationParams(max_tokens=3, temperature=0.0, grammar='root ::= "yes" | "no"'))
    assert done.text in ("yes", "no")


@pytest.mark.model
def test_a_session_refuses_a_bomb_before_the_worker_reads_the_prompt(starter_model: Path) -> None:
    from engine.inference.session import ChatSession

    with ChatSession(LoadParams(model_path=starter_model, n_ctx=512, n_threads=2)) as session:
        session.load()
        worker = session.worker
        assert worker is not None
        before = worker._tokens_out
        for params in (
            GenerationParams(max_tokens=4, json_schema=SCHEMA_BOMBS["maxLength"][0]),
            GenerationParams(max_tokens=4, grammar=GRAMMAR_BOMBS["40,000 nested groups"][0]),
        ):
            with pytest.raises(EngineError, match=r"^(json_schema|grammar): .*the limit is"):
                list(session.complete("Hello", params))
            with pytest.raises(EngineError, match=r"^(json_schema|grammar): .*the limit is"):
                list(session.stream([], "Hello", params))
        assert worker._tokens_out == before and session.last_prompt == []  # nothing was generated or read
