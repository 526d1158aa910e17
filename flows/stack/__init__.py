"""The embedded default: a local Prefect server (SQLite, 127.0.0.1), the work pool, the deployments, a worker.

    modelmint stack up       start what is not running, deploy prefect.yaml, print the UI address
    modelmint stack status   what is running
    modelmint stack run convert/tiny-qwen2 [--param k=v]   check the stack, then `prefect deployment run`
    modelmint stack doctor [--fix]   held slots (who, since when), runs whose process died, and the fix
    modelmint stack down     stop the worker and every process of its runs (marked Crashed, their slots freed; a run
                             already registering is let finish), then the server
    modelmint stack api-url  the API URL to export as PREFECT_API_URL

`python -m flows.stack CMD` is the same command line under its old name (__main__.py beside this). The commands
themselves are pipelines/cli/stack.py, over the functions here; their errors go through the CLI's one edge.

One stack per Prefect home and port: PREFECT_HOME is MODELMINT_HOME/prefect/<checkout>-<hash>-<port> unless
MODELMINT_PREFECT_HOME names one, and its state file records the owner checkout and port; a command asked to act
on another checkout's live stack refuses, naming it.

The server and the worker are long-lived processes, so they are started here in their own session (not
through pipelines.core.runner, which runs tools to completion); their pids and logs live in PREFECT_HOME/stack.
"""
from __future__ import annotations

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

from flows.slots import GPU_LIMIT, clock, ensure_limit, model_limit, read_leases, run_label
from pipelines.core.errors import OrchestratorError
from pipelines.core.runner import run as run_tool
from pipelines.core.runner import tool_env
from pipelines.core.settings import Settings, project_root

WORK_POOL = "modelmint-local"
WORKER_NAME = "modelmint-local-worker"
HEARTBEAT_S = 30
"""Flow runs started by the worker send a heartbeat this often (Prefect's minimum; its default is 180)."""
CRASH_AUTOMATION = "modelmint: mark runs whose heartbeats stopped as Crashed"
RUN_TAG = "modelmint"
"""prefect.yaml tags every deployment with it; the crash automation watches only runs that carry it."""


def stack_env(settings: Settings) -> dict[str, str]:
    """The environment of every Prefect process of the embedded stack."""
    return {
        "PREFECT_HOME": str(settings.prefect_dir),
        "PREFECT_API_URL": settings.prefect_api_url,
        # The flow runs' own Settings name the same stack (its home holds the slot leases they report on).
        "MODELMINT_PREFECT_HOME": str(settings.prefect_dir),
        "MODELMINT_PREFECT_PORT": str(settings.prefect_port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "DVC_NO_ANALYTICS": "1",
        # Workers poll every 2 s instead of 10: a run starts about as soon as it is scheduled.
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        # pipelines logs (what each step ran) show in the run's log in the UI.
        "PREFECT_LOGGING_EXTRA_LOGGERS": "pipelines",
        # The server can take 8-18 s to start on a loaded 2-core machine; the default limit is 20 s.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        # Concurrency leases on disk, not in the server's memory: a restarted server still knows who holds each
        # slot, so a dead holder's slot lapses (LEASE_S) instead of staying taken forever.
        "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect.server.concurrency.lease_storage.filesystem",
        # Runs announce they are alive every HEARTBEAT_S; the crash automation acts on the silence.
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
    }


@dataclass
class StackState:
    """What `up` started: whose stack it is (the checkout its deployments run from, its port) and its processes,
    each a pid with its start time (/proc/PID/stat starttime): a pid alone may have been reused since."""

    api_url: str
    checkout: str | None = None
    port: int | None = None
    server_pid: int | None = None
    server_started: int | None = None
    worker_pid: int | None = None
    worker_started: int | None = None

    @staticmethod
    def path(settings: Settings) -> Path:
        return settings.prefect_dir / "stack" / "state.json"

    @classmethod
    def read(cls, path: Path) -> StackState | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    @classmethod
    def load(cls, settings: Settings) -> StackState:
        return cls.read(cls.path(settings)) or cls.fresh(settings)

    @classmethod
    def fresh(cls, settings: Settings) -> StackState:
        return cls(api_url=settings.prefect_api_url, checkout=str(project_root()), port=settings.prefect_port)

    def save(self, settings: Settings) -> None:
        """Write it as the state of the stack `settings` name: whoever saves it (after refuse_foreign) is its owner."""
        from pipelines.core.fsutil import write_text_atomic

        self.checkout, self.port = str(project_root()), settings.prefect_port
        self.path(settings).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path(settings), json.dumps(self.__dict__, indent=2) + "\n")

    def server_alive(self) -> bool:
        return _is_ours(self.server_pid, self.server_started)

    def worker_alive(self) -> bool:
        return _is_ours(self.worker_pid, self.worker_started)

    def is_of(self, settings: Settings) -> bool:
        """Whether this is the state of the stack `settings` name: this checkout, this port."""
        return self.checkout == str(project_root()) and self.port == settings.prefect_port


def _owner_elsewhere(settings: Settings, *, home: bool) -> tuple[Path, StackState] | None:
    """Another stack whose server lives on this stack's port (another checkout's, or one started with another
    PREFECT_HOME), or with `home`, in this stack's Prefect home (one MODELMINT_PREFECT_HOME given to two checkouts
    or ports); None when there is none."""
    mine = StackState.path(settings)
    for path in dict.fromkeys([mine, *sorted((settings.home / "prefect").glob("*/stack/state.json"))]):
        other = StackState.read(path)
        if other is None or (path == mine and other.is_of(settings)) or not other.server_alive():
            continue
        if other.port == settings.prefect_port or (home and path == mine):
            return path.parent.parent, other
    return None


def refuse_foreign(settings: Settings, *, home: bool = True) -> None:
    """Raises OrchestratorError, naming the owner, when this stack's port (or, with `home`, its Prefect home) is
    another stack's: one stack per Prefect home and port, so that `up`, `down` and `status` of one never act on
    another's server, worker or deployments. (`run` and `doctor` only talk to the server on the port: `home=False`.)
    """
    found = _owner_elsewhere(settings, home=home)
    if found is None:
        return
    prefect_home, other = found
    where = (f"port {other.port} serves the Prefect stack of the checkout {other.checkout}"
             if other.port == settings.prefect_port else
             f"the Prefect home {prefect_home} holds the live stack of the checkout {other.checkout} on port {other.port}")
    raise OrchestratorError(
        f"{where} (PREFECT_HOME {prefect_home}, server pid {other.server_pid}), not this one's ({project_root()}, "
        f"port {settings.prefect_port}): one stack per Prefect home and port",
        hint=f"stop it from its checkout (cd {other.checkout} && modelmint stack down), or give this checkout a port "
        "of its own (MODELMINT_PREFECT_PORT=4300 modelmint stack up) and leave MODELMINT_PREFECT_HOME unset: each "
        "checkout and port then gets its own Prefect home",
    )


# ---------------------------------------------------------------- processes


def _log_path(settings: Settings, name: str) -> Path:
    return settings.prefect_dir / "stack" / f"{name}.log"


def run_env(settings: Settings) -> dict[str, str]:
    """The environment `run` hands `prefect deployment run`: it only asks the API to start a run (the worker's
    flow runs have their own environment), so no credential variable goes with it."""
    return tool_env(stack_env(settings))


def _spawn(settings: Settings, name: str, argv: list[str], *, credentials: bool) -> int:
    """Start a long-lived process in its own session (its own process group: a signal reaches all of it).

    With `credentials` it inherits modelmint's environment whole: the worker's flow runs fetch from the hub and
    publish to the registry with them. Without (the server), every credential variable is left out, as for
    any tool (runner.tool_env)."""
    log = _log_path(settings, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **stack_env(settings)} if credentials else tool_env(stack_env(settings))
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, cwd=project_root(),
            env=env, start_new_session=True,
        )
    return proc.pid


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (the first is the state), or None when there is no such pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie has exited)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own exited child
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _started(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, it names one process for the machine's
    uptime, where a pid alone is reused."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _is_ours(pid: int | None, started: int | None) -> bool:
    """A live process that is the one recorded: the same pid and the same start time (a pid from an old state file
    may have been reused since, by anything; a state without a start time proves nothing)."""
    return bool(pid and started is not None and _alive(pid) and _started(pid) == started)


def _stop(pid: int | None, started: int | None = None, grace_s: float = 10.0) -> bool:
    """Stop a process group: SIGTERM, SIGTERM again, then SIGKILL. With `started`, only if `pid` is still the
    process recorded with that start time (without, the caller has just started it and vouches for it).

    A worker started in the background of a non-interactive shell ignores the first SIGTERM; the second
    one (or SIGKILL after the grace period) ends it. Returns whether anything had to be stopped.
    """
    if not pid or not (_is_ours(pid, started) if started is not None else _alive(pid)):
        return False
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace_s
        # Wait for the exit itself: an exiting process has an empty cmdline for a moment while it still runs.
        while time.monotonic() < deadline:
            if not _alive(pid):
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


def _healthy_within(api_url: str, patience_s: float = 30.0) -> bool:
    """healthy(), asked again with longer waits until `patience_s` has passed."""
    deadline = time.monotonic() + patience_s
    while (left := deadline - time.monotonic()) > 0:
        if healthy(api_url, timeout=min(10.0, max(left, 0.5))):
            return True
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))
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
            hint="start the local stack with `modelmint stack up` (what bash scripts/up.sh runs; "
            "MODELMINT_PREFECT_PORT chooses its port)",
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
    ], credentials=False)
    state.server_started = _started(state.server_pid)
    state.save(settings)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(settings.prefect_api_url):
            return True
        if not state.server_alive():
            break
        time.sleep(0.5)
    _stop(state.server_pid, state.server_started)
    raise OrchestratorError(
        f"the Prefect server did not come up at {settings.prefect_api_url}:\n"
        f"{_tail(_log_path(settings, 'server'))}",
        hint=f"see {_log_path(settings, 'server')}",
    )


# ---------------------------------------------------------------- pool, limits, deployments, worker


def ensure_pool_and_limits(settings: Settings) -> None:
    """The process work pool (before `prefect deploy`, which fails without it), the concurrency limits and the
    crash automation."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from pipelines.source.catalog import load_catalog

    limits = {GPU_LIMIT: settings.gpu_slots} | {model_limit(m.name): 1 for m in load_catalog(settings.catalog_path).models}
    with api(settings) as client:
        try:
            client.read_work_pool(WORK_POOL)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_work_pool(WorkPoolCreate(name=WORK_POOL, type="process"))
        for name, limit in limits.items():
            ensure_limit(client, name, limit, update=True)
        ensure_crash_automation(client, settings.prefect_crash_after_s)


def crash_automation(crash_after_s: int) -> Any:
    """Prefect's own answer to runs whose process died without a word (SIGKILL, OOM, a lost machine): a
    proactive trigger expecting each modelmint run's next heartbeat (or its end) within `crash_after_s`,
    and a forced change to Crashed when it does not come. It acts for any cause of death and needs no
    process of ours alive, which a worker-side sweep would (the sweep in `reap` covers what the automation
    cannot see: a run that died before its first heartbeat, while the server was down)."""
    from datetime import timedelta

    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    ends = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")}
    return AutomationCore(
        name=CRASH_AUTOMATION,
        description=f"A flow run tagged {RUN_TAG} that sends no heartbeat for {crash_after_s} s has no process "
        "left: it is marked Crashed, so it stops showing as Running and its rerun can start.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{RUN_TAG}"},
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *ends},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=crash_after_s),
        ),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED, name="Crashed", force=True,
            message=f"no heartbeat for {crash_after_s} s: the run's process is gone. Rerun it; finished steps "
            "are reused. (modelmint crash automation)",
        )],
    )


def ensure_crash_automation(client: Any, crash_after_s: int) -> None:
    """Create the crash automation, or replace one whose definition differs (idempotent)."""
    wanted = crash_automation(crash_after_s)
    existing = client.read_automations_by_name(CRASH_AUTOMATION)
    same = [a for a in existing if a.trigger == wanted.trigger and a.actions == wanted.actions and a.enabled]
    for a in existing:
        if a not in same[:1]:
            client.delete_automation(a.id)
    if not same:
        client.create_automation(wanted)


def deploy(settings: Settings) -> None:
    """`prefect deploy --all` from the checkout: every deployment in prefect.yaml, pinned to this directory."""
    run_tool(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"],
        cwd=project_root(), env=stack_env(settings), timeout=300,
        hint="check prefect.yaml; `prefect deploy --all` from the repository root shows the same error",
    )


def worker_online(settings: Settings) -> bool:
    """Whether the stack's own worker is online."""
    with api(settings) as client:
        workers = client.read_workers_for_work_pool(WORK_POOL)
    return any(w.name == WORKER_NAME and str(w.status).upper().endswith("ONLINE") for w in workers)


def workers_online(settings: Settings, client: Any) -> list[str]:
    """The names of the workers polling the work pool now (any worker will do to run a deployment).

    The server marks a worker offline only after three missed heartbeats (90 s); the stack's own worker is
    known here at once from its pid."""
    ours_alive = StackState.load(settings).worker_alive()
    return [w.name for w in client.read_workers_for_work_pool(WORK_POOL)
            if str(w.status).upper().endswith("ONLINE") and (w.name != WORKER_NAME or ours_alive)]


def start_worker(settings: Settings, state: StackState, timeout_s: float = 60.0) -> bool:
    """Start the process worker unless ours runs already; returns whether it was started here."""
    if state.worker_alive():
        return False
    state.worker_pid = _spawn(settings, "worker", [
        sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL, "--type", "process",
        "--name", WORKER_NAME, "--no-create-pool-if-not-found",
    ], credentials=True)
    state.worker_started = _started(state.worker_pid)
    state.save(settings)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not state.worker_alive():
            break
        if worker_online(settings):
            return True
        time.sleep(0.5)
    _stop(state.worker_pid, state.worker_started)
    raise OrchestratorError(
        f"the Prefect worker did not come online:\n{_tail(_log_path(settings, 'worker'))}",
        hint=f"see {_log_path(settings, 'worker')}",
    )


# ---------------------------------------------------------------- runs whose process died, slots they hold

LIVE_STATES = ("RUNNING", "CANCELLING", "PENDING")


def flow_run_processes(flow_run_id: Any, prefect_home: Path | None = None) -> list[int]:
    """The pids of the local processes of this flow run: the one the worker started (it sets PREFECT__FLOW_RUN_ID in
    its environment) and the tools under it, which inherit that environment, lowest pid first. With `prefect_home`,
    only those started by that stack's worker (it hands its PREFECT_HOME down)."""
    needles = {f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode()}
    if prefect_home is not None:
        needles.add(f"PREFECT_HOME={prefect_home}".encode())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needles <= set((proc / "environ").read_bytes().split(b"\0")) and _alive(int(proc.name)):
                found.append(int(proc.name))
        except OSError:
            continue
    return sorted(found)


def flow_run_process(flow_run_id: Any) -> int | None:
    """A pid of the local processes running this flow run (flow_run_processes), or None when it has none."""
    return next(iter(flow_run_processes(flow_run_id)), None)


def live_runs(client: Any) -> list[Any]:
    """Flow runs of the local work pool that the server thinks live (scheduled to run, pending or running)."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType

    return client.read_flow_runs(
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=[StateType(s) for s in LIVE_STATES]))),
        work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[WORK_POOL])),
    )


def dead_runs(client: Any, *, pending_grace_s: float = 300) -> list[Any]:
    """Flow runs of the local work pool that the server thinks live but that have no process on this machine.

    A Pending run gets `pending_grace_s` to start its process (the worker may be starting it right now)."""
    from datetime import UTC, datetime

    runs = live_runs(client)
    now = datetime.now(UTC)
    dead = []
    for run in runs:
        if flow_run_process(run.id) is not None:
            continue
        if run.state.type.value == "PENDING" and (now - run.state.timestamp).total_seconds() < pending_grace_s:
            continue
        dead.append(run)
    return dead


def reap(settings: Settings, client: Any, why: str, runs: list[Any] | None = None) -> list[str]:
    """Mark runs whose process is gone as Crashed and release the slots they hold; returns what was done."""
    from prefect.states import Crashed

    done = []
    runs = dead_runs(client) if runs is None else runs
    dead_ids = {str(r.id) for r in runs}
    for run in runs:
        # Its processes are gone now: a run that reached its end before they went keeps the state it ended in (a
        # run Completed has registered, and is not to be called Crashed); one its own engine called Crashed is
        # marked again with the reason.
        now = client.read_flow_run(run.id).state
        if now is not None and now.is_final() and not now.is_crashed():
            done.append(f"flow run '{run.name}' ({str(run.id)[:8]}) had ended {now.name} before it was stopped")
            continue
        crashed: Any = Crashed(message=f"{why}; rerun it: finished steps are reused")
        client.set_flow_run_state(run.id, crashed, force=True)
        # Its task runs went with it (a killed engine reports nothing): none is left showing Running.
        for task in _task_runs(client, run.id):
            if task.state is not None and not task.state.is_final():
                with contextlib.suppress(Exception):  # ended meanwhile: nothing to mark
                    client.set_task_run_state(task.id, crashed, force=True)
        done.append(f"flow run '{run.name}' ({str(run.id)[:8]}) marked Crashed: {why}")
    for lease in read_leases(settings.prefect_dir):
        if lease.holder in dead_ids:
            with contextlib.suppress(Exception):  # already revoked: nothing to free
                client.release_concurrency_slots_with_lease(lease.id)
                done.append(f"released the slot {run_label(client, lease.holder)} held since {clock(lease.since)}")
    return done


def doctor(settings: Settings, *, fix: bool = False, say: Any = print) -> bool:
    """Held slots (who, since when), runs whose process died, counts no lease accounts for; with `fix`,
    repair them. Returns whether everything was healthy (before any fix)."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    refuse_foreign(settings, home=False)
    require_server(settings)
    healthy_ = True
    with api(settings) as client:
        leases = [le for le in read_leases(settings.prefect_dir) if not le.lapsed]
        say("slots")
        orphaned: dict[str, int] = {}
        for limit in sorted(client.read_global_concurrency_limits(limit=200), key=lambda x: x.name):
            mine = [le for le in leases if str(limit.id) in le.limit_ids]
            say(f"  {limit.name:<28} {limit.active_slots}/{limit.limit}")
            for le in mine:
                say(f"      held by {run_label(client, le.holder)} since {clock(le.since)}, "
                    f"lease renewed until {clock(le.expires)}")
            if limit.active_slots > len(mine):
                healthy_ = False
                orphaned[limit.name] = len(mine)
                say(f"      {limit.active_slots - len(mine)} taken with no lease behind them (a server restarted with "
                    "in-memory lease storage leaks them): `--fix` sets the count to the live leases")
        if not workers_online(settings, client):
            healthy_ = False
            say(f"worker  none online in work pool {WORK_POOL}: runs wait as Late; `bash scripts/up.sh` starts one")
        dead = dead_runs(client)
        say("runs whose process is gone" + ("" if dead else ": none"))
        for run in dead:
            healthy_ = False
            say(f"  '{run.name}' ({run.id}) {run.state.name} since {clock(run.state.timestamp)}")
        if not fix:
            if not healthy_:
                say("fix: modelmint stack doctor --fix  (marks those runs Crashed, frees their slots and "
                    "counts no lease holds); then rerun them, finished steps are reused")
            return healthy_
        for line in reap(settings, client, "its process is gone (modelmint stack doctor --fix)", dead):
            say(f"fixed: {line}")
        for name, live in orphaned.items():
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=live))
            say(f"fixed: {name} count set to {live}, the leases that hold it")
    return healthy_


# ---------------------------------------------------------------- commands


def up(settings: Settings, *, say: Any = print) -> StackState:
    """Server → work pool and limits → deployments → worker. Each part is reused when it runs already.

    Raises OrchestratorError, naming the owner, when the port or the Prefect home is another checkout's stack."""
    refuse_foreign(settings)
    state = StackState.load(settings)
    if not state.is_of(settings):  # a home set by MODELMINT_PREFECT_HOME whose last stack is gone: this one's now
        state = StackState.fresh(settings)
    state.api_url, state.checkout, state.port = settings.prefect_api_url, str(project_root()), settings.prefect_port
    started = start_server(settings, state)
    say(f"• Prefect server {'started' if started else 'already running'} at {settings.prefect_api_url}")
    ensure_pool_and_limits(settings)
    say(f"• work pool {WORK_POOL}, concurrency limits and the crash automation ready")
    if not state.worker_alive():
        # No worker of ours lives, so no run of the local pool can: runs left Running by a machine that went
        # down are marked Crashed now instead of when their heartbeats are missed.
        with api(settings) as client:
            for line in reap(settings, client, "the stack was down when it should have run"):
                say(f"• {line}")
    deploy(settings)
    say("• deployments from prefect.yaml deployed")
    started = start_worker(settings, state)
    say(f"• worker {'started' if started else 'already running'} (pid {state.worker_pid})")
    state.save(settings)
    ui = settings.prefect_api_url.removesuffix("/api")
    say(f"\nPrefect UI: {ui}\nUse it from this shell:  export PREFECT_API_URL={settings.prefect_api_url}")
    return state


STOPPED_BY_DOWN = "stopped by `bash scripts/down.sh` while it ran"
REGISTER_WAIT_S = 180.0
"""How long `down` lets a run that has reached its registration finish it (its dvc push and manifest)."""
REGISTRATION_TASKS = ("register", "publish")
"""The convert flow's tasks that register a variant (or come after it): a run in one of them is let finish."""


def down(settings: Settings, *, say: Any = print) -> None:
    """Stop the worker and every process of the runs the stack runs; mark those runs Crashed and free their slots;
    stop the server. A run that has reached its registration is let finish it first, so a run marked Crashed
    registered nothing and a run that registered is not marked Crashed.

    Raises OrchestratorError, naming the owner, when the port or the Prefect home is another checkout's stack."""
    refuse_foreign(settings)
    state = StackState.load(settings)
    # Our own server may be slow to answer on a loaded machine (its /health took over 2 s while a test suite held
    # both cores): taken for down, its runs were left Running and their slots held, so it is given time to answer.
    up_ = healthy(settings.prefect_api_url) or (state.server_alive() and _healthy_within(settings.prefect_api_url))
    home = settings.prefect_dir
    local: list[Any] = []
    if up_:
        with api(settings) as client:
            # The runs this stack runs on this machine: their processes carry the run's id and this stack's
            # PREFECT_HOME (a run of another stack's worker on the same server is left alone).
            local = [r for r in live_runs(client) if flow_run_processes(r.id, home)]
            # Frozen first (SIGSTOP), so that what is decided next stays true: no run reaches its registration
            # while down looks, or registers after down has called it Crashed.
            _signal_runs(local, home, signal.SIGSTOP)
            finishing = [r for r in local if _registering(settings, client, r)]
    else:
        finishing = []
    for run in finishing:
        say(f"• flow run '{run.name}' ({str(run.id)[:8]}) is registering: let finish (up to {REGISTER_WAIT_S:.0f} s)")
    _signal_runs(finishing, home, signal.SIGCONT)
    deadline = time.monotonic() + REGISTER_WAIT_S
    while any(flow_run_processes(r.id, home) for r in finishing) and time.monotonic() < deadline:
        time.sleep(0.5)
    say(f"• worker {'stopped' if _stop(state.worker_pid, state.worker_started) else 'was not running'}")
    # Prefect's process worker starts each run in a session of its own: stopping the worker's group does not stop
    # it, and an engine that outlived `down` went on after down had marked its run Crashed. Every process of every
    # run is gone before any run is marked.
    _end_runs(local, home)
    if up_:
        with api(settings) as client:
            runs = {str(r.id): r for r in [*local, *dead_runs(client)]}
            for line in reap(settings, client, STOPPED_BY_DOWN, list(runs.values())):
                say(f"• {line}")
    say(f"• server {'stopped' if _stop(state.server_pid, state.server_started) else 'was not running'}")
    StackState.fresh(settings).save(settings)


def _registering(settings: Settings, client: Any, run: Any) -> bool:
    """Whether `run` has reached its registration: a register or publish task run of its own on the server, or a
    manifest of its model created since it started (the manifest is written last: the exact proof)."""
    if any(t.name.split("-", 1)[0] in REGISTRATION_TASKS for t in _task_runs(client, run.id)):
        return True
    model, since = (run.parameters or {}).get("model"), run.start_time
    if not isinstance(model, str) or since is None:
        return False
    for path in (settings.manifests_dir / model).glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            from datetime import datetime

            if datetime.fromisoformat(json.loads(path.read_text())["created_at"]) >= since:
                return True
    return False


def _task_runs(client: Any, flow_run_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return list(client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))))


def _signal_runs(runs: list[Any], prefect_home: Path, sig: signal.Signals) -> None:
    """Send `sig` to every local process of `runs`; SIGSTOP returns once each is stopped (a tool started a moment
    before is found by the next look and stopped too)."""
    for _ in range(20):  # bounded: a stopped process starts nothing
        pids = [pid for run in runs for pid in flow_run_processes(run.id, prefect_home)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig != signal.SIGSTOP or all((_stat(pid) or ["T"])[0] in "Tt" for pid in pids):
            return
        time.sleep(0.1)


def _end_runs(runs: list[Any], prefect_home: Path) -> None:
    """Kill every local process of `runs` (frozen first, then SIGKILL: a run killed here takes no further step, so
    none registers after down decided it had not) and return once none is left; reap marks the runs Crashed."""
    for _ in range(50):  # bounded: a frozen or killed process starts nothing
        if not any(flow_run_processes(r.id, prefect_home) for r in runs):
            return
        _signal_runs(runs, prefect_home, signal.SIGSTOP)
        _signal_runs(runs, prefect_home, signal.SIGKILL)
        time.sleep(0.2)


def status(settings: Settings, *, say: Any = print) -> list[str]:
    """Say whether the server is healthy and the stack's worker runs; returns what is not up (empty: both are).

    Raises OrchestratorError, naming the owner, when the port or the Prefect home is another checkout's stack."""
    refuse_foreign(settings)
    state = StackState.load(settings)
    ok, worker = healthy(settings.prefect_api_url), state.worker_alive()
    say(f"server  {settings.prefect_api_url}: {'healthy' if ok else 'not running'}"
        + (f" (pid {state.server_pid})" if state.server_alive() else ""))
    say(f"worker  {f'running (pid {state.worker_pid})' if worker else 'not running'}")
    return [part for part, up in (("no Prefect server answers", ok), ("no worker of the stack runs", worker)) if not up]


def check_deployment(settings: Settings, deployment: str) -> None:
    """Raises OrchestratorError unless the server runs, the work pool exists and `deployment` is deployed (and is
    this checkout's stack)."""
    from prefect.exceptions import ObjectNotFound

    refuse_foreign(settings, home=False)
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
        if not workers_online(settings, client):
            raise OrchestratorError(
                f"no worker is polling work pool {WORK_POOL}: the run would wait as Late and nothing would start it",
                hint="`bash scripts/up.sh` starts the worker (or `prefect worker start --pool modelmint-local`)",
            )


def say_waits(settings: Settings, deployment: str, say: Any = print) -> None:
    """Before a run of `deployment` starts: say when its model's slot is held, by whom, since when."""
    from flows.slots import describe_holders

    model = deployment.split("/", 1)[-1]
    with api(settings) as client, contextlib.suppress(Exception):
        limit = client.read_global_concurrency_limit_by_name(model_limit(model))
        if limit.active_slots >= limit.limit:
            who = describe_holders(client, limit.name, settings.prefect_dir)
            say(f"{deployment} will wait for {limit.name}: {who}. `modelmint stack doctor` says more.",
                file=sys.stderr)


def _deployment_names(client: Any) -> list[str]:
    flows = {f.id: f.name for f in client.read_flows()}
    return sorted(f"{flows.get(d.flow_id, '?')}/{d.name}" for d in client.read_deployments())
