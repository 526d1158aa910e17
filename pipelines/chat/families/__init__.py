"""Chat families: each detects its Hugging Face chat template and writes the Ollama Go TEMPLATE that renders alike.

One small entry per family. `detect` looks at the Jinja source; `build` writes the Go template (and
may read constants such as a default system prompt out of the Jinja source); `stop` are the strings
that end a turn. The proof that a TEMPLATE renders what the Jinja renders lives in
`pipelines.chat.proof` and in tests/test_ollama_templates.py.

Conventions every TEMPLATE here follows, because Ollama works this way:
- The begin-of-sequence token is left out when the engine adds it (GGUF `tokenizer.ggml.add_bos_token`);
  Ollama's runner tokenizes the prompt with special tokens added, so writing it would double it.
- A conversation that ends with a user or tool message gets the generation prompt (transformers'
  `add_generation_prompt=True`); one that ends with an assistant message is left open for the model
  to continue it (transformers' `continue_final_message=True`).

Layout: core.py holds the machinery (ChatFamily, TemplateTokens, the registry, detection, refusal), helpers.py
what the families share to read Jinja and write Go (golit, _fill, _jinja_*, _LOOP_HEAD), blocks.py the Go TEMPLATE
skeletons and snippets several template lineages build from; each other module holds the families of one template
lineage and registers them on import. They are imported here in FAMILY_MODULES order, which is the registration
order: the order of FAMILIES, of every listing and of docs/ollama-families.md.
"""

from __future__ import annotations

from importlib import import_module

from pipelines.chat.families import core
from pipelines.chat.families.core import *  # noqa: F403 (the machinery, re-exported: core.__all__)
from pipelines.chat.families.helpers import golit

FAMILY_MODULES = ("chatml", "granite", "chatml_tools", "role_tokens", "tagged", "llama", "gemma", "mistral", "phi",
                  "rendered", "glimmer", "command_r", "harmony", "xtml", "dsml", "kimi", "minimax", "seed", "apriel",
                  "hunyuan", "minicpm", "reka", "gigachat", "apertus", "functionary", "nemotron_nano2")
"""The family modules, in registration order."""

for _module in FAMILY_MODULES:
    import_module(f"{__name__}.{_module}")

__all__ = [*core.__all__, "FAMILY_MODULES", "golit"]
