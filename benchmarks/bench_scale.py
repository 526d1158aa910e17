"""GGUF path at real model sizes: the pipeline against the raw llama.cpp tools on checkpoints of real shapes.

Run: .venv/bin/python benchmarks/bench_scale.py [--sizes 0.5b,1.5b,7b,8b] [--work-dir DIR] [--keep]

For each size, benchmarks/make_shape_model.py writes a bf16 checkpoint of the release's exact shape (random weights),
then in the same run: the raw tools (convert_hf_to_gguf.py to f16, llama-quantize q4_k_m and q8_0, llama-perplexity
--kl-divergence-base over the pipeline's evaluation text and context, its --kl-divergence per variant, cp of the
outputs) and a deployment's run, `modelmint convert <entry> --variants q4_k_m,q8_0 --register`, on a catalog entry
pointing at the checkpoint, in a temporary git + DVC project (its own MODELMINT_WORK_DIR, artifacts/ and DVC cache,
all inside the measured directory; the local DVC remote beside it). Each is measured as a process tree: wall time, peak RSS (the tree's
RSS polled, and the largest process's from wait4), peak disk of its directory (polled), bytes read and written
(/proc/PID/io of the tree's root, which holds every reaped descendant's). Prints the ratios and a least-squares fit per
billion parameters extrapolated to 14B, 32B and 72B; writes benchmarks/reference/scale.json and docs/images/scale.svg.

Random weights carry no signal and every quality gate refuses them: the pipeline's process here replaces the GGUF
gate with one that accepts every figure and names this benchmark as its basis (each report and manifest says so), so
that the registration runs and its cost is measured; the validation itself runs in full.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from make_shape_model import SHAPES, ensure_tokenizer, is_complete  # noqa: E402

from pipelines.core.settings import Settings  # noqa: E402
from pipelines.core.texts import EVAL_TEXT, bundled_text  # noqa: E402
from pipelines.core.toolchains import llama_cpp  # noqa: E402
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


def measure(argv: list[str | Path], *, disk: Path, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Measured:
    """Run `argv` to its end, watching its process tree and the disk used under `disk`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        return _measure(argv, out, err, disk=disk, env=env, cwd=cwd)


def _measure(argv: list[str | Path], out: Any, err: Any, *, disk: Path, env: dict[str, str] | None,
             cwd: Path | None) -> Measured:
    peak = {"rss": 0, "disk": _du(disk)}
    start = time.perf_counter()
    proc = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=err, env=env, cwd=cwd)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak["rss"] = max(peak["rss"], _tree_rss(proc.pid))
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
        wall_s=wall, peak_rss=max(peak["rss"], rusage.ru_maxrss * 1024), peak_disk=peak["disk"],
        read_bytes=io.get("read_bytes", 0), write_bytes=io.get("write_bytes", 0), rchar=io.get("rchar", 0),
        wchar=io.get("wchar", 0), returncode=proc.returncode,
        stdout=out.read().decode(errors="replace"), stderr=err.read().decode(errors="replace"),
    )


def _checked(step: str, m: Measured) -> Measured:
    if m.returncode != 0:
        raise SystemExit(f"{step} failed (exit {m.returncode}):\n{m.stderr[-3000:]}")
    return m


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"nproc": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total, "cpu": cpu,
            "python": platform.python_version()}


def bench_size(size: str, work: Path, settings: Settings, *, keep: bool) -> dict[str, Any]:
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
        steps[step] = {k: v for k, v in asdict(m).items() if k not in ("stdout", "stderr", "returncode")}
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

    # ---- the pipeline: a deployment's run, `modelmint convert --register` on a catalog entry pointing at the
    # checkpoint, in a fresh git + DVC project (its build dir, artifacts/ and DVC cache all measured; the DVC remote
    # beside it is not, as docs/scale.md counts it)
    project = here / "project"
    entry = f"scale-{size.replace('.', '-')}"
    env = _project(project, here / "dvc-remote", entry, src)
    pipe = record("pipeline_convert", measure(
        [sys.executable, "-c", _GATE_WAIVED, "convert", entry, "--variants", ",".join(QUANTS), "--json",
         "--register"], disk=project, env=env, cwd=project))
    summaries = list((project / "work").rglob("build.json"))
    if not summaries:
        raise SystemExit(f"modelmint convert left no build.json (exit {pipe.returncode}):\n{pipe.stderr[-3000:]}")
    built = json.loads(summaries[0].read_text())
    if pipe.returncode != 0:
        raise SystemExit(f"modelmint convert --register failed (exit {pipe.returncode}):\n{pipe.stderr[-3000:]}")
    manifests = sorted((project / "registry" / "manifests" / entry).glob("*.json"))
    row["pipeline_outcome"] = f"registered {len(manifests)} (quality gate waived: random weights)"
    row["deployment"] = "modelmint convert --register"
    row["pipeline_timings_s"] = built.get("timings", {})
    pipe_outputs = sum(v.get("size_bytes") or 0 for v in built.get("variants", {}).values())
    row["pipeline_outputs_bytes"] = pipe_outputs
    # what the run leaves on the builder, each inode once: the registered variants (build dir, artifacts/ and the
    # DVC cache sharing them), the f16 and the logits gone
    row["left_on_disk"] = _du(project)
    row["left_over_outputs"] = round(row["left_on_disk"] / row["outputs_bytes"], 3)
    if not keep:
        shutil.rmtree(project)
        shutil.rmtree(here / "dvc-remote", ignore_errors=True)

    # ---- ratios
    s = {k: v["wall_s"] for k, v in steps.items()}
    raw_build = s["raw_convert"] + sum(s[f"raw_quantize_{q}"] for q in QUANTS)
    raw_validate = s["raw_kld_base"] + sum(s[f"raw_kld_{q}"] for q in QUANTS)
    tim = row["pipeline_timings_s"]
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
        pipeline_wall_s=round(pipe.wall_s, 2), pipeline_peak_disk=pipe.peak_disk, raw_peak_disk=raw_peak_disk,
        pipeline_peak_rss=pipe.peak_rss, raw_peak_rss=raw_rss,
        steps=steps, load_1min_end=round(os.getloadavg()[0], 2),
    )
    return row


_GATE_WAIVED = """
import sys
import pipelines.gguf.build as build
import pipelines.gguf.validate as validate
from pipelines.core.gates import Gate

# Random weights carry no signal and fail any quality gate (and the check that the reference beats chance); a
# deployment's costs (registration included) are what is measured, so this benchmark's gate accepts every figure and
# says why in each report.
build.gguf_gate = lambda q, profile="reference", params=None: Gate(
    1e9, 0.0, 1e9, basis="benchmark: random weights, quality not judged (benchmarks/bench_scale.py)")
validate.chance_failure = lambda ppl_reference, vocab: None
from pipelines.cli import main
sys.argv = ["modelmint", *sys.argv[1:]]
main()
"""


def _project(project: Path, remote: Path, entry: str, src: Path) -> dict[str, str]:
    """A git + DVC repository laid out as the project (catalog, toolchain pins, .dvc/config, dvc.yaml) with one
    catalog entry, `entry`, pointing at the checkpoint `src`, and a local DVC remote at `remote`; its environment."""
    from pipelines.store import dvcgen
    from pipelines.source.catalog import load_catalog

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
    "pipeline_wall_s": ("modelmint convert (s)", lambda r: r["pipeline_wall_s"]),
    "raw_peak_disk_gb": ("raw tools, peak disk (GB)", lambda r: r["raw_peak_disk"] / 1e9),
    "pipeline_peak_disk_gb": ("modelmint convert, peak disk (GB)", lambda r: r["pipeline_peak_disk"] / 1e9),
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
    `--sizes 0.5b` updates one row of the reference and keeps the others (each row says when it was measured)."""
    earlier = json.loads(out.read_text()).get("rows", []) if out.is_file() else []
    ran = {r["size"] for r in rows}
    kept = [r for r in earlier if r.get("size") in SIZES and r["size"] not in ran]
    return sorted(kept + rows, key=lambda r: list(SIZES).index(r["size"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0.5b,1.5b", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--work-dir", type=Path, help="where checkpoints and outputs go (default MODELMINT_HOME/bench/scale)")
    ap.add_argument("--keep", action="store_true", help="keep each pipeline project (checkpoints are always kept)")
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
        rows.append(bench_size(size, work, settings, keep=args.keep))
    info["load_1min_end"] = round(os.getloadavg()[0], 2)
    for r in rows:
        r["measured_at"] = info["started"]
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
