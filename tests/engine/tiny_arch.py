"""Tiny random-weight GGUFs of real architectures, made the way a published model is converted.

Each :class:`Family` is a Hugging Face checkpoint built here: a ``transformers`` config of the real
architecture with tiny sizes (hidden 64, two layers), random weights saved as safetensors, a BPE
tokenizer trained here (``tokenizers``: byte-level, or SentencePiece-shaped with byte fallback)
whose vocabulary holds the chat template's control tokens as single tokens, and a chat template
published in llama.cpp's sources (the sdist's ``models/templates``) set in ``tokenizer_config.json``.
llama.cpp's own converter from the same sdist (``convert_hf_to_gguf.py`` with ``conversion/`` and
``gguf-py/``) turns it into a GGUF, offline, in a child interpreter.

llama.cpp's converter recognises a BPE pre-tokenizer by hashing the tokens of a test string; a
tokenizer trained here matches none of the published ones, so the child tells the converter which
of llama.cpp's pre-tokenizers the family uses (the one its published model has) instead of letting
it refuse.

The families (:data:`FAMILIES`): Qwen 2.5, Qwen 3 and Qwen 3.5 (a Gated DeltaNet hybrid), Llama 3.1,
Mistral Nemo, gpt-oss (harmony), DeepSeek (R1-Distill-Qwen, V3.1 and V3.2 templates), Gemma 3 (with
Gemma 2's published template), Gemma 4 (a SentencePiece-shaped tokenizer, as its converter wants),
Mamba (recurrent) and Granite 4 hybrid (a Mamba-2 layer and an attention layer). Each GGUF is 0.6
to 0.9 MB (F32).

A model is built once per machine: it is cached in the test cache under a hash of everything it is
made from (the family's row, the corpus and the builder's code, the sdist's version, the
``transformers`` and ``tokenizers`` versions), so ``make test`` converts each family once (15 to
20 s each on two cores) and later runs load the cached file. The build is deterministic: the same
inputs give the same bytes.

Run as a script (``python tiny_arch.py BUILD.json``) it is the child that builds one model.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Text the tokenizers are trained on: chat-like English, JSON and code punctuation, digits.
_CORPUS = """
The river runs past the old town, and the boat is tied to the house by the water.
What is the weather in Paris today? It is sunny and warm, about 21 degrees.
Please add two numbers: 2 and 3. The sum is 5. Let me check the result for you.
You are a helpful assistant. Answer the question of the user, and call a tool when it helps.
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "add", "arguments": {"a": 2, "b": 3}}
{"type": "function", "function": {"name": "add", "description": "Adds two numbers", "parameters": {}}}
{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
def main(argv):\n    return 0\n\nif __name__ == "__main__":\n    main([])
Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n
Environment: ipython\nTools: brave_search, wolfram_alpha\n
the of and to in is was that for it with as on be at by this had not are but from or have an they
which one you were her all she there would their we him been has when who will more no if out so
said what up its about into than them can only other new some could time these two may then do
first any my now such like our over man me even most made after also did many before must through
0 1 2 3 4 5 6 7 8 9 10 11 12 24 42 100 2024 3.14 -1 true false null
( ) [ ] { } < > : ; , . ! ? ' " ` ~ @ # $ % ^ & * - + = / \\ | _
"""


@dataclass(frozen=True)
class Family:
    """One architecture with its published template and the tokenizer shape its model has.

    Attributes:
        name: the family's name in the tests (and the cached file's).
        architecture: the ``transformers`` class (``architectures`` in config.json).
        config: the ``transformers`` config class name.
        hparams: the config's fields (tiny sizes).
        template: the file in the sdist's ``models/templates``.
        pre: llama.cpp's pre-tokenizer name for this family's published tokenizer.
        specials: control tokens (added, special: CONTROL in the GGUF).
        added: other added tokens (not special: USER_DEFINED in the GGUF).
        bos, eos, pad, unk: the tokenizer's special token roles.
        add_bos: the tokenizer puts BOS first.
        vocab_size: the trained vocabulary's size before the added tokens.
        pad_vocab: round the model's vocabulary up to a multiple of this (Mamba's converter does).
        eos_extra: extra end-of-generation tokens (``eos_token_id`` becomes a list).
        seed: the weights' and the tokenizer's seed.
        published: config.json fields written as the published model spells them, where this
            ``transformers`` writes them otherwise (the converter reads the published spelling).
        convert_args: extra arguments of ``convert_hf_to_gguf.py``.
        tokenizer: ``byte-level`` (GPT-2 style BPE) or ``sentencepiece`` (``▁`` for spaces, byte
            fallback: the shape of Gemma's and Llama 2's tokenizer.json).
    """

    name: str
    architecture: str
    config: str
    hparams: dict[str, Any]
    template: str
    pre: str
    specials: tuple[str, ...]
    added: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    unk: str | None = None
    add_bos: bool = False
    vocab_size: int = 640
    pad_vocab: int = 1
    eos_extra: tuple[str, ...] = ()
    seed: int = 0
    published: dict[str, Any] = field(default_factory=dict)
    convert_args: tuple[str, ...] = ()
    tokenizer: str = "byte-level"

    @property
    def tokens_in_template(self) -> tuple[str, ...]:
        """Every token the test expects to be one token: the specials and the added ones."""
        return (*self.specials, *self.added)


_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "max_position_embeddings": 4096}
_ATTN = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}

_QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_DEEPSEEK_SPECIALS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)

_DEEPSEEK_V3 = {
    **_SMALL,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "head_dim": 16,
    "tie_word_embeddings": False,
}

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            name="qwen2.5",
            architecture="Qwen2ForCausalLM",
            config="Qwen2Config",
            hparams={**_SMALL, **_ATTN, "tie_word_embeddings": False},
            template="Qwen-Qwen2.5-7B-Instruct.jinja",
            pre="qwen2",
            specials=_QWEN_SPECIALS,
            added=("<tool_call>", "</tool_call>"),
            eos="<|im_end|>",
            pad="<|endoftext|>",
        ),
        Family(
            name="qwen3",
            architecture="Qwen3ForCausalLM",
            config="Qwen3Config",
            hparams={**_SMALL, **_ATTN, "tie_word_embeddings": False},
            template="Qwen-Qwen3-0.6B.jinja",
            pre="qwen2",
            specials=_QWEN_SPECIALS,
            added=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
            eos="<|im_end|>",
            pad="<|endoftext|>",
        ),
        Family(
            # A hybrid: Gated DeltaNet (recurrent) layers and attention, with XML tool calls.
            name="qwen3.5",
            architecture="Qwen3_5ForCausalLM",
            config="Qwen3_5TextConfig",
            hparams={
                **_SMALL,
                **_ATTN,
                "layer_types": ["linear_attention", "full_attention"],
                "linear_conv_kernel_dim": 4,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5,
                    "mrope_section": [2, 1, 1],
                    "mrope_interleaved": True,
                },
                "tie_word_embeddings": False,
            },
            template="Qwen3.5-4B.jinja",
            pre="qwen35",
            convert_args=("--no-mtp",),  # the published model has a multi-token-prediction layer; this one not
            specials=_QWEN_SPECIALS,
            added=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
            eos="<|im_end|>",
            pad="<|endoftext|>",
        ),
        Family(
            name="llama3",
            architecture="LlamaForCausalLM",
            config="LlamaConfig",
            hparams={**_SMALL, **_ATTN, "tie_word_embeddings": False},
            template="meta-llama-Llama-3.1-8B-Instruct.jinja",
            pre="llama-bpe",
            specials=(
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
                "<|finetune_right_pad_id|>",
            ),
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
            add_bos=True,
            eos_extra=("<|end_of_text|>", "<|eom_id|>"),
        ),
        Family(
            name="mistral-nemo",
            architecture="MistralForCausalLM",
            config="MistralConfig",
            hparams={**_SMALL, **_ATTN, "sliding_window": None, "tie_word_embeddings": False},
            template="mistralai-Mistral-Nemo-Instruct-2407.jinja",
            pre="tekken",
            specials=(
                "<unk>",
                "<s>",
                "</s>",
                "[INST]",
                "[/INST]",
                "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]",
                "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]",
                "[TOOL_CALLS]",
            ),
            bos="<s>",
            eos="</s>",
            unk="<unk>",
            add_bos=True,
        ),
        Family(
            name="gpt-oss",
            architecture="GptOssForCausalLM",
            config="GptOssConfig",
            hparams={
                **_SMALL,
                **_ATTN,
                "intermediate_size": 64,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "sliding_window": 32,
                "layer_types": ["sliding_attention", "full_attention"],
                "tie_word_embeddings": False,
            },
            template="openai-gpt-oss-120b.jinja",
            pre="gpt-4o",
            specials=(
                "<|startoftext|>",
                "<|endoftext|>",
                "<|return|>",
                "<|constrain|>",
                "<|channel|>",
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|call|>",
            ),
            bos="<|startoftext|>",
            eos="<|return|>",
            pad="<|endoftext|>",
            eos_extra=("<|call|>", "<|endoftext|>"),
        ),
        Family(
            name="deepseek-r1-distill-qwen",
            architecture="Qwen2ForCausalLM",
            config="Qwen2Config",
            hparams={**_SMALL, **_ATTN, "tie_word_embeddings": False},
            template="deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            pre="deepseek-r1-qwen",
            specials=_DEEPSEEK_SPECIALS,
            added=("<think>", "</think>"),
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
            add_bos=True,
        ),
        Family(
            name="deepseek-v3",
            architecture="DeepseekV3ForCausalLM",
            config="DeepseekV3Config",
            hparams=_DEEPSEEK_V3,
            template="deepseek-ai-DeepSeek-V3.1.jinja",
            pre="deepseek-v3",
            specials=_DEEPSEEK_SPECIALS,
            added=("<think>", "</think>"),
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
            add_bos=True,
        ),
        Family(
            # DeepSeek V3.2's template on the V3 architecture: the sdist's converter writes no
            # expert gating function for V3.2's own (deepseek32), which llama.cpp then refuses.
            name="deepseek-v3.2",
            architecture="DeepseekV3ForCausalLM",
            config="DeepseekV3Config",
            hparams=_DEEPSEEK_V3,
            template="deepseek-ai-DeepSeek-V3.2.jinja",
            pre="deepseek-v3",
            specials=_DEEPSEEK_SPECIALS,
            added=("<think>", "</think>"),
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
            add_bos=True,
        ),
        Family(
            name="gemma3",
            architecture="Gemma3ForCausalLM",
            config="Gemma3TextConfig",
            hparams={
                **_SMALL,
                **_ATTN,
                "query_pre_attn_scalar": 16,
                "sliding_window": 32,
                "layer_types": ["sliding_attention", "full_attention"],
                "tie_word_embeddings": False,
            },
            # Gemma 3's published template is Gemma 2's with the system prompt folded into the
            # first user turn; the sdist keeps Gemma 2's.
            template="google-gemma-2-2b-it.jinja",
            pre="default",
            specials=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
            bos="<bos>",
            eos="<eos>",
            pad="<pad>",
            unk="<unk>",
            add_bos=True,
            eos_extra=("<end_of_turn>",),
        ),
        Family(
            name="gemma4",
            architecture="Gemma4ForCausalLM",
            config="Gemma4TextConfig",
            hparams={
                **_SMALL,
                **_ATTN,
                "sliding_window": 32,
                "layer_types": ["sliding_attention", "full_attention"],
                "per_layer_config": {"1": {"head_dim": 32}},
                "hidden_size_per_layer_input": 0,
                "num_kv_shared_layers": 0,
                "tie_word_embeddings": False,
            },
            template="google-gemma-4-31B-it.jinja",
            pre="default",
            tokenizer="sentencepiece",
            specials=(
                "<pad>",
                "<eos>",
                "<bos>",
                "<unk>",
                "<|turn>",
                "<turn|>",
                "<|channel>",
                "<channel|>",
                "<|tool>",
                "<tool|>",
                "<|tool_call>",
                "<tool_call|>",
                "<|tool_response>",
                "<tool_response|>",
                '<|"|>',
                "<|think|>",
            ),
            bos="<bos>",
            eos="<eos>",
            pad="<pad>",
            unk="<unk>",
            add_bos=True,
            eos_extra=("<turn|>",),
        ),
        Family(
            name="mamba",
            architecture="MambaForCausalLM",
            config="MambaConfig",
            hparams={
                "hidden_size": 64,
                "intermediate_size": 128,
                "state_size": 16,
                "num_hidden_layers": 2,
                "conv_kernel": 4,
                "time_step_rank": 4,
                "tie_word_embeddings": False,
            },
            template="Qwen-Qwen2.5-7B-Instruct.jinja",
            pre="gpt-2",
            specials=_QWEN_SPECIALS,
            added=("<tool_call>", "</tool_call>"),
            eos="<|im_end|>",
            pad="<|endoftext|>",
            pad_vocab=8,
        ),
        Family(
            name="granite4-hybrid",
            architecture="GraniteMoeHybridForCausalLM",
            config="GraniteMoeHybridConfig",
            hparams={
                **_SMALL,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "layer_types": ["mamba", "attention"],
                "mamba_n_heads": 8,
                "mamba_d_head": 16,
                "mamba_d_state": 16,
                "mamba_n_groups": 1,
                "mamba_expand": 2,
                "num_local_experts": 0,
                "num_experts_per_tok": 0,
                "shared_intermediate_size": 128,
                "tie_word_embeddings": False,
            },
            template="ibm-granite-granite-4.0.jinja",
            pre="gpt-4o",
            specials=("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"),
            added=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
            eos="<|end_of_text|>",
            pad="<|end_of_text|>",
            pad_vocab=8,  # the Mamba-2 converter pads the vocabulary, not the embeddings
            published={"layer_types": ["mamba", "attention"]},
        ),
    )
}


# --------------------------------------------------------------------------- the parent side


def _key(family: Family, sdist: Path) -> str:
    import tokenizers
    import transformers

    digest = hashlib.sha256()
    digest.update(json.dumps(asdict(family), sort_keys=True).encode())
    # What makes the model: the corpus and the child's code (not the family table's other rows).
    digest.update(_CORPUS.encode())
    builder = _train_sentencepiece_bpe if family.tokenizer == "sentencepiece" else _train_tokenizer
    for part in (builder, _spread_weights, _child):
        digest.update(inspect.getsource(part).encode())
    digest.update(sdist.resolve().name.encode())  # the llama-cpp-python version it was unpacked from
    digest.update(f"{transformers.__version__} {tokenizers.__version__}".encode())
    return digest.hexdigest()[:16]


def tiny_gguf(family: Family | str, sdist: Path, cache: Path) -> Path:
    """The family's tiny GGUF, built on first use into ``cache`` (then reused).

    Args:
        family: a :class:`Family` or its name in :data:`FAMILIES`.
        sdist: the unpacked llama.cpp sources (the ``llama_cpp_source`` fixture).
        cache: the test cache folder.

    Raises:
        RuntimeError: the build failed (with the child's last output).
    """
    spec = FAMILIES[family] if isinstance(family, str) else family
    target = cache / "tiny-arch" / f"{spec.name}-{_key(spec, sdist)}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"tiny-{spec.name}-", dir=target.parent) as scratch:
        work = Path(scratch)
        out = work / "model.gguf"
        build = {"family": asdict(spec), "sdist": str(sdist), "folder": str(work / "hf"), "out": str(out)}
        run_builder(Path(__file__), build, work, [out], spec.name)
        os.replace(out, target)
    return target


def run_builder(script: Path, build: dict[str, Any], work: Path, outputs: Sequence[Path], name: str) -> None:
    """Runs ``script``'s child side on ``build`` (written to ``work/build.json``) in a fresh
    interpreter, offline.

    Raises:
        RuntimeError: the child failed or left one of ``outputs`` unwritten (with its last output).
    """
    (work / "build.json").write_text(json.dumps(build), encoding="utf-8")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("NO_LOCAL_GGUF", None)
    proc = subprocess.run(
        [sys.executable, str(script), str(work / "build.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    if proc.returncode != 0 or not all(path.is_file() for path in outputs):
        raise RuntimeError(f"building the tiny {name} model failed: {(proc.stdout + proc.stderr)[-3000:]}")


def tiny_pair(script: Path, kind: str, name: str, key: str, sdist: Path, cache: Path) -> tuple[Path, Path]:
    """A tiny model and its projector (``script``'s child side builds both), built on first use
    into ``cache/kind/key`` (then reused): ``(model, mmproj)``, side by side in one folder.

    Raises:
        RuntimeError: the build failed (with the child's last output).
    """
    folder = cache / kind / key
    model, mmproj = folder / f"{name}-F32.gguf", folder / f"mmproj-{name}-F32.gguf"
    if model.is_file() and mmproj.is_file():
        return model, mmproj
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"tiny-{name}-", dir=folder.parent) as scratch:
        work = Path(scratch)
        out = work / "out"
        build = {"sdist": str(sdist), "folder": str(work / "hf"), "out": str(out)}
        run_builder(script, build, work, [out / model.name, out / mmproj.name], name)
        if not folder.exists():  # else a build beside this one finished first, with the same bytes
            os.replace(out, folder)
    return model, mmproj


# --------------------------------------------------------------------------- the child side


def _train_tokenizer(family: Family, template: str) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=family.vocab_size,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in family.specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The template's own text is in the corpus too, so its plain words merge into few tokens.
    lines = [*_CORPUS.splitlines(), *template.splitlines()]
    tok.train_from_iterator(lines * 4, trainer)
    if family.added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added])
    if family.add_bos and family.bos is not None:
        bos_id = tok.token_to_id(family.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B", special_tokens=[(family.bos, bos_id)]
        )
    return tok


def _train_sentencepiece_bpe(family: Family, template: str) -> Any:
    """A SentencePiece-shaped BPE: spaces as ``▁``, no pre-tokenizer, the 256 ``<0xNN>`` byte tokens
    after the control tokens (byte fallback), a ``Replace, ByteFallback, Fuse`` decoder."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors, trainers

    lines = [*_CORPUS.splitlines(), *template.splitlines()]
    draft = Tokenizer(models.BPE())
    draft.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=family.vocab_size, show_progress=False)
    draft.train_from_iterator(lines * 4, trainer)
    trained = json.loads(draft.to_str())["model"]
    pieces = sorted(trained["vocab"], key=trained["vocab"].__getitem__)
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    order = [*family.specials, *bytes_, *(p for p in pieces if p not in family.specials)]
    vocab = {piece: i for i, piece in enumerate(order)}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=family.unk, byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.specials])
    if family.added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added])
    if family.add_bos and family.bos is not None:
        bos_id = tok.token_to_id(family.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B", special_tokens=[(family.bos, bos_id)]
        )
    return tok


def _spread_weights(model: Any, seed: int) -> None:
    """Redraws every matrix with a variance that keeps activations of order one through the
    layers (1 / fan-in) and the embeddings at 0.5: the default initialisation (0.02) gives a random
    model whose logits are nearly flat, so its greedy reply is one token repeated; these give
    varied replies with clear winners, which is what the decoding tests need."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim < 2:
                continue
            std = 0.5 if "embed" in name else param.shape[-1] ** -0.5
            param.copy_(torch.randn(param.shape, generator=generator) * std)


def _child(build: dict[str, Any]) -> None:
    import torch
    import transformers

    family = Family(**{k: tuple(v) if isinstance(v, list) else v for k, v in build["family"].items()})
    sdist = Path(build["sdist"])
    folder = Path(build["folder"])
    folder.mkdir(parents=True)
    template = (sdist / "models" / "templates" / family.template).read_text(encoding="utf-8")

    train = _train_sentencepiece_bpe if family.tokenizer == "sentencepiece" else _train_tokenizer
    tok = train(family, template)
    tok.save(str(folder / "tokenizer.json"))
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    n_model = -(-n_vocab // family.pad_vocab) * family.pad_vocab
    ids = {
        role: tok.token_to_id(name) if (name := getattr(family, role)) else None
        for role in ("bos", "eos", "pad", "unk")
    }
    config_json: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "add_bos_token": family.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    for role in ("bos", "eos", "pad", "unk"):
        value = getattr(family, role)
        config_json[f"{role}_token"] = value
    # The template's control tokens are special tokens (CONTROL in the GGUF), whatever the format.
    config_json["extra_special_tokens"] = list(family.specials)
    (folder / "tokenizer_config.json").write_text(json.dumps(config_json, indent=1), encoding="utf-8")

    torch.manual_seed(family.seed)
    config_class = getattr(transformers, family.config)
    hparams = dict(family.hparams)
    config = config_class(
        vocab_size=n_model,
        bos_token_id=ids["bos"],
        eos_token_id=[ids["eos"], *(tok.token_to_id(t) for t in family.eos_extra)] if family.eos_extra else ids["eos"],
        pad_token_id=ids["pad"],
        **hparams,
    )
    config.architectures = [family.architecture]
    model_class = getattr(transformers, family.architecture)
    model = model_class(config)
    _spread_weights(model, family.seed)
    model.save_pretrained(folder, safe_serialization=True)
    if family.published:
        saved = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        (folder / "config.json").write_text(json.dumps({**saved, **family.published}, indent=1), encoding="utf-8")

    # llama.cpp's converter, from the sdist, told this tokenizer's pre-tokenizer.
    sys.path.insert(0, str(sdist))
    sys.path.insert(1, str(sdist / "gguf-py"))
    import importlib.util

    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", sdist / "convert_hf_to_gguf.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    import conversion.base

    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: family.pre  # type: ignore[method-assign]
    sys.argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--outfile", build["out"], *family.convert_args]
    sys.argv.append(str(folder))
    tool.main()


if __name__ == "__main__":
    _child(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")))
