"""One run, one step list: how `execute` walks a list whose steps plan more steps (a fetch's build, its finish and its
registrations), keeps going past a build that fails as a whole, hands a finish the record of its own steps, and
passes over a step with nothing to do. The steps here are plain functions: what they exercise is the executor
itself, which both the CLI's local runner and the flow's Prefect runner drive."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.core.errors import DiskFullError, SourceError
from pipelines.core.steps import RECORD, Executed, Inputs, Step, StepList, execute, local_runner


def _const(value: Any) -> Any:
    return lambda _got: value


def _raise(err: Exception) -> Any:
    def run(_got: Inputs) -> Any:
        raise err

    return run


def _build(fmt: str, variants: tuple[str, ...], *, fail: Exception | None = None, order: list[str]) -> Step:
    """A format's fetch whose plan lays out: convert (every variant), one step per variant, a finish, a register
    step per variant that passed ("bad" variants do not)."""

    def mark(name: str, value: Any = None) -> Any:
        def run(_got: Inputs) -> Any:
            order.append(name)
            if fail is not None and name == f"convert-{fmt}":
                raise fail
            return value if value is not None else name

        return run

    def planned(_plan: Any) -> StepList:
        steps = [Step(f"convert-{fmt}", "convert", run=mark(f"convert-{fmt}"),
                      tools=lambda _r: [f"convert {fmt}"])]
        steps += [Step(f"make-{v}", "quantize", run=mark(f"make-{v}"), needs=(f"convert-{fmt}",), variants=(v,),
                       tools=lambda r: [str(r)]) for v in variants]
        names = (f"fetch-{fmt}", *(s.name for s in steps))
        steps.append(Step(f"finish-{fmt}", "finish", run=lambda got: got[RECORD], needs=names, needs_any=True,
                          record=True, inline=True))
        steps += [Step(f"register-{v}", "register", run=mark(f"register-{v}"), needs=(f"finish-{fmt}",),
                       variants=(v,), when=lambda _got, v=v: not v.startswith("bad")) for v in variants]
        return StepList(steps, asked=list(variants))

    return Step(f"fetch-{fmt}", "fetch", run=mark(f"fetch-{fmt}", {"plan": fmt}), scope=variants, then=planned)


def test_a_fetch_lays_out_its_build_right_after_it_before_the_rest_of_the_list() -> None:
    order: list[str] = []
    last = Step("site", "site", run=lambda _got: order.append("site"), needs=("register-q4", "register-fp8"),
                needs_any=True)
    done = execute([_build("gguf", ("q4",), order=order), _build("ct", ("fp8",), order=order), last], local_runner)
    assert order == ["fetch-gguf", "convert-gguf", "make-q4", "register-q4",
                     "fetch-ct", "convert-ct", "make-fp8", "register-fp8", "site"]
    assert {"finish-gguf", "finish-ct", "site"} <= set(done.results)


def test_a_finish_takes_the_record_of_its_own_steps_only() -> None:
    order: list[str] = []
    done = execute([_build("gguf", ("q4", "q8"), order=order), _build("ct", ("fp8",), order=order)], local_runner)
    record: Executed = done.results["finish-gguf"]
    assert set(record.results) == {"fetch-gguf", "convert-gguf", "make-q4", "make-q8"}
    assert record.tools_run == ["convert gguf", "make-q4", "make-q8"]  # not the other format's
    assert set(record.timings) == {"fetch", "convert", "quantize"}
    assert done.tools_run == ["convert gguf", "make-q4", "make-q8", "convert ct", "make-fp8"]


def test_a_step_with_nothing_to_do_is_passed_over_neither_finished_nor_failed() -> None:
    order: list[str] = []
    done = execute([_build("gguf", ("q4", "bad-q2"), order=order)], local_runner)
    assert "register-q4" in order and "register-bad-q2" not in order
    assert "register-bad-q2" not in done.results and "bad-q2" not in done.errors


def test_keeping_going_a_build_that_fails_as_a_whole_fails_its_variants_and_the_next_build_runs() -> None:
    order: list[str] = []
    steps = [_build("gguf", ("q4", "q8"), fail=SourceError("the f16 could not be made"), order=order),
             _build("ct", ("fp8",), order=order)]
    done = execute(steps, local_runner, keep_going=True)
    assert {v: e.stage for v, e in done.errors.items()} == {"q4": "build", "q8": "build"}
    assert "the f16 could not be made" in done.errors["q4"].message
    assert "make-q4" not in order and "register-q4" not in order  # nothing that needs the failed step ran
    assert "register-fp8" in order
    # the failed build's finish still runs (its summary records the failure), with its variants' failures only
    assert set(done.results["finish-gguf"].errors) == {"q4", "q8"}
    assert done.results["finish-ct"].errors == {}


def test_without_keeping_going_a_build_that_fails_as_a_whole_ends_the_run() -> None:
    order: list[str] = []
    steps = [_build("gguf", ("q4",), fail=SourceError("the f16 could not be made"), order=order),
             _build("ct", ("fp8",), order=order)]
    with pytest.raises(SourceError, match="the f16 could not be made"):
        execute(steps, local_runner)
    assert "fetch-ct" not in order


def test_a_full_disk_ends_the_run_even_when_it_keeps_going() -> None:
    order: list[str] = []
    steps = [_build("gguf", ("q4",), fail=DiskFullError("the work directory is full"), order=order),
             _build("ct", ("fp8",), order=order)]
    with pytest.raises(DiskFullError):
        execute(steps, local_runner, keep_going=True)
    assert "fetch-ct" not in order


def test_a_fetch_that_fails_fails_its_variants_when_the_run_keeps_going() -> None:
    fetch = Step("fetch-gguf", "fetch", run=_raise(SourceError("the hub refused the revision")), scope=("q4", "q8"),
                 then=lambda _plan: StepList([]))
    done = execute([fetch, Step("after", "x", run=_const("ran"))], local_runner, keep_going=True)
    assert set(done.errors) == {"q4", "q8"} and done.results == {"after": "ran"}


def test_a_plan_that_repeats_a_step_name_is_refused_as_a_bug() -> None:
    fetch = Step("fetch", "fetch", run=_const(None), then=lambda _plan: StepList([Step("site", "x", run=_const(1))]))
    with pytest.raises(ValueError, match="two steps are named 'site'"):
        execute([fetch, Step("site", "site", run=_const(2))], local_runner)
