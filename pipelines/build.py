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
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import __version__, gguf
from pipelines.catalog import CatalogEntry, GGUFVariants, HubSource
from pipelines.fsutil import HashCache, clean_partials, disk_full_located, sha256_file, write_text_atomic
from pipelines.gates import gguf_gate
from pipelines.settings import Settings
from pipelines.toolchains import LlamaCpp, llama_cpp
from pipelines.validate import kld_base_logits, validate_variant

log = logging.getLogger(__name__)

EVAL_CTX = 128
EVAL_CHUNKS = 16


def bundled_text(name: str = "calibration.txt") -> Path:
    """The bundled, license-clean evaluation/calibration text (pipelines/data/)."""
    return Path(__file__).parent / "data" / name


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
    text: Path
    text_sha: str

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
        return content_key("imatrix", self.base_key, self.text_sha, self.llama.commit) if self.spec.imatrix else None

    def quant_path(self, q: str) -> Path:
        return self.out_dir / f"{self.entry.name}-{q}.gguf"

    @property
    def provenance_kv(self) -> dict[str, str | int]:
        """Metadata every quantized GGUF carries (llama-quantize --override-kv)."""
        return {
            "modelmint.version": __version__,
            "modelmint.llama_cpp.commit": self.llama.commit,
            "modelmint.source.repo": self.snapshot.repo_id or self.entry.name,
            "modelmint.source.revision": self.snapshot.revision or self.source_key,
        }

    def quant_key(self, q: str) -> str:
        return content_key("quantize", self.base_key, q, self.imatrix_key, self.llama.commit, self.provenance_kv)

    @property
    def logits_path(self) -> Path:
        return self.out_dir / f"{self.entry.name}-{self.spec.outtype}.kld-base.bin"

    @property
    def logits_key(self) -> str:
        return content_key("kld-base", self.base_key, self.text_sha, EVAL_CTX, EVAL_CHUNKS, self.llama.commit)

    def report_path(self, q: str) -> Path:
        return self.quant_path(q).with_suffix(".report.json")


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


def plan_gguf(
    entry: CatalogEntry, settings: Settings, *, revision: str | None = None, quants: list[str] | None = None
) -> GGUFPlan:
    """Fetch the source and fix the content keys and output directory of one GGUF build.

    Raises:
        ConfigError: the entry asks for no GGUF variants or an unknown quant type.
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
    with disk_full_located(settings):
        snapshot = fetch(entry, settings, revision=revision)
        source_key = content_key(sorted(snapshot.files.items()))
        out_dir = settings.work_dir / entry.name / (snapshot.revision or source_key)[:12]
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in clean_partials(out_dir):
            log.info("removed %s left by an interrupted run", stale)
        text = bundled_text()
        text_sha = HashCache(settings.home / "hashcache.json").sha256(text)
    return GGUFPlan(entry, spec, settings, llama, snapshot, source_key, out_dir, text, text_sha)


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
    """The importance matrix over the bundled calibration text, when the catalog asks for one."""
    out, key = plan.imatrix_path, plan.imatrix_key
    if out is None or key is None:
        return None
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    with disk_full_located(plan.settings):
        tool = gguf.compute_imatrix(plan.base_path, plan.text, out, plan.llama,
                                    threads=plan.settings.effective_threads)
        return StepResult(out, write_receipt(out, key, wall_s=round(tool.wall_s, 3)), ran=True)


def ensure_quant(plan: GGUFPlan, q: str, *, threads: int | None = None) -> StepResult:
    """One quantized GGUF made from the base (and the imatrix when there is one)."""
    out, key = plan.quant_path(q), plan.quant_key(q)
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    with disk_full_located(plan.settings):
        info, tool = gguf.quantize(
            plan.base_path, out, q, plan.llama,
            threads=threads or plan.settings.effective_threads,
            imatrix=plan.imatrix_path,
            kv={**plan.provenance_kv, "modelmint.variant": q},
        )
        receipt = write_receipt(out, key, gguf=info.to_dict(), wall_s=round(tool.wall_s, 3),
                                peak_rss=tool.peak_rss_bytes)
    return StepResult(out, receipt, ran=True)


def ensure_reference_logits(plan: GGUFPlan) -> StepResult:
    """The base model's logits over the evaluation text, shared by every variant's KL divergence."""
    out, key = plan.logits_path, plan.logits_key
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    out.unlink(missing_ok=True)
    with disk_full_located(plan.settings):
        kld_base_logits(plan.base_path, plan.text, out, plan.llama, threads=plan.settings.effective_threads,
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
    report_key = content_key("validate", qreceipt["sha256"], plan.logits_key, gate.to_dict())
    report = _load_report(report_path, report_key)
    cached = report is not None
    if report is None:
        logits = ensure_reference_logits(plan)
        info = gguf.inspect_gguf(qpath)
        with disk_full_located(plan.settings):
            report = validate_variant(
                q, qpath, info, plan.base_path, logits.path, gate, plan.llama,
                threads=plan.settings.effective_threads, ctx=EVAL_CTX, report_path=report_path,
                extra={"key": report_key, "sha256": qreceipt["sha256"], "source": plan.source},
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

    @property
    def passed(self) -> list[str]:
        return [q for q, v in self.variants.items() if v.passed]

    @property
    def failed(self) -> list[str]:
        return [q for q, v in self.variants.items() if not v.passed]


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

    todo = [q for q in plan.spec.quants if load_receipt(plan.quant_path(q), plan.quant_key(q)) is None]
    jobs, per_job = quant_parallelism(len(todo), settings.effective_threads)
    if todo:
        progress(f"quantize {', '.join(todo)} ({jobs} at a time, {per_job} threads each)")
    with phase("quantize"), ThreadPoolExecutor(max_workers=jobs) as pool:
        for step in pool.map(lambda q: ensure_quant(plan, q, threads=per_job), plan.spec.quants):
            if step.ran:
                tools_run.append(f"llama-quantize {step.path.name}")

    variants: dict[str, VariantOutcome] = {}
    with phase("validate"):
        for q in plan.spec.quants:
            if _load_report(plan.report_path(q), None) is None:
                progress(f"validate {q}")
            variants[q] = ensure_validated(plan, q)
            if not variants[q].cached:
                tools_run.append(f"validate {q}")

    result = BuildResult(entry.name, plan.out_dir, plan.source, base.receipt, variants, tools_run, timings, plan)
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
            }
            for q, v in result.variants.items()
        },
    }
