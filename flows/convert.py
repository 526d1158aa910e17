"""The `convert` flow: one catalog model through fetch → convert → quantize → validate → register → publish
(→ publish-image to the OCI registry MODELMINT_OCI_REGISTRY names, when it names one).

Each format's build is its step list (pipelines/core/steps.py), the one the CLI runs, here one task per step
(flows/steps.py), then its own finish (build.json / compress.json, ladder check). What Prefect adds:
  cache keys   from content (source commit, recipe, toolchain version, the input artifact's sha256), never
               from path strings; a hit whose output is gone or changed is run again (`_cached`)
  retries      only for errors that say a retry can help (ModelmintError.transient: network, 5xx, timeouts)
  concurrency  one run per model at a time (limit `model-<name>`); GPU steps hold a slot of `gpu`
  artifacts    a Markdown report and a table per run (validation figures, sizes, gate verdicts)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import get_client
from prefect.tasks import Task

if TYPE_CHECKING:
    pass

from flows import raycluster
from flows.runreport import publish_run_artifacts, run_rows, start_all, wait_all
from flows.slots import ensure_limit, model_limit, slot
from flows.steps import prefect_runner, ray_batches
from flows.tasks import gpu_slot, plan_source
from pipelines.compose import (
    Registered,
    candidates_of,
    preflight_registration,
    registered_of,
    registration_steps,
    registry_places,
    run_report,
)
from pipelines.core.errors import ConfigError, ModelmintError, VariantsFailed
from pipelines.core.fsutil import hash_cache
from pipelines.core.settings import Settings
from pipelines.core.steps import BuildResult, VariantError, execute, variant_scoped
from pipelines.publish.oci import RegistryRef
from pipelines.registry import register as reg
from pipelines.source.catalog import COMPRESSED_VARIANTS, CatalogEntry, load_catalog
from pipelines.store.formats import ArtifactFormat, implementation, split_by_format
from pipelines.store.names import NAMES, Format, owner

R = TypeVar("R")


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


# ---------------------------------------------------------------- "is the cached plan still there?"


def _source_current(plan: Any) -> bool:
    """A cached plan stands while its build directory exists and its source files are the ones it was made from."""
    hashes = hash_cache(plan.settings)
    try:
        return plan.out_dir.is_dir() and all(
            hashes.sha256(plan.snapshot.path / rel) == sha for rel, sha in plan.snapshot.files.items()
        )
    except (FileNotFoundError, NotADirectoryError):
        return False


# ---------------------------------------------------------------- the flow


@flow(name="convert", flow_run_name="{model}", log_prints=True, task_runner=raycluster.RunTaskRunner())
def convert(model: str, variants: list[str] | None = None, revision: str | None = None,
            force: bool = False) -> dict[str, Any]:
    """Build, validate, register and publish the variants of one catalog model.

    `variants` names what to build instead of the catalog's list: GGUF quant types (q4_k_m, q8_0, …) and
    compressed-tensors schemes (fp8, awq, …); `revision` overrides the pinned commit; `force` registers a source
    commit older than a tag's current version (pipelines.registry.register.refuse_older).
    """
    settings = Settings.from_env()
    entry = load_catalog(settings.catalog_path).get(model)
    by_format = split_variants(entry, variants)
    # Refused before any work: a variant no dvc.yaml stage records, a signing key that cannot sign.
    preflight_registration(settings, entry, [v for asked in by_format.values() for v in asked])
    oci = oci_registry(settings)
    if settings.ray_address:
        _check_cluster(settings, by_format)
    with get_client(sync_client=True) as client:
        ensure_limit(client, model_limit(model), 1)
    with slot(model_limit(model), prefect_home=settings.prefect_dir):
        results: list[BuildResult] = []
        registered = Registered()
        header: list[str] = []
        # Each format, and inside it each variant, fails on its own: the others are still built, validated,
        # registered and reported; the run fails at the end, naming every failure and its cause.
        for name, asked in by_format.items():
            if not asked:
                continue
            fmt = implementation(name)
            try:
                lines, result = _build(fmt, entry, settings, asked, revision)
            except Exception as err:
                if not variant_scoped(err):
                    raise
                lines, result = [], _all_failed(entry.name, asked, err)
            header += lines
            results.append(result)
            if result.plan is not None:
                # the f16 and its reference logits go once every variant passed, before registration: what follows
                # reads only the variants (MODELMINT_KEEP_SCRATCH keeps them)
                reg.drop_scratch(settings, fmt.scratch(result.plan), result)
                # the registration steps the CLI runs (pipelines/compose.py), one task each: register-<v> (place,
                # dvc commit, push, manifest; dvc.lock restored on failure), then publish-image-<v> with an OCI
                # registry: only what passed its gate, each variant on its own
                listed = registration_steps(settings, candidates_of(fmt, result), force=force, oci=oci,
                                            say=logging.getLogger("pipelines.compose").info)
                done = execute(listed, prefect_runner(settings), progress=get_run_logger().info)
                ran = registered_of(done, result.passed)
                registered.update(ran)
        registrations, published = registered.registrations, registered.published
        report = run_report(
            entry.name, results, registered.refs, registered.errors,
            header=header, dvc_paths={v: r.manifest.dvc.path for v, r in registrations.items()},
            published={v: (p.images, p.digest) for v, p in published.items()})
        summary = publish_run_artifacts(settings, report, registrations, published)
    causes: dict[str, str] = {}
    advice: dict[str, str] = {}
    for r in results:
        if isinstance(failure := r.failure(registered.errors), VariantsFailed):
            causes.update(failure.causes)
            advice.update(failure.advice)
    if causes:
        raise VariantsFailed([line.variant for line in report.lines], causes, advice)
    return summary


def _check_cluster(settings: Settings, by_format: dict[Format, list[str]]) -> None:
    """On Ray: every step's resources are offered by some node, and every node sees this run's storage and
    has the toolchains the asked formats need (flows.raycluster)."""
    raycluster.ship_by_value(convert.fn.__module__)
    raycluster.check_resources(settings)
    needed = [p for name, asked in by_format.items() if asked and (p := implementation(name).toolchain(settings))]
    for node in raycluster.probe_nodes(settings, needed):
        get_run_logger().info("Ray node %s on %s: sees the work directory and the toolchains",
                              node["node"][:12], node["host"])


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
        return {name: names.catalog_variants(entry) for name, names in NAMES.items()}
    names = [v.strip().lower() for v in variants if v.strip()]
    unknown = [v for v in names if owner(v) is None]
    if unknown or not names:
        raise ConfigError(
            f"variants {unknown or variants} name no GGUF quant type or compressed scheme",
            hint=f"e.g. variants=[\"q4_k_m\", \"q8_0\"] or [\"fp8\"]; schemes: {sorted(COMPRESSED_VARIANTS)}",
        )
    return split_by_format(names)


def _build(
    fmt: ArtifactFormat, entry: CatalogEntry, settings: Settings, asked: list[str], revision: str | None
) -> tuple[list[str], BuildResult]:
    """One format's build as the CLI runs it (its plan, its step list, its summary file), each step a task."""
    log = get_run_logger()
    fmt.stepwise()  # a format without them fails its variants here, before its plan task
    result = fmt.build_by(
        prefect_runner(settings), entry, settings, variants=asked, progress=log.info, warn=log.warning,
        plan=lambda: _cached(plan_source, _source_current, fmt.name, entry, settings, revision, asked),
        arrange=lambda steps: ray_batches(steps, settings), gpu_slot=functools.partial(gpu_slot, settings.without_secrets()),
        places=registry_places(settings, oci=oci_registry(settings)),
    )
    return fmt.header(result), result


def oci_registry(settings: Settings) -> RegistryRef | None:
    """The OCI registry the run publishes to (MODELMINT_OCI_REGISTRY), checked before any work; None: not asked.

    Raises:
        ConfigError: not HOST[:PORT]/NAMESPACE.
    """
    if not settings.oci_registry:
        return None
    return RegistryRef.parse(settings.oci_registry, insecure=settings.oci_insecure)


# ---------------------------------------------------------------- every catalog model: `convert/all`


@flow(name="convert", flow_run_name="all", log_prints=True)
def convert_all(models: list[str] | None = None, variants: list[str] | None = None) -> dict[str, Any]:
    """Run `convert/<name>` for every catalog model (or those named), as runs of their own deployments.

    Each run holds its model's `model-<name>` slot and its GPU steps a `gpu` slot, as when started alone, and
    runs wherever a worker (and, with MODELMINT_RAY_ADDRESS, Ray) has room. The runs are started at once with an
    idempotency key per model and this run, so a retried fan-out never starts a model twice; this run waits for
    all of them and publishes one table of every variant's figures and verdict.
    """
    settings = Settings.from_env()
    catalog = load_catalog(settings.catalog_path)
    names = [catalog.get(m).name for m in models] if models else [m.name for m in catalog.models]
    started = start_all(names, variants)
    finished = wait_all(started)
    rows, failed = [], {}
    with get_client(sync_client=True) as client:
        for name, run in finished.items():
            if not run.state.is_completed():
                failed[name] = run.state.message or run.state.name
            rows += [{"model": name, **r} for r in run_rows(client, run.id, name)]
    create_table_artifact(rows, key="convert-all", description=f"every variant of {len(names)} models")
    if failed:
        raise ModelmintError(
            f"{len(failed)} of {len(names)} models failed: " + "; ".join(f"{n}: {m}" for n, m in sorted(failed.items())),
            hint="the table artifact convert-all has every variant; each model's own run names its causes "
            "(`prefect flow-run logs <id>`); the others finished",
        )
    return {"models": names, "variants": rows}
