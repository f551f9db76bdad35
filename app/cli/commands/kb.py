"""``glassbox kb ...``: knowledge bases from the command line.

``create | add | list | remove | query | drop | reindex``, each with ``--json`` and
``--chroma-url``. Data lives under ``paths.knowledge``; the embedding model is ``--embedder``,
else ``$GLASSBOX_EMBEDDER``, else the ``embedding_model`` setting, else the bundled MiniLM.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli.commands._output import add_json_flag, print_json
from app.paths import Paths
from engine.units import format_eta

if TYPE_CHECKING:
    from rag.ingest import IngestProgress, IngestReport
    from rag.knowledge import KnowledgeBases
    from rag.retrieval import Passage

EMBEDDER_ENV = "GLASSBOX_EMBEDDER"


def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    """Adds the ``kb`` group and its actions."""
    shared = argparse.ArgumentParser(add_help=False)
    add_json_flag(shared)
    shared.add_argument(
        "--chroma-url",
        metavar="URL",
        help="keep vectors on a Chroma server (http://host:port); a knowledge base there is changed only by "
        "the Glassbox home that made it, other homes can search it",
    )
    parents = [common, shared]
    parser = sub.add_parser("kb", parents=[common], help="knowledge bases: index documents and search them")
    group = parser.add_subparsers(dest="kb_command", metavar="ACTION", required=True, parser_class=type(parser))

    p = group.add_parser("create", parents=parents, help="create an empty knowledge base")
    p.add_argument("name")
    p.add_argument("--embedder", metavar="DIR", help="sentence-transformers model folder (default: bundled MiniLM)")
    p.add_argument("--chunk-tokens", type=int, metavar="N", help="chunk size in model tokens (default: model max)")
    p.add_argument("--overlap", type=int, default=32, metavar="N", help="tokens shared by neighbouring chunks")
    p.set_defaults(handler=_create)

    p = group.add_parser("add", parents=parents, help="index files and folders (incremental)")
    p.add_argument("name")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per file read (indexed, skipped and why)")
    p.set_defaults(handler=_add)

    p = group.add_parser("list", parents=parents, help="list knowledge bases, or the documents of one")
    p.add_argument("name", nargs="?")
    p.set_defaults(handler=_list)

    p = group.add_parser("remove", parents=parents, help="forget a file or folder (your files stay)")
    p.add_argument("name")
    p.add_argument("path")
    p.set_defaults(handler=_remove)

    p = group.add_parser("query", parents=parents, help="search a knowledge base")
    p.add_argument("name")
    p.add_argument("text")
    p.add_argument("--k", type=int, default=5, metavar="K", help="how many passages (default 5)")
    p.set_defaults(handler=_query)

    p = group.add_parser("drop", parents=parents, help="delete a knowledge base (your files stay)")
    p.add_argument("name")
    p.set_defaults(handler=_drop)

    p = group.add_parser("reindex", parents=parents, help="rebuild a knowledge base, optionally with another model")
    p.add_argument("name")
    p.add_argument("--embedder", metavar="DIR", help="switch to this sentence-transformers model folder")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per file read (indexed, skipped and why)")
    p.set_defaults(handler=_reindex)


def _setting_embedder(paths: Paths) -> Path | None:
    # lazy: start-up (+119 ms: pydantic)
    from app.settings import load_settings

    value = load_settings(paths.settings_file).settings.embedding_model
    return Path(value).expanduser() if value else None


def _embedder(args: argparse.Namespace, paths: Paths) -> Path | None:
    given = getattr(args, "embedder", None) or os.environ.get(EMBEDDER_ENV)
    return Path(given).expanduser() if given else _setting_embedder(paths)


def _open(args: argparse.Namespace, paths: Paths) -> KnowledgeBases:
    # lazy: start-up (+201 ms: numpy)
    from rag.knowledge import KnowledgeBases

    kbs = KnowledgeBases(paths.knowledge, _embedder(args, paths), args.chroma_url)
    if kbs.recovered is not None:
        # ROBUSTNESS P5: the damaged index was moved aside; re-embed from the registry now, so
        # that this command and the next ones answer from a complete index.
        sys.stderr.write(
            f"glassbox: the document index was damaged ({kbs.recovered.reason}); "
            f"it was moved to {kbs.recovered.moved_to} and is being rebuilt\n"
        )
        sys.stderr.flush()
        # lazy: start-up (+1 ms)
        from rag.errors import KnowledgeBaseError

        try:
            kbs.rebuild(progress=_progress(args))
        except KnowledgeBaseError as exc:  # e.g. a knowledge base's model is gone; the command goes on
            sys.stderr.write(f"glassbox: the rebuild stopped ({exc}); finish it with: glassbox kb reindex NAME\n")
        except BaseException:
            kbs.close()
            raise
    return kbs


def _create(args: argparse.Namespace, paths: Paths) -> int:
    with _open(args, paths) as kbs:
        folder = Path(args.embedder).expanduser() if args.embedder else None
        kb = kbs.create(args.name, embedder_path=folder, max_tokens=args.chunk_tokens, overlap_tokens=args.overlap)
    if args.json:
        print_json(dataclasses.asdict(kb))
    else:
        _out(f"created {kb.name} ({kb.embedder_id}, {kb.dimension} dims, {kb.max_tokens}-token chunks)")
        if args.chroma_url:
            _out(f"  on {args.chroma_url}: other Glassbox homes can search it; only this one can change it")
    return 0


class _Progress:
    """Progress of an indexing run on stderr, and with ``--verbose`` one line per file on stdout.

    On a terminal: one self-overwriting bar, at most ~10 updates a second. Elsewhere (a log, a
    pipe): a plain line every :data:`QUIET_LINE_S` seconds, so a long run is never silent. With
    ``--json`` nothing is written but the JSON document (see :func:`_progress`).
    """

    QUIET_LINE_S = 10.0

    def __init__(self, *, terminal: bool, verbose: bool) -> None:
        self.terminal = terminal
        self.verbose = verbose
        self._last = 0.0
        self._started = time.monotonic()
        self._drawn = False

    def __call__(self, p: IngestProgress) -> None:
        if self.verbose and p.finished_file is not None:
            # lazy: start-up (+157 ms: numpy)
            from rag.ingest import display_path

            self._clear()
            _out(f"  {p.finished_as or 'indexed'}: {display_path(p.finished_file)}")
            sys.stdout.flush()
        now = time.monotonic()
        final = p.state in ("done", "cancelled")
        interval = 0.1 if self.terminal else self.QUIET_LINE_S
        if not final and now - self._last < interval:
            return
        if not self.terminal and final:
            return  # the summary follows on stdout
        self._last = now
        if self.terminal:
            self._draw(p, final)
        else:
            sys.stderr.write(f"glassbox: {_progress_words(p)} ({now - self._started:.0f} s)\n")
            sys.stderr.flush()

    def _draw(self, p: IngestProgress, final: bool) -> None:
        width = max(40, min(shutil.get_terminal_size((100, 20)).columns - 1, 160))
        if p.chunks_total is not None:
            done, total = p.chunks_done, p.chunks_total
        else:
            done, total = p.files_done, p.files_total
        cells = 24
        filled = cells if final and not total else (cells * done // total if total else 0)
        bar = "[" + "#" * filled + "-" * (cells - filled) + "]"
        line = f"{bar} {_progress_words(p)}"
        sys.stderr.write("\r" + line[:width].ljust(width) + ("\n" if final else ""))
        sys.stderr.flush()
        self._drawn = not final

    def _clear(self) -> None:
        if self._drawn:
            width = max(40, min(shutil.get_terminal_size((100, 20)).columns - 1, 160))
            sys.stderr.write("\r" + " " * width + "\r")
            sys.stderr.flush()
            self._drawn = False
            self._last = 0.0  # redraw at the next update


def _progress_words(p: IngestProgress) -> str:
    eta = f", about {format_eta(p.eta_s)}" if p.eta_s and p.eta_s > 0 else ""  # an estimate: "about"
    if p.chunks_total is not None:
        return f"{p.state} {p.chunks_done} of {p.chunks_total} chunks{eta}"
    name = f" {Path(p.current_file).name}" if p.current_file and p.state == "indexing" else ""
    return f"{p.state} {p.files_done}/{p.files_total} files, {p.chunks_done} chunks{eta}{name}"


def _progress(args: argparse.Namespace) -> _Progress | None:
    """The progress display for this command: none with ``--json``."""
    if getattr(args, "json", False):
        return None
    return _Progress(terminal=sys.stderr.isatty(), verbose=bool(getattr(args, "verbose", False)))


def _report(report: IngestReport, name: str, as_json: bool) -> int:
    if as_json:
        document = dataclasses.asdict(report)
        document["failures"] = [{"path": p, "reason": r} for p, r in report.failures]
        print_json({"kb": name, **document})
    else:
        # lazy: start-up (+168 ms: numpy); display_path: one line per file, even for a name with a line break
        from rag.ingest import display_path

        for path, reason in report.failures:
            _out(f"  {reason}: {display_path(path)}")
        _out(f"{name}: {report.summary()}")
    return 130 if report.cancelled else 0


def _add(args: argparse.Namespace, paths: Paths) -> int:
    progress = _progress(args)
    with _open(args, paths) as kbs:
        report = kbs.add(args.name, [Path(p) for p in args.paths], progress=progress)
    return _report(report, args.name, args.json)


def _reindex(args: argparse.Namespace, paths: Paths) -> int:
    progress = _progress(args)
    with _open(args, paths) as kbs:
        folder = Path(args.embedder).expanduser() if args.embedder else None
        report = kbs.reindex(args.name, embedder_path=folder, progress=progress)
    return _report(report, args.name, args.json)


def _list(args: argparse.Namespace, paths: Paths) -> int:
    with _open(args, paths) as kbs:
        if args.name:
            kb = kbs.get(args.name)
            records = kbs.documents(args.name)
            if args.json:
                print_json({"kb": dataclasses.asdict(kb), "documents": [dataclasses.asdict(d) for d in records]})
                return 0
            _out(f"{kb.name}: {len(records)} documents, model {kb.embedder_id}")
            for d in records:
                reason = f" ({d.reason})" if d.reason else ""
                _out(f"  {d.state:<8} {d.n_chunks:>6} chunks  {d.path}{reason}")
            return 0
        summaries = kbs.list()
        foreign = kbs.foreign()
    if foreign:
        # lazy: start-up (+231 ms: numpy)
        from rag.knowledge import ONE_HOME

        sys.stderr.write(
            f"glassbox: note: {args.chroma_url} also holds {', '.join(foreign)} from other Glassbox homes, "
            f"to search only (kb query, chat --kb): {ONE_HOME}\n"
        )
    if args.json:
        print_json([{**dataclasses.asdict(s.info), **dataclasses.asdict(s.stats)} for s in summaries])
        return 0
    if not summaries:
        _out("no knowledge bases (create one with: glassbox kb create NAME)")
    for s in summaries:
        docs = sum(s.stats.documents.values())
        _out(f"{s.info.name}: {docs} documents, {s.stats.embedded} chunks, model {s.info.embedder_id}")
    return 0


def _remove(args: argparse.Namespace, paths: Paths) -> int:
    with _open(args, paths) as kbs:
        removed = kbs.remove(args.name, Path(args.path))
    if args.json:
        print_json({"kb": args.name, "removed": removed})
    else:
        _out(f"{args.name}: removed {removed} document{'s' if removed != 1 else ''}")
    return 0


def _drop(args: argparse.Namespace, paths: Paths) -> int:
    with _open(args, paths) as kbs:
        kbs.drop(args.name)
    if args.json:
        print_json({"kb": args.name, "dropped": True})
    else:
        _out(f"dropped {args.name}")
    return 0


def _passage_json(passage: Passage) -> dict[str, object]:
    return dataclasses.asdict(passage)


def _query(args: argparse.Namespace, paths: Paths) -> int:
    if args.k < 1:
        sys.stderr.write("glassbox: error: --k must be at least 1\n")
        return 2
    with _open(args, paths) as kbs:
        if kbs.searchable([args.name]) and kbs.pending([args.name]):
            # Chunks an interrupted run left unembedded would be found by keywords only.
            kbs.rebuild([args.name], progress=_progress(args))
        passages = kbs.query(args.name, args.text, k=args.k)
    if args.json:
        print_json({"kb": args.name, "query": args.text, "passages": [_passage_json(p) for p in passages]})
        return 0
    if not passages:
        _out("no matching passages")
    for n, p in enumerate(passages, start=1):
        page = f" p.{p.page}" if p.page is not None else ""
        dense = f"dense {p.dense_score:.3f} #{p.dense_rank}" if p.dense_score is not None else "dense -"
        bm25 = f"bm25 {p.bm25_score:.2f} #{p.bm25_rank}" if p.bm25_score is not None else "bm25 -"
        _out(f"[{n}] {p.path}{page}  fused {p.fused_score:.4f} ({dense}, {bm25})")
        _out("    " + " ".join(p.text.split())[:300])
    return 0
