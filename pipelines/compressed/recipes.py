"""Typed llmcompressor recipes, one per compressed-tensors scheme (FP8, AWQ, GPTQ, W8A8), saved inside every artifact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.core.errors import (
    ConfigError,
)
from pipelines.core.texts import EVAL_TEXT
from pipelines.core.vocab import CompressedName
from pipelines.source.catalog import (
    COMPRESSED_VARIANTS,
    AWQVariant,
    CalibrationSpec,
    FP8Variant,
    GPTQVariant,
    W8A8Variant,
    unknown_variant_message,
)

RECIPE_FILE = "modelmint-recipe.yaml"
"""Our typed recipe, saved inside every artifact (llmcompressor writes its own expansion as recipe.yaml)."""


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

    variant: CompressedName
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
        from pipelines.core.preflight import GROUPED_SCHEMES

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
    mods: list[ModifierSpec] = [AWQModifierSpec(duo_scaling=spec.duo_scaling),
                                QuantizationModifierSpec(scheme=spec.scheme, ignore=spec.ignore)]
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


