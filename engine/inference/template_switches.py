"""The thinking switches a chat template reads, found in its syntax tree.

Contract: ARCHITECTURE.md, 'engine.inference.template_switches'.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from jinja2 import nodes

SwitchKind = Literal["bool", "number", "text"]

_THINKING_NAME = re.compile(r"think|reason|thought|effort", re.IGNORECASE)
_DEFINED_TESTS = frozenset({"defined", "undefined"})
_STRING_OPS = frozenset({"eq", "ne", "in", "notin"})
_NUMBER_OPS = frozenset({"eq", "ne", "lt", "lteq", "gt", "gteq"})


@dataclass(frozen=True)
class Switch:
    """One switch a chat template reads.

    Attributes:
        name: the variable (``enable_thinking``, ``reasoning_effort``, ...).
        kind: ``bool``, ``number`` or ``text``.
        values: for ``text``, the strings the template compares it with, in the order it names
            them; may be empty (gpt-oss prints any effort). Other strings are passed too: a template
            that refuses them says so itself (``raise_exception``).
        default: the value the template uses when none is passed, where it sets one.
    """

    name: str
    kind: SwitchKind
    values: tuple[str, ...] = ()
    default: Any = None

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is of this switch's kind."""
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        return isinstance(value, str)


MAX_SWITCHES = 32
"""Most switches looked at in one template (real ones read at most four): the rest are ignored, so
a template naming thousands costs no more than this many passes over its comparisons."""


@dataclass(frozen=True)
class _Index:
    """The nodes of a template that say what a switch is, gathered in one walk."""

    compares: list[nodes.Compare]
    filters: list[nodes.Filter]
    conds: list[nodes.CondExpr]
    ifs: list[nodes.If]
    joins: list[nodes.Expr]  # the operands of ``~`` and ``+``

    @classmethod
    def of(cls, tree: nodes.Template) -> _Index:
        index = cls([], [], [], [], [])
        for node in tree.find_all((nodes.Compare, nodes.Filter, nodes.CondExpr, nodes.If, nodes.Concat, nodes.Add)):
            if isinstance(node, nodes.Compare):
                index.compares.append(node)
            elif isinstance(node, nodes.Filter):
                index.filters.append(node)
            elif isinstance(node, nodes.CondExpr):
                index.conds.append(node)
            elif isinstance(node, nodes.If):
                index.ifs.append(node)
            elif isinstance(node, nodes.Concat):
                index.joins.extend(node.nodes)
            elif isinstance(node, nodes.Add):
                index.joins.extend((node.left, node.right))
        return index


def find_switches(tree: nodes.Template, reads: frozenset[str]) -> tuple[Switch, ...]:
    """The thinking switches of a parsed template, in the order the template first names them.

    Args:
        tree: the template's syntax tree (before the sandbox rewrites it).
        reads: the names the compiled template looks up in its context.

    Returns:
        The switches (at most :data:`MAX_SWITCHES`).
    """
    stored = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    probed = set(_defined_probes(tree))
    order: dict[str, None] = {}
    for name_node in tree.find_all(nodes.Name):
        name = name_node.name
        thinking = name_node.ctx == "load" and name in reads and _THINKING_NAME.search(name)
        if thinking and (name not in stored or name in probed) and len(order) < MAX_SWITCHES:
            order.setdefault(name)
    index = _Index.of(tree) if order else _Index([], [], [], [], [])
    return tuple(_switch(index, name) for name in order)


def _defined_probes(tree: nodes.Template) -> Iterator[str]:
    """Names the template tests for definedness or gives a ``default``: inputs even when it sets them."""
    for node in tree.find_all((nodes.Test, nodes.Filter)):
        probe = node.name in (_DEFINED_TESTS if isinstance(node, nodes.Test) else ("default", "d"))
        if probe and isinstance(node.node, nodes.Name):
            yield node.node.name


def _is(node: nodes.Node | None, name: str) -> bool:
    """``node`` reads ``name`` (directly, or through filters such as ``name | lower``)."""
    while isinstance(node, nodes.Filter) and node.node is not None:
        node = node.node
    return isinstance(node, nodes.Name) and node.name == name


def _consts(node: nodes.Node) -> list[Any]:
    """The constant(s) a comparison's other side names: a constant, or a list or tuple of them."""
    if isinstance(node, nodes.Const):
        return [node.value]
    if isinstance(node, nodes.List | nodes.Tuple):
        return [item.value for item in node.items if isinstance(item, nodes.Const)]
    return []


def _switch(index: _Index, name: str) -> Switch:
    strings: list[str] = []
    numbers = False
    for compare in index.compares:
        sides = [compare.expr, *(op.expr for op in compare.ops)]
        for at, op in enumerate(compare.ops):
            left, right = sides[at], sides[at + 1]
            other = right if _is(left, name) else left if _is(right, name) else None
            if other is None:
                continue
            for value in _consts(other):
                if isinstance(value, str) and op.op in _STRING_OPS:
                    strings.append(value)
                elif isinstance(value, int | float) and not isinstance(value, bool) and op.op in _NUMBER_OPS:
                    numbers = True
    default = _default(index, name)
    joined = any(_is(side, name) for side in index.joins)
    if strings or joined or isinstance(default, str):
        return Switch(name, "text", tuple(dict.fromkeys(value for value in strings if value)), default)
    if numbers or (isinstance(default, int | float) and not isinstance(default, bool)):
        return Switch(name, "number", (), default)
    return Switch(name, "bool", (), default if isinstance(default, bool) else None)


def _default(index: _Index, name: str) -> Any:
    """The constant the template gives ``name`` when the caller passed none, or None."""
    for flt in index.filters:
        if flt.name in ("default", "d") and _is(flt.node, name) and flt.args and isinstance(flt.args[0], nodes.Const):
            return flt.args[0].value
    for cond in index.conds:
        if _is(cond.expr1, name) and _tests_defined(cond.test, name) and isinstance(cond.expr2, nodes.Const):
            return cond.expr2.value
    for branch in index.ifs:
        if not _tests_undefined(branch.test, name):
            continue
        for assign in branch.body:
            if (
                isinstance(assign, nodes.Assign)
                and isinstance(assign.target, nodes.Name)
                and assign.target.name == name
                and isinstance(assign.node, nodes.Const)
            ):
                return assign.node.value
    return None


def _tests_defined(test: nodes.Node, name: str) -> bool:
    """``test`` is ``name is defined`` (possibly ``and``-ed with more)."""
    if isinstance(test, nodes.And):
        return _tests_defined(test.left, name) or _tests_defined(test.right, name)
    if isinstance(test, nodes.Test) and _is(test.node, name):
        return test.name == "defined"
    if isinstance(test, nodes.Not) and isinstance(test.node, nodes.Test) and _is(test.node.node, name):
        return test.node.name == "undefined"
    return False


def _tests_undefined(test: nodes.Node, name: str) -> bool:
    """``test`` is ``name is not defined`` / ``not name is defined`` / ``name is undefined``."""
    if isinstance(test, nodes.Not):
        return _tests_defined(test.node, name) and not isinstance(test.node, nodes.And)
    return isinstance(test, nodes.Test) and _is(test.node, name) and test.name == "undefined"
