"""Rebuild a Hugging Face model directory (bf16 Safetensors, tokenizer.json, chat template) from a GGUF.

Run by the llmcompressor venv's python (transformers 5 + accelerate + torch; gguf-py from the pinned llama.cpp
tree on PYTHONPATH) through pipelines.runner.run, never imported by modelmint:

    gguf_to_hf.py --gguf MODEL.gguf --out DIR --tokenizer smollm --result RESULT.json

Weights: transformers' GGUF loader dequantizes every tensor (and undoes llama.cpp's Q/K row permutation) into
the architecture's model class; saved as bf16 Safetensors. Nothing is unpickled. Tokenizer: transformers'
own GGUF tokenizer export is not usable for a BPE vocabulary (it writes the GGUF itself as tokenizer.model,
with the wrong pre-tokenizer), so tokenizer.json is rebuilt from the GGUF's tokens and merges with the
pre-tokenizer named by --tokenizer, its control tokens as special tokens; the chat template, bos and eos
come from the GGUF's metadata.

config.json is written so that transformers 4 (the llama.cpp converter's) reads the same model: transformers 5
keeps rope_theta under rope_parameters, where transformers 4 does not look (it would fall back to 10000).

A failure modelmint knows how to explain is written to the result as {"ok": false, "error": {"kind",
"message"}} with exit code 3; anything else is a crash with a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import sys
import time
from pathlib import Path
from typing import Any

EXIT_KNOWN_FAILURE = 3
_CONTROL = 3
"""llama.cpp's token type for control tokens (gguf.TokenType.CONTROL): special tokens in tokenizer.json."""


class KnownFailure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _log(msg: str) -> None:
    print(f"[gguf_to_hf] {msg}", file=sys.stderr, flush=True)


def _pre_tokenizers() -> dict[str, Any]:
    """Each known pre-tokenizer by the name a catalog's `source.tokenizer` gives: (pre_tokenizer, decoder,
    post_processor) as the original tokenizer.json of that family has them."""
    from tokenizers import decoders, pre_tokenizers, processors

    return {
        # SmolLM / SmolLM2 (llama.cpp's pre-tokenizer 'smollm'): each digit its own piece, then GPT-2 byte level
        # without a prefix space
        "smollm": (
            pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]),
            decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True),
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        ),
    }


def _field(fields: Any, key: str) -> Any:
    if key not in fields:
        raise KnownFailure("metadata", f"the GGUF has no {key}")
    return fields[key].contents()


def rebuild_tokenizer(gguf_path: Path, out: Path, kind: str) -> dict[str, Any]:
    """tokenizer.json and tokenizer_config.json from the GGUF's vocabulary, merges and metadata."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import BPE

    known = _pre_tokenizers()
    if kind not in known:
        raise KnownFailure("tokenizer", f"no pre-tokenizer named {kind!r} (known: {', '.join(sorted(known))})")
    fields = GGUFReader(str(gguf_path)).fields
    model = _field(fields, "tokenizer.ggml.model")
    if model != "gpt2":
        raise KnownFailure("tokenizer", f"tokenizer.ggml.model is {model!r}: only BPE ('gpt2') vocabularies are "
                           "rebuilt")
    tokens: list[str] = _field(fields, "tokenizer.ggml.tokens")
    types: list[int] = _field(fields, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(fields, "tokenizer.ggml.merges")]
    tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer, tok.decoder, tok.post_processor = known[kind]
    special = [t for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.save(str(out / "tokenizer.json"))
    bos = tokens[_field(fields, "tokenizer.ggml.bos_token_id")]
    eos = tokens[_field(fields, "tokenizer.ggml.eos_token_id")]
    template = _field(fields, "tokenizer.chat_template")
    context = f"{_field(fields, 'general.architecture')}.context_length"
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": tokens[0],
        "pad_token": eos,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_field(fields, context)),
        "additional_special_tokens": [t for t in special if t != tokens[0]],
        "chat_template": template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    return {"tokens": len(tokens), "merges": len(merges), "special": len(special), "bos": bos, "eos": eos,
            "pre_tokenizer": kind}


def rebuild_weights(gguf_path: Path, out: Path) -> dict[str, Any]:
    """bf16 Safetensors and config.json from the GGUF's (dequantized) tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    path = out / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        # transformers 4 reads rope_theta at the top level only
        config["rope_theta"] = rope["rope_theta"]
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return {"params": model.num_parameters(), "architectures": config.get("architectures"),
            "dtype": str(next(model.parameters()).dtype)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    try:
        start = time.perf_counter()
        tokenizer = rebuild_tokenizer(args.gguf, args.out, args.tokenizer)
        timings["tokenizer_s"] = round(time.perf_counter() - start, 3)
        start = time.perf_counter()
        weights = rebuild_weights(args.gguf, args.out)
        timings["weights_s"] = round(time.perf_counter() - start, 3)
    except KnownFailure as err:
        args.result.write_text(json.dumps({"ok": False, "error": {"kind": err.kind, "message": str(err)}}))
        _log(f"{err.kind}: {err}")
        return EXIT_KNOWN_FAILURE
    versions = {name: md.version(name) for name in ("torch", "transformers", "accelerate", "tokenizers")}
    versions["gguf"] = md.version("gguf") if _installed("gguf") else "llama.cpp tree (PYTHONPATH)"
    result = {"ok": True, "tokenizer": tokenizer, "weights": weights, "timings": timings, "versions": versions}
    args.result.write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0


def _installed(name: str) -> bool:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
