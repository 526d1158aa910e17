"""The typed variant report: one serialization for the file and its hash, earlier shapes read on load, the run report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipelines.core.gates import Gate
from pipelines.core.report import (
    CompressedReport,
    Figures,
    GGUFReport,
    Validation,
    VariantReport,
    advice_for_report,
    card_validation,
    parse_report,
    read_report,
)
from pipelines.core.steps import BuildResult, VariantOutcome, load_report

DATA = Path(__file__).parent / "data"


def _judged(mean_kl: float = 0.00127) -> Validation:
    return Validation.judge(format="gguf", reference="m-f16.gguf",
                            evaluation={"text": "eval.txt", "sha256": "e" * 64, "ctx": 128, "chunks": 16},
                            figures=Figures.of(mean_kl=mean_kl, same_top_pct=99.1, ppl_reference=20.41, ppl=20.4565),
                            gate=Gate(0.005, 97.0, 1.02, "tiny-model profile"))


def test_a_version_1_gguf_report_still_loads_with_its_verdict_and_cannot_be_registered() -> None:
    """tests/data/report-v1-gguf.json has the keys validate.VariantReport.to_dict wrote before the validation block
    (commit c47b857^): the verdict at the top level, llama-perplexity's figures under `kld`."""
    report = load_report(DATA / "report-v1-gguf.json", None)
    assert isinstance(report, GGUFReport) and report.validation is None
    assert report.passed is True and report.failures == [] and report.kld and report.kld.mean_kld == 0.00127
    assert report.sha256 == "50736d0c7af9b42459f414a1ecdc98dffbafe204f8735253bf0355ebba70330b"
    assert card_validation(report) == {"passed": True}
    assert "q4_k_m" in advice_for_report("q4_k_m", report)

    from pipelines.store.candidate import ValidatedOutputChanged, verdict

    with pytest.raises(ValidatedOutputChanged, match="predates its validation block"):
        verdict(report)


def test_a_report_with_run_time_keys_loads_without_them(tmp_path: Path) -> None:
    """A compressed report holding `serve_config` (a run-time key an earlier version kept beside the report) reads as
    a CompressedReport without it; written again, it reads back as the same report."""
    report = read_report(DATA / "report-v2-compressed.json")
    assert isinstance(report, CompressedReport) and report.scheme == "FP8_DYNAMIC"
    assert "serve_config" not in report.model_fields_set and report.judged.passed
    assert report.judged.figures is not None and report.judged.figures.mean_kl == 0.0011
    report.write(tmp_path / "r.json")
    again = read_report(tmp_path / "r.json")
    assert again == report and again.to_json() == report.to_json()


def test_one_serialization_for_the_file_and_its_hash(tmp_path: Path) -> None:
    """A report just measured (its dicts in any order) and the same report read back are equal, iterate alike and
    serialize to the same bytes, whose sha256 is the file's: registration needs no JSON round trip of its own."""
    fresh = GGUFReport(variant="q4_k_m", key="k", toolchain={"llama.cpp": "1", "llama-cpp-python-sdist": "2"},
                       gguf={"tensor_count": 1, "architecture": "qwen2"}, smoke=None, validation=_judged())
    path = tmp_path / "q4_k_m.report.json"
    fresh.write(path)
    back = load_report(path, "k")
    assert back == fresh and back is not None and list(back.toolchain or {}) == list(fresh.toolchain or {}) == [
        "llama-cpp-python-sdist", "llama.cpp"]
    assert path.read_text() == fresh.to_json() == back.to_json()
    assert fresh.file_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "passed" not in json.loads(path.read_text())  # only the fields it was given: no version-1 nulls
    assert load_report(path, "another key") is None


def test_unknown_keys_are_not_a_report(tmp_path: Path) -> None:
    path = tmp_path / "x.report.json"
    path.write_text(json.dumps({"variant": "q8_0", "validation": None, "surprise": 1}))
    assert read_report(path) is None
    with pytest.raises(ValueError, match="surprise"):
        parse_report({"variant": "q8_0", "validation": None, "surprise": 1})


def test_the_cli_and_the_flow_show_the_same_run_report_table(tmp_path: Path) -> None:
    """The CLI's rich table and the flow's data rows come from one RunReport; a variant refused before the work and
    one that failed its gate both appear, with their causes."""
    from pipelines.cli._tables import rich_table
    from pipelines.compose import run_report
    from pipelines.core.errors import ShapeRefused
    from pipelines.core.steps import VariantError

    def outcome(q: str, mean_kl: float) -> VariantOutcome:
        return VariantOutcome(q, tmp_path / f"{q}.gguf", "0" * 64, 1 << 20,
                              VariantReport(variant=q, validation=_judged(mean_kl)), cached=False)

    refused = VariantError.of("q4_0", "preflight", ShapeRefused("q4_0", "rows of 40", layers=["a"], works=[], hint="h"))
    result = BuildResult("m", tmp_path, {}, {}, {"q8_0": outcome("q8_0", 0.001), "q2_k": outcome("q2_k", 0.5)}, [],
                         errors={"q4_0": refused}, asked=["q8_0", "q2_k", "q4_0"])
    report = run_report("m", [result], {"q8_0": "m:q8_0"})
    columns, rows = report.table()
    table = rich_table(report)
    assert [c.header for c in table.columns] == columns
    assert columns[:2] == ["variant", "built"] and columns[-1] == "cause of failure"
    cells = {row[0].text: {c: cell.text for c, cell in zip(columns, row, strict=True)} for row in rows}
    assert cells["q8_0"]["registered"] == "m:q8_0" and cells["q8_0"]["gate"] == "pass"
    assert cells["q8_0"]["mean KL (max)"] == "0.00100 (0.005)"
    assert cells["q2_k"]["gate"].startswith("FAIL: mean KL") and cells["q2_k"]["cause of failure"].startswith("gate:")
    assert cells["q4_0"]["built"] == "refused" and cells["q4_0"]["mean KL (max)"] == "-"
    data = {r["variant"]: r for r in (line.data() for line in report.lines)}
    assert data["q8_0"]["registered"] == "m:q8_0" and data["q2_k"]["registered"] == "" and data["q8_0"]["size_mib"] == 1.0
    assert report.failed == ["q2_k", "q4_0"]
