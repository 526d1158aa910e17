"""The files of a Hugging Face model repository that are not weights, by what they are: one list for every step that
fetches, copies or classifies them (fetch's allow-list, the checkpoint's verbatim copies, upstream's change kinds)."""

from __future__ import annotations

TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
)
"""The tokenizer as transformers saves it (fast and slow), by exact name; tiktoken vocabularies are `*.tiktoken`."""

CHAT_TEMPLATE_FILES: tuple[str, ...] = ("chat_template.jinja", "chat_template.json")
"""The chat template in a file of its own (newer repos); older ones keep it in tokenizer_config.json."""

GENERATION_CONFIG = "generation_config.json"
