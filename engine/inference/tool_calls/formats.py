"""Every call format the published chat templates write, as data: the markup that opens and closes
a call, the parser of what is inside, the markers a template of that format holds.

``FORMATS`` maps a family name to its :class:`CallFormat`. The stream parser
(:mod:`engine.inference.tool_calls.stream`) reads any format of kind ``"blocks"``; the others are
whole-reply structures with their own splitters (harmony's channels, Muse's recipients, Kimi K3's
sections, functionary v3.2's ``>>>`` messages).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from engine.inference.tool_calls import json_calls as j
from engine.inference.tool_calls import xml_calls as x
from engine.inference.tool_calls.call import Parsed, Schemas
from engine.inference.tool_calls.python_calls import gemma4_calls, python_calls

Family = Literal[
    "hermes",
    "qwen_xml",
    "seed_xml",
    "glm",
    "hunyuan",
    "minimax_m2",
    "minimax_m3",
    "dsml",
    "minicpm",
    "kimi_k2",
    "kimi_k3",
    "deepseek",
    "mistral",
    "llama3",
    "functionary_v31",
    "functionary_v32",
    "firefunction",
    "cohere",
    "command_r_plus",
    "nemotron",
    "apriel",
    "minimax_m1",
    "granite",
    "gigachat",
    "apertus",
    "solar",
    "gemma4",
    "lfm2",
    "gemma",
    "harmony",
    "muse",
    "json",
]

BodyParser = Callable[[str, str, Schemas], Parsed]
Kind = Literal["blocks", "harmony", "muse", "kimi_k3", "functionary_v32"]


def _plain(parse: Callable[[str, str], Parsed]) -> BodyParser:
    """A body parser that needs no schemas (JSON arguments carry their types)."""

    def parser(body: str, raw: str, schemas: Schemas) -> Parsed:
        del schemas
        return parse(body, raw)

    parser.__name__ = parse.__name__
    return parser


@dataclass(frozen=True)
class Block:
    """Markup that opens a call and what closes it (``None``: the end of the reply).

    Attributes:
        open: the opening marker.
        close: the closing marker, or None when the call runs to the end of the reply.
        parse: turns the text in between into calls.
        keep_open: the opening marker is part of the call's syntax (``<function=NAME>``), so the
            parser gets it too.
    """

    open: str
    close: str | None
    parse: BodyParser
    keep_open: bool = False


@dataclass(frozen=True)
class CallFormat:
    """One family's call format.

    Attributes:
        name: the family.
        kind: ``"blocks"`` (markup blocks in the text) or the whole-reply structure it has.
        blocks: the markup of a call (kind ``"blocks"``).
        bare: a parser for a reply that is a call with no markup at all (it starts with ``{``, ``[``
            or a fence); None when the format always marks its calls.
        signatures: each a set of strings that together say a template writes this format (any
            one set suffices); the template's own rendering of a call decides first
            (:mod:`engine.inference.tool_calls.detect`).
        drop: stray markers removed from the answer (a closing tag some models add twice...).
        markers: the control tokens of the format, put back into the text where a vocabulary
            holds them as special tokens.
    """

    name: Family
    kind: Kind = "blocks"
    blocks: tuple[Block, ...] = ()
    bare: BodyParser | None = None
    signatures: tuple[tuple[str, ...], ...] = ()
    drop: tuple[str, ...] = ()
    markers: tuple[str, ...] = field(default=())

    def all_markers(self) -> tuple[str, ...]:
        """The block markers and the format's other control tokens."""
        found = [m for block in self.blocks for m in (block.open, block.close) if m]
        return tuple(dict.fromkeys([*found, *self.markers, *self.drop]))


_JSON = _plain(j.json_block)
_BARE = _plain(j.bare_json)

_FORMATS: tuple[CallFormat, ...] = (
    CallFormat(
        "qwen_xml",
        blocks=(
            Block("<tool_call>", "</tool_call>", x.qwen_xml),
            Block(x.QWEN_FUNCTION, x.QWEN_FUNCTION_END, x.qwen_function, keep_open=True),
        ),
        signatures=(("<tool_call>", "<function=", "<parameter="),),
        drop=("</tool_call>",),
    ),
    CallFormat(
        "seed_xml",
        blocks=(Block("<seed:tool_call>", "</seed:tool_call>", x.qwen_xml),),
        signatures=(("<seed:tool_call>", "<function="),),
    ),
    CallFormat(
        "glm",
        blocks=(Block("<tool_call>", "</tool_call>", x.glm),),
        signatures=(("<tool_call>", "<arg_key>", "<arg_value>"),),
        markers=("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    ),
    CallFormat(
        "hunyuan",
        blocks=(Block(f"<tool_calls{x.HUNYUAN_SUFFIX}>", f"</tool_calls{x.HUNYUAN_SUFFIX}>", x.hunyuan),),
        signatures=(("<tool_calls{}>", "<arg_key{}>"),),
        markers=(x.HUNYUAN_CALL, x.HUNYUAN_CALL_END, x.HUNYUAN_SEP),
    ),
    CallFormat(
        "minimax_m2",
        blocks=(Block("<minimax:tool_call>", "</minimax:tool_call>", x.minimax_m2),),
        signatures=(("<minimax:tool_call>", "<invoke name="),),
    ),
    CallFormat(
        "minimax_m3",
        blocks=(Block(x.M3_TOOL_CALL, x.M3_TOOL_CALL_END, x.minimax_m3),),
        signatures=((x.M3, "invoke name="),),
        markers=(x.M3,),
    ),
    CallFormat(
        "dsml",
        blocks=(
            Block(f"<{x.DSML}function_calls>", f"</{x.DSML}function_calls>", x.dsml),
            Block(f"<{x.DSML}tool_calls>", f"</{x.DSML}tool_calls>", x.dsml),
        ),
        signatures=((x.DSML, "invoke name="),),
        markers=(f"<{x.DSML}invoke", f"</{x.DSML}invoke>", f"<{x.DSML}parameter", f"</{x.DSML}parameter>", x.DSML),
    ),
    CallFormat(
        "minicpm",
        blocks=(Block('<function name="', "</function>", x.minicpm, keep_open=True),),
        signatures=(('<function name="', '<param name="'),),
    ),
    CallFormat(
        "kimi_k2",
        blocks=(
            Block(j.KIMI_SECTION_BEGIN, j.KIMI_SECTION_END, _plain(j.kimi_k2)),
            Block(j.KIMI_CALL_BEGIN, None, _plain(j.kimi_k2), keep_open=True),
        ),
        signatures=((j.KIMI_SECTION_BEGIN,),),
        markers=(j.KIMI_ARGS_BEGIN, j.KIMI_CALL_END),
    ),
    CallFormat("kimi_k3", kind="kimi_k3", signatures=(("<|open|>", "<|close|>", "<|sep|>"),)),
    CallFormat(
        "deepseek",
        blocks=(Block(j.DS_CALLS_BEGIN, j.DS_CALLS_END, _plain(j.deepseek)),),
        signatures=(("tool▁calls▁begin",),),
        markers=(j.DS_CALL_BEGIN, j.DS_CALL_END, j.DS_SEP),
    ),
    CallFormat(
        "mistral",
        blocks=(Block(j.MISTRAL_CALLS, None, _plain(j.mistral)),),
        signatures=((j.MISTRAL_CALLS,),),
        markers=(j.MISTRAL_ARGS, j.MISTRAL_CALL_ID),
    ),
    CallFormat(
        "functionary_v31",
        blocks=(
            Block("<function=", "</function>", _plain(j.functionary_v31)),
            Block(j.LLAMA_PYTHON_TAG, None, _plain(j.python_tag_code)),
        ),
        signatures=(("<function=", "<|python_tag|>"),),
    ),
    CallFormat("functionary_v32", kind="functionary_v32", signatures=((">>>", "all"),)),
    CallFormat(
        "firefunction",
        blocks=(Block(" functools", None, _JSON),),
        signatures=(("functools[",), ("functools",)),
    ),
    CallFormat(
        "cohere",
        blocks=(Block("<|START_ACTION|>", "<|END_ACTION|>", _JSON),),
        signatures=(("<|START_ACTION|>",),),
        drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>"),
    ),
    CallFormat(
        "command_r_plus",
        blocks=(Block("Action:", None, _plain(j.fenced_json)),),
        signatures=(("Action:", "tool_name"),),
        drop=("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
    ),
    CallFormat(
        "nemotron",
        blocks=(Block("<TOOLCALL>", "</TOOLCALL>", _JSON),),
        signatures=(("<TOOLCALL>",),),
    ),
    CallFormat(
        "apriel",
        blocks=(Block("<tool_calls>", "</tool_calls>", _JSON),),
        signatures=(("<tool_calls>", "BEGIN FINAL RESPONSE"),),
    ),
    CallFormat(
        "minimax_m1",
        blocks=(Block("<tool_calls>", "</tool_calls>", _JSON),),
        signatures=(("<tool_calls>",),),
    ),
    CallFormat(
        "granite",
        blocks=(Block("<|tool_call|>", None, _JSON),),
        signatures=(("<|tool_call|>",),),
        drop=("<response>", "</response>"),
    ),
    CallFormat(
        "gigachat",
        blocks=(Block("function call<|role_sep|>", None, _JSON), Block("<|function_call|>", None, _JSON)),
        signatures=(("function call<|role_sep|>",), ("<|function_call|>",)),
        drop=("<|message_sep|>",),
    ),
    CallFormat(
        "apertus",
        blocks=(Block("<|tools_prefix|>", "<|tools_suffix|>", _plain(j.name_keyed_block)),),
        signatures=(("<|tools_prefix|>",),),
    ),
    CallFormat(
        "solar",
        blocks=(Block("<|tool_calls|>", "<|calls|>", _plain(j.solar)),),
        signatures=(("<|tool_call:begin|>",),),
        markers=(j.SOLAR_CALL_BEGIN, j.SOLAR_NAME, j.SOLAR_ARGS, j.SOLAR_CALL_END),
    ),
    CallFormat(
        "gemma4",
        blocks=(Block("<|tool_call>", "<tool_call|>", _plain(gemma4_calls)),),
        signatures=(("<|tool_call>", "<tool_call|>"),),
        markers=('<|"|>',),
    ),
    CallFormat(
        "lfm2",
        blocks=(Block("<|tool_call_start|>", "<|tool_call_end|>", _plain(python_calls)),),
        signatures=(("<|tool_call_start|>",), ("<|tool_list_start|>",), ("List of tools: [", "<|im_start|>")),
    ),
    CallFormat("harmony", kind="harmony", signatures=(("<|channel|>", "<|message|>"),)),
    CallFormat("muse", kind="muse", signatures=(("atem:function_calls",),)),
    CallFormat(
        "hermes",
        blocks=(Block("<tool_call>", "</tool_call>", _JSON),),
        signatures=(("<tool_call>",),),
    ),
    CallFormat(
        "llama3",
        blocks=(Block(j.LLAMA_PYTHON_TAG, None, _plain(j.llama_tagged)),),
        bare=_BARE,
        signatures=(("<|start_header_id|>", "ipython"), (j.LLAMA_PYTHON_TAG,)),
    ),
    CallFormat(
        "gemma",
        blocks=(
            Block("```tool_code", "```", _plain(j.python_or_json)),
            Block("```tool_call", "```", _plain(j.python_or_json)),
        ),
        signatures=(("tool_code",),),
    ),
    CallFormat("json", blocks=(Block("<tool_call>", "</tool_call>", _JSON),), bare=_BARE),
)

FORMATS: dict[str, CallFormat] = {fmt.name: fmt for fmt in _FORMATS}
"""Family name -> format, in the order detection tries them (the most specific first)."""

FAMILIES: tuple[Family, ...] = tuple(fmt.name for fmt in _FORMATS)
