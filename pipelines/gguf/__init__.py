"""The GGUF format (llama.cpp): build f16 and k-quants, validate with llama-perplexity, read GGUF headers."""
