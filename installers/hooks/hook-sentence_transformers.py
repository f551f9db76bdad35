"""PyInstaller hook for sentence-transformers and the parts of transformers it loads lazily.

``transformers`` resolves most of its names on first attribute access (``_LazyModule``) and picks
the model and tokenizer modules from the model's ``config.json`` (``model_type``), so static
analysis sees little of it. Collected here: every transformers module outside ``models/``, the
``auto`` machinery, the whole BERT family (all-MiniLM-L6-v2, the starter embedder, is a BERT), and
the configuration and tokenizer modules of every architecture (the HF-to-GGUF converter asks
``AutoTokenizer`` for the tokenizer of whatever model it converts). The modeling code of the other
architectures (the bulk of transformers) stays out: the app never runs a transformers model other
than the embedder.
"""

from PyInstaller.utils.hooks import collect_data_files, collect_submodules, copy_metadata

_FULL_MODELS = {"auto", "bert"}
_LIGHT_PREFIXES = ("configuration_", "tokenization_")


def _wanted(name: str) -> bool:
    parts = name.split(".")
    if parts[:2] == ["transformers", "models"] and len(parts) >= 3:
        if parts[2] in _FULL_MODELS or len(parts) == 3:
            return True
        return parts[3].startswith(_LIGHT_PREFIXES)
    # Training-only and tooling trees the app never imports.
    return not name.startswith(("transformers.commands", "transformers.cli", "transformers.kernels"))


hiddenimports = collect_submodules("sentence_transformers")
hiddenimports += collect_submodules("transformers", filter=_wanted)
datas = collect_data_files("sentence_transformers", excludes=["**/*.pyi"])
datas += copy_metadata("sentence_transformers")
