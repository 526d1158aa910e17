"""Generate a tiny, briefly trained Qwen2 or Llama model with a real tokenizer and chat template.

Runs with the llama.cpp converter venv's python (torch, transformers 4.57, tokenizers, gguf-py); modelmint
itself never imports it. Two commands:

  generate         rebuild the tokenizer from llama.cpp's vocab-only GGUF, build and briefly train the model,
                   write a Hugging Face directory (bf16 safetensors) atomically.
  check-tokenizer  load a saved tokenizer as convert_hf_to_gguf.py does and print, as JSON, its pre-tokenizer
                   hash and how it fares on the vocab's .inp/.out test vectors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

# The converter's pre-tokenizer probe, verbatim from conversion/base.py:get_vocab_base_pre(); the sha256 of
# str(tokenizer.encode(_CHKTXT)) is how it recognises a tokenizer.
_CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ "
    "🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? "
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
_TEST_SEPARATOR = "\n__ggml_vocab_test__\n"

# gguf.TokenType values
_NORMAL, _USER_DEFINED = 1, 4


@dataclass(frozen=True)
class Family:
    """Everything one model family needs: where its vocab and template live, its tokenizer, its shape."""

    vocab: str
    """models/ggml-vocab-<vocab>.gguf in the llama.cpp tree; its tokenizer.ggml.pre is this name too."""
    chkhsh: str
    """The converter's hash for this pre-tokenizer (conversion/base.py), i.e. what it must recognise."""
    pre_regex: str
    """The Split regex of the upstream tokenizer.json (also quoted in llama.cpp's src/llama-vocab.cpp)."""
    template: str
    specials: dict[int, tuple[str, bool]]
    """Every added token of the instruct model: id -> (content, special). Ids must follow the BPE vocab."""
    bos: str | None
    eos: str
    pad: str | None
    pipeline: Callable[[Any, Family, int | None], None]
    """Sets normalizer, pre-tokenizer, post-processor and decoder on a `tokenizers.Tokenizer`."""
    tokenizer_config: dict[str, Any]
    model_config: dict[str, Any]
    generation_config: dict[str, Any]
    upstream: str
    """The instruct model this one imitates, for the model card."""
    additional_special_tokens: list[str] = field(default_factory=list)
    ignore_merges: bool = False
    """BPE option: a word found whole in the vocab is not merged (Llama 3 sets it)."""


def _qwen2_pipeline(tok: Any, family: Family, bos_id: int | None) -> None:
    # As in Qwen2.5's tokenizer.json: NFC, regex split, byte-level without prefix space, no BOS.
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(family.pre_regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)


def _llama3_pipeline(tok: Any, family: Family, bos_id: int | None) -> None:
    # As in Llama 3.x's tokenizer.json: no normalizer, BOS added by a template post-processor.
    from tokenizers import Regex, decoders, pre_tokenizers, processors

    bos = family.bos
    if bos is None or bos_id is None:
        raise GenerationFailed("the Llama 3 tokenizer needs a BOS token")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(family.pre_regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
        ),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)


_QWEN25_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
_QWEN25_PLAIN = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip

QWEN2 = Family(
    vocab="qwen2",
    chkhsh="e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea",
    pre_regex=r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+",
    template="Qwen-Qwen2.5-7B-Instruct.jinja",
    # The vocab GGUF is Qwen1.5's (3 added tokens, 290 [PAD] slots); Qwen2.5 uses the same BPE vocab and
    # merges and fills the first 22 slots: the 8 after <|video_pad|> are added but not special.
    specials={
        151643 + i: (content, i < len(_QWEN25_SPECIALS))
        for i, content in enumerate(_QWEN25_SPECIALS + _QWEN25_PLAIN)
    },
    bos=None,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    additional_special_tokens=_QWEN25_SPECIALS[1:],
    pipeline=_qwen2_pipeline,
    tokenizer_config={
        "errors": "replace", "split_special_tokens": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    },
    model_config={
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 4,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    generation_config={
        "bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": True,
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
    },
    upstream="Qwen/Qwen2.5-0.5B-Instruct",
)

# The vocab GGUF is Meta-Llama-3-8B's. Llama 3.1 and 3.2 keep its BPE vocab and merges, but three of its
# reserved special tokens got names (<|finetune_right_pad_id|>, <|eom_id|>, <|python_tag|>) and the other
# reserved ones were renumbered (<|reserved_special_token_3|> is id 128011).
_LLAMA31_NAMED = {
    128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128002: "<|reserved_special_token_0|>",
    128003: "<|reserved_special_token_1|>", 128004: "<|finetune_right_pad_id|>",
    128005: "<|reserved_special_token_2|>", 128006: "<|start_header_id|>", 128007: "<|end_header_id|>",
    128008: "<|eom_id|>", 128009: "<|eot_id|>", 128010: "<|python_tag|>",
}  # fmt: skip

LLAMA = Family(
    vocab="llama-bpe",
    chkhsh="0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5",
    pre_regex=r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+",
    template="meta-llama-Llama-3.2-3B-Instruct.jinja",
    specials={
        **{i: (content, True) for i, content in _LLAMA31_NAMED.items()},
        **{128011 + k: (f"<|reserved_special_token_{3 + k}|>", True) for k in range(245)},
    },
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    pad=None,
    pipeline=_llama3_pipeline,
    ignore_merges=True,
    tokenizer_config={"clean_up_tokenization_spaces": True, "model_max_length": 131072,
                      "model_input_names": ["input_ids", "attention_mask"]},
    model_config={
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rms_norm_eps": 1e-5,
        # Llama 3.2 1B/3B tie their embeddings; untied here so that the fixtures cover a separate output
        # matrix (llama-quantize treats output.weight specially), while tiny-qwen2 covers the tied case.
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    },
    generation_config={
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "do_sample": True,
        "temperature": 0.6, "top_p": 0.9,
    },
    upstream="meta-llama/Llama-3.2-1B-Instruct",
)

FAMILIES: dict[str, Family] = {"qwen2": QWEN2, "llama": LLAMA}

# Shared by both families: small, but every matrix row a multiple of 256 so llama.cpp's k-quants apply.
SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "use_cache": True,
}

_LICENSE = """\
The weights in this directory were generated and trained by modelmint (make_tiny_model.py).

Licensed under the Apache License, Version 2.0 (the "License"); you may not use these files except in
compliance with the License. You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software distributed under the License is
distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and limitations under the License.

The tokenizer vocabulary, merges and chat template are not covered by this notice: see README.md.
"""


_RECIPE_ARGS = ("seed", "train_steps", "seq_len", "batch_size", "lr", "threads")


class GenerationFailed(Exception):
    """A check inside the generator failed; the message says which."""


# ---------------------------------------------------------------- tokenizer


# GGUF value types: struct formats of the scalar ones; 8 is a string, 9 an array
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """The key-value section of a GGUF file (version 3).

    gguf-py's GGUFReader maps every array item into its own numpy view: 5-15 s for a 150k-token vocab with
    as many merges, twice per generation. Reading the values straight from the bytes takes under a second.
    """
    data = path.read_bytes()
    if data[:4] != b"GGUF" or len(data) < 24:
        raise GenerationFailed(f"{path} is not a GGUF file")
    version, _tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version != 3:
        raise GenerationFailed(f"{path}: GGUF version {version}, expected 3")
    pos = 24

    def string() -> str:
        nonlocal pos
        (size,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + size
        return data[pos - size : pos].decode("utf-8")

    def scalars(kind: int, count: int) -> list[Any]:
        nonlocal pos
        fmt = _GGUF_SCALARS[kind]
        end = pos + struct.calcsize(fmt) * count
        values = [v for (v,) in struct.iter_unpack(fmt, data[pos:end])]
        pos = end
        return values

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == _GGUF_STRING:
            return string()
        if kind != _GGUF_ARRAY:
            return scalars(kind, 1)[0]
        item, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        return [string() for _ in range(count)] if item == _GGUF_STRING else scalars(item, count)

    meta: dict[str, Any] = {}
    try:
        for _ in range(n_kv):
            key = string()
            (kind,) = struct.unpack_from("<I", data, pos)
            pos += 4
            meta[key] = value(kind)
    except (KeyError, struct.error, UnicodeDecodeError) as err:
        raise GenerationFailed(f"{path}: unreadable GGUF metadata ({err!r})") from err
    return meta


def _read_vocab(path: Path) -> tuple[list[str], list[int], list[str], str, str]:
    meta = read_gguf_metadata(path)
    keys = ("tokens", "token_type", "merges", "pre", "model")
    missing = [k for k in keys if f"tokenizer.ggml.{k}" not in meta]
    if missing:
        raise GenerationFailed(f"{path} has no tokenizer.ggml.{missing[0]}: not a llama.cpp vocab file")
    tokens, types, merges, pre, model = (meta[f"tokenizer.ggml.{k}"] for k in keys)
    return tokens, types, merges, pre, model


def build_tokenizer(family: Family, vocab_path: Path, template: str) -> tuple[Any, dict[str, Any]]:
    """A transformers fast tokenizer equal to the instruct model's, from llama.cpp's vocab-only GGUF."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    tokens, types, merges, pre, model = _read_vocab(vocab_path)
    if model != "gpt2" or pre != family.vocab:
        raise GenerationFailed(f"{vocab_path}: expected a gpt2/{family.vocab} vocab, found {model}/{pre}")
    vocab: dict[str, int] = {}
    renamed: dict[int, list[str]] = {}
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == _NORMAL:
            if i in family.specials:
                raise GenerationFailed(f"id {i} ({token!r}) is a normal token in the vocab, not an added one")
            vocab[token] = i
        elif i in family.specials:
            if family.specials[i][0] != token:
                renamed[i] = [token, family.specials[i][0]]
        elif not (kind == _USER_DEFINED and token == f"[PAD{i}]"):
            raise GenerationFailed(f"{vocab_path}: unexpected added token {i} {token!r} (type {kind})")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise GenerationFailed(f"{vocab_path}: the normal tokens do not form ids 0..{len(vocab) - 1}")

    bpe = BPE(
        vocab=vocab,
        merges=[tuple(m.split(" ", 1)) for m in merges],
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=family.ignore_merges,
    )
    tok = Tokenizer(bpe)
    # Added tokens get the next free id in order, which is how they keep their upstream ids.
    for i in sorted(family.specials):
        content, special = family.specials[i]
        added = AddedToken(content, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
        if tok.token_to_id(content) != i:
            raise GenerationFailed(f"{content!r} landed on id {tok.token_to_id(content)}, not {i}")
    bos_id = tok.token_to_id(family.bos) if family.bos else None
    family.pipeline(tok, family, bos_id)

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.pad,
        additional_special_tokens=family.additional_special_tokens or None,
        **family.tokenizer_config,
    )
    hf.chat_template = template
    info = {
        "vocab_size": len(tokens),
        "added_tokens": len(family.specials),
        "changed_vs_vocab_gguf": len(renamed),
        "changed_to_named_tokens": {
            str(i): names for i, names in sorted(renamed.items()) if "reserved" not in names[1]
        },
    }
    return hf, info


def check_tokenizer(model_dir: Path, family: Family, vocab_path: Path) -> dict[str, Any]:
    """Load the saved tokenizer the way the converter does; hash it and run llama.cpp's test vectors."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    chkhsh = sha256(str(tok.encode(_CHKTXT)).encode()).hexdigest()
    texts = vocab_path.with_name(vocab_path.name + ".inp").read_text(encoding="utf-8").split(_TEST_SEPARATOR)
    if texts[-1] != "":
        raise GenerationFailed(f"{vocab_path}.inp does not end with a test separator")
    texts = texts[:-1]
    lines = vocab_path.with_name(vocab_path.name + ".out").read_text(encoding="utf-8").split("\n")
    if len(lines) < len(texts):
        raise GenerationFailed(f"{vocab_path}.out has {len(lines)} lines for {len(texts)} test texts")
    failures = []
    for text, line in zip(texts, lines, strict=False):
        expected = [int(x) for x in line.split()]
        got = tok.encode(text, add_special_tokens=False)
        if got != expected:
            failures.append({"text": text[:60], "expected": expected[:16], "got": got[:16]})
    return {
        "chkhsh": chkhsh,
        "chkhsh_matches": chkhsh == family.chkhsh,
        "passed": len(texts) - len(failures),
        "total": len(texts),
        "failures": failures[:5],
    }


# ---------------------------------------------------------------- model
#
# With a 128k-152k vocabulary the output matrix dominates: a full-softmax step costs over 10x a step of the
# rest of the model. So training runs on a compact copy holding only the rows of tokens that occur in the
# training text (~1,800). The other rows keep their random initialisation plus one fitted offset, so that
# together they carry the Good-Turing estimate of the chance that the next token is one never seen in
# training (tokens seen once / all tokens), which is what a full softmax would teach them first.


def _windows(stream: Any, starts: Any, length: int, prefix: list[int]) -> Any:
    import torch

    body = length - len(prefix)
    head = torch.tensor(prefix, dtype=torch.long)
    return torch.stack([torch.cat([head, stream[s : s + body]]) for s in starts.tolist()])


def heldout_loss(model: Any, stream: Any, seq_len: int, prefix: list[int], batch: int = 4) -> float:
    """Mean next-token loss over consecutive windows of `stream`."""
    import torch

    body = seq_len - len(prefix)
    starts = torch.arange(0, len(stream) - body + 1, body)
    total = 0.0
    model.eval()
    with torch.no_grad():
        for chunk in starts.split(batch):
            x = _windows(stream, chunk, seq_len, prefix)
            total += model(input_ids=x, labels=x).loss.item() * len(chunk)
    return total / len(starts)


def _rows_copy(src: Any, dst: Any, rows: Any, *, into_full: bool) -> None:
    """Copy every weight from `src` to `dst`; vocabulary matrices only on `rows` of the full model."""
    import torch

    dst_state = dst.state_dict()
    with torch.no_grad():
        for name, tensor in src.state_dict().items():
            target = dst_state[name]
            if target.shape == tensor.shape:
                target.copy_(tensor)
            elif into_full:
                target[rows] = tensor
            else:
                target.copy_(tensor[rows])


def train_compact(model: Any, config: Any, active: Any, train_ids: Any, prefix: list[int],
                  args: argparse.Namespace) -> list[float]:
    """Train `model` on `train_ids`, updating only the vocabulary rows in `active`; returns step losses."""
    import torch
    from transformers import AutoModelForCausalLM

    compact_config = config.__class__(**{**config.to_dict(), "vocab_size": len(active)})
    compact = AutoModelForCausalLM.from_config(compact_config)
    _rows_copy(model, compact, active, into_full=False)
    remap = torch.full((config.vocab_size,), -1, dtype=torch.long)
    remap[active] = torch.arange(len(active))
    stream, head = remap[train_ids], remap[torch.tensor(prefix, dtype=torch.long)].tolist()

    gen = torch.Generator().manual_seed(args.seed)
    optim = torch.optim.AdamW(compact.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, args.train_steps // 10)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, args.train_steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_factor)
    body = args.seq_len - len(prefix)
    losses = []
    compact.train()
    for _ in range(args.train_steps):
        starts = torch.randint(0, len(stream) - body, (args.batch_size,), generator=gen)
        x = _windows(stream, starts, args.seq_len, head)
        loss = compact(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(compact.parameters(), 1.0)
        optim.step()
        sched.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.item())
    _rows_copy(compact, model, active, into_full=True)
    return losses


def place_unseen_rows(
    model: Any, active: Any, train_ids: Any, prefix: list[int], args: argparse.Namespace
) -> float:
    """Give the never-trained output rows, together, the Good-Turing unseen mass; returns that mass.

    All those rows get one shared offset, fitted by ridge regression on the final hidden states h of training
    windows so that, position by position, logit(P(unseen | h)) comes as close to logit(unseen mass) as a
    linear function of h can.
    """
    import torch

    counts = torch.bincount(train_ids)
    unseen_mass = (counts == 1).sum().item() / len(train_ids)
    gen = torch.Generator().manual_seed(args.seed + 1)
    body = args.seq_len - len(prefix)
    starts = torch.randint(0, len(train_ids) - body, (16,), generator=gen)
    x = _windows(train_ids, starts, args.seq_len, prefix)
    weight = model.get_output_embeddings().weight
    inactive = torch.ones(weight.shape[0], dtype=torch.bool)
    inactive[active] = False
    model.eval()
    with torch.no_grad():
        hidden = model.model(input_ids=x).last_hidden_state.reshape(-1, weight.shape[1])
        gaps = []
        for part in hidden.split(args.seq_len):  # one window at a time: a vocabulary-wide row each is 600 KB
            logits = part @ weight.T
            unseen, seen = logits[:, inactive], logits[:, active]
            gaps.append(torch.logsumexp(unseen, dim=-1) - torch.logsumexp(seen, dim=-1))
        gap = torch.cat(gaps)
        target = torch.logit(torch.tensor(unseen_mass)) - gap
        ridge = 1e-3 * len(hidden) * torch.eye(hidden.shape[1])
        offset = torch.linalg.solve(hidden.T @ hidden + ridge, hidden.T @ target)
        weight[inactive] += offset  # tied models move their input rows too: one shared "unknown" direction
    return unseen_mass


def generate(args: argparse.Namespace) -> None:
    import tokenizers
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    started = time.perf_counter()
    family = FAMILIES[args.family]
    src = Path(args.llama_cpp_src)
    vocab_path = src / "models" / f"ggml-vocab-{family.vocab}.gguf"
    template_path = src / "models" / "templates" / family.template
    for p in (vocab_path, template_path):
        if not p.is_file():
            raise GenerationFailed(f"{p} is missing: --llama-cpp-src must be the pinned llama.cpp tree")
    final = Path(args.out)
    if final.exists():
        raise GenerationFailed(f"{final} already exists; remove it or choose another --out")
    tmp = final.with_name(f"{final.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        torch.manual_seed(args.seed)
        torch.set_num_threads(args.threads)
        torch.use_deterministic_algorithms(True)

        template = template_path.read_text(encoding="utf-8")
        tokenizer, tok_info = build_tokenizer(family, vocab_path, template)
        # save_jinja_files=False: the template goes into tokenizer_config.json, as in the upstream repos.
        tokenizer.save_pretrained(tmp, save_jinja_files=False)
        check = check_tokenizer(tmp, family, vocab_path)
        if not check["chkhsh_matches"] or check["passed"] != check["total"]:
            raise GenerationFailed(f"rebuilt tokenizer does not match llama.cpp's: {json.dumps(check)}")
        tok_info.update(chkhsh=check["chkhsh"], test_vectors=f"{check['passed']}/{check['total']}")

        config = AutoConfig.for_model(**family.model_config, **SHAPE)
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        train_text = Path(args.train_text).read_text(encoding="utf-8")
        eval_text = Path(args.eval_text).read_text(encoding="utf-8")
        train_ids = torch.tensor(tokenizer.encode(train_text, add_special_tokens=False))
        eval_ids = torch.tensor(tokenizer.encode(eval_text, add_special_tokens=False))
        # Llama sees BOS at the start of every sequence (as llama-perplexity feeds it); Qwen never does.
        prefix = [tokenizer.bos_token_id] if family.bos else []
        active = torch.tensor(sorted(set(train_ids.tolist()) | set(prefix)))

        loss_init = heldout_loss(model, eval_ids, args.seq_len, prefix)
        print(f"held-out loss at init: {loss_init:.3f}", flush=True)
        t0 = time.perf_counter()
        losses = train_compact(model, config, active, train_ids, prefix, args)
        unseen_mass = place_unseen_rows(model, active, train_ids, prefix, args)
        train_s = time.perf_counter() - t0
        loss_final = heldout_loss(model, eval_ids, args.seq_len, prefix)
        print(f"held-out loss after {args.train_steps} steps ({train_s:.0f} s): {loss_final:.3f}", flush=True)
        if not loss_final < loss_init - 2.0:
            raise GenerationFailed(f"training did not help: held-out loss {loss_init:.3f} → {loss_final:.3f}")

        model = model.to(torch.bfloat16)
        model.generation_config = GenerationConfig(**family.generation_config)
        model.save_pretrained(tmp, safe_serialization=True)

        meta = {
            "generator": "modelmint pipelines/scripts/make_tiny_model.py",
            "name": args.name,
            "recipe_hash": args.recipe_hash,
            "family": args.family,
            "imitates": family.upstream,
            "recipe": {k: getattr(args, k) for k in _RECIPE_ARGS},
            "shape": SHAPE,
            "parameters": sum(p.numel() for p in model.parameters()),
            "tokenizer": {
                "vocab_gguf": f"llama.cpp/models/{vocab_path.name}",
                "vocab_gguf_sha256": _sha256(vocab_path),
                "pre": family.vocab,
                **tok_info,
            },
            "chat_template": {"source": f"llama.cpp/models/templates/{family.template}",
                              "sha256": sha256(template.encode()).hexdigest()},
            "training": {
                "train_text_sha256": sha256(train_text.encode()).hexdigest(),
                "train_tokens": len(train_ids),
                "trained_vocab_rows": len(active),
                "unseen_token_mass": round(unseen_mass, 4),
                "heldout_text_sha256": sha256(eval_text.encode()).hexdigest(),
                "heldout_tokens": len(eval_ids),
                "heldout_loss_init": round(loss_init, 4),
                "heldout_loss_final": round(loss_final, 4),
                "train_loss_last10": round(sum(losses[-10:]) / len(losses[-10:]), 4),
            },
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "tokenizers": tokenizers.__version__},
        }
        (tmp / "modelmint_tiny.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        (tmp / "LICENSE").write_text(_LICENSE, encoding="utf-8")
        (tmp / "README.md").write_text(_model_card(family, meta), encoding="utf-8")
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {final} in {time.perf_counter() - started:.0f} s", flush=True)


def _sha256(path: Path) -> str:
    h = sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _model_card(family: Family, meta: dict[str, Any]) -> str:
    t, shape = meta["training"], meta["shape"]
    name = meta["name"] or f"tiny-{meta['family']}"
    return f"""---
license: apache-2.0
tags: [modelmint, tiny, test-fixture]
---
# {name}

A {meta["parameters"] / 1e6:.1f} M-parameter `{family.model_config["architectures"][0]}`
generated by modelmint for demos and tests.
It has the tokenizer, chat template, special tokens, rope settings and generation defaults of
[{family.upstream}](https://huggingface.co/{family.upstream}),
but only {shape["num_hidden_layers"]} layers of width {shape["hidden_size"]}.
It was trained for {meta["recipe"]["train_steps"]} steps on about 30 KB of English prose:
held-out loss {t["heldout_loss_init"]:.2f} at initialisation, {t["heldout_loss_final"]:.2f} after training.
It knows nothing useful; use it only to test tools.

## Licence and provenance

- Weights: generated by modelmint; Apache-2.0, see `LICENSE`.
- Tokenizer: rebuilt from `{meta["tokenizer"]["vocab_gguf"]}`;
  chat template copied from `{meta["chat_template"]["source"]}`.
  Both come from llama.cpp's source tree (MIT licence), where they ship as test fixtures;
  they originate from the model family named above, whose own terms may also apply to them.
- Training text: modelmint's `pipelines/data/train.txt`, original prose, Apache-2.0.

Recipe, versions and checks: `modelmint_tiny.json`.
"""


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="build, train and save a tiny model")
    gen.add_argument("--family", choices=sorted(FAMILIES), required=True)
    gen.add_argument("--out", required=True, help="directory to create (must not exist)")
    gen.add_argument("--llama-cpp-src", required=True, help="the pinned llama.cpp source tree")
    gen.add_argument("--train-text", required=True)
    gen.add_argument("--eval-text", required=True, help="held-out text for the before/after loss")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--train-steps", type=int, default=150)
    gen.add_argument("--seq-len", type=int, default=64)
    gen.add_argument("--batch-size", type=int, default=8)
    gen.add_argument("--lr", type=float, default=2e-3)
    gen.add_argument("--threads", type=int, default=1,
                     help="torch threads; fixed so the same machine gives the same bits. One is also the "
                     "fastest on a busy 2-core machine: torch's thread barriers stall when a core is taken")
    gen.add_argument("--name", default=None, help="recorded in modelmint_tiny.json")
    gen.add_argument("--recipe-hash", default=None, help="recorded in modelmint_tiny.json")

    chk = sub.add_parser("check-tokenizer", help="print the saved tokenizer's hash and test-vector results")
    chk.add_argument("--family", choices=sorted(FAMILIES), required=True)
    chk.add_argument("--model", required=True)
    chk.add_argument("--llama-cpp-src", required=True)

    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            generate(args)
        else:
            family = FAMILIES[args.family]
            vocab = Path(args.llama_cpp_src) / "models" / f"ggml-vocab-{family.vocab}.gguf"
            print(json.dumps(check_tokenizer(Path(args.model), family, vocab), ensure_ascii=False))
    except GenerationFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
