"""Calibration and evaluation are different data, for every catalog entry and every format (no tools needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pipelines.compressed.build import compressed_texts, recipe_for
from pipelines.core.errors import ConfigError
from pipelines.core.report import CompressedReport, parse_report
from pipelines.core.settings import project_root
from pipelines.core.texts import EVAL_TEXT, TextRef, check_apart, text_ref
from pipelines.gguf.build import gguf_texts
from pipelines.source.catalog import COMPRESSED_VARIANTS, GGUFVariants, load_catalog

CATALOG = project_root() / "registry" / "catalog.yaml"
ENTRIES = load_catalog(CATALOG).models


def _overlap(a: Path, b: Path) -> list[str]:
    """Content two texts share, found independently of pipelines.core.texts: equal lines, or a run of 8 words."""
    ta, tb = a.read_text(encoding="utf-8"), b.read_text(encoding="utf-8")
    lines = {ln.strip() for ln in ta.splitlines() if len(ln.strip()) >= 30} & {
        ln.strip() for ln in tb.splitlines() if len(ln.strip()) >= 30
    }
    wa, wb = re.findall(r"\w+", ta.lower()), re.findall(r"\w+", tb.lower())
    runs = {" ".join(wa[i : i + 8]) for i in range(len(wa) - 7)} & {" ".join(wb[i : i + 8]) for i in range(len(wb) - 7)}
    return sorted(lines | runs)


def _assert_apart(calibration: TextRef, evaluation: TextRef, where: str) -> None:
    assert calibration.sha256 != evaluation.sha256, f"{where}: calibrates on the text it is measured on"
    shared = _overlap(calibration.path, evaluation.path)
    assert not shared, f"{where}: {calibration.name} and {evaluation.name} share {shared[:3]}"


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_every_gguf_plan_calibrates_on_other_text_than_it_is_measured_on(entry) -> None:
    spec = entry.variants.gguf or GGUFVariants()
    # what the plan would read if the entry turned its importance matrix on (the choice does not depend on it)
    calibration, evaluation = gguf_texts(spec.model_copy(update={"imatrix": True}))
    assert evaluation.name == EVAL_TEXT
    _assert_apart(calibration, evaluation, f"{entry.name} gguf")


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_every_compressed_plan_calibrates_on_other_text_than_it_is_measured_on(entry) -> None:
    configured = entry.variants.compressed()
    for v in COMPRESSED_VARIANTS:  # configured ones, and the defaults `--schemes` would build
        recipe = recipe_for(v, configured.get(v))
        calibration, evaluation = compressed_texts({v: recipe})
        assert evaluation.name == recipe.evaluation_text == EVAL_TEXT
        if recipe.calibration is not None:
            assert recipe.calibration.bundled == calibration.name
        _assert_apart(calibration, evaluation, f"{entry.name} {v}")


def test_the_bundled_texts_pass_the_runtime_check() -> None:
    check_apart(text_ref("train.txt"), text_ref(EVAL_TEXT))


def _ref(path: Path) -> TextRef:
    import hashlib

    return TextRef(path.name, hashlib.sha256(path.read_bytes()).hexdigest(), path)


def test_a_renamed_copy_of_the_evaluation_text_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "my-calibration.txt"
    copy.write_bytes(text_ref(EVAL_TEXT).path.read_bytes())
    with pytest.raises(ConfigError, match="is the evaluation text"):
        check_apart(_ref(copy), text_ref(EVAL_TEXT))


def test_a_calibration_text_quoting_one_evaluation_passage_is_refused(tmp_path: Path) -> None:
    evaluation = text_ref(EVAL_TEXT)
    paragraph = max(evaluation.path.read_text(encoding="utf-8").split("\n\n"), key=len)
    # reflowed and re-cased: equal by content, not by bytes or lines
    quoted = " ".join(paragraph.split()[5:20]).upper()
    mixed = tmp_path / "mixed.txt"
    mixed.write_text(text_ref("train.txt").path.read_text(encoding="utf-8") + "\n\n" + quoted + "\n")
    with pytest.raises(ConfigError, match=r"shares [0-9]+ passage") as exc:
        check_apart(_ref(mixed), evaluation)
    assert "pipelines/data/README.md" in str(exc.value.hint)


def test_a_gguf_calibration_from_the_hub_is_refused_at_the_edge() -> None:
    from pydantic import ValidationError

    hub = {"repo": "org/data", "revision": "0" * 40}
    with pytest.raises(ValidationError, match="llama-imatrix reads a local text file"):
        GGUFVariants.model_validate({"imatrix": True, "calibration": {"hub_dataset": hub}})


def test_a_compressed_model_card_names_both_texts_by_sha256() -> None:
    from pipelines.publish.vllm import VllmServeConfig, model_card

    train, evaluation = text_ref("train.txt"), text_ref(EVAL_TEXT)
    report = {
        "variant": "awq", "scheme": "W4A16_ASYM", "passed": True, "metrics": {"mean_kl": 0.002},
        "calibration": train.describe(samples=16, max_seq_length=256),
        "evaluation": {**evaluation.describe(ctx=256, chunks=8), "wall_s": 12.5},
    }  # fmt: skip
    config = VllmServeConfig.model_validate({"served-model-name": "m-w4a16-awq", "max-model-len": 2048})
    card = model_card(config, CompressedReport.read_as(parse_report(report)), None)
    front = yaml.safe_load(card.split("---\n")[1])["modelmint"]
    assert front["calibration"] == {"text": "train.txt", "sha256": train.sha256, "samples": 16, "max_seq_length": 256}
    assert front["evaluation"] == {"text": EVAL_TEXT, "sha256": evaluation.sha256, "ctx": 256, "chunks": 8}
    assert f"Calibrated on `train.txt` (sha256 `{train.sha256}`), 16 samples of up to 256 tokens." in card
    assert f"held-out `{EVAL_TEXT}` (sha256 `{evaluation.sha256}`, 8 chunks of 256 tokens)" in card
