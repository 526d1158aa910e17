"""The GGUF path for one catalog entry: fetch → f16 → quantize → validate, resumable and content-keyed."""

from __future__ import annotations

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
from pipelines.catalog import CatalogEntry, HubSource
from pipelines.fsutil import HashCache, clean_partials, sha256_file, write_text_atomic
from pipelines.gates import gguf_gate
from pipelines.settings import Settings
from pipelines.toolchains import LlamaCpp, llama_cpp
from pipelines.validate import VariantReport, kld_base_logits, validate_variant

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


# ---------------------------------------------------------------- results


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


@dataclass
class BuildResult:
    name: str
    out_dir: Path
    source: dict[str, Any]
    base: dict[str, Any]
    variants: dict[str, VariantOutcome]
    tools_run: list[str]
    """Every tool invocation this build made (empty when everything was cached)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Wall seconds per phase (fetch, convert, imatrix, quantize, validate), cached phases included."""

    @property
    def passed(self) -> list[str]:
        return [q for q, v in self.variants.items() if v.passed]

    @property
    def failed(self) -> list[str]:
        return [q for q, v in self.variants.items() if not v.passed]


# ---------------------------------------------------------------- the path


def build_gguf(
    entry: CatalogEntry,
    settings: Settings,
    *,
    revision: str | None = None,
    quants: list[str] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> BuildResult:
    """Build, check and validate the GGUF variants of one catalog entry.

    Every step is skipped when a receipt shows its output was made from the same content by the same
    toolchain; a failing gate is recorded in the variant's report and that variant goes no further.

    Raises:
        SourceError, ToolchainMissing, ToolError, DiskFullError, UnsupportedModel, ArtifactError.
    """
    from pipelines.fetch import fetch

    llama = llama_cpp(settings)
    spec = entry.variants.gguf
    if spec is None:
        raise ValueError(f"{entry.name} asks for no GGUF variants")
    if quants:
        entry = entry.with_quants(quants)
        spec = entry.variants.gguf
        assert spec is not None
    timings: dict[str, float] = {}

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - start, 3)

    progress(f"fetch {entry.name}")
    with phase("fetch"):
        snapshot = fetch(entry, settings, revision=revision)
    source_key = content_key(sorted(snapshot.files.items()))
    source = {
        "kind": snapshot.kind,
        "repo": snapshot.repo_id,
        "revision": snapshot.revision,
        "content_sha256": source_key,
        "path": str(snapshot.path),
    }
    out_dir = settings.work_dir / entry.name / (snapshot.revision or source_key)[:12]
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in clean_partials(out_dir):
        log.info("removed %s left by an interrupted run", stale)
    tools_run: list[str] = []
    threads = settings.effective_threads

    # 1. f16 / bf16 base
    base_path = out_dir / f"{entry.name}-{spec.outtype}.gguf"
    base_key = content_key("convert", source_key, spec.outtype, llama.commit, __version__)
    with phase("convert"):
        base = load_receipt(base_path, base_key)
    if base is None:
        progress(f"convert → {base_path.name}")
        with phase("convert"):
            info, tool = gguf.convert(
                snapshot.path, base_path, llama, outtype=spec.outtype, provenance=_provenance(entry, snapshot, llama)
            )
            base = write_receipt(
                base_path, base_key, gguf=info.to_dict(), wall_s=round(tool.wall_s, 3), peak_rss=tool.peak_rss_bytes
            )
        tools_run.append("convert_hf_to_gguf")

    # 2. optional importance matrix from the bundled calibration text
    text = bundled_text()
    text_sha = HashCache(settings.home / "hashcache.json").sha256(text)
    imatrix_path: Path | None = None
    imatrix_key = None
    if spec.imatrix:
        imatrix_path = out_dir / f"{entry.name}.imatrix.gguf"
        imatrix_key = content_key("imatrix", base_key, text_sha, llama.commit)
        if load_receipt(imatrix_path, imatrix_key) is None:
            progress("imatrix")
            with phase("imatrix"):
                gguf.compute_imatrix(base_path, text, imatrix_path, llama, threads=threads)
                write_receipt(imatrix_path, imatrix_key)
            tools_run.append("llama-imatrix")

    # 3. quantize every type from the one base, concurrently where cores allow
    kv = {
        "modelmint.version": __version__,
        "modelmint.llama_cpp.commit": llama.commit,
        "modelmint.source.repo": snapshot.repo_id or entry.name,
        "modelmint.source.revision": snapshot.revision or source_key,
    }

    def _quant_key(q: str) -> str:
        return content_key("quantize", base_key, q, imatrix_key, llama.commit, kv)

    with phase("quantize"):
        todo = [q for q in spec.quants if load_receipt(_qpath(out_dir, entry.name, q), _quant_key(q)) is None]
    if todo:
        jobs, per_job = quant_parallelism(len(todo), threads)
        progress(f"quantize {', '.join(todo)} ({jobs} at a time, {per_job} threads each)")

        def _one(q: str) -> None:
            out = _qpath(out_dir, entry.name, q)
            info, tool = gguf.quantize(
                base_path, out, q, llama, threads=per_job, imatrix=imatrix_path, kv={**kv, "modelmint.variant": q}
            )
            write_receipt(out, _quant_key(q), gguf=info.to_dict(), wall_s=round(tool.wall_s, 3),
                          peak_rss=tool.peak_rss_bytes)

        with phase("quantize"), ThreadPoolExecutor(max_workers=jobs) as pool:
            for _ in pool.map(_one, todo):
                pass
        tools_run += [f"llama-quantize {q}" for q in todo]

    # 4. validate each variant against the base's logits; the report is the variant's finish line
    ctx, chunks = EVAL_CTX, EVAL_CHUNKS
    logits_path = out_dir / f"{entry.name}-{spec.outtype}.kld-base.bin"
    logits_key = content_key("kld-base", base_key, text_sha, ctx, chunks, llama.commit)
    variants: dict[str, VariantOutcome] = {}
    validate_start = time.perf_counter()
    for q in spec.quants:
        qpath = _qpath(out_dir, entry.name, q)
        qreceipt = load_receipt(qpath, _quant_key(q))
        assert qreceipt is not None
        gate = gguf_gate(q, entry.gate_profile)
        report_path = qpath.with_suffix(".report.json")
        report_key = content_key("validate", qreceipt["sha256"], logits_key, gate.to_dict())
        report = _load_report(report_path, report_key)
        cached = report is not None
        if report is None:
            if load_receipt(logits_path, logits_key) is None:
                progress("reference logits (llama-perplexity --kl-divergence-base)")
                logits_path.unlink(missing_ok=True)
                kld_base_logits(base_path, text, logits_path, llama, threads=threads, ctx=ctx, chunks=chunks)
                tools_run.append("llama-perplexity base")
                write_receipt(logits_path, logits_key)
            progress(f"validate {q}")
            info = gguf.inspect_gguf(qpath)
            rep: VariantReport = validate_variant(
                q, qpath, info, base_path, logits_path, gate, llama, threads=threads, ctx=ctx,
                report_path=report_path, extra={"key": report_key, "sha256": qreceipt["sha256"]},
            )
            tools_run += [f"llama-completion {q}", f"llama-perplexity {q}"]
            report = rep.to_dict()
        outcome = VariantOutcome(q, qpath, qreceipt["sha256"], qreceipt["size"], report, cached)
        if outcome.passed and spec.split_max_size:
            outcome.shards = _split_if_needed(qpath, spec.split_max_size, llama)
        variants[q] = outcome

    timings["validate"] = round(time.perf_counter() - validate_start, 3)
    result = BuildResult(entry.name, out_dir, source, base, variants, tools_run, timings)
    write_text_atomic(out_dir / "build.json", json.dumps(_summary(result), indent=2, sort_keys=True) + "\n")
    return result


def quant_parallelism(n_jobs: int, threads: int) -> tuple[int, int]:
    """How many llama-quantize processes to run at once, and threads for each.

    llama-quantize keeps about two cores busy (reading, converting and writing tensors are serial), so
    one process per two cores; every process gets an equal share of the threads.
    """
    jobs = max(1, min(n_jobs, threads // 2))
    return jobs, max(1, threads // jobs)


def _qpath(out_dir: Path, name: str, q: str) -> Path:
    return out_dir / f"{name}-{q}.gguf"


def _load_report(path: Path, key: str) -> dict[str, Any] | None:
    try:
        report = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return report if report.get("key") == key else None


def _split_if_needed(path: Path, max_size: str, llama: LlamaCpp) -> list[Path]:
    limit = int(max_size[:-1]) * (1 << (30 if max_size.endswith("G") else 20))
    if path.stat().st_size <= limit:
        return []
    return gguf.split(path, max_size, llama)


def _provenance(entry: CatalogEntry, snapshot: Any, llama: LlamaCpp) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "general.name": entry.name,
        "general.quantized_by": f"modelmint {__version__} with llama.cpp {llama.commit}",
        "general.license": entry.license,
    }
    if isinstance(entry.source, HubSource) and snapshot.revision:
        meta["general.source.url"] = f"https://huggingface.co/{snapshot.repo_id}/tree/{snapshot.revision}"
        meta["general.source.repo_url"] = f"https://huggingface.co/{snapshot.repo_id}"
    return meta


def _summary(result: BuildResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "source": result.source,
        "base": result.base,
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
