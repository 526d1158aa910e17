"""Measure compressed-tensors checkpoints against their source on CPU: KL divergence, top-1 agreement, perplexity.

Run by the llmcompressor venv's python through pipelines.core.runner.run, never imported by modelmint:

  llmc_evaluate.py --source DIR --text FILE --ctx 256 --max-chunks 8 --out RESULT.json NAME=DIR [NAME=DIR ...]

The source runs once; its next-token log-probabilities over the text (cut into windows of --ctx tokens) are
kept in memory, then each variant is loaded in turn (transformers + compressed-tensors, decompressed to dense
weights; dynamic activation quantization still applies), run on the same windows and freed. Both run in
float32 so that the comparison measures the quantization, not a difference of compute precision.
Greedy text is recorded for people to read but is not a metric: near-ties flip it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

SAMPLE_PROMPT = "The best way to keep bread fresh is"


def _log(msg: str) -> None:
    print(f"[llmc_evaluate] {msg}", file=sys.stderr, flush=True)


def windows(tokenizer: Any, text: str, ctx: int, max_chunks: int) -> list[list[int]]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    adds_bos = bos is not None and tokenizer("a")["input_ids"][:1] == [bos]
    body = ctx - 1 if adds_bos else ctx
    out = [ids[i * body : (i + 1) * body] for i in range(min(max_chunks, len(ids) // body))]
    if not out:
        raise SystemExit(f"the evaluation text has {len(ids)} tokens, fewer than one window of {body}")
    return [[bos, *w] for w in out] if adds_bos else out


def load(path: str, compressed: bool) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if compressed:
        from transformers import CompressedTensorsConfig

        kwargs["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.eval()
    return model


def log_probs(model: Any, chunks: list[list[int]]) -> list[Any]:
    import torch

    out = []
    with torch.inference_mode():
        for ids in chunks:
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
            out.append(torch.log_softmax(logits, dim=-1))
    return out


def sample(model: Any, tokenizer: Any, new_tokens: int = 16) -> str:
    import torch

    ids = tokenizer(SAMPLE_PROMPT, return_tensors="pt")
    with torch.inference_mode():
        gen = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def compare(ref: list[Any], got: list[Any], chunks: list[list[int]]) -> dict[str, Any]:
    import torch

    kls, agree, nll_ref, nll_got, n = [], 0, 0.0, 0.0, 0
    nonfinite = 0
    for p_log, q_log, ids in zip(ref, got, chunks, strict=True):
        targets = torch.tensor(ids[1:])
        nonfinite += int((~torch.isfinite(q_log)).any(dim=-1).sum())
        kl = (p_log.exp() * (p_log - q_log)).sum(dim=-1)
        kls.append(kl)
        agree += int((p_log.argmax(-1) == q_log.argmax(-1)).sum())
        nll_ref -= float(p_log.gather(-1, targets[:, None]).sum())
        nll_got -= float(q_log.gather(-1, targets[:, None]).sum())
        n += len(targets)
    kl_all = torch.cat(kls)
    ppl_ref, ppl_got = math.exp(nll_ref / n), math.exp(nll_got / n)
    return {
        "mean_kl": float(kl_all.mean()),
        "kl_p99": float(torch.quantile(kl_all, 0.99)),
        "max_kl": float(kl_all.max()),
        "top1_agreement": agree / n,
        "ppl_source": ppl_ref,
        "ppl": ppl_got,
        "ppl_ratio": ppl_got / ppl_ref,
        "tokens": n,
        "nonfinite_positions": nonfinite,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--max-chunks", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-sample", action="store_true", help="skip the greedy text sample")
    ap.add_argument("variants", nargs="+", metavar="NAME=DIR")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.source)
    chunks = windows(tokenizer, Path(args.text).read_text(encoding="utf-8"), args.ctx, args.max_chunks)
    t = time.perf_counter()
    source = load(args.source, compressed=False)
    ref = log_probs(source, chunks)
    source_sample = None if args.no_sample else sample(source, tokenizer)
    del source
    gc.collect()
    result: dict[str, Any] = {
        "ctx": args.ctx,
        "chunks": len(chunks),
        "torch_threads": torch.get_num_threads(),
        "source": {"seconds": round(time.perf_counter() - t, 3), "sample": source_sample},
        "variants": {},
    }
    _log(f"source: {len(chunks)} windows of {args.ctx} tokens in {result['source']['seconds']} s")
    for spec in args.variants:
        name, _, path = spec.partition("=")
        t = time.perf_counter()
        model = load(path, compressed=True)
        got = log_probs(model, chunks)
        metrics = compare(ref, got, chunks)
        metrics["sample"] = None if args.no_sample else sample(model, tokenizer)
        metrics["seconds"] = round(time.perf_counter() - t, 3)
        result["variants"][name] = metrics
        _log(f"{name}: KL {metrics['mean_kl']:.3g}, top-1 {metrics['top1_agreement']:.4f}, "
             f"ppl ratio {metrics['ppl_ratio']:.4f} ({metrics['seconds']} s)")
        del model, got
        gc.collect()
    result["seconds"] = round(time.perf_counter() - t0, 3)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
