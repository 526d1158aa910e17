"""The `convert` flow: one catalog model through fetch → convert → quantize → validate → register → publish
(→ publish-image to the OCI registry MODELMINT_OCI_REGISTRY names, when it names one).

The run is pipelines.compose.run_model, the one the CLI runs: each format's step list (pipelines/core/steps.py) and
finish, then its registration steps, here one task per step (flows/steps.py). What Prefect adds:
  cache keys   from content (source commit, recipe, toolchain version, the input artifact's sha256), never
               from path strings; a hit whose output is gone or changed is run again (flows/steps.py)
  retries      only for errors that say a retry can help (ModelmintError.transient: network, 5xx, timeouts)
  concurrency  one run per model at a time (limit `model-<name>`); GPU steps hold a slot of `gpu`
  artifacts    a Markdown report and a table per run (validation figures, sizes, gate verdicts)
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import get_client

from flows import raycluster
from flows.runreport import publish_run_artifacts, run_rows, start_all, wait_all
from flows.slots import ensure_limit, model_limit, slot
from flows.steps import prefect_runner, ray_batches
from flows.tasks import gpu_slot
from pipelines.compose import registered_in, report_of, run_model
from pipelines.core.errors import ConfigError, ModelmintError, VariantsFailed
from pipelines.core.settings import Settings
from pipelines.publish.oci import RegistryRef
from pipelines.source.catalog import COMPRESSED_VARIANTS, CatalogEntry, load_catalog
from pipelines.store.formats import implementation, split_by_format
from pipelines.store.names import NAMES, Format, owner

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
    oci = oci_registry(settings)
    if settings.ray_address:
        _check_cluster(settings, by_format)
    with get_client(sync_client=True) as client:
        ensure_limit(client, model_limit(model), 1)
    log = get_run_logger()
    with slot(model_limit(model), prefect_home=settings.prefect_dir):
        # the run's one step list (pipelines/compose.py, what the CLI runs), one task per step: each format's
        # fetch, build, finish, then register-<v> and publish-image-<v> for what passed, then the site; each format,
        # and inside it each variant, fails on its own: the others are still built, registered and reported, and
        # the run fails at the end
        ran = run_model(
            entry, settings, [(implementation(name), asked) for name, asked in by_format.items()],
            runner=prefect_runner(settings), revision=revision, register=True, force=force, oci=oci,
            keep_going=True, progress=log.info, warn=log.warning,
            said_in_steps=logging.getLogger("pipelines.compose").info,
            arrange=lambda steps: ray_batches(steps, settings),
            gpu_slot=functools.partial(gpu_slot, settings.without_secrets()),
        )
        registered = registered_in(ran.runs)
        report = report_of(entry.name, ran.runs)
        summary = publish_run_artifacts(report, registered.registrations, registered.published, ran.site)
    causes: dict[str, str] = {}
    advice: dict[str, str] = {}
    for run in ran.runs:
        if isinstance(failure := run.failure(), VariantsFailed):
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
