"""``glassbox bench``: the engine against raw llama-cpp-python on the same model, side by side."""

from __future__ import annotations

import argparse
import sys

from app.cli.commands._output import add_json_flag, print_json
from app.cli.commands.model_resolver import resolve_model
from app.paths import Paths


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("bench", parents=[common], help="engine vs raw llama-cpp-python, side by side")
    parser.add_argument("--model", required=True, help="a GGUF path, a model name, or 'starter'")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved engine/raw pairs (default 5)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per run (default 64)")
    parser.add_argument("--n-ctx", type=int, default=2048, help="context window (default 2048)")
    parser.add_argument(
        "--threads",
        type=int,
        help="CPU threads (default: the app's, one fewer than the cores for decoding, all for prompts)",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+306 ms: pydantic, jinja2)
    from engine.inference.bench import run_bench

    model = resolve_model(args.model, paths)
    report = run_bench(model, rounds=args.rounds, max_tokens=args.max_tokens, n_ctx=args.n_ctx, threads=args.threads)
    if args.json:
        print_json(report.to_dict())
        return 0
    doc = report.to_dict()
    print(
        f"model {model.name}, {report.threads} threads ({report.threads_batch} for prompts), n_ctx {report.n_ctx}, "
        f"{args.rounds} interleaved rounds"
    )
    print(f"{'':10}{'prefill tok/s':>16}{'decode tok/s':>16}{'TTFT ms':>12}")
    for side in ("engine", "raw"):
        d = doc[side]
        print(f"{side:10}{d['prefill_tps']:16.1f}{d['decode_tps']:16.1f}{d['ttft_ms']:12.1f}")
    print(f"{'ratio':10}{doc['prefill_ratio']:16.3f}{doc['decode_ratio']:16.3f}")
    sys.stdout.flush()
    return 0
