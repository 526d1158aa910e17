"""Shape checks run before any tool starts: llmcompressor group sizes and llama.cpp block sizes, from headers only."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.core.errors import ShapeRefused
from pipelines.core.ggufheader import MIN_QUANTIZED_SHARE
from pipelines.core.vocab import GROUPED_PRESETS, gguf_type

# ---------------------------------------------------------------- what the source's weights look like


@dataclass(frozen=True)
class Weight:
    """One 2-D weight of the source: its name, its row length (input features) and its parameters."""

    name: str
    columns: int
    params: int


def source_weights(tensors: dict[str, dict[str, Any]]) -> list[Weight]:
    """Every 2-D `.weight` of a Safetensors header map (tensor name → {"shape", "dtype"}), by name.

    `columns` is the last dimension: the input features of a Linear (what llmcompressor's group size must
    divide) and the row length ne0 of the tensor once converted to GGUF (what llama.cpp's block size must divide).
    """
    out = []
    for name, info in tensors.items():
        shape = info.get("shape") or []
        if name.endswith(".weight") and len(shape) == 2:
            out.append(Weight(name, int(shape[-1]), math.prod(shape)))
    return sorted(out, key=lambda w: w.name)


# ---------------------------------------------------------------- llmcompressor: group sizes

# compressed-tensors presets whose weights are quantized per group, and their group size (pipelines/core/vocab.PRESETS).
GROUPED_SCHEMES = GROUPED_PRESETS
# Group sizes that runtimes (vLLM's Marlin / Machete kernels) take: what a refusal lists as "would work".
KERNEL_GROUP_SIZES = (256, 128, 64, 32, 16)


def indivisible(linears: list[Weight], group_size: int) -> list[Weight]:
    """The layers a group size cannot take: columns at least the group size and not a multiple of it.

    The same rule as llmcompressor's validate_group_size_divisibility (modifiers/quantization/
    group_size_validation.py), which raises on these layers inside oneshot, after the model was loaded.
    """
    return [w for w in linears if w.columns >= group_size and w.columns % group_size != 0]


@dataclass(frozen=True)
class GroupSizeChoice:
    """The group size a grouped scheme will use for this model, and why."""

    variant: str
    scheme: str
    group_size: int
    allowed: list[int]
    """The recipe's group sizes in order of preference; the first is the scheme's own."""
    rejected: dict[int, list[str]] = field(default_factory=dict)
    """Each preferred group size that was passed over → the layers (with their columns) it cannot divide."""

    @property
    def fell_back(self) -> bool:
        return self.group_size != self.allowed[0]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fell_back": self.fell_back}


def choose_group_size(variant: str, scheme: str, linears: list[Weight], allowed: list[int]) -> GroupSizeChoice | None:
    """The first of `allowed` that divides every targeted layer; None for a scheme without groups.

    Raises:
        ShapeRefused: no allowed group size divides every targeted layer (the message names the layers and the
            group sizes that would work).
    """
    if scheme not in GROUPED_SCHEMES:
        return None
    rejected: dict[int, list[str]] = {}
    for gs in allowed:
        bad = indivisible(linears, gs)
        if not bad:
            return GroupSizeChoice(variant, scheme, gs, list(allowed), rejected)
        rejected[gs] = [f"{w.name.removesuffix('.weight')} ({w.columns} columns)" for w in bad]
    works = [gs for gs in KERNEL_GROUP_SIZES if not indivisible(linears, gs)]
    layers = rejected[allowed[0]]
    shown = ", ".join(layers[:6]) + (f" and {len(layers) - 6} more" if len(layers) > 6 else "")
    if works:
        divide = "group sizes that divide every layer: " + ", ".join(map(str, works))
        hint = (f"set group_sizes: [{works[0]}] (or a list holding one of {works}) under variants.{variant} in "
                "registry/catalog.yaml")
    else:
        divide = f"none of {list(KERNEL_GROUP_SIZES)} divides them"
        hint = (f"add those layers to variants.{variant}.ignore in registry/catalog.yaml, or build fp8 / w8a8 "
                "(per-channel scales, no group constraint)")
    raise ShapeRefused(
        variant,
        f"{scheme} with group size {', '.join(map(str, allowed))} cannot quantize {len(layers)} layer(s) of this "
        f"model, whose column counts are not multiples of it: {shown} ({divide})",
        layers=layers, works=[str(w) for w in works], hint=hint,
    )


# ---------------------------------------------------------------- llama.cpp: block sizes

_QK = 32
"""The smallest block of any quantized type: a row that is not a multiple of it is stored as F16 whatever asked."""
# Each file type's block size and what llama-quantize stores instead when a row is not a multiple of it: its row in
# pipelines/core/vocab.GGUF_TYPES (ggml's type traits and tensor_type_fallback in src/llama-quant.cpp).
_UNKNOWN = 256, "Q4_0"
"""A name outside the table (the catalog refuses those before a build): a k-quant's block and its usual fallback."""


def block_size(qtype: str) -> int:
    row = gguf_type(qtype)
    return row.block if row else _UNKNOWN[0]


def fallback_type(qtype: str) -> str:
    row = gguf_type(qtype)
    return row.fallback if row else _UNKNOWN[1]


@dataclass(frozen=True)
class BlockFallback:
    """The tensors llama-quantize will not store in the asked type's block size, predicted from the source."""

    qtype: str
    block: int
    tensors: int
    params: int
    fallback: list[dict[str, Any]]
    """Each tensor it will store in another type: name, columns, parameters, the type it falls back to."""

    @property
    def fallback_params(self) -> int:
        return sum(t["params"] for t in self.fallback)

    @property
    def share(self) -> float:
        """Share of the quantized weights' parameters that will not get the asked type's blocks."""
        return self.fallback_params / self.params if self.params else 0.0

    @property
    def f16_share(self) -> float:
        """Share left unquantized (rows not even a multiple of 32)."""
        return sum(t["params"] for t in self.fallback if t["to"] == "F16") / self.params if self.params else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "qtype": self.qtype, "block": self.block, "tensors": self.tensors, "fallback_tensors": len(self.fallback),
            "fallback_params": self.fallback_params, "params": self.params, "share": round(self.share, 6),
            "f16_share": round(self.f16_share, 6), "fallback": self.fallback,
        }


def gguf_fallback(qtype: str, weights: list[Weight]) -> BlockFallback:
    """Which 2-D weights llama-quantize will store in another type than `qtype`'s, and their share.

    Raises:
        ShapeRefused: so many parameters would stay f16 (rows not a multiple of 32) that the output would fail
            check_gguf's quantized-share check anyway.
    """
    block = block_size(qtype)
    fallback = []
    for w in weights:
        if w.columns % block:
            to = fallback_type(qtype) if w.columns % _QK == 0 else "F16"
            fallback.append({"name": w.name, "columns": w.columns, "params": w.params, "to": to})
    result = BlockFallback(qtype.lower(), block, len(weights), sum(w.params for w in weights), fallback)
    if result.f16_share > 1 - MIN_QUANTIZED_SHARE:
        f16 = [f"{t['name']} ({t['columns']} columns)" for t in fallback if t["to"] == "F16"]
        raise ShapeRefused(
            qtype.lower(),
            f"{result.f16_share:.0%} of the weights have rows that are not multiples of {_QK}: llama-quantize would "
            f"leave them f16 ({', '.join(f16[:6])}{' …' if len(f16) > 6 else ''}), and the output would not count "
            "as quantized",
            layers=f16, works=[],
            hint="no llama.cpp type takes rows of that length; this model cannot be served as a quantized GGUF",
        )
    return result


def observed_fallback(qtype: str, tensors: list[tuple[str, tuple[int, ...], str]], log: str = "") -> dict[str, Any]:
    """What llama-quantize did: the 2-D tensors of its output (name, GGUF shape with ne0 first, ggml type name)
    stored in a type with smaller blocks than `qtype`'s (or not quantized), and the count its log reports.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block = block_size(qtype)
    total = fallback = 0
    names = []
    for name, shape, type_name in tensors:
        if len(shape) < 2 or not name.endswith(".weight"):
            continue
        n = math.prod(shape)
        total += n
        t_block = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
        if type_name in ("F32", "F16", "BF16") or t_block < block:
            fallback += n
            names.append(f"{name}:{type_name}")
    m = re.search(r"(\d+) of (\d+) tensor\(s\) required fallback quantization", log)
    return {
        "fallback_params": fallback, "params": total, "share": round(fallback / total, 6) if total else 0.0,
        "tensors": sorted(names), "log_fallback_tensors": int(m.group(1)) if m else 0,
    }
