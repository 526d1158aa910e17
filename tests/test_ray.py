"""The convert flow on a real Ray cluster: a head and a worker node started as separate raylets on this machine,
the flow run through the embedded Prefect stack (`prefect deployment run`) with MODELMINT_RAY_ADDRESS set.

Each node offers a custom resource of its own (node-a, node-b); MODELMINT_RAY_RESOURCES sends quantize to one and
validate to the other, so both nodes do work, and Ray's own task records say where each task ran.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import golden
import pytest
from ray_env import Cluster, ray_start, start_cluster
from registry_env import free_port
from stack_env import flow_runs, prefect, run_logs, stack_up

from flows import raycluster
from pipelines.core.errors import ConfigError, OrchestratorError
from pipelines.core.fsutil import sha256_file
from pipelines.core.settings import Settings
from pipelines.gguf.build import ensure_base, ensure_quant, plan_gguf
from pipelines.source.catalog import load_catalog
from pipelines.store.manifest import Manifest, list_manifests


def _local_gguf(settings: Settings, manifest: Manifest, tmp: Path) -> dict[str, str]:
    """What the local process runner registers for `manifest`'s variant: {file: sha256} of its GGUF.

    The golden manifest of a local run (tests/golden/gguf) where it was written from this machine's generated
    source; on a machine kind that trains the tiny model differently (golden.py), a local build here."""
    name = f"gguf/{manifest.tag}.manifest.json"
    if golden.written_from(name) == manifest.source.content_sha256:
        files = json.loads((golden.GOLDEN / name).read_text())["files"]
        return {f["path"]: f["sha256"] for f in files if f["path"].endswith(".gguf")}
    local = dataclasses.replace(settings, work_dir=tmp / "local-work")
    plan = plan_gguf(load_catalog(settings.catalog_path).get(manifest.name), local, quants=[manifest.tag])
    ensure_base(plan)
    out = ensure_quant(plan, manifest.tag).path
    return {out.name: sha256_file(out)}


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """Two Ray nodes, one CPU each, on 127.0.0.1; stopped by their own process ids, whatever the test did."""
    c = start_cluster([(1, {"node-a": 1}), (1, {"node-b": 1})], dashboard=True)
    try:
        yield c
    finally:
        c.stop()


def _where_tasks_ran(c: Cluster) -> dict[str, str]:
    """Ray's task records of the cluster: node id → the custom resource that node offers, for every node that ran
    one of the flow's tasks."""
    from ray.util.state import list_nodes, list_tasks

    nodes = {n.node_id: n.resources_total for n in list_nodes(address=c.dashboard)}
    tasks = list_tasks(address=c.dashboard, filters=[("state", "=", "FINISHED")], limit=1000, raise_on_missing_output=False)
    ran = {t.node_id for t in tasks if t.type == "NORMAL_TASK" and not t.name.endswith("_probe")}
    return {n: next((k for k in nodes[n] if k.startswith("node-")), "?") for n in ran if n in nodes}


@pytest.mark.slow
@pytest.mark.heavy  # a Ray cluster and a Prefect stack running the whole flow: minutes; nightly
def test_the_flow_runs_its_steps_on_both_nodes_and_registers_what_a_local_run_does(cluster, isolated, tmp_path,
                                                                                  monkeypatch) -> None:
    placement = {"quantize": {"node-b": 1}, "validate": {"node-a": 1}}
    with stack_up(tmp_path, monkeypatch, {"tiny-qwen2": ["q4_k_m", "q8_0"]}, MODELMINT_RAY_ADDRESS=cluster.address,
                  MODELMINT_RAY_RESOURCES=json.dumps(placement), MODELMINT_THREADS="1") as (repo, settings):
        run = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--watch")
        assert run.returncode == 0, run_logs(settings, flow_runs(settings)[-1].id)
        manifests = {m.tag: m for m in list_manifests(repo.settings()).manifests}
    assert sorted(manifests) == ["q4_k_m", "q8_0"]
    # (a) Ray's own records: tasks ran on the node offering node-a and on the one offering node-b
    assert sorted(_where_tasks_ran(cluster).values()) == ["node-a", "node-b"]
    # (b) byte for byte what the local process runner registers
    got = {f.path: f.sha256 for f in manifests["q4_k_m"].files if f.path.endswith(".gguf")}
    assert got == _local_gguf(repo.settings(), manifests["q4_k_m"], tmp_path)


def _task_running(settings: Settings, prefix: str) -> bool:
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    from flows import stack

    with stack.api(settings) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=prefix)))
    return any(r.state and r.state.name == "Running" for r in runs)


@pytest.mark.slow
@pytest.mark.heavy  # a Ray cluster and a Prefect stack running the whole flow: minutes; nightly
def test_a_node_lost_mid_step_is_retried_by_ray_on_its_replacement(cluster, isolated, tmp_path, monkeypatch) -> None:
    """SIGKILL the raylet of the node running validate (llama-perplexity, the longest step of a tiny model): Ray
    retries the task on the node that replaces it (one offering the same resource), the run completes, and what
    it registers is what a run without loss registers."""
    from ray.util.state import list_tasks
    from stack_env import wait_for

    placement = {"validate": {"node-b": 1}}
    with stack_up(tmp_path, monkeypatch, {"tiny-qwen2": ["q8_0"]}, MODELMINT_RAY_ADDRESS=cluster.address,
                  MODELMINT_RAY_RESOURCES=json.dumps(placement), MODELMINT_THREADS="1") as (repo, settings):
        started = prefect(settings, "deployment", "run", "convert/tiny-qwen2")
        assert started.returncode == 0, started.stderr
        wait_for(lambda: _task_running(settings, "validate"), 600, "validate to run on node-b")
        os.kill(cluster.raylet("node-b"), signal.SIGKILL)
        ray_start("--address", cluster.address, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                   "--resources", '{"node-b": 1}')
        run = wait_for(lambda: next((r for r in flow_runs(settings) if r.state and r.state.is_final()), None), 900,
                       "the run to finish")
        assert run.state.is_completed(), run_logs(settings, run.id)
        manifests = list_manifests(repo.settings()).manifests
    attempts = [(t.attempt_number, t.state) for t in list_tasks(address=cluster.dashboard, limit=1000,
                                                                 filters=[("name", "=", "validate")])]
    assert (0, "FAILED") in attempts and any(n > 0 and st == "FINISHED" for n, st in attempts), attempts
    assert [m.ref for m in manifests] == ["tiny-qwen2:q8_0"]
    got = {f.path: f.sha256 for f in manifests[0].files if f.path.endswith(".gguf")}
    assert got == _local_gguf(repo.settings(), manifests[0], tmp_path)


@pytest.mark.slow
def test_a_step_no_node_can_take_is_refused_before_any_work(cluster, tmp_path) -> None:
    import ray

    settings = Settings.from_env({"MODELMINT_HOME": str(tmp_path / "home"), "MODELMINT_WORK_DIR": str(tmp_path / "w"),
                                  "MODELMINT_RAY_ADDRESS": cluster.address,
                                  "MODELMINT_RAY_RESOURCES": '{"compress": {"gpu-H100-80G": 1}}'})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        with pytest.raises(OrchestratorError) as err:
            raycluster.check_resources(settings)
        assert "compress step" in err.value.message and "gpu-H100-80G" in err.value.message
        assert "node-a" in err.value.message and "node-b" in err.value.message  # what the nodes do offer
        # every node sees the work directory here; a toolchain that is not installed is named with the node
        with pytest.raises(OrchestratorError) as err:
            raycluster.probe_nodes(settings, [tmp_path / "home" / "toolchains" / "llama.cpp-x"])
        assert err.value.message.count("has no toolchain at") == 2
        assert not list((tmp_path / "w").glob(".ray-probe-*"))  # the probe cleans up after itself
    finally:
        ray.shutdown()


def test_an_address_nobody_answers_is_refused_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(OrchestratorError) as err:
        raycluster.reachable(f"127.0.0.1:{free_port()}")
    assert time.monotonic() - start < 10
    assert "no Ray cluster answers" in err.value.message and "ray start --head" in err.value.hint


def test_step_resources_are_checked_where_they_are_given(tmp_path) -> None:
    def opts(value: str, step: str = "compress") -> dict:
        env = {"MODELMINT_HOME": str(tmp_path), "MODELMINT_RAY_ADDRESS": "127.0.0.1:1", "MODELMINT_RAY_RESOURCES": value}
        return raycluster.step_options(Settings.from_env(env), step)

    assert opts('{"compress": {"GPU": 1, "gpu-H100-80G": 1}}') == {"num_cpus": 1, "num_gpus": 1.0,
                                                                  "resources": {"gpu-H100-80G": 1.0}}
    assert opts('{"compress": {"GPU": 1}}', "quantize") == {"num_cpus": 1}
    for bad, says in (("{nope", "not JSON"), ('{"fetch": {"x": 1}}', "do not run on Ray"), ('{"compress": 1}', "map step")):
        with pytest.raises(ConfigError, match=says):
            opts(bad)


def test_tokens_never_reach_the_ray_runtime_environment(monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_canary")
    monkeypatch.setenv("MODELMINT_HF_TOKEN", "hf_canary")
    monkeypatch.setenv("MODELMINT_WEBHOOK_SECRET", "hf_canary")
    monkeypatch.setenv("MODELMINT_REGISTRY_PASSWORD", "hf_canary")
    monkeypatch.setenv("MODELMINT_THREADS", "2")
    env = raycluster.forwarded_env()
    assert env["MODELMINT_THREADS"] == "2" and "hf_canary" not in json.dumps(env)
    assert type(raycluster.task_runner(Settings.from_env({"MODELMINT_RAY_ADDRESS": "127.0.0.1:6379"}))).__name__ \
        == "CheckedRayTaskRunner"


def test_the_flows_task_runner_is_chosen_when_a_run_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefect enters a duplicate of the flow's runner at each run's start: the duplicate follows the environment
    of that moment, whatever it was when flows/convert.py was imported."""
    from flows.convert import convert

    monkeypatch.delenv("MODELMINT_RAY_ADDRESS", raising=False)
    assert type(convert.task_runner.duplicate()).__name__ == "ThreadPoolTaskRunner"
    monkeypatch.setenv("MODELMINT_RAY_ADDRESS", "127.0.0.1:6379")
    assert type(convert.task_runner.duplicate()).__name__ == "CheckedRayTaskRunner"
    monkeypatch.setenv("MODELMINT_THREADS", "many")
    with pytest.raises(ConfigError, match="MODELMINT_THREADS"):  # an unusable setting fails the run, as it starts
        convert.task_runner.duplicate()


@pytest.mark.slow
def test_convert_all_runs_every_model_as_its_own_run_and_tables_every_variant(isolated, tmp_path, monkeypatch) -> None:
    """The test project's catalog holds one model (the only one small enough here); the fan-out is the same."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows import stack

    with stack_up(tmp_path, monkeypatch, {"tiny-qwen2": ["q8_0"]}) as (repo, settings):
        bad = prefect(settings, "deployment", "run", "convert/all", "--param", 'variants=["q6_k"]', "--watch")
        assert bad.returncode != 0
        parent = next(r for r in flow_runs(settings) if r.name == "all")
        assert parent.state.is_failed() and "1 of 1 models failed: tiny-qwen2" in parent.state.message
        run = prefect(settings, "deployment", "run", "convert/all", "--watch")
        assert run.returncode == 0, run_logs(settings, flow_runs(settings)[-1].id)
        runs = [r for r in flow_runs(settings) if r.name == "tiny-qwen2"]
        with stack.api(settings) as client:
            table = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["convert-all"])))
    assert [m.ref for m in list_manifests(repo.settings()).manifests] == ["tiny-qwen2:q8_0"]
    # each model's run is a run of its own deployment (its own process, model slot and logs), under the parent
    assert len(runs) == 2 and all(r.deployment_id is not None and r.parent_task_run_id is not None for r in runs)
    rows = json.loads(max(table, key=lambda a: a.created).data)
    assert [(r["model"], r["variant"], r["gate"]) for r in rows] == [("tiny-qwen2", "q8_0", "pass")]


# ---------------------------------------------------------------- Kubernetes: KubeRay workers and the Prefect job


K8S = Path(__file__).parent.parent / "containers" / "k8s"


def test_the_kuberay_cluster_manifest_passes_kuberay_and_kubernetes_schemas() -> None:
    import yaml
    from test_servefiles import check_core, check_custom

    docs = [d for d in yaml.safe_load_all((K8S / "raycluster.yaml").read_text()) if d]
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "RayCluster"]
    assert check_core(docs[0]) == [] and check_custom(docs[1]) == []
    spec = docs[1]["spec"]
    assert spec["rayVersion"] == "2.60.0"  # the ray pin (pyproject.toml's ray extra)
    mounts = {g["groupName"]: g["template"]["spec"]["containers"][0]["volumeMounts"] for g in spec["workerGroupSpecs"]}
    assert all(m == [{"name": "work", "mountPath": "/data"}] for m in mounts.values())  # one storage on every node
    # the check can fail: a misspelled field of the RayCluster, a pod field Kubernetes does not know
    broken = json.loads(json.dumps(docs[1]))
    broken["spec"]["workerGroupSpecs"][0]["replica"] = 2
    broken["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    errors = check_custom(broken)
    assert any("replica" in e for e in errors) and any("imagePullPolcy" in e for e in errors)


def _rendered_job(template: dict) -> dict:
    """The work pool's Job as Prefect renders it with the variables' defaults (a key whose value is None is left
    out, as Prefect's template rendering does)."""
    import re

    defaults = {k: v.get("default") for k, v in template["variables"]["properties"].items()}
    defaults.update(command=["prefect", "flow-run", "execute"], env=[{"name": "PREFECT_API_URL", "value": "http://x"}],
                    name="convert-run", image=defaults.get("image") or "modelmint/prefect-worker:0.1.0")

    def render(node):  # type: ignore[no-untyped-def]
        if isinstance(node, dict):
            out = {k: render(v) for k, v in node.items()}
            return {k: v for k, v in out.items() if v is not None}
        if isinstance(node, list):
            return [render(v) for v in node]
        if isinstance(node, str) and (m := re.fullmatch(r"\{\{\s*([a-z_]+)\s*\}\}", node)):
            return defaults.get(m.group(1))
        if isinstance(node, str):
            return re.sub(r"\{\{\s*([a-z_]+)\s*\}\}", lambda m: str(defaults.get(m.group(1)) or ""), node)
        return node

    return render(template["job_configuration"]["job_manifest"])


def test_the_prefect_kubernetes_job_template_renders_a_valid_job() -> None:
    from test_servefiles import check_core

    template = json.loads((K8S / "base-job-template.json").read_text())
    job = _rendered_job(template)
    assert check_core(job) == []
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
