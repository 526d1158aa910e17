"""Scale-out benchmark: the convert flow with the local task runner, on a one-node and on a two-node Ray cluster.

Run: .venv/bin/python benchmarks/bench_ray.py [--variants q4_k_m,q5_k_m,q6_k,q8_0] [--keep]
For each runner, the embedded stack is started (flows/stack.py) against a temp git + DVC project, and
`prefect deployment run convert/tiny-qwen2` is run twice into fresh work directories: once with one variant (the
overhead Ray adds to a single tiny model; target: under 10 s over the local runner) and once with the other `--variants`
(the fan-out of quantize and validate; the f16 base is the first run's cache hit, in every mode alike). The Ray clusters are started on this machine with their own temp dirs:
one node with every core, or two nodes splitting them (separate raylets). Flow wall time comes from the server's
records. On a machine with C cores the gain of two nodes over one is bounded by C / (cores one step keeps busy);
the result file states the machine's cores beside the ratios. Writes benchmarks/results/ray.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _flow_seconds(settings: object) -> float:
    from stack_env import flow_runs

    run = flow_runs(settings)[-1]  # type: ignore[arg-type]
    assert run.state and run.state.is_completed(), run.state
    return (run.end_time - run.start_time).total_seconds()


def _measure(scratch: Path, mode: str, variants: list[str], cores: int) -> dict[str, float]:
    from ray_env import start_cluster
    from stack_env import prefect, stack_up

    env = {"MODELMINT_THREADS": "1"}
    cluster = None
    if mode != "local":  # one node with every core, or the cores split between nodes (separate raylets)
        nodes = int(mode[-1])
        cluster = start_cluster([(max(1, cores // nodes), {})] * nodes)
        env["MODELMINT_RAY_ADDRESS"] = cluster.address
    mp = pytest.MonkeyPatch()
    out: dict[str, float] = {}
    try:
        with stack_up(scratch / mode, mp, {"tiny-qwen2": variants}, **env) as (_repo, settings):
            # the worker's work directory is fixed when the stack starts: the second run asks only for variants
            # the first did not build (both share the cached f16 base, in every mode alike)
            for label, asked in (("one", variants[:1]), ("rest", variants[1:])):
                param = json.dumps(asked)
                run = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--param", f"variants={param}",
                              "--watch")
                assert run.returncode == 0, run.stdout[-3000:]
                out[label] = round(_flow_seconds(settings), 2)
    finally:
        mp.undo()
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="q4_k_m,q5_k_m,q6_k,q8_0")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    variants = args.variants.split(",")
    cores = os.cpu_count() or 1
    scratch = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    env_dir = scratch / "env"
    home = env_dir / "modelmint"
    home.mkdir(parents=True)
    from pipelines.core.settings import Settings

    real_home = Settings.from_env().home
    for shared in ("toolchains", "models"):  # the pinned toolchains and generated models this machine built
        (real_home / shared).mkdir(parents=True, exist_ok=True)
        (home / shared).symlink_to(real_home / shared)
    (env_dir / "gitconfig").write_text("[user]\n\tname = bench\n\temail = bench@modelmint.invalid\n")
    os.environ.update({
        "MODELMINT_HOME": str(home), "PREFECT_HOME": str(env_dir / "prefect"),
        "MODELMINT_PREFECT_HOME": str(env_dir / "prefect"), "DVC_NO_ANALYTICS": "1",
        "DVC_SITE_CACHE_DIR": str(env_dir / "dvc-site"), "DVC_GLOBAL_CONFIG_DIR": str(env_dir / "dvc-g"),
        "DVC_SYSTEM_CONFIG_DIR": str(env_dir / "dvc-s"), "GIT_CONFIG_GLOBAL": str(env_dir / "gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1", "DO_NOT_TRACK": "1",
    })
    try:
        times = {mode: _measure(scratch, mode, variants, cores) for mode in ("local", "ray-1", "ray-2")}
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "cores": cores,
        "variants": variants,
        "flow_seconds": times,
        "ray_overhead_one_variant_s": {m: round(times[m]["one"] - times["local"]["one"], 2) for m in ("ray-1", "ray-2")},
        "ratio_rest_vs_local": {m: round(times[m]["rest"] / times["local"]["rest"], 3) for m in ("ray-1", "ray-2")},
        "bound": f"{cores} cores: validate and quantize keep about one core each, so two nodes can at most run "
                 f"{cores} steps at once, as the local runner's quantize batches already do",
    }
    out = ROOT / "benchmarks" / "results" / "ray.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
