"""The ``make bench`` summary: every benchmark's ratio in one table.

    python tests/bench/summary.py build/bench/results.jsonl [--markdown]

Reads the records the benchmarks wrote through ``tests/bench/results.py`` (one JSON line each; a
figure measured twice keeps its last value) and prints one table, with the machine it was measured
on and its load. ``--markdown`` prints the same table for the README's developer section. A
comparison the issue lists but no benchmark reported is shown as "not run", never left out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

EXPECTED = (
    "engine vs raw: prefill",
    "engine vs raw: decode",
    "serve vs engine: decode",
    "serve vs engine: end-to-end",
    "KV restore vs cold prefill: TTFT",
    "lookup vs plain: quoting answer",
    "lookup vs plain: ordinary chat",
    "indexing vs raw encoding",
    "query p95 at 50k chunks",
    "window vs bare Qt: start-up",
)
"""The comparisons every summary shows, in this order (others reported follow them)."""


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    """The last record of each name; lines that are not records are skipped."""
    records: dict[str, dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return records
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and "value" in entry:
            records[entry["name"]] = entry
    return records


def machine() -> str:
    """The CPU, its cores, memory, OS and the load averages (1, 5, 15 min) now."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages * size / 2**30:.0f} GiB RAM"
    except (ValueError, OSError, AttributeError):
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} cores{memory}, {platform.system()} {platform.release()}{load}"


def _budget(entry: dict[str, Any]) -> str:
    unit = "" if entry.get("unit", "x") == "x" else f" {entry['unit']}"
    parts = []
    if entry.get("at_least") is not None:
        parts.append(f">= {entry['at_least']:g}{unit}")
    if entry.get("at_most") is not None:
        parts.append(f"<= {entry['at_most']:g}{unit}")
    return " and ".join(parts) or "reported"


def _value(entry: dict[str, Any]) -> str:
    value = float(entry["value"])
    unit = entry.get("unit", "x")
    if unit == "x":
        return f"{value:.3f}x" if value < 10 else f"{value:.1f}x"
    return f"{value:.1f} {unit}"


def rows(records: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str, str, str]]:
    """``(comparison, value, budget, verdict, detail, benchmark)`` for the expected and the rest."""
    names = list(EXPECTED) + sorted(n for n in records if n not in EXPECTED)
    table = []
    for name in names:
        entry = records.get(name)
        if entry is None:
            table.append((name, "not run", "", "", "", ""))
            continue
        verdict = "ok" if entry.get("passed") else "MISSED"
        bench = Path(str(entry.get("bench", ""))).name
        table.append((name, _value(entry), _budget(entry), verdict, str(entry.get("detail", "")), bench))
    return table


def render(records: dict[str, dict[str, Any]], markdown: bool) -> str:
    table = rows(records)
    header = ("Comparison", "Measured", "Budget", "", "Sides", "Benchmark")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    title = f"Benchmarks, {when}, on {machine()}"
    if markdown:
        lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in table]
        return "\n".join(lines)
    widths = [max(len(str(r[i])) for r in (header, *table)) for i in range(len(header))]
    widths[4] = min(widths[4], 60)
    out = [title, ""]
    for row in (header, *table):
        cells = [str(cell)[: widths[i]].ljust(widths[i]) for i, cell in enumerate(row)]
        out.append("  ".join(cells).rstrip())
    missed = [row[0] for row in table if row[3] == "MISSED"]
    out += [
        "",
        f"{len(table) - sum(r[1] == 'not run' for r in table)} of {len(table)} figures reported"
        + (f"; over budget: {', '.join(missed)}" if missed else "; all within budget"),
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print every benchmark's ratio in one table.")
    parser.add_argument("results", type=Path, help="the JSON-lines file the benchmarks wrote")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (for the README)")
    args = parser.parse_args(argv)
    records = read_records(args.results)
    if not records:
        print(f"summary: no benchmark results in {args.results}", file=sys.stderr)
        return 1
    print(render(records, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
