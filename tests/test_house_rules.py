"""CONTRIBUTING.md rule 15: imports are at module level; one inside a function says why; no two
modules import each other at run time.

The reason is a comment on the import's line or on the line above it (which may head a run of
consecutive imports), ``# lazy: <reason>``: a heavy or banned package, a measured start-up cost,
a child process that must not load it, or an optional dependency. A cycle is no reason: it is
removed instead.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "rag")

_REASON = re.compile(r"#\s*lazy:\s*(?P<reason>\S.*)$")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _local_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child, in_function or isinstance(child, _FUNCTIONS))

    walk(tree, False)
    return found


def _reason(lines: list[str], node: ast.Import | ast.ImportFrom, import_lines: set[int]) -> str | None:
    """The ``# lazy:`` reason on the import's line, or above it past a run of imports."""
    match = _REASON.search(lines[node.lineno - 1])
    if match:
        return match["reason"]
    row = node.lineno - 1  # 1-based number of the line above
    while row >= 1 and row in import_lines:
        row -= 1
    if row >= 1:
        above = lines[row - 1].strip()
        if above.startswith("#"):
            match = _REASON.search(above)
            return match["reason"] if match else None
    return None


def offenders(root: Path = ROOT) -> list[str]:
    """``path:line: why`` for each function-local import without an acceptable reason."""
    bad: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            source = path.read_text(encoding="utf-8")
            lines = source.splitlines()
            nodes = _local_imports(ast.parse(source, rel))
            # every line of a local import (a parenthesized one spans several)
            import_lines = {n for node in nodes for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
            for node in nodes:
                reason = _reason(lines, node, import_lines)
                if reason is None:
                    bad.append(f"{rel}:{node.lineno}: no '# lazy: <reason>' comment")
                elif "cycle" in reason.lower():
                    bad.append(f"{rel}:{node.lineno}: an import cycle is removed, not commented")
    return bad


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports at run time: at module level or inside a
    function, not under ``if TYPE_CHECKING:``. A module's own package is left out."""
    files = {_module_name(path, root): path for package in PACKAGES for path in (root / package).rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():

        def walk(node: ast.AST, module: str = name) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                targets: list[str] = []
                if isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                    targets = [f"{child.module}.{alias.name}" for alias in child.names]
                for target in targets:
                    found = known(target)
                    if found and found != module and not module.startswith(found + "."):
                        graph[module].add(found)
                walk(child)

        walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycle_at_run_time() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "modules that import each other (move what both need into one of them):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )


def test_cycle_finder_sees_a_cycle_through_a_function_local_import(tmp_path: Path) -> None:
    package = tmp_path / "rag"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "a.py").write_text("from rag.b import f\n", encoding="utf-8")
    (package / "b.py").write_text("def f():\n    from rag import a  # lazy: start-up\n", encoding="utf-8")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rag.a import x\n", encoding="utf-8"
    )
    graph = import_graph(tmp_path)
    assert graph["rag.b"] == {"rag.a"} and graph["rag.c"] == set()
    assert import_cycles(graph) == [["rag.a", "rag.b"]]


def test_function_local_imports_say_why() -> None:
    bad = offenders()
    assert not bad, "imports inside functions without a reason (CONTRIBUTING.md rule 15):\n" + "\n".join(bad)


def test_checker_finds_an_unexplained_local_import(tmp_path: Path) -> None:
    package = tmp_path / "engine"
    package.mkdir()
    (package / "mod.py").write_text(
        "import os\n"
        "\n"
        "def a():\n"
        "    import json\n"  # line 4: no reason
        "\n"
        "def b():\n"
        "    # lazy: heavy (numpy)\n"
        "    import numpy\n"
        "    from numpy import linalg\n"  # covered by the comment above the run
        "\n"
        "def c():\n"
        "    import csv  # lazy: cycle with engine.other\n"  # line 12: a cycle is no reason
        "\n"
        "def d():\n"
        "    # a comment that gives no lazy: reason\n"
        "    import re\n",  # line 16
        encoding="utf-8",
    )
    assert offenders(tmp_path) == [
        "engine/mod.py:4: no '# lazy: <reason>' comment",
        "engine/mod.py:12: an import cycle is removed, not commented",
        "engine/mod.py:16: no '# lazy: <reason>' comment",
    ]


# CONTRIBUTING.md rule 17: a module's docstring says what the module is in a few lines and points
# to ARCHITECTURE.md for the contract rather than restating it.
DOCSTRING_MAX_LINES = 12

# Being changed in parallel; point it at an ARCHITECTURE.md heading later.
POINTER_IN_PROGRESS: frozenset[str] = frozenset()

_POINTER = re.compile(r"""ARCHITECTURE\.md,\s+(?:'(?P<single>[^']+)'|"(?P<double>[^"]+)")""")


def _module_docstrings(root: Path) -> list[tuple[str, str]]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), rel), clean=False)
            if doc is not None:
                found.append((rel, doc))
    return found


def long_docstrings(root: Path = ROOT, limit: int = DOCSTRING_MAX_LINES) -> list[str]:
    """``path: N lines`` for each module docstring longer than ``limit`` lines, longest first."""
    long = [(len(doc.splitlines()), rel) for rel, doc in _module_docstrings(root) if len(doc.splitlines()) > limit]
    return [f"{rel}: {lines} lines" for lines, rel in sorted(long, key=lambda row: (-row[0], row[1]))]


def dangling_pointers(root: Path = ROOT) -> list[str]:
    """``path: 'title'`` for each ARCHITECTURE.md section a module docstring names that is not a heading."""
    text = (root / "ARCHITECTURE.md").read_text(encoding="utf-8")
    headings = {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}
    return [
        f"{rel}: '{title}'"
        for rel, doc in _module_docstrings(root)
        if rel not in POINTER_IN_PROGRESS
        for match in _POINTER.finditer(doc)
        if (title := match["single"] or match["double"]) not in headings
    ]


def test_module_docstrings_are_short() -> None:
    long = long_docstrings()
    assert not long, (
        f"module docstrings over {DOCSTRING_MAX_LINES} lines (CONTRIBUTING.md rule 17: say what the module is "
        "and point to ARCHITECTURE.md, 'Module notes', for the contract):\n" + "\n".join(long)
    )


def test_module_docstrings_point_to_sections_that_exist() -> None:
    bad = dangling_pointers()
    assert not bad, "module docstrings name ARCHITECTURE.md sections that are not headings there:\n" + "\n".join(bad)


def test_docstring_checkers_see_a_long_docstring_and_a_dangling_pointer(tmp_path: Path) -> None:
    package = tmp_path / "rag"
    package.mkdir()
    (tmp_path / "ARCHITECTURE.md").write_text("# Title\n\n## Module notes\n\n### rag.short\n", encoding="utf-8")
    (package / "short.py").write_text(
        '"""One line.\n\nContract: ARCHITECTURE.md, \'rag.short\'.\n"""\n', encoding="utf-8"
    )
    (package / "long.py").write_text('"""' + "line\n" * 13 + '"""\n', encoding="utf-8")
    (package / "limit.py").write_text('"""' + "line\n" * 12 + '"""\n', encoding="utf-8")
    (package / "lost.py").write_text('"""One line (ARCHITECTURE.md, "Gone").\n"""\n', encoding="utf-8")
    assert long_docstrings(tmp_path) == ["rag/long.py: 13 lines"]
    assert dangling_pointers(tmp_path) == ["rag/lost.py: 'Gone'"]


# The repository's own documents are the truth: nothing in it points to a document outside it (the
# design notes the project started from are in ARCHITECTURE.md and CONTRIBUTING.md now).
_OUTSIDE = re.compile(r"\b(?:DESIGN|STYLE|USERS)\.md\b|\.\./shared/")


def outside_pointers(root: Path = ROOT) -> list[str]:
    """``path:line`` of each mention of a document outside the repository, in its tracked text files."""
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    found = []
    for rel in listed.splitlines():
        path = root / rel
        if (
            path.suffix not in {".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".cfg", ".spec", ""}
            or not path.is_file()
        ):
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{rel}:{n}" for n, line in enumerate(lines, 1) if _OUTSIDE.search(line) and rel != THIS_FILE]
    return found


THIS_FILE = "tests/test_house_rules.py"


def test_nothing_points_outside_the_repository() -> None:
    assert outside_pointers() == []


def test_the_outside_check_finds_a_pointer() -> None:
    assert _OUTSIDE.search("as " + "DESIGN" + ".md says") and _OUTSIDE.search("see ../" + "shared/x")
    assert not _OUTSIDE.search("see ARCHITECTURE.md and ROBUSTNESS.md")
