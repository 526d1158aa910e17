"""The Prefect executor of a format's step list: each step one task run (flows.tasks.run_step), named after the step,
cached by its content key, retried on transient errors, tagged with its kind and variants, and placed on Ray where
the step asks for resources. What runs, in which order, and what a failure costs is pipelines.core.steps's: the
CLI's local executor and this one run the same list.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from prefect import get_run_logger
from prefect.tasks import Task

from flows import raycluster
from flows.tasks import run_step
from pipelines.core.settings import Settings
from pipelines.core.steps import Batch, Step, local_runner


def _task(step: Step) -> Task[..., Any]:
    delays: list[float] | float = (
        [float(d) for d in step.retry_delays] if len(step.retry_delays) > 1 else float(step.retry_delays[0])
    )
    return run_step.with_options(
        name=step.task,
        task_run_name=step.name,
        retries=step.retries,
        retry_delay_seconds=delays,
        # no tags: Prefect 3.9.1 acquires a `tag:<tag>` concurrency slot on the server for every tag of a task run
        # before it starts (prefect/task_engine.py:986-991), so with the server restarting a tagged step fails with
        # ConcurrencySlotAcquisitionError instead of waiting; modelmint's slots (flows/slots.py) are leased and
        # survive a restart. The run name carries the step and its variant.
    )


@contextlib.contextmanager
def _placed(settings: Settings, step: Step) -> Iterator[None]:
    if step.place is None:
        yield
        return
    with raycluster.placed(settings, step.place):
        yield


def prefect_runner(settings: Settings) -> Callable[[Batch], list[Any]]:
    """A runner for pipelines.core.steps.execute: submit the batch's steps as tasks, then wait for each.

    A cached result whose output is gone or changed (`Step.current`, asked of cache hits only) is not a hit: that
    step runs again with its cache refreshed. An `inline` step (bookkeeping) runs in the flow, with no task. A group
    is sent `width` steps at a time (llama-quantize keeps about two cores busy).
    """

    def run(batch: Batch) -> list[Any]:
        width = max(1, batch[0][0].width)
        return [r for i in range(0, len(batch), width) for r in _wave(batch[i : i + width])]

    def _wave(batch: Batch) -> list[Any]:
        if batch[0][0].inline:  # bookkeeping (a build's finish): run in the flow itself, no task of its own
            return local_runner(batch)
        with _placed(settings, batch[0][0]):
            futures = [_task(s).submit(s, got) for s, got in batch]
        out: list[Any] = []
        for (s, got), fut in zip(batch, futures, strict=True):
            try:
                result = fut.result()
                # only a cache hit is checked: a result the task just made is current by construction (checking it
                # would read its outputs again: a registration's remote copy, 12 GB at 7B, hashed a second time)
                if fut.state.name == "Cached" and not s.current(result):
                    get_run_logger().info("%s: cached output is gone or changed, running it again", s.name)
                    with _placed(settings, s):
                        result = _task(s).with_options(refresh_cache=True).submit(s, got).result()
            except Exception as err:
                out.append(err)
                continue
            out.append(result)
        return out

    return run


def ray_batches(steps: list[Step], settings: Settings) -> list[Step]:
    """On Ray, the validate steps of a list form one group (sent at once); elsewhere the list as it is."""
    if not settings.ray_address:
        return steps
    import dataclasses

    return [
        # every one at once, whatever width the list chose from this machine's memory: Ray places each on a worker
        dataclasses.replace(s, group=s.group or "validate", width=len(steps)) if s.task == "validate" else s
        for s in steps
    ]
