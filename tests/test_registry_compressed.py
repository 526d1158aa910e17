"""Compressed-tensors variants registered like GGUF ones: DVC stage, manifest, vLLM serve config, pull, flow.

The checkpoints are tiny-qwen2's FP8 and AWQ builds made by the real llmcompressor; every module here shares
one compress work directory with test_compress.py, so each is built once per session and then found by its
receipt.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import golden
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
from prefect.testing.utilities import prefect_test_harness
from registry_env import Repo, artifacts, dvc, git, make_repo
from test_compress import compress_work_dir

from flows.convert import convert
from pipelines.compressed.build import build_compressed
from pipelines.compressed.recipes import RECIPE_FILE
from pipelines.compressed.serve import SERVE_CONFIG_FILE, VllmServeConfig, check_serve_config
from pipelines.core.errors import GateFailed
from pipelines.core.fsutil import sha256_file
from pipelines.publish.vllm import CARD_FILE
from pipelines.registry.register import register
from pipelines.source.catalog import load_catalog
from pipelines.store.formats.compressed import candidate_from_compressed
from pipelines.store.manifest import find_manifest, list_manifests, manifest_path

MODELMINT = [sys.executable, "-m", "pipelines.cli"]

pytestmark = pytest.mark.slow


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compress_work_dir(tmp_path_factory)


def _cli(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**repo.env(), "COLUMNS": "200"}
    return subprocess.run([*MODELMINT, *args], env=env, capture_output=True, text=True, cwd=repo.root)


def test_dvc_yaml_has_a_compress_stage_per_scheme(isolated, tmp_path: Path, work: Path) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0", "fp8", "awq"]}, work=work)
    stages = yaml.safe_load((repo.root / "dvc.yaml").read_text())["stages"]
    assert set(stages) == {"gguf", "compress"}
    assert set(stages["compress"]["foreach"]) == {"tiny-qwen2-fp8", "tiny-qwen2-awq"}
    assert "toolchains/llmcompressor.env" in stages["compress"]["do"]["deps"]
    listed = dvc(repo.root, "stage", "list").stdout
    assert "compress@tiny-qwen2-fp8" in listed and "gguf@tiny-qwen2-q8_0" in listed


def test_registered_fp8_and_awq_are_complete_checkpoints_with_serving_files(
    isolated, tmp_path: Path, work: Path, tiny_qwen2: Path
) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["fp8", "awq"]}, work=work)
    settings = repo.settings()
    done = _cli(repo, "compress", "tiny-qwen2", "--register")
    assert done.returncode == 0, done.stderr
    assert "tiny-qwen2:fp8 registered and pushed" in done.stderr and "tiny-qwen2:awq registered" in done.stderr

    source = load_catalog(settings.catalog_path).get("tiny-qwen2")
    locked = (repo.root / "dvc.lock").read_text()
    for tag, scheme in (("fp8", "FP8_DYNAMIC"), ("awq", "W4A16_ASYM")):
        m = find_manifest(settings, f"tiny-qwen2:{tag}")
        assert m.format == "compressed-tensors" and m.file == "model.safetensors"
        assert m.dvc.stage == f"compress@tiny-qwen2-{tag}" and m.dvc.pushed and m.dvc.md5 in locked
        assert m.parent is None and m.source.kind == "generated"
        assert m.recipe["recipe"]["scheme"] == scheme and m.toolchain["llmcompressor"] == "0.14.0.1"
        assert m.validation.figures.mean_kl <= m.validation.gate.max_mean_kl
        d = repo.root / m.dvc.path
        files = {f.path: f for f in m.files}
        assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json", RECIPE_FILE,
                SERVE_CONFIG_FILE, CARD_FILE} <= set(files)
        for f in m.files:
            assert sha256_file(d / f.path) == f.sha256
        # the tokenizer is the source's, byte for byte (transformers 5 would rewrite a re-saved one)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            assert (d / name).read_bytes() == (tiny_qwen2 / name).read_bytes(), name
        qc = json.loads((d / "config.json").read_text())["quantization_config"]
        assert qc["format"] == ("float-quantized" if tag == "fp8" else "pack-quantized")
        # the serve config travels with the checkpoint: no absolute path in it
        serve = VllmServeConfig.from_yaml((d / SERVE_CONFIG_FILE).read_text())
        assert serve.model is None and serve.served_model_name.startswith("tiny-qwen2-")
        card = (d / CARD_FILE).read_text()
        assert card.startswith("---\n") and "vllm serve ./ --config ./vllm.yaml" in card
        assert f"license: {source.license}" in card
        front = yaml.safe_load(card.split("---\n")[1])
        assert front["quantization"]["ignore"] == ["lm_head"] and front["quantization"]["scheme"] == scheme
        assert front["validation"]["passed"] is True
        assert "base_model" not in front  # a generated source has no hub repo to name
    assert "in sync" in dvc(repo.root, "status", "--cloud").stdout
    places = {"repo": repo.root, "work": work, "tmp": tmp_path}
    # the generated source the builds came from: its weights depend on the machine's CPU (golden.py)
    source = find_manifest(settings, "tiny-qwen2:fp8").source.content_sha256
    for tag in ("fp8", "awq"):
        golden.check(f"compressed/{tag}.manifest.json", manifest_path(settings, "tiny-qwen2", tag).read_text(),
                     source=source, **places)
        d = repo.root / "artifacts/tiny-qwen2" / tag
        golden.check(f"compressed/{tag}.vllm.yaml", (d / SERVE_CONFIG_FILE).read_text(), **places)
        golden.check(f"compressed/{tag}.README.md", (d / CARD_FILE).read_text(), source=source, **places)

    # vLLM's own parser accepts the registered config for the placed checkpoint (no weights loaded)
    checked = check_serve_config(repo.root / "artifacts/tiny-qwen2/fp8" / SERVE_CONFIG_FILE, settings,
                                 model=repo.root / "artifacts/tiny-qwen2/fp8")
    assert checked["ok"]

    again = _cli(repo, "compress", "tiny-qwen2", "--register")
    assert again.returncode == 0, again.stderr
    assert "nothing changed" in again.stderr and again.stderr.count("already registered") == 2

    listing = _cli(repo, "list")
    assert "tiny-qwen2:awq" in listing.stdout and "compressed-tensors" in listing.stdout
    golden.check("compressed/list.txt", listing.stdout, source=source, **places)
    golden.check("compressed/show-awq.json", _cli(repo, "show", "tiny-qwen2:awq").stdout, source=source, **places)

    # a developer's fresh clone pulls the checkpoint and is told how to serve it
    repo.commit_all("register tiny-qwen2 fp8 and awq")
    git(tmp_path, "clone", "-q", str(repo.root), "clone")
    clone = Repo(tmp_path / "clone", repo.remote, repo.work)
    pulled = _cli(clone, "pull", "tiny-qwen2:fp8")
    assert pulled.returncode == 0, pulled.stderr
    placed = clone.root / "artifacts/tiny-qwen2/fp8"
    assert "fetched and verified" in pulled.stdout
    assert f"vllm serve {placed} --config {placed}/vllm.yaml" in pulled.stdout
    assert (placed / "model.safetensors").read_bytes() == (repo.root / "artifacts/tiny-qwen2/fp8/model.safetensors").read_bytes()
    assert "up to date" in dvc(clone.root, "status", "compress@tiny-qwen2-fp8").stdout


def test_dvc_repro_builds_the_compress_stage_through_the_same_cli(
    isolated, tmp_path: Path, work: Path, monkeypatch
) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["fp8"]}, work=work)
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(work))
    done = dvc(repo.root, "repro", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    settings = repo.settings()
    m = find_manifest(settings, "tiny-qwen2:fp8")
    assert m.dvc.md5 is None and not m.dvc.pushed
    assert "compress@tiny-qwen2-fp8" in (repo.root / "dvc.lock").read_text()
    assert "didn't change, skipping" in dvc(repo.root, "repro").stdout
    cli = _cli(repo, "compress", "tiny-qwen2", "--schemes", "fp8", "--register")
    assert cli.returncode == 0, cli.stderr
    after = find_manifest(settings, "tiny-qwen2:fp8")
    assert after.dvc.pushed and after.dvc.md5 in (repo.root / "dvc.lock").read_text()
    assert after.created_at == m.created_at and after.sha256 == m.sha256
    assert "in sync" in dvc(repo.root, "status", "--cloud").stdout


def test_a_variant_that_failed_its_gate_is_never_registered(isolated, tmp_path: Path, work: Path) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["fp8"]}, work=work)
    settings = repo.settings()
    entry = load_catalog(settings.catalog_path).get("tiny-qwen2")
    result = build_compressed(entry, settings, schemes=["fp8"])
    assert not result.tools_run  # found by its receipts
    good = result.variants["fp8"]
    failed = dataclasses.replace(good, report=good.report.with_validation(good.validation.model_copy(
        update={"passed": False, "failures": ["mean KL 0.9 > 0.02"]})))
    with pytest.raises(GateFailed) as refused:
        candidate_from_compressed(result.plan, failed)
    # advice from what failed: fp8 is already the highest-bit scheme, so nothing higher is suggested
    assert refused.value.failures == ["mean KL 0.9 > 0.02"] and "Try fp8" not in (refused.value.hint or "")
    # a report edited on disk after validation is not trusted either
    report = result.plan.report_path("fp8")
    original = report.read_text()
    try:
        edited = json.loads(original)
        report.write_text(json.dumps({**edited, "validation": {**edited["validation"], "passed": False}}))
        with pytest.raises(FileNotFoundError, match="rerun `modelmint compress`"):
            candidate_from_compressed(result.plan, good)
    finally:
        report.write_text(original)
    assert list_manifests(settings).manifests == []
    assert not (repo.root / "artifacts").exists()
    # and the untouched one registers
    assert register(settings, candidate_from_compressed(result.plan, good)).manifest.ref == "tiny-qwen2:fp8"


def test_the_flow_registers_compressed_variants_like_gguf_ones(isolated, tmp_path: Path, work: Path, monkeypatch) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["fp8"]}, work=work)
    monkeypatch.setenv("MODELMINT_REPO", str(repo.root))
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(work))
    with prefect_test_harness(server_startup_timeout=180), \
            temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        state = convert(model="tiny-qwen2", variants=["fp8"], return_state=True)
        assert state.is_completed(), state.message
        summary = state.result()
        with get_client(sync_client=True) as client:
            found = {a.key: a for a in artifacts(client, state.state_details.flow_run_id)}
    assert summary["registered"] == ["tiny-qwen2:fp8"] and summary["failed"] == []
    m = find_manifest(repo.settings(), "tiny-qwen2:fp8")
    assert m.dvc.pushed and m.dvc.md5 in (repo.root / "dvc.lock").read_text()
    rows = json.loads(found["convert-tiny-qwen2-variants"].data)
    (row,) = rows
    assert row["format"] == "compressed-tensors" and row["registered"] == "tiny-qwen2:fp8"
    assert row["mean_kl"] <= row["max_mean_kl"] and row["same_top_pct"] >= row["min_same_top_pct"]
    assert "`tiny-qwen2:fp8`" in found["convert-tiny-qwen2"].data
