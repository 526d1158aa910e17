"""The llmcompressor wrapper: quantize and evaluate, each a job run in the llmcompressor toolchain's own venv."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines import PACKAGE
from pipelines.compressed.checkpoint import VERBATIM_FILES, check_checkpoint
from pipelines.compressed.recipes import RECIPE_FILE, Recipe
from pipelines.core.errors import (
    ConfigError,
    DiskFullError,
    ToolError,
    UnsupportedModel,
)
from pipelines.core.fsutil import (
    atomic_output,
    is_full,
    write_text_atomic,
)
from pipelines.core.report import Figures
from pipelines.core.runner import ToolRun, run
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    tree_files,
)
from pipelines.core.texts import EVAL_TEXT, bundled_text
from pipelines.core.toolchains import LlmCompressor

SCRIPTS = PACKAGE / "scripts"
QUANTIZE_SCRIPT = SCRIPTS / "llmc_quantize.py"
EVALUATE_SCRIPT = SCRIPTS / "llmc_evaluate.py"
COMPRESSED_EVAL_CTX = 256
COMPRESSED_EVAL_CHUNKS = 8

_OOM_HINT = (
    "the model is held in CPU RAM and onloaded to the accelerator one decoder layer at a time (llmcompressor's "
    "sequential pipeline); lower calibration.num_samples or max_seq_length of this variant in "
    "registry/catalog.yaml, or run on a machine with more memory (containers/llmcompressor on a GPU node)"
)


def quantize(
    source_dir: Path,
    out: Path,
    recipe: Recipe,
    tc: LlmCompressor,
    *,
    settings: Settings,
    trust_remote_code: bool = False,
    log_path: Path | None = None,
) -> tuple[dict[str, Any], ToolRun]:
    """Run llmcompressor on `source_dir` with `recipe`; the checkpoint appears at `out` only when complete.

    Returns the script's result (device, timings, versions, calibration used) and the tool run.

    Raises:
        ConfigError: the calibration text is too small for the recipe's samples x sequence length.
        UnsupportedModel: AWQ has no mappings for the model's architecture.
        ToolError: llmcompressor failed; out of memory says so and how to fix it.
    """
    env = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(settings.effective_threads)}
    hf: dict[str, Any] = {}
    cal = recipe.calibration
    if cal is None or cal.hub_dataset is None:
        env["HF_HUB_OFFLINE"] = "1"  # nothing to download: a local model and the bundled text
    else:
        if settings.hf_endpoint:
            env["HF_ENDPOINT"] = settings.hf_endpoint
        if settings.hf_token:
            env["HF_TOKEN"] = settings.hf_token
        hf["cache_dir"] = str(settings.home / "datasets")
    # the job's scratch sits beside the output, named like a partial output: a killed run's is cleaned up
    with atomic_output(out, check=check_checkpoint) as tmp, \
            tempfile.TemporaryDirectory(prefix=f"{out.name}.partial-job-", dir=out.parent) as work:
        result_path = Path(work) / "result.json"
        job = {
            "source": str(source_dir),
            "output": str(tmp),
            "result": str(result_path),
            "modifiers": [m.model_dump(mode="json") for m in recipe.modifiers],
            "calibration": None
            if cal is None
            else {
                "text_path": str(bundled_text(cal.bundled)),
                "text_name": cal.bundled,
                "num_samples": cal.num_samples,
                "max_seq_length": cal.max_seq_length,
                "hub_dataset": cal.hub_dataset.model_dump() if cal.hub_dataset else None,
            },
            "hf": hf,
            "copy_files": list(VERBATIM_FILES),
            "trust_remote_code": trust_remote_code,
        }
        job_path = Path(work) / "job.json"
        job_path.write_text(json.dumps(job, indent=2))
        argv = [tc.python, QUANTIZE_SCRIPT, job_path]
        tool = run(argv, env=env, check=False, output=tmp)
        if log_path is not None:
            write_text_atomic(log_path, tool.stderr)
        if tool.returncode != 0:
            _raise_for_failure(tool, result_path, recipe, source_dir, out)
        result = json.loads(result_path.read_text())
        (tmp / RECIPE_FILE).write_text(recipe.to_yaml(), encoding="utf-8")
        for p in tree_files(tmp):
            p.chmod(0o644)  # transformers writes weights 0600; an artifact is for others to read
    return result, tool


def _raise_for_failure(
    tool: ToolRun, result_path: Path, recipe: Recipe, source_dir: Path, out: Path | None = None
) -> None:
    """Turn a failed llmc_quantize.py run into the error that says what to change."""
    tail = "\n".join((tool.stderr or tool.stdout).rstrip().splitlines()[-25:])
    known: dict[str, Any] = {}
    with contextlib.suppress(FileNotFoundError, ValueError):
        known = json.loads(result_path.read_text()).get("error") or {}
    kind, message = known.get("kind"), known.get("message", "")
    where = f"variants.{recipe.variant} of this entry in registry/catalog.yaml"
    if "No space left on device" in tool.stderr or (out is not None and is_full(out.parent)):
        raise DiskFullError(str((out or result_path).parent), "\n".join(tail.splitlines()[-3:]))
    if kind == "calibration_too_small":
        raise ConfigError(
            f"calibration set too small for {recipe.variant}: {message}",
            hint=f"lower calibration.num_samples or calibration.max_seq_length of {where}, "
            "or name a pinned calibration.hub_dataset for a production run",
        )
    if kind == "no_awq_mappings":
        raise UnsupportedModel(
            f"{source_dir.name}: {message}",
            hint="build fp8 or gptq for this model instead (neither needs mappings), or drop awq from its variants",
        )
    # -9: SIGKILL, what the kernel's OOM killer sends; 137 when it went through a shell
    if kind == "oom" or tool.returncode in (-9, 137):
        raise ToolError(
            tool.argv,
            tool.returncode,
            message or tail,
            hint=f"out of memory while compressing {recipe.variant}: {_OOM_HINT}",
        )
    raise ToolError(tool.argv, tool.returncode, tail, hint="the full llmcompressor log is beside the output (<variant>.log)")


def evaluate(
    source_dir: Path,
    variants: dict[str, Path],
    tc: LlmCompressor,
    *,
    settings: Settings,
    ctx: int = COMPRESSED_EVAL_CTX,
    chunks: int = COMPRESSED_EVAL_CHUNKS,
    text: Path | None = None,
    sample: bool = True,
) -> dict[str, Any]:
    """Measure `variants` (name → checkpoint) against `source_dir` on CPU in one process.

    Returns the script's JSON: per variant mean_kl, kl_p99, top1_agreement, ppl_source, ppl, ppl_ratio.

    Raises:
        ToolError: the evaluation failed (a checkpoint that does not load, out of memory).
    """
    text = text or bundled_text(EVAL_TEXT)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eval.partial-", dir=settings.work_dir) as work:
        out = Path(work) / "eval.json"
        argv: list[Any] = [tc.python, EVALUATE_SCRIPT, "--source", source_dir, "--text", text, "--ctx", str(ctx),
                           "--max-chunks", str(chunks), "--out", out]
        if not sample:
            argv.append("--no-sample")
        argv += [f"{name}={path}" for name, path in variants.items()]
        env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "OMP_NUM_THREADS": str(settings.effective_threads)}
        tool = run(argv, env=env, hint="a checkpoint that does not load is broken: rebuild it", output=out)
        result = json.loads(out.read_text())
    result["wall_s"] = round(tool.wall_s, 3)
    result["peak_rss_bytes"] = tool.peak_rss_bytes
    return result


def figures_of(metrics: Mapping[str, Any]) -> Figures:
    """The evaluation script's figures for one variant as every format's figures."""
    return Figures.of(mean_kl=metrics["mean_kl"], kl_p99=metrics.get("kl_p99"),
                      same_top_pct=round(100.0 * metrics["top1_agreement"], 4), ppl_reference=metrics["ppl_source"],
                      ppl=metrics["ppl"], tokens=metrics.get("tokens"))


