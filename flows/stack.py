"""The embedded default: a local Prefect server (SQLite, 127.0.0.1), the work pool, the deployments, a worker.

    python -m flows.stack up       start what is not running, deploy prefect.yaml, print the UI address
    python -m flows.stack status   what is running
    python -m flows.stack run convert/tiny-qwen2 [--param k=v]   check the stack, then `prefect deployment run`
    python -m flows.stack down     stop the worker, then the server
    python -m flows.stack api-url  the API URL to export as PREFECT_API_URL

The server and the worker are long-lived processes, so they are started here in their own session (not
through pipelines.runner, which runs tools to completion); their pids and logs live in PREFECT_HOME/stack.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.errors import ModelmintError, OrchestratorError
from pipelines.runner import run as run_tool
from pipelines.settings import Settings, project_root

WORK_POOL = "modelmint-local"
WORKER_NAME = "modelmint-local-worker"
GPU_LIMIT = "gpu"


def stack_env(settings: Settings) -> dict[str, str]:
    """The environment of every Prefect process of the embedded stack."""
    return {
        "PREFECT_HOME": str(settings.prefect_dir),
        "PREFECT_API_URL": settings.prefect_api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "DVC_NO_ANALYTICS": "1",
        # Workers poll every 2 s instead of 10: a run starts about as soon as it is scheduled.
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        # pipelines logs (what each step ran) show in the run's log in the UI.
        "PREFECT_LOGGING_EXTRA_LOGGERS": "pipelines",
        # The server can take 8-18 s to start on a loaded 2-core machine; the default limit is 20 s.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    }


@dataclass
class StackState:
    api_url: str
    server_pid: int | None = None
    worker_pid: int | None = None

    @staticmethod
    def path(settings: Settings) -> Path:
        return settings.prefect_dir / "stack" / "state.json"

    @classmethod
    def load(cls, settings: Settings) -> StackState:
        try:
            return cls(**json.loads(cls.path(settings).read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return cls(api_url=settings.prefect_api_url)

    def save(self, settings: Settings) -> None:
        from pipelines.fsutil import write_text_atomic

        self.path(settings).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path(settings), json.dumps(self.__dict__, indent=2) + "\n")


# ---------------------------------------------------------------- processes


def _log_path(settings: Settings, name: str) -> Path:
    return settings.prefect_dir / "stack" / f"{name}.log"


def _spawn(settings: Settings, name: str, argv: list[str]) -> int:
    """Start a long-lived process in its own session (its own process group: a signal reaches all of it)."""
    log = _log_path(settings, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, cwd=project_root(),
            env={**os.environ, **stack_env(settings)}, start_new_session=True,
        )
    return proc.pid


def _is_ours(pid: int | None) -> bool:
    """A live process that is a Prefect process (a pid from an old state file may have been reused)."""
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own exited child
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and b"prefect" in cmdline


def _stop(pid: int | None, grace_s: float = 10.0) -> bool:
    """Stop a process group: SIGTERM, SIGTERM again, then SIGKILL.

    A worker started in the background of a non-interactive shell ignores the first SIGTERM; the second
    one (or SIGKILL after the grace period) ends it. Returns whether anything had to be stopped.
    """
    if not _is_ours(pid):
        return False
    assert pid is not None
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _is_ours(pid):
                return True
            time.sleep(0.2)
    return True


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# ---------------------------------------------------------------- the server


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    import httpx

    try:
        return httpx.get(f"{api_url}/health", timeout=timeout).json() is True
    except (httpx.HTTPError, ValueError):
        return False


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def require_server(settings: Settings) -> None:
    """Raises OrchestratorError, saying how to start one, when no Prefect server answers."""
    if not healthy(settings.prefect_api_url):
        raise OrchestratorError(
            f"no Prefect server answers at {settings.prefect_api_url}",
            hint="start the local stack with `bash scripts/up.sh` (MODELMINT_PREFECT_PORT chooses its port)",
        )


@contextlib.contextmanager
def api(settings: Settings) -> Iterator[Any]:
    """A Prefect client for the stack's server (settings scoped to this block, os.environ untouched)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: settings.prefect_api_url}), get_client(sync_client=True) as c:
        yield c


def start_server(settings: Settings, state: StackState, timeout_s: float = 120.0) -> bool:
    """Start the server unless one answers already; returns whether it was started here."""
    if healthy(settings.prefect_api_url):
        return False
    if _port_taken(settings.prefect_port):
        raise OrchestratorError(
            f"port {settings.prefect_port} on 127.0.0.1 is taken by something that is not a Prefect server",
            hint="stop it, or choose another port with MODELMINT_PREFECT_PORT=4300",
        )
    state.server_pid = _spawn(settings, "server", [
        sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
        "--port", str(settings.prefect_port), "--analytics-off",
    ])
    state.save(settings)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(settings.prefect_api_url):
            return True
        if not _is_ours(state.server_pid):
            break
        time.sleep(0.5)
    _stop(state.server_pid)
    raise OrchestratorError(
        f"the Prefect server did not come up at {settings.prefect_api_url}:\n"
        f"{_tail(_log_path(settings, 'server'))}",
        hint=f"see {_log_path(settings, 'server')}",
    )


# ---------------------------------------------------------------- pool, limits, deployments, worker


def ensure_pool_and_limits(settings: Settings) -> None:
    """The process work pool (before `prefect deploy`, which fails without it) and the concurrency limits."""
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
        WorkPoolCreate,
    )
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from flows.convert import model_limit
    from pipelines.catalog import load_catalog

    limits = {GPU_LIMIT: settings.gpu_slots} | {model_limit(m.name): 1 for m in load_catalog(settings.catalog_path).models}
    with api(settings) as client:
        try:
            client.read_work_pool(WORK_POOL)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_work_pool(WorkPoolCreate(name=WORK_POOL, type="process"))
        for name, limit in limits.items():
            try:
                client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                with contextlib.suppress(ObjectAlreadyExists):
                    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))
            else:
                client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=limit))


def deploy(settings: Settings) -> None:
    """`prefect deploy --all` from the checkout: every deployment in prefect.yaml, pinned to this directory."""
    run_tool(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"],
        cwd=project_root(), env=stack_env(settings), timeout=300,
        hint="check prefect.yaml; `prefect deploy --all` from the repository root shows the same error",
    )


def worker_online(settings: Settings) -> bool:
    with api(settings) as client:
        workers = client.read_workers_for_work_pool(WORK_POOL)
    return any(w.name == WORKER_NAME and str(w.status).upper().endswith("ONLINE") for w in workers)


def start_worker(settings: Settings, state: StackState, timeout_s: float = 60.0) -> bool:
    """Start the process worker unless ours runs already; returns whether it was started here."""
    if _is_ours(state.worker_pid):
        return False
    state.worker_pid = _spawn(settings, "worker", [
        sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL, "--type", "process",
        "--name", WORKER_NAME, "--no-create-pool-if-not-found",
    ])
    state.save(settings)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _is_ours(state.worker_pid):
            break
        if worker_online(settings):
            return True
        time.sleep(0.5)
    _stop(state.worker_pid)
    raise OrchestratorError(
        f"the Prefect worker did not come online:\n{_tail(_log_path(settings, 'worker'))}",
        hint=f"see {_log_path(settings, 'worker')}",
    )


# ---------------------------------------------------------------- commands


def up(settings: Settings, *, say: Any = print) -> StackState:
    """Server → work pool and limits → deployments → worker. Each part is reused when it runs already."""
    state = StackState.load(settings)
    state.api_url = settings.prefect_api_url
    started = start_server(settings, state)
    say(f"• Prefect server {'started' if started else 'already running'} at {settings.prefect_api_url}")
    ensure_pool_and_limits(settings)
    say(f"• work pool {WORK_POOL} and concurrency limits ready")
    deploy(settings)
    say("• deployments from prefect.yaml deployed")
    started = start_worker(settings, state)
    say(f"• worker {'started' if started else 'already running'} (pid {state.worker_pid})")
    state.save(settings)
    ui = settings.prefect_api_url.removesuffix("/api")
    say(f"\nPrefect UI: {ui}\nUse it from this shell:  export PREFECT_API_URL={settings.prefect_api_url}")
    return state


def down(settings: Settings, *, say: Any = print) -> None:
    state = StackState.load(settings)
    for name, pid in (("worker", state.worker_pid), ("server", state.server_pid)):
        say(f"• {name} {'stopped' if _stop(pid) else 'was not running'}")
    StackState(api_url=state.api_url).save(settings)


def status(settings: Settings, *, say: Any = print) -> bool:
    state = StackState.load(settings)
    ok = healthy(settings.prefect_api_url)
    say(f"server  {settings.prefect_api_url}: {'healthy' if ok else 'not running'}"
        + (f" (pid {state.server_pid})" if _is_ours(state.server_pid) else ""))
    say(f"worker  {f'running (pid {state.worker_pid})' if _is_ours(state.worker_pid) else 'not running'}")
    return ok and _is_ours(state.worker_pid)


def check_deployment(settings: Settings, deployment: str) -> None:
    """Raises OrchestratorError unless the server runs, the work pool exists and `deployment` is deployed."""
    from prefect.exceptions import ObjectNotFound

    require_server(settings)
    with api(settings) as client:
        try:
            client.read_work_pool(WORK_POOL)
        except ObjectNotFound:
            raise OrchestratorError(
                f"work pool {WORK_POOL} does not exist on {settings.prefect_api_url}",
                hint="`bash scripts/up.sh` creates it, deploys and starts a worker",
            ) from None
        try:
            client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            known = _deployment_names(client)
            raise OrchestratorError(
                f"no deployment named {deployment!r} (deployed: {', '.join(known) or 'none'})",
                hint="deployments are named convert/<catalog name>; `modelmint catalog list` shows the names, "
                "and `bash scripts/up.sh` deploys prefect.yaml",
            ) from None


def _deployment_names(client: Any) -> list[str]:
    flows = {f.id: f.name for f in client.read_flows()}
    return sorted(f"{flows.get(d.flow_id, '?')}/{d.name}" for d in client.read_deployments())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up")
    sub.add_parser("down")
    sub.add_parser("status")
    sub.add_parser("api-url", help="print the API URL (for PREFECT_API_URL)")
    runp = sub.add_parser("run")
    runp.add_argument("deployment", help="e.g. convert/tiny-qwen2")
    runp.add_argument("--param", action="append", default=[], help="key=value (JSON values), repeatable")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    try:
        if args.cmd == "up":
            up(settings)
        elif args.cmd == "down":
            down(settings)
        elif args.cmd == "status":
            return 0 if status(settings) else 1
        elif args.cmd == "api-url":
            print(settings.prefect_api_url)
        elif args.cmd == "run":
            check_deployment(settings, args.deployment)
            argv_run = [sys.executable, "-m", "prefect", "deployment", "run", args.deployment, "--watch"]
            for p in args.param:
                argv_run += ["--param", p]
            env = {**os.environ, **stack_env(settings)}
            os.execve(sys.executable, argv_run, env)
    except ModelmintError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"→ {err.hint}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
