"""The convert flow's tasks: the plan (fetch), a format's steps (`run_step`, one task run each: flows/steps.py),
register, publish and publish-image, with their cache keys, retries and the GPU slot.

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
from pipelines.core.execute import Step
from pipelines.core.settings import Settings
from pipelines.core.steps import content_key
from pipelines.publish.oci import RegistryRef
from pipelines.registry import register as reg
from pipelines.registry.formats.base import implementation
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


def _plan_key(_ctx: Any, p: dict[str, Any]) -> str:
    entry: CatalogEntry = p["entry"]
    return content_key("fetch", p["format"], entry.model_dump(mode="json"), p["revision"], p["variants"],
                       _settings_key(p["settings"]))


def _step_key(_ctx: Any, p: dict[str, Any]) -> str | None:
    """A step's content key (pipelines.core.execute.Step.key, from its inputs' receipts) with its kind and where
    its output is written: two checkouts sharing one Prefect server must not be handed each other's outputs."""
    step: Step = p["step"]
    key = step.key(p["inputs"])
    return None if key is None else content_key(step.task, key, str(step.output))


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


@task(name="fetch", task_run_name="fetch", cache_key_fn=_plan_key, retries=3, retry_delay_seconds=[5, 30, 120],
      retry_condition_fn=_transient, **_CACHED)
def plan_source(format: str, entry: CatalogEntry, settings: Settings, revision: str | None,
                variants: list[str] | None) -> Any:
    """Fetch the source and plan one format's build (its plan hook); the plan is this task's cached result."""
    plan = implementation(format).stepwise().plan(entry, settings, variants=variants, revision=revision)
    # The plan is stored as this task's cached result: keep the token and registry credentials out of it.
    return dataclasses.replace(plan, settings=plan.settings.without_secrets())


@task(name="step", cache_key_fn=_step_key, retries=1, retry_condition_fn=_transient, **_CACHED)
def run_step(step: Step, inputs: dict[str, Any]) -> Any:
    """One step of a format's step list (pipelines.core.execute); flows.steps gives each its name, retries and tags."""
    return step.run(inputs)


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


def gpu_slot() -> AbstractContextManager[Any]:
    """One slot of the `gpu` global limit (flows.slots: strict, holder named, waits said, release never fatal)."""
    return slot(GPU_LIMIT, prefect_home=Settings.from_env().prefect_dir)


