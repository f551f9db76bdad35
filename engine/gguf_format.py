"""The GGUF format's vocabulary: value types, ggml tensor types, file types and architectures.

Owns the tables the header parser (:mod:`engine.gguf`) and the fit estimator check a file against:
the GGUF value types (id, size, ``struct`` format), the ggml tensor types of the pinned llama.cpp
(block size and bytes), llama.cpp's ``general.file_type`` names, and the architectures the pinned
llama.cpp can load. Tables only; nothing here reads a file.
"""

from __future__ import annotations

__all__ = [
    "FILE_TYPE_GUESSED",
    "FILE_TYPE_NAMES",
    "FLOAT_TYPES",
    "GGML_TYPES",
    "GGUF_MAGIC",
    "LLAMA_CPP_ARCHITECTURES",
    "NOT_CHAT_ARCHITECTURES",
    "SUPPORTED_VERSIONS",
    "T_ARRAY",
    "T_BOOL",
    "T_STRING",
    "T_UINT32",
    "VALUE_TYPES",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)

# GGUF value types: id -> (name, fixed size in bytes, struct format) ; strings and arrays are 0.
VALUE_TYPES: dict[int, tuple[str, int, str]] = {
    0: ("UINT8", 1, "<B"),
    1: ("INT8", 1, "<b"),
    2: ("UINT16", 2, "<H"),
    3: ("INT16", 2, "<h"),
    4: ("UINT32", 4, "<I"),
    5: ("INT32", 4, "<i"),
    6: ("FLOAT32", 4, "<f"),
    7: ("BOOL", 1, "<B"),
    8: ("STRING", 0, ""),
    9: ("ARRAY", 0, ""),
    10: ("UINT64", 8, "<Q"),
    11: ("INT64", 8, "<q"),
    12: ("FLOAT64", 8, "<d"),
}
T_UINT32, T_BOOL, T_STRING, T_ARRAY = 4, 7, 8, 9
FLOAT_TYPES = (6, 12)

# ggml tensor types (ggml.h of the pinned llama.cpp): id -> (name, elements per block, bytes per block).
# Ids that ggml removed (4, 5, 31-33, 36-38) are absent, so a file using them is rejected.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}

# llama.cpp's LLAMA_FTYPE_MOSTLY_* names, as stored in general.file_type.
FILE_TYPE_NAMES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    4: "Q4_1_SOME_F16",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}
FILE_TYPE_GUESSED = 1024

# Architectures the pinned llama.cpp (llama-cpp-python 0.3.36, src/llama-arch.cpp) can load.
# Update with the pin; a file outside this set gets "model needs a newer engine".
_ARCHITECTURE_NAMES = """
    afmoe apertus arcee arctic arwkv7 baichuan bailingmoe bailingmoe2 bailingmoe3 bert bitnet bloom
    chameleon chatglm clip codeshell cogvlm cohere2 cohere2moe command-r dbrx deci deepseek deepseek2
    deepseek2-ocr deepseek32 deepseek4 dflash dots1 dots3note dream eagle3 ernie4_5 ernie4_5-moe
    eurobert exaone exaone-moe exaone4 falcon falcon-h1 gemma gemma-embedding gemma2 gemma3 gemma3n
    gemma4 gemma4-assistant glm-dsa glm4 glm4moe glm5-next gpt-oss gpt2 gptj gptneox granite granite_swa
    granitehybrid granitemoe graniteswitch grok grovemoe hrm_text hunyuan-dense hunyuan-moe hunyuan_vl
    hy_v3 hy_v4 internlm2 jais jais2 jamba jina-bert-v2 jina-bert-v3 kimi-k3 kimi-linear laguna lfm2
    lfm2moe llada llada-moe llama llama-embed llama4 maincoder mamba mamba2 maple mellum mimo2 minicpm
    minicpm3 minimax-01 minimax-m2 minimax-m3 mistral3 mistral4 modern-bert mpt muse-glimmer nanbeige
    nemotron nemotron_h nemotron_h_moe neo-bert nomic-bert nomic-bert-moe olmo olmo2 olmoe openelm orion
    paddleocr pangu-embedded phi2 phi3 phimoe plamo plamo2 plamo3 plm pockettts qwen qwen2 qwen2moe
    qwen2vl qwen3 qwen35 qwen35moe qwen3moe qwen3next qwen3tts qwen3vl qwen3vlmoe qwen4exp refact rnd1
    rwkv6 rwkv6qwen2 rwkv7 seed_oss smallthinker smollm3 spark2_5 stablelm starcoder starcoder2 step35
    t5 t5encoder talkie wavtokenizer-dec xverse
"""
LLAMA_CPP_ARCHITECTURES = frozenset(_ARCHITECTURE_NAMES.split())
NOT_CHAT_ARCHITECTURES = {"clip": "a vision projector (mmproj) that goes with a chat model"}
