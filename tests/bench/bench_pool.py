"""The model pool and live adapters (issue 26): answering a request for another model when it is
resident vs when it has to be loaded, the memory the pool reports vs what its workers hold, and a
LoRA adapter switched in the loaded model vs the model loaded again (the last test's docstring).

Run: ``make bench`` or ``pytest tests/bench/bench_pool.py -s`` (``BENCH_POOL_ROUNDS``, default 4).

Two ``glassbox serve`` servers (in this process, each model in its own worker) serve the starter
(Gemma 3 270M) and a tiny Qwen 3 built by the tests: one keeps both resident (``max_resident`` 2),
the other may hold one (``max_resident`` 1), so every change of model unloads one and loads the
other, as a server holding a single model does. Each round, on each server in turn (the order
rotates), a request alternates the two models: starter, tiny, starter, tiny. The time to the first
token is the client's (the ``openai`` SDK, streamed): from sending the request to the first
content chunk, the load included when there is one; the prompts are short and the same on both
servers, so the difference is the load. Budget: a switch to a resident model takes <= 10% of the
time a switch with a load takes (median of the switches to the starter, whose weights dominate;
the tiny model's figure beside it). Greedy, so the replies are identical on both servers.

Beside it, without a budget: the memory the pool reports for the two resident models (the fit
estimator's weights, KV cache and compute buffers) over the resident set size of their worker
processes (``psutil``), measured after the rounds: the estimate is what eviction decisions use.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import openai
import psutil
from openai.types.chat import ChatCompletionMessageParam

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from engine.inference.adapters import LoraAdapter
from engine.inference.events import Finished, Token
from engine.inference.pool import PoolSettings
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from tests.bench.results import budgets, record
from tests.engine.lora_fixtures import write_gguf_lora

ROUNDS = int(os.environ.get("BENCH_POOL_ROUNDS", "4"))
BUDGET = 0.10
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a river."}]
SIDES = ("resident", "reload")


class _Tiny:
    def __init__(self, path: Path) -> None:
        self.path = path

    def find(self, name: str) -> Path | None:
        return self.path if name == "tiny" else None

    def names(self) -> list[str]:
        return ["tiny"]


def _ttft(api: openai.OpenAI, model: str) -> tuple[float, str]:
    """Seconds from the request to its first content chunk, and the whole reply."""
    start = time.perf_counter()
    first: float | None = None
    text = ""
    stream = api.chat.completions.create(model=model, messages=ASK, max_tokens=4, temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter()
            text += chunk.choices[0].delta.content
    assert first is not None, f"{model} sent no text"
    return first - start, text


def _resident(handle: ServerHandle) -> list[dict]:  # type: ignore[type-arg]
    import json
    import urllib.request

    with urllib.request.urlopen(f"{handle.url}/glassbox/ps", timeout=60) as response:
        return json.loads(response.read())["models"]  # type: ignore[no-any-return]


def test_switching_to_a_resident_model_vs_loading_it(
    starter_model: Path, tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    tiny = tiny_model("qwen3")
    handles: dict[str, ServerHandle] = {}
    try:
        for side, count in (("resident", 2), ("reload", 1)):
            handles[side] = start_server(
                Paths.resolve(tmp_path / side),
                port=0,
                model_path=starter_model,
                n_ctx=1024,
                catalog=_Tiny(tiny),
                pool_settings=PoolSettings(max_resident=count, memory_budget=8 << 30, idle_unload_s=None),
            )
        apis = {
            side: openai.OpenAI(base_url=f"{h.url}/v1", api_key="-", max_retries=0, timeout=300)
            for side, h in handles.items()
        }
        starter = handles["resident"].model
        assert handles["reload"].model == starter
        for api in apis.values():  # both models loaded once and warmed on both servers
            _ttft(api, "tiny")
            _ttft(api, starter)
        times: dict[tuple[str, str], list[float]] = {(s, m): [] for s in SIDES for m in (starter, "tiny")}
        replies: dict[str, set[str]] = {starter: set(), "tiny": set()}
        for i in range(ROUNDS):
            for side in SIDES[i % 2 :] + SIDES[: i % 2]:
                for model in ("tiny", starter):  # the last request named the other model
                    seconds, text = _ttft(apis[side], model)
                    times[(side, model)].append(seconds)
                    replies[model].add(text)
        pids = {r["name"]: r["pid"] for r in _resident(handles["resident"])}
        assert set(pids) == {starter, "tiny"}, "the resident server unloaded a model"
        assert len(_resident(handles["reload"])) == 1
        reported = sum(r["memory"]["total"] for r in _resident(handles["resident"]))
        rss = sum(psutil.Process(pid).memory_info().rss for pid in pids.values())
    finally:
        for handle in handles.values():
            handle.stop()
    assert all(len(texts) == 1 for texts in replies.values()), f"greedy replies differ: {replies}"
    median = {key: statistics.median(values) * 1000 for key, values in times.items()}
    for key, values in times.items():
        print(f"{key[0]:8} -> {key[1]:24} TTFT ms {[round(v * 1000) for v in values]}")
    ratio = median[("resident", starter)] / median[("reload", starter)]
    tiny_ratio = median[("resident", "tiny")] / median[("reload", "tiny")]
    print(f"switch to the starter: resident / reload {ratio:.3f} (tiny {tiny_ratio:.3f}), budget <= {BUDGET}")
    with budgets():
        record(
            "pool: switch to a resident model vs loading it: TTFT",
            ratio,
            at_most=BUDGET,
            detail=f"starter {median[('resident', starter)]:.0f} ms resident vs {median[('reload', starter)]:.0f} ms "
            f"with its load; tiny {median[('resident', 'tiny')]:.0f} vs {median[('reload', 'tiny')]:.0f} ms",
        )
        record(
            "pool: reported memory vs workers' RSS",
            reported / rss,
            detail=f"{reported / 2**20:.0f} MiB estimated for the two resident models, {rss / 2**20:.0f} MiB RSS",
        )


def _first_token(session: ChatSession, start: float) -> tuple[float, str, str]:
    """Seconds from ``start`` to the turn's first token, the reply and the adapters it ran with."""
    first: float | None = None
    finished: Finished | None = None
    for event in session.stream([], "Name a river.", GenerationParams(max_tokens=8, temperature=0.0)):
        if isinstance(event, Token) and first is None:
            first = time.perf_counter()
        elif isinstance(event, Finished):
            finished = event
    assert first is not None and finished is not None
    return first - start, finished.text, finished.stats.adapters


def test_switching_an_adapter_vs_reloading_the_base_model(starter_model: Path, tmp_path: Path) -> None:
    """A LoRA adapter (made in the test for the starter's shapes, ``lora_fixtures``) switched on
    and off in the loaded model (``ChatSession.set_adapters``: the KV cache is read again) vs the
    same change made by loading the model again with or without it, as a server without live
    adapters does. Time to the first token of a short turn, the load included. Budget: the switch
    <= 10% of the reload; greedy, the replies of each configuration identical both ways."""
    adapter = write_gguf_lora(tmp_path / "starter-lora.gguf", starter_model, strength=1.0)
    configs: dict[str, tuple[LoraAdapter, ...]] = {"base": (), "adapter": (LoraAdapter(adapter, 1.0),)}
    params = LoadParams(model_path=starter_model, n_ctx=512)
    live = ChatSession(params, reply_reserve=64)
    sides = ("switch", "reload")
    times: dict[tuple[str, str], list[float]] = {(s, c): [] for s in sides for c in configs}
    replies: dict[str, set[str]] = {c: set() for c in configs}
    try:
        live.load()
        _first_token(live, time.perf_counter())  # warm
        for i in range(ROUNDS):
            for side in sides[i % 2 :] + sides[: i % 2]:
                for name in ("adapter", "base"):  # each turn changes the adapters
                    start = time.perf_counter()
                    if side == "switch":
                        live.set_adapters(configs[name])
                        seconds, text, used = _first_token(live, start)
                    else:
                        fresh = ChatSession(params, reply_reserve=64)
                        try:
                            fresh.set_adapters(configs[name])
                            fresh.load()
                            seconds, text, used = _first_token(fresh, start)
                        finally:
                            fresh.close()
                    assert (used != "") == (name == "adapter"), used
                    times[(side, name)].append(seconds)
                    replies[name].add(text)
    finally:
        live.close()
    assert all(len(texts) == 1 for texts in replies.values()), f"greedy replies differ: {replies}"
    assert replies["base"] != replies["adapter"], "the adapter changed nothing"
    for key, values in times.items():
        print(f"{key[0]:7} -> {key[1]:8} TTFT ms {[round(v * 1000) for v in values]}")
    median = {key: statistics.median(values) * 1000 for key, values in times.items()}
    switch = statistics.median(times[("switch", "adapter")] + times[("switch", "base")]) * 1000
    reload = statistics.median(times[("reload", "adapter")] + times[("reload", "base")]) * 1000
    record(
        "adapter switch vs base reload: TTFT",
        switch / reload,
        at_most=BUDGET,
        detail=f"switch {switch:.0f} ms (on {median[('switch', 'adapter')]:.0f}, off {median[('switch', 'base')]:.0f}) "
        f"vs reload {reload:.0f} ms",
    )
