"""modelmint: turn pinned Hugging Face Safetensors into validated, versioned, deployable artifacts."""

__version__ = "0.1.0"
