"""Whose stack is it: two checkouts sharing one MODELMINT_HOME, and a pid the state file no longer owns.

Real Prefect servers and workers on 127.0.0.1 (flows/stack/):
  two checkouts (copies of this one) on two ports with one MODELMINT_HOME: each one's up, status and down see and
  stop its own server and worker only, its deployments run from its own directory, and a checkout that asks for
  the other's port is refused with the owner named
  a state file whose worker pid now belongs to an unrelated process with "prefect" in its command line: status
  says not running, up starts a worker, down leaves that process alone
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from registry_env import ROOT, free_port, isolate

from flows import stack
from pipelines.core.settings import Settings

pytestmark = pytest.mark.slow

_NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "artifacts", "__pycache__", ".mypy_cache",
                                     ".ruff_cache", "*.egg-info", ".prefect", "tests", "benchmarks", "docs")


def _checkout(dest: Path) -> Path:
    """A second copy of this checkout's files (its own directory, as a clone is)."""
    shutil.copytree(ROOT, dest, ignore=_NOT_COPIED, symlinks=True)
    return dest


def _stack(checkout: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`modelmint stack ARGS` run from `checkout` (its own code: python -m with the checkout first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "MODELMINT_PREFECT_PORT": str(port), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "stack", *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)


def _worker_pid(status: subprocess.CompletedProcess[str]) -> int:
    found = re.search(r"worker\s+running \(pid (\d+)\)", status.stdout)
    assert found, status.stdout + status.stderr
    return int(found.group(1))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _deployment_dirs(port: int) -> set[str]:
    """The directories the deployments on the server at `port` run from (their set_working_directory pull step)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}), \
            get_client(sync_client=True) as client:
        deployments = client.read_deployments()
    return {str(step["prefect.deployments.steps.set_working_directory"]["directory"])
            for d in deployments for step in d.pull_steps or [] if "prefect.deployments.steps.set_working_directory" in step}


def _kill_recorded(home: Path) -> None:
    """SIGKILL the process group of every Prefect process a stack state under `home` records (a failed test's
    leftovers: `down` stops the rest)."""
    for path in home.rglob("state.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            for pid in (data.get("worker_pid"), data.get("server_pid")):
                if pid and b"prefect" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def shared_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One MODELMINT_HOME for every checkout, with no Prefect home set: each stack derives its own."""
    isolate(tmp_path / "env", monkeypatch)
    for key in ("MODELMINT_PREFECT_HOME", "PREFECT_HOME", "MODELMINT_PREFECT_PORT"):
        monkeypatch.delenv(key, raising=False)
    # prefect.yaml's watch-upstream deployment has a cron schedule: nothing here should start a run
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED", "false")
    return Path(os.environ["MODELMINT_HOME"])


def test_two_checkouts_sharing_one_home_run_two_stacks_that_never_touch(shared_home: Path, tmp_path: Path) -> None:
    a, b = _checkout(tmp_path / "a"), _checkout(tmp_path / "b")
    port_a, port_b = free_port(), free_port()
    try:
        for checkout, port in ((a, port_a), (b, port_b)):
            done = _stack(checkout, port, "up")
            assert done.returncode == 0, done.stdout + done.stderr
        status_a, status_b = _stack(a, port_a, "status"), _stack(b, port_b, "status")
        assert status_a.returncode == 0 and status_b.returncode == 0, status_a.stdout + status_b.stdout
        worker_a, worker_b = _worker_pid(status_a), _worker_pid(status_b)
        assert worker_a != worker_b, "the second checkout's status named the first one's worker"
        for worker, checkout, port in ((worker_a, a, port_a), (worker_b, b, port_b)):
            assert _environ(worker)["PREFECT_API_URL"] == f"http://127.0.0.1:{port}/api"
            assert Path(f"/proc/{worker}/cwd").resolve() == checkout.resolve()
        assert _deployment_dirs(port_a) == {str(a)} and _deployment_dirs(port_b) == {str(b)}

        # The first checkout's port asked for from the second: refused, naming the owner, and nothing of A moves.
        for command in (["up"], ["status"], ["down"], ["doctor"], ["run", "convert/tiny-qwen2"]):
            refused = _stack(b, port_a, *command)
            assert refused.returncode == 1 and str(a) in refused.stderr, (command, refused.stdout + refused.stderr)
            assert "Traceback" not in refused.stderr and "modelmint stack down" in refused.stderr
        assert _deployment_dirs(port_a) == {str(a)}, "the second checkout re-pointed the first one's deployments"

        down_b = _stack(b, port_b, "down")
        assert down_b.returncode == 0, down_b.stdout + down_b.stderr
        assert _stack(b, port_b, "status").returncode == 1
        again = _stack(a, port_a, "status")
        assert again.returncode == 0 and _worker_pid(again) == worker_a, again.stdout + again.stderr
        assert stack.healthy(f"http://127.0.0.1:{port_a}/api")
    finally:
        for checkout, port in ((a, port_a), (b, port_b)):
            _stack(checkout, port, "down")
        _kill_recorded(shared_home)


def test_a_stale_worker_pid_of_an_unrelated_prefect_process_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate(tmp_path / "env", monkeypatch)
    monkeypatch.setenv("MODELMINT_PREFECT_PORT", str(free_port()))
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED", "false")
    settings = Settings.from_env()
    # Not a worker: a process that only has the word in its command line, as any `prefect ...` command would.
    imposter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "prefect", "worker"],
                                start_new_session=True)
    try:
        # A state file left by a stack that stopped without `down` (the machine went down); its worker's pid is
        # the imposter's now.
        path = stack.StackState.path(settings)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"api_url": settings.prefect_api_url, "worker_pid": imposter.pid}))
        said: list[str] = []
        stack.status(settings, say=said.append)
        assert "worker  not running" in said, said
        said = []
        try:
            stack.up(settings, say=said.append)
            assert any(line.startswith("• worker started") for line in said), said
            worker = stack.StackState.load(settings).worker_pid
            assert worker != imposter.pid and stack.worker_online(settings)
            said = []
        finally:
            stack.down(settings, say=said.append)
        assert "• worker stopped" in said, said
        assert imposter.poll() is None, "down stopped an unrelated process"
        assert not stack._is_ours(imposter.pid, stack._started(imposter.pid) + 1)  # reused pid, other start time
    finally:
        imposter.kill()
        imposter.wait()
