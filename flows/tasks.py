"""The convert flow's tasks: every step of its step list (`run_step`, one task run each: flows/steps.py): the fetch,
the build, the validation, the registration and the image push, with their cache keys, retries and the GPU slot.

They live in this importable module (not in the flow's file, which Prefect loads by path as a module of its own
name) so that a task sent to another process, a Ray worker on another node, is found there by its module path.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

from prefect import task

from flows.slots import GPU_LIMIT, prefect_unreachable, slot
from pipelines.core.errors import ModelmintError
from pipelines.core.settings import Settings
from pipelines.core.steps import Step, content_key

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


def _step_key(_ctx: Any, p: dict[str, Any]) -> str | None:
    """A step's content key (pipelines.core.steps.Step.key: its receipt's key, from its inputs) with its kind and where
    its output is written: two checkouts sharing one Prefect server must not be handed each other's outputs."""
    step: Step = p["step"]
    key = step.key(p["inputs"])
    return None if key is None else content_key(step.task, key, str(step.output))


# ---------------------------------------------------------------- tasks: one pipelines step each

_CACHED: dict[str, Any] = {"persist_result": True}


@task(name="step", cache_key_fn=_step_key, retries=1, retry_condition_fn=_transient, **_CACHED)
def run_step(step: Step, inputs: dict[str, Any]) -> Any:
    """One step of a format's step list (pipelines.core.steps); flows.steps gives each its name, retries and tags."""
    return step.run(inputs)


def gpu_slot(settings: Settings) -> AbstractContextManager[Any]:
    """One slot of the `gpu` global limit (flows.slots: strict, holder named, waits said, release never fatal) on
    the Prefect of `settings` (the flow binds its own: functools.partial(gpu_slot, settings))."""
    return slot(GPU_LIMIT, prefect_home=settings.prefect_dir)


