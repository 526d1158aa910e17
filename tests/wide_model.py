"""A random-weight Llama-shaped model with SmolLM2-135M's widths (hidden 576), written with numpy: shape fixtures."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def _bf16(a: np.ndarray) -> bytes:
    bits = a.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return rounded.astype(np.uint16).tobytes()


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, arr in tensors.items():
        data = _bf16(arr)
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for b in blobs:
            fh.write(b)


def write_wide_model(
    dst: Path,
    *,
    tokenizer_from: Path | None = None,
    hidden: int = 576,
    intermediate: int = 1536,
    layers: int = 2,
    heads: int = 9,
    kv_heads: int = 3,
    vocab: int | None = None,
    seed: int = 0,
) -> Path:
    """A LlamaForCausalLM directory (tied embeddings, as SmolLM2) with random bf16 weights.

    With `tokenizer_from` (a generated tiny-llama) its tokenizer files are copied and its vocabulary size used,
    so that the GGUF converter and transformers accept the model; without it, only the shapes are meaningful.
    """
    dst.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is not None:
        vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
        for name in TOKENIZER_FILES:
            if (tokenizer_from / name).is_file():
                shutil.copy(tokenizer_from / name, dst / name)
    vocab = vocab or 1024
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    tensors = {"model.embed_tokens.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": w(intermediate, hidden),
            p + "mlp.up_proj.weight": w(intermediate, hidden),
            p + "mlp.down_proj.weight": w(hidden, intermediate),
            p + "input_layernorm.weight": np.ones(hidden, dtype=np.float32),
            p + "post_attention_layernorm.weight": np.ones(hidden, dtype=np.float32),
        })
    tensors["model.norm.weight"] = np.ones(hidden, dtype=np.float32)
    write_safetensors(dst / "model.safetensors", tensors)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "hidden_act": "silu",
        "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }
    if tokenizer_from is not None:
        src = json.loads((tokenizer_from / "config.json").read_text())
        config.update({k: src[k] for k in ("bos_token_id", "eos_token_id") if k in src})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst
