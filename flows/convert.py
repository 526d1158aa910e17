"""The `convert` flow: one catalog model through fetch → convert → quantize → validate → register → publish.

Each task calls one pipelines step. What Prefect adds:
  cache keys   from content (source commit, recipe, toolchain version, the input artifact's sha256), never
               from path strings; a hit whose output is gone or changed is run again (`_cached`)
  retries      only for errors that say a retry can help (ModelmintError.transient: network, 5xx, timeouts)
  concurrency  one run per model at a time (limit `model-<name>`); GPU steps hold a slot of `gpu`
  artifacts    a Markdown report and a table per run (validation figures, sizes, gate verdicts)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.tasks import Task

from flows.slots import GPU_LIMIT, ensure_limit, model_limit, prefect_unreachable, slot
from pipelines.core.errors import ConfigError, ModelmintError, ShapeRefused, VariantsFailed
from pipelines.core.fsutil import HashCache
from pipelines.core.report import Validation
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    BuildResult,
    StepResult,
    VariantError,
    VariantOutcome,
    content_key,
    keep_failure,
    load_receipt,
    variant_scoped,
)
from pipelines.gguf import build
from pipelines.gguf.build import GGUFPlan
from pipelines.registry import dvcrepo
from pipelines.registry import register as reg
from pipelines.registry.formats import FORMATS, Format, format_of, split_by_format
from pipelines.source.catalog import COMPRESSED_VARIANTS, GGUF_QUANT_TYPES, CatalogEntry, load_catalog

# pipelines' INFO lines (what each step ran, what an interrupted run left and was removed) belong in the run's
# log: PREFECT_LOGGING_EXTRA_LOGGERS attaches Prefect's handler to the `pipelines` logger, but the logger's
# own level would still be the root's WARNING.
logging.getLogger("pipelines").setLevel(logging.INFO)

R = TypeVar("R")


def _transient(_task: Any, _run: Any, state: Any) -> bool:
    """Retry only what may succeed when tried again: modelmint's transient errors, and any error saying the
    Prefect API (or another server) could not be reached (httpx's errors do not derive from ConnectionError)."""
    try:
        state.result()
    except ModelmintError as err:
        return err.transient
    except Exception as err:
        return prefect_unreachable(err)
    return False


def _cached(step: Task[..., R], current: Callable[[R], bool], *args: Any) -> R:
    """Run a cached task; a cached result whose output is gone or changed is not a hit: run it again.

    Prefect keys the result by content, but cannot know that the file the result points at was deleted
    since; `current` checks that (a stat and a receipt read), and a refresh replaces the stale record.
    """
    result = step(*args)
    if not current(result):
        get_run_logger().info("%s: cached output is gone or changed, running it again", step.name)
        result = step.with_options(refresh_cache=True)(*args)
    return result


# ---------------------------------------------------------------- cache keys (content only)


def _settings_key(s: Settings) -> dict[str, Any]:
    # Where outputs go is part of what a plan *is*; the token never enters a key or a stored result, and
    # the orchestration settings say nothing about the plan.
    skip = {"hf_token", "prefect_home", "prefect_port", "gpu_slots", "prefect_crash_after_s"}
    return {k: str(v) for k, v in dataclasses.asdict(s).items() if k not in skip}


def _fetch_key(_ctx: Any, p: dict[str, Any]) -> str:
    entry: CatalogEntry = p["entry"]
    return content_key("fetch", entry.model_dump(mode="json"), p["revision"], p["quants"], _settings_key(p["settings"]))


def _convert_key(_ctx: Any, p: dict[str, Any]) -> str:
    plan: GGUFPlan = p["plan"]
    # base_key = the source files' sha256s + outtype + llama.cpp commit + modelmint version. The result is
    # a file in this plan's work directory, so where it is written is part of the key too: two checkouts
    # sharing one Prefect server must not be handed each other's build directories.
    return content_key("convert", plan.snapshot.revision, plan.base_key, str(plan.base_path))


def _imatrix_key(_ctx: Any, p: dict[str, Any]) -> str:
    plan: GGUFPlan = p["plan"]
    return content_key("imatrix", plan.imatrix_key, p["base"].receipt["sha256"], str(plan.imatrix_path))


def _quantize_key(_ctx: Any, p: dict[str, Any]) -> str:
    plan: GGUFPlan = p["plan"]
    imatrix: StepResult | None = p["imatrix"]
    return content_key(
        "quantize", plan.quant_key(p["q"]), p["base"].receipt["sha256"], imatrix.receipt["sha256"] if imatrix else None,
        str(plan.quant_path(p["q"])),
    )


def _validate_key(_ctx: Any, p: dict[str, Any]) -> str:
    plan: GGUFPlan = p["plan"]
    q = p["q"]
    gate = plan.gate(q).to_dict()
    return content_key("validate", p["quant"].receipt["sha256"], plan.logits_key, gate, str(plan.report_path(q)))


def _register_key(_ctx: Any, p: dict[str, Any]) -> str:
    candidate: reg.Candidate = p["candidate"]
    # candidate.key = the blob's sha256 + recipe + validation report + toolchain; the entry decides the
    # serving files written beside it (chat family, licence)
    return content_key("register", candidate.key, candidate.entry.model_dump(mode="json"))


def _publish_key(_ctx: Any, p: dict[str, Any]) -> str:
    candidate: reg.Candidate = p["candidate"]
    return content_key("publish", candidate.key, p["tracked"].md5)


# ---------------------------------------------------------------- tasks: one pipelines step each

_CACHED: dict[str, Any] = {"persist_result": True}


@task(name="fetch", task_run_name="fetch", cache_key_fn=_fetch_key, retries=3, retry_delay_seconds=[5, 30, 120],
      retry_condition_fn=_transient, **_CACHED)
def fetch_source(entry: CatalogEntry, settings: Settings, revision: str | None, quants: list[str] | None) -> GGUFPlan:
    plan = build.plan_gguf(entry, settings, revision=revision, quants=quants)
    # The plan is stored as this task's cached result: keep the token out of it.
    return dataclasses.replace(plan, settings=dataclasses.replace(plan.settings, hf_token=None))


@task(name="convert", task_run_name="convert", cache_key_fn=_convert_key, retries=1, retry_condition_fn=_transient, **_CACHED)
def convert_base(plan: GGUFPlan) -> StepResult:
    return build.ensure_base(plan)


@task(name="imatrix", task_run_name="imatrix", cache_key_fn=_imatrix_key, retries=1, retry_condition_fn=_transient, **_CACHED)
def compute_imatrix(plan: GGUFPlan, base: StepResult) -> StepResult | None:
    return build.ensure_imatrix(plan)


@task(name="quantize", task_run_name="quantize-{q}", cache_key_fn=_quantize_key, retries=1,
      retry_condition_fn=_transient, **_CACHED)
def quantize(plan: GGUFPlan, q: str, base: StepResult, imatrix: StepResult | None, threads: int) -> StepResult:
    return build.ensure_quant(plan, q, threads=threads)


@task(name="validate", task_run_name="validate-{q}", cache_key_fn=_validate_key, retries=1,
      retry_condition_fn=_transient, **_CACHED)
def validate(plan: GGUFPlan, q: str, quant: StepResult) -> VariantOutcome:
    return build.ensure_validated(plan, q)


@task(name="register", task_run_name="register-{candidate.tag}", cache_key_fn=_register_key, **_CACHED)
def register(settings: Settings, candidate: reg.Candidate) -> reg.Tracked:
    """Place the artifact directory and `dvc commit` its stage (local: no network, no retries)."""
    return reg.track(settings, candidate, reg.place(settings, candidate))


@task(name="publish", task_run_name="publish-{candidate.tag}", cache_key_fn=_publish_key, retries=3,
      retry_delay_seconds=[10, 60, 300], retry_condition_fn=_transient, **_CACHED)
def publish(settings: Settings, candidate: reg.Candidate, tracked: reg.Tracked) -> reg.Registration:
    """`dvc push` to the remote, then the manifest: the variant is registered once this returns."""
    return reg.publish(settings, candidate, tracked)


@task(name="compress", task_run_name="compress-{model}", retries=1, retry_condition_fn=_transient,
      cache_policy=NO_CACHE)
def compress(model: str, entry: CatalogEntry, settings: Settings, schemes: list[str], revision: str | None) -> Any:
    """AWQ / FP8 / … with llmcompressor (pipelines.compressed.build); each GPU run holds one slot of the `gpu` limit.

    Not cached by Prefect: build_compressed skips every step whose receipt matches, on its own.
    """
    from pipelines.compressed.build import build_compressed

    return build_compressed(entry, settings, schemes=schemes, revision=revision, gpu_slot=gpu_slot)


def gpu_slot() -> AbstractContextManager[Any]:
    """One slot of the `gpu` global limit (flows.slots: strict, holder named, waits said, release never fatal)."""
    return slot(GPU_LIMIT, prefect_home=Settings.from_env().prefect_dir)


# ---------------------------------------------------------------- "is the cached output still there?"


def _source_current(plan: GGUFPlan) -> bool:
    hashes = HashCache(plan.settings.home / "hashcache.json")
    try:
        return plan.out_dir.is_dir() and all(
            hashes.sha256(plan.snapshot.path / rel) == sha for rel, sha in plan.snapshot.files.items()
        )
    except (FileNotFoundError, NotADirectoryError):
        return False


def _step_current(key: str | None, path: Path | None) -> Callable[[StepResult | None], bool]:
    """A step's output is current while it is the file this plan expects, its receipt matches `key` and
    the file is the one the receipt describes."""

    def check(step: StepResult | None) -> bool:
        if step is None:
            return path is None
        return key is not None and step.path == path and load_receipt(step.path, key) is not None

    return check


def _report_current(plan: GGUFPlan) -> Callable[[VariantOutcome], bool]:
    def check(outcome: VariantOutcome) -> bool:
        try:
            report = json.loads(plan.report_path(outcome.variant).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return False
        return report.get("key") == outcome.report.get("key")

    return check


# ---------------------------------------------------------------- the flow


@flow(name="convert", flow_run_name="{model}", log_prints=True)
def convert(model: str, variants: list[str] | None = None, revision: str | None = None) -> dict[str, Any]:
    """Build, validate, register and publish the variants of one catalog model.

    `variants` names what to build instead of the catalog's list: GGUF quant types (q4_k_m, q8_0, …) and
    compressed-tensors schemes (fp8, awq, …); `revision` overrides the pinned commit.
    """
    settings = Settings.from_env()
    entry = load_catalog(settings.catalog_path).get(model)
    by_format = split_variants(entry, variants)
    # Refuse before any work a variant that could not be registered (no dvc.yaml stage records it).
    dvcrepo.require_stages(settings, entry.name, [v for asked in by_format.values() for v in asked])
    with get_client(sync_client=True) as client:
        ensure_limit(client, model_limit(model), 1)
    with slot(model_limit(model), prefect_home=settings.prefect_dir):
        results: list[BuildResult] = []
        registrations: dict[str, reg.Registration] = {}
        register_errors: dict[str, VariantError] = {}
        header: list[str] = []
        # Each format, and inside it each variant, fails on its own: the others are still built, validated,
        # registered and reported; the run fails at the end, naming every failure and its cause.
        for name, asked in by_format.items():
            if not asked:
                continue
            fmt = FORMATS[name]
            try:
                lines, result = _BUILDS[name](entry, settings, asked, revision)
            except Exception as err:
                if not variant_scoped(err):
                    raise
                lines, result = [], _all_failed(entry.name, asked, err)  # type: ignore[arg-type]
            header += lines
            results.append(result)
            if result.plan is not None:
                done, failed = _register_all(settings, {
                    v: functools.partial(fmt.candidate, result.plan, result.variants[v]) for v in result.passed
                })
                registrations.update(done)
                register_errors.update(failed)
        refs = {v: r.manifest.ref for v, r in registrations.items()}
        status = [row for r in results for row in r.rows(refs, register_errors)]
        outcomes = {v: o for r in results for v, o in r.variants.items()}
        summary = _publish_artifacts(entry.name, header, outcomes, registrations, status)
    causes: dict[str, str] = {}
    advice: dict[str, str] = {}
    for r in results:
        if isinstance(failure := r.failure(register_errors), VariantsFailed):
            causes.update(failure.causes)
            advice.update(failure.advice)
    if causes:
        raise VariantsFailed([row["variant"] for row in status], causes, advice)
    return summary


def _all_failed(name: str, variants: list[str], err: ModelmintError) -> BuildResult:
    """A format's result when its shared steps failed (fetch, convert, imatrix): every variant failed with that."""
    errors = {v: VariantError.of(v, "build", err) for v in variants}
    return BuildResult(name, Path(), {}, {}, {}, [], errors=errors, asked=list(variants))


def split_variants(entry: CatalogEntry, variants: list[str] | None) -> dict[Format, list[str]]:
    """The variants a run builds, by format: the catalog's, or the ones named.

    Raises:
        ConfigError: a name that is neither a GGUF quant type nor a compressed scheme, or nothing to build.
    """
    if variants is None:
        return {name: fmt.catalog_variants(entry) for name, fmt in FORMATS.items()}
    names = [v.strip().lower() for v in variants if v.strip()]
    unknown = [v for v in names if v not in GGUF_QUANT_TYPES and v not in COMPRESSED_VARIANTS]
    if unknown or not names:
        raise ConfigError(
            f"variants {unknown or variants} name no GGUF quant type or compressed scheme",
            hint=f"e.g. variants=[\"q4_k_m\", \"q8_0\"] or [\"fp8\"]; schemes: {sorted(COMPRESSED_VARIANTS)}",
        )
    return split_by_format(names)


def _compressed(
    entry: CatalogEntry, settings: Settings, schemes: list[str], revision: str | None
) -> tuple[list[str], BuildResult]:
    result = compress(entry.name, entry, settings, schemes, revision)
    tc = getattr(result.plan, "tc", None)
    return ([f"compressed-tensors with llmcompressor {tc.version} from the same source"] if tc else []), result


def _gguf(
    entry: CatalogEntry, settings: Settings, quants: list[str], revision: str | None
) -> tuple[list[str], BuildResult]:
    plan = _cached(fetch_source, _source_current, entry, settings, revision, quants)
    errors: dict[str, VariantError] = {}
    preflight: dict[str, dict[str, Any]] = {}
    for q in plan.spec.quants:
        try:
            preflight[q] = plan.block_fallback(q).to_dict()
        except ShapeRefused as err:
            errors[q] = VariantError.of(q, "preflight", err)
            get_run_logger().warning("%s refused before the work: %s", q, err.message)
    todo = [q for q in plan.spec.quants if q not in errors]
    if not todo:  # every type refused: nothing to convert for
        return [], BuildResult(entry.name, plan.out_dir, plan.source, {}, {}, [], plan=plan, errors=errors,
                               asked=list(plan.spec.quants))
    base = _cached(convert_base, _step_current(plan.base_key, plan.base_path), plan)
    imatrix = None
    if plan.spec.imatrix:
        imatrix = _cached(compute_imatrix, _step_current(plan.imatrix_key, plan.imatrix_path), plan, base)

    # llama-quantize keeps about two cores busy: run as many at once as build_gguf does.
    jobs, per_job = build.quant_parallelism(len(todo), settings.effective_threads)
    quants_done: dict[str, StepResult] = {}
    for i in range(0, len(todo), jobs):
        batch = todo[i : i + jobs]
        futures = {q: quantize.submit(plan, q, base, imatrix, per_job) for q in batch}
        for q, fut in futures.items():
            try:
                step = fut.result()
                if not _step_current(plan.quant_key(q), plan.quant_path(q))(step):
                    step = quantize.with_options(refresh_cache=True)(plan, q, base, imatrix, per_job)
            except Exception as err:
                keep_failure(errors, q, "build", err)
                continue
            quants_done[q] = step

    outcomes: dict[str, VariantOutcome] = {}
    for q in quants_done:
        try:
            outcomes[q] = _cached(validate, _report_current(plan), plan, q, quants_done[q])
        except Exception as err:
            keep_failure(errors, q, "validate", err)

    snap = plan.snapshot
    source = f"{snap.repo_id}@{snap.revision}" if snap.repo_id else f"{snap.kind} source"
    header = [
        f"Source **{source}** (content {plan.source_key[:12]}) · llama.cpp {plan.llama.commit} · "
        f"base {plan.base_path.name} {_mib(base.receipt['size'])}, sha256 `{base.receipt['sha256'][:16]}`",
    ]
    result = BuildResult(entry.name, plan.out_dir, plan.source, base.receipt, outcomes, [], plan=plan, errors=errors,
                         preflight=preflight, asked=list(plan.spec.quants))
    return header, result


def _register_all(
    settings: Settings, candidates: dict[str, Callable[[], reg.Candidate]]
) -> tuple[dict[str, reg.Registration], dict[str, VariantError]]:
    """Register and publish validated variants, GGUF or compressed-tensors, through the same two tasks; a
    variant whose registration fails is reported with its cause and the others still go on."""
    registrations: dict[str, reg.Registration] = {}
    errors: dict[str, VariantError] = {}
    for v, make in candidates.items():
        try:
            c = make()
            tracked = _cached(register, lambda t, c=c: reg.is_tracked(settings, c, t), settings, c)
            registrations[c.tag] = _cached(
                publish, lambda _r, c=c: reg.registered(settings, c) is not None, settings, c, tracked
            )
        except Exception as err:
            keep_failure(errors, v, "register", err)
    return registrations, errors


# ---------------------------------------------------------------- what each run publishes


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow only a-z, 0-9 and dashes."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _publish_artifacts(
    name: str, header: list[str], outcomes: dict[str, VariantOutcome], registrations: dict[str, reg.Registration],
    status: list[dict[str, str]],
) -> dict[str, Any]:
    rows = []
    for st in status:
        v = st["variant"]
        o = outcomes.get(v)
        figures = _figures(o.report if o else {})
        done = registrations.get(v)
        rows.append({
            "variant": v,
            "format": format_of(v).name,
            "built": st["built"],
            "validated": st["validated"],
            "size_mib": round(o.size_bytes / (1 << 20), 2) if o else None,
            **figures,
            "gate": ("pass" if o.passed else "FAIL: " + "; ".join(o.failures)) if o else "-",
            "registered": done.manifest.ref if done else "",
            "cause": st["cause"],
            "sha256": o.digest if o else "",
            "dvc_path": done.manifest.dvc.path if done else "",
        })
    lines = [f"# {name}: convert", "", *header, "",
             "| variant | built | size | mean KL (max) | same top % (min) | ΔPPL % (max) | gate | registered | cause of failure |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        size = f"{r['size_mib']:,.1f} MiB" if r["size_mib"] is not None else "-"
        gate = "✅ pass" if r["gate"] == "pass" else ("-" if r["gate"] == "-" else "❌ " + r["gate"])
        lines.append(
            f"| {r['variant']} | {r['built']} | {size} | {_num(r['mean_kl'], 5)} ({r['max_mean_kl']}) | "
            f"{_num(r['same_top_pct'], 2)} ({r['min_same_top_pct']}) | {_num(r['dppl_pct'], 2)} ({r['max_dppl_pct']}) | "
            f"{gate} | {r['registered'] and '`' + r['registered'] + '`'} | {r['cause'].replace('|', '/')} |"
        )
    lines += ["", "Registered variants are in the DVC remote; `modelmint pull NAME:TAG` fetches one and checks it."]
    create_markdown_artifact("\n".join(lines), key=artifact_key("convert", name), description=f"convert {name}")
    create_table_artifact(rows, key=artifact_key("convert", name, "variants"), description=f"variants of {name}")
    return {
        "model": name,
        "registered": [r.manifest.ref for r in registrations.values()],
        "failed": [r["variant"] for r in rows if r["cause"]],
        "variants": rows,
    }


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    """The table's figure columns, from the report's validation block (the same for every format)."""
    judged = Validation.of_report(report)
    if judged is None:
        return dict.fromkeys(("mean_kl", "max_mean_kl", "same_top_pct", "min_same_top_pct", "dppl_pct", "max_dppl_pct"))
    f, gate = judged.figures, judged.gate
    return {
        "mean_kl": f and f.mean_kl, "max_mean_kl": gate.get("max_mean_kl"),
        "same_top_pct": f and f.same_top_pct, "min_same_top_pct": gate.get("min_same_top_pct"),
        "dppl_pct": f and f.dppl_pct, "max_dppl_pct": gate.get("max_dppl_pct"),
    }


def _num(v: Any, digits: int) -> str:
    return f"{v:.{digits}f}" if isinstance(v, int | float) else "-"


_BUILDS: dict[Format, Callable[[CatalogEntry, Settings, list[str], str | None], tuple[list[str], BuildResult]]] = {
    "gguf": _gguf,
    "compressed-tensors": _compressed,
}
"""How the flow builds each format: the same steps as the library, one task each, with Prefect's caching."""

