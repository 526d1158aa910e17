"""The serving planner: how to serve a model variant on the GPUs a team has (pure: no I/O beyond reading files
it is handed, no toolchain).

The rules are the deployment handbooks' (../DESIGN.md, "The VRAM planner"), made exact where the model allows:

- weights per GPU come from the artifact's real tensor bytes, split over tensor-parallel ranks and pipeline
  stages; usable memory is the memory CUDA reports (the GPU profile's, not the nominal size) ×
  gpu_memory_utilization (0.90); from it vLLM keeps what its profile run measured: the activation peak of one
  forward pass of the scheduler's batch (max_num_batched_tokens tokens, max_num_seqs × vocab logits), the
  non-torch memory (CUDA context, NCCL buffers: more at TP ≥ 2) and, from vLLM 0.20, its CUDA-graph estimate;
  each term is fitted on real vLLM startup logs (tests/data/vllm_startups/, benchmarks/bench_planner.py), with
  the handbooks' 25 % of the weights only as a fallback with a warning; what is left is the KV pool;
- KV bytes per token come from the model's config.json, per architecture: 2 × layers × KV heads × head dim ×
  bytes for full attention (KV heads split over TP ranks, never below one per rank), layers with a sliding
  window hold at most their window, MLA models cache kv_lora_rank + rope dims once per layer (no × 2, the same
  on every TP rank); a layer that is not softmax attention (state-space, linear attention, convolution: read from
  the config's keys, never the model's name) is refused;
- tensor parallel only inside a node and only on identical GPUs, dividing the attention and KV heads; pipeline
  parallel across nodes (PP = nodes, TP = GPUs per node), never more stages than layers; independent replicas
  when fewer GPUs hold the model; mixed GPU types get one plan per type (instances behind a router);
- a plan that cannot fit is refused with the nearest plans that do (more GPUs of the same type, a smaller
  registered variant of the same model, a shorter context): never "does not fit" alone;
- pipeline stages across GPU types only when asked, sized by vLLM's layer partition in proportion to each
  stage's usable memory.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.core.errors import ArtifactError, ConfigError
from pipelines.core.gpus import GIB as GIB
from pipelines.core.gpus import GPU as GPU
from pipelines.core.gpus import GPUS_FILE as GPUS_FILE
from pipelines.core.gpus import NodeGroup as NodeGroup
from pipelines.core.gpus import cluster_of as cluster_of
from pipelines.core.gpus import gpu as gpu
from pipelines.core.gpus import known_gpus as known_gpus
from pipelines.core.gpus import load_inventory as load_inventory
from pipelines.core.gpus import parse_cluster as parse_cluster
from pipelines.core.vocab import KV_DTYPES, GGUFKey

GPU_MEMORY_UTILIZATION = 0.90
ACTIVATION_SHARE = 0.25
"""The handbooks' heuristic (activations as a share of the per-GPU weights): only a fallback, with a warning,
for a model whose config lacks the sizes the measured terms need."""
MAX_NUM_SEQS = 256
"""The most sequences a plan gives vLLM (its max_num_seqs; vLLM's own default on GPUs under 70 GiB)."""

# The memory terms below are least-squares fits on the vLLM startup logs in tests/data/vllm_startups/ (vLLM 0.19,
# the profiler vLLM runs since 0.17; benchmarks/bench_planner.py refits and prints them, and
# tests/test_planner_calibration.py checks them by leave-one-out). Each is in bytes per GPU.
ACTIVATION_FIXED = 156_300_000
"""Activation peak: a fixed part of the profile run (buffers every forward pass allocates)."""
ACTIVATION_PER_LOGIT = 3.372
"""… per fp32 logit of the sampler's dummy batch (max_num_seqs × vocab_size × 4 bytes, sampled together)."""
ACTIVATION_PER_HIDDEN = 1.469
"""… per byte of the batch's hidden states (max_num_batched_tokens × hidden_size × 2 bytes)."""
ACTIVATION_PER_MLP = 0.06908
"""… per byte of the batch's MLP activations on one rank (max_num_batched_tokens × intermediate / TP × 2 bytes)."""
NON_TORCH_TP1 = 341_800_000
"""Non-torch memory of one GPU serving alone (CUDA context growth, cuBLAS workspaces)."""
NON_TORCH_TP = 2_253_000_000
"""Non-torch memory per GPU at TP ≥ 2: NCCL and custom all-reduce buffers."""
CUDA_GRAPHS_TP1 = 1_037_000_000
"""vLLM's estimate of its CUDA graphs (51 capture sizes up to 512 tokens), one GPU."""
CUDA_GRAPHS_TP = 1_954_000_000
"""… per GPU at TP ≥ 2 (the all-reduce in every graph)."""
CUDA_GRAPHS_FROM = (0, 20)
"""vLLM deducts its CUDA-graph estimate from the KV pool from this version on (0.19 only announces it:
"In v0.19, CUDA graph memory profiling will be enabled by default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)")."""
KV_BYTES: dict[str, int] = {k.name: k.bytes for k in KV_DTYPES.values()}
"""Bytes per cached element of each KV dtype (pipelines/core/vocab.KV_DTYPES)."""


# ---------------------------------------------------------------- the model's shape


@dataclass(frozen=True)
class ModelShape:
    """What sizes the KV cache and the parallel layouts, read from config.json."""

    architecture: str
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    max_context: int
    windows: tuple[int | None, ...] = ()
    """Per layer: its sliding window in tokens, or None for full attention (empty: all full)."""
    mla_dims: int | None = None
    """MLA: kv_lora_rank + qk_rope_head_dim, cached once per layer and token (DeepSeek V2/V3)."""
    hidden_size: int = 0
    intermediate_size: int = 0
    """The MLP width a token passes through (a mixture of experts: its active experts' together); 0: unknown."""
    vocab_size: int = 0

    def kv_bytes_per_sequence(self, tokens: int, *, tp: int = 1, pp: int = 1, kv_dtype: str = "auto") -> int:
        """KV cache bytes one sequence of `tokens` needs on one GPU of a TP × PP layout (the largest stage)."""
        # the first stage's layers (the largest one when layers do not divide evenly)
        return self.kv_bytes_for_layers(tokens, range(math.ceil(self.layers / pp)), tp=tp, kv_dtype=kv_dtype)

    def kv_bytes_for_layers(self, tokens: int, layers: range, *, tp: int = 1, kv_dtype: str = "auto") -> int:
        """KV cache bytes one sequence of `tokens` needs in `layers` (one pipeline stage's) on one TP rank.

        Counted per run of layers with one window (_window_runs), never per layer: the searches call this for every
        layout and context they try, and the work must not grow with the layer count."""
        elem = KV_BYTES[kv_dtype]
        start, stop = max(0, layers.start), min(layers.stop, self.layers)
        cached = 0  # tokens cached over the layers, summed
        for first, end, window in self._window_runs:
            n = min(end, stop) - max(first, start)
            if n > 0:
                cached += n * (min(tokens, window) if window else tokens)
        if self.mla_dims is not None:
            return cached * self.mla_dims * elem
        kv_per_rank = max(1, self.kv_heads // tp)
        return cached * 2 * kv_per_rank * self.head_dim * elem

    @functools.cached_property
    def _window_runs(self) -> tuple[tuple[int, int, int | None], ...]:
        """(first layer, end, window) of each run of consecutive layers with the same window (None: full attention);
        layers past `windows` (or all of them, when it is empty) are full attention."""
        runs: list[list[Any]] = []
        for i, w in enumerate(self.windows[: self.layers]):
            if runs and runs[-1][2] == w:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1, w])
        covered = runs[-1][1] if runs else 0
        if covered < self.layers:
            runs.append([covered, self.layers, None])
        return tuple((a, b, w) for a, b, w in runs)

    def kv_bytes_per_token(self, *, tp: int = 1, pp: int = 1, kv_dtype: str = "auto") -> int:
        """Per token of a sequence no longer than any window (the figure vLLM's KV spec gives per page slot)."""
        return self.kv_bytes_per_sequence(1, tp=tp, pp=pp, kv_dtype=kv_dtype)

    def tp_sizes(self, limit: int) -> list[int]:
        """Tensor-parallel sizes up to `limit` that vLLM accepts: dividing the attention heads, and the KV heads
        dividing them or divided by them."""
        return [
            t
            for t in range(1, limit + 1)
            if self.attention_heads % t == 0 and (self.kv_heads % t == 0 or t % self.kv_heads == 0)
        ]


_ATTENTION = frozenset({"attention", "full_attention", "sliding_attention", "chunked_attention"})
"""Layer kinds that cache keys and values per token (softmax attention, windowed or not)."""
_STATE_KEYS = (
    "mamba_d_state",
    "mamba_d_ssm",
    "ssm_state_size",
    "state_size",
    "ssm_cfg",
    "linear_conv_kernel_dim",
    "conv_L_cache",
)
"""Config keys only layers that keep a fixed state per sequence have: Mamba's state (Jamba, Bamba, Zamba, Falcon-H1,
GraniteMoeHybrid: mamba_d_state; Falcon-H1 also mamba_d_ssm; NemotronH: ssm_state_size; Mamba, Mamba2:
state_size), Qwen3-Next's gated delta net (linear_conv_kernel_dim), LFM2's short convolutions (conv_L_cache)."""


def _not_attention(text: dict[str, Any], layers: int) -> str | None:
    """Which key of the config declares a layer that is not softmax attention (None: every layer is attention).

    Read from the keys the hybrid configs carry (transformers' models/*/configuration_*.py), never from the model's
    name: a list of layer kinds (`layer_types`: Qwen3-Next, LFM2, GraniteMoeHybrid, MiniMax; `layers_block_type`:
    Zamba2, NemotronH; `block_types`: RecurrentGemma), the attention layers' indices or period (`attn_layer_indices`:
    Bamba; `full_attn_idxs`: LFM2; `attn_layer_period`: Jamba, Zamba; `full_attention_interval`: Qwen3-Next), a layer pattern (`hybrid_override_pattern`: NemotronH, `*` for
    attention), Zamba2's `hybrid_layer_ids`, Kimi-Linear's `linear_attn_config`, MiniMax's `attn_type_list` (0: linear),
    and the state-space sizes of _STATE_KEYS.
    """
    for key in ("layer_types", "layers_block_type", "block_types"):
        kinds = text.get(key)
        if isinstance(kinds, (list, tuple)):
            other = sorted({str(k) for k in kinds} - _ATTENTION)
            if other:
                return f"{key} lists {', '.join(map(repr, other))} layers"
    for key in ("attn_layer_indices", "full_attn_idxs"):
        indices = text.get(key)
        if isinstance(indices, (list, tuple)) and len(set(indices)) < layers:
            return f"{key} makes {len(set(indices))} of {layers} layers attention"
    for key in ("attn_layer_period", "full_attention_interval"):
        period = text.get(key)
        if isinstance(period, int) and period > 1:
            return f"{key} {period} makes one layer in {period} attention"
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and set(pattern) - {"*"}:
        return f"hybrid_override_pattern {pattern[:24]!r}{'…' if len(pattern) > 24 else ''} has layers other than * (attention)"
    if text.get("hybrid_layer_ids"):
        return "hybrid_layer_ids names Mamba layers with shared attention"
    if text.get("linear_attn_config"):
        return "linear_attn_config declares linear-attention layers"
    if 0 in (text.get("attn_type_list") or []):
        return "attn_type_list marks linear-attention layers (0)"
    found = [k for k in _STATE_KEYS if text.get(k) is not None]
    return f"{found[0]} sizes a state-space layer" if found else None


def _check_heads(arch: str, layers: int, heads: int, kv: int, hint: str) -> None:
    """Refuse head counts no attention layer can have: vLLM would fail loading them, so no plan may hold them."""
    for name, value in (
        ("num_hidden_layers", layers),
        ("num_attention_heads", heads),
        ("num_key_value_heads", kv),
    ):
        if value <= 0:
            raise ConfigError(f"{arch}'s {name} is {value}: the planner cannot size its attention", hint=hint)
    if kv > heads or heads % kv:
        raise ConfigError(
            f"{arch}'s {kv} KV heads do not divide {heads} attention heads "
            f"(grouped-query attention needs a divisor): the config is damaged",
            hint=hint,
        )


def _config_int(text: dict[str, Any], key: str, arch: str, hint: str) -> int:
    """A count config.json must give: absent and not-a-number are different messages."""
    if key not in text:
        raise ConfigError(f"{arch}'s config.json has no {key}: the planner cannot size its attention", hint=hint)
    try:
        return int(text[key])
    except (TypeError, ValueError):
        raise ConfigError(f"{arch}'s config.json {key} is {text[key]!r}, not a count", hint=hint) from None


def shape_of(config: dict[str, Any]) -> ModelShape:
    """The model's shape from its config.json (a multimodal config's `text_config` when it has one).

    Raises:
        ConfigError: an architecture the planner cannot size (state-space or hybrid layers), or a config that
            lacks what sizes attention.
    """
    text = config.get("text_config") or config
    arch = (config.get("architectures") or [config.get("model_type", "the model")])[0]
    model_type = str(text.get("model_type") or config.get("model_type") or "").lower()
    layer_types = [str(t) for t in text.get("layer_types") or []]
    why = _not_attention(text, _count(text.get("num_hidden_layers")))
    if why:
        raise ConfigError(
            f"{arch} has state-space or hybrid layers (config.json: {why}): the planner sizes only "
            "attention's per-token KV cache, not a fixed state per sequence",
            hint="plan it by hand from vLLM's logged KV cache size, or serve a transformer model",
        )
    hint = "check the checkpoint's config.json (num_hidden_layers, num_attention_heads, num_key_value_heads)"
    layers = _config_int(text, "num_hidden_layers", arch, hint)
    heads = _config_int(text, "num_attention_heads", arch, hint)
    try:
        # absent means one KV head per attention head (multi-head attention); a present 0 is a damaged config
        kv = heads if text.get("num_key_value_heads") is None else int(text["num_key_value_heads"])
    except (TypeError, ValueError):
        raise ConfigError(
            f"{arch}'s config.json num_key_value_heads is {text.get('num_key_value_heads')!r}, not a count",
            hint=hint,
        ) from None
    _check_heads(arch, layers, heads, kv, hint)
    try:
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        ctx = int(text.get("max_position_embeddings") or 4096)
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(
            f"{arch}'s config.json lacks a usable {err} (head_dim or hidden_size, "
            f"max_position_embeddings): the planner cannot size its attention",
            hint=hint,
        ) from None
    mla = None
    if text.get("kv_lora_rank"):
        mla = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)
    window = text.get("sliding_window")
    windows: tuple[int | None, ...] = ()
    if window and (text.get("use_sliding_window", True) is not False):
        if layer_types:
            windows = tuple(int(window) if t == "sliding_attention" else None for t in layer_types[:layers])
        elif model_type in ("mistral",):
            windows = (int(window),) * layers
    return ModelShape(arch, layers, heads, kv, head_dim, ctx, windows, mla, *_widths(text))


def _count(value: Any) -> int:
    """A config's count as an int (0 when absent or not a count: the sizes it feeds fall back, never fail)."""
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _widths(text: dict[str, Any]) -> tuple[int, int, int]:
    """(hidden_size, MLP width a token passes through, vocab_size) from a config; 0 where it does not say."""
    hidden = _count(text.get("hidden_size") or text.get("n_embd") or text.get("d_model"))
    experts = _count(text.get("num_experts_per_tok") or text.get("moe_topk"))
    if experts and text.get("moe_intermediate_size"):
        mlp = experts * _count(text["moe_intermediate_size"]) + _count(
            text.get("shared_expert_intermediate_size")
        )
    else:
        mlp = _count(text.get("intermediate_size") or text.get("ffn_dim") or text.get("n_inner"))
    return hidden, mlp, _count(text.get("vocab_size"))


# ---------------------------------------------------------------- plans


@dataclass(frozen=True)
class GPUMemory:
    """One GPU's budget in a plan, in bytes."""

    total: int
    usable: int
    weights: int
    activations: int
    kv_pool: int

    @property
    def headroom(self) -> int:
        return self.total - self.usable


@dataclass(frozen=True)
class Plan:
    group: NodeGroup
    tp: int
    pp: int
    replicas: int
    max_model_len: int
    max_num_seqs: int
    memory: GPUMemory
    kv_bytes_per_token: int
    kv_dtype: str
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    utilization: float = GPU_MEMORY_UTILIZATION
    layer_partition: tuple[int, ...] = ()
    """Layers per pipeline stage when the stages differ (vLLM's VLLM_PP_LAYER_PARTITION); empty: vLLM's even split."""
    stages: tuple[NodeGroup, ...] = ()
    """Pipeline stages of different GPU types (one node each, the first runs Ray's head and the API server), with
    `stage_memory` their budgets; empty: every stage is a node of `group`."""
    stage_memory: tuple[GPUMemory, ...] = ()
    batched_tokens: int = 0
    """The max_num_batched_tokens the budget assumes vLLM profiles with (its default unless asked)."""
    max_num_batched_tokens: int | None = None
    """--max-num-batched-tokens when asked: every file that starts vLLM passes it (None: vLLM's default)."""

    @property
    def label(self) -> str:
        """The GPUs a plan uses, as --gpus writes them (a pipeline across types: its groups joined with +)."""
        if not self.stages:
            return str(self.group)
        runs: list[list[Any]] = []
        for s in self.stages:
            if runs and runs[-1][1] == s.gpus_per_node and runs[-1][2] == s.gpu:
                runs[-1][0] += 1
            else:
                runs.append([1, s.gpus_per_node, s.gpu])
        return "+".join(str(NodeGroup(n, k, g)) for n, k, g in runs)

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def per_gpu(self) -> list[tuple[str, GPUMemory]]:
        """Each GPU type's name with its budget: one per stage in a pipeline across types, else the group's."""
        names = [s.gpu.name for s in self.stages] or [self.group.gpu.name]
        return list(zip(names, self.stage_memory or (self.memory,), strict=True))

    @property
    def multi_node(self) -> bool:
        return self.pp > 1 and (self.group.nodes > 1 or bool(self.stages))


class PlanRefused(ConfigError):
    """No layout of the asked GPUs holds the model at the asked context; `nearest` names one that does."""

    def __init__(self, message: str, nearest: list[str]) -> None:
        super().__init__(message, hint="nearest plans that fit: " + "; ".join(nearest))
        self.nearest = nearest


@dataclass(frozen=True)
class Variant:
    """Another registered variant of the same model, offered when the asked one does not fit."""

    ref: str
    weights_bytes: int
    """Its registered size: at least its tensor bytes, so a fit with it is a fit with the real variant."""
    fp8_weights: bool = False


@dataclass(frozen=True)
class Ask:
    """What the user wants served."""

    weights_bytes: int
    shape: ModelShape
    context: int | None = None
    """Tokens per sequence (None: the model's own maximum, or what fits)."""
    concurrency: int = 1
    kv_dtype: str = "auto"
    utilization: float = GPU_MEMORY_UTILIZATION
    """vLLM's gpu_memory_utilization: the share of the memory CUDA reports that the instance may use."""
    activation_share: float | None = None
    """None: the measured memory terms. A number: the handbooks' accounting (activations = that share of the
    weights, no non-torch memory, no CUDA graphs), for reproducing their worked cases."""
    fp8_weights: bool = False
    """The variant is FP8 W8A8 (it wants FP8 compute)."""
    smaller: tuple[Variant, ...] = ()
    """The model's other registered variants (a refusal suggests the largest smaller one that fits)."""
    tp: int | None = None
    """vLLM's tensor_parallel_size, when asked for (None: the smallest that fits)."""
    max_num_batched_tokens: int | None = None
    """vLLM's max_num_batched_tokens (what its profile run pushes through one forward pass); None: its default."""
    max_num_seqs: int = MAX_NUM_SEQS
    """The most sequences a plan gives vLLM (its max_num_seqs, which also sizes the profile's dummy sampler batch)."""
    cuda_graphs: bool = True
    """Whether the vLLM that serves deducts its CUDA-graph estimate from the KV pool (from 0.20; the pinned one does)."""

    def __post_init__(self) -> None:
        # 0 once meant "the maximum" by falling through `context or max_context`: say so instead of guessing
        if self.context is not None and self.context < 1:
            raise ConfigError(
                f"--context {self.context} is no context: a sequence holds at least one token",
                hint=f"omit --context for the model's maximum ({self.shape.max_context}), "
                f"or give a positive number of tokens",
            )
        if self.concurrency < 1:
            raise ConfigError(
                f"--concurrency {self.concurrency}: at least one sequence is served",
                hint="give --concurrency 1 or more",
            )
        if not 0 < self.utilization <= 1:
            raise ConfigError(
                f"--gpu-memory-utilization {self.utilization:g} is not a share of GPU memory: vLLM "
                "takes a fraction above 0 and at most 1",
                hint=f"give e.g. --gpu-memory-utilization {GPU_MEMORY_UTILIZATION} (vLLM's default)",
            )
        if self.tp is not None and self.tp < 1:
            raise ConfigError(
                f"--tensor-parallel-size {self.tp}: a replica runs on at least one GPU",
                hint="give --tensor-parallel-size 1 or more, or leave it out for the smallest that fits",
            )
        if self.tp is not None and self.tp not in self.shape.tp_sizes(self.tp):
            raise ConfigError(
                f"--tensor-parallel-size {self.tp} does not divide {self.shape.architecture}'s "
                f"{self.shape.attention_heads} attention / {self.shape.kv_heads} KV heads: vLLM refuses it",
                hint=f"one of {', '.join(map(str, self.shape.tp_sizes(64)[:8]))}, or leave it out",
            )
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError(
                f"--max-num-batched-tokens {self.max_num_batched_tokens}: a batch holds at least one token",
                hint="give a positive number of tokens (vLLM's default: 2048, or 8192 on "
                "GPUs of 70 GiB and more other than A100s)",
            )

    @property
    def seqs_cap(self) -> int:
        """The most sequences a plan may give vLLM: max_num_seqs, and vLLM wants max_num_batched_tokens ≥ it."""
        return max(1, min(self.max_num_seqs, self.max_num_batched_tokens or self.max_num_seqs))


def default_batched_tokens(g: GPU) -> int:
    """vLLM's default max_num_batched_tokens for `vllm serve`: 8192 on GPUs of 70 GiB and more whose name does not
    say A100, else 2048 (EngineArgs' defaults for the OpenAI server, vLLM 0.8 and later; an A800 gets 8192)."""
    return 8192 if g.memory_gib >= 70 and "A100" not in g.name.upper() else 2048


def batched_tokens(ask: Ask, g: GPU) -> int:
    return ask.max_num_batched_tokens or default_batched_tokens(g)


def activation_bytes(shape: ModelShape, tp: int, tokens: int, seqs: int) -> int | None:
    """The activation peak vLLM's profile run measures on one GPU: one forward pass of `tokens` batched tokens and
    the sampler's dummy batch of `seqs` sequences × vocab fp32 logits (None: the config lacks the sizes)."""
    if not (shape.hidden_size and shape.intermediate_size and shape.vocab_size):
        return None
    return int(
        ACTIVATION_FIXED
        + ACTIVATION_PER_LOGIT * seqs * shape.vocab_size * 4
        + ACTIVATION_PER_HIDDEN * tokens * shape.hidden_size * 2
        + ACTIVATION_PER_MLP * tokens * math.ceil(shape.intermediate_size / tp) * 2
    )


def non_torch_bytes(tp: int) -> int:
    """Memory outside PyTorch's allocator on one GPU: the CUDA context's growth alone, NCCL buffers at TP ≥ 2."""
    return NON_TORCH_TP1 if tp == 1 else NON_TORCH_TP


def cuda_graph_bytes(tp: int) -> int:
    """vLLM's CUDA-graph estimate on one GPU (deducted from the KV pool from vLLM 0.20 on)."""
    return CUDA_GRAPHS_TP1 if tp == 1 else CUDA_GRAPHS_TP


def _runtime(ask: Ask, g: GPU, tp: int, weights: int) -> tuple[int, str]:
    """(bytes vLLM keeps beyond the weights and the KV pool on one GPU, how they were sized)."""
    if ask.activation_share is not None:
        return int(
            weights * ask.activation_share
        ), f"activations {ask.activation_share:.0%} of that (handbook)"
    tokens = batched_tokens(ask, g)
    act = activation_bytes(ask.shape, tp, tokens, ask.seqs_cap)
    if act is None:
        act, how = int(weights * ACTIVATION_SHARE), f"activations {ACTIVATION_SHARE:.0%} of that (fallback)"
    else:
        how = (
            f"activation peak {act / GIB:.2f} GiB (vLLM's profile of {tokens} batched tokens and "
            f"{ask.seqs_cap} × {ask.shape.vocab_size:,} logits)"
        )
    extra = non_torch_bytes(tp)
    how += f", non-torch {extra / GIB:.2f} GiB"
    if ask.cuda_graphs:
        extra += cuda_graph_bytes(tp)
        how += f", CUDA graphs {cuda_graph_bytes(tp) / GIB:.2f} GiB"
    return act + extra, how


def budget(ask: Ask, g: GPU, tp: int, pp: int) -> GPUMemory:
    """One GPU's budget in a TP × PP replica: `activations` holds all that vLLM keeps beyond the weights and the KV
    pool (the activation peak, non-torch memory, CUDA graphs where deducted)."""
    total = g.memory_bytes
    usable = int(total * ask.utilization)
    weights = math.ceil(ask.weights_bytes / (tp * pp))
    runtime, _ = _runtime(ask, g, tp, weights)
    return GPUMemory(total, usable, weights, runtime, usable - weights - runtime)


_budget = budget


def _fits(ask: Ask, group: NodeGroup, tp: int, pp: int) -> tuple[GPUMemory, int, int] | None:
    """(memory, max_model_len, max_num_seqs) when a TP × PP replica serves `ask` on `group`'s GPUs, else None."""
    mem = _budget(ask, group.gpu, tp, pp)
    if mem.kv_pool <= 0:
        return None
    context = min(ask.context or ask.shape.max_context, ask.shape.max_context)
    per_seq = ask.shape.kv_bytes_per_sequence(context, tp=tp, pp=pp, kv_dtype=ask.kv_dtype)
    seqs = mem.kv_pool // per_seq if per_seq else ask.seqs_cap
    if seqs < 1:
        return None
    return mem, context, int(min(seqs, ask.seqs_cap))


def _serves(ask: Ask, group: NodeGroup, tp: int, pp: int) -> tuple[GPUMemory, int, int] | None:
    """_fits, and enough sequences for the asked concurrency."""
    fit = _fits(ask, group, tp, pp)
    return fit if fit is not None and fit[2] >= min(ask.concurrency, ask.seqs_cap) else None


def _layouts(ask: Ask, group: NodeGroup) -> list[tuple[int, int]]:
    """TP × PP layouts on `group`, fewest GPUs first: one node's TP sizes (only the asked one, when asked), then
    PP across its nodes."""
    tps = [t for t in ask.shape.tp_sizes(group.gpus_per_node) if ask.tp is None or t == ask.tp]
    out = [(t, 1) for t in tps]
    if group.nodes > 1:
        out += [(t, p) for p in range(2, group.nodes + 1) for t in tps if p <= ask.shape.layers]
    return sorted(out, key=lambda tp_pp: (tp_pp[0] * tp_pp[1], tp_pp[1]))


def _memory_warnings(ask: Ask) -> list[str]:
    out = []
    if ask.activation_share is None and activation_bytes(ask.shape, 1, 1, 1) is None:
        out.append(
            f"{ask.shape.architecture}'s config lacks hidden_size / intermediate_size / vocab_size: "
            f"activations are sized as {ACTIVATION_SHARE:.0%} of the weights (the handbooks' rule), not by "
            "vLLM's profile"
        )
    if ask.max_num_batched_tokens is not None:
        out.append(
            f"the budget assumes vLLM runs with --max-num-batched-tokens {ask.max_num_batched_tokens} (its "
            "profile batch): start it with that option, or the activation peak it measures differs"
        )
    return out


def replicas_of(group: NodeGroup, tp: int, pp: int) -> int:
    """Independent TP × PP replicas `group` holds: TP GPUs never span a node, a pipeline takes PP whole nodes."""
    return group.nodes * (group.gpus_per_node // tp) if pp == 1 else group.nodes // pp


def plan_group(ask: Ask, group: NodeGroup) -> Plan:
    """The layout of `group`'s GPUs that serves `ask` at its context and concurrency and uses the most of them (as
    many replicas as the group holds), the fewest GPUs per replica among those, TP inside a node before PP across
    nodes; a GPU no layout can use is named in the reasons.

    Raises:
        PlanRefused: none fits: with the nearest plans that do.
    """
    context = min(ask.context or ask.shape.max_context, ask.shape.max_context)
    if ask.context and ask.context > ask.shape.max_context:
        raise ConfigError(
            f"a context of {ask.context} tokens is longer than {ask.shape.architecture} supports "
            f"({ask.shape.max_context})",
            hint=f"ask for --context {ask.shape.max_context} or less",
        )
    fitting = [
        (tp, pp, fit) for tp, pp in _layouts(ask, group) if (fit := _serves(ask, group, tp, pp)) is not None
    ]
    if fitting:
        tp, pp, (mem, max_len, seqs) = min(
            fitting, key=lambda f: (-f[0] * f[1] * replicas_of(group, f[0], f[1]), f[0] * f[1], f[1])
        )
        replicas = replicas_of(group, tp, pp)
        reasons = _reasons(ask, group, tp, pp, mem, replicas)
        reasons += _idle(ask, group, tp, pp, replicas, smallest=min(t * p for t, p, _ in fitting))
        warnings = [_fp8_warning(group.gpu)] if ask.fp8_weights and not group.gpu.fp8_compute else []
        per_token = ask.shape.kv_bytes_per_token(tp=tp, pp=pp, kv_dtype=ask.kv_dtype)
        return Plan(
            group,
            tp,
            pp,
            replicas,
            max_len,
            seqs,
            mem,
            per_token,
            ask.kv_dtype,
            reasons,
            warnings + _memory_warnings(ask),
            ask.utilization,
            batched_tokens=batched_tokens(ask, group.gpu),
            max_num_batched_tokens=ask.max_num_batched_tokens,
        )
    tp_note = f" with --tensor-parallel-size {ask.tp}" if ask.tp is not None else ""
    raise PlanRefused(
        f"{ask.shape.architecture} ({ask.weights_bytes / GIB:.1f} GiB of weights) at {context} tokens × "
        f"{ask.concurrency} sequences does not fit {group}{tp_note}",
        nearest(ask, group),
    )


def _idle(ask: Ask, group: NodeGroup, tp: int, pp: int, replicas: int, smallest: int) -> list[str]:
    """Why GPUs of `group` stay idle under a TP × PP layout of `replicas` (nothing when every GPU serves)."""
    idle = group.gpus - tp * pp * replicas
    if idle <= 0:
        return []
    parts = []
    per_node = group.gpus_per_node - (group.gpus_per_node // tp * tp if pp == 1 else tp)
    if per_node:
        parts.append(
            f"{'replicas take' if pp == 1 else 'a pipeline stage takes'} {tp} GPU(s) of a node of "
            f"{group.gpus_per_node}, leaving {per_node} in each node used"
        )
    if pp > 1 and group.nodes % pp:
        parts.append(
            f"a pipeline takes {pp} whole nodes of the {group.nodes}, leaving {group.nodes % pp} node(s)"
        )
    why = "; ".join(parts)
    limits = (
        f"--tensor-parallel-size {ask.tp} was asked for"
        if ask.tp is not None
        else f"tensor parallel must divide the {ask.shape.attention_heads} attention / {ask.shape.kv_heads} KV heads"
    )
    return [
        f"{idle} of {group.gpus} GPUs stay idle: {why}; no layout that serves the model uses more ({limits}, "
        f"and a replica needs at least {smallest} GPU(s))"
    ]


def _fp8_warning(g: GPU) -> str:
    return (
        f"{g.name} (compute capability {g.compute_capability}) has no FP8 compute: vLLM runs this FP8 checkpoint "
        "as weight-only W8A16 (Marlin), slower and not for MoE; AWQ (W4A16) runs natively on it"
    )


def _reasons(ask: Ask, group: NodeGroup, tp: int, pp: int, mem: GPUMemory, replicas: int) -> list[str]:
    g = group.gpu
    _, runtime = _runtime(ask, g, tp, mem.weights)
    out = [
        f"weights {ask.weights_bytes / GIB:.1f} GiB over {tp * pp} GPU(s): {mem.weights / GIB:.1f} GiB each; "
        f"{runtime}; {g.memory_gib:g} GiB ({g.memory_basis}) × "
        f"{ask.utilization:.2f} usable leaves "
        f"{mem.kv_pool / GIB:.1f} GiB of KV pool per GPU"
    ]
    if tp > 1:
        out.append(
            f"tensor parallel {tp} inside one node of {group.gpus_per_node} {g.name} ({g.interconnect}): "
            f"{ask.shape.attention_heads} attention / {ask.shape.kv_heads} KV heads divide by it"
        )
    else:
        out.append("one GPU holds a replica: no tensor parallel (no all-reduce per layer)")
    if pp > 1:
        out.append(
            f"pipeline parallel {pp} across nodes ({math.ceil(ask.shape.layers / pp)} of {ask.shape.layers} "
            "layers per stage, Ray backend): tensor parallel never crosses a node"
        )
    if replicas > 1:
        used = tp * pp * replicas
        out.append(
            f"{replicas} independent replicas behind a router use "
            f"{'all ' + str(used) if used == group.gpus else f'{used} of {group.gpus}'} GPUs"
        )
    return out


def _more_gpus(ask: Ask, group: NodeGroup, g: GPU) -> str | None:
    """The smallest cluster of `g` GPUs from `group`'s size up (more GPUs in its nodes up to 8, more nodes up to 7
    more) that serves `ask`, as --gpus writes it: fewest GPUs first, then fewest nodes (TP inside a node before PP
    across nodes)."""
    per_node = sorted({group.gpus_per_node, *(k for k in (2, 4, 8) if k > group.gpus_per_node)})
    candidates = sorted(
        (NodeGroup(n, k, g) for n in range(group.nodes, group.nodes + 8) for k in per_node),
        key=lambda c: (c.gpus, c.nodes),
    )
    for bigger in candidates:
        if str(bigger) != str(group) and any(_serves(ask, bigger, t, p) for t, p in _layouts(ask, bigger)):
            return f"--gpus {bigger}"
    return None


def _longest_context(ask: Ask, pool: int, tp: int, pp: int) -> int:
    """The longest context, a multiple of 256, whose asked sequences (at most max_num_seqs) fit `pool` (0: not even
    256).

    Searched, not divided: sliding-window layers cap their tokens, so a sequence's bytes grow slower than its length.
    """
    seqs = min(ask.concurrency, ask.seqs_cap)  # what _serves asks of a plan

    def fits(tokens: int) -> bool:
        return ask.shape.kv_bytes_per_sequence(tokens, tp=tp, pp=pp, kv_dtype=ask.kv_dtype) * seqs <= pool

    lo, hi = 0, ask.shape.max_context // 256  # in units of 256 tokens; lo always fits (0 tokens need nothing)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * 256) else (lo, mid - 1)
    return lo * 256


def nearest(ask: Ask, group: NodeGroup) -> list[str]:
    """Plans that do fit, nearest first: more GPUs of the same type, a smaller registered variant, a shorter context
    on these GPUs; when none of these fits, GPUs with more memory."""
    out = [s for s in [_more_gpus(ask, group, group.gpu)] if s]
    out += _smaller_variant(ask, group)
    # the longest over every layout of these GPUs: a wider one holds fewer weights per GPU, so more KV
    shorter = max(
        (
            (_longest_context(ask, mem.kv_pool, tp, pp), -tp * pp, tp, pp)
            for tp, pp in _layouts(ask, group)
            if (mem := _budget(ask, group.gpu, tp, pp)).kv_pool > 0
        ),
        default=None,
    )
    if shorter and shorter[0] >= 256:
        tokens, _, tp, pp = shorter
        out.append(f"--context {tokens} on {group} (TP {tp} × PP {pp})")
    for g in sorted(known_gpus().values(), key=lambda g: g.memory_gib):
        found = None if out or g.memory_gib <= group.gpu.memory_gib else _more_gpus(ask, group, g)
        if found:
            out.append(found)
    if not out:
        out.append(
            "a smaller variant of the same model (`modelmint list` shows what is registered): no cluster of "
            "up to 8 more nodes of 8 of any known GPU holds this one"
        )
    return out


def smaller_ask(ask: Ask, variant: Variant) -> Ask:
    """`ask` for another variant of the same model (same shape, context and concurrency)."""
    return dataclasses.replace(
        ask, weights_bytes=variant.weights_bytes, fp8_weights=variant.fp8_weights, smaller=()
    )


def _smaller_variant(ask: Ask, group: NodeGroup) -> list[str]:
    """The largest smaller registered variant that serves `ask` on `group`, as a suggestion."""
    for v in sorted(ask.smaller, key=lambda v: -v.weights_bytes):
        if v.weights_bytes < ask.weights_bytes and any(
            _serves(smaller_ask(ask, v), group, t, p) for t, p in _layouts(ask, group)
        ):
            return [f"{v.ref} ({v.weights_bytes / GIB:.1f} GiB) on {group}"]
    return []


def plan(ask: Ask, cluster: list[NodeGroup], *, pp_across_types: bool = False) -> list[Plan]:
    """One plan per GPU type: tensor parallel never spans types; mixed clusters get independent instances per type
    behind a router, or (`pp_across_types`) one pipeline whose stages are the nodes of every type. Refuses only
    when no group can serve the model (naming the nearest plans)."""
    if pp_across_types:
        if len(cluster) == 1:
            raise ConfigError(
                f"--pp-across-types asks for one pipeline over several GPU types; {cluster[0]} is one",
                hint="leave it out: nodes of one type get pipeline parallel across them when needed",
            )
        return [plan_pipeline(ask, cluster)]
    plans, refusals, dropped = [], [], []
    for group in cluster:
        try:
            plans.append(plan_group(ask, group))
        except PlanRefused as err:
            refusals.append(err)
            dropped.append(
                f"{group} serves no replica, its {group.gpus} GPU(s) stay idle: {err.message} (nearest: "
                f"{err.nearest[0]})"
            )
    if plans and dropped:  # said on the first plan, where the cluster's summary is read
        plans[0] = dataclasses.replace(plans[0], warnings=[*plans[0].warnings, *dropped])
    if not plans:
        across = []
        if len(cluster) > 1:
            try:
                p = plan_pipeline(ask, cluster)
                across = [f"--pp-across-types (one pipeline over {p.label}, layers {p.layer_partition})"]
            except ConfigError:  # PlanRefused included: the pipeline does not fit either
                pass
        raise PlanRefused(refusals[0].message, across + [n for r in refusals for n in r.nearest])
    return plans


def partition(layers: int, shares: list[int]) -> tuple[int, ...]:
    """`layers` split over stages in proportion to `shares` (largest remainder first), at least one each."""
    if layers < len(shares):
        raise ValueError(f"{len(shares)} stages for {layers} layers")
    raw = [layers * x / sum(shares) for x in shares]
    parts = [max(1, int(r)) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: int(raw[i]) - raw[i])
    for i in itertools.cycle(by_remainder):
        if sum(parts) == layers:
            break
        if sum(parts) < layers:
            parts[i] += 1
        elif parts[i] > 1:
            parts[i] -= 1
    return tuple(parts)


def _stage_budgets(
    ask: Ask, stages: list[NodeGroup], tp: int, context: int
) -> tuple[tuple[int, ...], list[GPUMemory], int]:
    """(layer partition, per-stage budgets, sequences the tightest stage holds) of a TP-wide pipeline over
    `stages`: layers in proportion to each stage's usable memory, so that weights and KV fill them alike."""
    usable = [int(s.gpu.memory_bytes * ask.utilization) for s in stages]
    parts = partition(ask.shape.layers, usable)
    mems, seqs, first = [], ask.seqs_cap, 0
    for stage, room, layers in zip(stages, usable, parts, strict=True):
        weights = math.ceil(ask.weights_bytes * layers / ask.shape.layers / tp)
        runtime, _ = _runtime(ask, stage.gpu, tp, weights)
        mem = GPUMemory(stage.gpu.memory_bytes, room, weights, runtime, room - weights - runtime)
        per_seq = ask.shape.kv_bytes_for_layers(
            context, range(first, first + layers), tp=tp, kv_dtype=ask.kv_dtype
        )
        seqs = min(seqs, max(0, mem.kv_pool) // per_seq if per_seq else ask.seqs_cap)
        mems.append(mem)
        first += layers
    return parts, mems, seqs


def plan_pipeline(ask: Ask, cluster: list[NodeGroup]) -> Plan:
    """Pipeline parallel across GPU types (asked for): one stage per node, the same TP on each (never across
    types), stage sizes through vLLM's layer partition in proportion to each stage's usable memory.

    Raises:
        ConfigError: a cluster this layout cannot order (the first group must be one node: the first stage,
            where Ray's head and the API server run; the other stages one other type).
        PlanRefused: no TP size fits: with the nearest plans that do.
    """
    if len(cluster) != 2 or cluster[0].nodes != 1:
        raise ConfigError(
            f"pipeline parallel across GPU types takes one node of one type, then nodes of another; "
            f"got {'+'.join(map(str, cluster))}",
            hint="write the cluster as 1xGPUSxTYPE+NxGPUSxOTHER (the first node is the first stage), "
            "or leave out --pp-across-types for independent instances per type",
        )
    stages = [NodeGroup(1, g.gpus_per_node, g.gpu) for g in cluster for _ in range(g.nodes)]
    context = min(ask.context or ask.shape.max_context, ask.shape.max_context)
    label = "+".join(map(str, cluster))
    if len(stages) > ask.shape.layers:
        raise ConfigError(
            f"{len(stages)} pipeline stages for {ask.shape.layers} layers",
            hint="use fewer nodes, or independent instances per type",
        )
    narrowest = min(s.gpus_per_node for s in stages)
    # the widest TP that fits: a stage is a whole node (PP = nodes, TP = GPUs per node), so a narrower one idles GPUs
    for tp in sorted((t for t in ask.shape.tp_sizes(narrowest) if ask.tp in (None, t)), reverse=True):
        parts, mems, seqs = _stage_budgets(ask, stages, tp, context)
        if seqs < max(1, min(ask.concurrency, ask.seqs_cap)):
            continue
        pp = len(stages)
        reasons = [
            f"{s.gpu.name} stage: {n} of {ask.shape.layers} layers, {m.weights / GIB:.1f} GiB of weights and "
            f"{m.kv_pool / GIB:.1f} GiB of KV pool per GPU"
            for s, n, m in zip(stages, parts, mems, strict=True)
        ]
        reasons += [
            f"pipeline parallel {pp} across GPU types (asked for), layers in proportion to each stage's "
            f"usable memory: VLLM_PP_LAYER_PARTITION={','.join(map(str, parts))}; tensor parallel {tp} "
            "stays inside each node; expect pipeline bubbles, and run the containers with host networking "
            "so that Ray and NCCL reach each other"
        ]
        idle = sum(s.gpus_per_node for s in stages) - tp * pp
        if idle:
            limit = (
                f"--tensor-parallel-size {ask.tp} was asked for"
                if ask.tp is not None
                else f"the widest that divides the {ask.shape.attention_heads} attention / {ask.shape.kv_heads} KV "
                f"heads within the narrowest node's {narrowest} GPUs"
            )
            reasons.append(
                f"{idle} of {sum(s.gpus_per_node for s in stages)} GPUs stay idle: every stage runs "
                f"tensor parallel {tp} ({limit}), one stage per node"
            )
        warnings = [_fp8_warning(s.gpu) for s in cluster if ask.fp8_weights and not s.gpu.fp8_compute]
        per_token = ask.shape.kv_bytes_for_layers(1, range(parts[0]), tp=tp, kv_dtype=ask.kv_dtype)
        return Plan(
            cluster[0],
            tp,
            pp,
            1,
            context,
            int(seqs),
            mems[0],
            per_token,
            ask.kv_dtype,
            reasons,
            warnings + _memory_warnings(ask),
            ask.utilization,
            parts,
            tuple(stages),
            tuple(mems),
            batched_tokens=batched_tokens(ask, cluster[0].gpu),
            max_num_batched_tokens=ask.max_num_batched_tokens,
        )
    raise PlanRefused(
        f"{ask.shape.architecture} ({ask.weights_bytes / GIB:.1f} GiB of weights) at {context} tokens × "
        f"{ask.concurrency} sequences does not fit a pipeline over {label}",
        [n for g in cluster for n in nearest(ask, g)],
    )


# ---------------------------------------------------------------- what is planned: a GGUF or a checkpoint


@dataclass(frozen=True)
class Served:
    """What a plan serves: its real weight bytes, its shape, and whether it wants FP8 compute."""

    path: Path
    weights_bytes: int
    shape: ModelShape
    fp8_weights: bool


# Each count a plan reads, and the most any real model has, with margin: a config past it is damaged or made up
# (10**9 layers kept the planner searching for minutes), and is refused naming the field and the bound. The largest
# released decoders: 126 layers, 128 heads, hidden 16,384 and MLP 53,248 (Llama 3.1 405B); 262,144 tokens of
# vocabulary (Gemma 3); 10,485,760 tokens of context (Llama 4 Scout); MLA rank 512 (DeepSeek-V3); 8 active experts.
_LAYERS, _HEADS, _WIDTH, _MLP, _CONTEXT = 1_024, 1_024, 1 << 17, 1 << 20, 1 << 27
CONFIG_BOUNDS: dict[str, int] = {
    "num_hidden_layers": _LAYERS, "num_attention_heads": _HEADS, "num_key_value_heads": _HEADS,
    "hidden_size": _WIDTH, "n_embd": _WIDTH, "d_model": _WIDTH, "head_dim": 1 << 12,
    "max_position_embeddings": _CONTEXT, "sliding_window": _CONTEXT,
    "intermediate_size": _MLP, "ffn_dim": _MLP, "n_inner": _MLP, "moe_intermediate_size": _MLP,
    "shared_expert_intermediate_size": _MLP, "vocab_size": 1 << 22, "kv_lora_rank": 1 << 16,
    "qk_rope_head_dim": 1 << 12, "num_experts_per_tok": _HEADS, "moe_topk": _HEADS,
}
"""config.json's field → the largest value a plan takes."""
_GGUF_BOUNDS: dict[str, tuple[str, int]] = {
    "block_count": ("num_hidden_layers", 1), "attention.head_count": ("num_attention_heads", 1),
    "attention.head_count_kv": ("num_key_value_heads", 1), "embedding_length": ("hidden_size", 1),
    "attention.key_length": ("head_dim", 1), "context_length": ("max_position_embeddings", 1),
    "feed_forward_length": ("intermediate_size", 0), "attention.sliding_window": ("sliding_window", 0),
    "attention.kv_lora_rank": ("kv_lora_rank", 0), "rope.dimension_count": ("qk_rope_head_dim", 0),
    "vocab_size": ("vocab_size", 1), "expert_count": ("num_local_experts", 0),
    "expert_used_count": ("num_experts_per_tok", 0), "expert_feed_forward_length": ("moe_intermediate_size", 0),
    "expert_shared_feed_forward_length": ("shared_expert_intermediate_size", 0),
}
"""A GGUF's `<arch>.` key → (the config.json field it comes from, whose bound it takes; the least value it may
have: 1 where a 0 cannot be a model's, e.g. a context of 0 tokens)."""
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""The config fields that count a mixture of experts' experts (Mixtral and Llama 4, Qwen-MoE and OLMoE, DeepSeek,
ERNIE)."""
CONFIG_BOUNDS.update(dict.fromkeys(_EXPERT_COUNTS, 1 << 16))


def _gguf_counts(meta: dict[str, Any], arch: str, where: str) -> None:
    """Raises ConfigError naming the first `<arch>.` key a plan sizes by whose value is not a whole number (or a
    list of them) between its least (_GGUF_BOUNDS) and what any model has (CONFIG_BOUNDS)."""
    for name, (field_, least) in _GGUF_BOUNDS.items():
        key = f"{arch}.{name}"
        if key not in meta:
            continue
        value = meta[key]
        bound = CONFIG_BOUNDS[field_]
        # a per-layer list (llama.cpp's head_count_kv) may hold 0 for a layer without it, not only 0s
        values = value if isinstance(value, list) and value else [value]
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            problem = f"is {_shown(value)}, not a whole number"
        elif min(values) < 0:
            problem = f"is {_shown(value)}, below 0"
        elif max(values) < least:
            problem = f"is {_shown(value)}: a model has at least {least}"
        elif max(values) > bound:
            problem = f"is {max(values):,}: more than any model has (the planner takes at most {bound:,}, as {field_})"
        else:
            continue
        raise ConfigError(f"{where}: metadata {key} {problem}",
                          hint="its metadata is damaged: reconvert it with `modelmint convert NAME` (or "
                          "`modelmint pull NAME:TAG` again for a registered one)")


def shape_of_gguf(meta: dict[str, Any], where: str = "the GGUF") -> ModelShape:
    """The model's shape from a GGUF's metadata (llama.cpp's `<arch>.*` keys; `where`: the file, for messages).

    Raises:
        ConfigError: state-space layers, or keys missing, of the wrong type or out of bounds that size attention.
    """
    arch = str(meta.get(GGUFKey.ARCHITECTURE) or "?")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    # llama.cpp's keys of layers that keep a state per sequence (gguf-py constants.py: Keys.SSM, Keys.KDA, Keys.WKV,
    # Keys.ShortConv) or mix in linear attention (LLM.FULL_ATTENTION_INTERVAL, Qwen3-Next)
    stateful = [
        k
        for k in meta
        if k.startswith(tuple(f"{arch}.{p}." for p in ("ssm", "kda", "wkv", "shortconv")))
        or k == f"{arch}.full_attention_interval"
    ]
    if stateful:
        raise ConfigError(
            f"{arch} has state-space or hybrid layers (GGUF key {sorted(stateful)[0]}): the planner "
            "sizes only attention's per-token KV cache, not a fixed state per sequence",
            hint="plan it by hand from vLLM's logged KV cache size, or serve a transformer model",
        )
    _gguf_counts(meta, arch, where)
    if key("block_count") is None or key("attention.head_count") is None:
        raise ConfigError(
            f"{where}'s {arch}.block_count / {arch}.attention.head_count are missing",
            hint="reconvert it with `modelmint convert`",
        )
    layers, heads = int(key("block_count")), int(key("attention.head_count"))
    kv = key("attention.head_count_kv", heads)
    kv = max(kv) if isinstance(kv, list) else int(kv)
    _check_heads(arch, layers, heads, kv, "reconvert it with `modelmint convert`")
    if not key("attention.key_length") and not key("embedding_length"):
        raise ConfigError(f"{where} has neither {arch}.attention.key_length nor {arch}.embedding_length: the "
                          "planner cannot size its attention", hint="reconvert it with `modelmint convert`")
    head_dim = int(key("attention.key_length") or int(key("embedding_length")) // heads)
    window = key("attention.sliding_window")
    mla = None
    if key("attention.kv_lora_rank"):
        mla = int(key("attention.kv_lora_rank")) + int(key("rope.dimension_count") or 0)
    windows: tuple[int | None, ...] = (int(window),) * layers if window else ()
    ffn = key("feed_forward_length")
    widths = (
        _count(key("embedding_length")),
        _count(max(ffn) if isinstance(ffn, list) else ffn),
        _count(key("vocab_size") or len(meta.get(GGUFKey.TOKENS) or ())),
    )
    # absent: llama.cpp's own default for a model that does not say; a present 0 was refused above
    return ModelShape(
        arch, layers, heads, kv, head_dim, int(key("context_length") or 4096), windows, mla, *widths
    )


_SHARD = re.compile(r"^(.*)-00001-of-(\d{5})\.gguf$")


def _later_shards(path: Path) -> list[Path]:
    """The 2nd to last files of a GGUF llama-gguf-split wrote (`NAME-00001-of-0000N.gguf` names them all)."""
    m = _SHARD.match(path.name)
    if not m:
        return []
    return [
        path.with_name(f"{m.group(1)}-{i:05d}-of-{m.group(2)}.gguf") for i in range(2, int(m.group(2)) + 1)
    ]


# What a plan reads of a config.json (shape_of, its text_config too): the counts, and the fields that choose how.
# transformers' PretrainedConfig holds each count as an int.
_CONFIG_COUNTS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
                  "max_position_embeddings", "intermediate_size", "vocab_size", "sliding_window", "kv_lora_rank",
                  "qk_rope_head_dim", "num_experts_per_tok", "moe_intermediate_size",
                  "shared_expert_intermediate_size", "n_embd", "d_model", "ffn_dim", "n_inner", "moe_topk")
_CONFIG_KINDS: dict[str, tuple[type, ...]] = {"model_type": (str,), "architectures": (list,),
                                              "layer_types": (list,), "use_sliding_window": (bool,)}


def _refuse_damaged_config(config: dict[str, Any], path: Path) -> None:
    """Raises ConfigError naming the first field of `config` (read from `path`) that a plan reads and that is not
    what transformers writes there (a count that is not a whole number, or more than any model has: CONFIG_BOUNDS;
    a text_config that is not an object)."""
    hint = f"restore the checkpoint's config.json (`modelmint pull NAME:TAG` again for a registered one): {path}"
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError(f"{path}: text_config is {_shown(text)}, not an object", hint=hint)
    for where, scope in (("", config), ("text_config.", text or {})):
        for key in _CONFIG_COUNTS:
            v = scope.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"{path}: {where}{key} is {_shown(v)}, not a whole number", hint=hint)
        for key, bound in CONFIG_BOUNDS.items():
            v = scope.get(key)
            if isinstance(v, int) and v > bound:
                raise ConfigError(
                    f"{path}: {where}{key} is {v:,}: more than any model has (the planner takes at most {bound:,})",
                    hint=hint,
                )
        for key, kinds in _CONFIG_KINDS.items():
            v = scope.get(key)
            if v is not None and not isinstance(v, kinds):
                raise ConfigError(f"{path}: {where}{key} is {_shown(v)}, not a {kinds[0].__name__}", hint=hint)


def _shown(value: object) -> str:
    import json

    shown = json.dumps(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")


def _read_gguf(path: Path) -> tuple[dict[str, Any], int, int, set[int]]:
    """(the metadata a plan sizes by, tensor bytes, parameters, the N of its `blk.N.*` tensors) of a GGUF and the
    later files of its split, each read through the checked reader `modelmint inspect` uses (read_checked_gguf).

    Raises:
        ArtifactError: what inspect refuses (a damaged header, metadata of the wrong type, a truncated tensor).
        ConfigError: no tensors in any of its files.
    """
    from pipelines.core.ggufheader import read_checked_gguf

    info, header = read_checked_gguf(
        path,
        lambda k, found: (
            k in (GGUFKey.ARCHITECTURE, GGUFKey.TOKENS)
            or k.startswith(str(found.get(GGUFKey.ARCHITECTURE, "\0")) + ".")
        ),
    )
    weights, parameters = sum(t.nbytes for t in header.tensors), info.parameter_count
    names = [t.name for t in header.tensors]
    for shard in _later_shards(path):  # llama-gguf-split's other files hold the rest of the tensors
        more, part = read_checked_gguf(shard)
        weights += sum(t.nbytes for t in part.tensors)
        parameters += more.parameter_count
        names += [t.name for t in part.tensors]
    if not parameters:
        raise ConfigError(f"{path} holds no tensors: there are no weights to serve",
                          hint="reconvert it with `modelmint convert NAME` (or `modelmint pull NAME:TAG` again)")
    blocks = {int(m.group(1)) for m in map(_BLOCK_TENSOR.match, names) if m}
    return header.metadata, weights, parameters, blocks


def _check_blocks(shape: ModelShape, blocks: set[int], where: str) -> None:
    """A GGUF whose `<arch>.block_count` disagrees with the `blk.N` tensors it holds (llama.cpp refuses to load it,
    and a plan would size the KV cache of layers it does not have). One without per-layer tensors is left alone.

    Raises:
        ArtifactError: tensors of a layer past the count, or layers below it without tensors.
    """
    if not blocks:
        return
    key = f"{shape.architecture}.block_count"
    beyond = sorted(i for i in blocks if i >= shape.layers)
    missing = sorted(set(range(shape.layers)) - blocks)
    if beyond:
        raise ArtifactError(
            f"{where}: metadata {key} says {shape.layers} layers but it holds tensors of layer blk.{beyond[-1]} "
            f"({max(blocks) + 1} layers): its header contradicts its tensors",
            hint="rebuild it with `modelmint convert NAME` (or `modelmint pull NAME:TAG` again for a registered one)")
    if missing:
        raise ArtifactError(
            f"{where}: metadata {key} says {shape.layers} layers but it holds tensors of {len(blocks)} "
            f"(none for blk.{missing[0]}): its header contradicts its tensors",
            hint="rebuild it with `modelmint convert NAME` (or `modelmint pull NAME:TAG` again for a registered one)")


def _read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[Path, dict[str, Any]]]:
    """(config.json, each .safetensors file's header) of a checkpoint directory, the config checked.

    Raises:
        ConfigError: a config.json that is not JSON, not an object, or has a damaged field (_refuse_damaged_config).
        ArtifactError: a .safetensors header that does not read back.
    """
    import json

    from pipelines.core.safetensorsheader import read_safetensors_header

    restore = "restore the checkpoint's config.json, e.g. `modelmint pull NAME:TAG` again"
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ConfigError(f"{path / 'config.json'} is not valid JSON ({err})", hint=restore) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path / 'config.json'} is not a JSON object", hint=restore)
    _refuse_damaged_config(config, path / "config.json")
    return config, {f: read_safetensors_header(f) for f in sorted(path.glob("*.safetensors"))}


def _tensor_bytes(headers: dict[Path, dict[str, Any]]) -> int:
    """The bytes the tensors of .safetensors files take (their data ranges: the files less their headers)."""
    return sum(
        v["data_offsets"][1] - v["data_offsets"][0]
        for entries in headers.values()
        for k, v in entries.items()
        if k != "__metadata__"
    )


def served(path: Path) -> Served:
    """A GGUF file or a Hugging Face / compressed-tensors checkpoint directory, read for planning (headers only).

    Raises:
        ConfigError: neither, a config.json field a plan reads that is not what transformers writes there, GGUF
            metadata a plan reads that no model has, no weights, or an architecture the planner cannot size.
        ArtifactError: a file that is not what its name says, a GGUF `modelmint inspect` refuses, or one whose
            block_count disagrees with its `blk.N` tensors.
    """
    if path.is_file() and path.suffix == ".gguf":
        meta, weights, _, blocks = _read_gguf(path)
        # the file name, not its path: a refusal is recorded in the registered plans.json, which must not hold a
        # builder's directories (a rebuild elsewhere reproduces it byte for byte)
        shape = shape_of_gguf(meta, path.name)
        _check_blocks(shape, blocks, path.name)
        return Served(path, weights, shape, False)
    if path.is_dir() and (path / "config.json").is_file():
        config, headers = _read_checkpoint(path)
        weights = _tensor_bytes(headers)
        if not weights:
            raise ConfigError(
                f"{path} holds no .safetensors weights", hint="plan a complete checkpoint directory"
            )
        qc = config.get("quantization_config") or {}
        fp8 = qc.get("format") == "float-quantized" or qc.get("quant_method") == "fp8"
        return Served(path, weights, shape_of(config), fp8)
    raise ConfigError(
        f"{path} is neither a .gguf file nor a checkpoint directory with config.json",
        hint="give a registered name:tag (pulled), a .gguf, or a model directory",
    )


# ---------------------------------------------------------------- the config against the weights

PARAMETER_TOLERANCE = 2.0
"""How far the weights' parameter count may lie outside the range the config implies (ImpliedParameters) before a
plan is refused. The range already spans what the config does not say (a gated MLP or not, tied embeddings or not,
every layer a mixture of experts or every other one); the factor covers what it leaves out (a vision tower beside
the text model, MLA's projections, biases, quantization scales). A config whose layer count is doubled, or weights
with half their shards missing, fall outside."""


@dataclass(frozen=True)
class ImpliedParameters:
    """The parameters a model of a config's shape holds: at least `low`, at most `high` (None: the config does not
    say enough to bound it from above, e.g. a mixture of experts that does not count its experts)."""

    low: int
    high: int | None
    shape: str
    """The sizes it was computed from, as a reader checks them."""


def implied_parameters(
    *, layers: int, heads: int, kv_heads: int, head_dim: int, hidden: int, mlp_active: int, mlp_total: int | None,
    vocab: int,
) -> ImpliedParameters:
    """Parameters of a decoder of this shape: per layer the attention projections (Q and O of heads × head_dim, K
    and V of kv_heads × head_dim, each by hidden) and two (plain) to three (gated) MLP matrices by hidden of its
    width (every expert's: `mlp_total`; only the active ones' known: `mlp_active`, a low bound alone); the
    embedding once (tied) or twice. Norms and biases are left out (under 1 %)."""
    hidden = hidden or heads * head_dim
    attention = hidden * head_dim * 2 * (heads + kv_heads)
    low = vocab * hidden + layers * (attention + 2 * hidden * mlp_active)
    widths = mlp_total and vocab and mlp_total >= mlp_active
    high = 2 * vocab * hidden + layers * (attention + 3 * hidden * mlp_total) if widths and mlp_total else None
    mlp = f"MLP {mlp_total:,}" if mlp_total else f"active MLP {mlp_active:,}" if mlp_active else "no MLP width"
    return ImpliedParameters(
        low, high, f"{layers:,} layers, hidden {hidden:,}, {heads} × {head_dim} heads, {mlp}, vocab {vocab:,}"
    )


def _implied_by_config(config: dict[str, Any]) -> ImpliedParameters | None:
    """implied_parameters from a config.json (its text_config where it has one), None where it lacks the counts."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    layers, heads = _count(text.get("num_hidden_layers")), _count(text.get("num_attention_heads"))
    if not layers or not heads:
        return None
    kv = _count(text.get("num_key_value_heads")) or heads
    hidden = _count(text.get("hidden_size") or text.get("n_embd") or text.get("d_model"))
    head_dim = _count(text.get("head_dim")) or (hidden // heads)
    dense = _count(text.get("intermediate_size") or text.get("ffn_dim") or text.get("n_inner"))
    active = _count(text.get("num_experts_per_tok") or text.get("moe_topk"))
    per_expert = _count(text.get("moe_intermediate_size")) or dense
    shared = _count(text.get("shared_expert_intermediate_size")) + _count(text.get("n_shared_experts")) * per_expert
    experts = next((v for k in _EXPERT_COUNTS if isinstance(v := text.get(k), int) and v > 0), 0)
    if experts and per_expert:
        total: int | None = experts * per_expert + shared
        mlp_active = min(active or 1, experts) * per_expert + shared
    elif active:  # a mixture whose expert count the planner does not know: a low bound only
        total, mlp_active = None, active * per_expert + shared
    else:
        total = mlp_active = dense
    return implied_parameters(layers=layers, heads=heads, kv_heads=kv, head_dim=head_dim, hidden=hidden,
                              mlp_active=mlp_active, mlp_total=total, vocab=_count(text.get("vocab_size")))


def _implied_by_gguf(meta: dict[str, Any]) -> ImpliedParameters | None:
    """implied_parameters from a GGUF's `<arch>.` keys, None where it lacks the counts."""
    arch = str(meta.get(GGUFKey.ARCHITECTURE) or "?")

    def key(name: str) -> int:
        v = meta.get(f"{arch}.{name}")
        return _count(max(v, default=0) if isinstance(v, list) else v)

    layers, heads = key("block_count"), key("attention.head_count")
    if not layers or not heads:
        return None
    hidden = key("embedding_length")
    head_dim = key("attention.key_length") or hidden // heads
    experts, per_expert = key("expert_count"), key("expert_feed_forward_length") or key("feed_forward_length")
    shared = key("expert_shared_feed_forward_length") or key("expert_shared_count") * per_expert
    if experts and per_expert:
        total = experts * per_expert + shared
        active = min(key("expert_used_count") or 1, experts) * per_expert + shared
    else:
        total = active = key("feed_forward_length")
    vocab = key("vocab_size") or len(meta.get(GGUFKey.TOKENS) or ())
    return implied_parameters(layers=layers, heads=heads, kv_heads=key("attention.head_count_kv") or heads,
                              head_dim=head_dim, hidden=hidden, mlp_active=active, mlp_total=total, vocab=vocab)


_INT_BITS = {"I8": 8, "U8": 8, "I16": 16, "U16": 16, "I32": 32, "U32": 32, "I64": 64, "U64": 64}


def _stored_parameters(config: dict[str, Any], headers: dict[Path, dict[str, Any]]) -> int:
    """The parameters a checkpoint's tensors hold: their elements, with a packed integer tensor (compressed-tensors'
    `*_packed`, GPTQ's and AWQ's `qweight`) counted as the values it packs (its bits over the quantization's)."""
    qc = config.get("quantization_config")
    qc = qc if isinstance(qc, dict) else {}
    groups = qc.get("config_groups")
    groups = groups if isinstance(groups, dict) else {}
    widths = [g["weights"].get("num_bits") for g in groups.values()
              if isinstance(g, dict) and isinstance(g.get("weights"), dict)] + [qc.get("bits")]
    bits = min((b for b in widths if isinstance(b, int) and 0 < b <= 8), default=4)
    total = 0
    for entries in headers.values():
        for name, t in entries.items():
            if name == "__metadata__":
                continue
            n = math.prod(t["shape"])
            packed = name.endswith(("_packed", "qweight")) and t["dtype"] in _INT_BITS
            total += n * _INT_BITS[t["dtype"]] // bits if packed else n
    return total


def _figure(n: float) -> str:
    """A parameter count as people read one: 4,096, 1.5 M, 7.62 B."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n):,}"


def weights_mismatch(path: Path) -> str | None:
    """How the parameters of the weights at `path` (a GGUF's tensors, a checkpoint's .safetensors) contradict
    those its config implies (its config.json, the GGUF's metadata), beyond PARAMETER_TOLERANCE; None when they
    agree, or when the config lacks the counts (`served` names that).

    Raises:
        ConfigError, ArtifactError: a file `served` refuses as well.
    """
    if path.is_file() and path.suffix == ".gguf":
        meta, weights, stored, _ = _read_gguf(path)
        implied, config_is, held_in = _implied_by_gguf(meta), "its metadata implies", "its tensors hold"
    elif path.is_dir() and (path / "config.json").is_file():
        config, headers = _read_checkpoint(path)
        weights = _tensor_bytes(headers)
        stored, implied = _stored_parameters(config, headers), _implied_by_config(config)
        config_is, held_in = "config.json implies", f"its {len(headers)} .safetensors file(s) hold"
    else:
        return None
    if implied is None:
        return None
    low, high = implied.low / PARAMETER_TOLERANCE, implied.high and implied.high * PARAMETER_TOLERANCE
    if low <= stored and (high is None or stored <= high):
        return None
    expected = f"{_figure(implied.low)} to {_figure(implied.high)}" if implied.high else f"at least {_figure(implied.low)}"
    return (f"{config_is} {expected} parameters ({implied.shape}) but {held_in} {_figure(stored)} "
            f"({weights:,} bytes): more than a factor {PARAMETER_TOLERANCE:g} apart, so the config and the weights "
            "are not one model's")


def refuse_mismatched_weights(path: Path) -> None:
    """Raises ConfigError when the weights at `path` do not have the parameters its config implies
    (weights_mismatch): a plan would size a model that is not there."""
    problem = weights_mismatch(path)
    if problem:
        gguf = path.suffix == ".gguf"
        raise ConfigError(
            f"{path}: {problem}",
            hint="reconvert it with `modelmint convert NAME`" if gguf else "restore the checkpoint: its config.json "
            "and every shard its index names (`modelmint pull NAME:TAG` again for a registered one)",
        )


def require_kv_dtype(kv_dtype: str) -> None:
    """Raises ConfigError for a KV cache dtype the planner does not size (KV_BYTES)."""
    if kv_dtype not in KV_BYTES:
        raise ConfigError(f"unknown --kv-cache-dtype {kv_dtype!r}", hint=f"one of {', '.join(KV_BYTES)}")


def plan_path(
    path: Path, gpus: str, *, context: int | None = None, concurrency: int = 1, kv_dtype: str = "auto",
    smaller: tuple[Variant, ...] = (), utilization: float = GPU_MEMORY_UTILIZATION, tp: int | None = None,
    max_num_batched_tokens: int | None = None, pp_across_types: bool = False,
) -> tuple[Served, list[Plan]]:
    """What `modelmint plan` plans: the GGUF or checkpoint directory at `path` (sized by `served`) on `gpus` (a
    cluster text or an inventory file, `cluster_of`), with the asked context, concurrency and vLLM settings.

    Raises:
        ConfigError: an unknown KV dtype, an ask vLLM would refuse (Ask), what `served` refuses, weights whose
            parameters its config contradicts (weights_mismatch), or PlanRefused (nothing fits: its hint names the
            nearest plans that do).
        ArtifactError: a GGUF whose tensors contradict its declared architecture (it would be sized as another
            model), or a file that is not what its name says.
    """
    require_kv_dtype(kv_dtype)
    what = served_checked(path)
    return what, plan_served(what, gpus, context=context, concurrency=concurrency, kv_dtype=kv_dtype,
                             smaller=smaller, utilization=utilization, tp=tp,
                             max_num_batched_tokens=max_num_batched_tokens, pp_across_types=pp_across_types)


def served_checked(path: Path) -> Served:
    """`served(path)`, refused where its tensors contradict its declared architecture or its config's parameters.

    Raises:
        ConfigError, ArtifactError: as `plan_path`'s, for the file.
    """
    from pipelines.core.ggufheader import refuse_contradicting_architecture

    if path.is_file() and path.suffix == ".gguf":
        refuse_contradicting_architecture(path)
    what = served(path)
    refuse_mismatched_weights(path)
    return what


def plan_served(
    what: Served, gpus: str, *, context: int | None = None, concurrency: int = 1, kv_dtype: str = "auto",
    smaller: tuple[Variant, ...] = (), utilization: float = GPU_MEMORY_UTILIZATION, tp: int | None = None,
    max_num_batched_tokens: int | None = None, pp_across_types: bool = False,
) -> list[Plan]:
    """`plan_path`'s plans for a model already sized (`served`, or a registered manifest's recorded shape when its
    bytes are not in the checkout).

    Raises:
        ConfigError: an unknown KV dtype, an ask vLLM would refuse (Ask), or PlanRefused (nothing fits).
    """
    require_kv_dtype(kv_dtype)
    ask = Ask(what.weights_bytes, what.shape, context=context, concurrency=concurrency, kv_dtype=kv_dtype,
              fp8_weights=what.fp8_weights, smaller=smaller, utilization=utilization, tp=tp,
              max_num_batched_tokens=max_num_batched_tokens)
    return plan(ask, cluster_of(gpus), pp_across_types=pp_across_types)
