"""Chat templates: fallbacks render exact strings, hostile templates never run code, time limits fire."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.errors import TemplateError
from engine.inference import template_sandbox
from engine.inference.template_sandbox import GuardedEnvironment
from engine.inference.templates import (
    ChatTemplate,
    fallback_template,
    guess_format,
    select_template,
)

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""A well-behaved Qwen-style template; hostile payloads are appended to it so that only the payload
can make selection fail."""

EXPECTED = {
    "chatml": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    ),
    "gemma": (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    ),
    "llama3": (
        "<bos><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "mistral": "<bos>[INST] Be brief.\n\nHi [/INST] Hello!<eos>[INST] Bye [/INST]",
    "phi3": (
        "<bos><|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
        "<|user|>\nBye<|end|>\n<|assistant|>\n"
    ),
    "plain": "<bos>System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: Bye\n\nAssistant:",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fallback_renders_the_exact_prompt(name: str) -> None:
    template = fallback_template(name, "test", "<bos>", "<eos>")  # type: ignore[arg-type]
    assert template.source == "fallback"
    assert template.render(CONVO) == EXPECTED[name]


def test_fallback_without_generation_prompt_ends_after_the_last_turn() -> None:
    template = fallback_template("chatml", "test")
    assert template.render(CONVO[:3], add_generation_prompt=False).endswith("Hello!<|im_end|>\n")


@pytest.mark.parametrize(("name", "trims"), [("gemma", True), ("llama3", True), ("chatml", False)])
def test_gemma_and_llama3_strip_message_text_like_their_own_templates(name: str, trims: bool) -> None:
    template = fallback_template(name, "test", "<bos>", "<eos>")  # type: ignore[arg-type]
    padded = [CONVO[0]] + [{"role": m["role"], "content": f"\n {m['content']} \n"} for m in CONVO[1:]]
    assert (template.render(padded) == EXPECTED[name]) is trims


def test_folded_system_prompt_without_a_user_turn_becomes_one() -> None:
    template = fallback_template("gemma", "test", "<bos>")
    assert template.render([{"role": "system", "content": "S"}]) == (
        "<bos><start_of_turn>user\nS<end_of_turn>\n<start_of_turn>model\n"
    )


def test_unknown_fallback_name_is_a_typed_error() -> None:
    with pytest.raises(TemplateError, match="unknown fallback format"):
        fallback_template("nope", "test")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("architecture", "bos", "expected"),
    [
        ("gemma3", "<bos>", "gemma"),
        ("gemma2", "<bos>", "gemma"),
        ("qwen2", None, "chatml"),
        ("qwen3", None, "chatml"),
        ("phi3", "<s>", "phi3"),
        ("mistral", "<s>", "mistral"),
        ("llama", "<|begin_of_text|>", "llama3"),
        ("llama", "<s>", "chatml"),
        ("some-new-arch", None, "chatml"),
    ],
)
def test_missing_template_falls_back_by_architecture(architecture: str, bos: str | None, expected: str) -> None:
    template = select_template(None, architecture, bos, "<eos>")
    assert (template.name, template.source) == (expected, "fallback")
    assert "no chat template" in template.reason
    assert expected in template.reason


def test_starter_model_choice_is_gemma() -> None:
    # The Gemma 3 270M starter GGUF (a base model) has no tokenizer.chat_template: checked with a
    # GGUF header dump; its vocabulary does have <start_of_turn>/<end_of_turn>.
    template = select_template(None, "gemma3", "<bos>", "<eos>")
    assert template.name == "gemma"
    assert template.stop == ("<end_of_turn>", "<eos>")
    assert template.render(CONVO) == EXPECTED["gemma"]


def test_good_gguf_template_is_used_and_sandboxed_render_matches() -> None:
    template = select_template(CHATML, "qwen2", None, "<|endoftext|>")
    assert (template.name, template.source) == ("gguf", "gguf")
    assert template.stop == ("<|im_end|>", "<|endoftext|>")
    assert template.render(CONVO) == EXPECTED["chatml"]


def test_template_with_common_hf_features_renders() -> None:
    source = (
        "{{ bos_token }}{% set ns = namespace(first=true) %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{{ m.role | upper }}:{{ m.content | trim }}|{{ strftime_now('%Y')[:2] }}|{{ tools | tojson }}\n"
        "{% set ns.first = false %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )
    template = select_template(source, "llama", "<s>", "</s>")
    assert template.source == "gguf", template.reason
    rendered = template.render([{"role": "user", "content": " x "}])
    assert rendered == f"<s>USER:x|{time.strftime('%Y')[:2]}|null\nASSISTANT:"
    concat = select_template(
        "{% for m in messages %}{{ m.role ~ ':' ~ 12345678 ~ m.content }}{% endfor %}", "x", None, None
    )
    assert concat.render([{"role": "user", "content": "x"}]) == "user:12345678x"


def test_tojson_is_plain_text_so_concatenating_it_escapes_nothing() -> None:
    # Jinja's Markup + str escapes the str; tojson must return a str (as transformers' does), or
    # `'<|tag|>' + x|tojson` prints `&lt;|tag|&gt;` and `&#34;` (DeepSeek, gpt-oss, Granite did).
    source = (
        "{% for m in messages %}{{ '<|' + m.role + '|>' + m.content|tojson + '<\\'' }}"
        "{{ {'q': m.content}|tojson(separators=(',', ':'), indent=None) }}{% endfor %}"
    )
    template = select_template(source, "llama", None, None)
    assert template.source == "gguf", template.reason
    rendered = template.render([{"role": "user", "content": 'say "<hi>" & go'}])
    assert rendered == '<|user|>"say \\"<hi>\\" & go"<\'{"q":"say \\"<hi>\\" & go"}'
    assert "&" + "lt;" not in rendered and "&#34;" not in rendered


def test_template_rejecting_system_role_folds_it_into_the_first_user_turn() -> None:
    source = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}"
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    )
    template = select_template(source, "gemma", "<bos>", "<eos>")
    assert (template.source, template.fold_system) == ("gguf", True)
    assert "System role not supported" in template.reason
    assert template.render(CONVO[:2]) == "<user>Be brief.\n\nHi"


def test_template_dropping_the_system_prompt_gets_it_folded() -> None:
    source = "{% for m in messages if m.role != 'system' %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    template = select_template(source, "llama", None, None)
    assert (template.source, template.fold_system) == ("gguf", True)
    assert "drops the system prompt" in template.reason
    assert template.render(CONVO[:2]) == "<user>Be brief.\n\nHi"


def test_template_refusing_a_conversation_at_render_time_is_one_line_error() -> None:
    source = (
        "{% for m in messages %}{% if m.content == 'forbidden' %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}{{ m.content }}{% endfor %}"
    )
    template = select_template(source, "llama", None, None)
    assert template.source == "gguf"
    with pytest.raises(TemplateError) as caught:
        template.render([{"role": "user", "content": "forbidden"}])
    assert str(caught.value) == "chat template: the template refused the conversation: roles must alternate"


@pytest.mark.parametrize(
    "payload",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ('' ~ cycler).__class__ }}",
        "{{ cycler.__init__.__globals__.os.system('touch CANARY') }}",
        "{{ joiner.__init__.__globals__['os'].popen('touch CANARY').read() }}",
        "{{ namespace.__init__.__globals__.os.system('touch CANARY') }}",
        "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch CANARY') }}",
        "{{ lipsum.__globals__['os'].system('touch CANARY') }}",
        "{{ lipsum.__globals__.__builtins__.__import__('os').system('touch CANARY') }}",
        "{{ '{0.__init__.__globals__[os].system}'.format(cycler) }}",
        "{{ ('{0.__class__.__mro__}'|attr('format'))(cycler) }}",
        "{{ '{c.__class__}'.format_map({'c': cycler}) }}",
        "{{ (cycler|attr('__init__')|attr('__globals__'))['os'].system('touch CANARY') }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{% do messages.append({'role': 'user', 'content': 'injected'}) %}",
        "{% set _ = messages[0].update({'content': 'changed'}) %}",
        "{{ messages.pop() }}",
        "{{ range.__globals__ }}",
        "{{ raise_exception.__globals__['os'].system('touch CANARY') }}",
    ],
)
def test_sandbox_escape_attempts_never_run_code_and_fall_back(payload: str, tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    hostile = payload.replace("CANARY", str(canary)) + CHATML
    template = select_template(hostile, "qwen2", None, None)
    assert not canary.exists()
    assert (template.source, template.name) == ("fallback", "chatml")
    assert "rejected" in template.reason
    assert "unsafe" in template.reason


def test_messages_are_not_mutated_by_a_template(tmp_path: Path) -> None:
    template = fallback_template("chatml", "test")
    convo = [dict(m) for m in CONVO]
    template.render(convo)
    assert convo == CONVO


@pytest.mark.parametrize(
    "source",
    [
        "{% for m in messages %}{{ m.content }}",
        "{{ messages[0].content ",
        "{% glassbox_unknown_tag %}{{ messages }}{% endglassbox_unknown_tag %}",
        "{% for %}",
    ],
)
def test_syntax_errors_fall_back_with_a_reason(source: str) -> None:
    template = select_template(source, "gemma3", "<bos>", "<eos>")
    assert (template.source, template.name) == ("fallback", "gemma")
    assert "rejected" in template.reason


@pytest.fixture
def template_clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A clock for the sandbox that moves ``step`` (10 ms) at every look, so a 0.3 s deadline passes
    after 30 looks on any machine, however slow; ``checks`` counts the deadline checks made (a loop
    checks at every iteration). Past 1,000,000 checks the render is failed: a loop the deadline did
    not stop."""
    clock = SimpleNamespace(now=0.0, step=0.01, checks=0)
    real_check = GuardedEnvironment.check

    def monotonic() -> float:
        clock.now += clock.step
        return float(clock.now)

    def check(self: GuardedEnvironment) -> None:
        clock.checks += 1
        if clock.checks > 1_000_000:
            raise AssertionError("the deadline did not stop the loop")
        real_check(self)

    monkeypatch.setattr(template_sandbox, "time", SimpleNamespace(monotonic=monotonic))
    monkeypatch.setattr(GuardedEnvironment, "check", check)
    return clock


@pytest.mark.parametrize(
    "source",
    [
        # Each of these would run for minutes (10^10 iterations or more) without the time limit.
        "{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x"
        "{% endfor %}{% endfor %}{% endfor %}",
        "{% for m in messages recursive %}{{ loop(['ab' * 50000]) }}{% endfor %}",
    ],
)
def test_time_limit_stops_huge_loops(source: str, template_clock: SimpleNamespace) -> None:
    # Bound, counted on a clock that moves 10 ms a look: at most 2,000 checks (960 here: 30 looks,
    # one every 32 checks), not 10^10 iterations; a slow machine changes none of it.
    template = select_template(source + CHATML, "qwen2", None, None, timeout_s=0.3)
    assert template.source == "fallback"
    assert "took too long" in template.reason or "recursed" in template.reason
    assert template_clock.checks <= 2000, f"{template_clock.checks} checks"


def test_time_limit_also_applies_when_rendering_later(template_clock: SimpleNamespace) -> None:
    # Passes validation (4 messages) but loops for minutes on a longer conversation.
    source = (
        "{% for a in range(100000 if messages|length > 5 else 1) %}{% for b in range(100000) %}"
        "{% endfor %}{% endfor %}" + CHATML
    )
    template_clock.step = 0.0  # the validation's 100,000 iterations run to their end
    template = select_template(source, "qwen2", None, None, timeout_s=0.3)
    assert template.source == "gguf"
    template_clock.step, template_clock.checks = 0.01, 0
    with pytest.raises(TemplateError, match="took too long"):
        template.render(CONVO * 2)
    assert template_clock.checks <= 2000, f"{template_clock.checks} checks"


def test_a_template_that_hangs_on_tools_is_probed_once_and_kept_without_them(template_clock: SimpleNamespace) -> None:
    # Its chats render; given tools it loops for minutes: one probe runs into the deadline, and
    # none after it.
    source = (
        "{% if tools %}{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
        "{% endif %}" + CHATML
    )
    template = select_template(source, "qwen2", None, None, timeout_s=0.3)
    assert (template.source, template.supports_tools) == ("gguf", False)
    assert template_clock.checks <= 2000, f"{template_clock.checks} checks"


@pytest.mark.parametrize(
    "source",
    [
        "{% set ns = namespace(s='xy') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{{ 'x' * 1000000000 }}",
        "{% set a = 'x' * 500000 %}{% set b = a ~ a %}{% set c = b ~ b %}{% set d = c ~ c %}{{ d ~ d }}",
        "{% set a = 'x' * 500000 %}{% set b = a + a %}{% set c = b + b %}{% set d = c + c %}{{ d + d }}",
        "{{ 'x' | center(1000000000) }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ '%999999999d' % 1 }}",
        "{{ '%*d' % (999999999, 1) }}",
        "{{ 10 ** 100000000 }}",
        "{{ messages | tojson(indent=999999999) }}",
        "{% set a = 'x' * 500000 %}{% set b %}{{ a }}{{ a }}{{ a }}{% endset %}{% set c %}{{ b }}{{ b }}{% endset %}",
        "{{ (['x'] * 900000) | map('center', 999999) | join }}",
        "{{ lipsum(999999) }}",
    ],
)
def test_memory_blowups_are_refused(source: str) -> None:
    # Bound: refused within a 128 MiB tracemalloc peak (0.2-68 MiB here; the blowups ask for GBs).
    tracemalloc.start()
    try:
        template = select_template(source + CHATML, "qwen2", None, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 128 << 20, f"{peak >> 20} MiB"
    assert template.source == "fallback"
    assert "unsafe" in template.reason


def test_template_that_ignores_the_messages_is_rejected() -> None:
    template = select_template("Hello{{ eos_token }}", "phi3", "<s>", "<|endoftext|>")
    assert (template.source, template.name) == ("fallback", "phi3")
    assert "does not contain the messages" in template.reason


def test_rejected_template_markers_choose_the_fallback_format() -> None:
    # A Gemma-format template under a "llama" architecture that fails to parse.
    source = "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>"
    assert guess_format(source, "llama", "<s>") == "gemma"
    template = select_template(source, "llama", "<bos>", "<eos>")
    assert template.name == "gemma"


def test_chat_template_is_frozen() -> None:
    template = fallback_template("chatml", "test")
    assert isinstance(template, ChatTemplate)
    with pytest.raises(AttributeError):
        template.name = "other"  # type: ignore[misc]


GEMMA3_STYLE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""
"""A fixture in the style of the Gemma 3 instruction-tuned models' template."""


def test_gemma_fallback_matches_a_gemma_style_model_template() -> None:
    template = select_template(GEMMA3_STYLE, "gemma3", "<bos>", "<eos>")
    assert (template.source, template.fold_system) == ("gguf", False), template.reason
    assert template.stop == ("<end_of_turn>", "<eos>")
    assert template.render(CONVO) == EXPECTED["gemma"]
    with pytest.raises(TemplateError, match="roles must alternate"):
        template.render([{"role": "assistant", "content": "first"}])


def test_rendering_a_long_conversation_costs_in_proportion_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Bound, counted, not timed: at most 32 sandbox checks a message (16.5 here) and at most twice
    # the output's characters size-checked (1.04x here): linear in the conversation.
    template = select_template(GEMMA3_STYLE, "gemma3", "<bos>", "<eos>")
    long = [{"role": "system", "content": "s"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 50} for i in range(400)
    ]
    checks = [0]
    counted = [0]
    real_check, real_count = GuardedEnvironment.check, GuardedEnvironment._count

    def check(self: GuardedEnvironment) -> None:
        checks[0] += 1
        real_check(self)

    def count(self: GuardedEnvironment, size: int) -> None:
        counted[0] += size
        real_count(self, size)

    monkeypatch.setattr(GuardedEnvironment, "check", check)
    monkeypatch.setattr(GuardedEnvironment, "_count", count)
    rendered = template.render(long)
    assert rendered.count("<start_of_turn>") == 401
    assert checks[0] <= 32 * len(long), checks[0]
    assert counted[0] <= 2 * len(rendered), counted[0]


@pytest.mark.model
def test_gemma_fallback_tokenizes_to_the_starter_models_special_tokens(starter_model: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    model = llama_cpp.Llama(str(starter_model), vocab_only=True, verbose=False)
    try:
        template = select_template(None, "gemma3", "<bos>", "<eos>")
        prompt = template.render(CONVO)
        ids = model.tokenize(prompt.encode(), add_bos=False, special=True)
        start, end = (
            model.tokenize(t.encode(), add_bos=False, special=True) for t in ("<start_of_turn>", "<end_of_turn>")
        )
        assert len(start) == 1
        assert len(end) == 1
        assert ids[0] == model.token_bos()
        assert ids.count(model.token_bos()) == 1
        assert ids.count(start[0]) == 4
        assert ids.count(end[0]) == 3
    finally:
        model.close()
