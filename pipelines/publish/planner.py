"""The serving planner: how to serve a model variant on the GPUs a team has (pure: no I/O beyond reading files
it is handed, no toolchain).

The rules are the deployment handbooks' (../DESIGN.md, "The VRAM planner"), made exact where the model allows:

- weights per GPU come from the artifact's real tensor bytes, split over tensor-parallel ranks and pipeline
  stages; activations are a share of them (25 % unless measured); usable memory is GPU memory ×
  gpu_memory_utilization (0.90); what is left is the KV pool;
- KV bytes per token come from the model's config.json, per architecture: 2 × layers × KV heads × head dim ×
  bytes for full attention (KV heads split over TP ranks, never below one per rank), layers with a sliding
  window hold at most their window, MLA models cache kv_lora_rank + rope dims once per layer (no × 2, the same
  on every TP rank); an architecture it cannot size (state-space or hybrid layers) is refused by name;
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
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.core.errors import ConfigError
from pipelines.core.gpus import GIB as GIB
from pipelines.core.gpus import GPU as GPU
from pipelines.core.gpus import GPUS_FILE as GPUS_FILE
from pipelines.core.gpus import NodeGroup as NodeGroup
from pipelines.core.gpus import cluster_of as cluster_of
from pipelines.core.gpus import gpu as gpu
from pipelines.core.gpus import known_gpus as known_gpus
from pipelines.core.gpus import load_inventory as load_inventory
from pipelines.core.gpus import parse_cluster as parse_cluster

GPU_MEMORY_UTILIZATION = 0.90
ACTIVATION_SHARE = 0.25
"""Activations as a share of the per-GPU weights (the handbooks' inference heuristic), unless measured."""
MAX_NUM_SEQS = 256
"""vLLM's default max_num_seqs: the planner never asks for more concurrency than that."""
KV_BYTES = {"auto": 2, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


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

    def kv_bytes_per_sequence(self, tokens: int, *, tp: int = 1, pp: int = 1, kv_dtype: str = "auto") -> int:
        """KV cache bytes one sequence of `tokens` needs on one GPU of a TP × PP layout (the largest stage)."""
        # the first stage's layers (the largest one when layers do not divide evenly)
        return self.kv_bytes_for_layers(tokens, range(math.ceil(self.layers / pp)), tp=tp, kv_dtype=kv_dtype)

    def kv_bytes_for_layers(self, tokens: int, layers: range, *, tp: int = 1, kv_dtype: str = "auto") -> int:
        """KV cache bytes one sequence of `tokens` needs in `layers` (one pipeline stage's) on one TP rank."""
        elem = KV_BYTES[kv_dtype]
        windows = self.windows or (None,) * self.layers
        per_layer_tokens = [min(tokens, w) if w else tokens for w in windows[layers.start:layers.stop]]
        if self.mla_dims is not None:
            return sum(per_layer_tokens) * self.mla_dims * elem
        kv_per_rank = max(1, self.kv_heads // tp)
        return sum(per_layer_tokens) * 2 * kv_per_rank * self.head_dim * elem

    def kv_bytes_per_token(self, *, tp: int = 1, pp: int = 1, kv_dtype: str = "auto") -> int:
        """Per token of a sequence no longer than any window (the figure vLLM's KV spec gives per page slot)."""
        return self.kv_bytes_per_sequence(1, tp=tp, pp=pp, kv_dtype=kv_dtype)

    def tp_sizes(self, limit: int) -> list[int]:
        """Tensor-parallel sizes up to `limit` that vLLM accepts: dividing the attention heads, and the KV heads
        dividing them or divided by them."""
        return [t for t in range(1, limit + 1) if self.attention_heads % t == 0
                and (self.kv_heads % t == 0 or t % self.kv_heads == 0)]


_STATE_SPACE = ("mamba", "ssm", "linear_attention", "rwkv", "jamba", "zamba", "nemotron_h", "falcon_h1", "granitemoehybrid",
                "qwen3_next", "lfm2")


def _hybrid_layers(text: dict[str, Any], layer_types: list[str]) -> bool:
    """Whether the config declares any layer that is not (full or sliding-window) softmax attention.

    Read from the keys hybrid configs carry, not from a list of names: `layer_types` (Qwen3-Next, LFM2),
    `layers_block_type` (Bamba, Jamba), `block_types` (RecurrentGemma), `linear_attn_config` (Kimi-Linear),
    `attn_type_list` (MiniMax, 0 marks a linear layer).
    """
    attention = {"attention", "full_attention", "sliding_attention", "chunked_attention"}
    kinds = layer_types + [str(t) for t in (text.get("layers_block_type") or []) + (text.get("block_types") or [])]
    if any(k not in attention for k in kinds):
        return True
    return bool(text.get("linear_attn_config")) or 0 in (text.get("attn_type_list") or [])


def _check_heads(arch: str, layers: int, heads: int, kv: int, hint: str) -> None:
    """Refuse head counts no attention layer can have: vLLM would fail loading them, so no plan may hold them."""
    for name, value in (("num_hidden_layers", layers), ("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if value <= 0:
            raise ConfigError(f"{arch}'s {name} is {value}: the planner cannot size its attention", hint=hint)
    if kv > heads or heads % kv:
        raise ConfigError(f"{arch}'s {kv} KV heads do not divide {heads} attention heads "
                          f"(grouped-query attention needs a divisor): the config is damaged", hint=hint)


def shape_of(config: dict[str, Any]) -> ModelShape:
    """The model's shape from its config.json (a multimodal config's `text_config` when it has one).

    Raises:
        ConfigError: an architecture the planner cannot size (state-space or hybrid layers), or a config that
            lacks what sizes attention.
    """
    text = config.get("text_config") or config
    arch = (config.get("architectures") or [config.get("model_type", "?")])[0]
    model_type = str(text.get("model_type") or config.get("model_type") or "").lower()
    layer_types = [str(t) for t in text.get("layer_types") or []]
    if any(s in model_type for s in _STATE_SPACE) or _hybrid_layers(text, layer_types):
        raise ConfigError(f"{arch} has state-space or hybrid layers: the planner cannot size its cache yet",
                          hint="plan it by hand from vLLM's logged KV cache size, or serve a transformer model")
    hint = "check the checkpoint's config.json (num_hidden_layers, num_attention_heads, num_key_value_heads)"
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{arch}'s config.json lacks {err}: the planner cannot size its attention",
                          hint=hint) from None
    try:
        # absent means one KV head per attention head (multi-head attention); a present 0 is a damaged config
        kv = heads if text.get("num_key_value_heads") is None else int(text["num_key_value_heads"])
    except (TypeError, ValueError):
        raise ConfigError(f"{arch}'s config.json num_key_value_heads is {text.get('num_key_value_heads')!r}, "
                          f"not a count", hint=hint) from None
    _check_heads(arch, layers, heads, kv, hint)
    try:
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        ctx = int(text.get("max_position_embeddings") or 4096)
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{arch}'s config.json lacks a usable {err} (head_dim or hidden_size, "
                          f"max_position_embeddings): the planner cannot size its attention", hint=hint) from None
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
    return ModelShape(arch, layers, heads, kv, head_dim, ctx, windows, mla)


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
    activation_share: float = ACTIVATION_SHARE
    fp8_weights: bool = False
    """The variant is FP8 W8A8 (it wants FP8 compute)."""
    smaller: tuple[Variant, ...] = ()
    """The model's other registered variants (a refusal suggests the largest smaller one that fits)."""

    def __post_init__(self) -> None:
        # 0 once meant "the maximum" by falling through `context or max_context`: say so instead of guessing
        if self.context is not None and self.context < 1:
            raise ConfigError(f"--context {self.context} is no context: a sequence holds at least one token",
                              hint=f"omit --context for the model's maximum ({self.shape.max_context}), "
                                   f"or give a positive number of tokens")
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency {self.concurrency}: at least one sequence is served",
                              hint="give --concurrency 1 or more")


def _budget(ask: Ask, g: GPU, tp: int, pp: int) -> GPUMemory:
    total = g.memory_bytes
    usable = int(total * ask.utilization)
    weights = math.ceil(ask.weights_bytes / (tp * pp))
    activations = int(weights * ask.activation_share)
    return GPUMemory(total, usable, weights, activations, usable - weights - activations)


def _fits(ask: Ask, group: NodeGroup, tp: int, pp: int) -> tuple[GPUMemory, int, int] | None:
    """(memory, max_model_len, max_num_seqs) when a TP × PP replica serves `ask` on `group`'s GPUs, else None."""
    mem = _budget(ask, group.gpu, tp, pp)
    if mem.kv_pool <= 0:
        return None
    context = min(ask.context or ask.shape.max_context, ask.shape.max_context)
    per_seq = ask.shape.kv_bytes_per_sequence(context, tp=tp, pp=pp, kv_dtype=ask.kv_dtype)
    seqs = mem.kv_pool // per_seq if per_seq else MAX_NUM_SEQS
    if seqs < 1:
        return None
    return mem, context, int(min(seqs, MAX_NUM_SEQS))


def _serves(ask: Ask, group: NodeGroup, tp: int, pp: int) -> tuple[GPUMemory, int, int] | None:
    """_fits, and enough sequences for the asked concurrency."""
    fit = _fits(ask, group, tp, pp)
    return fit if fit is not None and fit[2] >= min(ask.concurrency, MAX_NUM_SEQS) else None


def _layouts(ask: Ask, group: NodeGroup) -> list[tuple[int, int]]:
    """TP × PP layouts on `group`, fewest GPUs first: one node's TP sizes, then PP across its nodes."""
    tps = ask.shape.tp_sizes(group.gpus_per_node)
    out = [(t, 1) for t in tps]
    if group.nodes > 1:
        out += [(t, p) for p in range(2, group.nodes + 1) for t in tps if p <= ask.shape.layers]
    return sorted(out, key=lambda tp_pp: (tp_pp[0] * tp_pp[1], tp_pp[1]))


def plan_group(ask: Ask, group: NodeGroup) -> Plan:
    """The smallest layout of `group`'s GPUs that serves `ask` at its context and concurrency (as many replicas
    as the group holds).

    Raises:
        PlanRefused: none fits: with the nearest plans that do.
    """
    context = min(ask.context or ask.shape.max_context, ask.shape.max_context)
    if ask.context and ask.context > ask.shape.max_context:
        raise ConfigError(f"a context of {ask.context} tokens is longer than {ask.shape.architecture} supports "
                          f"({ask.shape.max_context})", hint=f"ask for --context {ask.shape.max_context} or less")
    for tp, pp in _layouts(ask, group):
        fit = _serves(ask, group, tp, pp)
        if fit is None:
            continue
        mem, max_len, seqs = fit
        replicas = max(1, group.gpus // (tp * pp)) if pp == 1 else max(1, group.nodes // pp)
        reasons = _reasons(ask, group, tp, pp, mem, replicas)
        warnings = [_fp8_warning(group.gpu)] if ask.fp8_weights and not group.gpu.fp8_compute else []
        per_token = ask.shape.kv_bytes_per_token(tp=tp, pp=pp, kv_dtype=ask.kv_dtype)
        return Plan(group, tp, pp, replicas, max_len, seqs, mem, per_token, ask.kv_dtype, reasons, warnings,
                    ask.utilization)
    raise PlanRefused(f"{ask.shape.architecture} ({ask.weights_bytes / GIB:.1f} GiB of weights) at {context} tokens × "
                      f"{ask.concurrency} sequences does not fit {group}", nearest(ask, group))


def _fp8_warning(g: GPU) -> str:
    return (f"{g.name} (compute capability {g.compute_capability}) has no FP8 compute: vLLM runs this FP8 checkpoint "
            "as weight-only W8A16 (Marlin), slower and not for MoE; AWQ (W4A16) runs natively on it")


def _reasons(ask: Ask, group: NodeGroup, tp: int, pp: int, mem: GPUMemory, replicas: int) -> list[str]:
    g = group.gpu
    out = [f"weights {ask.weights_bytes / GIB:.1f} GiB over {tp * pp} GPU(s): {mem.weights / GIB:.1f} GiB each; "
           f"activations {ask.activation_share:.0%} of that; {g.memory_gib:g} GiB × {ask.utilization:.2f} usable leaves "
           f"{mem.kv_pool / GIB:.1f} GiB of KV pool per GPU"]
    if tp > 1:
        out.append(f"tensor parallel {tp} inside one node of {group.gpus_per_node} {g.name} ({g.interconnect}): "
                   f"{ask.shape.attention_heads} attention / {ask.shape.kv_heads} KV heads divide by it")
    else:
        out.append("one GPU holds a replica: no tensor parallel (no all-reduce per layer)")
    if pp > 1:
        out.append(f"pipeline parallel {pp} across nodes ({math.ceil(ask.shape.layers / pp)} of {ask.shape.layers} "
                   "layers per stage, Ray backend): tensor parallel never crosses a node")
    if replicas > 1:
        out.append(f"{replicas} independent replicas behind a router use all {group.gpus} GPUs")
    return out


def _more_gpus(ask: Ask, group: NodeGroup, g: GPU) -> str | None:
    """The smallest cluster of `g` GPUs from `group`'s size up (more GPUs in its nodes up to 8, more nodes up to 7
    more) that serves `ask`, as --gpus writes it: fewest GPUs first, then fewest nodes (TP inside a node before PP
    across nodes)."""
    per_node = sorted({group.gpus_per_node, *(k for k in (2, 4, 8) if k > group.gpus_per_node)})
    candidates = sorted((NodeGroup(n, k, g) for n in range(group.nodes, group.nodes + 8) for k in per_node),
                        key=lambda c: (c.gpus, c.nodes))
    for bigger in candidates:
        if str(bigger) != str(group) and any(_serves(ask, bigger, t, p) for t, p in _layouts(ask, bigger)):
            return f"--gpus {bigger}"
    return None


def _longest_context(ask: Ask, pool: int, tp: int, pp: int) -> int:
    """The longest context, a multiple of 256, whose `ask.concurrency` sequences fit `pool` (0: not even 256).

    Searched, not divided: sliding-window layers cap their tokens, so a sequence's bytes grow slower than its length.
    """
    def fits(tokens: int) -> bool:
        return ask.shape.kv_bytes_per_sequence(tokens, tp=tp, pp=pp, kv_dtype=ask.kv_dtype) * ask.concurrency <= pool

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
    for tp, pp in _layouts(ask, group):
        mem = _budget(ask, group.gpu, tp, pp)
        if mem.kv_pool <= 0:
            continue
        tokens = _longest_context(ask, mem.kv_pool, tp, pp)
        if tokens >= 256:
            out.append(f"--context {tokens} on {group} (TP {tp} × PP {pp})")
            break
    for g in sorted(known_gpus().values(), key=lambda g: g.memory_gib):
        found = None if out or g.memory_gib <= group.gpu.memory_gib else _more_gpus(ask, group, g)
        if found:
            out.append(found)
    if not out:
        out.append("a smaller variant of the same model (`modelmint list` shows what is registered): no cluster of "
                   "up to 8 more nodes of 8 of any known GPU holds this one")
    return out


def smaller_ask(ask: Ask, variant: Variant) -> Ask:
    """`ask` for another variant of the same model (same shape, context and concurrency)."""
    return dataclasses.replace(ask, weights_bytes=variant.weights_bytes, fp8_weights=variant.fp8_weights, smaller=())


def _smaller_variant(ask: Ask, group: NodeGroup) -> list[str]:
    """The largest smaller registered variant that serves `ask` on `group`, as a suggestion."""
    for v in sorted(ask.smaller, key=lambda v: -v.weights_bytes):
        if v.weights_bytes < ask.weights_bytes and any(
                _serves(smaller_ask(ask, v), group, t, p) for t, p in _layouts(ask, group)):
            return [f"{v.ref} ({v.weights_bytes / GIB:.1f} GiB) on {group}"]
    return []


def plan(ask: Ask, cluster: list[NodeGroup], *, pp_across_types: bool = False) -> list[Plan]:
    """One plan per GPU type: tensor parallel never spans types; mixed clusters get independent instances per type
    behind a router, or (`pp_across_types`) one pipeline whose stages are the nodes of every type. Refuses only
    when no group can serve the model (naming the nearest plans)."""
    if pp_across_types:
        if len(cluster) == 1:
            raise ConfigError(f"--pp-across-types asks for one pipeline over several GPU types; {cluster[0]} is one",
                              hint="leave it out: nodes of one type get pipeline parallel across them when needed")
        return [plan_pipeline(ask, cluster)]
    plans, refusals = [], []
    for group in cluster:
        try:
            plans.append(plan_group(ask, group))
        except PlanRefused as err:
            refusals.append(err)
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


def _stage_budgets(ask: Ask, stages: list[NodeGroup], tp: int, context: int) -> tuple[tuple[int, ...],
                                                                                      list[GPUMemory], int]:
    """(layer partition, per-stage budgets, sequences the tightest stage holds) of a TP-wide pipeline over
    `stages`: layers in proportion to each stage's usable memory, so that weights and KV fill them alike."""
    usable = [int(s.gpu.memory_bytes * ask.utilization) for s in stages]
    parts = partition(ask.shape.layers, usable)
    mems, seqs, first = [], MAX_NUM_SEQS, 0
    for stage, room, layers in zip(stages, usable, parts, strict=True):
        weights = math.ceil(ask.weights_bytes * layers / ask.shape.layers / tp)
        activations = int(weights * ask.activation_share)
        mem = GPUMemory(stage.gpu.memory_bytes, room, weights, activations, room - weights - activations)
        per_seq = ask.shape.kv_bytes_for_layers(context, range(first, first + layers), tp=tp, kv_dtype=ask.kv_dtype)
        seqs = min(seqs, max(0, mem.kv_pool) // per_seq if per_seq else MAX_NUM_SEQS)
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
        raise ConfigError(f"pipeline parallel across GPU types takes one node of one type, then nodes of another; "
                          f"got {'+'.join(map(str, cluster))}",
                          hint="write the cluster as 1xGPUSxTYPE+NxGPUSxOTHER (the first node is the first stage), "
                               "or leave out --pp-across-types for independent instances per type")
    stages = [NodeGroup(1, g.gpus_per_node, g.gpu) for g in cluster for _ in range(g.nodes)]
    context = min(ask.context or ask.shape.max_context, ask.shape.max_context)
    label = "+".join(map(str, cluster))
    if len(stages) > ask.shape.layers:
        raise ConfigError(f"{len(stages)} pipeline stages for {ask.shape.layers} layers",
                          hint="use fewer nodes, or independent instances per type")
    for tp in ask.shape.tp_sizes(min(s.gpus_per_node for s in stages)):
        parts, mems, seqs = _stage_budgets(ask, stages, tp, context)
        if seqs < max(1, min(ask.concurrency, MAX_NUM_SEQS)):
            continue
        pp = len(stages)
        reasons = [f"{s.gpu.name} stage: {n} of {ask.shape.layers} layers, {m.weights / GIB:.1f} GiB of weights and "
                   f"{m.kv_pool / GIB:.1f} GiB of KV pool per GPU" for s, n, m in zip(stages, parts, mems, strict=True)]
        reasons += [f"pipeline parallel {pp} across GPU types (asked for), layers in proportion to each stage's "
                    f"usable memory: VLLM_PP_LAYER_PARTITION={','.join(map(str, parts))}; tensor parallel {tp} "
                    "stays inside each node; expect pipeline bubbles, and run the containers with host networking "
                    "so that Ray and NCCL reach each other"]
        warnings = [_fp8_warning(s.gpu) for s in cluster if ask.fp8_weights and not s.gpu.fp8_compute]
        per_token = ask.shape.kv_bytes_for_layers(1, range(parts[0]), tp=tp, kv_dtype=ask.kv_dtype)
        return Plan(cluster[0], tp, pp, 1, context, int(seqs), mems[0], per_token, ask.kv_dtype, reasons, warnings,
                    ask.utilization, parts, tuple(stages), tuple(mems))
    raise PlanRefused(f"{ask.shape.architecture} ({ask.weights_bytes / GIB:.1f} GiB of weights) at {context} tokens × "
                      f"{ask.concurrency} sequences does not fit a pipeline over {label}",
                      [n for g in cluster for n in nearest(ask, g)])


# ---------------------------------------------------------------- what is planned: a GGUF or a checkpoint


@dataclass(frozen=True)
class Served:
    """What a plan serves: its real weight bytes, its shape, and whether it wants FP8 compute."""

    path: Path
    weights_bytes: int
    shape: ModelShape
    fp8_weights: bool


def shape_of_gguf(meta: dict[str, Any]) -> ModelShape:
    """The model's shape from a GGUF's metadata (llama.cpp's `<arch>.*` keys).

    Raises:
        ConfigError: state-space layers, or keys missing that size attention.
    """
    arch = str(meta.get("general.architecture") or "?")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    if any(k.startswith(f"{arch}.ssm.") for k in meta):
        raise ConfigError(f"{arch} has state-space layers: the planner cannot size its cache yet",
                          hint="plan it by hand from vLLM's logged KV cache size, or serve a transformer model")
    try:
        layers, heads = int(key("block_count")), int(key("attention.head_count"))
    except (TypeError, ValueError):
        raise ConfigError(f"the GGUF's {arch}.block_count / {arch}.attention.head_count are missing",
                          hint="reconvert it with `modelmint convert`") from None
    kv = key("attention.head_count_kv", heads)
    kv = max(kv) if isinstance(kv, list) else int(kv)
    _check_heads(arch, layers, heads, kv, "reconvert it with `modelmint convert`")
    head_dim = int(key("attention.key_length") or int(key("embedding_length")) // heads)
    window = key("attention.sliding_window")
    mla = None
    if key("attention.kv_lora_rank"):
        mla = int(key("attention.kv_lora_rank")) + int(key("rope.dimension_count") or 0)
    windows: tuple[int | None, ...] = (int(window),) * layers if window else ()
    return ModelShape(arch, layers, heads, kv, head_dim, int(key("context_length") or 4096), windows, mla)


_SHARD = re.compile(r"^(.*)-00001-of-(\d{5})\.gguf$")


def _later_shards(path: Path) -> list[Path]:
    """The 2nd to last files of a GGUF llama-gguf-split wrote (`NAME-00001-of-0000N.gguf` names them all)."""
    m = _SHARD.match(path.name)
    if not m:
        return []
    return [path.with_name(f"{m.group(1)}-{i:05d}-of-{m.group(2)}.gguf") for i in range(2, int(m.group(2)) + 1)]


def served(path: Path) -> Served:
    """A GGUF file or a Hugging Face / compressed-tensors checkpoint directory, read for planning (headers only).

    Raises:
        ConfigError: neither, or an architecture the planner cannot size.
        ArtifactError: a file that is not what its name says.
    """
    import json

    from pipelines.core.ggufheader import read_gguf_header
    from pipelines.source.fetch import read_safetensors_header

    if path.is_file() and path.suffix == ".gguf":
        header = read_gguf_header(path, lambda k, found: k == "general.architecture" or
                                  k.startswith(str(found.get("general.architecture", "\0")) + "."))
        weights = sum(t.nbytes for t in header.tensors)
        for shard in _later_shards(path):  # llama-gguf-split's other files hold the rest of the tensors
            weights += sum(t.nbytes for t in read_gguf_header(shard, lambda k, found: False).tensors)
        return Served(path, weights, shape_of_gguf(header.metadata), False)
    if path.is_dir() and (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise ConfigError(f"{path / 'config.json'} is not valid JSON ({err})",
                              hint="restore the checkpoint's config.json, e.g. `modelmint pull NAME:TAG` again") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{path / 'config.json'} is not a JSON object",
                              hint="restore the checkpoint's config.json, e.g. `modelmint pull NAME:TAG` again")
        weights = 0
        for f in sorted(path.glob("*.safetensors")):
            header = read_safetensors_header(f)
            weights += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
        if not weights:
            raise ConfigError(f"{path} holds no .safetensors weights", hint="plan a complete checkpoint directory")
        qc = config.get("quantization_config") or {}
        fp8 = qc.get("format") == "float-quantized" or qc.get("quant_method") == "fp8"
        return Served(path, weights, shape_of(config), fp8)
    raise ConfigError(f"{path} is neither a .gguf file nor a checkpoint directory with config.json",
                      hint="give a registered name:tag (pulled), a .gguf, or a model directory")
