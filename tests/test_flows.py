"""The `convert` flow in-process against Prefect's test server: caching, retries, artifacts, registration."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest
import yaml
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
from prefect.testing.utilities import prefect_test_harness
from registry_env import PopenCounter, Repo, artifacts, dvc, make_repo, task_runs

from flows import stack
from flows.convert import convert, model_limit
from flows.runreport import artifact_key
from flows.tasks import _step_key, _transient
from pipelines.core.errors import ConfigError, HubUnavailable
from pipelines.core.settings import project_root
from pipelines.source.catalog import load_catalog
from pipelines.store.manifest import find_manifest, list_manifests

ROOT = project_root()


# ---------------------------------------------------------------- without a build


def test_prefect_yaml_names_one_deployment_per_catalog_entry() -> None:
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    catalog = [m.name for m in load_catalog(ROOT / "registry" / "catalog.yaml").models]
    fan_out = [d for d in doc["deployments"] if d["name"] == "all"]
    assert [d["entrypoint"] for d in fan_out] == ["flows/convert.py:convert_all"]
    # convert/all and watch-upstream (tests/test_watch.py checks it) are not one model's conversion
    deployments = [d for d in doc["deployments"] if d["name"] not in ("all", "watch-upstream")]
    assert sorted(d["name"] for d in deployments) == sorted(catalog)
    for d in deployments:
        assert d["entrypoint"] == "flows/convert.py:convert"
        assert d["parameters"] == {"model": d["name"]}
        assert d["work_pool"]["name"] == stack.WORK_POOL


def test_artifact_and_limit_names_are_what_prefect_accepts() -> None:
    assert artifact_key("convert", "qwen2.5", "variants") == "convert-qwen2-5-variants"
    assert model_limit("Qwen2.5") == "model-qwen2-5"
    for name in load_catalog(ROOT / "registry" / "catalog.yaml").models:
        assert re.fullmatch(r"[a-z0-9-]+", artifact_key("convert", name.name))


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=180):
        yield


def test_only_transient_errors_are_retried(harness, tmp_path: Path) -> None:
    import httpx
    from registry_env import free_port

    attempts: dict[str, int] = {}
    closed = free_port()  # nothing listens there: a real connection error from httpx, as from the Prefect client

    @task(retries=2, retry_delay_seconds=0, retry_condition_fn=_transient)
    def flaky(kind: str) -> str:
        attempts[kind] = attempts.get(kind, 0) + 1
        if attempts[kind] == 1:
            if kind == "api-down":
                httpx.get(f"http://127.0.0.1:{closed}/api/health", timeout=5)
            raise HubUnavailable("503 from the hub") if kind == "network" else ConfigError("bad recipe")
        return "ok"

    @flow
    def three() -> tuple[object, object, object]:
        return (flaky("network", return_state=True), flaky("config", return_state=True),
                flaky("api-down", return_state=True))

    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path}):
        network, config, api_down = three()
    assert network.is_completed() and attempts["network"] == 2
    assert config.is_failed() and attempts["config"] == 1
    # httpx's ConnectError does not derive from ConnectionError; it is transient all the same
    assert api_down.is_completed() and attempts["api-down"] == 2


def test_an_unknown_model_fails_the_run_with_the_catalog_names(harness, isolated, tmp_path: Path, monkeypatch) -> None:
    repo = make_repo(tmp_path)
    monkeypatch.setenv("MODELMINT_REPO", str(repo.root))
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        state = convert(model="tiny-qwen3", return_state=True)
    assert state.is_failed()
    assert "no catalog entry named 'tiny-qwen3'" in state.message and "tiny-qwen2" in state.message


# ---------------------------------------------------------------- the real build (tiny-qwen2, pinned llama.cpp)


@pytest.fixture(scope="module")
def shared_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build directory for the module: later tests reuse the first one's receipts."""
    return tmp_path_factory.mktemp("work")


@pytest.fixture
def project(harness, isolated, tmp_path: Path, shared_work: Path, monkeypatch) -> Repo:
    repo = make_repo(tmp_path, work=shared_work)
    monkeypatch.setenv("MODELMINT_REPO", str(repo.root))
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(shared_work))
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        yield repo


def _run(**params):  # type: ignore[no-untyped-def]
    state = convert(return_state=True, **params)
    assert state.is_completed(), state.message
    return state


@pytest.mark.slow
def test_a_run_builds_validates_registers_and_publishes(project: Repo) -> None:
    state = _run(model="tiny-qwen2")
    summary = state.result()
    assert summary["registered"] == ["tiny-qwen2:q4_k_m", "tiny-qwen2:q8_0"] and summary["failed"] == []
    settings = project.settings()
    for ref in summary["registered"]:
        m = find_manifest(settings, ref)
        assert m.validation.passed and m.dvc.pushed
        assert m.dvc.md5 in (project.root / "dvc.lock").read_text()
        files = {f.path for f in m.files}
        assert {m.file, "Modelfile", "README.md"} <= files
        assert m.parent is not None and m.parent.artifact == "tiny-qwen2:f16"
        assert m.source.kind == "generated" and m.toolchain["llama.cpp"] == "0c1e570"
    assert "in sync" in dvc(project.root, "status", "--cloud").stdout
    with get_client(sync_client=True) as client:
        found = {a.key: a for a in artifacts(client, state.state_details.flow_run_id)}
        names = [r.name for r in task_runs(client, state.state_details.flow_run_id)]
    assert set(found) == {"convert-tiny-qwen2", "convert-tiny-qwen2-variants"}
    md = found["convert-tiny-qwen2"].data
    assert "| q4_k_m |" in md and "✅ pass" in md and "`tiny-qwen2:q8_0`" in md
    # the registry site, rebuilt after the registrations and linked from the artifact
    site = project.work / "site" / "index.html"
    assert f"Registry site: [{site}]({site.as_uri()})" in md and "tiny-qwen2" in site.read_text()
    rows = json.loads(found["convert-tiny-qwen2-variants"].data)
    assert {r["variant"]: r["gate"] for r in rows} == {"q4_k_m": "pass", "q8_0": "pass"}
    assert all(r["mean_kl"] < r["max_mean_kl"] and r["sha256"] for r in rows)
    for step in ("fetch", "convert", "quantize-q4_k_m", "validate-q8_0", "register-q4_k_m", "register-q8_0"):
        assert any(n.startswith(step) for n in names), (step, names)


@pytest.mark.slow
def test_a_rerun_with_nothing_changed_invokes_no_tool(project: Repo, monkeypatch) -> None:
    _run(model="tiny-qwen2")
    manifests = {p: p.stat().st_mtime_ns for p in (project.root / "registry").rglob("*.json")}
    popen = PopenCounter(monkeypatch)
    state = _run(model="tiny-qwen2")
    assert popen.argv == []  # no llama.cpp tool, no DVC, no git: nothing
    with get_client(sync_client=True) as client:
        runs = task_runs(client, state.state_details.flow_run_id)
    assert runs and {r.state.name for r in runs} == {"Cached"}, [(r.name, r.state.name) for r in runs]
    assert {p: p.stat().st_mtime_ns for p in manifests} == manifests


@pytest.mark.slow
def test_a_cached_step_whose_output_is_gone_runs_again(project: Repo, shared_work: Path, monkeypatch) -> None:
    _run(model="tiny-qwen2")
    before = find_manifest(project.settings(), "tiny-qwen2:q8_0")
    quant = next(shared_work.rglob("tiny-qwen2-q8_0.gguf"))
    quant.unlink()
    popen = PopenCounter(monkeypatch)
    state = _run(model="tiny-qwen2")
    assert quant.is_file()
    assert any("llama-quantize" in " ".join(a) for a in popen.argv)
    with get_client(sync_client=True) as client:
        runs = [(r.name, r.state.name) for r in task_runs(client, state.state_details.flow_run_id)]
    q8 = [s for n, s in runs if n.startswith("quantize-q8_0")]
    assert q8 == ["Cached", "Completed"], runs  # the stale hit, then the refresh
    assert all(s == "Cached" for n, s in runs if n.startswith("quantize-q4_k_m"))
    # llama-quantize is deterministic: the same bytes, so the registration stands as it was
    after = find_manifest(project.settings(), "tiny-qwen2:q8_0")
    assert after.sha256 == before.sha256


@pytest.mark.slow
def test_variants_parameter_and_content_keys(project: Repo, shared_work: Path, tmp_path: Path) -> None:
    state = _run(model="tiny-qwen2", variants=["Q8_0"])
    assert state.result()["registered"] == ["tiny-qwen2:q8_0"]
    assert [m.ref for m in list_manifests(project.settings()).manifests] == ["tiny-qwen2:q8_0"]
    # Keys come from content and the output's place, never from an input's path: the same plan made
    # again has the same key, other content another, and another checkout's work directory another
    # (its cached result would name a file in the first checkout).
    import dataclasses

    from pipelines.gguf.build import gguf_steps, plan_gguf

    settings = project.settings()
    entry = load_catalog(settings.catalog_path).get("tiny-qwen2")
    here = plan_gguf(entry, settings)

    def _convert_key(plan):  # type: ignore[no-untyped-def]
        convert = next(s for s in gguf_steps(plan).steps if s.name == "convert")
        return _step_key(None, {"step": convert, "inputs": {}})

    assert _convert_key(here) == _convert_key(plan_gguf(entry, settings))
    changed = dataclasses.replace(here, source_key="f" * 64)
    assert _convert_key(changed) != _convert_key(here)
    elsewhere = plan_gguf(entry, project.settings(MODELMINT_WORK_DIR=tmp_path / "elsewhere"))
    assert _convert_key(here) != _convert_key(elsewhere)


@pytest.mark.slow
def test_a_second_checkout_on_the_same_server_builds_in_its_own_directory(
    harness, isolated, tmp_path: Path, shared_work: Path, monkeypatch
) -> None:
    """Two clones share MODELMINT_HOME (and so the Prefect server and its result store): the second one's
    run must produce its own files, not be handed the first one's cached paths."""
    first = make_repo(tmp_path / "one", work=shared_work)
    second = make_repo(tmp_path / "two", work=tmp_path / "two" / "build")
    for repo in (first, second):
        monkeypatch.setenv("MODELMINT_REPO", str(repo.root))
        monkeypatch.setenv("MODELMINT_WORK_DIR", str(repo.work))
        with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
            _run(model="tiny-qwen2", variants=["q8_0"])
    built = list(second.work.rglob("tiny-qwen2-q8_0.gguf"))
    assert len(built) == 1
    m = find_manifest(second.settings(), "tiny-qwen2:q8_0")
    assert (second.root / m.dvc.path / m.file).is_file()


# Registration faults (a failed push, a full DVC cache, the catalog entry moving during validation, a damaged remote
# object) run through the flow and the CLI alike, with the same assertions: tests/faults/test_registration_executors.py


def test_kubernetes_job_template_requests_gpus_through_a_declared_variable() -> None:
    template = json.loads((ROOT / "containers" / "k8s" / "base-job-template.json").read_text())
    declared = set(template["variables"]["properties"])
    used = set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", json.dumps(template["job_configuration"])))
    assert used <= declared, used - declared
    container = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpu_limit }}"
    assert template["variables"]["properties"]["gpu_limit"]["default"] == 0


@pytest.mark.slow
def test_gpu_steps_need_the_strict_gpu_limit(harness, isolated, tmp_path: Path, monkeypatch) -> None:
    """Compressed variants run under a slot of `gpu`; without the limit the run fails instead of running unlimited."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    # its own work dir: a receipt hit would skip llmcompressor, and with it the need for a GPU slot
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["fp8"]})
    monkeypatch.setenv("MODELMINT_REPO", str(repo.root))
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(repo.work))
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
            client.delete_global_concurrency_limit_by_name("gpu")
        refused = convert(model="tiny-qwen2", variants=["fp8"], return_state=True)
        assert refused.is_failed() and "gpu" in refused.message
        with get_client(sync_client=True) as client:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="gpu", limit=1))
        done = convert(model="tiny-qwen2", variants=["fp8"], return_state=True)
    assert done.is_completed(), done.message
    rows = done.result()["variants"]
    assert [r["variant"] for r in rows] == ["fp8"] and rows[0]["gate"] == "pass"


@pytest.mark.slow
def test_the_flow_writes_build_json_and_reports_a_ladder_conflict_like_the_cli(
    project: Repo, shared_work: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The flow runs the CLI's step list and finish: build.json beside the build, and a gate defect said when a type is
    refused although one with fewer bits passed with figures no better (here q8_0's report is made to say so)."""
    import logging

    from pipelines.gguf.build import build_gguf

    _run(model="tiny-qwen2")
    [build_json] = list(shared_work.rglob("build.json"))
    assert set(json.loads(build_json.read_text())["variants"]) == {"q4_k_m", "q8_0"}
    out = build_json.parent
    q4 = json.loads((out / "tiny-qwen2-q4_k_m.report.json").read_text())
    q8_path = out / "tiny-qwen2-q8_0.report.json"
    kept = q8_path.read_text()
    q8 = json.loads(kept)
    q8["validation"] = {**q4["validation"], "passed": False, "failures": ["refused by this test"]}
    conflict = "gate defect, not the variant's: q8_0 was refused although q4_k_m, a type with fewer bits, passed"
    try:
        q8_path.write_text(json.dumps(q8))
        settings = project.settings()
        said: list[str] = []
        build_gguf(load_catalog(settings.catalog_path).get("tiny-qwen2"), settings, progress=said.append)
        assert any(conflict in m for m in said), said
        build_json.unlink()
        caplog.set_level(logging.INFO)
        state = convert(model="tiny-qwen2", return_state=True)
        assert state.is_failed() and "q8_0" in state.message
        assert conflict in caplog.text
        written = json.loads(build_json.read_text())
        assert written["variants"]["q8_0"]["passed"] is False and written["variants"]["q4_k_m"]["passed"] is True
    finally:
        q8_path.write_text(kept)
