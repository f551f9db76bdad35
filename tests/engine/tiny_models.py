"""Tiny models the tests write themselves: a llama GGUF (the ``gguf`` package) and a Hugging Face
Llama checkpoint folder (``transformers`` + ``tokenizers``), plus a generate-in-a-subprocess check.

The GGUF has dimensions that K-quants accept (rows of 256), a SentencePiece-style vocabulary with
the 256 byte tokens (so any text tokenizes), and small random weights (so generation is finite).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "that",
    "for",
    "it",
    "with",
    "as",
    "on",
    "be",
    "at",
    "by",
    "this",
    "had",
    "not",
    "are",
    "but",
    "from",
    "or",
    "have",
    "an",
    "they",
    "which",
    "one",
    "you",
    "were",
    "her",
    "all",
    "she",
    "there",
    "would",
    "their",
    "we",
    "him",
    "been",
    "has",
    "when",
    "who",
    "will",
    "more",
    "no",
    "if",
    "out",
    "so",
    "said",
    "what",
    "up",
    "its",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "river",
    "town",
    "water",
    "boat",
    "house",
]


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style tokens, scores and types: specials, 256 bytes, letters, whole words."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # UNKNOWN, CONTROL, CONTROL
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # BYTE
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += [chr(c) for c in range(ord("A"), ord("Z") + 1)] + list(".,;:!?'-\"()")
    pieces += ["\u2581" + w for w in _WORDS]
    tokens += pieces
    types += [1] * len(pieces)  # NORMAL
    scores = [0.0] * 259 + [float(len(p)) - 10.0 for p in pieces]
    return tokens, scores, types


def write_tiny_llama_gguf(
    path: Path,
    *,
    dtype: str = "F32",
    n_embd: int = 256,
    n_ff: int = 512,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 4,
    n_ctx: int = 512,
    seed: int = 0,
    split_max_tensors: int = 0,
    arch: str = "llama",
) -> Path:
    """Writes a random llama-architecture GGUF that llama.cpp loads, in F32, F16 or BF16.

    Args:
        path: where to write.
        dtype: ``"F32"``, ``"F16"`` (2-D weights) or ``"BF16"``; norms stay F32 as in real files.
        n_embd, n_ff, n_layer, n_head, n_head_kv, n_ctx: the shape.
        seed: weights are reproducible.
        split_max_tensors: write a split model (``<stem>-00001-of-0000N.gguf``, ...) instead.
        arch: the architecture name written (anything but ``llama`` makes llama.cpp refuse it).

    Returns:
        ``path``.
    """
    import gguf

    ftype = {"F32": 0, "F16": 1, "BF16": 32}[dtype]
    tokens, scores, types = tiny_vocab()
    n_vocab = len(tokens)
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)

    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    writer.add_name("glassbox-tiny-llama")
    writer.add_file_type(ftype)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    def weight(rows: int, cols: int) -> np.ndarray:
        w = rng.normal(0.0, 0.05, size=(rows, cols)).astype(np.float32)
        if dtype == "F16":
            return w.astype(np.float16)
        return w

    def add(name: str, array: np.ndarray) -> None:
        if dtype == "BF16" and array.ndim == 2:
            # bfloat16 = the top half of a float32, stored as raw uint16 words.
            raw = (array.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            writer.add_tensor(name, raw, raw_shape=array.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(name, array)

    ones = np.ones(n_embd, dtype=np.float32)
    add("token_embd.weight", weight(n_vocab, n_embd))
    for i in range(n_layer):
        add(f"blk.{i}.attn_norm.weight", ones)
        add(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
        add(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        add(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        add(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        add(f"blk.{i}.ffn_norm.weight", ones)
        add(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        add(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        add(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    add("output_norm.weight", ones)
    add("output.weight", weight(n_vocab, n_embd))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_LAYER_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


def tensor_names(n_layer: int) -> list[str]:
    """The tensors :func:`write_tiny_llama_gguf` writes for ``n_layer`` layers."""
    names = ["token_embd.weight", "output_norm.weight", "output.weight"]
    return names + [f"blk.{i}.{t}.weight" for i in range(n_layer) for t in _LAYER_TENSORS]


def tensor_count(n_layer: int) -> int:
    """How many tensors :func:`write_tiny_llama_gguf` writes for ``n_layer`` layers."""
    return len(tensor_names(n_layer))


_GENERATE = textwrap.dedent(
    """
    import json, sys
    from engine.cpu_backend import load_backends
    load_backends()  # the portable build's CPU code, as the worker loads it
    from llama_cpp import Llama
    llm = Llama(model_path=sys.argv[1], n_ctx=128, n_threads=1, verbose=False, seed=1)
    tokens = []
    for token in llm.generate(llm.tokenize(sys.argv[2].encode()), temp=0.0):
        tokens.append(token)
        if len(tokens) == int(sys.argv[3]):
            break
    text = llm.detokenize(tokens).decode("utf-8", "replace")
    print(json.dumps({"text": text, "tokens": len(tokens), "ids": tokens}))
    """
)


def generate_in_subprocess(model: Path, prompt: str = "the river", max_tokens: int = 5) -> dict[str, object]:
    """Loads ``model`` with llama-cpp-python in a fresh interpreter and generates greedily.

    A native abort kills only that interpreter; the test then fails with its stderr.
    """
    proc = subprocess.run(
        [sys.executable, "-c", _GENERATE, str(model), prompt, str(max_tokens)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"generation failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def write_tiny_hf_llama(folder: Path, *, hidden_size: int = 64, n_layer: int = 2, seed: int = 0) -> Path:
    """Saves a random ``LlamaForCausalLM`` as safetensors, with a byte-fallback BPE tokenizer.

    The tokenizer is built here with ``tokenizers`` (Llama-2 style: ``▁`` for spaces, byte
    fallback, no pre-tokenizer), which the converter maps to llama.cpp's SentencePiece vocab.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokens, _scores, _types = tiny_vocab()
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        # A left-to-right merge chain builds each "▁word" from its letters.
        current = "\u2581"
        for ch in word:
            nxt = current + ch
            if nxt not in vocab:
                vocab[nxt] = len(vocab)
            if (current, ch) not in merges:
                merges.append((current, ch))
            current = nxt
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_prefix_space=None
    )
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


def cached_tiny_hf_llama(cache: Path, scratch: Path) -> Path:
    """:func:`write_tiny_hf_llama`, written once per machine under ``cache`` (importing torch is
    the slow part); ``scratch`` is an empty folder to build it in."""
    import os
    import shutil

    cached = cache / "tiny-hf-llama-v1"
    if not (cached / "model.safetensors").is_file():
        fresh = write_tiny_hf_llama(scratch / "tiny-llama")
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = cached.with_name(f"{cached.name}.tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(fresh, staging)
        shutil.rmtree(cached, ignore_errors=True)
        os.replace(staging, cached)
    return cached
