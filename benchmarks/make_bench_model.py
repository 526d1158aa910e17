"""Write a Qwen2-shaped bf16 Safetensors model of about 2 GB (random weights) for speed benchmarks."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

# Qwen2 geometry between the 0.5B and 1.5B releases: 983 M parameters, ~1.97 GB in bf16.
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 1536, 8960, 16, 12, 2, 151936
HEAD_DIM = HIDDEN // HEADS
SHARD_BYTES = 1 << 30


def _tensors() -> list[tuple[str, tuple[int, ...]]]:
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", (HIDDEN,)),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN,)),
            (f"{p}.self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
            (f"{p}.self_attn.q_proj.bias", (HIDDEN,)),
            (f"{p}.self_attn.k_proj.weight", (kv, HIDDEN)),
            (f"{p}.self_attn.k_proj.bias", (kv,)),
            (f"{p}.self_attn.v_proj.weight", (kv, HIDDEN)),
            (f"{p}.self_attn.v_proj.bias", (kv,)),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (f"{p}.mlp.gate_proj.weight", (INTER, HIDDEN)),
            (f"{p}.mlp.up_proj.weight", (INTER, HIDDEN)),
            (f"{p}.mlp.down_proj.weight", (HIDDEN, INTER)),
        ]
    out.append(("model.norm.weight", (HIDDEN,)))
    return out


def _bf16(rng: np.random.Generator, shape: tuple[int, ...], name: str) -> bytes:
    if name.endswith("norm.weight"):
        x = np.ones(shape, dtype=np.float32)
    else:
        x = rng.standard_normal(shape, dtype=np.float32) * 0.02
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def _write_shard(path: Path, items: list[tuple[str, tuple[int, ...], bytes]]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, data in items:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for _, _, data in items:
            fh.write(data)


def main(out: Path, tokenizer_from: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shards: list[list[tuple[str, tuple[int, ...], bytes]]] = [[]]
    size = 0
    for name, shape in _tensors():
        data = _bf16(rng, shape, name)
        if size and size + len(data) > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, data))
        size += len(data)
    weight_map = {}
    for i, items in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        _write_shard(out / fname, items)
        weight_map.update({n: fname for n, _, _ in items})
        items.clear()
    total = sum(int(np.prod(s)) * 2 for _, s in _tensors())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    config = json.loads((tokenizer_from / "config.json").read_text())
    config.update(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                  tie_word_embeddings=True, torch_dtype="bfloat16")
    config.pop("head_dim", None)
    # transformers 5 checks layer_types against num_hidden_layers (the tiny model's list is shorter)
    config.update(layer_types=["full_attention"] * LAYERS, max_window_layers=LAYERS)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config", "LICENSE", "vocab", "merges")):
            shutil.copy(f, out / f.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
