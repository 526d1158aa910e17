"""What a compressed-tensors checkpoint must hold: the on-disk format of each scheme, checked against its source and recipe."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.compressed.recipes import RECIPE_FILE, Recipe
from pipelines.core.errors import (
    ArtifactError,
    ConfigError,
)
from pipelines.core.fsutil import (
    sha256_file,
)
from pipelines.core.report import StructureRecord
from pipelines.core.safetensorsheader import safetensors_files, source_tensors
from pipelines.core.sourcefiles import CHAT_TEMPLATE_FILES, GENERATION_CONFIG, TOKENIZER_FILES

# Copied byte for byte from the source: transformers 5 rewrites tokenizers and generation configs it re-saves.
VERBATIM_FILES = (*TOKENIZER_FILES, *CHAT_TEMPLATE_FILES, GENERATION_CONFIG, "LICENSE", "LICENSE.txt", "LICENSE.md")


METADATA_FILES = ("tokenizer_config.json", *CHAT_TEMPLATE_FILES, GENERATION_CONFIG)
"""What a metadata-only upstream change may touch in a checkpoint (the chat template and the generation config):
files copied from the source that llmcompressor does not read to make the weights."""


def with_new_metadata(donor: Path, source_dir: Path, out: Path) -> list[str]:
    """Copy checkpoint `donor` to `out` (atomically) with its METADATA_FILES taken from `source_dir` (one the source
    no longer has is left out); every other file, the Safetensors among them, stays byte for byte. Returns the
    metadata files the copy holds.

    Raises:
        ArtifactError: the copy does not read back as a checkpoint.
    """
    import shutil

    from pipelines.core.fsutil import atomic_output

    with atomic_output(out, check=check_checkpoint) as tmp:
        shutil.copytree(donor, tmp)
        for name in METADATA_FILES:
            (tmp / name).unlink(missing_ok=True)
            if (source_dir / name).is_file():
                shutil.copyfile(source_dir / name, tmp / name)
                (tmp / name).chmod(0o644)
        return sorted(n for n in METADATA_FILES if (tmp / n).is_file())


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


def check_structure(out_dir: Path, source_dir: Path, recipe: Recipe) -> StructureRecord:
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
    problems = _config_problems(out_dir, fmt, recipe)
    try:
        out_t = source_tensors(out_dir)
        src_t = source_tensors(source_dir)
    except ArtifactError as err:
        raise ArtifactError(f"{out_dir}: {err.message}") from err
    targets = targeted_linears(src_t, recipe.ignore)
    problems += _tensor_problems(out_t, src_t, targets, fmt, recipe)
    problems += _file_problems(out_dir, source_dir)
    if problems:
        shown = "; ".join(problems[:12]) + (f"; … {len(problems) - 12} more" if len(problems) > 12 else "")
        raise ArtifactError(f"{out_dir.name} does not match its {recipe.scheme} recipe: {shown}")
    dtypes: dict[str, int] = {}
    for info in out_t.values():
        dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + 1
    return StructureRecord(
        format=fmt.format,
        scheme=recipe.scheme,
        quantized_linears=len(targets),
        ignored=recipe.ignore,
        lm_head="tied to the embeddings" if not any(n.startswith("lm_head.") for n in out_t) else "unquantized",
        tensor_dtypes=dict(sorted(dtypes.items())),
        shards=[p.name for p in safetensors_files(out_dir)],
    )


def _config_problems(out_dir: Path, fmt: SchemeFormat, recipe: Recipe) -> list[str]:
    """What config.json's quantization_config says that the recipe's scheme does not."""
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
    return problems


def _tensor_problems(out_t: dict[str, dict[str, Any]], src_t: dict[str, dict[str, Any]], targets: list[str],
                     fmt: SchemeFormat, recipe: Recipe) -> list[str]:
    """Targeted Linears carry the scheme's tensors in the source's shape; every other source tensor is unchanged."""
    problems: list[str] = []
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
    # lm_head (and anything else ignored) must not carry quantization tensors
    for name in sorted(set(out_t) - expected_names - set(src_t)):
        module = name.rsplit(".", 1)[0]
        if _ignored(module, recipe.ignore):
            problems.append(f"{name}: {module} is in the recipe's ignore list but was quantized")
        else:
            problems.append(f"unexpected tensor {name}")
    return problems


def _file_problems(out_dir: Path, source_dir: Path) -> list[str]:
    """The tokenizer, generation config and licence are the source's bytes; our recipe is saved."""
    problems = []
    for name in VERBATIM_FILES:
        src = source_dir / name
        if src.is_file() and (not (out_dir / name).is_file() or sha256_file(out_dir / name) != sha256_file(src)):
            problems.append(f"{name} is not the source's file byte for byte")
    if not (out_dir / RECIPE_FILE).is_file():
        problems.append(f"{RECIPE_FILE} is missing")
    return problems


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
    source_tensors(d)


