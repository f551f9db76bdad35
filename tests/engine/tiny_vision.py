"""A tiny random-weight vision model, made the way a published one is converted: Gemma 3 with its
SigLIP vision tower and projector.

The same recipe as :mod:`tests.engine.tiny_arch` (its tokenizer trainer, its weight spread, the
sdist's ``convert_hf_to_gguf.py``, offline in a child interpreter), extended for ``--mmproj``: a
``transformers`` ``Gemma3ForConditionalGeneration`` with a tiny text model (hidden 64, two layers)
and a tiny vision tower (64 × 64 images in 8 × 8 patches, hidden 32, two layers, pooled by 2: 16
image tokens), a tokenizer that holds Gemma 3's image markers (``<start_of_image>``,
``<end_of_image>``, ``<image_soft_token>``) as control tokens, and a ``preprocessor_config.json``
(the image mean, std and 16 image tokens). The converter runs twice on the one checkpoint: once
for the language model, once with ``--mmproj`` for the projector. The two GGUFs land in one folder
named as the Hub names them (``gemma3-vision-F32.gguf`` and ``mmproj-gemma3-vision-F32.gguf``),
together about 0.75 MB, cached in the test cache under a hash of everything they are made from.

transformers 5 saves Gemma 3's vision tower as ``vision_tower.*``; published checkpoints (and the
converter's tensor map) spell it ``vision_tower.vision_model.*``, so the child renames those
tensors in the saved safetensors, as the published checkpoints have them.

Run as a script (``python tiny_vision.py BUILD.json``) it is the child that builds the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.engine.tiny_arch import _CORPUS, FAMILIES, _spread_weights, _train_tokenizer, tiny_pair

NAME = "gemma3-vision"
IMAGE_SIZE = 64
PATCH_SIZE = 8
IMAGE_TOKENS = 16
"""The image tokens the projector makes of any image (64 / 8 = 8 patches a side, pooled by 2)."""
_IMAGE_SPECIALS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")


def _family() -> Any:
    base = FAMILIES["gemma3"]
    return dataclasses.replace(base, name=NAME, specials=(*base.specials, *_IMAGE_SPECIALS))


def _key(sdist: Path) -> str:
    import tokenizers
    import transformers

    digest = hashlib.sha256()
    digest.update(json.dumps(dataclasses.asdict(_family()), sort_keys=True).encode())
    digest.update(_CORPUS.encode())
    for part in (_train_tokenizer, _spread_weights, _child, _convert):
        digest.update(inspect.getsource(part).encode())
    digest.update(f"{IMAGE_SIZE} {PATCH_SIZE} {IMAGE_TOKENS}".encode())
    digest.update(sdist.resolve().name.encode())
    digest.update(f"{transformers.__version__} {tokenizers.__version__}".encode())
    return digest.hexdigest()[:16]


def tiny_vision_gguf(sdist: Path, cache: Path) -> tuple[Path, Path]:
    """The tiny vision model and its projector, built on first use into ``cache`` (then reused).

    Returns:
        ``(model, mmproj)``, side by side in one folder.

    Raises:
        RuntimeError: the build failed (with the child's last output).
    """
    return tiny_pair(Path(__file__).resolve(), "tiny-vision", NAME, _key(sdist), sdist, cache)


def _child(build: dict[str, Any]) -> None:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    family = _family()
    sdist = Path(build["sdist"])
    folder = Path(build["folder"])
    folder.mkdir(parents=True)
    template = (sdist / "models" / "templates" / family.template).read_text(encoding="utf-8")
    tok = _train_tokenizer(family, template)
    tok.save(str(folder / "tokenizer.json"))
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    config_json = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        **{f"{role}_token": getattr(family, role) for role in ("bos", "eos", "pad", "unk")},
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config_json, indent=1), encoding="utf-8")
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Gemma3ImageProcessor",
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "image_seq_length": IMAGE_TOKENS,
                "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
            }
        ),
        encoding="utf-8",
    )
    text = transformers.Gemma3TextConfig(
        vocab_size=n_vocab,
        bos_token_id=tok.token_to_id(family.bos),
        eos_token_id=[tok.token_to_id(family.eos), *(tok.token_to_id(t) for t in family.eos_extra)],
        pad_token_id=tok.token_to_id(family.pad),
        **family.hparams,
    )
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        vision_use_head=False,
    )
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=IMAGE_TOKENS,
        boi_token_index=tok.token_to_id("<start_of_image>"),
        eoi_token_index=tok.token_to_id("<end_of_image>"),
        image_token_index=tok.token_to_id("<image_soft_token>"),
        tie_word_embeddings=False,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(family.seed)
    model = transformers.Gemma3ForConditionalGeneration(config)
    _spread_weights(model, family.seed)
    model.save_pretrained(folder, safe_serialization=True)
    # The published checkpoints' (and the converter's) names for the vision tower.
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    renamed = {
        ("vision_tower.vision_model." + k.removeprefix("vision_tower.") if k.startswith("vision_tower.") else k): v
        for k, v in tensors.items()
    }
    save_file(renamed, str(weights), metadata={"format": "pt"})
    out = Path(build["out"])
    out.mkdir()
    _convert(sdist, folder, out / f"{NAME}-F32.gguf", family.pre, mmproj=False)
    _convert(sdist, folder, out / f"mmproj-{NAME}-F32.gguf", family.pre, mmproj=True)


def _convert(sdist: Path, folder: Path, out: Path, pre: str, *, mmproj: bool) -> None:
    """llama.cpp's converter from the sdist, in a child of its own (it keeps module state)."""
    argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--outfile", str(out), *(["--mmproj"] if mmproj else [])]
    converter = str(sdist / "convert_hf_to_gguf.py")
    script = (
        "import sys, importlib.util\n"
        f"sys.path.insert(0, {str(sdist)!r}); sys.path.insert(1, {str(sdist / 'gguf-py')!r})\n"
        f"spec = importlib.util.spec_from_file_location('convert_hf_to_gguf', {converter!r})\n"
        "tool = importlib.util.module_from_spec(spec); spec.loader.exec_module(tool)\n"
        "import conversion.base\n"
        f"conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}\n"
        f"sys.argv = {[*argv, str(folder)]!r}\n"
        "tool.main()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=600)


if __name__ == "__main__":
    _child(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")))
