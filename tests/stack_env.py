"""Helpers for tests that drive the embedded Prefect stack (flows/stack.py) for real: the `prefect` CLI with
the stack's environment, the runs on record, waiting with a bound, the logs of a run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from registry_env import Repo, free_port, make_repo

from flows import stack
from pipelines.core.settings import Settings

PREFECT = [sys.executable, "-m", "prefect"]
T = TypeVar("T")


def prefect(settings: Settings, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.stack_env(settings), "COLUMNS": "200"}
    return subprocess.run([*PREFECT, *args], env=env, capture_output=True, text=True, timeout=timeout)


@contextmanager
def stack_up(base: Path, mp: pytest.MonkeyPatch, models: dict[str, list[str]], **env: str) -> Iterator[tuple[Repo, Settings]]:
    """The embedded stack up on a free port against a temp project under `base` (its git + DVC repository with a
    local remote, and `models` in its catalog); `env` sets more settings. Down again, whatever the test did."""
    repo = make_repo(base, models=models)
    mp.setenv("MODELMINT_REPO", str(repo.root))
    mp.setenv("MODELMINT_WORK_DIR", str(repo.work))
    mp.setenv("MODELMINT_PREFECT_PORT", str(free_port()))
    # prefect.yaml's watch-upstream deployment has a cron schedule: a test counts only the runs it starts itself
    mp.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED", "false")
    for k, v in env.items():
        mp.setenv(k, v)
    settings = Settings.from_env()
    try:
        stack.up(settings, say=lambda _msg: None)
        yield repo, settings
    finally:
        stack.down(settings, say=lambda _msg: None)


def flow_runs(settings: Settings) -> list[Any]:
    with stack.api(settings) as client:
        return sorted(client.read_flow_runs(), key=lambda r: r.created)


def wait_for(pred: Callable[[], T], timeout: float, what: str) -> T:
    """Poll `pred` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def run_logs(settings: Settings, flow_run_id: Any) -> str:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with stack.api(settings) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)
    return "\n".join(f"{log.name}: {log.message}" for log in logs)
