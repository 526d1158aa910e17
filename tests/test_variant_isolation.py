"""One variant's failure does not sink the others: CLI, Prefect flow and `dvc repro`, with real tool failures.

The failing variants fail for real: tq1_0 (ternary) on tiny-qwen2 fails its quality gate by a wide margin, a
GPTQ recipe that allows only group size 128 is refused by the shape check on a 576-wide model, and an AWQ
calibration set larger than the bundled text is refused by llmc_quantize.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from registry_env import Repo, artifacts, dvc, judged, make_repo
from wide_model import write_wide_model

from pipelines.store.manifest import find_manifest, list_manifests

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build directory for the module: the f16 base and q8_0 are built once, then found by their receipts."""
    return tmp_path_factory.mktemp("work")


def test_the_summary_shows_every_variant_and_the_run_fails_at_the_end_with_each_cause(tmp_path: Path) -> None:
    from pipelines.core.errors import ShapeRefused, VariantsFailed
    from pipelines.core.gates import gguf_gate
    from pipelines.core.report import parse_report
    from pipelines.core.steps import BuildResult, VariantError, VariantOutcome

    gate = gguf_gate("q8_0", "tiny")
    def outcome(q: str, kld: float) -> VariantOutcome:
        report = parse_report({"validation": judged(kld, 99.9, gate=gate)})
        return VariantOutcome(q, tmp_path / f"{q}.gguf", "0" * 64, 1, report, cached=False)

    refused = ShapeRefused("q4_k_m", "rows of 40", layers=["a"], works=[], hint="no llama.cpp type takes rows of 40")
    result = BuildResult(
        "m", tmp_path, {}, {}, {"q8_0": outcome("q8_0", 0.0001), "q6_k": outcome("q6_k", 0.0009)}, [],
        errors={"q4_k_m": VariantError.of("q4_k_m", "preflight", refused)}, asked=["q4_k_m", "q6_k", "q8_0"],
    )
    rows = {r["variant"]: r for r in result.rows({"q8_0": "m:q8_0"}, {})}
    assert list(rows) == ["q4_k_m", "q6_k", "q8_0"]
    assert rows["q8_0"] == {"variant": "q8_0", "built": "yes", "validated": "pass", "registered": "m:q8_0", "cause": ""}
    assert rows["q6_k"]["validated"] == "FAIL" and rows["q6_k"]["cause"].startswith("gate: mean KL")
    assert rows["q4_k_m"]["built"] == "refused" and rows["q4_k_m"]["cause"] == "preflight: ShapeRefused: q4_k_m: rows of 40"
    assert result.rows()[0]["registered"] == "not asked"
    failure = result.failure()
    assert isinstance(failure, VariantsFailed) and list(failure.causes) == ["q4_k_m", "q6_k"]
    assert "2 of 3 variant(s) failed" in failure.message and "q6_k failed its quality gate" in failure.message
    assert failure.advice["q4_k_m"] == "no llama.cpp type takes rows of 40"
    assert "Try a higher-bit type (q8_0)" in failure.advice["q6_k"]
    assert "q8_0 finished as the summary shows" in (failure.hint or "")
    # a registration that failed is a failure too, with its own cause
    reg = VariantError("q8_0", "register", "RemoteUnavailable", "remote down", "rerun", True)
    assert "q8_0" in result.failure({"q8_0": reg}).causes  # type: ignore[union-attr]
    assert BuildResult("m", tmp_path, {}, {}, {"q8_0": outcome("q8_0", 0.0001)}, [], asked=["q8_0"]).failure() is None


def _cli(repo: Repo, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODELMINT, *args], env={**repo.env(), "COLUMNS": "250"}, capture_output=True, text=True,
                          cwd=cwd or repo.root)


@pytest.mark.slow
def test_a_quant_type_llama_quantize_rejects_does_not_stop_the_others(
    isolated, tmp_path: Path, work: Path, tiny_qwen2: Path
) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0", "tq1_0"]}, work=work)
    done = _cli(repo, "convert", "tiny-qwen2", "--variants", "tq1_0,q8_0", "--register")
    assert done.returncode == 1, done.stdout + done.stderr
    # the summary names both: q8_0 built, validated and registered; tq1_0 built and failed its gate
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if line.count("│") >= 5}
    assert "tiny-qwen2:q8_0" in rows["q8_0"] and "pass" in rows["q8_0"] and "ok" in rows["q8_0"]
    assert "FAIL" in rows["tq1_0"] and "gate: mean KL" in rows["tq1_0"]
    assert "1 of 2 variant(s) failed: tq1_0" in done.stderr and "Traceback" not in done.stderr
    m = find_manifest(repo.settings(), "tiny-qwen2:q8_0")
    assert m.validation.passed and m.dvc.pushed
    assert [x.ref for x in list_manifests(repo.settings()).manifests] == ["tiny-qwen2:q8_0"]
    summary = json.loads(next(work.rglob("build.json")).read_text())
    assert summary["variants"]["q8_0"]["passed"] and not summary["variants"]["tq1_0"]["passed"]


@pytest.mark.slow
def test_dvc_repro_keep_going_finishes_the_stages_that_can_finish(isolated, tmp_path: Path, work: Path) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0", "tq1_0"]}, work=work)
    assert "--keep-going" in (repo.root / "dvc.yaml").read_text()  # the generated file says how to run it
    done = dvc(repo.root, "repro", "--keep-going", check=False)
    assert done.returncode != 0, done.stdout
    lock = (repo.root / "dvc.lock").read_text()
    assert "gguf@tiny-qwen2-q8_0" in lock and "tq1_0" not in lock
    assert find_manifest(repo.settings(), "tiny-qwen2:q8_0").validation.passed


@pytest.mark.slow
def test_the_flow_registers_what_succeeded_and_fails_at_the_end_naming_the_rest(
    isolated, tmp_path: Path, work: Path, monkeypatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from flows.convert import convert

    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0", "tq1_0"]}, work=work)
    monkeypatch.setenv("MODELMINT_REPO", str(repo.root))
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(work))
    with prefect_test_harness(server_startup_timeout=180), \
            temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        state = convert(model="tiny-qwen2", variants=["tq1_0", "q8_0"], return_state=True)
        with get_client(sync_client=True) as client:
            found = {a.key: a for a in artifacts(client, state.state_details.flow_run_id)}
    assert state.is_failed()
    assert "1 of 2 variant(s) failed: tq1_0" in state.message and "failed its quality gate" in state.message
    assert find_manifest(repo.settings(), "tiny-qwen2:q8_0").dvc.pushed
    rows = {r["variant"]: r for r in json.loads(found["convert-tiny-qwen2-variants"].data)}
    assert rows["q8_0"]["registered"] == "tiny-qwen2:q8_0" and rows["q8_0"]["gate"] == "pass" and not rows["q8_0"]["cause"]
    assert rows["tq1_0"]["built"] == "yes" and rows["tq1_0"]["cause"].startswith("gate: mean KL")
    assert rows["tq1_0"]["registered"] == "" and rows["tq1_0"]["validated"] == "FAIL"
    md = found["convert-tiny-qwen2"].data
    assert "| tq1_0 | yes |" in md and "`tiny-qwen2:q8_0`" in md
    # the registry site the flow rebuilt: the registered variant, and the failed one from its report, never registered
    page = (work / "site" / "models" / "tiny-qwen2.html").read_text()
    assert 'data-ref="tiny-qwen2:q8_0"' in page and 'data-ref="tiny-qwen2:tq1_0"' in page
    assert "gate failed, not registered</span>: mean KL" in page and "Registry site: [" in md


def _wide_catalog(tmp_path: Path, model: Path, variants: dict) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": [{
        "name": "wide", "source": {"path": str(model)}, "license": "apache-2.0", "gate_profile": "tiny",
        "variants": {"gguf": None, **variants},
    }]}))
    return path


@pytest.mark.slow
def test_awq_falls_back_to_group_size_64_and_a_refused_gptq_does_not_stop_it(
    tmp_path: Path, tiny_llama: Path
) -> None:
    """On a 576-wide model (SmolLM2-135M's hidden size): AWQ's group size 128 cannot divide the projections, the
    recipe allows 64, and llmcompressor really builds with 64; GPTQ allowing only 128 is refused before the work."""
    # one layer and a small calibration set keep llmcompressor's AWQ grid search to about a minute on 2 cores
    model = write_wide_model(tmp_path / "wide-576", tokenizer_from=tiny_llama, layers=1)
    catalog = _wide_catalog(tmp_path, model, {"awq": {"calibration": {"num_samples": 4, "max_seq_length": 64}},
                                              "gptq": {"group_sizes": [128]}})
    env = {**__import__("os").environ, "MODELMINT_CATALOG": str(catalog), "MODELMINT_WORK_DIR": str(tmp_path / "w")}
    done = subprocess.run([*MODELMINT, "compress", "wide", "--schemes", "gptq,awq", "--json"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    rows = {r["variant"]: r for r in summary["summary"]}
    assert rows["gptq"]["built"] == "refused" and rows["gptq"]["cause"].startswith("preflight: ShapeRefused")
    assert "group_sizes: [64]" in summary["errors"]["gptq"]["hint"]
    assert rows["awq"]["built"] == "yes" and rows["awq"]["validated"] in ("pass", "FAIL")
    awq = summary["variants"]["awq"]
    assert awq["preflight"]["group_size"] == 64 and awq["preflight"]["fell_back"]
    qc = json.loads((Path(awq["path"]) / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["weights"]["group_size"] == 64
    report = json.loads(Path(awq["path"]).with_name(Path(awq["path"]).name + ".report.json").read_text())
    assert report["structure"] is not None and report["preflight"]["group_size"] == 64  # the structure check agreed
    assert not [p for p in (tmp_path / "w").rglob("*gptq*")]  # nothing was started for the refused one
    assert "gptq" in done.stderr and "refused" in done.stderr


@pytest.mark.slow
def test_k_quant_fallback_is_predicted_before_the_build_and_matches_llama_quantize(
    isolated, tmp_path: Path, tiny_llama: Path
) -> None:
    from pipelines.core.settings import Settings
    from pipelines.gguf.build import build_gguf
    from pipelines.source.catalog import load_catalog

    model = write_wide_model(tmp_path / "wide-576", tokenizer_from=tiny_llama)
    catalog = _wide_catalog(tmp_path, model, {})
    raw = yaml.safe_load(catalog.read_text())
    raw["models"][0]["variants"]["gguf"] = {"quants": ["q4_k_m", "q8_0"]}
    catalog.write_text(yaml.safe_dump(raw))
    settings = Settings.from_env({**__import__("os").environ, "MODELMINT_CATALOG": str(catalog),
                                  "MODELMINT_WORK_DIR": str(tmp_path / "w")})
    result = build_gguf(load_catalog(catalog).get("wide"), settings)
    assert set(result.preflight) == {"q4_k_m", "q8_0"}
    predicted = result.preflight["q4_k_m"]
    assert 0.5 < predicted["share"] < 1 and predicted["block"] == 256
    assert result.preflight["q8_0"]["share"] == 0
    for q in ("q4_k_m", "q8_0"):
        # random weights may miss the gate: what matters here is that both were built and measured
        pre = result.variants[q].report.preflight
        assert pre["matches"] is True, pre
        assert pre["observed"]["fallback_params"] == pre["fallback_params"]
    observed = result.variants["q4_k_m"].report.preflight["observed"]
    assert observed["log_fallback_tensors"] > 0 and any(t.endswith(":Q5_0") for t in observed["tensors"])


@pytest.mark.slow
def test_convert_all_goes_on_past_a_model_that_fails(isolated, tmp_path: Path, work: Path, tiny_qwen2: Path,
                                                     monkeypatch) -> None:
    """`modelmint convert --all`: qwen2.5 cannot be fetched (the hub is off), tiny-qwen2 is still built and
    registered, and the command fails at the end naming the model that failed."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = make_repo(tmp_path, models={"qwen2.5": ["q8_0"], "tiny-qwen2": ["q8_0"]}, work=work)
    done = _cli(repo, "convert", "--all", "--variants", "q8_0", "--register")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 model(s) failed: qwen2.5" in done.stderr and "HF_HUB_OFFLINE" in done.stderr
    assert "Traceback" not in done.stderr
    assert [x.ref for x in list_manifests(repo.settings()).manifests] == ["tiny-qwen2:q8_0"]
    both = _cli(repo, "convert", "tiny-qwen2", "--all")
    assert both.returncode == 2 and "not both" in both.stderr
