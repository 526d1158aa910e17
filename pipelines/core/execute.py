"""One step list per build, planned once and run by a pluggable runner (DVC's plan_repro, then _reproduce(repro_fn)).

A format turns its plan into `Step`s (pipelines/gguf/build.py `gguf_steps`, pipelines/compressed/build.py
`compressed_steps`): each names what it makes (its content key and output), how to make it (`run`, which skips by
its receipt on its own), whether a result handed back by a cache still stands (`current`), what it needs, and the
variants it serves. `execute` walks the list in order with keep-going: a step that fails costs only its variants
(kept as VariantError, the steps that need it are not run) unless it serves them all (fetch, convert: the build
fails). How a batch of steps runs is the runner's business: `local_runner` here (a thread pool, for the CLI), or
the Prefect runner in flows/steps.py (one task per step, with its cache key, retries, tags and Ray placement).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pipelines.core.steps import VariantError, keep_failure, timed_phase

P = TypeVar("P")
R = TypeVar("R")

Inputs = dict[str, Any]
"""The results of the steps a step needs, by step name."""


def _none(_inputs: Inputs) -> None:
    return None


def _always(_result: Any) -> bool:
    return True


def _no_tools(_result: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class Step:
    """One resumable step of a build: what it makes, from what, and how."""

    name: str
    """Unique in its list: convert, quantize-q4_k_m, validate-q8_0, compress-fp8."""
    task: str
    """The kind of step (convert, quantize, validate, compress, …): the orchestrator's task name and tag."""
    run: Callable[[Inputs], Any]
    """Make the output (or find it finished by its receipt) and return the step's result."""
    key: Callable[[Inputs], str | None] = _none
    """The content key of what it makes, given its inputs (None: not cacheable by an orchestrator)."""
    output: Path | None = None
    """Where its output lives (part of an orchestrator's cache key: two checkouts never share a result)."""
    current: Callable[[Any], bool] = _always
    """Whether a result an orchestrator's cache hands back still stands (its output is there and unchanged)."""
    needs: tuple[str, ...] = ()
    """Steps whose results it takes; it is not run when any failed (or, with `needs_any`, when all failed)."""
    needs_any: bool = False
    variants: tuple[str, ...] = ()
    """The variants it serves: its failure is theirs. Empty: it serves every variant, and its failure ends the build."""
    stage: str = "build"
    """The stage its failures are recorded under (build, validate)."""
    phase: str = ""
    """The timings bucket its wall time adds to (default: its task)."""
    say: Callable[[Inputs], str | None] = _none
    """What to tell the user before it runs (None: nothing, e.g. its output is finished already)."""
    tools: Callable[[Any], list[str]] = _no_tools
    """The tools its run started, from its result (the build's tools_run)."""
    group: str | None = None
    """Consecutive steps of one group run together, `width` at a time."""
    width: int = 1
    threads: int | None = None
    """The threads its tool is given (the orchestrator's resources follow it)."""
    place: str | None = None
    """The Ray resources it asks for (flows.raycluster step names: quantize, validate, compress)."""
    retries: int = 1
    """How often an orchestrator retries it after a transient failure."""
    retry_delays: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class PerVariant:
    """What a step serving several variants returns when some of them failed inside it (the others' results)."""

    outcomes: dict[str, Any]
    errors: dict[str, VariantError] = field(default_factory=dict)


@dataclass
class StepList:
    """A format's plan as steps: what to run, and what was decided before any of it (refusals, pre-flight)."""

    steps: list[Step]
    errors: dict[str, VariantError] = field(default_factory=dict)
    """Variants refused before the work (they have no steps)."""
    preflight: dict[str, Any] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    """Every variant the run was asked for, in order."""


@dataclass
class Executed:
    """What running a step list left: every finished step's result, every variant's failure, the tools run, timings."""

    results: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, VariantError] = field(default_factory=dict)
    tools_run: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


Batch = list[tuple[Step, Inputs]]
Runner = Callable[[Batch], list[Any]]
"""Runs a batch of ready steps; returns, in order, each one's result or the exception it raised."""


def _batches(steps: list[Step]) -> list[list[Step]]:
    out: list[list[Step]] = []
    for s in steps:
        if out and s.group is not None and out[-1][0].group == s.group:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def execute(
    steps: list[Step],
    runner: Runner,
    *,
    progress: Callable[[str], None] = lambda _msg: None,
    errors: dict[str, VariantError] | None = None,
    timings: dict[str, float] | None = None,
) -> Executed:
    """Run `steps` in order through `runner`, keep going past a variant's failure, and collect what they left.

    Raises:
        ModelmintError: a step serving every variant failed (the build cannot go on); any error that is not a
            variant's own (a full disk, a missing toolchain: steps.variant_scoped).
    """
    done = Executed(
        errors=errors if errors is not None else {}, timings=timings if timings is not None else {}
    )
    for batch in _batches(steps):
        ready: Batch = []
        for s in batch:
            got = {n: done.results[n] for n in s.needs if n in done.results}
            if (len(got) < len(s.needs) and not s.needs_any) or (s.needs and not got):
                continue  # what it needs failed: its variants already carry that failure
            if s.variants and all(v in done.errors for v in s.variants):
                continue
            ready.append((s, got))
        if not ready:
            continue
        for s, got in ready:
            if msg := s.say(got):
                progress(msg)
        with timed_phase(done.timings, ready[0][0].phase or ready[0][0].task):
            outcomes = runner(ready)
        for (s, _got), result in zip(ready, outcomes, strict=True):
            if isinstance(result, BaseException):
                if not s.variants or not isinstance(result, Exception):
                    raise result
                for v in s.variants:
                    progress(f"{v} failed: {keep_failure(done.errors, v, s.stage, result).cause}")
                continue
            done.results[s.name] = result
            if isinstance(result, PerVariant):
                done.errors.update(result.errors)
            done.tools_run += s.tools(result)
    return done


def _call(s: Step, got: Inputs) -> Any:
    try:
        return s.run(got)
    except Exception as err:
        return err


def local_runner(batch: Batch) -> list[Any]:
    """Run a batch here: one step in this thread, a group in a thread pool `width` wide (the CLI's runner)."""
    if len(batch) == 1:
        return [_call(*batch[0])]
    with ThreadPoolExecutor(max_workers=max(1, batch[0][0].width)) as pool:
        futures = [pool.submit(functools.partial(_call, s, got)) for s, got in batch]
    return [f.result() for f in futures]


def build_with(
    runner: Runner,
    what: str,
    plan: Callable[[], P],
    steps: Callable[[P], StepList],
    finish: Callable[[P, StepList, Executed, Callable[[str], None]], R],
    *,
    progress: Callable[[str], None] = lambda _msg: None,
    warn: Callable[[str], None] | None = None,
    arrange: Callable[[list[Step]], list[Step]] = lambda steps: steps,
) -> R:
    """A build as every front-end runs it: the plan (fetch, timed), its step list, the list run by `runner`
    (the CLI's `local_runner`, the flow's Prefect runner), then the format's finish (its summary file).

    `warn` is told what the finish and the list found wrong before any work (a refused variant); default
    `progress`. `arrange` regroups the list for the runner (on Ray, every validate step at once).
    """
    timings: dict[str, float] = {}
    progress(f"fetch {what}")
    with timed_phase(timings, "fetch"):
        planned = plan()
    listed = steps(planned)
    done = execute(arrange(listed.steps), runner, progress=progress, errors=listed.errors, timings=timings)
    return finish(planned, listed, done, warn or progress)
