"""Rebuild a Hugging Face model directory (bf16 Safetensors, tokenizer.json, chat template) from a GGUF.

Run by the llama.cpp converter venv's python (transformers 4.57, torch, gguf-py from the pinned tree) through
pipelines.core.runner.run, never imported by modelmint:

    gguf_to_hf.py --gguf MODEL.gguf --out DIR --tokenizer smollm --result RESULT.json

Weights: transformers' GGUF loader dequantizes every tensor (and undoes llama.cpp's Q/K row permutation) into
the architecture's model class; saved as bf16 Safetensors. Nothing is unpickled. Tokenizer: transformers'
own GGUF tokenizer export is not usable for a BPE vocabulary (it writes the GGUF itself as tokenizer.model,
with the wrong pre-tokenizer), so tokenizer.json is rebuilt from the GGUF's tokens and merges with the
pre-tokenizer named by --tokenizer, its control tokens as special tokens; the chat template, bos and eos
come from the GGUF's metadata.

The converter venv is used because its transformers is the one convert_hf_to_gguf.py reads config.json with:
a config saved by transformers 5 keeps rope_theta under rope_parameters, where transformers 4 does not look
(it would fall back to 10000), and the llmcompressor venv has no gguf package.

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
    """bf16 Safetensors and config.json from the GGUF's (dequantized) tensors.

    The steps of transformers' own from_pretrained(gguf_file=...): the config from the GGUF's metadata, the tensor
    names mapped on a model built on the meta device, every tensor dequantized and un-permuted by
    load_gguf_checkpoint. from_pretrained itself refuses a GGUF unless accelerate is installed, which this venv
    (the llama.cpp converter's) has no other use for; none of these steps uses it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    with torch.device("meta"):
        names = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=names)["tensors"]
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise KnownFailure("weights", f"the GGUF's tensors do not fill the {type(model).__name__}: missing "
                           f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}")
    model.tie_weights()
    model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    config_json = json.loads((out / "config.json").read_text(encoding="utf-8"))
    return {"params": model.num_parameters(), "tensors": len(tensors), "architectures": config_json.get("architectures"),
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
    versions = {name: md.version(name) for name in ("torch", "transformers", "tokenizers", "gguf")}
    result = {"ok": True, "tokenizer": tokenizer, "weights": weights, "timings": timings, "versions": versions}
    args.result.write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
