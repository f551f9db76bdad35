"""``glassbox chat``: one prompt, or a conversation read from stdin, streamed to stdout.

With ``--prompt`` it answers once. Without it, each line of stdin is a user turn of one
conversation, so the KV cache of earlier turns is reused. ``--json`` prints one JSON object per
turn: the reply, ``finish_reason``, every Stats field, ``sources`` and ``documents_dropped``.

Contract: ARCHITECTURE.md, 'app.cli.commands.chat'.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from app.cli.commands import chat_tools
from app.cli.commands._output import add_json_flag, positive_int, print_json
from app.cli.commands.model_resolver import resolve_lora, resolve_model
from app.knowledge_glue import make_retriever
from app.paths import Paths
from app.turn import TurnRecord, TurnRequest, run_turn
from engine.display import printable
from engine.gguf import read_gguf_info
from engine.hardware import cached_memory_bandwidth
from engine.inference.events import Finished, Reasoning, Token
from engine.media import load_media

if TYPE_CHECKING:
    from app.agent_history import AgentRecord, Record
    from app.cli.commands.chat_history import ChatLog
    from app.knowledge_glue import Retriever
    from engine.inference.backends import ChatBackend
    from engine.inference.context import Message
    from engine.inference.projector import MediaInfo
    from engine.inference.runtime import GenerationParams
    from engine.media import Media


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("chat", parents=[common], help="chat with a local or remote model in the terminal")
    parser.add_argument(
        "--model",
        help="a GGUF path, a model name from the library, or 'starter'; with "
        "--endpoint, the server's model id (default: the server's first model)",
    )
    parser.add_argument(
        "--endpoint",
        metavar="NAME",
        help="chat with a model on this saved OpenAI-compatible endpoint instead of a local one",
    )
    parser.add_argument("--prompt", help="answer this once (default: read user turns from stdin, one per line)")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="attach an image (PNG, JPEG, WebP, GIF, BMP; or a WAV, MP3 or FLAC clip) to the first turn; repeatable",
    )
    parser.add_argument("--kb", action="append", default=[], metavar="NAME", help="answer from this knowledge base")
    parser.add_argument("--chroma-url", metavar="URL", help="knowledge bases on a Chroma server (http://host:port)")
    parser.add_argument(
        "--n-ctx",
        type=positive_int,
        default=None,
        help="context window in tokens (default 4096; with --endpoint, what the server reports)",
    )
    parser.add_argument("--max-tokens", type=positive_int, default=512, help="reply length limit (default 512)")
    parser.add_argument("--temperature", type=float, default=0.7, help="0 is greedy and deterministic")
    parser.add_argument("--seed", type=int, help="sampling seed")
    parser.add_argument("--threads", type=positive_int, help="CPU threads (default: llama.cpp's choice)")
    parser.add_argument("--gpu-layers", default="0", help="layers to offload to the GPU: N, or 'auto'")
    parser.add_argument(
        "--overflow",
        choices=["rolling", "refuse"],
        default="rolling",
        help="when the conversation outgrows the window: drop oldest turns, or refuse",
    )
    parser.add_argument(
        "--conversation",
        type=positive_int,
        metavar="ID",
        help="continue this saved conversation (a new one prints its id at the start)",
    )
    parser.add_argument(
        "--no-kv-cache", action="store_true", help="neither restore nor save the KV cache saved with the conversation"
    )
    parser.add_argument(
        "--speculative",
        metavar="off|lookup|MODEL_PATH",
        default=None,
        help="speculative decoding: 'lookup' drafts from the prompt and the reply (the default), "
        "a GGUF path drafts with that smaller model of the same vocabulary, 'off' disables it",
    )
    parser.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="FILE[:SCALE]",
        help="apply this LoRA adapter (a file or a library adapter's name) at SCALE (default 1); repeatable",
    )
    parser.add_argument(
        "--compare-base",
        action="store_true",
        help="after each reply, decode its prompt greedily with the --lora adapters and without them, and print "
        "where the two replies first differ and how far the adapters moved that token's probability",
    )
    chat_tools.add_arguments(parser)
    add_json_flag(parser)
    parser.set_defaults(handler=run)


def _bandwidth(paths: Paths) -> float | None:
    try:
        return cached_memory_bandwidth(paths.bandwidth_cache)
    except OSError:
        return None


def _usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags together (exit code 2), or None."""
    if args.endpoint is None and not args.model:
        return "chat needs --model (or --endpoint NAME for a remote server)"
    usage = chat_tools.check_arguments(args)
    if usage is not None:
        return usage
    if args.endpoint is not None and args.speculative is not None:
        return "--speculative applies to local models, not to --endpoint"
    if args.endpoint is not None and args.lora:
        return "--lora applies to local models, not to --endpoint"
    if args.compare_base and not args.lora:
        return "--compare-base compares the --lora adapters with the base model: give --lora FILE[:SCALE]"
    if args.compare_base and (args.json or args.tools or args.kb):
        return "--compare-base compares the reply's prompt alone: not with --json, --tools or --kb"
    return None


@dataclass
class _Chat:
    """One ``glassbox chat`` run: what every turn of it uses."""

    args: argparse.Namespace
    session: ChatBackend
    log: ChatLog
    params: GenerationParams
    system: str | None
    retriever: Retriever | None
    tools: chat_tools.ChatTools | None = None
    media: tuple[Media, ...] = ()  # what ``--image`` attached to the next turn

    def turn(self, history: list[Message], user: str) -> list[Message]:
        """Answers ``user`` after ``history``, saves and prints the turn; returns its messages."""
        # lazy: start-up (+13 ms)
        from engine.inference.context import Message

        args, chat_log, tools = self.args, self.log, self.tools
        media, self.media = self.media, ()
        costs = _media_costs(self.session, media)
        if costs and not args.json:
            for line in costs:
                print(f"[{line['name']}: {_cost_words(line)}]", file=sys.stderr)
        conversation_id, created = chat_log.start_turn(user, self.system, media)
        if created and not args.json:
            print(
                f"[conversation {conversation_id}: continue it with --conversation {conversation_id}]", file=sys.stderr
            )
        request = TurnRequest(
            tuple(history),
            user,
            self.params,
            self.system,
            media=media,
            retrieve=self.retriever,
            tools=tools.turn_tools if tools is not None else None,
            tool_choice=args.tool_choice if tools is not None else None,
            cache_key=chat_log.cache_key() if args.endpoint is None and not args.no_kv_cache else None,
            **chat_tools.thinking_options(args),
        )
        try:
            record = answer(self.session, request, args.json, chat_log.save_progress)  # each step saved as it happens
        except BaseException as exc:
            chat_log.fail_turn(exc)
            raise
        finished = record.finished
        assert finished is not None  # a turn that did not finish raised instead (fail_turn saved it)
        chat_log.finish_turn(record)
        sources, dropped = record.sources, finished.stats.documents_dropped
        if args.json:
            print_json(
                {
                    **_turn_document(record.answer, finished, sources, dropped),
                    **chat_tools.turn_extras(record),
                    **({"media": costs} if costs else {}),
                    "conversation_id": conversation_id,
                }
            )
        else:
            if dropped:
                print(f"[{dropped_line(dropped)}]", file=sys.stderr)
            if sources:
                _print_sources(sources)
        return [Message("user", user, media=media), *record.messages]


def run(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+177 ms: pydantic)
    from app.cli.commands.chat_history import ChatLog
    from engine.inference.runtime import GenerationParams

    usage = _usage_error(args)
    if usage is not None:
        print(f"glassbox: error: {usage}", file=sys.stderr)
        return 2
    if args.endpoint is None and args.speculative is None:
        args.speculative = _speculative_setting(args, paths)
    try:
        session = _remote_session(args, paths) if args.endpoint is not None else _local_session(args, paths)
    except argparse.ArgumentTypeError as exc:
        print(f"glassbox: error: {exc}", file=sys.stderr)
        return 2
    schema = chat_tools.read_json_schema(args.json_schema) if args.json_schema else None
    params = GenerationParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        json_schema=schema,
        speculative=_speculative_mode(args),
    )
    retriever = _retriever(args, paths) if args.kb else None
    media = tuple(load_media(Path(name).expanduser()) for name in args.image)  # one line naming a bad file
    chat_log = ChatLog(paths, args.conversation, args.model or args.endpoint)
    history: list[Message] = chat_log.history()
    system = args.system if args.system is not None else chat_log.system_prompt
    chat = _Chat(args, session, chat_log, params, system, retriever, media=media)
    with session, chat_log, contextlib.ExitStack() as stack:
        chat.tools = stack.enter_context(chat_tools.ChatTools(args, paths, session)) if args.tools else None
        session.load()
        for user in _turns(args):
            before = list(history)
            history += chat.turn(history, user)
            if args.compare_base:
                _compare_base(session, before, user, params, system)
    return 0


def _compare_base(session: ChatBackend, history: list[Message], user: str, params: Any, system: str | None) -> None:
    """Prints where the reply to ``user`` changes with the adapters (greedy both ways): the line the
    window's inspector shows (``engine.inference.base_compare``)."""
    local = session.local
    assert local is not None  # --compare-base needs --lora, which needs a local model
    comparison = local.compare_base(history, user, params, system=system)
    print(f"compare with base: {printable(comparison.summary())}")
    if comparison.move_line():
        print(f"compare with base: {printable(comparison.move_line())}")


def _local_session(args: argparse.Namespace, paths: Paths) -> ChatBackend:
    """A ChatSession for ``--model`` (a path, a library name or 'starter'). Raises ModelFileError."""
    # lazy: start-up (+7 ms)
    from app.compose import BackendOptions, LoadSettings, LocalModel, open_backend, parse_gpu_layers, projector_choice

    model = resolve_model(args.model, paths, for_chat=True)
    try:
        gpu_layers = parse_gpu_layers(args.gpu_layers)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    mmproj = projector_choice(model, paths)  # chosen by hand in the library, else the one beside it
    load = LoadSettings(args.n_ctx or 4096, args.threads, gpu_layers, _draft_model(args.speculative), mmproj)
    options = BackendOptions(
        overflow_policy=args.overflow,
        machine_bandwidth_gbps=_bandwidth(paths),
        backend_state=paths.cpu_backend_state,
        kv_cache=None if args.no_kv_cache else _kv_cache(paths),
    )
    backend = open_backend(LocalModel(model), load, options, None)
    local = backend.local
    if args.lora and local is not None:
        local.set_adapters([resolve_lora(value, paths) for value in args.lora])  # AdapterMismatch: one line
    return backend


def _speculative_setting(args: argparse.Namespace, paths: Paths) -> str:
    """Without ``--speculative``: the draft model set for this model in Settings, else the
    setting's mode (``lookup`` unless changed: tests/bench/bench_speculative.py measured ordinary
    chat no slower with it)."""
    # lazy: start-up (+140 ms: pydantic)
    from app.settings import load_settings

    settings = load_settings(paths.settings_file).settings
    draft = settings.draft_models.get(str(resolve_model(args.model, paths, for_chat=True)))
    return draft if draft else settings.speculative


def _speculative_mode(args: argparse.Namespace) -> Literal["off", "lookup", "draft"]:
    """GenerationParams.speculative for ``--speculative`` (remote endpoints decode on their own)."""
    if args.endpoint is not None:
        return "off"
    spec = args.speculative or "lookup"
    if spec == "off":
        return "off"
    return "lookup" if spec == "lookup" else "draft"


def _draft_model(spec: str | None) -> Path | None:
    """The draft model ``--speculative MODEL_PATH`` names. Raises ModelFileError when it is no GGUF."""
    if spec is None or spec in ("off", "lookup"):
        return None

    path = Path(spec).expanduser()
    read_gguf_info(path)  # a missing or broken file is a one-line error naming it, before any load
    return path


def _kv_cache(paths: Paths) -> Any:
    """Where the KV cache saved with each chat lives, under the settings' size cap."""
    # lazy: start-up (+143 ms: pydantic)
    from app.settings import load_settings
    from engine.inference.kv_cache import KvCacheConfig

    return KvCacheConfig(paths.kv_cache, load_settings(paths.settings_file).settings.kv_cache_max_bytes)


def _remote_session(args: argparse.Namespace, paths: Paths) -> ChatBackend:
    """A RemoteSession on the saved endpoint ``--endpoint``. Raises EngineError for an unknown name."""
    # lazy: start-up (+9 ms)
    from app.compose import BackendOptions, LoadSettings, RemoteModel, open_backend

    options = BackendOptions(overflow_policy=args.overflow, n_ctx=args.n_ctx)
    model = RemoteModel(args.endpoint, args.model or "")  # no --model: the server's first model
    return open_backend(model, LoadSettings(), options, paths.endpoints_file)


def _turns(args: argparse.Namespace) -> Iterator[str]:
    if args.prompt is not None:
        yield args.prompt
        return
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print(">>> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        text = line.rstrip("\n")
        if text.strip():
            yield text


def answer(
    session: ChatBackend,
    request: TurnRequest,
    quiet: bool,
    progress: Callable[[str, AgentRecord], None] | None = None,
) -> TurnRecord:
    """Runs one turn (``app.turn.run_turn``) and prints it as it streams: the answer on stdout,
    the thinking and each tool call on stderr. Ctrl-C stops it.

    Args:
        progress: told ``(text so far, record)`` after each new message of the agent loop (the
            assistant's calls, each result, the answer), to save it as it happens
            (``ChatLog.save_progress``).

    Returns:
        The turn's record.
    """
    # lazy: start-up (+18 ms)
    from engine.agent.loop import ToolStep

    def on_record(entry: Record) -> None:
        if progress is not None and entry.get("kind") == "message":
            progress(record.shown.text, record.agent)

    turn = run_turn(session, request, on_record)
    record = turn.record
    events = iter(turn)
    try:
        for event in events:
            if quiet:
                continue
            if isinstance(event, Token):
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Reasoning):
                sys.stderr.write(event.text)  # the thinking, apart from the answer
            elif isinstance(event, ToolStep):
                chat_tools.print_step(event)
    except KeyboardInterrupt:
        request.cancel.set()
        for _ in events:
            pass
    finished = record.finished
    assert finished is not None
    if not quiet:
        sys.stdout.write("\n")
        if finished.reason == "cancelled":
            print("[stopped]", file=sys.stderr)
        if request.tools is None and finished.stats.evicted_messages:
            print(
                f"[{finished.stats.evicted_messages} older messages no longer fit the context window]", file=sys.stderr
            )
        if record.hit_step_limit and request.tools is not None:
            print(
                f"[{request.tools.max_steps} rounds of tool calls: the model had to answer without calling one]",
                file=sys.stderr,
            )
    if finished.stats.cpu_note:  # the CPU code crashed mid-reply and the reply went on: said once, on it
        print(f"glassbox: note: {finished.stats.cpu_note}", file=sys.stderr)
    return record


def _media_costs(session: ChatBackend, media: tuple[Media, ...]) -> list[dict[str, Any]]:
    """Each attachment's cost for this model before the turn is sent: the projector's own token
    count (a local model; a server's is its own, so none is said). Raises MediaError (the model
    cannot see it)."""
    if not media:
        return []
    local = session.local
    infos: list[MediaInfo | None] = [*local.media_info(list(media))] if local is not None else [None] * len(media)
    out = []
    for item, info in zip(media, infos, strict=True):
        line: dict[str, Any] = {"name": item.name, "digest": item.digest, "kind": item.kind, "label": item.label}
        if info is not None:
            line.update(tokens=info.tokens, width=info.width, height=info.height, note=info.note)
        out.append(line)
    return out


def _cost_words(line: dict[str, Any]) -> str:
    tokens = f"{line['tokens']} tokens" if "tokens" in line else "cost counted by the server"
    note = f"; {line['note']}" if line.get("note") else ""
    return f"{tokens} ({line['label']}{note})"


def _turn_document(reply: str, finished: Finished, sources: list[dict[str, Any]], dropped: int = 0) -> dict[str, Any]:
    document: dict[str, Any] = {"text": reply, "finish_reason": finished.reason}
    document.update(finished.stats.to_dict())
    document["sources"] = sources
    document["documents_dropped"] = dropped
    return document


def dropped_line(dropped: int) -> str:
    """What ``glassbox chat`` says when the documents band left passages out (one line, stderr)."""
    if dropped == 1:
        return "1 passage did not fit the context window and was left out"
    return f"{dropped} passages did not fit the context window and were left out"


def _print_sources(sources: list[dict[str, Any]]) -> None:
    print("Sources:", file=sys.stderr)
    for source in sources:
        page = f", page {source['page']}" if source.get("page") else ""
        print(f"  [{source['n']}] {source['path']}{page}", file=sys.stderr)


def _retriever(args: argparse.Namespace, paths: Paths) -> Retriever:
    """Returns ``fn(query) -> Passages`` over the named knowledge bases: the passages found, ranked
    (the backend's documents band fits them)."""

    return make_retriever(paths, args.kb, args.chroma_url)
