"""Scale-out on Ray: the convert flow's tasks on a Ray cluster, through prefect-ray's RayTaskRunner.

With MODELMINT_RAY_ADDRESS set (a cluster's GCS, host:port), the flow process is the Ray driver: the steps it
submits (quantize, validate, compress) run as Ray tasks wherever the cluster has the resources each asks for;
fetch, convert, imatrix and registration stay in the flow process. Nothing in pipelines/ knows about Ray: a step
is the same function wherever it runs. Before any work the flow probes every node (`probe_nodes`): a node that
does not see the work directory the driver sees, or lacks the pinned toolchains, is refused with its name, so two
nodes never build into paths only one of them can read. docs/ray.md says what must be shared and how.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect.task_runners import TaskRunner

from pipelines.core.errors import ConfigError, OrchestratorError
from pipelines.core.settings import Settings

STEP_CPUS = {"quantize": 1, "validate": 1, "compress": 1}
"""Ray CPUs each submitted step asks for: llama-quantize / llama-perplexity and llmcompressor keep about one
core busy per task here (their own threads come from MODELMINT_THREADS on the node)."""
FORWARDED = ("MODELMINT_", "PREFECT_API_URL", "PREFECT_HOME", "HF_ENDPOINT", "HF_HUB_OFFLINE", "DVC_", "PIP_INDEX_URL")
"""Environment the driver passes to its Ray tasks (runtime_env). Never a token: runtime environments are visible
in Ray's state API and dashboard. Steps that download run in the flow process."""


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """Raises OrchestratorError when nothing answers at the Ray address (before Ray's own, much longer, wait)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as err:
        raise OrchestratorError(
            f"no Ray cluster answers at MODELMINT_RAY_ADDRESS={address} ({err})",
            hint="start one (`ray start --head --port 6379`) or point MODELMINT_RAY_ADDRESS at its head "
            "(host:port); unset it to run the steps in the flow's own process",
        ) from None


def task_runner(settings: Settings) -> Any:
    """The flow's task runner: RayTaskRunner on MODELMINT_RAY_ADDRESS, else Prefect's default thread pool."""
    if not settings.ray_address:
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner()
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise ConfigError(
            "MODELMINT_RAY_ADDRESS is set but Ray is not installed in this environment",
            hint="pip install -e '.[ray]' (ray and prefect-ray, pinned in pyproject.toml)",
        ) from None

    class CheckedRayTaskRunner(RayTaskRunner):
        """RayTaskRunner that says plainly when nothing answers at the address, instead of Ray's long wait."""

        def __enter__(self) -> Any:
            reachable(self.address)
            self.init_kwargs.setdefault("runtime_env", {})["env_vars"] = forwarded_env()
            return super().__enter__()

    return CheckedRayTaskRunner(address=settings.ray_address.removeprefix("ray://"),
                                init_kwargs={"log_to_driver": False})


class RunTaskRunner(TaskRunner[Any]):
    """The convert flow's declared task runner: Prefect duplicates a flow's runner when a run starts, and this one's
    duplicate is `task_runner` of the settings then. Nothing is read when the flow's file is imported (a deployment
    loading it, a test importing it), and each run sees the environment it was started in."""

    def duplicate(self) -> Any:  # Prefect enters what this returns: a runner of another class
        return task_runner(Settings.from_env())

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a run's tasks go to the runner duplicate() makes when it starts")


def forwarded_env() -> dict[str, str]:
    """What the driver's Ray tasks are given: modelmint's settings and where Prefect is (its API, its result
    storage, which every node must share for cached results to be found), never a token."""
    from prefect.settings import PREFECT_API_URL, PREFECT_LOCAL_STORAGE_PATH

    env = {k: v for k, v in os.environ.items()
           if k.startswith(FORWARDED) and k not in Settings.SECRET_ENV and "TOKEN" not in k}
    if url := PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = str(url)
    env["PREFECT_LOCAL_STORAGE_PATH"] = str(PREFECT_LOCAL_STORAGE_PATH.value())
    return env


def step_options(settings: Settings, step: str) -> dict[str, Any]:
    """Ray remote options of one step: its CPUs, and the custom resources MODELMINT_RAY_RESOURCES gives it."""
    try:
        extra = json.loads(settings.ray_resources) if settings.ray_resources else {}
    except ValueError as err:
        raise ConfigError(f"MODELMINT_RAY_RESOURCES is not JSON: {err}",
                          hint='e.g. {"compress": {"gpu-H100-80G": 1}}') from None
    if not isinstance(extra, dict) or not all(isinstance(v, dict) for v in extra.values()):
        raise ConfigError("MODELMINT_RAY_RESOURCES must map step names to resource objects",
                          hint='e.g. {"compress": {"gpu-H100-80G": 1}}')
    if unknown := sorted(set(extra) - set(STEP_CPUS)):
        raise ConfigError(f"MODELMINT_RAY_RESOURCES names steps that do not run on Ray: {unknown}",
                          hint=f"steps submitted to Ray: {sorted(STEP_CPUS)}")
    asked = {str(k): float(v) for k, v in (extra.get(step) or {}).items()}
    options: dict[str, Any] = {"num_cpus": STEP_CPUS[step]}
    if "GPU" in asked:  # Ray's own GPU resource is asked for with num_gpus
        options["num_gpus"] = asked.pop("GPU")
    if asked:
        options["resources"] = asked
    return options


@contextlib.contextmanager
def placed(settings: Settings, step: str) -> Iterator[None]:
    """Submissions inside ask Ray for the step's resources; outside Ray this does nothing."""
    if not settings.ray_address:
        yield
        return
    from prefect_ray.context import remote_options

    with remote_options(**step_options(settings, step)):
        yield


def ship_by_value(module_name: str) -> None:
    """Prefect loads a deployment's flow file by path, as a module that only this process can import; every task
    sent to Ray carries the flow in its context, so Ray's workers are given that module's code by value
    (cloudpickle). What it imports (flows.tasks, pipelines) they import themselves."""
    from ray import cloudpickle

    # A script loaded by path is a top-level module named after its file (here its directory is even on
    # sys.path, which a worker's is not); a module of a package (flows.convert) is imported there by name.
    if "." not in module_name and module_name in sys.modules:
        cloudpickle.register_pickle_by_value(sys.modules[module_name])


def check_resources(settings: Settings) -> None:
    """Raises OrchestratorError when no alive node offers what a step asks for (Ray would wait for ever)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for step in STEP_CPUS:
        want = step_options(settings, step)
        need = {"CPU": float(want["num_cpus"]), **({"GPU": want["num_gpus"]} if "num_gpus" in want else {}),
                **want.get("resources", {})}
        if not any(all(n["Resources"].get(k, 0.0) >= v for k, v in need.items()) for n in nodes):
            offered = sorted({k for n in nodes for k in n["Resources"] if not k.startswith("node:")})
            raise OrchestratorError(
                f"no node of the Ray cluster at {settings.ray_address} offers what the {step} step asks for "
                f"({need}); the nodes offer {offered}",
                hint="start a node with that resource (`ray start --address … --resources '{\"name\": 1}'`) or "
                "change MODELMINT_RAY_RESOURCES",
            )


def _probe(marker: str, expect: str, toolchain_dirs: list[str]) -> dict[str, Any]:
    """Runs on one node: does it see the driver's marker in the work directory, and the toolchains?"""
    import ray

    try:
        seen = Path(marker).read_text() == expect
    except OSError:
        seen = False
    return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "sees_work_dir": seen,
            "missing_toolchains": [d for d in toolchain_dirs if not (Path(d) / ".complete").is_file()]}


def probe_nodes(settings: Settings, toolchain_dirs: list[Path], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Run `_probe` on every alive node; raise OrchestratorError naming each node that cannot take part."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    settings.work_dir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    marker = settings.work_dir / f".ray-probe-{token[:12]}"
    marker.write_text(token)
    try:
        probe = ray.remote(num_cpus=0)(_probe)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(marker), token, [str(d) for d in toolchain_dirs]) for n in ray.nodes() if n.get("Alive")]
        found = ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise OrchestratorError(f"a node of the Ray cluster at {settings.ray_address} did not answer the probe "
                                f"in {timeout_s:.0f} s", hint="`ray status` shows the nodes; rerun") from None
    finally:
        marker.unlink(missing_ok=True)
    problems = [f"node {p['node'][:12]} on {p['host']} does not see {settings.work_dir} as the driver does"
                for p in found if not p["sees_work_dir"]]
    problems += [f"node {p['node'][:12]} on {p['host']} has no toolchain at {d}"
                 for p in found for d in p["missing_toolchains"]]
    if problems:
        raise OrchestratorError(
            "the Ray cluster cannot run this flow: " + "; ".join(problems),
            hint="MODELMINT_WORK_DIR and MODELMINT_HOME must be the same storage on every node (docs/ray.md), "
            "and each node needs `bash scripts/setup.sh` at the same pins",
        )
    return found
