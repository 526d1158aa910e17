"""The convert flow's publish step (MODELMINT_OCI_REGISTRY) against a real registry, Debian's docker-registry 2.8.

The flow runs in-process against Prefect's test server on the real tiny-qwen2 build (pinned llama.cpp): q8_0 passes
its gate, tq1_0 fails it. One build directory serves the module, so later runs find the first one's receipts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ociregistry import RunningRegistry, start_registry
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
from prefect.testing.utilities import prefect_test_harness
from registry_env import Repo, artifacts, free_port, make_repo, task_runs

from flows.convert import convert, oci_registry
from pipelines.core.errors import ConfigError
from pipelines.core.fsutil import sha256_file
from pipelines.core.settings import Settings
from pipelines.oci.images import pinned_tag
from pipelines.publish.oci import OciClient, RegistryRef
from pipelines.publish.ollama_image import MODEL
from pipelines.store.manifest import find_manifest
from pipelines.store.published import publications_path

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


def test_the_registry_setting_is_checked_before_any_work() -> None:
    assert oci_registry(Settings.from_env({})) is None
    ref = oci_registry(
        Settings.from_env(
            {"MODELMINT_OCI_REGISTRY": "registry.internal:5000/team", "MODELMINT_OCI_INSECURE": "yes"}
        )
    )
    assert ref == RegistryRef("registry.internal:5000", "team", insecure=True)
    with pytest.raises(ConfigError, match="HOST"):
        oci_registry(Settings.from_env({"MODELMINT_OCI_REGISTRY": "registry.internal"}))
    with pytest.raises(ConfigError, match="MODELMINT_OCI_INSECURE"):
        Settings.from_env({"MODELMINT_OCI_INSECURE": "maybe"})
    # where a run publishes says nothing about what it builds: no cache key changes with it
    plain = Settings.from_env({}).plan_fields()
    assert Settings.from_env({"MODELMINT_OCI_REGISTRY": "r.internal/team"}).plan_fields() == plain


@pytest.fixture(scope="module")
def harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    running = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def project(
    harness: None, isolated: Path, tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Repo]:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0", "tq1_0"]}, work=work)
    monkeypatch.setenv("MODELMINT_REPO", str(repo.root))
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(work))
    monkeypatch.setenv("MODELMINT_OCI_INSECURE", "1")
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        yield repo


def _cli(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MODELMINT, *args],
        env={**repo.env(), "COLUMNS": "300"},
        capture_output=True,
        text=True,
        cwd=repo.root,
    )


def _run(**params: Any) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """A flow run's final state, its variants table (by variant) and its task runs' names → state names."""
    state = convert(model="tiny-qwen2", return_state=True, **params)
    with get_client(sync_client=True) as client:
        found = {a.key: a for a in artifacts(client, state.state_details.flow_run_id)}
        tasks = {r.name: r for r in task_runs(client, state.state_details.flow_run_id)}
    rows = {r["variant"]: r for r in json.loads(found["convert-tiny-qwen2-variants"].data)}
    return state, {"rows": rows, "markdown": found["convert-tiny-qwen2"].data}, tasks


@pytest.mark.slow
def test_the_flow_publishes_what_passed_never_what_failed_and_a_rerun_moves_nothing(
    project: Repo, registry: RunningRegistry, work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELMINT_OCI_REGISTRY", f"{registry.host}/flow")
    state, out, tasks = _run(variants=["tq1_0", "q8_0"])
    assert state.is_failed() and "1 of 2 variant(s) failed: tq1_0" in state.message, state.message
    m = find_manifest(project.settings(), "tiny-qwen2:q8_0")
    pinned = pinned_tag(m)
    assert pinned == f"q8_0-{m.source.content_sha256[:12]}"  # a generated source: no upstream commit
    images = [f"{registry.host}/flow/tiny-qwen2:{t}" for t in (pinned, "q8_0")]

    where = RegistryRef(registry.host, "flow", insecure=True)
    with OciClient(where) as c:
        got = c.get_manifest("flow/tiny-qwen2", "q8_0")
        assert got is not None and c.get_manifest("flow/tiny-qwen2", pinned)[2] == got[2]  # type: ignore[index]
        tags = c._send("GET", "/v2/flow/tiny-qwen2/tags/list").json()["tags"]
        model = json.loads(got[0])["layers"][0]
        c.fetch_blob("flow/tiny-qwen2", model["digest"], tmp_path / "model.gguf")
    assert sorted(tags) == sorted([pinned, "q8_0"])  # nothing of tq1_0
    assert model["mediaType"] == MODEL and model["digest"] == "sha256:" + m.sha256
    assert (tmp_path / "model.gguf").read_bytes() == (project.root / m.dvc.path / m.file).read_bytes()
    failed_gguf = next(work.rglob("tiny-qwen2-tq1_0.gguf"))
    assert not registry.blob_data("sha256:" + sha256_file(failed_gguf)).exists()

    rows = out["rows"]
    assert rows["q8_0"]["published"] == images and rows["q8_0"]["image_digest"] == got[2]
    assert rows["tq1_0"]["published"] == [] and rows["tq1_0"]["registered"] == ""
    assert f"ollama pull --insecure {images[-1]}" in out["markdown"]
    assert tasks["publish-image-q8_0"].state.name == "Completed" and "publish-image-tq1_0" not in tasks
    record = json.loads(publications_path(project.settings(), "tiny-qwen2", "q8_0").read_text())
    assert [(e["registry"], e["repository"], e["tags"], e["digest"]) for e in record] == [
        (registry.host, "flow/tiny-qwen2", [pinned, "q8_0"], got[2])
    ]
    listed = _cli(project, "list")
    assert listed.returncode == 0 and f"{images[-1]} +:{pinned}" in listed.stdout, listed.stdout

    # the same run again: the publish step asks the registry and finds everything there
    posts, puts = len(registry.requests("POST")), len(registry.requests("PUT"))
    stamp = publications_path(project.settings(), "tiny-qwen2", "q8_0").stat().st_mtime_ns
    again, out, tasks = _run(variants=["q8_0"])
    assert again.is_completed(), again.message
    assert tasks["publish-image-q8_0"].state.name == "Completed"
    assert "0 blob(s) uploaded, 0 tag(s) written" in out["markdown"]
    assert (len(registry.requests("POST")), len(registry.requests("PUT"))) == (posts, puts)
    assert publications_path(project.settings(), "tiny-qwen2", "q8_0").stat().st_mtime_ns == stamp
    # `modelmint publish` tags as the flow does: the image is there, nothing is sent
    cli = _cli(project, "publish", m.ref, "--registry", f"{registry.host}/flow", "--insecure")
    assert cli.returncode == 0 and "0 blob(s) uploaded" in cli.stdout, cli.stdout + cli.stderr
    assert (len(registry.requests("POST")), len(registry.requests("PUT"))) == (posts, puts)


@pytest.mark.slow
def test_a_registry_that_is_down_fails_the_publish_step_and_leaves_the_registration(
    project: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # nothing listens there yet
    host = f"127.0.0.1:{port}"
    monkeypatch.setenv("MODELMINT_OCI_REGISTRY", f"{host}/late")
    # the task's own retries, without their minutes of delay
    monkeypatch.setattr("pipelines.compose.RETRY_DELAYS", (0, 0, 0))
    state, out, tasks = _run(variants=["q8_0"])
    assert state.is_failed()
    assert f"the registry {host} cannot be reached" in state.message, state.message
    assert f"modelmint publish tiny-qwen2:q8_0 --registry {host}/late --insecure" in state.message
    assert tasks["publish-image-q8_0"].run_count == 4  # tried, then retried 3 times: the error is transient
    m = find_manifest(project.settings(), "tiny-qwen2:q8_0")
    assert m.validation.passed and m.dvc.pushed  # registered all the same
    row = out["rows"]["q8_0"]
    assert row["registered"] == "tiny-qwen2:q8_0" and row["published"] == []
    assert row["cause"].startswith("publish: OciUnavailable")
    assert not publications_path(project.settings(), "tiny-qwen2", "q8_0").exists()

    up = start_registry(tmp_path / "late", port=port)
    try:
        state, out, _ = _run(variants=["q8_0"])
        assert state.is_completed(), state.message
        assert out["rows"]["q8_0"]["published"][-1] == f"{host}/late/tiny-qwen2:q8_0"
        with OciClient(RegistryRef(host, "late", insecure=True)) as c:
            got = c.get_manifest("late/tiny-qwen2", pinned_tag(m))
        assert got is not None and json.loads(got[0])["layers"][0]["digest"] == "sha256:" + m.sha256
    finally:
        up.stop()
