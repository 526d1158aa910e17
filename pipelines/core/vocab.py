"""Every name modelmint's parts share, declared once: GGUF types, compressed schemes, KV dtypes, identifiers, tags."""

# A leaf: it imports no other modelmint module (only pydantic, for the identifier types), so the catalog, the gates,
# the pre-flight checks, the manifest, the DVC stages and the planner read their names and per-type facts from here and
# cannot disagree (tests/test_layout.py keeps the import graph acyclic; tests/test_vocab.py checks the GGUF rows against
# the pinned llama.cpp tree).

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import AfterValidator

# ---------------------------------------------------------------- identifiers

COMMIT_PATTERN: Final = r"^[0-9a-f]{40}$"
COMMIT: Final = re.compile(COMMIT_PATTERN)
"""A pinned git commit (hub repos, data sets, llama.cpp): 40 lower-case hex digits."""
SHA256_PATTERN: Final = r"^[0-9a-f]{64}$"
SHA256: Final = re.compile(SHA256_PATTERN)
NAME: Final = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
"""A model name or a variant tag, as catalog entries, manifests, artifact paths and dvc.yaml stages spell them."""
NAME_RULE: Final = "lower-case letters, digits, '.', '_' or '-'"
GIT_REF: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
"""A branch or tag a catalog entry tracks (git check-ref-format's rules are checked beside it)."""
VERSION: Final = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
"""A package version as a wheel source pins it."""


def is_name(text: str) -> bool:
    return bool(NAME.fullmatch(text))


def _checked_name(text: str) -> str:
    if not NAME.fullmatch(text):
        raise ValueError(f"{text!r} must be {NAME_RULE}")
    return text


ModelName = Annotated[str, AfterValidator(_checked_name)]
"""A catalog entry's and a manifest's model name (qwen2.5): the first part of a reference and of an artifact path."""
VariantTag = Annotated[str, AfterValidator(_checked_name)]
"""A variant's tag (q4_k_m, fp8): the second part of a reference, one item of a dvc.yaml stage."""


# ---------------------------------------------------------------- GGUF types (llama.cpp)


@dataclass(frozen=True)
class GGUFType:
    """One llama-quantize file type, lower-case as the catalog, Ollama tags and Hugging Face GGUF repos write it."""

    name: str
    ggml_type: str
    """The ggml type most tensors get (llama_ftype_get_default_type in src/llama-quant.cpp of the pinned tree)."""
    block: int
    """That type's block size (ggml's type traits): 256 for k-, i- (but IQ4_NL) and ternary quants, 32 for legacy."""
    fallback: str
    """What llama-quantize stores instead when a row is not a multiple of `block` (tensor_type_fallback in
    src/llama-quant.cpp): a 32-block type has nothing smaller and becomes F16. A mix's other types (Q6_K in Q4_K_M)
    fall back to theirs; the share of parameters is what pre-flight predicts, not each type."""
    bpw: float
    """Bits per weight (tools/quantize/README.md of the pinned tree, Llama-3-8B column): orders the types."""
    needs_imatrix: bool = False
    """llama-quantize refuses it without an importance matrix ("this quantization requires an imatrix!": its
    tensors become IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S or IQ3_XXS, or it is Q2_K_S; tensor_requires_imatrix and
    llama_tensor_get_type in src/llama-quant.cpp; IQ3_XS stores attn_q/attn_k as IQ3_XXS)."""
    kld: float | None = None
    """llama.cpp's published mean KLD on Llama-3-8B (tools/perplexity/README.md, "LLaMA 3 8b Scoreboard", f16 base,
    wikitext-2), without an importance matrix; the types refused without one take the row measured with the "WT
    10m" matrix. None: not in that table."""
    same_top: float | None = None
    """The same README's same-top-p % on Llama-3-8B ("LLaMA 2 vs. LLaMA 3"), where it gives one."""
    tiny: tuple[float, float, float] | None = None
    """The tiny-model gate (max mean KLD, min same top %, max ΔPPL %), where measured (pipelines/core/gates.py)."""
    ladder: bool = False
    """Worth suggesting as the next step up after a gate failed (the types the catalog and Ollama's library use)."""
    usual: int | None = None
    """Rank among the types people usually mean: a typo as close to q4_k_s as to q4_k_m (q4_k_z) is q4_k_m."""


# Tiny generated models (hidden 256, 4 layers, briefly trained; pipelines/source/tinymodel.py), measured on tiny-qwen2
# against its f16 GGUF over eval.txt (16 x 128 tokens): Q4_K_M mean KLD 0.0013, same top 99.1 %, ΔPPL +0.23 %; Q8_0
# 0.0001, 99.8 %, +0.03 %. Their next-token distributions are flatter than a real model's, so the same type loses
# *less* here than in llama.cpp's table. The `tiny` thresholds leave ~4x KLD headroom over those figures; a quant
# with zeroed blocks (tests/test_gguf_path.py) misses them by orders of magnitude.
# fmt: off
_G = GGUFType
GGUF_TYPES: Final[dict[str, GGUFType]] = {t.name: t for t in (
    _G("q4_0", "Q4_0", 32, "F16", 4.5, kld=0.071940, usual=4),
    _G("q4_1", "Q4_1", 32, "F16", 5.0, kld=0.071683),
    _G("q5_0", "Q5_0", 32, "F16", 5.5, kld=0.022239),
    _G("q5_1", "Q5_1", 32, "F16", 6.0, kld=0.018045),
    _G("q8_0", "Q8_0", 32, "F16", 8.5, kld=0.001355, same_top=97.674, tiny=(0.0005, 99.0, 0.5), ladder=True,
       usual=3),
    _G("q2_k", "Q2_K", 256, "Q4_0", 2.96, kld=0.445132, same_top=71.138, usual=6),
    _G("q2_k_s", "Q2_K", 256, "Q4_0", 2.79, needs_imatrix=True, kld=0.403360),
    _G("q3_k_s", "Q3_K", 256, "Q4_0", 3.5, kld=0.228217),
    _G("q3_k_m", "Q3_K", 256, "Q4_0", 3.91, kld=0.101913, ladder=True, usual=5),
    _G("q3_k_l", "Q3_K", 256, "Q4_0", 4.27, kld=0.087176),
    _G("q4_k_s", "Q4_K", 256, "Q5_0", 4.58, kld=0.043136),
    _G("q4_k_m", "Q4_K", 256, "Q5_0", 4.89, kld=0.031273, same_top=91.901, tiny=(0.005, 97.0, 2.0), ladder=True,
       usual=0),
    _G("q5_k_s", "Q5_K", 256, "Q5_1", 5.54, kld=0.016595),
    _G("q5_k_m", "Q5_K", 256, "Q5_1", 5.7, kld=0.010762, tiny=(0.003, 98.0, 1.5), ladder=True, usual=1),
    _G("q6_k", "Q6_K", 256, "Q8_0", 6.56, kld=0.005452, same_top=96.031, tiny=(0.0015, 98.5, 1.0), ladder=True,
       usual=2),
    _G("iq2_xxs", "IQ2_XXS", 256, "IQ4_NL", 2.06, needs_imatrix=True, kld=0.812022),
    _G("iq2_xs", "IQ2_XS", 256, "IQ4_NL", 2.31, needs_imatrix=True, kld=0.546290),
    _G("iq2_s", "IQ2_XS", 256, "IQ4_NL", 2.5, needs_imatrix=True, kld=0.439197),
    _G("iq2_m", "IQ2_S", 256, "IQ4_NL", 2.7, needs_imatrix=True, kld=0.325989),
    _G("iq1_s", "IQ1_S", 256, "IQ4_NL", 1.56, needs_imatrix=True, kld=2.211278),
    _G("iq1_m", "IQ1_M", 256, "IQ4_NL", 1.75, needs_imatrix=True, kld=1.393084),
    _G("iq3_xxs", "IQ3_XXS", 256, "IQ4_NL", 3.06, needs_imatrix=True, kld=0.183625),
    _G("iq3_xs", "IQ3_S", 256, "IQ4_NL", 3.3, needs_imatrix=True, kld=0.138693),
    _G("iq3_s", "IQ3_S", 256, "IQ4_NL", 3.44, kld=0.111278),
    _G("iq3_m", "IQ3_S", 256, "IQ4_NL", 3.66, kld=0.102534),
    _G("iq4_nl", "IQ4_NL", 32, "F16", 4.5, kld=0.035742),
    _G("iq4_xs", "IQ4_XS", 256, "IQ4_NL", 4.25, kld=0.036334),
    _G("tq1_0", "TQ1_0", 256, "Q4_0", 1.69),
    _G("tq2_0", "TQ2_0", 256, "Q4_0", 2.06),
)}
# fmt: on
GGUF_QUANT_TYPES: Final = frozenset(GGUF_TYPES)
IMATRIX_REQUIRED: Final = frozenset(t.name for t in GGUF_TYPES.values() if t.needs_imatrix)
USUAL_QUANTS: Final = tuple(
    t.name
    for t in sorted((t for t in GGUF_TYPES.values() if t.usual is not None), key=lambda t: t.usual or 0)
)
GGUF_LADDER: Final = tuple(
    t.name for t in sorted((t for t in GGUF_TYPES.values() if t.ladder), key=lambda t: t.bpw)
)
PUBLISHED_SAME_TOP: Final = tuple(
    sorted((t.kld, t.same_top) for t in GGUF_TYPES.values() if t.kld is not None and t.same_top is not None)
)
"""(mean KLD, same top %) points of Llama-3-8B, by KLD: the curve a type without its own same top is read off."""


def gguf_type(name: str) -> GGUFType | None:
    """The row of a file type (any case), or None for a name llama-quantize does not have."""
    return GGUF_TYPES.get(name.lower())


# ---------------------------------------------------------------- compressed-tensors schemes (llmcompressor)

CompressedName = Literal["fp8", "awq", "w8a8", "gptq"]
"""The compressed-tensors variants a catalog entry may ask for (pipelines/compressed/build.py builds them)."""


@dataclass(frozen=True)
class Preset:
    """A compressed-tensors preset scheme (what the quantizing modifier applies): FP8_DYNAMIC, W4A16_ASYM, …"""

    name: str
    group_size: int | None = None
    """The preset's weight group size (compressed-tensors' preset_schemes); None: per channel."""


# fmt: off
PRESETS: Final[dict[str, Preset]] = {p.name: p for p in (
    Preset("FP8_DYNAMIC"), Preset("W4A16", 128), Preset("W4A16_ASYM", 128), Preset("W8A8"),
)}
# fmt: on
GROUPED_PRESETS: Final = {p.name: p.group_size for p in PRESETS.values() if p.group_size is not None}


@dataclass(frozen=True)
class CompressedScheme:
    """One compressed-tensors variant: its presets, its bits, where its output goes and the gate it faces."""

    name: CompressedName
    bits: int
    presets: tuple[str, ...]
    """The presets it may use, its default first (the catalog's `scheme` field offers these)."""
    directory: str
    """The suffix of its output directory and served name (qwen2.5-w4a16-awq)."""
    anchor: str
    """The GGUF type with the nearest bits: its KL and same-top bars are this scheme's (pipelines/core/gates.py)."""
    recovery: tuple[tuple[float, str], tuple[float, str]]
    """(max perplexity ratio, its source) on models of the large size band, then on smaller ones."""
    tiny: tuple[float, float, float]
    """The tiny-model gate (max mean KL, min top-1 %, max perplexity ratio)."""


# Published recoveries (task accuracy of the quantized model / the original's), read as "perplexity may rise by no more
# than 1 / recovery", plus a margin for the short evaluation text:
#   FP8-dynamic: >= 99 % (RedHatAI / neuralmagic FP8-dynamic model cards, Llama 3.x and Qwen2.5, 1B-70B);
#   INT8 W8A8: ~ 99 % (the same cards for quantized.w8a8);
#   INT4 W4A16: 97-99 % on models of 3B and more (RedHatAI quantized.w4a16 cards); Qwen's own AWQ table
#   puts Qwen2.5-0.5B-Instruct-AWQ at about 90 % of the bf16 model.
# Tiny generated models, measured on tiny-qwen2 against its bf16 source on eval.txt (8 x 256 tokens): FP8_DYNAMIC mean
# KL 5.9e-4, top-1 99.3 %, ppl ratio 1.000; AWQ W4A16_ASYM (16 x 256 calibration tokens of train.txt) 2.5e-3, 99.3 %,
# 1.031. Rows of 256 weights are two 128-groups, so 4-bit loses more here than on a real model. The thresholds leave
# ~4x KL headroom; zeroed scales (KL ~10, top-1 ~7 %, ppl x thousands) fail all three (tests/test_compress.py).
# fmt: off
COMPRESSED_SCHEMES: Final[dict[str, CompressedScheme]] = {s.name: s for s in (
    CompressedScheme("fp8", 8, ("FP8_DYNAMIC",), "fp8-dynamic", "q8_0",
                     ((1.02, "FP8-dynamic >= 99 % recovery (RedHatAI cards)"),
                      (1.03, "FP8-dynamic >= 99 % recovery (RedHatAI cards, 1B), small-model margin")),
                     (2.5e-3, 95.0, 1.02)),
    CompressedScheme("awq", 4, ("W4A16_ASYM", "W4A16"), "w4a16-awq", "q4_k_m",
                     ((1.05, "W4A16 97-99 % recovery on >= 3B (RedHatAI cards)"),
                      (1.15, "W4A16 ~ 90 % recovery at 0.5B (Qwen2.5 AWQ table)")),
                     (1e-2, 95.0, 1.10)),
    CompressedScheme("w8a8", 8, ("W8A8",), "w8a8", "q8_0",
                     ((1.02, "INT8 W8A8 ~ 99 % recovery (RedHatAI cards)"),
                      (1.03, "INT8 W8A8 ~ 99 % recovery (RedHatAI cards), small-model margin")),
                     (2.5e-3, 95.0, 1.02)),
    CompressedScheme("gptq", 4, ("W4A16", "W4A16_ASYM"), "w4a16-gptq", "q4_k_m",
                     ((1.05, "W4A16 97-99 % recovery on >= 3B (RedHatAI cards)"),
                      (1.15, "W4A16 ~ 90 % recovery at 0.5B (Qwen2.5 AWQ/GPTQ tables)")),
                     (1e-2, 95.0, 1.10)),
)}
# fmt: on

# ---------------------------------------------------------------- KV cache dtypes

KVCacheDtype = Literal["auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""What a catalog's serve.kv_cache_dtype and `modelmint plan --kv-cache-dtype` take."""
VllmKVCacheDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""The same dtypes as vLLM's --kv-cache-dtype spells them (vllm/config/cache.py CacheDType)."""


@dataclass(frozen=True)
class KVDtype:
    name: KVCacheDtype
    bytes: int
    """Bytes per cached element (auto: the model's 16-bit dtype)."""
    vllm: VllmKVCacheDtype


# fmt: off
KV_DTYPES: Final[dict[str, KVDtype]] = {k.name: k for k in (
    KVDtype("auto", 2, "auto"), KVDtype("fp16", 2, "float16"), KVDtype("bf16", 2, "bfloat16"),
    KVDtype("fp8", 1, "fp8"), KVDtype("fp8_e4m3", 1, "fp8_e4m3"), KVDtype("fp8_e5m2", 1, "fp8_e5m2"),
)}
# fmt: on

LLAMA_KV_CACHE_TYPES: Final[tuple[str, ...]] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
"""The KV cache types llama-server's `-ctk` / `-ctv` accept (llama.cpp common/arg.cpp kv_cache_types)."""

# ---------------------------------------------------------------- formats, tags, stages, paths

Format = Literal["gguf", "compressed-tensors"]
STAGES: Final[dict[Format, str]] = {"gguf": "gguf", "compressed-tensors": "compress"}
"""The dvc.yaml stage that builds each format (its `foreach` items are name-tag). Which format a tag is and its stage
name are pipelines/store/names.py's (format_name, stage_name): the one table a declared format joins."""


def artifact_relpath(name: str, tag: str) -> str:
    """Where a registered artifact directory lives, relative to the repository root."""
    return f"artifacts/{name}/{tag}"


def _same(declared: Iterable[str], literal: Any, what: str) -> None:
    """Refuse to import when a row table and the Literal type that spells its names for pydantic and mypy differ."""
    if set(declared) != set(get_args(literal)):
        raise RuntimeError(
            f"pipelines/core/vocab.py: {what} rows {sorted(declared)} != {sorted(get_args(literal))}"
        )


_same(COMPRESSED_SCHEMES, CompressedName, "compressed scheme")
_same(KV_DTYPES, KVCacheDtype, "KV dtype")
_same((k.vllm for k in KV_DTYPES.values()), VllmKVCacheDtype, "vLLM KV dtype")
_same(STAGES, Format, "format")


# ---------------------------------------------------------------- GGUF metadata keys


class GGUFKey:
    """The GGUF metadata keys modelmint reads or writes, spelled once (gguf-py's `Keys`, gguf/constants.py)."""

    ARCHITECTURE: Final = "general.architecture"
    NAME: Final = "general.name"
    TYPE: Final = "general.type"
    """"model", or "imatrix" in an importance matrix."""
    FILE_TYPE: Final = "general.file_type"
    ALIGNMENT: Final = "general.alignment"
    LICENSE: Final = "general.license"
    QUANTIZED_BY: Final = "general.quantized_by"
    SOURCE_URL: Final = "general.source.url"
    SOURCE_REPO_URL: Final = "general.source.repo_url"
    SAMPLING_PREFIX: Final = "general.sampling."
    SPLIT_NO: Final = "split.no"
    SPLIT_COUNT: Final = "split.count"
    CHAT_TEMPLATE: Final = "tokenizer.chat_template"
    TOKENIZER_PREFIX: Final = "tokenizer."
    TOKENIZER_MODEL: Final = "tokenizer.ggml.model"
    TOKENIZER_PRE: Final = "tokenizer.ggml.pre"
    TOKENS: Final = "tokenizer.ggml.tokens"
    BOS_ID: Final = "tokenizer.ggml.bos_token_id"
    EOS_ID: Final = "tokenizer.ggml.eos_token_id"
    EOT_ID: Final = "tokenizer.ggml.eot_token_id"
    ADD_BOS: Final = "tokenizer.ggml.add_bos_token"
    IMATRIX_DATASETS: Final = "imatrix.datasets"
    IMATRIX_CHUNK_COUNT: Final = "imatrix.chunk_count"
    IMATRIX_CHUNK_SIZE: Final = "imatrix.chunk_size"

    @staticmethod
    def context_length(arch: object) -> str:
        """The model's trained context length key, `<arch>.context_length` (general.architecture names arch)."""
        return f"{arch}.context_length"
