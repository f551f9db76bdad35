"""PyInstaller hook for chromadb (the vector store behind rag.store).

Chroma picks its implementation classes from strings in ``chromadb.config`` (the Rust-backed API,
the segment manager, telemetry) and imports them with ``importlib``, so static analysis misses
them: collect the package's submodules, minus its tests, its FastAPI server and its CLI, which the
app never runs. The embedding functions Chroma ships import their backends (onnxruntime, openai,
...) only when used; the app embeds with sentence-transformers itself, so those stay out
(see ``EXCLUDES`` in glassbox.spec).
"""

from PyInstaller.utils.hooks import collect_data_files, collect_submodules, copy_metadata

_SKIP = ("chromadb.test", "chromadb.server", "chromadb.cli", "chromadb.experimental")


def _wanted(name: str) -> bool:
    return not name.startswith(_SKIP)


hiddenimports = collect_submodules("chromadb", filter=_wanted)
hiddenimports += ["chromadb_rust_bindings"]
datas = collect_data_files("chromadb", excludes=["**/test/**", "**/*.pyi"])
# chromadb reads its own version, and opentelemetry finds its providers by entry points.
datas += copy_metadata("chromadb")
