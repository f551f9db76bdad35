"""LoRA adapters made in the test: a GGUF adapter written to a base model's shapes with the
``gguf`` package (what ``convert_lora_to_gguf.py`` writes: ``general.type = adapter``,
``adapter.type = lora``, ``adapter.lora.alpha``, a ``.lora_a``/``.lora_b`` pair per tensor), and a
PEFT adapter folder (``adapter_config.json`` and ``adapter_model.safetensors``, named as peft
saves them) for llama.cpp's converter.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.gguf_tensors import read_tensor_shapes


def write_gguf_lora(
    out: Path,
    base: Path,
    *,
    targets: Sequence[str] = ("attn_q", "attn_v"),
    rank: int = 4,
    alpha: float = 8.0,
    strength: float = 0.5,
    seed: int = 0,
    architecture: str | None = None,
    shape_of: dict[str, tuple[int, int]] | None = None,
    base_model: str | None = None,
) -> Path:
    """An adapter for every ``blk.N.<target>.weight`` of ``base``, random, written with ``gguf``.

    ``architecture`` overrides the base's (a mismatched adapter); ``shape_of`` overrides a
    target's (n_in, n_out) (a wrong shape). ``base_model`` (``owner/name``) is written as the
    converter writes its model card's ``base_model`` (``general.base_model.0.repo_url``).
    """
    import gguf

    info, shapes = read_tensor_shapes(base)
    arch = architecture or info.architecture
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    writer.add_name(f"test lora for {base.name}")
    if base_model is not None:
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, base_model.split("/")[-1])
        writer.add_base_model_repo_url(0, f"https://huggingface.co/{base_model}")
    rng = np.random.default_rng(seed)
    for shape in shapes:
        parts = shape.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in targets or parts[3] != "weight":
            continue
        n_in, n_out = (shape_of or {}).get(parts[2], (shape.dims[0], shape.dims[1]))
        a = (rng.standard_normal((rank, n_in)) * strength / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * strength).astype(np.float32)
        writer.add_tensor(f"{shape.name}.lora_a", a)
        writer.add_tensor(f"{shape.name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_peft_adapter(
    folder: Path,
    base_config: Path,
    *,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    rank: int = 4,
    alpha: int = 8,
    strength: float = 0.5,
    seed: int = 0,
) -> Path:
    """A PEFT LoRA folder for the Hugging Face model whose ``config.json`` is in ``base_config``
    (a Llama-style model: ``model.layers.N.self_attn.<target>``), as ``peft.save_pretrained`` names
    its files and tensors."""
    from safetensors.numpy import save_file

    config = json.loads((base_config / "config.json").read_text(encoding="utf-8"))
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    outs = {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim, "o_proj": hidden}
    ins = {"q_proj": hidden, "k_proj": hidden, "v_proj": hidden, "o_proj": heads * head_dim}
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for target in targets:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, ins[target])) * strength).astype(
                np.float32
            )
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((outs[target], rank)) * strength).astype(
                np.float32
            )
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(targets),
        "base_model_name_or_path": str(base_config),
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2), encoding="utf-8")
    return folder
