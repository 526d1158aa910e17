"""The convert flow's tasks: one Prefect task per pipelines step, with its cache key, retries and GPU slot.

They live in this importable module (not in the flow's file, which Prefect loads by path as a module of its own
name) so that a task sent to another process, a Ray worker on another node, is found there by its module path.
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import AbstractContextManager
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.slots import GPU_LIMIT, prefect_unreachable, slot
from pipelines.core.errors import ModelmintError
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    StepResult,
    VariantOutcome,
    content_key,
)
from pipelines.gguf import build
from pipelines.gguf.build import GGUFPlan
from pipelines.publish.oci import RegistryRef
from pipelines.registry import register as reg
from pipelines.registry.images import Published, publish_image
from pipelines.source.catalog import CatalogEntry

# pipelines' INFO lines (what each step ran, what an interrupted run left and was removed) belong in the run's
# log: PREFECT_LOGGING_EXTRA_LOGGERS attaches Prefect's handler to the `pipelines` logger, but the logger's
# own level would still be the root's WARNING.
logging.getLogger("pipelines").setLevel(logging.INFO)


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




# ---------------------------------------------------------------- cache keys (content only)


def _settings_key(s: Settings) -> dict[str, str]:
    # Where outputs go is part of what a plan *is*; no credential enters a key or a stored result, and the
    # orchestration settings say nothing about the plan (Settings.plan_fields).
    return s.plan_fields()


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
    # The plan is stored as this task's cached result: keep the token and registry credentials out of it.
    return dataclasses.replace(plan, settings=plan.settings.without_secrets())


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


@task(name="publish-image", task_run_name="publish-image-{tag}", retries=3, retry_delay_seconds=[10, 60, 300],
      retry_condition_fn=_transient, cache_policy=NO_CACHE)
def push_image(settings: Settings, ref: str, tag: str, registry: RegistryRef) -> Published:
    """Push the registered variant `ref` to the OCI registry (pipelines.registry.images.publish_image).

    Not cached by Prefect: each run asks the registry (a HEAD per blob, a GET per tag) and uploads or tags only what
    it lacks, so a registry that lost the image gets it again and one that holds it is left untouched.
    """
    return publish_image(settings, ref, registry)


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


