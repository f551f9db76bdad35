"""Model conversion in killable children: quantization, safetensors to GGUF, perplexity."""
