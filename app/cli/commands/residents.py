"""``glassbox ps`` and ``glassbox unload``: the models a running ``glassbox serve`` holds in memory.

``ps`` lists them (state, the fit estimator's weights + KV cache + compute buffers, the worker's
pid and measured resident memory, idle time, seconds until the idle unload) and why models left;
``unload NAME`` / ``unload --all`` unloads them now. Both ask the server at ``--url`` (default
``http://127.0.0.1:8080``) with its key (``--api-key`` or ``$GLASSBOX_SERVE_API_KEY``), over its
``/glassbox/ps`` and ``/glassbox/unload``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

import psutil

from app.cli.commands._output import add_json_flag, print_json
from app.paths import Paths
from engine.display import printable
from engine.errors import EngineError
from engine.units import format_bytes, format_duration

DEFAULT_URL = "http://127.0.0.1:8080"
API_KEY_ENV = "GLASSBOX_SERVE_API_KEY"
TIMEOUT_S = 600.0  # an unload waits for the reply the model is giving


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Registers ``ps`` and ``unload``."""
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument("--url", default=DEFAULT_URL, help=f"the running glassbox serve (default {DEFAULT_URL})")
    server.add_argument(
        "--api-key", metavar="KEY", default=os.environ.get(API_KEY_ENV) or None, help=f"its key (or ${API_KEY_ENV})"
    )
    ps = sub.add_parser("ps", parents=[common, server], help="the models a running glassbox serve holds in memory")
    add_json_flag(ps)
    ps.set_defaults(handler=run_ps)
    unload = sub.add_parser("unload", parents=[common, server], help="unload a model of a running glassbox serve")
    unload.add_argument("name", nargs="?", help="the model (a name or an alias)")
    unload.add_argument("--all", action="store_true", help="every model no request waits for")
    add_json_flag(unload)
    unload.set_defaults(handler=run_unload)


def _call(args: argparse.Namespace, path: str, body: dict[str, object] | None = None) -> Any:
    """The server's JSON answer. Raises EngineError in one line (no server, refused, an error)."""
    url = args.url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise EngineError(f"{url}: {printable(str(message))[:300]} (HTTP {exc.code})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EngineError(
            f"{url}: no glassbox serve answers there ({reason}); start one with `glassbox serve`"
        ) from None
    except ValueError:
        raise EngineError(f"{url}: the answer is not JSON: is that a glassbox serve?") from None


def _rss(pid: object) -> int | None:
    """The worker's resident memory, measured (None when it cannot be read here)."""
    if not isinstance(pid, int):
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except Exception:  # noqa: BLE001 - another machine's server, or a worker just gone
        return None


def run_ps(args: argparse.Namespace, paths: Paths) -> int:
    del paths
    answer = _call(args, "/glassbox/ps")
    models = answer.get("models", [])
    for model in models:
        model["rss"] = _rss(model.get("pid"))
    if args.json:
        print_json(answer)
        return 0
    if not models:
        sys.stdout.write("No model is loaded.\n")
    else:
        rows = [["NAME", "STATE", "MEMORY", "WEIGHTS", "KV", "BUFFERS", "RSS", "PID", "IDLE", "UNLOADS IN"]]
        for m in models:
            memory = m["memory"]
            unload = m.get("unload_in_s")
            rows.append(
                [
                    printable(str(m["name"])),
                    str(m["state"]),
                    format_bytes(memory["total"]),
                    format_bytes(memory["weights"]),
                    format_bytes(memory["kv"]),
                    format_bytes(memory["compute"]),
                    format_bytes(m["rss"]) if m.get("rss") else "-",
                    str(m.get("pid") or "-"),
                    format_duration(m["idle_s"]) if m["state"] == "ready" else "-",
                    "never" if m.get("keep_s") is None else (format_duration(unload) if unload is not None else "-"),
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    budget = answer.get("memory_budget")
    if budget:
        used = sum(m["memory"]["total"] for m in models)
        sys.stdout.write(f"memory: {format_bytes(used)} of the {format_bytes(budget)} budget\n")
    for eviction in answer.get("evictions", [])[-5:]:
        sys.stdout.write(f"left: {printable(str(eviction['name']))}: {printable(str(eviction['reason']))}\n")
    return 0


def run_unload(args: argparse.Namespace, paths: Paths) -> int:
    del paths
    if bool(args.name) == bool(args.all):
        raise EngineError("unload: give a model name or --all")
    answer = _call(args, "/glassbox/unload", {"all": True} if args.all else {"model": args.name})
    unloaded = answer.get("unloaded", [])
    if args.json:
        print_json(answer)
    elif unloaded:
        for name in unloaded:
            sys.stdout.write(f"unloaded {printable(str(name))}\n")
    else:
        sys.stdout.write(
            "nothing to unload: " + ("no model is loaded\n" if args.all else f"{args.name} is not loaded\n")
        )
    return 0
