"""The compressed-tensors format (llmcompressor, for vLLM): recipes, build, checkpoint check, evaluation."""
