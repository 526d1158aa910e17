"""Compressed-tensors benchmark on a generated Qwen2.5-0.5B-shaped model: modelmint's step against plain llmcompressor.

Run: .venv/bin/python benchmarks/bench_compress.py [--schemes fp8,awq] [--calibration 16x256] [--keep]
For each scheme, in the same run: a plain llmcompressor script (load, oneshot, save: what its README does)
and modelmint's compress step (plan_compressed + ensure_compressed: job file, AWQ mapping check, calibration
windows, oneshot, save, verbatim tokenizer copy, receipt with every file's sha256). Prints pipeline / plain
wall-time ratios (target ≤ 1.05), each one's share spent inside oneshot, and peak RSS; writes
benchmarks/results/compress.json. Random weights: this measures speed and memory, not quality.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from pipelines.core.runner import run
from pipelines.core.settings import Settings, project_root
from pipelines.core.toolchains import llmcompressor

ROOT = project_root()
# Qwen2.5-0.5B's geometry: 494 M parameters (tied embeddings), ~0.99 GB in bf16
SHAPE = {"HIDDEN": 896, "INTER": 4864, "LAYERS": 24, "HEADS": 14, "KV_HEADS": 2, "VOCAB": 151936}
CALIBRATION = {"num_samples": 16, "max_seq_length": 256}

# What an llmcompressor user writes (its README's oneshot example), with the same modifiers, the same
# calibration windows and the same CPU pin_memory fix (without it AWQ cannot run on a CPU-only torch).
_PLAIN = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from llmcompressor.modifiers.transform.awq import AWQModifier
from llmcompressor.pipelines.cache import IntermediatesCache
from transformers import AutoModelForCausalLM, AutoTokenizer
if not torch.accelerator.is_available():
    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None
src, out, scheme, text, n, length = sys.argv[1:7]
n, length = int(n), int(length)
model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
tok = AutoTokenizer.from_pretrained(src)
kw = {}
if scheme == "awq":
    recipe = [AWQModifier(), QuantizationModifier(targets=["Linear"], scheme="W4A16_ASYM", ignore=["lm_head"])]
    ids = tok(open(text).read(), add_special_tokens=False)["input_ids"]
    rows = [ids[i * length:(i + 1) * length] for i in range(n)]
    kw = dict(dataset=Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * length for _ in rows]}),
              num_calibration_samples=n, max_seq_length=length, shuffle_calibration_samples=False)
else:
    recipe = [QuantizationModifier(targets=["Linear"], scheme="FP8_DYNAMIC", ignore=["lm_head"])]
t1 = time.perf_counter()
oneshot(model=model, recipe=recipe, **kw)
t2 = time.perf_counter()
model.save_pretrained(out, save_compressed=True)
tok.save_pretrained(out)
print(json.dumps({"oneshot_s": t2 - t1, "in_process_s": time.perf_counter() - t0}))
"""

_DRIVER = r"""
import json, sys, time
from pipelines.source.catalog import load_catalog
from pipelines.compressed.build import ensure_compressed, plan_compressed
from pipelines.core.settings import Settings
settings = Settings.from_env()
v = sys.argv[1]
entry = load_catalog(settings.catalog_path).get("bench-0.5b")
t0 = time.perf_counter()
plan = plan_compressed(entry, settings, schemes=[v])
t1 = time.perf_counter()
step = ensure_compressed(plan, v)
t2 = time.perf_counter()
q = step.receipt["quantize"]
print(json.dumps({"plan_s": t1 - t0, "step_s": t2 - t1, "oneshot_s": q["timings"]["oneshot"],
                  "tool_wall_s": q["wall_s"], "tool_peak_rss": q["peak_rss_bytes"], "ran": step.ran}))
"""


def _make_model(out: Path, tokenizer_from: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_bench_model", ROOT / "benchmarks" / "make_bench_model.py")
    assert spec and spec.loader
    mbm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mbm)
    for k, v in SHAPE.items():  # the generator's geometry is module-level: set it to the 0.5B shape
        setattr(mbm, k, v)
    mbm.HEAD_DIM = SHAPE["HIDDEN"] // SHAPE["HEADS"]
    mbm.main(out, tokenizer_from)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--schemes", default="fp8,awq")
    ap.add_argument("--calibration", default="16x256", help="AWQ calibration: SAMPLESxTOKENS (AWQ on 2 CPU cores "
                    "takes minutes per 1,000 tokens at this size)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    schemes = args.schemes.split(",")
    n, length = (int(x) for x in args.calibration.split("x"))
    CALIBRATION.update(num_samples=n, max_seq_length=length)
    settings = Settings.from_env()
    tc = llmcompressor(settings)
    model = settings.home / "bench" / "qwen2-shaped-0.5b"
    if not (model / "model.safetensors.index.json").exists():
        from pipelines.source.tinymodel import ensure_tiny_model

        print("generating the 0.5B-shaped model …", flush=True)
        _make_model(model, ensure_tiny_model("tiny-qwen2", settings))
    config = json.loads((model / "config.json").read_text())
    if len(config.get("layer_types") or []) != SHAPE["LAYERS"]:
        shutil.rmtree(model)
        raise SystemExit(f"{model} came from an older generator; removed it, run again")
    src_bytes = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    scratch = Path(tempfile.mkdtemp(prefix="modelmint-bench-", dir=settings.home))
    catalog = scratch / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": [{
        "name": "bench-0.5b", "source": {"path": str(model)}, "license": "apache-2.0", "gate_profile": "tiny",
        "variants": {"gguf": None, "fp8": {}, "awq": {"calibration": CALIBRATION}},
    }]}))
    env = {**os.environ, "MODELMINT_WORK_DIR": str(scratch / "work"), "MODELMINT_CATALOG": str(catalog),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    plain_script = scratch / "plain.py"
    plain_script.write_text(_PLAIN)
    for f in sorted(model.glob("*.safetensors")):  # the same warm page cache for both
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass

    res: dict[str, Any] = {"source_bytes": src_bytes, "threads": settings.effective_threads, "schemes": {}}
    for v in schemes:
        plain = run([tc.python, plain_script, model, scratch / f"plain-{v}", v, ROOT / "pipelines" / "data" / "train.txt",
                     str(CALIBRATION["num_samples"]), str(CALIBRATION["max_seq_length"])], env=env)
        inner = json.loads(plain.stdout.strip().splitlines()[-1])
        pipe = run([sys.executable, "-c", _DRIVER, v], env=env)
        p = json.loads(pipe.stdout.strip().splitlines()[-1])
        assert p["ran"], "the pipeline step was cached: remove the scratch work dir"
        res["schemes"][v] = {
            "plain_wall_s": plain.wall_s, "plain_oneshot_s": inner["oneshot_s"], "plain_peak_rss": plain.peak_rss_bytes,
            "pipe_step_s": p["step_s"], "pipe_plan_s": p["plan_s"], "pipe_oneshot_s": p["oneshot_s"],
            "pipe_tool_wall_s": p["tool_wall_s"], "pipe_tool_peak_rss": p["tool_peak_rss"],
            "pipe_driver_peak_rss": pipe.peak_rss_bytes,
        }
        shutil.rmtree(scratch / f"plain-{v}", ignore_errors=True)
    if not args.keep:
        shutil.rmtree(scratch)

    rows = []
    for v, r in res["schemes"].items():
        rows += [
            (f"{v}: pipeline step / plain llmcompressor script (wall)", r["pipe_step_s"] / r["plain_wall_s"], "≤ 1.05"),
            (f"{v}: pipeline step / its own oneshot call", r["pipe_step_s"] / r["pipe_oneshot_s"], "(report)"),
            (f"{v}: plain script / its own oneshot call", r["plain_wall_s"] / r["plain_oneshot_s"], "(report)"),
            (f"{v}: peak RSS pipeline tool / plain script", r["pipe_tool_peak_rss"] / r["plain_peak_rss"], "≤ 1.05"),
            (f"{v}: peak RSS of the llmcompressor process (GB)", r["pipe_tool_peak_rss"] / 1e9, "(report)"),
            (f"{v}: oneshot seconds (pipeline / plain)", r["pipe_oneshot_s"], f"{r['plain_oneshot_s']:.1f} s plain"),
        ]
    print(f"\nsource: {src_bytes / 1e9:.2f} GB bf16 (Qwen2.5-0.5B shape, random weights), "
          f"{settings.effective_threads} threads, calibration {CALIBRATION}")
    print(f"{'measure':58} {'value':>9}  target")
    for name, value, target in rows:
        print(f"{name:58} {value:9.3f}  {target}")
    print("\nraw figures:", json.dumps(res, default=str))
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "compress.json").write_text(json.dumps({"ratios": {n: v for n, v, _ in rows}, "raw": res}, indent=2))


if __name__ == "__main__":
    main()
