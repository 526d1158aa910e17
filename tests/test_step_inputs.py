"""A GGUF step takes its inputs from the results of the steps it needs, and its cache key is its receipt's key.

Real llama.cpp on the bundled tiny-qwen2 (q8_0 only): convert, quantize, the f16's reference logits as a step of
their own, and the check; real llmcompressor for its fp8 checkpoint and its check. The Prefect cache key
(flows.tasks._step_key) is read from the same step lists.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from flows.tasks import _step_key
from pipelines.compressed.build import CompressPlan, compressed_steps, plan_compressed
from pipelines.core.errors import ArtifactError
from pipelines.core.fsutil import sha256_file
from pipelines.core.settings import Settings, project_root
from pipelines.core.steps import (
    Executed,
    Step,
    StepResult,
    content_key,
    execute,
    local_runner,
    receipt_path,
    write_receipt,
)
from pipelines.core.texts import TextRef
from pipelines.gguf.build import GGUFPlan, gguf_steps, plan_gguf
from pipelines.source.catalog import load_catalog

pytestmark = pytest.mark.slow

CATALOG = project_root() / "registry" / "catalog.yaml"


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> GGUFPlan:
    base = Settings.from_env()
    settings = Settings(home=base.home, work_dir=tmp_path_factory.mktemp("work"), catalog_path=CATALOG,
                        threads=base.threads)
    return plan_gguf(load_catalog(CATALOG).get("tiny-qwen2"), settings, quants=["q8_0"])


@pytest.fixture(scope="module")
def done(plan: GGUFPlan) -> Executed:
    return execute(gguf_steps(plan).steps, local_runner)


def _steps(plan: GGUFPlan) -> dict[str, Step]:
    return {s.name: s for s in gguf_steps(plan).steps}


def _inputs(step: Step, done: Executed) -> dict[str, Any]:
    return {n: done.results[n] for n in step.needs}


def _prefect_key(step: Step, got: dict[str, Any]) -> str | None:
    return _step_key(None, {"step": step, "inputs": got})


def test_the_reference_logits_are_a_step_every_check_takes(plan: GGUFPlan, done: Executed) -> None:
    steps = _steps(plan)
    assert steps["reference-logits"].needs == ("convert",)
    assert "reference-logits" in steps["validate-q8_0"].needs
    logits = done.results["reference-logits"]
    assert logits.path == plan.logits_path and logits.receipt["key"] == plan.logits_key
    # the quantize step does not read its output back: the check hashes it while llama-perplexity reads it
    quant = done.results["quantize-q8_0"]
    assert "sha256" not in quant.receipt
    checked = done.results["validate-q8_0"]
    assert checked.report.sha256 == sha256_file(quant.path) == checked.digest


def test_each_steps_cache_key_is_its_receipts_key(plan: GGUFPlan, done: Executed) -> None:
    steps = _steps(plan)
    made = {
        "convert": done.results["convert"].receipt["key"],
        "quantize-q8_0": done.results["quantize-q8_0"].receipt["key"],
        "reference-logits": done.results["reference-logits"].receipt["key"],
        "validate-q8_0": done.results["validate-q8_0"].report.key,
    }
    for name, receipt_key in made.items():
        step = steps[name]
        got = _inputs(step, done)
        assert step.key(got) == receipt_key, name
        assert _prefect_key(step, got) == content_key(step.task, receipt_key, str(step.output)), name


def test_texts_and_answers_change_the_check_key_and_the_report_key_alike(plan: GGUFPlan, done: Executed,
                                                                         tmp_path: Path) -> None:
    step = _steps(plan)["validate-q8_0"]
    got = _inputs(step, done)
    key = step.key(got)
    # the questions asked are part of what the report says: asking them is another key for Prefect too
    asking = dataclasses.replace(plan, spec=plan.spec.model_copy(update={"answers": True}))
    assert _steps(asking)["validate-q8_0"].key(got) != key
    # another evaluation text: new reference logits, and a report (and cache key) of its own
    text = tmp_path / "other-eval.txt"
    text.write_text(plan.evaluation.path.read_text(encoding="utf-8")[: 6000] + "\nAnother closing line.\n")
    other = dataclasses.replace(plan, evaluation=TextRef("other-eval.txt", sha256_file(text), text))
    other_done = execute(gguf_steps(other).steps, local_runner)
    other_step = _steps(other)["validate-q8_0"]
    other_key = other_step.key(_inputs(other_step, other_done))
    assert other_key != key
    assert other_done.results["validate-q8_0"].report.key == other_key
    assert other_done.results["validate-q8_0"].report.evaluation["sha256"] == sha256_file(text)


def test_a_check_takes_the_quant_it_is_given_not_the_quant_receipt(plan: GGUFPlan, done: Executed) -> None:
    step = _steps(plan)["validate-q8_0"]
    got = _inputs(step, done)
    quant = got["quantize-q8_0"]
    receipt_path(quant.path).unlink()  # only the step's result says the quant is finished now
    outcome = step.run(got)
    assert outcome.path == quant.path and outcome.digest == sha256_file(quant.path)
    assert outcome.report.key == step.key(got)


def test_a_quant_changed_after_its_step_gets_no_report(plan: GGUFPlan, done: Executed) -> None:
    """The check hashes the variant while it measures it (the quantize step's receipt holds no sha256): a file
    that is no longer the one its step made (here: touched, so another mtime) is named, and no report is written
    for it, though llama-perplexity measured it."""
    step = _steps(plan)["validate-q8_0"]
    got = _inputs(step, done)
    quant = got["quantize-q8_0"]
    report = plan.report_path("q8_0")
    report.unlink()
    st = quant.path.stat()
    os.utime(quant.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    try:
        with pytest.raises(ArtifactError, match="changed or went away since its step made it") as err:
            step.run(got)
        assert "modelmint convert tiny-qwen2" in (err.value.hint or "")
        assert not report.exists()
    finally:
        os.utime(quant.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert step.run(got).digest == sha256_file(quant.path) and report.is_file()


def test_a_quant_made_again_to_other_bytes_is_measured_again(plan: GGUFPlan, done: Executed) -> None:
    """A report is keyed by the quantize step's inputs and names the variant's sha256: a variant made again
    under the same key whose bytes differ (here the f16 in its place, with a current receipt) is measured
    again, not handed the report of the bytes it replaced, and a cache hit of the old result no longer
    stands."""
    step = _steps(plan)["validate-q8_0"]
    got = _inputs(step, done)
    quant = got["quantize-q8_0"]
    first = step.run(got)
    assert first.cached and step.current(first)
    kept = quant.path.read_bytes()
    extra = {k: v for k, v in quant.receipt.items() if k not in ("key", "size", "mtime_ns")}
    try:
        shutil.copyfile(plan.base_path, quant.path)
        made = write_receipt(quant.path, quant.receipt["key"], digest=False, **extra)
        other = StepResult(quant.path, made, ran=True)
        assert step.key({**got, "quantize-q8_0": other}) == step.key(got)
        assert not step.current(first)
        again = step.run({**got, "quantize-q8_0": other})
        assert not again.cached and again.digest == sha256_file(plan.base_path) == again.report.sha256
    finally:
        quant.path.write_bytes(kept)
        made = write_receipt(quant.path, quant.receipt["key"], digest=False, **extra)
        restored = StepResult(quant.path, made, ran=True)
        done.results["quantize-q8_0"] = restored
        assert step.run({**got, "quantize-q8_0": restored}).digest == first.digest


# ---------------------------------------------------------------- compressed-tensors: fp8 on the same model


@pytest.fixture(scope="module")
def compressed(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompressPlan, Executed]:
    base = Settings.from_env()
    settings = Settings(home=base.home, work_dir=tmp_path_factory.mktemp("compress"), catalog_path=CATALOG,
                        threads=base.threads)
    plan = plan_compressed(load_catalog(CATALOG).get("tiny-qwen2"), settings, schemes=["fp8"])
    return plan, execute(compressed_steps(plan).steps, local_runner)


def test_the_compressed_check_key_is_its_reports_key(compressed: tuple[CompressPlan, Executed]) -> None:
    from pipelines.compressed.build import validate_key as compressed_validate_key

    plan, done = compressed
    step = next(s for s in compressed_steps(plan).steps if s.name == "validate")
    got = _inputs(step, done)
    report = done.results["validate"].outcomes["fp8"].report
    assert step.key(got) == compressed_validate_key(plan, {"fp8": got["compress-fp8"]})
    assert step.key(got) == content_key({"fp8": report.key})
    assert _prefect_key(step, got) == content_key(step.task, content_key({"fp8": report.key}), str(step.output))


def test_the_compressed_check_takes_the_checkpoint_it_is_given(compressed: tuple[CompressPlan, Executed]) -> None:
    plan, done = compressed
    step = next(s for s in compressed_steps(plan).steps if s.name == "validate")
    got = _inputs(step, done)
    made = got["compress-fp8"]
    receipt_path(made.path).unlink()  # only the step's result says the checkpoint is finished now
    checked = step.run(got)
    assert checked.errors == {}
    assert checked.outcomes["fp8"].digest == made.receipt["tree_sha256"] and checked.outcomes["fp8"].cached
