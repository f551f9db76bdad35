"""The sandbox speaks transformers' Jinja dialect, and its few extensions stay contained.

Each small template is rendered by Glassbox's sandbox and by transformers' reference renderer
(`render_jinja_template`) on the same context; the extensions ARCHITECTURE.md lists (a template's
own lists and dicts may change, `tojson` writes iterators, `{% do %}`) are checked on their own,
with what they must still refuse.
"""

from __future__ import annotations

import tracemalloc
from types import ModuleType
from typing import Any

import pytest

from engine.inference.template_sandbox import GuardedEnvironment

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": 'Say "<hi>" & go'},
    {"role": "assistant", "content": "Hi."},
]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "Does f.", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def hf() -> ModuleType:
    from transformers.utils import chat_template_utils

    return chat_template_utils


def glassbox(source: str, timeout_s: float = 2.0, **context: Any) -> str:
    env = GuardedEnvironment()
    template = env.compile_guarded(source)
    full = {"messages": MESSAGES, "tools": None, "documents": None, "add_generation_prompt": True, **context}
    return env.render_guarded(template, full, timeout_s)


def reference(hf: ModuleType, source: str, **context: Any) -> str:
    tools = context.pop("tools", None)
    rendered, _ = hf.render_jinja_template(
        [MESSAGES], tools=tools, chat_template=source, add_generation_prompt=True, **context
    )
    return str(rendered[0])


SAME_AS_REFERENCE = {
    "generation tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{% set inner = 'x' %}"
        "{{ m.content }}{% endgeneration %}[{{ inner is defined }}]{% else %}{{ m.content }}{% endif %}{% endfor %}"
    ),
    "loop controls": (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.role }};"
        "{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}"
    ),
    "tojson's arguments": (
        "{{ tools | tojson }}|{{ tools | tojson(indent=2) }}|{{ tools[0] | tojson(sort_keys=true) }}|"
        "{{ {'é': '<&>'} | tojson(ensure_ascii=true) }}|{{ tools | tojson(separators=(',', ':')) }}"
    ),
    "tojson joined with text": "{{ '<|tool|>' + tools|tojson + '</tool>' ~ messages[1].content|tojson }}",
    "strftime_now": "{{ strftime_now('%Y') }}",
    "dict() and namespace": (
        "{% set d = dict(a=1, b=[1, 2]) %}{% set ns = namespace(n=0) %}"
        "{% for k in d %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ d | tojson }} {{ ns.n }}"
    ),
    "special tokens": "{{ bos_token }}{% if add_generation_prompt %}GO{{ eos_token }}{% endif %}",
    "undefined and defaults": "{{ missing | default('none') }}{% if tools is none %}no tools{% endif %}",
}


@pytest.mark.parametrize("source", SAME_AS_REFERENCE.values(), ids=SAME_AS_REFERENCE.keys())
def test_renders_as_the_reference(source: str, hf: ModuleType) -> None:
    context = {"bos_token": "<s>", "eos_token": "</s>", "tools": TOOLS}
    assert glassbox(source, **context) == reference(hf, source, **context)


@pytest.mark.parametrize(
    "source",
    [
        "{{ raise_exception('roles must alternate') }}",
        "{% set ns = namespace(_hidden=1) %}{{ ns._hidden }}",
        "{% set ns = namespace() %}{% set ns._hidden = 1 %}{{ 'x' }}",
        "{{ messages.append(1) }}",
    ],
)
def test_refuses_what_the_reference_refuses(source: str, hf: ModuleType) -> None:
    with pytest.raises(Exception):  # noqa: B017, PT011 - any refusal: the two renderers word it apart
        reference(hf, source)
    with pytest.raises(Exception):  # noqa: B017, PT011
        glassbox(source)


def test_a_template_changes_only_the_containers_it_built(hf: ModuleType) -> None:
    # Kimi-K2's pattern: a namespace holding a list the template appends to and pops from.
    source = (
        "{% set queue = namespace(ids=[]) %}{% set seen = {} %}{% for m in messages %}"
        "{% set _ = queue.ids.append(m.role) %}{% set _ = seen.update({m.role: loop.index}) %}{% endfor %}"
        "{{ queue.ids.pop(0) }} {{ queue.ids | tojson }} {{ seen | tojson }}"
    )
    assert glassbox(source) == 'system ["user", "assistant"] {"system": 1, "user": 2, "assistant": 3}'
    with pytest.raises(Exception, match="unsafe"):  # the reference's immutable sandbox refuses it
        reference(hf, source)
    for hostile in (
        "{% set _ = messages.append({'role': 'user', 'content': 'injected'}) %}",
        "{% set box = {'m': messages} %}{% set _ = box['m'].append(1) %}",
        "{% set xs = messages | list %}{% set _ = xs.append(1) %}",
        "{% set _ = tools[0].update({'x': 1}) %}",
    ):
        with pytest.raises(Exception, match="unsafe"):
            glassbox(hostile, tools=[dict(t) for t in TOOLS])


@pytest.mark.parametrize(
    "source",
    [
        "{% set xs = [] %}{% for i in range(100000) %}{% for j in range(100) %}"
        "{% set _ = xs.append(j) %}{% endfor %}{% endfor %}",
        "{% set d = {} %}{% for i in range(100000) %}{% for j in range(100) %}"
        "{% set _ = d.update({i * 100 + j: i}) %}{% endfor %}{% endfor %}",
    ],
)
def test_growing_its_own_containers_is_refused_by_the_size_limits(source: str) -> None:
    with pytest.raises(Exception, match=r"built|grew"):  # long before the time limit
        glassbox(source, timeout_s=600)


def test_a_container_extended_with_itself_is_refused_in_bounded_memory() -> None:
    source = "{% set xs = ['x' * 1000] %}{% for i in range(40) %}{% set _ = xs.extend(xs) %}{% endfor %}"
    tracemalloc.start()
    try:
        with pytest.raises(Exception, match="grew"):
            glassbox(source, timeout_s=600)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_tojson_writes_what_map_returns_as_a_list(hf: ModuleType) -> None:
    # llama.cpp's DeepSeek R1 template: `tools | map(attribute='function') | tojson`.
    source = "{{ tools | map(attribute='function') | tojson }}"
    assert (
        glassbox(source, tools=TOOLS) == '[{"name": "f", "description": "Does f.", "parameters": {"type": "object"}}]'
    )
    with pytest.raises(TypeError, match="generator"):
        reference(hf, source, tools=TOOLS)


def test_do_tag_is_accepted() -> None:
    source = "{% set xs = [] %}{% do xs.append(messages[1].content) %}{{ xs[0] }}"
    assert glassbox(source) == 'Say "<hi>" & go'
