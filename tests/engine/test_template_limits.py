"""Chat templates that are too big to compile: refused with a reason, in bounded time and memory.

The template is compiled in the app's own process (the chat session picks it), so its cost is
bounded before Jinja or Python's compiler see it: the text by MAX_TEMPLATE_BYTES, the parse tree by
MAX_TEMPLATE_NODES, the generated code by MAX_COMPILED_SOURCE. The bounds are the work done,
counted, not timed (CI machines are noisy): which of the costly steps (Jinja's parse, Jinja's code
generation, Python's compile) ran on the refused template, and the ``tracemalloc`` peak of the call.

Measured on the 2-core dev machine, before -> after: a 1 MiB template 8.3 s and a 550 MiB peak
(over 1 GB of RSS in the app) -> 0.00 s and 0 MiB; templates under the cap that compile to too
much: 0.3-1.0 s and 24-80 MiB (three of them were accepted) -> at most 0.4 s and 5 MiB.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from jinja2 import nodes
from jinja2.exceptions import SecurityError

from engine.gguf import MAX_CHAT_TEMPLATE_BYTES
from engine.inference import template_sandbox, template_switches
from engine.inference.template_sandbox import GuardedEnvironment
from engine.inference.templates import (
    MAX_COMPILED_SOURCE,
    MAX_TEMPLATE_BYTES,
    MAX_TEMPLATE_NODES,
    ChatTemplate,
    select_template,
)

MIB = 1 << 20
HEAD = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@dataclass
class Work:
    """The sizes of what each costly step of compiling a template was given, in one call."""

    parsed: list[int] = field(default_factory=list)  # characters of template Jinja parsed
    generated: list[int] = field(default_factory=list)  # syntax nodes Jinja generated code for
    compiled: list[int] = field(default_factory=list)  # characters of Python that Python compiled


def measured(fn: Callable[[], ChatTemplate], monkeypatch: pytest.MonkeyPatch) -> tuple[Work, int, ChatTemplate]:
    """(the work of a first call, the tracemalloc peak of a second one, the result)."""
    work = Work()
    real_parse = GuardedEnvironment.parse
    real_generate = GuardedEnvironment.compile

    def parse(self: GuardedEnvironment, source: str, *args: Any, **kwargs: Any) -> Any:
        work.parsed.append(len(source))
        return real_parse(self, source, *args, **kwargs)

    def generate(self: GuardedEnvironment, source: Any, *args: Any, **kwargs: Any) -> Any:
        work.generated.append(sum(1 for _ in source.find_all(nodes.Node)) if isinstance(source, nodes.Node) else -1)
        return real_generate(self, source, *args, **kwargs)

    def python_compile(source: Any, *args: Any, **kwargs: Any) -> Any:
        work.compiled.append(len(source))
        return compile(source, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(GuardedEnvironment, "parse", parse)
        patch.setattr(GuardedEnvironment, "compile", generate)
        patch.setattr(template_sandbox, "compile", python_compile, raising=False)
        result = fn()
    tracemalloc.start()
    try:
        fn()
        return work, tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def filled(unit: str) -> str:
    """HEAD, then ``unit`` repeated to just under the size cap."""
    return HEAD + unit * ((MAX_TEMPLATE_BYTES - len(HEAD)) // len(unit))


def test_the_cap_is_the_readers_cap() -> None:
    assert MAX_TEMPLATE_BYTES == MAX_CHAT_TEMPLATE_BYTES == 64 << 10


@pytest.mark.parametrize(
    ("marker", "architecture", "expected"),
    [("<|im_start|>", "llama", "chatml"), ("", "gemma3", "gemma"), ("", "phi3", "phi3")],
)
def test_a_1_mib_template_is_refused_before_it_is_compiled(
    marker: str, architecture: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bound: never parsed, and a 1 MiB tracemalloc peak (before: parsed and compiled, 8.3 s, 550 MiB).
    # The fallback is chosen as for any rejected template (its markers, else the architecture), with the reason.
    template = HEAD + marker + "{{ messages[0].content }}" * (MIB // 25)
    work, peak, chosen = measured(lambda: select_template(template, architecture, "<s>", "</s>"), monkeypatch)
    assert max(work.parsed, default=0) <= MAX_TEMPLATE_BYTES, work  # the fallback's own template may be parsed
    assert max(work.compiled, default=0) <= MAX_COMPILED_SOURCE, work
    assert peak < MIB
    assert (chosen.source, chosen.name) == ("fallback", expected)
    assert chosen.reason == (
        f"the model's chat template was rejected (it is {len(template)} bytes, over the {MAX_TEMPLATE_BYTES}-byte "
        f"limit for a chat template); using the {expected} format"
    )
    assert "Hi there" in chosen.render(CONVERSATION)


def test_the_cap_counts_utf8_bytes_and_admits_a_template_at_it() -> None:
    at_cap = HEAD + "x" * (MAX_TEMPLATE_BYTES - len(HEAD))
    assert select_template(at_cap, "llama", "", "").source == "gguf"
    assert "over the 65536-byte limit" in select_template(at_cap + "x", "llama", "", "").reason
    accented = HEAD + "é" * 40_000  # 40,000 characters, under the cap; 80,000 bytes, over it
    assert len(accented) < MAX_TEMPLATE_BYTES
    assert f"it is {len(accented.encode())} bytes" in select_template(accented, "llama", "", "").reason


def test_a_large_realistic_template_is_still_used() -> None:
    # A real-style template with a 60 KB built-in system prompt: far from the node and code caps.
    prompt = "You are a careful assistant. " * 2100
    template = (
        "{% if messages[0].role != 'system' %}<|system|>" + prompt + "{% endif %}"
        "{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content | trim }}"
        "{% elif m.role == 'assistant' %}<|assistant|>{{ m.content }}{% else %}<|system|>{{ m.content }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    assert 60_000 < len(template) <= MAX_TEMPLATE_BYTES
    chosen = select_template(template, "llama", "", "")
    assert (chosen.source, chosen.reason) == ("gguf", "the model's own chat template")
    assert chosen.render(CONVERSATION) == "<|system|>Be brief.<|user|>Hi there<|assistant|>"


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (filled("{{ x }}"), "characters of code, over the"),
        (filled("{% if x %}" * 90 + "a" + "{% endif %}" * 90), "characters of code, over the"),
        (
            HEAD + "".join(f"{{% macro m{i}(a) %}}{{{{ a }}}}{{% endmacro %}}" for i in range(1400)),
            "characters of code, over the",
        ),
        (filled("{{ x(" + ",".join(["1"] * 1000) + ") }}"), "syntax nodes, over the"),
        (filled("{% set a = [" + ",".join(["1"] * 5000) + "] %}"), "syntax nodes, over the"),
    ],
    ids=["outputs", "nested-ifs", "macros", "call-arguments", "list-literal"],
)
def test_templates_under_the_cap_that_compile_to_too_much_are_refused(
    template: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bound: Python never compiles more than MAX_COMPILED_SOURCE characters, Jinja never generates
    # code for more than MAX_TEMPLATE_NODES nodes, and a 16 MiB tracemalloc peak (before: 24-80 MiB,
    # and the nested-ifs, macros and list-literal templates were accepted).
    assert len(template) <= MAX_TEMPLATE_BYTES
    work, peak, chosen = measured(lambda: select_template(template, "llama", "", ""), monkeypatch)
    assert len(template) in work.parsed, work  # it was parsed: the caps below are what stopped it
    assert max(work.generated, default=0) <= MAX_TEMPLATE_NODES, work
    assert max(work.compiled, default=0) <= MAX_COMPILED_SOURCE, work
    assert peak < 16 * MIB
    assert chosen.source == "fallback"
    assert reason in chosen.reason
    assert str(MAX_COMPILED_SOURCE if "code" in reason else MAX_TEMPLATE_NODES) in chosen.reason


def test_compile_guarded_refuses_an_oversized_template_itself() -> None:
    # Whoever compiles without select_template gets the same refusal, before any parsing.
    env = GuardedEnvironment()
    with pytest.raises(SecurityError, match=r"^it is 1048576 bytes, over the 65536-byte limit"):
        env.compile_guarded("x" * MIB)
    with pytest.raises(SecurityError, match=r"syntax nodes, over the 16384 limit$"):
        env.compile_guarded(filled("{{ x(" + ",".join(["1"] * 1000) + ") }}"))


def test_a_template_naming_1500_switches_costs_a_bounded_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each switch costs a pass over the template's comparisons: only MAX_SWITCHES are looked at.
    names = [f"think_{i}" for i in range(1500)]
    template = HEAD + "".join(f"{{% if {n} == 'x' %}}{{% endif %}}" for n in names)
    assert len(template) <= MAX_TEMPLATE_BYTES
    passes: list[str] = []
    real = template_switches._switch
    monkeypatch.setattr(template_switches, "_switch", lambda index, name: passes.append(name) or real(index, name))
    chosen = select_template(template, "llama", "", "")
    assert chosen.source == "gguf", chosen.reason
    assert len(passes) == len(chosen.switches) == template_switches.MAX_SWITCHES
    assert [s.name for s in chosen.switches] == names[: template_switches.MAX_SWITCHES]
    assert chosen.switches[0].values == ("x",)
