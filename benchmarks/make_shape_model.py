"""Write a bf16 Safetensors checkpoint of a real model's shape (random weights) for benchmarks at real sizes.

Run: .venv/bin/python benchmarks/make_shape_model.py SHAPE OUT [--seed N]   (SHAPE: one of SHAPES, e.g. qwen2.5-1.5b)

The config, tensor names and shapes, and the shard layout are those of the hub release the shape names; the
tokenizer is the family's real one, rebuilt from llama.cpp's vocab-only GGUF by pipelines/scripts/make_tiny_model.py
(in the llama.cpp converter venv) and kept in MODELMINT_HOME/bench/tokenizers. Weights are normal with std 0.02 (norms
1.0), so llama-quantize and llama-perplexity run at their real speed; their quality figures mean nothing. The weights
are streamed: each shard's header is written first with computed offsets, then each tensor in chunks of rows from its
own seeded generator, so memory stays near one chunk (not the model, not even the largest tensor) and the bytes are
the same on every run. OUT is written as OUT.partial-PID and renamed when complete.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the modelmint package is the checkout's
    sys.path.insert(0, str(ROOT))

RECORD = "modelmint_shape.json"
"""Written last inside OUT: the shape, seed and generator digest the checkpoint was made from."""
CHUNK_BYTES = 64 << 20
"""float32 bytes generated at a time (the bound on this script's memory beyond numpy itself)."""
STD = 0.02


@dataclass(frozen=True)
class Shape:
    """One hub release's geometry, config and shard layout."""

    family: str
    """make_tiny_model.FAMILIES key: whose tokenizer and generation config."""
    template: str
    """The chat template in llama.cpp's models/templates/."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool
    max_shard_bytes: int | None
    """transformers' max_shard_size the release was saved with; None: one model.safetensors."""
    config: dict[str, Any] = field(default_factory=dict)
    """Every other config.json key, as the release has it."""
    imitates: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every tensor in the order transformers' state dict lists them (the order shards are filled in)."""
        kv = self.kv_heads * self.head_dim
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, self.hidden))]
        for i in range(self.layers):
            p = f"model.layers.{i}"
            attn: list[tuple[str, tuple[int, ...]]] = [(f"{p}.self_attn.q_proj.weight", (self.hidden, self.hidden))]
            attn += [(f"{p}.self_attn.q_proj.bias", (self.hidden,))] if self.qkv_bias else []
            attn += [(f"{p}.self_attn.k_proj.weight", (kv, self.hidden))]
            attn += [(f"{p}.self_attn.k_proj.bias", (kv,))] if self.qkv_bias else []
            attn += [(f"{p}.self_attn.v_proj.weight", (kv, self.hidden))]
            attn += [(f"{p}.self_attn.v_proj.bias", (kv,))] if self.qkv_bias else []
            out += [
                *attn,
                (f"{p}.self_attn.o_proj.weight", (self.hidden, self.hidden)),
                (f"{p}.mlp.gate_proj.weight", (self.intermediate, self.hidden)),
                (f"{p}.mlp.up_proj.weight", (self.intermediate, self.hidden)),
                (f"{p}.mlp.down_proj.weight", (self.hidden, self.intermediate)),
                (f"{p}.input_layernorm.weight", (self.hidden,)),
                (f"{p}.post_attention_layernorm.weight", (self.hidden,)),
            ]
        out.append(("model.norm.weight", (self.hidden,)))
        if not self.tied:
            out.append(("lm_head.weight", (self.vocab, self.hidden)))
        return out

    def parameters(self) -> int:
        return sum(int(np.prod(s)) for _, s in self.tensors())

    def config_json(self) -> dict[str, Any]:
        return {
            **self.config,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied,
            "torch_dtype": "bfloat16",
        }


def _qwen25(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, tied: bool,
            window_layers: int, sliding_window: int, shard: int | None, name: str) -> Shape:
    return Shape(
        family="qwen2", template="Qwen-Qwen2.5-7B-Instruct.jinja", hidden=hidden, intermediate=inter, layers=layers,
        heads=heads, kv_heads=kv, vocab=vocab, tied=tied, qkv_bias=True, max_shard_bytes=shard, imitates=name,
        config={
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "initializer_range": 0.02,
            "max_position_embeddings": 32768, "max_window_layers": window_layers, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "sliding_window": sliding_window, "use_cache": True, "use_sliding_window": False,
            "transformers_version": "4.43.1",
        },
    )


# The Instruct releases' config.json and shard layout (Qwen saved with max_shard_size 4GB, Meta with 5GB).
SHAPES: dict[str, Shape] = {
    "qwen2.5-0.5b": _qwen25(896, 4864, 24, 14, 2, 151936, True, 21, 32768, None, "Qwen/Qwen2.5-0.5B-Instruct"),
    "qwen2.5-1.5b": _qwen25(1536, 8960, 28, 12, 2, 151936, True, 21, 32768, None, "Qwen/Qwen2.5-1.5B-Instruct"),
    "qwen2.5-7b": _qwen25(3584, 18944, 28, 28, 4, 152064, False, 28, 131072, 4_000_000_000,
                          "Qwen/Qwen2.5-7B-Instruct"),
    "llama-3.1-8b": Shape(
        family="llama", template="meta-llama-Llama-3.1-8B-Instruct.jinja", hidden=4096, intermediate=14336,
        layers=32, heads=32, kv_heads=8, vocab=128256, tied=False, qkv_bias=False, max_shard_bytes=5_000_000_000,
        imitates="meta-llama/Llama-3.1-8B-Instruct",
        config={
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
            "head_dim": 128, "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 131072,
            "mlp_bias": False, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "use_cache": True, "transformers_version": "4.43.0.dev0",
        },
    ),
}


def _rng(seed: int, name: str) -> np.random.Generator:
    # one generator per tensor, keyed by its name: a tensor's bytes do not depend on the others or their order
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))


def _write_tensor(fh: Any, name: str, shape: tuple[int, ...], seed: int) -> None:
    if name.endswith("norm.weight"):
        fh.write(np.full(shape, 0x3F80, dtype=np.uint16).tobytes())  # bf16 1.0
        return
    rng = _rng(seed, name)
    row = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    rows_per_chunk = max(1, CHUNK_BYTES // (4 * row))
    total_rows = shape[0] if len(shape) > 1 else 1
    for start in range(0, total_rows, rows_per_chunk):
        n = min(rows_per_chunk, total_rows - start)
        x = rng.standard_normal(n * row, dtype=np.float32)
        x *= STD
        bits = x.view(np.uint32)
        bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even, as torch's bf16 cast does
        bits >>= 16
        fh.write(bits.astype(np.uint16).tobytes())


def _shards(shape: Shape) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Tensors per shard, filled in state-dict order as transformers' shard_checkpoint does."""
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, dims in shape.tensors():
        nbytes = int(np.prod(dims)) * 2
        if shape.max_shard_bytes is not None and shards[-1] and size + nbytes > shape.max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, dims))
        size += nbytes
    return shards


def _write_shard(path: Path, items: list[tuple[str, tuple[int, ...]]], seed: int) -> None:
    # the header first, its offsets computed from the shapes; the data laid out by name, as safetensors' save does
    ordered = sorted(items)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims in ordered:
        n = int(np.prod(dims)) * 2
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, dims in ordered:
            _write_tensor(fh, name, dims, seed)
        if fh.tell() != 8 + len(raw) + offset:
            raise SystemExit(f"{path}: wrote {fh.tell()} bytes, the header declares {8 + len(raw) + offset}")


_TOKENIZER_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from make_tiny_model import FAMILIES, build_tokenizer, check_tokenizer
family, src, template, out = FAMILIES[sys.argv[2]], Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
vocab = src / "models" / f"ggml-vocab-{family.vocab}.gguf"
tok, info = build_tokenizer(family, vocab, (src / "models" / "templates" / template).read_text(encoding="utf-8"))
tok.save_pretrained(out, save_jinja_files=False)
check = check_tokenizer(out, family, vocab)
if not check["chkhsh_matches"] or check["passed"] != check["total"]:
    raise SystemExit("rebuilt tokenizer does not match llama.cpp's: " + json.dumps(check))
(out / "generation_config.json").write_text(json.dumps(family.generation_config, indent=2) + "\\n")
print(json.dumps({**info, "chkhsh": check["chkhsh"], "test_vectors": f"{check['passed']}/{check['total']}"}))
"""


def ensure_tokenizer(shape: Shape) -> Path:
    """The family's tokenizer files (tokenizer.json, tokenizer_config.json with the chat template, ...), built once."""
    from pipelines.core.settings import Settings
    from pipelines.core.toolchains import llama_cpp

    settings = Settings.from_env()
    out = settings.home / "bench" / "tokenizers" / f"{shape.family}-{shape.template.removesuffix('.jinja')}"
    if (out / "tokenizer.json").is_file():
        return out
    llama = llama_cpp(settings)
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        subprocess.run([str(llama.python), "-c", _TOKENIZER_SCRIPT, str(ROOT / "pipelines" / "scripts"),
                        shape.family, str(llama.source), shape.template, str(tmp)], check=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def generator_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def is_complete(out: Path, name: str, seed: int) -> bool:
    """Whether OUT already holds this shape's checkpoint from this generator and seed."""
    try:
        record = json.loads((out / RECORD).read_text())
    except (OSError, ValueError):
        return False
    return bool(record.get("shape") == name and record.get("seed") == seed
                and record.get("generator_sha256") == generator_digest())


def generate(name: str, out: Path, seed: int = 0) -> dict[str, Any]:
    """Write shape `name` into `out` (atomically) and return its record."""
    shape = SHAPES[name]
    started = time.perf_counter()
    tokenizer = ensure_tokenizer(shape)
    if out.exists():
        raise SystemExit(f"{out} already exists; remove it or choose another OUT")
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        shards = _shards(shape)
        total = sum(int(np.prod(d)) * 2 for _, d in shape.tensors())
        if shape.max_shard_bytes is None or len(shards) == 1:
            _write_shard(tmp / "model.safetensors", shards[0], seed)
            files = ["model.safetensors"]
        else:
            weight_map: dict[str, str] = {}
            files = []
            for i, items in enumerate(shards, 1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                _write_shard(tmp / fname, items, seed)
                weight_map.update({n: fname for n, _ in items})
                files.append(fname)
            (tmp / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                           indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(shape.config_json(), indent=2, sort_keys=True) + "\n")
        for f in tokenizer.iterdir():
            shutil.copy(f, tmp / f.name)
        record = {
            "generator": "modelmint benchmarks/make_shape_model.py", "generator_sha256": generator_digest(),
            "shape": name, "imitates": shape.imitates, "seed": seed, "parameters": shape.parameters(),
            "bytes": total, "files": files, "weights": f"normal(0, {STD}) in bf16, norms 1.0: random, not a model",
            "seconds": round(time.perf_counter() - started, 1),
        }
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps(generate(args.shape, args.out, args.seed), indent=2))


if __name__ == "__main__":
    main()
