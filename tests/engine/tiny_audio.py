"""A tiny random-weight audio model, made the way a published one is converted: Qwen2-Audio (a
Whisper-style encoder and a Qwen 2 language model).

The recipe of :mod:`tests.engine.tiny_vision` for audio: a ``transformers``
``Qwen2AudioForConditionalGeneration`` with a tiny Qwen 2 text model (hidden 64, two layers) and a
tiny audio encoder (128 mel bins, three layers of width 32: the converter's tensor map numbers the
two input convolutions as blocks, so it needs at least three), a tokenizer that holds the audio
markers (``<|audio_bos|>``, ``<|audio_eos|>``, ``<|AUDIO|>``) as control tokens, and llama.cpp's
converter from the sdist run twice on the one checkpoint (the language model, then ``--mmproj``:
the Whisper encoder as a ``qwen2a`` projector). llama.cpp reads a clip in 30-second windows of 750
tokens each. The two GGUFs (about 1 MB) land side by side, named as the Hub names them, cached in
the test cache under a hash of everything they are made from.

Run as a script (``python tiny_audio.py BUILD.json``) it is the child that builds the model.
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

NAME = "qwen2-audio"
WINDOW_TOKENS = 750
"""The tokens llama.cpp's Qwen2-Audio projector makes of each 30-second window of a clip."""
_AUDIO_SPECIALS = ("<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>")


def _family() -> Any:
    base = FAMILIES["qwen2.5"]
    return dataclasses.replace(base, name=NAME, specials=(*base.specials, *_AUDIO_SPECIALS))


def _key(sdist: Path) -> str:
    import tokenizers
    import transformers

    digest = hashlib.sha256()
    digest.update(json.dumps(dataclasses.asdict(_family()), sort_keys=True).encode())
    digest.update(_CORPUS.encode())
    for part in (_train_tokenizer, _spread_weights, _child, _convert):
        digest.update(inspect.getsource(part).encode())
    digest.update(f"{WINDOW_TOKENS}".encode())
    digest.update(sdist.resolve().name.encode())
    digest.update(f"{transformers.__version__} {tokenizers.__version__}".encode())
    return digest.hexdigest()[:16]


def tiny_audio_gguf(sdist: Path, cache: Path) -> tuple[Path, Path]:
    """The tiny audio model and its projector, built on first use into ``cache`` (then reused).

    Returns:
        ``(model, mmproj)``, side by side in one folder.

    Raises:
        RuntimeError: the build failed (with the child's last output).
    """
    return tiny_pair(Path(__file__).resolve(), "tiny-audio", NAME, _key(sdist), sdist, cache)


def _child(build: dict[str, Any]) -> None:
    import torch
    import transformers

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
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "eos_token": family.eos,
        "pad_token": family.pad,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config_json, indent=1), encoding="utf-8")
    (folder / "preprocessor_config.json").write_text(
        json.dumps({"feature_size": 128, "sampling_rate": 16000, "feature_extractor_type": "WhisperFeatureExtractor"}),
        encoding="utf-8",
    )
    text = transformers.Qwen2Config(
        vocab_size=n_vocab,
        eos_token_id=tok.token_to_id(family.eos),
        pad_token_id=tok.token_to_id(family.pad),
        **family.hparams,
    )
    audio = transformers.Qwen2AudioEncoderConfig(
        num_mel_bins=128,
        encoder_layers=3,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        d_model=32,
        max_source_positions=1500,
    )
    config = transformers.Qwen2AudioConfig(
        audio_config=audio, text_config=text, audio_token_index=tok.token_to_id("<|AUDIO|>")
    )
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    torch.manual_seed(family.seed)
    model = transformers.Qwen2AudioForConditionalGeneration(config)
    _spread_weights(model, family.seed)
    model.save_pretrained(folder, safe_serialization=True)
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
