"""vLLM publishing for compressed-tensors variants: the portable serve config and the model card beside the checkpoint."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipelines.compressed.serve import SERVE_CONFIG_FILE, VllmServeConfig, serve_config_for
from pipelines.core.errors import ConfigError
from pipelines.core.fsutil import write_text_atomic
from pipelines.core.report import CompressedReport, answer_lines, card_front, card_validation
from pipelines.core.texts import EVAL_RECORD, data_lines
from pipelines.core.weights import is_weight_file, weights_line
from pipelines.source.catalog import CatalogEntry
from pipelines.source.wheelsource import origin_lines

CARD_FILE = "README.md"


def serve_command(model_dir: Path | str) -> list[str]:
    """How a registered compressed-tensors artifact is served, wherever it was placed."""
    return ["vllm", "serve", str(model_dir), "--config", f"{model_dir}/{SERVE_CONFIG_FILE}"]


def publish_vllm(checkpoint: Path, out_dir: Path, report: CompressedReport, entry: CatalogEntry, served_name: str) -> list[Path]:
    """Write the portable vLLM serve config and the model card of a validated checkpoint into `out_dir`.

    `checkpoint` is the compressed-tensors directory (its config.json sizes the context). Raises
    ConfigError when the checkpoint already holds a file of either name (it would be overwritten).
    """
    for name in (SERVE_CONFIG_FILE, CARD_FILE):
        if (checkpoint / name).exists():
            raise ConfigError(f"{checkpoint} already holds {name}", hint="the publish step writes it: rebuild the variant")
    config = serve_config_for(checkpoint, served_name, portable=True)
    serve_path, card_path = out_dir / SERVE_CONFIG_FILE, out_dir / CARD_FILE
    write_text_atomic(serve_path, config.to_yaml())
    weights = sorted((p.name, p.stat().st_size) for p in checkpoint.iterdir() if p.is_file() and is_weight_file(p.name))
    write_text_atomic(card_path, model_card(config, report, entry, weights=weights))
    return [serve_path, card_path]


def model_card(config: VllmServeConfig, report: CompressedReport, entry: CatalogEntry | None,
               weights: list[tuple[str, int]] | None = None) -> str:
    """README.md with Hugging Face front matter for a compressed-tensors checkpoint served by vLLM; `weights`: its
    safetensors files' names and sizes (their total is the card's `weights_bytes`; None: not stated)."""
    from pipelines import __version__

    source = report.source or {}
    repo, revision = source.get("repo"), source.get("revision")
    variant, scheme = report.variant, report.scheme
    ignore = report.ignored
    group = report.preflight or {}
    grouping = ""
    if group.get("group_size"):
        grouping = f" Weights are quantized in groups of {group['group_size']}" + (
            f" (the scheme's own {group['allowed'][0]} does not divide every layer of this model)."
            if group.get("fell_back") else "."
        )
    validation = card_validation(report)
    front = card_front(repo, entry.license if entry else None, "transformers")
    front.update({
        "pipeline_tag": "text-generation",
        "tags": [t for t in ("compressed-tensors", "vllm", "modelmint", variant, (scheme or "").lower()) if t],
        "model_name": entry.name if entry else None,
        "quantization": {"format": report.format, "scheme": scheme, "ignore": ignore,
                         **({"group_size": group["group_size"]} if group.get("group_size") else {})},
        "validation": validation,
        "modelmint": {
            "version": __version__,
            "source": {k: v for k, v in source.items() if k in ("kind", "repo", "revision", "content_sha256", "origin")
                       and v},
            "tree_sha256": report.tree_sha256,
            **({"weights_bytes": sum(size for _, size in weights)} if weights else {}),
            **({"shards": [name for name, _ in weights]} if weights and len(weights) > 1 else {}),
            "toolchain": report.toolchain or {},
            "calibration": report.calibration,
            "evaluation": {k: v for k, v in (report.evaluation or {}).items() if k in EVAL_RECORD} or None,
        },
    })
    head = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, width=100)
    rows = "\n".join(f"| {k} | {v} |" for k, v in validation.items() if not isinstance(v, dict | list))
    origin = f"Quantized from [{repo}](https://huggingface.co/{repo}) at commit `{revision}` " if repo else "Quantized "
    return f"""---
{head}---

# {config.served_model_name} ({scheme}, compressed-tensors)

{origin}with llmcompressor by modelmint {__version__}; the recipe is `modelmint-recipe.yaml`.{grouping}
{weights_line(weights, "safetensors") + chr(10) if weights else ""}{origin_lines(source.get("origin"))}
## Serve with vLLM

```sh
vllm serve ./ --config ./{SERVE_CONFIG_FILE}
```

`{SERVE_CONFIG_FILE}` names the model `{config.served_model_name}` and caps the context at {config.max_model_len}
tokens; run it from this directory, or pass the directory's path instead of `./`.

## Validation against the source

Next-token distributions of this checkpoint and the source on modelmint's bundled evaluation text (CPU).
{data_lines(report)}

| figure | value |
| --- | --- |
{rows}
{answer_lines(report)}"""
