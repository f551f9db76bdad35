"""The ``make bench`` summary: every benchmark's figure in one table, and whether ``make bench`` passes.

    python tests/bench/summary.py build/bench/results.jsonl [--markdown]

Reads the records the benchmarks wrote through ``tests/bench/results.py`` (one JSON line each; a
figure measured twice keeps its last value) and prints, under one line naming the machine and its
load, the figures with a budget (each "ok", "MISSED", or a known miss with the issue that will
close it), then apart from them the figures reported without a budget (no verdict: "—").
``--markdown`` prints the same for the README. A budgeted comparison every run must report
(:data:`EXPECTED`) that no benchmark reported is shown as "not run", never left out.

Exit status: 1 when a figure missed its budget and is not a known miss, or an expected figure was
not reported; else 0 (``make bench`` fails with it).
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
    "remote backend vs plain client: decode",
    "remote backend vs plain client: end-to-end",
    "KV restore vs cold prefill: TTFT",
    "lookup vs plain: quoting answer",
    "lookup vs plain: ordinary chat",
    "indexing vs raw encoding",
    "query p95 at 50k chunks",
    "recall@5",
    "window vs bare Qt: start-up",
    "GUI stall while a reply streams and a folder indexes",
    "whole app RSS, idle after the Knowledge page",
    "prefill with Stop armed vs whole chunks",
    "pool: switch to a resident model vs loading it: TTFT",
    "adapter switch vs base reload: TTFT",
)
"""The budgeted comparisons every full run reports, in this order (others reported follow them)."""

NO_VERDICT = "—"


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


def _cpu() -> tuple[str, str]:
    """The CPU's model name (with family and model on x86), and its widest vector units."""
    name, family, model, flags = platform.processor() or platform.machine(), "", "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "model name" and name in (platform.processor(), platform.machine()):
                name = value
            elif key == "cpu family" and not family:
                family = value
            elif key == "model" and not model:
                model = value
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    if family:
        name += f" (family {family} model {model})"
    units = []
    if flags:
        units.append("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2")
        units.append("AMX" if "amx_tile" in flags else "no AMX")
    return name, ", ".join(units)


def machine() -> str:
    """The CPU, its cores, memory, OS and the load averages (1, 5, 15 min) now."""
    cpu, units = _cpu()
    memory = ""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages * size / 2**30:.0f} GiB RAM"
    except (ValueError, OSError, AttributeError):
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg())
    units = f", {units}" if units else ""
    return f"{cpu}{units}, {os.cpu_count()} cores{memory}, {platform.system()} {platform.release()}{load}"


def budget_text(entry: dict[str, Any]) -> str:
    unit = "" if entry.get("unit", "x") in ("x", "") else f" {entry['unit']}"
    parts = []
    if entry.get("at_least") is not None:
        parts.append(f">= {entry['at_least']:g}{unit}")
    if entry.get("at_most") is not None:
        parts.append(f"<= {entry['at_most']:g}{unit}")
    return " and ".join(parts)


def _value(entry: dict[str, Any]) -> str:
    value = float(entry["value"])
    unit = entry.get("unit", "x")
    if unit == "x":
        return f"{value:.3f}x" if value < 10 else f"{value:.1f}x"
    if unit in ("", "count"):
        return f"{value:g}"
    return f"{value:.1f} {unit}" if abs(value) < 1000 else f"{value:.0f} {unit}"


def verdict(entry: dict[str, Any]) -> str:
    """ "ok", "MISSED", "missed: <issue>" (a known miss), or "—" (no budget)."""
    if not budget_text(entry):
        return NO_VERDICT
    passed = entry.get("passed")
    if passed is None:  # a record of an older results.py: check it here
        value = float(entry["value"])
        low, high = entry.get("at_least"), entry.get("at_most")
        passed = (low is None or value >= low) and (high is None or value <= high)
    if passed:
        return "ok"
    known = entry.get("known_miss")
    return f"missed: {known}" if known else "MISSED"


Row = tuple[str, str, str, str, str, str]


def rows(records: dict[str, dict[str, Any]]) -> tuple[list[Row], list[Row]]:
    """``(comparison, value, budget, verdict, detail, benchmark)`` rows: those with a budget (the
    expected ones first, in order, "not run" where missing), then those reported without one."""
    budgeted: list[Row] = []
    reported: list[Row] = []
    names = list(EXPECTED) + sorted(n for n in records if n not in EXPECTED)
    for name in names:
        entry = records.get(name)
        if entry is None:
            budgeted.append((name, "not run", "", "not run", "", ""))
            continue
        bench = Path(str(entry.get("bench", ""))).name
        row = (name, _value(entry), budget_text(entry), verdict(entry), str(entry.get("detail", "")), bench)
        (budgeted if row[2] else reported).append(row)
    return budgeted, reported


def failures(records: dict[str, dict[str, Any]]) -> list[str]:
    """The names that fail ``make bench``: unexpected misses and expected figures not reported."""
    budgeted, _ = rows(records)
    return [row[0] for row in budgeted if row[3] in ("MISSED", "not run")]


HEADER = ("Comparison", "Measured", "Budget", "Verdict", "Sides", "Benchmark")


def _markdown(table: list[Row], header: tuple[str, ...]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in table]
    return lines


def _text(table: list[Row], header: tuple[str, ...]) -> list[str]:
    widths = [max(len(str(r[i])) for r in (header, *table)) for i in range(len(header))]
    widths[4] = min(widths[4], 70)
    out = []
    for row in (header, *table):
        cells = [str(cell)[: widths[i]].ljust(widths[i]) for i, cell in enumerate(row)]
        out.append("  ".join(cells).rstrip())
    return out


def render(records: dict[str, dict[str, Any]], markdown: bool) -> str:
    budgeted, reported = rows(records)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    title = f"Benchmarks, {when}, on {machine()}"
    table = _markdown if markdown else _text
    out = [title, "", "With a budget:" if not markdown else "**With a budget**", ""]
    out += table(budgeted, HEADER)
    if reported:
        out += ["", "Reported, no budget (no verdict):" if not markdown else "**Reported, no budget**", ""]
        out += table(reported, HEADER)
    known = [row[0] for row in budgeted if row[3].startswith("missed:")]
    failed = failures(records)
    done = sum(row[1] != "not run" for row in budgeted)
    summary = f"{done} of {len(budgeted)} budgeted figures reported"
    summary += f"; known misses: {', '.join(known)}" if known else ""
    summary += f"; FAILED: {', '.join(failed)}" if failed else "; no unexpected miss"
    out += ["", summary]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print every benchmark's figure in one table.")
    parser.add_argument("results", type=Path, help="the JSON-lines file the benchmarks wrote")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (for the README)")
    args = parser.parse_args(argv)
    records = read_records(args.results)
    if not records:
        print(f"summary: no benchmark results in {args.results}", file=sys.stderr)
        return 1
    print(render(records, args.markdown))
    return 1 if failures(records) else 0


if __name__ == "__main__":
    sys.exit(main())
