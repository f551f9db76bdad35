"""The cases of the formats that write each argument between tags (the XML ones, GLM's pairs,
MiniMax, DeepSeek's DSML, MiniCPM): see ``tests/engine/call_format_cases.py``."""

from __future__ import annotations

from tests.engine.call_format_cases import CODE, CONFIG, LS, PARIS, PARIS_2, WRITE, Case

DS = "｜DSML｜"
M3 = "]<]minimax[>["


def _qwen(name: str, **params: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def _glm(name: str, sep: str = "", **params: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in params.items())
    return f"<tool_call>{name}{sep}{body}</tool_call>"


XML_CASES: list[Case] = [
    # ------------------------------------------------------------ <function=...><parameter=...>
    # (Qwen3-Coder/3.5, Nemotron 3, StepFun)
    Case(
        "qwen_xml-after-opened-thinking",
        "qwen_xml",
        "I'm\nthinking\n</think>\n\n" + _qwen("get_weather", city="Paris", days="2"),
        reasoning="I'm\nthinking\n",
        calls=[PARIS_2],
        started=True,
    ),
    Case(
        "qwen_xml-parallel",
        "qwen_xml",
        _qwen("get_weather", city="Paris") + "\n" + _qwen("run", command="ls -la"),
        calls=[PARIS, LS],
    ),
    Case(
        "qwen_xml-text-then-call",
        "qwen_xml",
        "Let me look.\n" + _qwen("run", command="ls -la") + "\nThat is all.",
        content="Let me look.That is all.",
        calls=[LS],
    ),
    Case(
        "qwen_xml-call-inside-opened-thinking",
        "qwen_xml",
        "Need to list files.\n" + _qwen("run", command="ls -la"),
        reasoning="Need to list files.\n",
        calls=[LS],
        started=True,
    ),
    Case(
        "qwen_xml-closing-markup-in-a-value",
        "qwen_xml",
        _qwen("write_file", path="a.py", content=CODE),
        calls=[WRITE],
    ),
    Case(
        "qwen_xml-without-the-opening-tag",
        "qwen_xml",
        "<function=run>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>",
        calls=[LS],
    ),
    Case(
        "qwen_xml-typed-by-the-schema",
        "qwen_xml",
        _qwen("set_config", config='{"theme": "dark", "limits": {"n": [1, 2]}}', tags='["a", "b"]', on="true")
        + _qwen("note", text="null", n="12 apples")
        + _qwen("note", text="123 Main St", n="7")
        + _qwen("run", command="42"),
        calls=[
            CONFIG,
            ("note", {"text": None, "n": "12 apples"}),
            ("note", {"text": "123 Main St", "n": 7}),
            ("run", {"command": "42"}),
        ],
    ),
    Case(
        "qwen_xml-no-arguments",
        "qwen_xml",
        "<tool_call>\n<function=ping>\n</function>\n</tool_call>",
        calls=[("ping", {})],
    ),
    Case(
        "qwen_xml-cut-off",
        "qwen_xml",
        "<tool_call>\n<function=run>\n<parameter=command>\nls",
        content="<tool_call>\n<function=run>\n<parameter=command>\nls",
    ),
    # ------------------------------------------------------------ Seed-OSS
    Case(
        "seed_xml-after-thinking",
        "seed_xml",
        "<seed:think>Plan it.</seed:think>\n<seed:tool_call>\n<function=get_weather>\n"
        "<parameter=city>Paris</parameter>\n<parameter=days>2</parameter>\n</function>\n</seed:tool_call>",
        reasoning="Plan it.",
        calls=[PARIS_2],
        think="seed",
    ),
    Case(
        "seed_xml-parallel-and-quotes",
        "seed_xml",
        "Two calls.<seed:tool_call>\n<function=run>\n<parameter=command>ls -la</parameter>\n</function>\n"
        "</seed:tool_call>\n<seed:tool_call>\n<function=write_file>\n<parameter=path>a.py</parameter>\n"
        f"<parameter=content>{CODE}</parameter>\n</function>\n</seed:tool_call>",
        content="Two calls.",
        calls=[LS, WRITE],
        think="seed",
    ),
    Case(
        "seed_xml-thinking-opened-by-the-prompt",
        "seed_xml",
        " thinking</seed:think>\nHello!",
        reasoning=" thinking",
        content="Hello!",
        think="seed",
        started=True,
    ),
    # ------------------------------------------------------------ GLM 4.5-4.7, Spark, Ling, Laguna
    Case(
        "glm-after-opened-thinking",
        "glm",
        "Checking.</think>" + _glm("get_weather", city="Paris", days="2"),
        reasoning="Checking.",
        calls=[PARIS_2],
        started=True,
    ),
    Case(
        "glm-parallel-with-newlines",
        "glm",
        _glm("get_weather", "\n", city="Paris") + "\n" + _glm("run", "\n", command="ls -la"),
        calls=[PARIS, LS],
    ),
    Case("glm-no-arguments", "glm", "Reading.<tool_call>ping</tool_call>", content="Reading.", calls=[("ping", {})]),
    Case(
        "glm-closing-markup-in-a-value",
        "glm",
        "<tool_call>note<arg_key>text</arg_key><arg_value>has </think>, <tool_call> and </arg_value> in it"
        "</arg_value></tool_call>",
        calls=[("note", {"text": "has </think>, <tool_call> and </arg_value> in it"})],
    ),
    Case(
        "glm-call-inside-opened-thinking",
        "glm",
        "I need the weather first.\n" + _glm("get_weather", "\n", city="Paris"),
        reasoning="I need the weather first.\n",
        calls=[PARIS],
        started=True,
    ),
    Case(
        "glm-text-after-the-call",
        "glm",
        _glm("get_weather", city="Paris") + "\nChecked.",
        content="Checked.",
        calls=[PARIS],
    ),
    Case(
        "glm-typed-by-the-schema",
        "glm",
        _glm("set_config", config='{"theme": "dark", "limits": {"n": [1, 2]}}', tags='["a", "b"]', on="true"),
        calls=[CONFIG],
    ),
    Case(
        "glm-cut-off",
        "glm",
        "<tool_call>run<arg_key>command</arg_key><arg_value>ls",
        content="<tool_call>run<arg_key>command</arg_key><arg_value>ls",
    ),
    # ------------------------------------------------------------ Hunyuan 3
    Case(
        "hunyuan-after-thinking-parallel",
        "hunyuan",
        "<think:opensource>Plan.</think:opensource><tool_calls:opensource>\n"
        "<tool_call:opensource>get_weather<tool_sep:opensource>\n<arg_key:opensource>city</arg_key:opensource>\n"
        "<arg_value:opensource>Paris</arg_value:opensource>\n</tool_call:opensource>\n"
        "<tool_call:opensource>run<tool_sep:opensource>\n<arg_key:opensource>command</arg_key:opensource>\n"
        "<arg_value:opensource>ls -la</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
        reasoning="Plan.",
        calls=[PARIS, LS],
        think="hunyuan",
    ),
    # ------------------------------------------------------------ MiniMax M2
    Case(
        "minimax_m2-after-opened-thinking",
        "minimax_m2",
        'Let me call.\n</think>\n\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        '</parameter>\n<parameter name="days">2</parameter>\n</invoke>\n<invoke name="ping">\n</invoke>\n'
        "</minimax:tool_call>",
        reasoning="Let me call.\n",
        calls=[PARIS_2, ("ping", {})],
        started=True,
    ),
    Case(
        "minimax_m2-closing-markup-in-a-value",
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="write_file">\n<parameter name="path">a.py</parameter>\n'
        f'<parameter name="content">{CODE}</parameter>\n</invoke>\n</minimax:tool_call>',
        calls=[WRITE],
    ),
    # ------------------------------------------------------------ MiniMax M3
    Case(
        "minimax_m3-nested-elements",
        "minimax_m3",
        f'<mm:think>Nested.</mm:think>{M3}<tool_call>\n{M3}<invoke name="set_config">{M3}<config>'
        f"{M3}<theme>dark{M3}</theme>{M3}<limits>{M3}<n>{M3}<item>1{M3}</item>{M3}<item>2{M3}</item>{M3}</n>"
        f"{M3}</limits>{M3}</config>{M3}<tags>{M3}<item>a{M3}</item>{M3}<item>b{M3}</item>{M3}</tags>"
        f"{M3}<on>true{M3}</on>{M3}</invoke>\n{M3}</tool_call>",
        reasoning="Nested.",
        calls=[("set_config", {"config": {"theme": "dark", "limits": {"n": [1, 2]}}, "tags": ["a", "b"], "on": True})],
        think="minimax_m3",
    ),
    Case(
        "minimax_m3-no-thinking-and-parallel",
        "minimax_m3",
        f'</mm:think>On it.{M3}<tool_call>\n{M3}<invoke name="get_weather">{M3}<city>Paris{M3}</city>'
        f'{M3}<days>2{M3}</days>{M3}</invoke>\n{M3}<invoke name="run">{M3}<command>ls -la{M3}</command>'
        f"{M3}</invoke>\n{M3}</tool_call>",
        content="On it.",
        calls=[PARIS_2, LS],
        think="minimax_m3",
    ),
    Case(
        "minimax_m3-a-string-that-looks-structured",
        "minimax_m3",
        f'{M3}<tool_call>\n{M3}<invoke name="note">{M3}<text>{M3}<b>hi{M3}</b>{M3}</text>{M3}</invoke>\n'
        f"{M3}</tool_call>",
        calls=[("note", {"text": f"{M3}<b>hi{M3}</b>"})],
        think="minimax_m3",
    ),
    # ------------------------------------------------------------ DeepSeek V3.2 / V4 (DSML)
    Case(
        "dsml-after-opened-thinking",
        "dsml",
        f'Let me check</think>\n\n<{DS}function_calls>\n<{DS}invoke name="get_weather">\n'
        f'<{DS}parameter name="city" string="true">Paris</{DS}parameter>\n'
        f'<{DS}parameter name="days" string="false">2</{DS}parameter>\n</{DS}invoke>\n</{DS}function_calls>',
        reasoning="Let me check",
        calls=[PARIS_2],
        started=True,
    ),
    Case(
        "dsml-v4-text-and-parallel",
        "dsml",
        f'Thinking</think>Two calls.\n\n<{DS}tool_calls>\n<{DS}invoke name="run">\n'
        f'<{DS}parameter name="command" string="true">ls -la</{DS}parameter>\n</{DS}invoke>\n'
        f'<{DS}invoke name="set_config">\n<{DS}parameter name="config" string="false">'
        f'{{"theme": "dark", "limits": {{"n": [1, 2]}}}}</{DS}parameter>\n'
        f'<{DS}parameter name="tags" string="false">["a", "b"]</{DS}parameter>\n'
        f'<{DS}parameter name="on" string="false">true</{DS}parameter>\n</{DS}invoke>\n</{DS}tool_calls>',
        reasoning="Thinking",
        content="Two calls.",
        calls=[LS, CONFIG],
        started=True,
    ),
    Case(
        "dsml-v4-call-inside-opened-thinking",
        "dsml",
        f'Let me check the weather\n\n<{DS}tool_calls>\n<{DS}invoke name="get_weather">\n'
        f'<{DS}parameter name="city" string="true">Paris</{DS}parameter>\n</{DS}invoke>\n</{DS}tool_calls>',
        reasoning="Let me check the weather\n\n",
        calls=[PARIS],
        started=True,
    ),
    # ------------------------------------------------------------ MiniCPM 5
    Case(
        "minicpm-after-opened-thinking",
        "minicpm",
        '</think><function name="run"><param name="command">ls -la</param></function>',
        calls=[LS],
        started=True,
    ),
    Case(
        "minicpm-cdata-and-parallel",
        "minicpm",
        '<function name="write_file"><param name="path">a.py</param><param name="content"><![CDATA['
        f"{CODE}</param></function>]]></param></function>\n"
        '<function name="get_weather"><param name="city">Paris</param><param name="days">2</param></function>',
        calls=[("write_file", {"path": "a.py", "content": CODE + "</param></function>"}), PARIS_2],
    ),
]
