"""``glassbox models search | files | download``: find GGUF models on Hugging Face and fetch them.

Downloads go to ``<models>/<owner>/<repo>/<file>`` (the layout LM Studio users know, and the
Models page's: ``engine.hub.model_download.model_folder``; a model already in the page's older
``<owner>__<repo>`` folder is found there), resume where they stopped when the same command
runs again, print progress on stderr (a redrawn line on a terminal, a line a second otherwise)
and, with ``--json``, one document with the final path and sha256 on stdout. ``HF_ENDPOINT``
(or ``--endpoint``) points at a mirror; ``HF_TOKEN`` opens gated repositories.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from app.cli.commands._output import add_json_flag, print_json
from app.paths import Paths
from engine.display import printable
from engine.errors import DownloadError, EngineError
from engine.fit import estimate_fit_from_size
from engine.hardware import probe_hardware
from engine.units import format_bytes, format_eta, format_speed

if TYPE_CHECKING:
    from engine.fit import FitEstimate
    from engine.hub.download_job import DownloadResult
    from engine.hub.search import ModelChoice, ModelFile, RepoFiles
    from engine.hub.transfer import DownloadProgress


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Adds ``search``, ``files`` and ``download`` to the ``models`` group."""
    search = sub.add_parser("search", parents=[common], help="search Hugging Face for GGUF models")
    search.add_argument("query", metavar="QUERY", nargs="?", default="", help="words in the repository name")
    search.add_argument(
        "--adapters",
        action="store_true",
        help="search GGUF LoRA adapters (repos tagged lora) instead of models, each with the base it adapts",
    )
    search.add_argument("--base", metavar="REPO", help="with --adapters: only adapters of this base model (owner/name)")
    search.add_argument(
        "--sort",
        choices=["downloads", "likes", "recent"],
        default="downloads",
        help="order of the results (default: downloads)",
    )
    search.add_argument("--limit", type=_limit, default=20, help="at most this many results (default 20)")
    _endpoint_flag(search)
    add_json_flag(search)
    search.set_defaults(handler=run_search)

    files = sub.add_parser("files", parents=[common], help="list a repository's GGUF files and quant types")
    files.add_argument("repo", metavar="REPO", help="owner/name on Hugging Face")
    files.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")
    _endpoint_flag(files)
    add_json_flag(files)
    files.set_defaults(handler=run_files)

    download = sub.add_parser("download", parents=[common], help="download a model file (resumable, verified)")
    download.add_argument("repo", metavar="REPO", help="owner/name on Hugging Face")
    download.add_argument(
        "file", metavar="FILE", help="a file of the repository, or a split model's name (all its parts)"
    )
    download.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")
    download.add_argument(
        "--to", metavar="DIR", type=Path, help="download into DIR (default: the models folder, under owner/repo)"
    )
    download.add_argument(
        "--with-mmproj",
        action="store_true",
        help="also download the vision projector (mmproj) that goes with the model",
    )
    download.add_argument(
        "--force", action="store_true", help="download even if the model looks too big for this machine"
    )
    _endpoint_flag(download)
    add_json_flag(download)
    download.set_defaults(handler=run_download)


def _endpoint_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="Hugging Face endpoint or mirror (default: $HF_ENDPOINT or https://huggingface.co)",
    )


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be between 1 and 1000, not {text}")
    return value


def _table(rows: list[list[str]], out: TextIO) -> None:
    rows = [[printable(cell) for cell in row] for row in rows]  # names from the Hub: no terminal control
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")


# ---------------------------------------------------------------------------------- search


def run_search(args: argparse.Namespace, paths: Paths) -> int:  # noqa: ARG001 - the handler signature
    """``models search``."""
    if args.adapters or args.base:
        return _run_adapter_search(args)
    if not args.query.strip():
        raise DownloadError("models search: say what to search for (or use --adapters)")
    # lazy: start-up (+22 ms)
    from engine.hub.search import search_models

    results = search_models(args.query, args.sort, args.limit, args.endpoint)
    if args.json:
        print_json({"query": args.query, "sort": args.sort, "results": [r.to_dict() for r in results]})
        return 0
    if not results:
        sys.stdout.write(f"no GGUF models found for {printable(repr(args.query))}\n")
        return 0
    rows = [["REPOSITORY", "DOWNLOADS", "LIKES", "UPDATED", ""]]
    for r in results:
        rows.append(
            [r.id, f"{r.downloads:,}", f"{r.likes:,}", (r.last_modified or "")[:10], "gated" if r.gated else ""]
        )
    _table(rows, sys.stdout)
    return 0


def _run_adapter_search(args: argparse.Namespace) -> int:
    """``models search --adapters``: the Discover page's adapter search."""
    # lazy: start-up (+25 ms, as the model search)
    from engine.hub.adapters import search_adapters

    results = search_adapters(
        args.query, base_model=args.base, sort=args.sort, limit=args.limit, endpoint=args.endpoint
    )
    if args.json:
        print_json(
            {"query": args.query, "base": args.base, "sort": args.sort, "results": [r.to_dict() for r in results]}
        )
        return 0
    if not results:
        sys.stdout.write("no GGUF LoRA adapters found\n")
        return 0
    rows = [["ADAPTER", "BASE MODEL", "DOWNLOADS", "LIKES", ""]]
    for r in results:
        rows.append([r.id, r.base_model or "?", f"{r.downloads:,}", f"{r.likes:,}", "gated" if r.gated else ""])
    _table(rows, sys.stdout)
    return 0


# ----------------------------------------------------------------------------------- files


def run_files(args: argparse.Namespace, paths: Paths) -> int:
    """``models files``."""
    # lazy: start-up (+21 ms)
    from engine.hub.search import list_repo_files

    listing = list_repo_files(args.repo, args.revision, args.endpoint)
    for name in listing.unsafe_names:
        sys.stderr.write(f"glassbox: warning: skipping unsafe file name in the repository: {name!r}\n")
    if args.json:
        print_json(listing.to_dict())
        return 0
    out = sys.stdout
    commit = f" @ {listing.commit[:12]}" if listing.commit else ""
    title = f"{listing.repo} ({listing.revision}{commit}){'  [gated]' if listing.gated else ''}"
    out.write(printable(title) + "\n")
    if not listing.choices:
        hint = (
            "it has safetensors weights: download them and use `glassbox models convert`"
            if listing.has_safetensors
            else "nothing Glassbox can load"
        )
        out.write(f"no GGUF models in this repository; {hint}\n")
        return 0
    rows = [["FILE", "QUANT", "SIZE", "PARTS", "FIT", "MMPROJ"]]
    fit_of = fit_checker(paths)
    for choice in listing.choices:
        parts = str(len(choice.files)) if choice.complete else f"{len(choice.files)} (incomplete)"
        fit = fit_of(choice.total_size) if choice.total_size else None
        rows.append(
            [
                choice.name,
                choice.quant or "?",
                format_bytes(choice.total_size),
                parts,
                _FIT_LABELS[fit.verdict] if fit else "?",
                _projector_cell(choice),
            ]
        )
    _table(rows, out)
    out.write(
        "FIT is a rough estimate from the file size (the KV cache is not included); "
        "`glassbox models fit FILE` gives the exact figure after download.\n"
    )
    return 0


_FIT_LABELS = {"gpu": "GPU", "partial": "partial offload", "ram": "RAM", "no": "won't fit"}


# -------------------------------------------------------------------------------- download


class ProgressPrinter:
    """Download progress on stderr: a redrawn line on a terminal, else a line a second.

    Args:
        stream: where to write (stderr).
        tty: redraw in place; default: whether ``stream`` is a terminal.
    """

    def __init__(self, stream: TextIO, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.last_line = 0.0
        self.last_state = ""
        self.drawn = False

    def __call__(self, report: DownloadProgress) -> None:
        now = time.monotonic()
        changed = report.state != self.last_state
        interval = 0.1 if self.tty else 1.0
        if not changed and now - self.last_line < interval:
            return
        self.last_state = report.state
        self.last_line = now
        text = self.describe(report)
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            self.drawn = True
            if report.state == "done":
                self.stream.write("\n")
                self.drawn = False
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """Ends a redrawn line (before an error message, say)."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False

    @staticmethod
    def describe(report: DownloadProgress) -> str:
        """One line: state, file, percentage, bytes, speed, ETA and any message."""
        parts = [f"{report.state} {report.filename}"]
        if report.total:
            parts.append(
                f"{100 * report.done / report.total:5.1f}% "
                f"({format_bytes(report.done)} of {format_bytes(report.total)})"
            )
        elif report.done:
            parts.append(format_bytes(report.done))
        if report.state == "downloading" and report.speed_bps > 0:
            parts.append(format_speed(report.speed_bps))
            if report.eta_s is not None:
                parts.append(format_eta(report.eta_s))
        if report.attempt > 1:
            parts.append(f"attempt {report.attempt}")
        if report.message and report.state != "done":
            parts.append(report.message)
        return "  ".join(parts)


def _projector_cell(choice: ModelChoice) -> str:
    """The projector ``--with-mmproj`` fetches, and how many others the repository offers."""
    projector = choice.projector
    if projector is None:
        return ""
    others = len(choice.mmproj) - 1
    return projector.filename + (f" (of {others + 1})" if others else "")


def select_files(listing: RepoFiles, wanted: str, with_mmproj: bool) -> list[ModelFile]:
    """The files ``wanted`` names: one file, or every part of a split model; plus its mmproj (the
    one a load would pick: ``ModelChoice.projector``).

    Raises:
        DownloadError: not in the repository, or a split part is missing there.
    """

    single = listing.find(wanted)
    choice = next((c for c in listing.choices if c.name == wanted or (single and single in c.files)), None)
    if single is None and choice is None:
        if wanted in listing.unsafe_names:
            raise DownloadError(f"{wanted!r}: unsafe file name in the repository; refusing it")
        raise DownloadError(f"{wanted}: no such file in {listing.repo} (see `glassbox models files {listing.repo}`)")
    if single is not None and (single.split is None or choice is None):
        files = [single]
    else:
        assert choice is not None
        if not choice.complete:
            have = {f.split[0] for f in choice.files if f.split}
            total = choice.files[0].split[1] if choice.files[0].split else len(choice.files)
            missing = min(set(range(1, total + 1)) - have)
            raise DownloadError(f"{choice.name}: part {missing} of {total} is missing in {listing.repo}")
        files = list(choice.files)
    if with_mmproj and choice is not None and choice.projector is not None and choice.projector not in files:
        files.append(choice.projector)  # the one a load picks, not every type the repository offers
    return files


def _record_provenance(paths: Paths, result: DownloadResult) -> None:
    """Tells the model library where a download came from (repo, commit, sha256)."""
    # lazy: start-up (+25 ms)
    from engine.library import ModelLibrary

    try:
        library = ModelLibrary(paths.models, [], paths.models_manifest)
        library.record_provenance(
            result.path, repo=result.repo, revision=result.revision, sha256=result.sha256, source="huggingface"
        )
    except (EngineError, OSError, ValueError) as exc:
        # The model is downloaded and verified; only the label is missing. Say so, carry on.
        sys.stderr.write(f"glassbox: warning: could not record where {result.path.name} came from: {exc}\n")


def fit_checker(paths: Paths) -> Callable[[int], FitEstimate]:
    """A rough "will it fit" from a file size on this machine (before any byte is downloaded).

    The hardware is probed once; the memory bandwidth is taken only if measured before (``models
    fit`` caches it), never measured here.
    """

    hardware = probe_hardware()
    bandwidth = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        bandwidth = float(json.loads(paths.bandwidth_cache.read_text(encoding="utf-8"))["gbps"])
    return lambda size: estimate_fit_from_size(size, hardware, bandwidth)


def run_download(args: argparse.Namespace, paths: Paths) -> int:
    """``models download``."""
    # lazy: start-up (+75 ms)
    from engine.hub.model_download import FileJob, download_files, model_folder
    from engine.hub.partials import check_disk_space
    from engine.hub.search import check_filename, check_repo_id

    check_repo_id(args.repo)
    check_filename(args.file)
    # lazy: start-up (+16 ms)
    from engine.hub.search import list_repo_files

    listing = list_repo_files(args.repo, args.revision, args.endpoint)
    files = select_files(listing, args.file, args.with_mmproj)
    filenames = [f.filename for f in files]
    dest: Path = args.to.expanduser() if args.to else model_folder(paths.models, args.repo, filenames)
    dest.mkdir(parents=True, exist_ok=True)
    margin = 512 * 2**20
    check_disk_space(dest, sum(f.size for f in files) + margin, args.file)
    model_size = sum(f.size for f in files if not f.is_mmproj)
    if model_size and not args.force:
        fit = fit_checker(paths)(model_size)
        if fit.verdict == "no":
            raise DownloadError(f"{args.file}: {fit.message}; pass --force to download it anyway")
    printer = ProgressPrinter(sys.stderr)
    jobs = [FileJob(args.repo, f.filename, dest, args.revision, args.endpoint, f.sha256, f.size or None) for f in files]
    try:
        outcome = download_files(
            jobs,
            progress=lambda update: printer(update.file),
            on_file=lambda result: _record_provenance(paths, result),
            disk_margin_bytes=margin,
        )
    except KeyboardInterrupt:
        printer.finish()
        sys.stderr.write("glassbox: download interrupted; run the same command again to resume\n")
        return 130
    except BaseException:
        printer.finish()
        raise
    results = outcome.downloaded
    first = results[0]
    if args.json:
        document: dict[str, object] = {**first.to_dict(), "files": [r.to_dict() for r in results]}
        print_json(document)
    else:
        for r in results:
            sys.stdout.write(printable(f"{r.path}  sha256 {r.sha256}") + "\n")
    return 0
