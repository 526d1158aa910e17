"""GGUF path at real model sizes: a Prefect deployment's run against the raw llama.cpp tools, on checkpoints of real
shapes.

Run: .venv/bin/python benchmarks/bench_scale.py [--sizes 0.5b,1.5b,7b,8b] [--work-dir DIR] [--keep]

For each size, benchmarks/make_shape_model.py writes a bf16 checkpoint of the release's exact shape (random weights),
then in the same run:
- the raw tools, one after another: convert_hf_to_gguf.py to f16, llama-quantize q4_k_m and q8_0, llama-perplexity
  --kl-divergence-base over the pipeline's evaluation text and context, its --kl-divergence per variant, cp of the
  outputs; each a process tree (wall time, peak RSS polled and the largest process's from wait4, peak disk of the
  scratch directory polled, bytes read and written from /proc/PID/io of the tree's root, which holds every reaped
  descendant's);
- `prefect deployment run convert/scale-<size> --watch`, as a user runs it: a throwaway git + DVC project with a
  catalog entry pointing at the checkpoint and a local DVC remote, the embedded stack started by `modelmint stack
  up` (a Prefect server on SQLite on a free port of 127.0.0.1, the work pool, prefect.yaml's deployments plus this
  entry's, deployed from prefect.yaml's own convert template, the process worker), MODELMINT_OCI_REGISTRY naming a
  local docker-registry. The project, the DVC remote and the registry's storage are the measured directory; the
  flow run's process tree is the worker's (see _deployment_run for what is and is not counted). Each step's wall
  time comes from the flow run's task runs on the Prefect API, its bytes from the tree's counters polled and cut at
  the task runs' starts and ends (step_io), and each variant's reads over its size from those (variant_reads); the
  row names the deployment, the variants registered (their manifests) and the image references the registry holds
  afterwards.
- with --convert-pairs N, the raw converter and the convert step's work on it, N pairs (convert_pairs).
Prints the ratios and a least-squares fit per billion parameters extrapolated to 14B, 32B and 72B; writes
benchmarks/reference/scale.json and docs/images/scale.svg (--out, --plot: elsewhere).

Random weights carry no signal and every quality gate refuses them: the deployment's stack gets a sitecustomize on
its PYTHONPATH that replaces, in the flow run's process only, the GGUF gate with one that accepts every figure and
names this benchmark as its basis (each report and manifest says so), so that the registration and the publication
run and their cost is measured; the validation itself runs in full.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from make_shape_model import SHAPES, ensure_tokenizer, is_complete  # noqa: E402

from pipelines.core.fsutil import HashCache  # noqa: E402
from pipelines.core.settings import Settings  # noqa: E402
from pipelines.core.texts import EVAL_TEXT, bundled_text  # noqa: E402
from pipelines.core.toolchains import LlamaCpp, llama_cpp  # noqa: E402
from pipelines.gguf import tools as gguf_tools  # noqa: E402
from pipelines.gguf.build import GGUF_EVAL_CHUNKS, GGUF_EVAL_CTX  # noqa: E402
from pipelines.gguf.validate import check_threads  # noqa: E402

SIZES = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "7b": "qwen2.5-7b", "8b": "llama-3.1-8b"}
QUANTS = ["q4_k_m", "q8_0"]
# Parameters of the releases extrapolated to (Qwen2.5-14B / 32B / 72B, from their configs' shapes)
TARGETS = {"14B": 14.77e9, "32B": 32.76e9, "72B": 72.71e9}
REFERENCE = ROOT / "benchmarks" / "reference" / "scale.json"
PLOT = ROOT / "docs" / "images" / "scale.svg"
_POLL_S = 0.25


@dataclass
class Measured:
    wall_s: float
    peak_rss: int
    peak_disk: int
    read_bytes: int
    write_bytes: int
    rchar: int
    wchar: int
    returncode: int
    stdout: str
    stderr: str
    io_series: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    """With a watched `tree`: (time.time(), the tree's I/O counters) every poll, for the I/O of each step."""


def _du(path: Path) -> int:
    """Bytes allocated under `path` (st_blocks, as du counts: a hard-linked file once), files vanishing meanwhile
    ignored."""
    total = 0
    seen: set[int] = set()
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                else:
                    st = e.stat(follow_symlinks=False)
                    if st.st_nlink > 1:
                        if st.st_ino in seen:
                            continue
                        seen.add(st.st_ino)
                    total += st.st_blocks * 512
            except OSError:
                pass
    return total


def _tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    return _rss_of(procs)


def _rss_of(procs: list[psutil.Process]) -> int:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def _proc_io(pid: int) -> dict[str, int]:
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return {}
    return {k: int(v) for k, v in (line.split(": ") for line in text.splitlines())}


_IO_KEYS = ("read_bytes", "write_bytes", "rchar", "wchar")


def _tree_io(pid: int, descendants: list[psutil.Process]) -> dict[str, int]:
    """The I/O counters of `pid` and its live `descendants` together: a reaped descendant's are in its parent's
    (the kernel adds them on reaping), a live one's in its own. The descendants are listed before the root is read,
    so a process reaped meanwhile is counted once, in its parent; one reaped after the root's read and before its
    own is missed by this sample alone."""
    total = dict.fromkeys(_IO_KEYS, 0)
    for p in (pid, *(d.pid for d in descendants)):
        for k, v in _proc_io(p).items():
            if k in total:
                total[k] += v
    return total


def measure(argv: list[str | Path], *, disk: Path, env: dict[str, str] | None = None,
            cwd: Path | None = None, tree: int | None = None) -> Measured:
    """Run `argv` to its end, watching its process tree and the disk used under `disk`; with `tree` (a pid), the
    RSS watched is that process's descendants' instead (where the work runs: a worker's flow run)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        return _measure(argv, out, err, disk=disk, env=env, cwd=cwd, tree=tree)


def _measure(argv: list[str | Path], out: Any, err: Any, *, disk: Path, env: dict[str, str] | None,
             cwd: Path | None, tree: int | None) -> Measured:
    peak = {"rss": 0, "disk": _du(disk)}
    series: list[tuple[float, dict[str, int]]] = []
    start = time.perf_counter()
    proc = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=err, env=env, cwd=cwd)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if tree is None:
                rss = _tree_rss(proc.pid)
            else:
                kids = _descendants(tree)  # listed once a poll: their RSS, and their I/O with the root's
                rss = _rss_of(kids)
                series.append((time.time(), _tree_io(tree, kids)))
            peak["rss"] = max(peak["rss"], rss)
            peak["disk"] = max(peak["disk"], _du(disk))
            done.wait(_POLL_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # wait without reaping: the zombie's /proc/PID/io still holds its own and its reaped descendants' I/O
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    wall = time.perf_counter() - start
    io = _proc_io(proc.pid)
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    watcher.join()
    peak["disk"] = max(peak["disk"], _du(disk))
    out.seek(0)
    err.seek(0)
    return Measured(
        wall_s=wall, peak_rss=peak["rss"] if tree is not None else max(peak["rss"], rusage.ru_maxrss * 1024), peak_disk=peak["disk"],
        read_bytes=io.get("read_bytes", 0), write_bytes=io.get("write_bytes", 0), rchar=io.get("rchar", 0),
        wchar=io.get("wchar", 0), returncode=proc.returncode,
        stdout=out.read().decode(errors="replace"), stderr=err.read().decode(errors="replace"), io_series=series,
    )


def convert_pairs(src: Path, scratch: Path, llama: LlamaCpp, n: int) -> dict[str, Any]:
    """The convert step's own cost set against the converter's run-to-run spread: `n` pairs, one run after the
    other on the same checkpoint and disk, each pair in the other order than the one before, of the raw converter
    and of the step's work on the converter (pipelines.gguf.tools.convert: the same converter, the f16 hashed as it
    is written, renamed into place and its header checked; no receipt, no Prefect task). One run of each, as the
    row's convert figures are, can differ by more than the hash costs."""
    raw_s: list[float] = []
    step_s: list[float] = []
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / "pair-f16.gguf"
    hashes = HashCache(scratch / "hashcache.json")
    argv = [str(a) for a in (llama.python, llama.converter, src, "--outfile", out, "--outtype", "f16")]
    for i in range(n):
        # each pair in the other order than the one before: a run leaves the page cache to the next
        for times in (raw_s, step_s) if i % 2 == 0 else (step_s, raw_s):
            out.unlink(missing_ok=True)
            start = time.perf_counter()
            if times is raw_s:
                subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            else:
                gguf_tools.convert(src, out, llama, outtype="f16", hashes=hashes)
            times.append(round(time.perf_counter() - start, 2))
        print(f"  convert pair {i + 1}/{n}: converter {raw_s[-1]:7.1f} s, step {step_s[-1]:7.1f} s", flush=True)
    shutil.rmtree(scratch)
    return {"pairs": n, "raw_s": raw_s, "step_s": step_s,
            "median_ratio": round(statistics.median(b / a for a, b in zip(raw_s, step_s, strict=True)), 3),
            "median_raw_s": statistics.median(raw_s), "median_step_s": statistics.median(step_s)}


def _checked(step: str, m: Measured) -> Measured:
    if m.returncode != 0:
        raise SystemExit(f"{step} failed (exit {m.returncode}):\n{m.stderr[-3000:]}")
    return m


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"nproc": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total, "cpu": cpu,
            "python": platform.python_version()}


def bench_size(size: str, work: Path, settings: Settings, *, keep: bool, publish: bool = True,
               pairs: int = 0) -> dict[str, Any]:
    name = SIZES[size]
    llama = llama_cpp(settings)
    threads = settings.effective_threads
    here = work / name
    src = here / "source"
    row: dict[str, Any] = {"size": size, "shape": name, "imitates": SHAPES[name].imitates,
                           "params": SHAPES[name].parameters(), "threads": threads,
                           "load_1min_start": round(os.getloadavg()[0], 2)}
    steps: dict[str, dict[str, Any]] = {}

    def record(step: str, m: Measured) -> Measured:
        steps[step] = {k: v for k, v in asdict(m).items() if k not in ("stdout", "stderr", "returncode", "io_series")}
        steps[step]["wall_s"] = round(m.wall_s, 2)
        print(f"  {step:28} {m.wall_s:8.1f} s  peak RSS {m.peak_rss / 2**30:6.2f} GiB  "
              f"disk {m.peak_disk / 2**30:6.2f} GiB  read {m.read_bytes / 2**30:6.2f} GiB  "
              f"written {m.write_bytes / 2**30:6.2f} GiB", flush=True)
        return m

    if not is_complete(src, name, 0):
        shutil.rmtree(src, ignore_errors=True)
        here.mkdir(parents=True, exist_ok=True)
        # the generator itself (the family's tokenizer is built once beforehand, outside the measure)
        ensure_tokenizer(SHAPES[name])
        record("generate", _checked("generate", measure(
            [sys.executable, ROOT / "benchmarks" / "make_shape_model.py", name, src], disk=here)))
    else:
        print(f"  {name}: reusing {src}", flush=True)
    _fits_or_exit(here, src, publish=publish)
    shards = sorted(src.glob("*.safetensors"))
    row["source_bytes"] = sum(f.stat().st_size for f in shards)
    row["source_files"] = [f.name for f in shards]

    # ---- raw tools, one after another in one scratch directory (its peak disk is theirs)
    raw = here / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    (raw / "cp-source").mkdir(parents=True)
    record("raw_cp_source", _checked("cp", measure(["cp", *shards, raw / "cp-source"], disk=raw)))
    shutil.rmtree(raw / "cp-source")
    f16 = raw / f"{name}-f16.gguf"
    record("raw_convert", _checked("convert_hf_to_gguf.py", measure(
        [llama.python, llama.converter, src, "--outfile", f16, "--outtype", "f16"], disk=raw)))
    outs = []
    for q in QUANTS:
        out = raw / f"{name}-{q}.gguf"
        record(f"raw_quantize_{q}", _checked(f"llama-quantize {q}", measure(
            [llama.bin("llama-quantize"), f16, out, q.upper(), str(threads)], disk=raw)))
        outs.append(out)
    logits = raw / f"{name}-f16.kld-base.bin"
    text = bundled_text(EVAL_TEXT)
    ppl = llama.bin("llama-perplexity")
    ctx, t = str(GGUF_EVAL_CTX), str(check_threads(threads))
    record("raw_kld_base", _checked("llama-perplexity --kl-divergence-base", measure(
        [ppl, "-m", f16, "-f", text, "--kl-divergence-base", logits, "-c", ctx, "-b", ctx,
         "--chunks", str(GGUF_EVAL_CHUNKS), "-t", t], disk=raw)))
    for q, out in zip(QUANTS, outs, strict=True):
        record(f"raw_kld_{q}", _checked(f"llama-perplexity --kl-divergence {q}", measure(
            [ppl, "-m", out, "--kl-divergence-base", logits, "--kl-divergence", "-c", ctx, "-b", ctx, "-t", t],
            disk=raw)))
    (raw / "cp-outputs").mkdir()
    record("raw_cp_outputs", _checked("cp", measure(["cp", *outs, raw / "cp-outputs"], disk=raw)))
    row["outputs_bytes"] = sum(o.stat().st_size for o in outs)
    row["f16_bytes"] = f16.stat().st_size
    row["kld_base_bytes"] = logits.stat().st_size
    raw_peak_disk = max(s["peak_disk"] for k, s in steps.items() if k.startswith("raw_") and k != "raw_cp_outputs")
    shutil.rmtree(raw)
    if pairs:
        row["convert_pairs"] = convert_pairs(src, raw, llama, pairs)

    # ---- the pipeline: `prefect deployment run convert/<entry> --watch` against the embedded stack, in a fresh
    # git + DVC project; the project, its local DVC remote and the local OCI registry's storage are measured together
    deploy = here / "deployment"
    entry = f"scale-{size.replace('.', '-')}"
    run = _deployment_run(deploy, here, entry, src, record, keep=keep, publish=publish)
    pipe, row["deployment"] = run.measured, f"prefect deployment run convert/{entry}"
    row["flow_run"] = run.flow_run
    row["preflight"] = run.preflight
    row["pipeline_steps_s"] = run.steps
    row["registered"] = run.registered
    row["published_images"] = run.images
    row["pipeline_outcome"] = (f"{run.flow_run['state']}: registered {len(run.registered)}, "
                               f"published {len(run.images)} image reference(s) (quality gate waived: random weights)")
    row["pipeline_steps_by_kind_s"] = run.by_task
    row["pipeline_timings_s"] = run.timings  # the build's own summary (build.json), for comparison
    row["pipeline_outputs_bytes"] = run.outputs_bytes
    row["pipeline_steps_io"] = run.io
    row["variant_reads"] = variant_reads(run.io, run.variant_bytes)
    for name, io in run.io.items():
        print(f"  {name:28} read {io['read_bytes'] / 2**30:6.2f} GiB from the disk, {io['rchar'] / 2**30:6.2f} GiB "
              f"through read(); written {io['write_bytes'] / 2**30:6.2f} GiB", flush=True)
    # what the run leaves on the builder, each inode once: the registered variants (build dir, artifacts/ and the
    # DVC cache sharing them, the DVC remote's copy and the registry's), the f16 and the logits gone
    row["left_on_disk"] = run.left_on_disk
    row["left_over_outputs"] = round(row["left_on_disk"] / row["outputs_bytes"], 3)

    # ---- ratios
    s = {k: v["wall_s"] for k, v in steps.items()}
    raw_build = s["raw_convert"] + sum(s[f"raw_quantize_{q}"] for q in QUANTS)
    raw_validate = s["raw_kld_base"] + sum(s[f"raw_kld_{q}"] for q in QUANTS)
    tim = run.by_task
    pipe_build = sum(tim.get(k, 0.0) for k in ("fetch", "convert", "quantize"))
    pipe_validate = tim.get("validate", 0.0)
    raw_rss = max(v["peak_rss"] for k, v in steps.items() if k.startswith("raw_") and not k.startswith("raw_cp"))
    row.update(
        build_over_raw=round(pipe_build / raw_build, 3),
        total_over_raw=round(pipe.wall_s / (raw_build + raw_validate), 3),
        peak_rss_over_raw=round(pipe.peak_rss / raw_rss, 3),
        peak_disk_over_outputs=round(pipe.peak_disk / row["outputs_bytes"], 3),
        raw_peak_disk_over_outputs=round(raw_peak_disk / row["outputs_bytes"], 3),
        # docs/scale.md's preflight column: the peak over the f16 and the variants together
        peak_disk_over_f16_and_outputs=round(pipe.peak_disk / (row["f16_bytes"] + row["outputs_bytes"]), 3),
        validate_over_build=round(pipe_validate / pipe_build, 3) if pipe_build else None,
        raw_validate_over_build=round(raw_validate / raw_build, 3),
        written_over_raw=round(pipe.write_bytes / max(1, sum(v["write_bytes"] for k, v in steps.items()
                                                          if k.startswith("raw_") and not k.startswith("raw_cp"))), 3),
        raw_build_s=round(raw_build, 2), raw_validate_s=round(raw_validate, 2),
        pipeline_build_s=round(pipe_build, 2), pipeline_validate_s=round(pipe_validate, 2),
        pipeline_register_s=tim.get("register", 0.0), pipeline_publish_image_s=tim.get("publish-image", 0.0),
        pipeline_wall_s=round(pipe.wall_s, 2), pipeline_peak_disk=pipe.peak_disk, raw_peak_disk=raw_peak_disk,
        pipeline_peak_rss=pipe.peak_rss, raw_peak_rss=raw_rss,
        steps=steps, load_1min_end=round(os.getloadavg()[0], 2),
    )
    return row


_GATE_WAIVER = """\
# Written by benchmarks/bench_scale.py; on PYTHONPATH of its deployment run's stack only.
# Random weights carry no signal and fail any quality gate (and the check that the reference beats chance); a
# deployment's costs (registration and publication included) are what is measured, so the flow run's GGUF gate
# accepts every figure and says why in each report. Nothing is imported here: the patch applies when the flow run
# imports pipelines.gguf.build / .validate, and every other Python process (server, DVC, the converter's own
# interpreter) is left as it is.
import importlib.abc
import sys

_BASIS = "benchmark: random weights, quality not judged (benchmarks/bench_scale.py)"


def _waive(module):
    if module.__name__ == "pipelines.gguf.build":
        from pipelines.core.gates import Gate

        module.gguf_gate = lambda q, profile="reference", params=None: Gate(1e9, 0.0, 1e9, basis=_BASIS)
    else:
        module.chance_failure = lambda ppl_reference, vocab: None


class _Waiver(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in ("pipelines.gguf.build", "pipelines.gguf.validate"):
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    run = spec.loader.exec_module

                    def exec_module(module, run=run):
                        run(module)
                        _waive(module)

                    spec.loader.exec_module = exec_module
                    return spec
        return None


sys.meta_path.insert(0, _Waiver())
"""


@dataclass
class DeploymentRun:
    measured: Measured
    flow_run: dict[str, Any]
    preflight: dict[str, Any]
    """What the run's own disk check (pipelines/core/resources.py) predicts on the work dir's filesystem."""
    steps: dict[str, float]
    """Each task run's wall seconds (its end less its start, from the API), by task run name."""
    by_task: dict[str, float]
    """The wall seconds of each kind of step (fetch, convert, quantize, validate, register, publish-image): the union
    of its task runs' spans, so that two quantizations side by side count once."""
    timings: dict[str, Any]
    io: dict[str, dict[str, int]]
    """Bytes read and written in each step (step_io)."""
    variant_bytes: dict[str, int]
    registered: list[str]
    images: list[str]
    outputs_bytes: int
    left_on_disk: int


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_registry(root: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Debian's docker-registry (the toolchain `toolchains/setup-registry.sh` installs), plain HTTP on a free port of
    127.0.0.1, its filesystem storage under `root` (inside the measured directory)."""
    import urllib.request

    from pipelines.publish.localregistry import registry_binary, registry_config

    root.mkdir(parents=True)
    port = _free_port()
    (root / "config.yml").write_text(registry_config(root / "storage", port, redirect_to=None))
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen([registry_binary(), "serve", str(root / "config.yml")], stdout=log,
                                stderr=subprocess.STDOUT)
    for _ in range(150):
        if proc.poll() is not None:
            raise SystemExit(f"docker-registry exited {proc.returncode}:\n{(root / 'registry.log').read_text()[-2000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
            return proc, port
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise SystemExit(f"docker-registry did not answer on 127.0.0.1:{port} within 30 s")


def _registry_images(port: int) -> list[str]:
    """Every image reference the registry holds (its catalog and each repository's tags)."""
    import urllib.request

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/{path}", timeout=10) as r:
            return json.loads(r.read())

    return sorted(f"127.0.0.1:{port}/{repo}:{tag}" for repo in get("_catalog?n=1000").get("repositories", [])
                  for tag in (get(f"{repo}/tags/list").get("tags") or []))


def _bucket(task_run: str) -> str:
    """The kind of a convert flow's task run from its name (quantize-q4_k_m → quantize; the reference logits are
    the validation's, as the build's own timings count them)."""
    if task_run.startswith("reference"):
        return "validate"
    for kind in ("publish-image", "register", "quantize", "validate", "convert", "imatrix", "fetch"):
        if task_run.startswith(kind):
            return kind
    return task_run.rsplit("-", 1)[0] if task_run[-1:].isdigit() else task_run


def _union_s(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


Span = tuple[float, float]


def _flow_record(settings: Settings, deployment: str
                 ) -> tuple[dict[str, Any], dict[str, float], dict[str, float], dict[str, Span]]:
    """The deployment's last flow run (its state, times), its task runs' wall seconds, each and by kind, and each
    task run's span (epoch seconds)."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterId,
    )

    from flows import stack

    with stack.api(settings) as client:
        dep = client.read_deployment_by_name(deployment)
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))
        if not runs:
            raise SystemExit(f"{deployment} has no flow run on record")
        run = max(runs, key=lambda r: r.created)
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    steps: dict[str, float] = {}
    spans: dict[str, list[Span]] = {}
    each: dict[str, Span] = {}
    for t in sorted(tasks, key=lambda t: t.start_time or t.created):
        if t.start_time is None or t.end_time is None:
            continue
        steps[t.name] = round((t.end_time - t.start_time).total_seconds(), 2)
        each[t.name] = (t.start_time.timestamp(), t.end_time.timestamp())
        spans.setdefault(_bucket(t.name), []).append(each[t.name])
    flow = {"id": str(run.id), "name": run.name, "state": run.state.name if run.state else None,
            "message": (run.state.message if run.state else None) or "",
            "wall_s": round(run.total_run_time.total_seconds(), 2) if run.total_run_time else None,
            "tasks": len(tasks)}
    return flow, steps, {k: round(_union_s(v), 2) for k, v in spans.items()}, each


def step_io(series: list[tuple[float, dict[str, int]]], spans: dict[str, Span]) -> dict[str, dict[str, int]]:
    """Bytes read and written in each step of a flow run, from the polled counters of its process tree (`series`)
    and its task runs' `spans`: time is cut where a task run starts or ends, and each stretch gets the growth of the
    counters between the last polls at or before its ends. A stretch in which one task run ran is that step's; one
    in which several ran is theirs together ("a + b"), never split by a guess; one in which none ran is the flow's
    own ("between steps": the flow run starting, scratch removed, the run report)."""
    if len(series) < 2:
        return {}
    times = [t for t, _ in series]

    def at(when: float) -> dict[str, int]:
        return series[max(0, bisect.bisect_right(times, when) - 1)][1]

    cuts = sorted({t for span in spans.values() for t in span if times[0] < t < times[-1]} | {times[0], times[-1]})
    out: dict[str, dict[str, int]] = {}
    for a, b in itertools.pairwise(cuts):
        ran = sorted(name for name, (start, end) in spans.items() if start <= a and end >= b)
        got = out.setdefault(" + ".join(ran) or "between steps", dict.fromkeys(_IO_KEYS, 0))
        first, last = at(a), at(b)
        for k in _IO_KEYS:
            got[k] += last[k] - first[k]
    return out


def variant_reads(io: dict[str, dict[str, int]], sizes: dict[str, int]) -> dict[str, dict[str, Any]]:
    """How many times over each variant's size its own steps read (check, registration, publication): from the
    disk (read_bytes) and through read() (rchar; a mapped file's pages are not in it, the page cache's are). A
    check's figures include its reference logits and text (the `kld_base_bytes` of the row)."""
    out: dict[str, dict[str, Any]] = {}
    for q, size in sizes.items():
        mine = {k: v for k, v in io.items() if k in (f"validate-{q}", f"register-{q}", f"publish-image-{q}")}
        out[q] = {
            "size": size,
            "steps": {k: {"disk": round(v["read_bytes"] / size, 3), "read": round(v["rchar"] / size, 3)}
                      for k, v in mine.items()},
            "disk": round(sum(v["read_bytes"] for v in mine.values()) / size, 3),
            "read": round(sum(v["rchar"] for v in mine.values()) / size, 3),
        }
    return out


def _deployment_yaml(entry: str) -> dict[str, Any]:
    """prefect.yaml with its convert deployment for `entry` alone: the settings every convert/<name> shares (work
    pool, job variables, tags), as a user adds a catalog entry's deployment."""
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    template = next(d for d in project["deployments"] if d.get("entrypoint") == "flows/convert.py:convert")
    dep = {**template, "name": entry, "parameters": {"model": entry},
           "description": f"{entry}: a checkpoint of a release's shape (random weights), benchmarks/bench_scale.py"}
    return {k: v for k, v in project.items() if k != "definitions"} | {"deployments": [dep]}


def _fits_or_exit(here: Path, src: Path, *, publish: bool) -> None:
    """Before the raw tools (hours at 7B): stop when the deployment run's own disk check would refuse it, on the
    places the run will have (its project, DVC remote and registry storage under `here`)."""
    from pipelines.core.errors import RunTooLarge
    from pipelines.core.resources import KLReference, Places, gguf_run, require, source_shape

    d = here / "deployment"
    places = Places(d / "project" / "work", d / "project" / "artifacts", d / "project" / ".dvc" / "cache",
                    dvc_remote=d / "dvc-remote", oci_registry=d / "oci" / "storage" if publish else None)
    # the registering run removes the f16 and the logits once every variant passed, before registration
    check = gguf_run(source_shape(src), QUANTS, places, imatrix=False, kl=KLReference(GGUF_EVAL_CTX, GGUF_EVAL_CHUNKS),
                     keep_f16=False)
    try:
        require(check, what=f"the deployment run of {src.parent.name}")
    except RunTooLarge as err:
        more = " --no-publish leaves the registry's copy out." if publish else ""
        raise SystemExit(f"{err}\n(bench_scale: nothing was run.{more})") from None


def _preflight(settings: Settings, src: Path) -> dict[str, Any]:
    """The disk check the flow run makes before its first step, on the places it finds (the project's local DVC
    remote, the registry's storage), for the work dir's filesystem."""
    from flows.convert import oci_registry
    from pipelines.compose import registry_places
    from pipelines.core.resources import KLReference, gguf_run, source_shape

    places = registry_places(settings, oci=oci_registry(settings))
    # the registering run removes the f16 and the logits once every variant passed, before registration
    check = gguf_run(source_shape(src), QUANTS, places, imatrix=False, kl=KLReference(GGUF_EVAL_CTX, GGUF_EVAL_CHUNKS),
                     keep_f16=False)
    fs = next(f for f in check.filesystems if any(loc == "work_dir" for loc, _ in f.locations))
    return {"needed": fs.needed, "margin": fs.margin, "free": fs.free, "fits": fs.fits, "peak_step": fs.peak_step,
            "places": [loc for loc, _ in fs.locations], "outputs": list(fs.outputs)}


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _deployment_run(deploy: Path, here: Path, entry: str, src: Path, record: Any, *, keep: bool,
                    publish: bool) -> DeploymentRun:
    """`prefect deployment run convert/<entry> --watch` as a user runs it: a git + DVC project with a local DVC
    remote, the embedded stack (`modelmint stack up`: Prefect server on SQLite on a free port of 127.0.0.1, work
    pool, prefect.yaml's deployments and this entry's, the process worker), MODELMINT_OCI_REGISTRY naming a local
    docker-registry (unless not `publish`). `deploy` (project, DVC remote, registry storage) is the measured
    directory.

    What is measured: wall time from the `--watch` call to its end; peak RSS of the worker's descendants (the flow
    run's process the worker spawns and every tool under it; the worker, the server, the registry and the `--watch`
    client are not in it) polled every 0.25 s; peak disk of `deploy` polled; bytes read and written: the growth of
    the worker's /proc/PID/io over the run, which holds the worker's own I/O and that of every descendant it (or a
    descendant) reaped, i.e. the flow run and its tools. Not counted: the server's SQLite writes, docker-registry's
    writes of the pushed blobs (its storage is in the peak disk) and the Prefect home's result files.
    """
    from flows import stack

    project, remote, oci = deploy / "project", deploy / "dvc-remote", deploy / "oci"
    shutil.rmtree(deploy, ignore_errors=True)
    deploy.mkdir(parents=True)
    env = _project(project, remote, entry, src)
    site = here / "bench-site"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir()
    (site / "sitecustomize.py").write_text(_GATE_WAIVER)
    prefect_home = here / "prefect"
    shutil.rmtree(prefect_home, ignore_errors=True)
    registry, port = _start_registry(oci) if publish else (None, 0)
    if publish:
        env.update({"MODELMINT_OCI_REGISTRY": f"127.0.0.1:{port}/bench", "MODELMINT_OCI_INSECURE": "1"})
    env.update({
        "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "MODELMINT_PREFECT_PORT": str(_free_port()),
        "MODELMINT_PREFECT_HOME": str(prefect_home),
        # prefect.yaml's watch-upstream deployment has a cron schedule: only this run runs
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
    })
    settings = Settings.from_env(env)
    senv = {**env, **stack.stack_env(settings)}
    deployment = f"convert/{entry}"
    try:
        preflight = _preflight(settings, src)
        print(f"  preflight: {preflight['needed'] / 2**30:.2f} GiB at {preflight['peak_step']} on the disk of "
              f"{', '.join(preflight['places'])}, {preflight['free'] / 2**30:.2f} GiB free", flush=True)
        _checked("modelmint stack up", _run([sys.executable, "-m", "pipelines.cli", "stack", "up"], env, ROOT))
        spec = here / "prefect-bench.yaml"
        spec.write_text(yaml.safe_dump(_deployment_yaml(entry), sort_keys=False))
        _checked("prefect deploy", _run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all",
                                         "--prefect-file", str(spec)], senv, ROOT))
        worker = stack.StackState.load(settings).worker_pid
        if worker is None:
            raise SystemExit("modelmint stack up left no worker")
        before = _proc_io(worker)
        m = measure([sys.executable, "-m", "prefect", "deployment", "run", deployment, "--watch"], disk=deploy,
                    env=senv, cwd=ROOT, tree=worker)
        # the flow run's process ends after it reports its final state: wait (bounded) until the worker reaped it
        for _ in range(240):
            if not _descendants(worker):
                break
            time.sleep(0.25)
        after = _proc_io(worker)
        m.read_bytes, m.write_bytes, m.rchar, m.wchar = (after.get(k, 0) - before.get(k, 0) for k in
                                                          ("read_bytes", "write_bytes", "rchar", "wchar"))
        record("pipeline_deployment_run", m)
        flow, steps, by_task, spans = _flow_record(settings, deployment)
        images = _registry_images(port) if registry is not None else []
    finally:
        _run([sys.executable, "-m", "pipelines.cli", "stack", "down"], env, ROOT)
        if registry is not None:
            registry.terminate()
            registry.wait()
    if m.returncode != 0 or flow["state"] != "Completed":
        raise SystemExit(f"{deployment} failed (exit {m.returncode}, {flow['state']}: {flow['message']}):\n"
                         f"{(m.stdout + m.stderr)[-3000:]}")
    manifests = sorted((project / "registry" / "manifests" / entry).glob("*.json"))
    summaries = list((project / "work").rglob("build.json"))
    built = json.loads(summaries[0].read_text()) if summaries else {}
    run = DeploymentRun(
        measured=m, flow_run=flow, preflight=preflight, steps=steps, by_task=by_task, timings=built.get("timings", {}),
        io=step_io(m.io_series, spans),
        variant_bytes={q: v.get("size_bytes") or 0 for q, v in built.get("variants", {}).items()},
        registered=[f"{entry}:{p.stem}" for p in manifests], images=images,
        outputs_bytes=sum(v.get("size_bytes") or 0 for v in built.get("variants", {}).values()),
        left_on_disk=_du(deploy))
    if len(run.registered) != len(QUANTS) or (publish and not run.images):
        raise SystemExit(f"{deployment} completed but registered {run.registered} and published {run.images}")
    if not keep:
        shutil.rmtree(deploy)
        for extra in (prefect_home, site):
            shutil.rmtree(extra, ignore_errors=True)
        (here / "prefect-bench.yaml").unlink(missing_ok=True)
    return run


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> Measured:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    return Measured(0.0, 0, 0, 0, 0, 0, 0, done.returncode, done.stdout, done.stderr)


def _project(project: Path, remote: Path, entry: str, src: Path) -> dict[str, str]:
    """A git + DVC repository laid out as the project (catalog, toolchain pins, .dvc/config, dvc.yaml) with one
    catalog entry, `entry`, pointing at the checkpoint `src`, and a local DVC remote at `remote`; its environment."""
    from pipelines.source.catalog import load_catalog
    from pipelines.store import dvcgen

    for d in (project, remote):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    (project / "registry").mkdir()
    (project / "toolchains").mkdir()
    catalog = project / "registry" / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": [{
        "name": entry, "source": {"path": str(src)}, "license": "apache-2.0", "gate_profile": "tiny",
        "variants": {"gguf": {"outtype": "f16", "quants": QUANTS}},
    }]}))
    for pins in ("llama-cpp.env", "llmcompressor.env"):
        shutil.copy(ROOT / "toolchains" / pins, project / "toolchains" / pins)
    for f in (".gitignore", ".dvcignore"):
        shutil.copy(ROOT / f, project / f)
    shutil.copytree(ROOT / ".dvc", project / ".dvc", ignore=shutil.ignore_patterns("config.local", "tmp", "cache"))
    env = {**os.environ, "MODELMINT_REPO": str(project), "MODELMINT_WORK_DIR": str(project / "work"),
           "MODELMINT_CATALOG": str(catalog), "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@modelmint.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@modelmint.invalid"}
    for key in ("MODELMINT_OCI_REGISTRY", "MODELMINT_SIGNING_KEY", "MODELMINT_KEEP_SCRATCH"):
        env.pop(key, None)
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True, env=env)
    subprocess.run([sys.executable, "-m", "dvc", "remote", "modify", "local", "url", str(remote)], cwd=project,
                   check=True, env=env, stdout=subprocess.DEVNULL)
    dvcgen.write(load_catalog(catalog), project / "dvc.yaml")
    subprocess.run([*git, "add", "-A"], cwd=project, check=True, env=env)
    subprocess.run([*git, "commit", "-q", "-m", "a modelmint project"], cwd=project, check=True, env=env)
    return env


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b·x (one point: a line through the origin)."""
    if len(xs) == 1:
        return 0.0, ys[0] / xs[0]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


FITTED = {
    "raw_total_s": ("raw tools, build + validate (s)", lambda r: r["raw_build_s"] + r["raw_validate_s"]),
    "pipeline_wall_s": ("prefect deployment run convert/<entry> (s)", lambda r: r["pipeline_wall_s"]),
    "raw_peak_disk_gb": ("raw tools, peak disk (GB)", lambda r: r["raw_peak_disk"] / 1e9),
    "pipeline_peak_disk_gb": ("deployment run, peak disk (GB)", lambda r: r["pipeline_peak_disk"] / 1e9),
}


def extrapolate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    xs = [r["params"] / 1e9 for r in rows]
    out: dict[str, Any] = {}
    for key, (label, get) in FITTED.items():
        a, b = fit(xs, [get(r) for r in rows])
        out[key] = {"label": label, "intercept": round(a, 3), "per_billion": round(b, 3),
                    **{t: round(a + b * p / 1e9, 1) for t, p in TARGETS.items()}}
    return out


def svg(rows: list[dict[str, Any]], fits: dict[str, Any]) -> str:
    """Two log-log panels (time, disk) of the measured sizes and the fitted lines out to 72B."""
    import math

    w, h, pad, top = 380, 320, 55, 75
    colours = {"raw_total_s": "#1f77b4", "pipeline_wall_s": "#d62728",
               "raw_peak_disk_gb": "#1f77b4", "pipeline_peak_disk_gb": "#d62728"}
    panels = [("time per run (s)", ["raw_total_s", "pipeline_wall_s"]),
              ("peak disk (GB)", ["raw_peak_disk_gb", "pipeline_peak_disk_gb"])]
    xmax = max(TARGETS.values()) / 1e9
    xmin = min(r["params"] for r in rows) / 1e9 / 1.5
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h + 54}" '
             f'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>']
    for i, (title, keys) in enumerate(panels):
        ox = i * w
        pts = [(x / 1e9, fits[k]["intercept"] + fits[k]["per_billion"] * x / 1e9)
               for k in keys for x in [*[r["params"] for r in rows], *TARGETS.values()]]
        pts += [(r["params"] / 1e9, FITTED[k][1](r)) for k in keys for r in rows]
        ys = [y for _, y in pts if y > 0]
        ymin, ymax = min(ys) / 1.5, max(ys) * 1.5

        def px(x: float, ox: float = ox) -> float:
            return ox + pad + (math.log10(x) - math.log10(xmin)) / (math.log10(xmax * 1.3) - math.log10(xmin)) * (
                w - pad - 15)

        def py(y: float, ymin: float = ymin, ymax: float = ymax) -> float:
            return h - pad + 20 - (math.log10(max(y, ymin)) - math.log10(ymin)) / (
                math.log10(ymax) - math.log10(ymin)) * (h - pad + 20 - top)

        parts.append(f'<text x="{ox + w / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>')
        parts.append(f'<line x1="{px(xmin)}" y1="{py(ymin)}" x2="{px(xmax * 1.3)}" y2="{py(ymin)}" stroke="#444"/>')
        parts.append(f'<line x1="{px(xmin)}" y1="{py(ymin)}" x2="{px(xmin)}" y2="{py(ymax)}" stroke="#444"/>')
        for x in [0.5, 1.5, 7, 14, 32, 72]:
            if xmin <= x:
                parts.append(f'<text x="{px(x):.1f}" y="{py(ymin) + 14:.1f}" text-anchor="middle">{x:g}B</text>')
        for e in range(math.floor(math.log10(ymin)), math.ceil(math.log10(ymax)) + 1):
            if ymin <= 10**e <= ymax:
                parts.append(f'<text x="{px(xmin) - 4:.1f}" y="{py(10**e) + 4:.1f}" text-anchor="end">{10**e:g}</text>')
                parts.append(f'<line x1="{px(xmin)}" y1="{py(10**e):.1f}" x2="{px(xmax * 1.3):.1f}" '
                             f'y2="{py(10**e):.1f}" stroke="#ddd"/>')
        for j, k in enumerate(keys):
            c, f = colours[k], fits[k]
            line = [(x, f["intercept"] + f["per_billion"] * x) for x in
                    [xmin * 1.5 * (xmax / (xmin * 1.5)) ** (n / 40) for n in range(41)]]
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in line if y > 0)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-dasharray="5,4"/>')
            for r in rows:
                parts.append(f'<circle cx="{px(r["params"] / 1e9):.1f}" cy="{py(FITTED[k][1](r)):.1f}" r="4" '
                             f'fill="{c}"/>')
            for t, p in TARGETS.items():
                parts.append(f'<text x="{px(p / 1e9) - 4:.1f}" y="{py(f[t]) - 6 - 12 * j:.1f}" text-anchor="end" '
                             f'fill="{c}">{f[t]:,.0f}</text>')
            parts.append(f'<text x="{ox + pad + 8}" y="{38 + 14 * j}" fill="{c}">{FITTED[k][0]}</text>')
    loads = ", ".join(f"{r['size']}: {r['load_1min_start']}–{r['load_1min_end']}" for r in rows)
    parts.append(f'<text x="10" y="{h + 30}" fill="#555">dots: measured on checkpoints of the releases\' shapes '
                 f'(random weights); dashes: least-squares fit per billion parameters, extrapolated</text>')
    parts.append(f'<text x="10" y="{h + 46}" fill="#555">{rows[0]["threads"]} threads; 1-min load average '
                 f'(start–end) {loads}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _merged(out: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with the rows of the sizes not run this time kept from `out` (an earlier run's file), in size order:
    `--sizes 0.5b` updates one row of the reference and keeps the others (each row says when and on which
    machine it was measured)."""
    before = json.loads(out.read_text()) if out.is_file() else {}
    ran = {r["size"] for r in rows}
    kept = [r for r in before.get("rows", []) if r.get("size") in SIZES and r["size"] not in ran]
    for r in kept:  # a row from before rows named their machine was measured on the file's
        r.setdefault("machine", before.get("machine"))
    return sorted(kept + rows, key=lambda r: list(SIZES).index(r["size"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0.5b,1.5b", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--work-dir", type=Path, help="where checkpoints and outputs go (default MODELMINT_HOME/bench/scale)")
    ap.add_argument("--keep", action="store_true", help="keep each pipeline project (checkpoints are always kept)")
    ap.add_argument("--no-publish", action="store_true",
                    help="no OCI registry: the deployment run registers (DVC) and publishes no image, one copy of the "
                    "variants fewer on the disk")
    ap.add_argument("--convert-pairs", type=int, default=0, metavar="N",
                    help="also run the raw converter and the convert step's work on it N times each, in pairs, "
                    "for the step's cost against the converter's spread (convert_pairs)")
    ap.add_argument("--out", type=Path, default=REFERENCE,
                    help="the JSON written; rows of sizes not run are kept from it (default %(default)s)")
    ap.add_argument("--plot", type=Path, default=PLOT, help="the SVG written (default %(default)s)")
    args = ap.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or not sizes:
        raise SystemExit(f"unknown size {', '.join(unknown) or '(none)'}: choose from {', '.join(SIZES)}")
    settings = Settings.from_env()
    work = args.work_dir or settings.home / "bench" / "scale"
    subprocess.run([sys.executable, "-m", "compileall", "-q", ROOT / "pipelines"], check=True,
                   stdout=subprocess.DEVNULL)
    info: dict[str, Any] = {"machine": machine(), "load_1min_start": round(os.getloadavg()[0], 2),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rows = []
    for size in sizes:
        print(f"{size} ({SIZES[size]}):", flush=True)
        rows.append(bench_size(size, work, settings, keep=args.keep, publish=not args.no_publish,
                               pairs=args.convert_pairs))
    info["load_1min_end"] = round(os.getloadavg()[0], 2)
    for r in rows:
        r["measured_at"], r["machine"] = info["started"], info["machine"]
    rows = _merged(args.out, rows)
    fits = extrapolate(rows)

    print(f"\n{'size':6} {'params':>8} {'build/raw':>10} {'rss/raw':>8} {'disk/outputs':>13} {'raw disk/out':>13} "
          f"{'validate/build':>15} {'load start-end':>15}")
    for r in rows:
        print(f"{r['size']:6} {r['params'] / 1e9:7.2f}B {r['build_over_raw']:10.3f} {r['peak_rss_over_raw']:8.3f} "
              f"{r['peak_disk_over_outputs']:13.3f} {r['raw_peak_disk_over_outputs']:13.3f} "
              f"{r['validate_over_build']:15.3f} {r['load_1min_start']:7.1f}-{r['load_1min_end']:<7.1f}")
    print(f"\nfit per billion parameters ({'exact through 2 points' if len(rows) == 2 else 'least squares'}), "
          f"extrapolated:")
    print(f"{'':38} {'a':>8} {'per B':>8} " + " ".join(f"{t:>9}" for t in TARGETS))
    for f in fits.values():
        print(f"{f['label']:38} {f['intercept']:8.2f} {f['per_billion']:8.2f} "
              + " ".join(f"{f[t]:9,.0f}" for t in TARGETS))
        if f["per_billion"] <= 0:
            print(f"  {f['label']}: a cost that falls with size says the load changed between the sizes; "
                  "rerun on a quieter machine")
    m = info["machine"]
    print(f"\n{m['nproc']} CPUs ({m['cpu']}), {m['ram_bytes'] / 2**30:.0f} GiB; load average "
          f"{info['load_1min_start']} at the start, {info['load_1min_end']} at the end")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**info, "quants": QUANTS, "eval": {"text": EVAL_TEXT, "ctx": GGUF_EVAL_CTX,
                                                                        "chunks": GGUF_EVAL_CHUNKS},
                                    "rows": rows, "fit": fits}, indent=2) + "\n")
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    args.plot.write_text(svg(rows, fits))
    print(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
