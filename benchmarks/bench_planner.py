"""The serving planner's memory terms against real vLLM startups (tests/data/vllm_startups/): KV pool, weights,
activation peak and non-torch memory per GPU, planned for each logged layout and compared with what vLLM logged.

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_planner.py [--fit] [--json benchmarks/results/planner.json]
Prints one row per corpus entry (planned / logged ratios), then the median and worst KV ratio, how many entries are
within ±10 % (goal: ≥ 90 %), and whether the planner refused any layout vLLM served (goal: none). An entry whose
config contradicts its own log (weights or KV bytes per token off by more than 2 %) is refused, not compared.
--fit refits the planner's memory terms on the corpus (least squares) and prints them next to the constants in
pipelines/publish/planner.py. --wizard PYTHON puts vllm-wizard's KV pool beside the planner's, run by that
interpreter (a benchmark-only venv: python -m venv /tmp/vw && /tmp/vw/bin/pip install vllm-wizard==0.2.0), on the
memory the log reports (the most favourable GPU size for it).

Each entry is planned from a header-only checkpoint built from the model's published config.json (the same tensor
table `write_header_only_checkpoint` writes as a sparse .safetensors file): the planner reads real tensor bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.publish import planner
from pipelines.publish.planner import GIB, GPU, Ask, ModelShape, shape_of

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "vllm_startups"
TOLERANCE = 0.02
"""How far a config may disagree with its log (weights, KV bytes per token) before the entry is refused."""
ACTIVATION_PROFILER_FROM = (0, 17)
"""vLLM's profile run as it is today (0.17 cut the reported activation peak by about 60 %): the activation fit."""
NON_TORCH_FROM = (0, 7)
"""vLLM counts only the non-torch memory that grows during profiling from 0.7 on (0.6.5 counted the CUDA context)."""

_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I8": 1, "I32": 4}


# ---------------------------------------------------------------- the corpus


def load_corpus(directory: Path = CORPUS) -> list[dict[str, Any]]:
    """Every entry of the corpus, by file name."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]


def version(entry: dict[str, Any]) -> tuple[int, int]:
    major, minor = entry["vllm_version"].split(".")[:2]
    return int(major), int(minor)


def tensors(config: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    """(name, safetensors dtype, shape) of every tensor a Llama-family checkpoint with this config holds (Llama,
    Qwen2 with its q/k/v biases, Granite), quantized as its quantization_config says: compressed-tensors FP8 or
    INT8 per channel, AWQ 4-bit."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // heads
    vocab = config["vocab_size"]
    dense = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[config.get("torch_dtype", "bfloat16")]
    qc = config.get("quantization_config") or {}
    out: list[tuple[str, str, list[int]]] = [("model.embed_tokens.weight", dense, [vocab, h])]

    def linear(name: str, rows: int, cols: int) -> None:
        if qc.get("quant_method") == "awq":
            group = qc["group_size"]
            out.extend([(f"{name}.qweight", "I32", [cols, rows // 8]), (f"{name}.qzeros", "I32", [cols // group, rows // 8]),
                        (f"{name}.scales", "F16", [cols // group, rows])])
        elif qc.get("format") in ("float-quantized", "int-quantized"):
            kind = "F8_E4M3" if qc["format"] == "float-quantized" else "I8"
            out.extend([(f"{name}.weight", kind, [rows, cols]), (f"{name}.weight_scale", "BF16", [rows, 1])])
        else:
            out.append((f"{name}.weight", dense, [rows, cols]))

    for i in range(layers):
        p = f"model.layers.{i}"
        for proj, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
            linear(f"{p}.self_attn.{proj}_proj", rows, h)
            if config["model_type"] == "qwen2":
                out.append((f"{p}.self_attn.{proj}_proj.bias", dense, [rows]))
        linear(f"{p}.self_attn.o_proj", h, heads * hd)
        linear(f"{p}.mlp.gate_proj", inter, h)
        linear(f"{p}.mlp.up_proj", inter, h)
        linear(f"{p}.mlp.down_proj", h, inter)
        out.extend([(f"{p}.input_layernorm.weight", dense, [h]), (f"{p}.post_attention_layernorm.weight", dense, [h])])
    out.append(("model.norm.weight", dense, [h]))
    if not config.get("tie_word_embeddings"):
        out.append(("lm_head.weight", dense, [vocab, h]))
    return out


def tensor_bytes(config: dict[str, Any]) -> int:
    return sum(_BYTES[dtype] * math.prod(shape) for _, dtype, shape in tensors(config))


def write_header_only_checkpoint(config: dict[str, Any], directory: Path) -> Path:
    """A checkpoint directory the planner reads as the real one: config.json and one model.safetensors whose header
    lists every tensor with its real byte range, its data a sparse hole of the right length (no disk used)."""
    directory.mkdir(parents=True, exist_ok=True)
    header: dict[str, Any] = {}
    offset = 0
    for name, dtype, shape in tensors(config):
        size = _BYTES[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path = directory / "model.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)
    (directory / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


# ---------------------------------------------------------------- one entry against the planner


@dataclass(frozen=True)
class Result:
    id: str
    refused: str | None
    """Why the benchmark refused the entry (its config contradicts its log), or None."""
    served: bool
    planned_refused: bool = False
    weights: tuple[float, float] = (0.0, 0.0)
    """(planned, logged) GiB per GPU; the same for the others."""
    activations: tuple[float, float | None] = (0.0, None)
    non_torch: tuple[float, float | None] = (0.0, None)
    kv: tuple[float, float] = (0.0, 0.0)

    @property
    def kv_ratio(self) -> float | None:
        return self.kv[0] / self.kv[1] if self.served and not self.refused and self.kv[1] > 0 else None


def gpu_of(entry: dict[str, Any]) -> GPU:
    """The entry's GPU profile (what the planner plans with), or one with the memory the log reports."""
    g = entry["gpu"]
    if g.get("profile"):
        return planner.gpu(g["profile"])
    return GPU(g["name"], g["total_gib"], 0, "8.9", "pcie", g["name"], "the corpus log")


def ask_of(entry: dict[str, Any], weights: int, shape: ModelShape) -> Ask:
    return Ask(weights, shape, context=entry["max_model_len"], utilization=entry["gpu_memory_utilization"],
               max_num_batched_tokens=entry["max_num_batched_tokens"], max_num_seqs=entry["max_num_seqs"],
               cuda_graphs=version(entry) >= planner.CUDA_GRAPHS_FROM)


def contradictions(entry: dict[str, Any]) -> list[str]:
    """Where the entry's config disagrees with its own log by more than TOLERANCE (weights, KV bytes per token)."""
    shape, logged = shape_of(entry["config"]), entry["logged"]
    tp, pp = entry["tp"], entry["pp"]
    out = []
    per_gpu = tensor_bytes(entry["config"]) / (tp * pp) / GIB
    if abs(per_gpu / logged["weights_gib"] - 1) > TOLERANCE:
        out.append(f"weights: the config makes {per_gpu:.2f} GiB per GPU, the log {logged['weights_gib']:.2f}")
    if logged.get("kv_tokens") and logged["kv_gib"] > 0 and pp == 1:
        per_token = logged["kv_gib"] * GIB / logged["kv_tokens"]
        want = shape.kv_bytes_per_token(tp=tp, pp=pp, kv_dtype=entry["kv_cache_dtype"])
        if abs(per_token / want - 1) > TOLERANCE:
            out.append(f"KV bytes per token: the log's {logged['kv_gib']} GiB / {logged['kv_tokens']:,} tokens is "
                       f"{per_token:,.0f} B, the config's {want:,} B")
    return out


def evaluate(entry: dict[str, Any]) -> Result:
    """The planner's budget for the entry's own layout, next to what vLLM logged."""
    problems = contradictions(entry)
    if problems:
        return Result(entry["id"], "; ".join(problems), entry["served"])
    shape, logged = shape_of(entry["config"]), entry["logged"]
    tp, pp = entry["tp"], entry["pp"]
    ask = ask_of(entry, tensor_bytes(entry["config"]), shape)
    g = gpu_of(entry)
    mem = planner.budget(ask, g, tp, pp)
    act = planner.activation_bytes(shape, tp, entry["max_num_batched_tokens"], entry["max_num_seqs"]) or 0
    one_sequence = shape.kv_bytes_per_sequence(entry["max_model_len"], tp=tp, pp=pp, kv_dtype=entry["kv_cache_dtype"])
    return Result(
        entry["id"], None, entry["served"], planned_refused=mem.kv_pool < one_sequence,
        weights=(mem.weights / GIB, logged["weights_gib"]),
        activations=(act / GIB, logged.get("activation_peak_gib")),
        non_torch=(planner.non_torch_bytes(tp) / GIB, logged.get("non_torch_gib")),
        kv=(mem.kv_pool / GIB, logged["kv_gib"]))


# ---------------------------------------------------------------- fitting the terms


def activation_features(shape: ModelShape, tp: int, tokens: int, seqs: int) -> list[float]:
    """What planner.activation_bytes multiplies by its coefficients, in its order (the fixed part first)."""
    return [1.0, seqs * shape.vocab_size * 4, tokens * shape.hidden_size * 2,
            tokens * math.ceil(shape.intermediate_size / tp) * 2]


def _usable(entry: dict[str, Any]) -> bool:
    return not contradictions(entry) and entry["served"]


def fit_activation(entries: list[dict[str, Any]]) -> list[float]:
    """Least squares of the activation peak on activation_features over the entries vLLM's current profiler logged
    (one pipeline stage only: a first stage runs no sampler), coefficients kept non-negative by dropping a
    feature whose coefficient comes out negative and refitting."""
    rows = [e for e in entries if _usable(e) and version(e) >= ACTIVATION_PROFILER_FROM and e["pp"] == 1
            and e["logged"].get("activation_peak_gib") is not None]
    x = np.array([activation_features(shape_of(e["config"]), e["tp"], e["max_num_batched_tokens"],
                                      e["max_num_seqs"]) for e in rows])
    y = np.array([e["logged"]["activation_peak_gib"] * GIB for e in rows])
    keep = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (coef >= 0).all():
            break
        keep.pop(int(np.argmin(coef)))
    out = [0.0] * x.shape[1]
    for i, c in zip(keep, coef, strict=True):
        out[i] = float(c)
    return out


def fit_non_torch(entries: list[dict[str, Any]]) -> tuple[float, float]:
    """(TP 1, TP ≥ 2) non-torch memory per GPU: the least-squares constant (the mean) of each group."""
    rows = [e for e in entries if _usable(e) and version(e) >= NON_TORCH_FROM and e["pp"] == 1
            and e["logged"].get("non_torch_gib") is not None]
    one = [e["logged"]["non_torch_gib"] * GIB for e in rows if e["tp"] == 1]
    many = [e["logged"]["non_torch_gib"] * GIB for e in rows if e["tp"] > 1]
    return statistics.fmean(one), statistics.fmean(many)


def fit_cuda_graphs(entries: list[dict[str, Any]]) -> tuple[float, float]:
    rows = [e for e in entries if e["logged"].get("cuda_graph_estimate_gib") is not None]
    one = [e["logged"]["cuda_graph_estimate_gib"] * GIB for e in rows if e["tp"] == 1]
    many = [e["logged"]["cuda_graph_estimate_gib"] * GIB for e in rows if e["tp"] > 1]
    return statistics.fmean(one), statistics.fmean(many)


def predict_activation(coef: list[float], entry: dict[str, Any]) -> float:
    feats = activation_features(shape_of(entry["config"]), entry["tp"], entry["max_num_batched_tokens"],
                                entry["max_num_seqs"])
    return float(np.dot(coef, feats))


# ---------------------------------------------------------------- vllm-wizard, side by side

_WIZARD = """
import json, sys
from vllm_wizard.planning.memory import compute_overhead, compute_weights_memory
from vllm_wizard.schemas.inputs import DType, Quantization
out = []
for e in json.load(sys.stdin):
    # what its planner does (planning/planner.py): VRAM of the TP group, weights / TP, its overhead rule
    group = int(e["total_gib"] * 2**30) * e["tp"]
    weights = compute_weights_memory(e["params_b"], DType(e["dtype"]), Quantization(e["quant"])) // e["tp"]
    pool = int(group * e["util"]) - weights - compute_overhead(group, e["tp"])
    out.append(pool / e["tp"])
print(json.dumps(out))
"""


def _params(config: dict[str, Any]) -> float:
    """Parameters in billions, as vllm-wizard takes them (the unquantized model's)."""
    plain = {k: v for k, v in config.items() if k != "quantization_config"}
    return sum(math.prod(shape) for _, _, shape in tensors(plain)) / 1e9


def _wizard_quant(config: dict[str, Any]) -> str:
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") == "awq":
        return "awq"
    return {"float-quantized": "fp8", "int-quantized": "int8"}.get(qc.get("format", ""), "none")


def wizard_kv(python: str, entries: list[dict[str, Any]]) -> list[float]:
    """vllm-wizard's KV pool per GPU (GiB) for each entry, computed by its own functions in its own venv."""
    asks = [{"total_gib": e["gpu"]["total_gib"], "tp": e["tp"] * e["pp"], "util": e["gpu_memory_utilization"],
             "params_b": _params(e["config"]), "quant": _wizard_quant(e["config"]),
             "dtype": {"bfloat16": "bf16", "float16": "fp16"}.get(e["config"].get("torch_dtype", ""), "bf16")}
            for e in entries]
    done = subprocess.run([python, "-c", _WIZARD], input=json.dumps(asks), capture_output=True, text=True,
                          check=True, timeout=120)
    return [x / GIB for x in json.loads(done.stdout)]


# ---------------------------------------------------------------- report


def summary(results: list[Result]) -> dict[str, Any]:
    ratios = [r.kv_ratio for r in results if r.kv_ratio is not None]
    return {
        "entries": len(results),
        "refused_as_contradicting": [r.id for r in results if r.refused],
        "compared": len(ratios),
        "kv_median_ratio": statistics.median(ratios) if ratios else None,
        "kv_worst_ratio": max(ratios, key=lambda x: abs(x - 1)) if ratios else None,
        "kv_within_10_percent": sum(abs(x - 1) <= 0.10 for x in ratios),
        "refused_what_vllm_served": [r.id for r in results if not r.refused and r.served and r.planned_refused],
        "served_what_vllm_refused": [r.id for r in results if not r.refused and not r.served and not r.planned_refused],
    }


def _ratio(pair: tuple[float, float | None]) -> str:
    planned, logged = pair
    return "     —" if not logged else f"{planned / logged:6.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the memory terms and print them")
    parser.add_argument("--json", type=Path, help="write the results and the summary here")
    parser.add_argument("--wizard", metavar="PYTHON", help="a python with vllm-wizard installed: compare it too")
    args = parser.parse_args(argv)
    entries = load_corpus()
    if args.fit:
        act = fit_activation(entries)
        nt, graphs = fit_non_torch(entries), fit_cuda_graphs(entries)
        print("activation (fixed B, per logit, per hidden byte, per MLP byte):", [f"{c:.4g}" for c in act])
        print(f"non-torch TP 1 {nt[0]:.0f} B ({nt[0] / GIB:.3f} GiB), TP >= 2 {nt[1]:.0f} B ({nt[1] / GIB:.3f} GiB)")
        print(f"CUDA graphs TP 1 {graphs[0]:.0f} B, TP >= 2 {graphs[1]:.0f} B")
    results = [evaluate(e) for e in entries]
    print(f"{'entry':34} {'vLLM':9} {'weights':>7} {'activ.':>7} {'non-t.':>7} {'KV plan':>8} {'KV log':>7} {'ratio':>6}")
    for e, r in zip(entries, results, strict=True):
        if r.refused:
            print(f"{r.id:34} {e['vllm_version']:9} refused: {r.refused}")
            continue
        ratio = f"{r.kv_ratio:6.3f}" if r.kv_ratio is not None else ("refused" if r.planned_refused else "  —")
        print(f"{r.id:34} {e['vllm_version']:9} {_ratio(r.weights):>7} {_ratio(r.activations):>7} "
              f"{_ratio(r.non_torch):>7} {r.kv[0]:8.2f} {r.kv[1]:7.2f} {ratio:>6}"
              + ("" if r.served else "  (vLLM refused it" + ("; so does the plan)" if r.planned_refused else ")")))
    s = summary(results)
    print(f"\nKV pool: median ratio {s['kv_median_ratio']:.3f}, worst {s['kv_worst_ratio']:.3f}, "
          f"{s['kv_within_10_percent']} of {s['compared']} within ±10 %; "
          f"refused what vLLM served: {s['refused_what_vllm_served'] or 'none'}; "
          f"served what vLLM refused: {s['served_what_vllm_refused'] or 'none'}; "
          f"entries refused as contradicting their config: {len(s['refused_as_contradicting'])}")
    if args.wizard:
        compared = [(e, r) for e, r in zip(entries, results, strict=True) if r.kv_ratio is not None]
        wizard = [w / r.kv[1] for w, (_, r) in zip(wizard_kv(args.wizard, [e for e, _ in compared]), compared,
                                                   strict=True)]
        ours = [r.kv_ratio for _, r in compared]
        print(f"vllm-wizard 0.2.0 on the same {len(wizard)} entries: KV pool median ratio "
              f"{statistics.median(wizard):.3f}, worst {max(wizard, key=lambda x: abs(x - 1)):.3f}, "
              f"{sum(abs(x - 1) <= 0.10 for x in wizard)} within ±10 % (modelmint: {statistics.median(ours):.3f}, "
              f"{sum(abs(x - 1) <= 0.10 for x in ours)})")
        s["vllm_wizard"] = {"kv_ratios": dict(zip([r.id for _, r in compared], wizard, strict=True)),
                            "kv_median_ratio": statistics.median(wizard)}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": s, "results": [r.__dict__ for r in results]}, indent=2,
                                        default=str) + "\n", encoding="utf-8")
    ok = s["kv_within_10_percent"] >= 0.9 * s["compared"] and not s["refused_what_vllm_served"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
