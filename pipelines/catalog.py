"""The catalog: what to build, validated once at the edge (unknown keys are errors, commits are pinned)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipelines.errors import CatalogEntryNotFound, ConfigError

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

# llama-quantize's type names (tools/quantize/quantize.cpp in the pinned tree), written lower-case in the
# catalog as users of Ollama tags and Hugging Face GGUF repos know them (qwen2.5:q4_k_m).
GGUF_QUANT_TYPES = frozenset(
    t.lower()
    for t in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0"]
)
# i-quants below 4 bits are unusable without an importance matrix; llama-quantize refuses them.
IMATRIX_REQUIRED = frozenset({"iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "q2_k_s"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HubSource(_Strict):
    """A Hugging Face Hub repo at a pinned commit: the source of truth."""

    repo: str
    revision: str | None = Field(
        description="40-hex commit; null means 'not pinned yet' and fetch refuses until one is set"
    )

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", v):
            raise ValueError(f"{v!r} is not a Hugging Face repo id (owner/name)")
        return v

    @field_validator("revision")
    @classmethod
    def _pinned(cls, v: str | None) -> str | None:
        if v is not None and not _COMMIT.fullmatch(v):
            raise ValueError(
                f"revision {v!r} is not a 40-hex commit: pin the exact commit (branch and tag names move); "
                "find it with `hf models info <repo> --expand sha` or on the repo's commit history page"
            )
        return v


class LocalSource(_Strict):
    """A directory of Safetensors + config + tokenizer already on disk."""

    path: Path


class GeneratedSource(_Strict):
    """A tiny model built deterministically by modelmint itself (demo and test fixtures)."""

    generated: Literal["tiny-qwen2", "tiny-llama"]


Source = HubSource | LocalSource | GeneratedSource


class GGUFVariants(_Strict):
    outtype: Literal["f16", "bf16"] = "f16"
    quants: list[str] = Field(default_factory=lambda: ["q4_k_m"])
    imatrix: bool = False
    split_max_size: str | None = Field(
        default=None, description="shard outputs above this size with llama-gguf-split, e.g. '2G'"
    )

    @field_validator("quants")
    @classmethod
    def _known_types(cls, v: list[str]) -> list[str]:
        out = [q.lower() for q in v]
        unknown = [q for q in out if q not in GGUF_QUANT_TYPES]
        if unknown:
            raise ValueError(f"unknown llama.cpp quant type(s) {unknown}; known: {sorted(GGUF_QUANT_TYPES)}")
        if len(set(out)) != len(out):
            raise ValueError(f"duplicate quant types in {v}")
        return out

    @field_validator("split_max_size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+[MG]", v):
            raise ValueError(f"split_max_size {v!r} must look like 500M or 2G (llama-gguf-split's form)")
        return v


class HubDataset(_Strict):
    """A calibration data set on the hub, pinned like a model; for production runs on a machine that reaches it."""

    repo: str
    revision: str = Field(description="40-hex commit of the dataset repo")
    split: str = "train"
    text_column: str = "text"

    @field_validator("revision")
    @classmethod
    def _pinned(cls, v: str) -> str:
        if not _COMMIT.fullmatch(v):
            raise ValueError(f"dataset revision {v!r} is not a 40-hex commit: pin the exact commit")
        return v


class CalibrationSpec(_Strict):
    """Calibration text for AWQ / GPTQ / SmoothQuant: the bundled train.txt unless a pinned hub data set is named.

    pipelines/data/calibration.txt is never used here: it is the held-out evaluation text.
    """

    bundled: Literal["train.txt"] = "train.txt"
    hub_dataset: HubDataset | None = Field(
        default=None, description="used instead of the bundled text; fetched by llmcompressor's `datasets`"
    )
    num_samples: int = Field(default=16, ge=1, le=4096)
    max_seq_length: int = Field(default=256, ge=16, le=16384)


def _ignore_default() -> list[str]:
    return ["lm_head"]


def _group_sizes(v: list[int]) -> list[int]:
    if not v or any(g < 1 for g in v) or len(set(v)) != len(v):
        raise ValueError(f"group_sizes {v} must list distinct positive sizes, the preferred first (e.g. [128, 64, 32])")
    return v


GroupSizes = Annotated[
    list[int],
    Field(
        default_factory=lambda: [128, 64, 32],
        description="group sizes in order of preference; the first that divides every quantized layer's columns "
        "is used (checked before llmcompressor starts); [128] allows no fallback",
    ),
]


class FP8Variant(_Strict):
    """FP8 weights (per channel) and dynamic per-token FP8 activations; no calibration data."""

    scheme: Literal["FP8_DYNAMIC"] = "FP8_DYNAMIC"
    ignore: list[str] = Field(default_factory=_ignore_default)


class AWQVariant(_Strict):
    """4-bit integer weights in groups (128, or the next of group_sizes the model's shapes take), after AWQ's smoothing."""

    scheme: Literal["W4A16_ASYM", "W4A16"] = "W4A16_ASYM"
    ignore: list[str] = Field(default_factory=_ignore_default)
    group_sizes: GroupSizes
    duo_scaling: bool = True
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)

    _check_group_sizes = field_validator("group_sizes")(_group_sizes)


class GPTQVariant(_Strict):
    """4-bit integer weights in groups (128, or the next of group_sizes the model's shapes take), by GPTQ's rounding."""

    scheme: Literal["W4A16", "W4A16_ASYM"] = "W4A16"
    ignore: list[str] = Field(default_factory=_ignore_default)
    group_sizes: GroupSizes
    dampening_frac: float = Field(default=0.01, gt=0, lt=1)
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)

    _check_group_sizes = field_validator("group_sizes")(_group_sizes)


class W8A8Variant(_Strict):
    """INT8 weights (per channel) and dynamic per-token INT8 activations: SmoothQuant, then GPTQ."""

    scheme: Literal["W8A8"] = "W8A8"
    ignore: list[str] = Field(default_factory=_ignore_default)
    smoothing_strength: float | None = Field(default=0.8, ge=0, le=1, description="null skips SmoothQuant")
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)


# The compressed-tensors variants a catalog entry may ask for (pipelines/compress.py builds them).
COMPRESSED_VARIANTS: dict[str, type[_Strict]] = {
    "fp8": FP8Variant,
    "awq": AWQVariant,
    "w8a8": W8A8Variant,
    "gptq": GPTQVariant,
}


def unknown_variant_message(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f"unknown variant {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "") + f"; known: {known}"


class Variants(_Strict):
    gguf: GGUFVariants | None = Field(default_factory=GGUFVariants)
    fp8: FP8Variant | None = None
    awq: AWQVariant | None = None
    w8a8: W8A8Variant | None = None
    gptq: GPTQVariant | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_kinds(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = list(cls.model_fields)
            for key in data:
                if key not in known:
                    raise ValueError(unknown_variant_message(str(key), known))
        return data

    def compressed(self) -> dict[str, BaseModel]:
        """The compressed-tensors variants this entry asks for, by name (fp8, awq, w8a8, gptq)."""
        return {k: v for k in COMPRESSED_VARIANTS if (v := getattr(self, k)) is not None}


class CatalogEntry(_Strict):
    name: str
    source: Annotated[Source, Field(union_mode="left_to_right")]
    license: str
    chat_family: str | None = None
    trust_remote_code: bool = False
    gated: bool = False
    gate_profile: Literal["reference", "tiny"] = Field(
        default="reference",
        description="which thresholds in pipelines/gates.py apply: published figures, or the tiny-model ones",
    )
    variants: Variants = Field(default_factory=Variants)
    description: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"name {v!r} must be lower-case letters, digits, '.', '_' or '-'")
        return v

    def with_quants(self, quants: list[str]) -> CatalogEntry:
        """The same entry asking for other GGUF quant types (the CLI's --variants)."""
        gguf = self.variants.gguf or GGUFVariants()
        new_gguf = GGUFVariants.model_validate({**gguf.model_dump(), "quants": quants})
        return self.model_copy(update={"variants": self.variants.model_copy(update={"gguf": new_gguf})})


class Catalog(_Strict):
    models: list[CatalogEntry]

    @field_validator("models")
    @classmethod
    def _unique(cls, v: list[CatalogEntry]) -> list[CatalogEntry]:
        names = [m.name for m in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate catalog names: {dupes}")
        return v

    def get(self, name: str) -> CatalogEntry:
        for m in self.models:
            if m.name == name:
                return m
        raise CatalogEntryNotFound(name, [m.name for m in self.models])


def load_catalog(path: Path) -> Catalog:
    """Read and validate the catalog.

    Raises:
        ConfigError: the file is missing, not YAML, or does not match the schema (unknown keys included).
    """
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ConfigError(f"catalog not found at {path}", hint="set MODELMINT_CATALOG or run from the repo") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}", hint=f"fix the syntax in {path}") from err
    try:
        return Catalog.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors(include_url=False)
        )
        raise ConfigError(
            f"{path} is invalid: {problems}", hint=f"edit {path}; `modelmint catalog list` checks it"
        ) from err
