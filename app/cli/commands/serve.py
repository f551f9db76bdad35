"""``glassbox serve`` (an OpenAI-compatible API over the library's models) and ``glassbox endpoints``
(saved remote OpenAI-compatible servers).

``glassbox serve`` serves every chat model of the library by name (and the ``--alias`` names),
several resident at once (a model pool: ``--max-models``, ``--memory-budget``, ``--keep-alive``,
``--queue``); ``--model`` is loaded first and answers requests that name no model. It prints the URL
(or, with ``--json``, one JSON object with ``url`` and ``model``) once that model is loaded and the
port is open, then serves until interrupted (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from app.cli.commands._output import add_json_flag, positive_int, print_json
from app.cli.commands.model_resolver import open_library, resolve_lora, resolve_model
from app.paths import Paths
from engine.errors import EngineError

API_KEY_ENV = "GLASSBOX_SERVE_API_KEY"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Registers ``serve`` and ``endpoints``."""
    del common  # its --home default (None) would reset a --home given before the command
    # Each level takes --home, but must not reset one given earlier (argparse copies a sub-parser's
    # defaults over the values already parsed): SUPPRESS leaves it unset unless given here.
    nested = argparse.ArgumentParser(add_help=False)
    nested.add_argument(
        "--home",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="keep all data under DIR (default: the user's folders)",
    )
    serve = sub.add_parser("serve", parents=[nested], help="serve a local model over an OpenAI-compatible API")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --api-key)")
    serve.add_argument("--port", type=_port, default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require 'Authorization: Bearer KEY' on every request (or set ${API_KEY_ENV}: unlike a "
        "command-line argument, other users cannot read it in the process list)",
    )
    serve.add_argument(
        "--model",
        default="starter",
        help="the model loaded first, for requests that name none: a GGUF path, a library name, or 'starter'",
    )
    serve.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="NAME=MODEL",
        help="another name for a model (e.g. gpt-4o=qwen2.5-7b-instruct), for tools that hard-code one (repeatable)",
    )
    serve.add_argument(
        "--default-model",
        metavar="MODEL",
        help="answer requests naming an unknown model with this one (default: they are a 404)",
    )
    serve.add_argument("--max-models", type=positive_int, default=3, help="most models loaded at once (default 3)")
    serve.add_argument(
        "--memory-budget",
        type=_gib,
        metavar="GIB",
        help="memory the loaded models may take, in GiB (default: the RAM and VRAM free at the first load)",
    )
    serve.add_argument(
        "--keep-alive",
        default="5m",
        metavar="TIME",
        help="how long a model stays loaded without a request: seconds, 30s, 5m, 1h, or 'never' (default 5m)",
    )
    serve.add_argument(
        "--queue", type=int, default=8, metavar="N", help="requests that may wait for one model (default 8)"
    )
    serve.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="FILE[:SCALE]",
        help="offer this LoRA adapter at /lora-adapters, applied at SCALE (default 1) to the models it fits",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let browser pages from ORIGIN call the API (https://host[:port], 'localhost' or '*'; default none)",
    )
    serve.add_argument(
        "--kb",
        action="append",
        default=[],
        metavar="NAME",
        help="answer from this knowledge base when a request names none",
    )
    serve.add_argument("--n-ctx", type=positive_int, default=4096, help="context window in tokens (default 4096)")
    serve.add_argument("--threads", type=positive_int, help="CPU threads (default: llama.cpp's choice)")
    serve.add_argument("--gpu-layers", type=int, default=0, help="layers to offload to the GPU")
    serve.add_argument("--chroma-url", metavar="URL", help="knowledge bases live on this Chroma server")
    serve.add_argument("--no-embeddings", action="store_true", help="do not offer /v1/embeddings")
    add_json_flag(serve)
    serve.set_defaults(handler=run_serve)

    endpoints = sub.add_parser("endpoints", parents=[nested], help="saved remote OpenAI-compatible servers")
    actions = endpoints.add_subparsers(
        dest="endpoints_command", metavar="ACTION", required=True, parser_class=type(endpoints)
    )
    add = actions.add_parser("add", parents=[nested], help="save a server: URL [--api-key K] [--name N]")
    add.add_argument("url", help="the server's base URL, e.g. http://192.168.1.5:8080 (with or without /v1)")
    add.add_argument("--api-key", metavar="KEY", help="bearer key (stored with owner-only permissions)")
    add.add_argument("--name", help="a short name for it (default: host-port)")
    add.add_argument("--no-check", action="store_true", help="save without contacting the server")
    add_json_flag(add)
    add.set_defaults(handler=run_endpoints_add)
    listing = actions.add_parser("list", parents=[nested], help="list saved servers (keys masked)")
    add_json_flag(listing)
    listing.set_defaults(handler=run_endpoints_list)
    remove = actions.add_parser("remove", parents=[nested], help="forget a saved server")
    remove.add_argument("name")
    add_json_flag(remove)
    remove.set_defaults(handler=run_endpoints_remove)
    models = actions.add_parser("models", parents=[nested], help="list the models a saved server offers")
    models.add_argument("name")
    add_json_flag(models)
    models.set_defaults(handler=run_endpoints_models)


def _say(text: str, *, err: bool = False) -> None:
    """Writes one line for the user: stdout for results, stderr for errors and notices."""
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{text}\n")
    stream.flush()


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, not {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, not {text}")
    return value


def endpoint_store(paths: Paths) -> Any:
    """The saved endpoints of this profile (``paths.endpoints_file``)."""
    # lazy: start-up (+5 ms)
    from engine.inference.endpoints import EndpointStore

    return EndpointStore(paths.endpoints_file)


def _embedder_path(paths: Paths) -> Path | None:
    """The settings' embedding model folder, else the bundled starter embedder."""
    # lazy: start-up (+132 ms: pydantic)
    from app.settings import load_settings
    from engine.starter import starter_embedder_path

    try:
        configured = load_settings(paths.settings_file).settings.embedding_model
    except (OSError, ValueError):
        configured = ""
    if configured:
        return Path(configured).expanduser()
    return starter_embedder_path()


# ------------------------------------------------------------------------------------ serve


class LibraryCatalog:
    """The library's chat models, as ``glassbox serve`` offers them: a request naming one (by file
    name, name without ``.gguf`` or label; never a path) is answered by it, loaded in the server's
    model pool."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    def _library(self) -> Any:
        return open_library(self.paths)

    def find(self, name: str) -> Path | None:
        entry = self._library().find(name)
        if entry is None or entry.chat_problem() is not None:
            return None
        return Path(entry.path)

    def names(self) -> list[str]:
        entries = self._library().scan()
        return [Path(e.path).stem for e in entries if e.chat_problem() is None]


def _gib(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of GiB, not {text!r}") from None
    if not 0 < value < 1 << 20:
        raise argparse.ArgumentTypeError(f"must be a positive number of GiB, not {text}")
    return int(value * (1 << 30))


def _pool_settings(args: argparse.Namespace) -> Any:
    # lazy: start-up (+458 ms: pydantic)
    from app.server.served import keep_alive_of
    from engine.inference.pool import KEEP_DEFAULT, PoolSettings

    if args.queue < 0:
        raise EngineError(f"--queue {args.queue}: give 0 or more")
    keep: float | None = None
    if args.keep_alive.strip().lower() != "never":
        try:
            keep = keep_alive_of(args.keep_alive)
        except Exception:  # noqa: BLE001 - the server's 400 becomes the flag's one line
            raise EngineError(f"--keep-alive {args.keep_alive!r}: give seconds, 30s, 5m, 1h or 'never'") from None
        keep = None if keep == KEEP_DEFAULT else keep
    return PoolSettings(
        max_resident=args.max_models, idle_unload_s=keep, memory_budget=args.memory_budget, queue_depth=args.queue
    )


def _aliases(values: list[str]) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for value in values:
        alias, sep, target = value.partition("=")
        if not sep or not alias.strip() or not target.strip():
            raise EngineError(f"--alias {value!r}: give NAME=MODEL")
        aliases[alias.strip()] = target.strip()
    return aliases


def _adapters(args: argparse.Namespace, paths: Paths) -> list[Any]:
    """``--lora`` adapters, then the library's other adapters at scale 0 (offered, not applied)."""
    # lazy: start-up (+30 ms)
    from engine.inference.adapters import LoraAdapter

    chosen = [resolve_lora(value, paths) for value in args.lora]
    given = {a.path.resolve() for a in chosen}
    for entry in open_library(paths).scan():
        if entry.kind == "adapter" and entry.available and Path(entry.path).resolve() not in given:
            chosen.append(LoraAdapter(Path(entry.path), 0.0))
    return chosen


def run_serve(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+545 ms: pydantic)
    from app.server.http import check_host, start_server
    from app.settings import load_settings
    from engine.inference.kv_cache import KvCacheConfig

    check_host(args.host, args.api_key)  # before loading anything: refusing must be instant
    settings = _pool_settings(args)
    aliases = _aliases(args.alias)
    adapters = _adapters(args, paths)
    model = resolve_model(args.model, paths, for_chat=True)
    try:
        kv_max = load_settings(paths.settings_file).settings.kv_cache_max_bytes
    except (OSError, ValueError):
        kv_max = 0
    handle = start_server(
        paths,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        model_path=model,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_gpu_layers=args.gpu_layers,
        knowledge_bases=tuple(args.kb),
        chroma_url=args.chroma_url,
        embedder_path=None if args.no_embeddings else _embedder_path(paths),
        catalog=LibraryCatalog(paths),
        pool_settings=settings,
        aliases=aliases,
        default_model=args.default_model,
        adapters=adapters,
        cors_origins=args.cors_origin,
        kv_cache=KvCacheConfig(paths.kv_cache, kv_max) if kv_max > 0 else None,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        if args.json:
            print_json(
                {
                    "url": handle.url,
                    "openai_base_url": f"{handle.url}/v1",
                    "model": handle.model,
                    "host": handle.host,
                    "port": handle.port,
                    "api_key_required": bool(args.api_key),
                }
            )
        else:
            _say(f"Serving {handle.model} at {handle.url}/v1 (OpenAI-compatible). Ctrl-C to stop.")
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        handle.stop()
    _say("glassbox: server stopped", err=True)
    return 0


# ------------------------------------------------------------------------------------ endpoints


def run_endpoints_add(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+421 ms: rich, pydantic)
    from engine.inference.endpoints import normalize_url
    from engine.inference.remote import list_models

    models: list[str] | None = None
    if not args.no_check:
        # Check before saving: a typo should fail now, not at the first chat.
        models = [m.id for m in list_models(normalize_url(args.url), args.api_key, timeout=15.0)]
    endpoint = endpoint_store(paths).add(args.url, name=args.name, api_key=args.api_key)
    document = endpoint.public_dict()
    if models is not None:
        document["models"] = models
    if args.json:
        print_json(document)
    else:
        found = f" ({len(models)} models)" if models is not None else ""
        _say(f"Saved endpoint {endpoint.name}: {endpoint.url}{found}")
    return 0


def run_endpoints_list(args: argparse.Namespace, paths: Paths) -> int:
    endpoints = endpoint_store(paths).all()
    if args.json:
        print_json({"endpoints": [e.public_dict() for e in endpoints]})
        return 0
    if not endpoints:
        _say("No saved endpoints (add one with `glassbox endpoints add URL`).")
    for endpoint in endpoints:
        key = f"  key {endpoint.public_dict()['api_key']}" if endpoint.api_key else ""
        _say(f"{endpoint.name}\t{endpoint.url}{key}")
    return 0


def run_endpoints_remove(args: argparse.Namespace, paths: Paths) -> int:
    endpoint = endpoint_store(paths).remove(args.name)
    if args.json:
        print_json({"removed": endpoint.public_dict()})
    else:
        _say(f"Removed endpoint {endpoint.name}")
    return 0


def run_endpoints_models(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+382 ms: rich, pydantic)
    from engine.inference.remote import list_models

    endpoint = endpoint_store(paths).get(args.name)
    models = list_models(endpoint.url, endpoint.api_key)
    if args.json:
        print_json(
            {
                "endpoint": endpoint.name,
                "url": endpoint.url,
                "models": [{"id": m.id, "owned_by": m.owned_by, "context_length": m.context_length} for m in models],
            }
        )
        return 0
    for model in models:
        ctx = f"\t{model.context_length} tokens" if model.context_length else ""
        _say(f"{model.id}{ctx}")
    return 0
