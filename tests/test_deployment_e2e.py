"""End to end through a real Prefect server and worker: `prefect deployment run convert/tiny-qwen2 --watch`.

The stack is the embedded default (flows/stack.py, what scripts/up.sh runs) on a free port with every cache
in a temp dir; the project is a temp git + DVC repository with a local remote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import golden
import pytest
from registry_env import Repo, free_port, git, task_runs
from stack_env import flow_runs, prefect, stack_up, wait_for

from flows import stack
from pipelines.core.settings import Settings
from pipelines.store.manifest import find_manifest, list_manifests, manifest_path

pytestmark = pytest.mark.slow

@pytest.fixture
def deployed(request, isolated, tmp_path: Path, monkeypatch) -> Any:
    """The stack up against a temp project; `indirect` parametrization chooses the catalog's GGUF variants."""
    with stack_up(tmp_path, monkeypatch, {"tiny-qwen2": getattr(request, "param", ["q4_k_m", "q8_0"])}) as up:
        yield up


def test_deployment_run_end_to_end(deployed) -> None:
    repo, settings = deployed
    # 1. the README's command, against the server and worker
    first = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--watch")
    assert first.returncode == 0, first.stdout + first.stderr
    assert [m.ref for m in list_manifests(repo.settings()).manifests] == ["tiny-qwen2:q4_k_m", "tiny-qwen2:q8_0"]
    _golden_outputs(repo, settings)

    # 2. pushed, then pulled into a fresh clone
    repo.commit_all("register tiny-qwen2")
    git(repo.root.parent, "clone", "-q", str(repo.root), "clone")
    clone = Repo(repo.root.parent / "clone", repo.remote, repo.work)
    pulled = subprocess.run([sys.executable, "-m", "pipelines.cli", "pull", "tiny-qwen2:q8_0"], env=clone.env(),
                            capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr
    m = find_manifest(clone.settings(), "tiny-qwen2:q8_0")
    assert (clone.root / m.dvc.path / m.file).stat().st_size == m.size_bytes

    # 3. nothing changed: every task is a cache hit, nothing is rewritten
    stamps = {p: p.stat().st_mtime_ns for p in (repo.root / "registry").rglob("*.json")}
    again = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--watch")
    assert again.returncode == 0, again.stdout + again.stderr
    run = flow_runs(settings)[-1]
    with stack.api(settings) as client:
        states = [(r.name, r.state.name) for r in task_runs(client, run.id)]
    # the site step runs again only because the registration was committed between the runs (its versions chart
    # reads git): what it is built from changed; every other step is a cache hit
    assert ("site", "Completed") in states
    assert states and {s for n, s in states if n != "site"} == {"Cached"}, [s for s in states if s[1] != "Cached"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    # 4. --param variants=[...] and an unknown model
    one = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--param", 'variants=["q8_0"]', "--watch")
    assert one.returncode == 0, one.stdout + one.stderr
    assert flow_runs(settings)[-1].parameters == {"model": "tiny-qwen2", "variants": ["q8_0"]}
    bad = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--param", "model=nope", "--watch")
    assert bad.returncode != 0
    failed = flow_runs(settings)[-1]
    assert failed.state.is_failed() and "no catalog entry named 'nope'" in (failed.state.message or "")
    # a variant the catalog does not list is refused before any work: no dvc.yaml stage could record it
    outside = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--param", 'variants=["q6_k"]', "--watch")
    assert outside.returncode != 0
    refused = flow_runs(settings)[-1]
    assert "dvc.yaml has no stage gguf@tiny-qwen2-q6_k" in (refused.state.message or "")
    with stack.api(settings) as client:
        assert task_runs(client, refused.id) == []


def _golden_outputs(repo: Repo, settings: Settings) -> None:
    """What the run published, against tests/golden (golden.py): manifests, Modelfile, card, the flow's table,
    `modelmint list` and `show`."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    places = {"repo": repo.root, "work": repo.work, "tmp": repo.root.parent}
    manifests = {tag: manifest_path(repo.settings(), "tiny-qwen2", tag).read_text() for tag in ("q4_k_m", "q8_0")}
    # the generated source the builds came from: its weights depend on the machine's CPU (golden.py)
    source = json.loads(manifests["q4_k_m"])["source"]["content_sha256"]
    for tag, text in manifests.items():
        golden.check(f"gguf/{tag}.manifest.json", text, source=source, **places)
    placed = repo.root / "artifacts/tiny-qwen2/q4_k_m"
    golden.check("gguf/q4_k_m.Modelfile", (placed / "Modelfile").read_text(), **places)
    golden.check("gguf/q4_k_m.README.md", (placed / "README.md").read_text(), source=source, **places)
    with stack.api(settings) as client:
        table = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["convert-tiny-qwen2-variants"])))
    golden.check("gguf/flow-table.json", table[0].data if isinstance(table[0].data, str) else json.dumps(table[0].data),
                 source=source, **places)
    cli = [sys.executable, "-m", "pipelines.cli"]
    env = {k: v for k, v in repo.env().items() if k != "COLUMNS"}
    listed = subprocess.run([*cli, "list"], env=env, capture_output=True, text=True, cwd=repo.root)
    golden.check("gguf/list.txt", listed.stdout, source=source, **places)
    shown = subprocess.run([*cli, "show", "tiny-qwen2:q4_k_m"], env=env, capture_output=True, text=True, cwd=repo.root)
    golden.check("gguf/show-q4_k_m.json", shown.stdout, source=source, **places)


def test_unknown_deployment_no_server_missing_work_pool_and_down(deployed) -> None:
    """The stack's error paths and its stop, on one stack (each start is ~30 s of Prefect server and worker)."""
    _, settings = deployed
    prefect_says = prefect(settings, "deployment", "run", "convert/nope")
    assert prefect_says.returncode != 0 and "not found" in (prefect_says.stdout + prefect_says.stderr).lower()
    ours = subprocess.run([sys.executable, "-m", "flows.stack", "run", "convert/nope"], capture_output=True,
                          text=True, env={**os.environ})
    assert ours.returncode == 1
    assert "no deployment named 'convert/nope'" in ours.stderr and "convert/tiny-qwen2" in ours.stderr
    elsewhere = {**os.environ, "MODELMINT_PREFECT_PORT": str(free_port())}
    down = subprocess.run([sys.executable, "-m", "flows.stack", "run", "convert/tiny-qwen2"], capture_output=True,
                          text=True, env=elsewhere)
    assert down.returncode == 1 and "no Prefect server answers" in down.stderr and "scripts/up.sh" in down.stderr

    # up again is idempotent (the same processes)
    state = stack.up(settings, say=lambda _msg: None)
    assert stack.healthy(settings.prefect_api_url) and stack.worker_online(settings)
    again = stack.up(settings, say=lambda _msg: None)
    assert (again.server_pid, again.worker_pid) == (state.server_pid, state.worker_pid)

    # a work pool deleted under the stack is named
    with stack.api(settings) as client:
        client.delete_work_pool(stack.WORK_POOL)
    ours = subprocess.run([sys.executable, "-m", "flows.stack", "run", "convert/tiny-qwen2"], capture_output=True,
                          text=True, env={**os.environ})
    assert ours.returncode == 1 and "work pool modelmint-local does not exist" in ours.stderr

    # down stops both
    stack.down(settings, say=lambda _msg: None)
    assert not stack.healthy(settings.prefect_api_url)
    for pid in (state.server_pid, state.worker_pid):
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


@pytest.mark.heavy  # four flow runs, one killed mid-step: minutes; nightly (test_flow_faults kills runs in CI's run)
@pytest.mark.parametrize("deployed", [["q5_k_m", "q6_k", "q3_k_m"]], indirect=True)
def test_same_model_runs_serialize_and_a_killed_run_leaves_no_manifest(deployed) -> None:
    repo, settings = deployed
    # Two runs of the same model at once, each with work to do: the second waits for the first.
    results: list[subprocess.CompletedProcess[str]] = []

    def launch(variant: str) -> None:
        results.append(prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--param",
                                f'variants=["{variant}"]', "--watch"))

    threads = [threading.Thread(target=launch, args=(v,)) for v in ("q5_k_m", "q6_k")]
    for t in threads:
        t.start()
        time.sleep(1)
    for t in threads:
        t.join(900)
    assert [r.returncode for r in results] == [0, 0], [r.stdout + r.stderr for r in results]
    a, b = flow_runs(settings)[-2:]
    with stack.api(settings) as client:
        spans = [[(r.start_time, r.end_time) for r in task_runs(client, fr.id) if r.start_time] for fr in (a, b)]
    first, second = sorted(spans, key=lambda s: min(t[0] for t in s))
    assert max(end for _, end in first) <= min(start for start, _ in second), "runs of one model interleaved"

    # A run killed mid-way (SIGKILL of its process, while it quantizes or validates) registers nothing ...
    submitted = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--param", 'variants=["q3_k_m"]')
    assert submitted.returncode == 0
    run = wait_for(lambda: [r for r in flow_runs(settings) if r.parameters.get("variants") == ["q3_k_m"]],
                    120, "the flow run")[-1]

    def busy() -> bool:
        with stack.api(settings) as client:
            return any(t.state is not None and t.state.name == "Running" and t.name.split("-")[0] in ("quantize", "validate")
                       for t in task_runs(client, run.id))

    wait_for(busy, 300, "quantize/validate to start")
    pid = wait_for(lambda: stack.flow_run_process(run.id), 30, "the flow run's process")
    os.kill(pid, signal.SIGKILL)
    with stack.api(settings) as client:
        wait_for(lambda: client.read_flow_run(run.id).state.is_final(), 120, "the worker to notice")
        assert client.read_flow_run(run.id).state.name in ("Crashed", "Failed")
    assert not manifest_path(repo.settings(), "tiny-qwen2", "q3_k_m").exists()
    # ... and the next run completes it (once the killed run's model slot lease has lapsed).
    again = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--param", 'variants=["q3_k_m"]', "--watch")
    assert again.returncode == 0, again.stdout + again.stderr
    assert find_manifest(repo.settings(), "tiny-qwen2:q3_k_m").validation.passed
