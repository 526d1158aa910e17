"""`modelmint stack` (pipelines/cli/stack.py) and its old name `python -m flows.stack`: the same commands, one error
edge; on a stack that is not up each says so and how to start it, and for real it starts, checks and stops one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from registry_env import free_port, make_repo

MODELMINT = [str(Path(sys.executable).parent / "modelmint"), "stack"]
ALIAS = [sys.executable, "-m", "flows.stack"]


@pytest.fixture
def down_env(isolated: Path, tmp_path: Path) -> dict[str, str]:
    """A fresh home whose stack was never started (`isolated`: Prefect's home too), on a port nothing listens on."""
    env = {
        **os.environ,
        "MODELMINT_HOME": str(tmp_path / "home"),
        "MODELMINT_REPO": str(tmp_path / "repo"),
        "MODELMINT_PREFECT_PORT": str(free_port()),
        "COLUMNS": "400",
    }
    env.pop("MODELMINT_DEBUG", None)
    return env


def _run(
    cli: list[str], env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("cli", [MODELMINT, ALIAS], ids=["modelmint stack", "python -m flows.stack"])
def test_status_on_a_stack_that_is_not_up_says_so_and_how_to_start_it(
    down_env: dict[str, str], cli: list[str]
) -> None:
    url = f"http://127.0.0.1:{down_env['MODELMINT_PREFECT_PORT']}/api"
    proc = _run(cli, down_env, "status")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [f"server  {url}: not running", "worker  not running"], proc.stdout
    assert _errors(proc.stderr) == [
        f"error: the local stack at {url} is not up: no Prefect server answers; no worker of the stack runs"
    ]
    assert "`modelmint stack up` starts what is not running" in proc.stderr


@pytest.mark.parametrize("command", [["doctor"], ["doctor", "--fix"], ["run", "convert/tiny-qwen2"]])
@pytest.mark.parametrize("cli", [MODELMINT, ALIAS], ids=["modelmint stack", "python -m flows.stack"])
def test_doctor_and_run_on_a_stack_that_is_not_up_name_the_server(
    down_env: dict[str, str], cli: list[str], command: list[str]
) -> None:
    url = f"http://127.0.0.1:{down_env['MODELMINT_PREFECT_PORT']}/api"
    proc = _run(cli, down_env, *command)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert _errors(proc.stderr) == [f"error: no Prefect server answers at {url}"], proc.stderr
    assert "`modelmint stack up`" in proc.stderr and "scripts/up.sh" in proc.stderr and proc.stdout == ""


def test_the_alias_goes_through_the_one_error_edge(down_env: dict[str, str]) -> None:
    """A setting that is not a number was a traceback under `python -m flows.stack` (its settings were read outside
    its own error printer); a usage error is typer's, under the alias's name."""
    bad = _run(ALIAS, {**down_env, "MODELMINT_PREFECT_PORT": "four"}, "status")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    errors = _errors(bad.stderr)
    assert len(errors) == 1 and "MODELMINT_PREFECT_PORT" in errors[0] and "'four'" in errors[0], bad.stderr
    usage = _run(ALIAS, down_env, "doctor", "--bogus")
    assert usage.returncode == 2 and "Usage: python -m flows.stack doctor" in usage.stderr, usage.stderr
    assert "No such option: --bogus" in usage.stderr
    url = _run(ALIAS, down_env, "api-url")
    assert (
        url.returncode == 0 and url.stdout == f"http://127.0.0.1:{down_env['MODELMINT_PREFECT_PORT']}/api\n"
    )


def test_down_on_a_stack_that_is_not_up_stops_nothing(down_env: dict[str, str]) -> None:
    proc = _run(MODELMINT, down_env, "down")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["• worker was not running", "• server was not running"], proc.stdout


@pytest.mark.slow
def test_up_status_doctor_down_for_real(isolated: Path, tmp_path: Path) -> None:
    """The commands on a real stack (server, pool, deployments, worker) on a free port against a temp project."""
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0"]})
    env = {
        **repo.env(),
        "MODELMINT_PREFECT_PORT": str(free_port()),
        "COLUMNS": "400",
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
    }
    env.pop("MODELMINT_DEBUG", None)
    try:
        up = _run(MODELMINT, env, "up", timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "• Prefect server started" in up.stdout and "• worker started" in up.stdout, up.stdout
        status = _run(MODELMINT, env, "status")
        assert status.returncode == 0 and ": healthy" in status.stdout and "running (pid" in status.stdout, (
            status
        )
        doctor = _run(ALIAS, env, "doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "runs whose process is gone: none" in doctor.stdout and "model-tiny-qwen2" in doctor.stdout
        again = _run(MODELMINT, env, "up", timeout=600)
        assert "already running" in again.stdout and again.returncode == 0, again.stdout + again.stderr
    finally:
        down = _run(MODELMINT, env, "down")
    assert down.returncode == 0 and "• worker stopped" in down.stdout and "• server stopped" in down.stdout, (
        down
    )
    after = _run(MODELMINT, env, "status")
    assert after.returncode == 1 and "not running" in after.stdout
