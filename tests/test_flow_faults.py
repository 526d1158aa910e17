"""The Prefect path under faults, against a real server and worker (the embedded stack, flows/stack.py).

One stack serves the module (a temp project with a local DVC remote, its own Prefect home and port); each
test injects one fault into a real run of `convert/tiny-qwen2` and asserts what docs/registry.md promises:
the run ends in a terminal state within a stated bound, the model's slot frees within a stated bound, the
rerun completes and reuses finished work, nothing is half-registered.

Bounds (the crash automation is set to CRASH_AFTER_S here; the stack's default is 120 s):
  a run stopped by `down.sh`          no process of it left, Crashed and its slot freed by down itself, before the
                                      server stops; nothing registered
  a run that registered when down came  let end: it keeps the state it ends in (Completed), never Crashed
  a run SIGKILLed with its worker     Crashed within CRASH_AFTER_S + 45 s; its slot within LEASE_S + 45 s
  a server SIGKILLed and restarted    the run completes; its slot is free once it ends
  the worker alone SIGKILLed          the run completes on its own
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from registry_env import isolate, task_runs
from stack_env import flow_runs, prefect, run_logs, stack_up, wait_for

from flows import stack
from flows.slots import LEASE_S, model_limit
from pipelines.core.settings import Settings
from pipelines.core.steps import receipt_path
from pipelines.store.manifest import find_manifest, manifest_path

pytestmark = pytest.mark.slow

CRASH_AFTER_S = 45
QUANTS = ["q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "q8_0"]
MODEL = "tiny-qwen2"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("flow-faults")
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        with stack_up(base, mp, {MODEL: QUANTS}, MODELMINT_CRASH_AFTER_S=str(CRASH_AFTER_S)) as up:
            yield up


@pytest.fixture(autouse=True)
def _server_up(deployed: Any) -> None:
    """A test that failed with the server or the worker down does not take the next ones with it."""
    _, settings = deployed
    if not stack.healthy(settings.prefect_api_url) or not stack.StackState.load(settings).worker_alive():
        stack.up(settings, say=lambda _msg: None)


def _submit(settings: Settings, variant: str) -> Any:
    """Start a run of one variant (without waiting) and return it once the server has it."""
    before = {r.id for r in flow_runs(settings)}
    done = prefect(settings, "deployment", "run", f"convert/{MODEL}", "--param", f'variants=["{variant}"]')
    assert done.returncode == 0, done.stdout + done.stderr
    return wait_for(lambda: [r for r in flow_runs(settings) if r.id not in before], 60, "the flow run")[-1]


def _in_step(settings: Settings, run: Any, *steps: str) -> bool:
    with stack.api(settings) as client:
        return any(t.state is not None and t.state.name == "Running" and t.name.split("-")[0] in steps
                   for t in task_runs(client, run.id))


def _state(settings: Settings, run: Any) -> Any:
    with stack.api(settings) as client:
        return client.read_flow_run(run.id).state


def _slots_taken(settings: Settings) -> int:
    with stack.api(settings) as client:
        return client.read_global_concurrency_limit_by_name(model_limit(MODEL)).active_slots


def _rerun(settings: Settings, variant: str) -> Any:
    done = prefect(settings, "deployment", "run", f"convert/{MODEL}", "--param", f'variants=["{variant}"]', "--watch")
    assert done.returncode == 0, done.stdout + done.stderr
    return flow_runs(settings)[-1]


def _restart_worker(settings: Settings) -> None:
    state = stack.StackState.load(settings)
    stack.start_worker(settings, state)
    state.save(settings)


def test_a_run_without_a_worker_is_refused_and_doctor_says_why(deployed) -> None:
    _repo, settings = deployed
    state = stack.StackState.load(settings)
    runs = len(flow_runs(settings))
    stack._stop(state.worker_pid)
    try:
        ran = subprocess.run([sys.executable, "-m", "flows.stack", "run", f"convert/{MODEL}"], capture_output=True,
                             text=True, timeout=120)
        assert ran.returncode == 1
        assert "no worker is polling work pool modelmint-local" in ran.stderr and "scripts/up.sh" in ran.stderr
        doc = subprocess.run([sys.executable, "-m", "flows.stack", "doctor"], capture_output=True, text=True,
                             timeout=120)
        assert doc.returncode == 1 and "none online" in doc.stdout, doc.stdout + doc.stderr
    finally:
        _restart_worker(settings)
    assert len(flow_runs(settings)) == runs, "a refused run must not be created"


def test_killing_only_the_worker_lets_the_run_finish(deployed) -> None:
    repo, settings = deployed
    run = _submit(settings, "q8_0")
    wait_for(lambda: _in_step(settings, run, "convert", "quantize", "validate"), 300, "the run's build steps")
    os.kill(stack.StackState.load(settings).worker_pid, signal.SIGKILL)  # the worker alone, not its group
    # The run writes its output to its Prefect log, not to the dead worker's pipe: it finishes on its own.
    final = wait_for(lambda: (s := _state(settings, run)).is_final() and s, 600, "the run to end")
    assert final.name == "Completed", final.message
    assert find_manifest(repo.settings(), f"{MODEL}:q8_0").validation.passed
    assert _slots_taken(settings) == 0
    # pipelines' INFO lines reach the run's log (docs/registry.md says they show there)
    assert f"pipelines.source.fetch: {MODEL}: generated source" in run_logs(settings, run.id)
    _restart_worker(settings)


def test_down_gives_its_own_slow_server_time_to_answer() -> None:
    """A Prefect server on a loaded machine can take more than healthy()'s 2 s to answer /health; `stack down` took
    such a server for stopped and left its runs Running, their slots held. It now waits for its own server."""
    import http.server
    import threading

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(3)
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads, server.block_on_close = True, False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api"
    try:
        assert not stack.healthy(url)
        assert stack._healthy_within(url, patience_s=20)
    finally:
        server.shutdown()
        server.server_close()
    assert not stack._healthy_within(url, patience_s=2)  # nothing listens now: no, within the patience


def _building(run: Any) -> list[int]:
    """The run's local processes while one of its build tools (llama-quantize, llama-perplexity) runs, else []: seen
    from /proc at once, where the server learns a task's state from events, seconds late on a loaded machine."""
    pids = stack.flow_run_processes(run.id)
    tools = [p for p in pids if re.search(rb"llama-(quantize|perplexity)", _cmdline(p))]
    return pids if tools else []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_down_mid_run_crashes_the_run_frees_its_slot_and_the_rerun_reuses_work(deployed) -> None:
    """`down` while a run builds. The run is held mid-build (SIGSTOP, as a loaded machine may hold it): seen in
    quantize or validate by the server, it had sometimes registered by the time down came, and was marked Crashed
    all the same; and a run that did not answer down's signals at once outlived it. Down now stops every process of
    the run before it marks it, and the run registers nothing."""
    repo, settings = deployed
    run = _submit(settings, "q6_k")
    held = wait_for(lambda: _building(run), 300, "the run's llama-quantize or llama-perplexity")
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    base = next(repo.work.rglob("*f16.gguf"))
    stamp = base.stat().st_mtime_ns
    said: list[str] = []
    try:
        stack.down(settings, say=said.append)
        left = stack.flow_run_processes(run.id)
    finally:  # the module's other tests need the stack, whatever this one finds
        for pid in stack.flow_run_processes(run.id):  # what down left goes on: it must find nothing to do
            os.kill(pid, signal.SIGCONT)
        stack.up(settings, say=lambda _msg: None)
    assert left == [], "processes of the run outlived down"
    assert any("marked Crashed" in line for line in said), said
    state = _state(settings, run)
    assert state.name == "Crashed" and "down.sh" in (state.message or ""), state
    assert _slots_taken(settings) == 0  # freed by down.sh, not left to lapse
    with stack.api(settings) as client:
        running = [t.name for t in task_runs(client, run.id) if t.state is not None and not t.state.is_final()]
    assert not running, f"task runs left {running} as if they still ran"
    assert not manifest_path(repo.settings(), MODEL, "q6_k").exists()
    again = _rerun(settings, "q6_k")
    assert find_manifest(repo.settings(), f"{MODEL}:q6_k").validation.passed
    # the rerun registered every variant it asked for, so the f16 went as scratch (MODELMINT_KEEP_SCRATCH): its
    # receipt, which stays, records the file it was made as (a conversion writes a new one)
    assert json.loads(receipt_path(base).read_text())["mtime_ns"] == stamp, "the f16 was converted again"
    with stack.api(settings) as client:
        names = {t.name: t.state.name for t in task_runs(client, again.id)}
    assert names.get("convert") in ("Cached", "Completed"), names


def test_down_lets_a_run_that_has_registered_end_and_never_calls_it_crashed(deployed) -> None:
    """`down` just after a run wrote its manifest (the run held there, SIGSTOP, as a loaded machine may hold it):
    down marked it Crashed although it had registered. It is now let end, and keeps the state it ends in."""
    repo, settings = deployed
    run = _submit(settings, "q4_k_m")
    manifest = manifest_path(repo.settings(), MODEL, "q4_k_m")
    deadline = time.monotonic() + 600
    while not manifest.exists() and time.monotonic() < deadline:  # finely: the run ends soon after its manifest
        time.sleep(0.02)
    assert manifest.exists(), "the run registered nothing"
    for pid in stack.flow_run_processes(run.id):  # none when it ended already: down then has nothing to decide
        os.kill(pid, signal.SIGSTOP)
    said: list[str] = []
    try:
        stack.down(settings, say=said.append)
    finally:
        for pid in stack.flow_run_processes(run.id):
            os.kill(pid, signal.SIGCONT)
        stack.up(settings, say=lambda _msg: None)
    state = _state(settings, run)
    assert state.name == "Completed", (state, said)
    assert not any("marked Crashed" in line for line in said), said
    assert find_manifest(repo.settings(), f"{MODEL}:q4_k_m").validation.passed


def test_a_run_killed_with_its_worker_is_marked_crashed_and_its_slot_lapses(deployed) -> None:
    repo, settings = deployed
    run = _submit(settings, "q5_k_m")
    wait_for(lambda: _in_step(settings, run, "quantize", "validate"), 300, "quantize/validate")
    wait_for(lambda: stack.flow_run_process(run.id), 30, "the run's process")
    worker = stack.StackState.load(settings).worker_pid
    os.killpg(os.getpgid(worker), signal.SIGKILL)
    # Every process of the run, its tools too: they are not all in one process group, and a tool left running kept
    # the run from looking dead to doctor below on a loaded machine.
    for _ in range(20):
        if not (pids := stack.flow_run_processes(run.id)):
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.2)
    killed = time.monotonic()
    assert _slots_taken(settings) == 1
    # While the dead run's lease lasts: doctor names the holder, and a new run is told it will wait.
    doc = subprocess.run([sys.executable, "-m", "flows.stack", "doctor"], capture_output=True, text=True, timeout=120)
    assert f"held by flow run '{MODEL}'" in doc.stdout, doc.stdout + doc.stderr
    assert f"'{MODEL}' ({run.id})" in doc.stdout and "--fix" in doc.stdout
    said: list[str] = []
    stack.say_waits(settings, f"convert/{MODEL}", say=lambda msg, **_kw: said.append(msg))
    assert said and f"will wait for {model_limit(MODEL)}: held by flow run '{MODEL}'" in said[0], said
    # Nothing of ours is alive to notice: Prefect's own automation does, from the missing heartbeats.
    final = wait_for(lambda: (s := _state(settings, run)).is_final() and s, CRASH_AFTER_S + 45, "Crashed")
    assert final.name == "Crashed" and "no heartbeat" in (final.message or ""), final
    wait_for(lambda: _slots_taken(settings) == 0, max(5, LEASE_S + 45 - (time.monotonic() - killed)), "the slot")
    _restart_worker(settings)
    assert not manifest_path(repo.settings(), MODEL, "q5_k_m").exists()
    _rerun(settings, "q5_k_m")
    assert find_manifest(repo.settings(), f"{MODEL}:q5_k_m").validation.passed
    doc = subprocess.run([sys.executable, "-m", "flows.stack", "doctor"], capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0, doc.stdout + doc.stderr


def test_a_server_killed_and_restarted_mid_run_leaks_no_slot(deployed) -> None:
    repo, settings = deployed
    run = _submit(settings, "q3_k_m")
    wait_for(lambda: _in_step(settings, run, "quantize", "validate"), 300, "quantize/validate")
    state = stack.StackState.load(settings)
    os.killpg(state.server_pid, signal.SIGKILL)
    stack.start_server(settings, state)
    final = wait_for(lambda: (s := _state(settings, run)).is_final() and s, 600, "the run to end")
    assert final.name == "Completed", final.message
    # The lease is on disk, so the restarted server knew it and its release freed the slot.
    wait_for(lambda: _slots_taken(settings) == 0, 10, "the slot to be free after the run")
    assert find_manifest(repo.settings(), f"{MODEL}:q3_k_m").validation.passed


_OUTAGE_IN_THE_SLOT = """
import os, signal, sys
from contextlib import contextmanager

from flows.slots import GPU_LIMIT, slot
from pipelines.source.catalog import load_catalog
from pipelines.compressed.build import ensure_compressed, plan_compressed
from pipelines.core.settings import Settings
from pipelines.core.steps import receipt_path

settings = Settings.from_env()
plan = plan_compressed(load_catalog(settings.catalog_path).get(sys.argv[1]), settings, schemes=["fp8"])


@contextmanager
def slot_then_outage():
    with slot(GPU_LIMIT, prefect_home=settings.prefect_dir):
        os.killpg(int(sys.argv[2]), signal.SIGKILL)  # the server goes while llmcompressor runs
        yield


built = ensure_compressed(plan, "fp8", gpu_slot=slot_then_outage)
print("built" if built.ran and built.receipt else "not built")
"""


def test_a_gpu_slot_released_during_an_outage_keeps_the_checkpoint(deployed, tmp_path: Path) -> None:
    """The step's work is done inside the slot; the server is gone when the slot is released. The receipt
    is written first, the failed release is a warning, and a second call builds nothing.

    The step runs in a process of its own, as in a flow run: the Prefect client state a lost server leaves
    behind stays there."""
    from pipelines.compressed.build import ensure_compressed, plan_compressed
    from pipelines.source.catalog import load_catalog

    repo, settings = deployed
    work = tmp_path / "work"
    state = stack.StackState.load(settings)
    env = {**os.environ, **stack.stack_env(settings), "MODELMINT_WORK_DIR": str(work),
           "PREFECT_API_URL": settings.prefect_api_url}
    try:
        step = subprocess.run([sys.executable, "-c", _OUTAGE_IN_THE_SLOT, MODEL, str(state.server_pid)], env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        stack.start_server(settings, state)
        state.save(settings)
    assert step.returncode == 0 and step.stdout.strip().endswith("built"), step.stdout + step.stderr
    assert "could not release the slot of gpu" in step.stderr, step.stderr[-2000:]
    s = repo.settings(MODELMINT_WORK_DIR=work)
    plan = plan_compressed(load_catalog(s.catalog_path).get(MODEL), s, schemes=["fp8"])
    assert not ensure_compressed(plan, "fp8").ran  # the rerun finds the receipt
