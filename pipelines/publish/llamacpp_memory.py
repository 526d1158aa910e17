"""What llama.cpp allocates to serve a GGUF (weights per offloaded layer, KV cache, output and compute buffers), read
against llama-server's own load log, and how many layers Ollama offloads to the GPUs it is given.

llama.cpp (the pinned tree, 0c1e570; paths under the toolchain's llama.cpp/):

- Layers on a device: `-ngl N` counts the output layer as one more layer (llama_model::n_gpu_layers, "plus 1 for
  the output layer", src/llama-model.cpp:2002-2005); the layers il >= n_layer + 1 - N go to the GPUs, il == n_layer
  being the output layer (output_norm, output), so N = 1 offloads the output layer alone and N = n_layer + 1 all
  of them (src/llama-model.cpp:1589-1614). The input layer (token_embd) always stays on the CPU ("very little
  benefit to offloading the input layer", src/llama-model.cpp:1604-1605). A model whose output shares the token
  embedding creates it again as the output layer's tensor (TENSOR_DUPLICATED, src/models/qwen2.cpp:30,
  src/models/llama.cpp:45), reused only where the output layer's buffer type is the input's
  (src/llama-model-loader.cpp:1370-1377): an offloaded output layer holds a second copy of the embedding.
- Weights: the CPU backend maps the file; its `CPU_Mapped model buffer` spans the first to the last byte of the
  tensors it holds (llama_model_loader::get_mapping_range, src/llama-model-loader.cpp:1449-1464), which is the sum
  of their sizes when nothing is repacked. With repacking on (the default), weights the CPU kernels interleave are
  copied into a `CPU_REPACK` buffer while the map still spans them: host memory then exceeds the file's tensors by
  the repacked ones (`--no-repack` gives the sum). A GPU backend holds the bytes of its layers' tensors.
- Context: n_ctx is rounded up to a multiple of 256; without a unified KV cache each of the n_seq_max
  (`-np`) sequences gets n_ctx_seq = pad(n_ctx / n_seq_max, 256) cells and n_ctx becomes n_ctx_seq * n_seq_max
  (src/llama-context.cpp:289-305): `-c` is the total over the slots, unlike Ollama's num_ctx per slot.
- KV cache: per layer one K tensor [n_embd_k_gqa, kv_size, n_stream] and one V tensor alike, in the cache types
  (src/llama-kv-cache.cpp:233-234), kv_size = n_ctx_seq (llama_kv_cache's construction for a plain attention
  model, src/llama-model.cpp:2859-2869) and n_stream = n_seq_max unless unified (src/llama-kv-cache.cpp:84):
  n_ctx * n_layer * n_head_kv * (head_dim_k * bytes(type_k) + head_dim_v * bytes(type_v)), a quantized type taking
  its block bytes per block (q8_0: 34 B per 32 values, q4_0: 18 B per 32). Each layer's K/V lives on that layer's
  device.
- Output buffer: reserved at load for n_seq_max outputs (output_reserve(params.n_seq_max), src/llama-context.cpp:377;
  n_outputs_max = max(n_outputs, n_seq_max), :2120): n_vocab * n_seq_max floats of logits (:2141), in the host
  buffer type of the output layer's device (:2190-2196).
- Compute buffer: the peak of the graph reserved for one ubatch of n_ubatch tokens (sched_reserve, graph_reserve at
  src/llama-context.cpp:896-898; ggml-alloc reuses a freed tensor's memory, so the buffer is the largest set of
  tensors alive at once). n_batch = min(n_ctx, -b) and n_ubatch = min(n_batch, -ub) (:246-248). Fitted on the CPU
  backend's logs of tiny-qwen2 and SmolLM2-135M (two shapes; benchmarks/bench_llamacpp_memory.py holds every case and
  its residual): with flash attention (the default `auto` turns it on there) n_ubatch * (4 * (3 * n_ff + 3 * n_embd)
  + 2 * n_ctx_seq + 24) bytes, one layer's FFN activations and the f16 mask over one sequence's cells, plus n_ubatch
  * 4 * n_embd with a float V cache, or 16 KiB for each quantized K or V cache; without flash attention the KQ
  scores of every head and an f32 mask are materialised: n_ubatch * (n_ctx_seq * (4 * n_head + 4) + 4 * (3 * n_embd
  + n_ff) + 24). The output stage (n_vocab logits per output) is the peak only where outputs are many. GPU backends
  differ: a CUDA/Metal buffer holds the graph of the layers it runs (the kernels' scratch besides), the host keeps a
  smaller `CUDA_Host` compute buffer for the inputs, and under partial offload the GPU's buffer also stages the
  CPU-resident weights it multiplies large batches with (op offload); budget those from that backend's own log.

Ollama (its llama.cpp engine's estimate; ollama/ollama at 3258a89b6e4c, the last commit holding it whole):

- It loads each model with numParallel = OLLAMA_NUM_PARALLEL (at least 1; 1 for embedding models,
  server/sched.go:386-392) and asks llama.cpp for a KV cache of num_ctx * numParallel cells (KvSize,
  llm/server.go:179); its estimate sizes the KV for context = num_ctx * numParallel (fs/ggml/ggml.go:551) at 2 B per
  value for f16, 1 for q8_0 and 0.5 for q4_0 (kvCacheBytesPerElement, fs/ggml/ggml.go:904-915; a quantized cache
  only with flash attention, llm/memory.go:214-225). num_batch defaults to 512 (api/types.go:851) and the graph is
  sized for batch = min(num_ctx, num_batch) (llm/memory.go:227).
- Graph: per architecture (qwen2: fs/ggml/ggml.go:717-726; llama: :614-624); where none is given, partial =
  GQA * kv_total / 6 and full = partial (llm/memory.go:238-248). Metal uses the full size for partial; several GPUs
  always use the partial size (llm/memory.go:250-256).
- Layer sizes: the sum of each `blk.N` group's tensors plus that layer's KV; the output layer is output_norm plus
  output, or token_embd when the output is tied (llm/memory.go:207-266).
- Which GPUs: a GPU takes part only when its free memory holds OLLAMA_GPU_OVERHEAD + the larger graph + its minimum
  (457 MiB; 512 MiB on Metal, ml/device.go:320-325) + two layers (llm/memory.go:284-304); each taking part is charged
  its minimum and one layer up front. The scheduler first tries the fewest GPUs, largest free memory first, that hold
  the whole model, then every GPU of the library that offloads most (pickBestFullFitByLibrary and
  pickBestPartialFitByLibrary, llm/memory.go:21-83; llm/server.go:463-475).
- Offload: layers from the last (n_layer - 1) down to 0; layer i goes to gpusWithSpace[i % j], j counting down
  from the GPUs left, when its free memory exceeds overhead + allocated + the larger graph + the layer, and a GPU
  that cannot take it leaves the list (llm/memory.go:315-346). num_gpu >= 0 stops at that many layers. Then the
  output layer, on gpusWithSpace[layerCount % j] on the same test (llm/memory.go:352-371). The count is the `-ngl`
  it passes; on several GPUs the per-GPU counts are the tensor split (createGPULayers, llm/server.go:570-590). Without
  a GPU, or when no layer fits, it offloads nothing (llm/memory.go:423-429).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.core.errors import ArtifactError, ConfigError
from pipelines.core.gpus import NodeGroup
from pipelines.core.vocab import LLAMA_KV_CACHE_TYPES, GGUFKey
from pipelines.publish.planner import PlanRefused

MIB = 1024 * 1024

_CTX_PAD = 256
"""llama.cpp rounds n_ctx and each sequence's n_ctx_seq up to a multiple of this (src/llama-context.cpp:290, 296)."""

_COMPUTE_PER_TOKEN = 24
"""Bytes per ubatch token of the CPU compute buffer beyond the FFN and the mask (positions, row ids, norms' scalars):
fitted to the CPU logs (benchmarks/bench_llamacpp_memory.py)."""

_FLOAT_KV = frozenset({"f32", "f16", "bf16"})
_QUANT_SCRATCH = 16 * 1024
"""Bytes the CPU compute buffer grows by for each quantized K or V cache (fitted)."""

COMPUTE_TOLERANCE = 0.05
"""How far the fitted CPU compute buffer may be from the logged one (relative): the benchmark's goal."""

_MIN_MEMORY = {"metal": 512 * MIB}
_MIN_MEMORY_DEFAULT = 457 * MIB
"""Ollama's per-GPU floor (ml/device.go:320-325 at ollama 3258a89b6e4c)."""

_OLLAMA_KV_BYTES = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5}
"""Ollama's bytes per KV value (kvCacheBytesPerElement, fs/ggml/ggml.go:904-915); any other name counts as f16."""


def kv_type_bytes(name: str, values: int) -> int:
    """The bytes `values` values take in llama.cpp cache type `name` (whole blocks: q8_0 34 B per 32 values).

    Raises:
        ConfigError: not a cache type llama-server accepts, or a row that is not a whole number of its blocks.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if name not in LLAMA_KV_CACHE_TYPES:
        raise ConfigError(f"KV cache type {name!r} is not one llama.cpp offers ({', '.join(LLAMA_KV_CACHE_TYPES)})",
                          hint="pick one of them (f16, the default; q8_0 halves the cache)")
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
    if values % block:
        raise ConfigError(f"a KV row of {values} values is not a whole number of {name} blocks of {block}",
                          hint="use the f16 cache for this model (llama.cpp refuses the quantized one too)")
    return values // block * size


# ---------------------------------------------------------------------------------------------- the model's layers


@dataclass(frozen=True)
class LayeredWeights:
    """A GGUF's tensors grouped as llama.cpp places them: the input layer, each block, the output layer."""

    path: str
    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: tuple[int, ...]
    """KV heads of each layer (a GGUF may give one count or one per layer)."""
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    layer_bytes: tuple[int, ...]
    """Bytes of each `blk.N.*` group, N = 0 .. n_layer - 1."""
    input_bytes: int
    """token_embd and every other tensor outside the blocks and the output layer: always on the CPU."""
    output_bytes: int
    """output_norm and output; with a tied output, output_norm and the token embedding it uses again."""
    output_tied: bool
    token_embd_bytes: int
    """token_embd alone: what a tied output layer holds again once it is offloaded."""

    @property
    def file_bytes(self) -> int:
        """The bytes of the file's tensors (a tied output's embedding counted once)."""
        return self.input_bytes + sum(self.layer_bytes) + self.output_bytes - (
            self.token_embd_bytes if self.output_tied else 0)

    def offloaded_bytes(self, n_gpu_layers: int) -> int:
        """The weights `-ngl n_gpu_layers` puts on the GPUs: the output layer first, then blocks from the last
        (src/llama-model.cpp:1589-1614); negative means all."""
        n = self.n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, self.n_layer + 1)
        if n <= 0:
            return 0
        return self.output_bytes + sum(self.layer_bytes[self.n_layer - (n - 1):])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _arch_keys(arch: str) -> tuple[str, ...]:
    return tuple(f"{arch}.{k}" for k in ("block_count", "embedding_length", "feed_forward_length",
                                          "attention.head_count", "attention.head_count_kv",
                                          "attention.key_length", "attention.value_length"))


def _count(meta: dict[str, Any], key: str, where: str, default: Any = None) -> int | list[int]:
    value = meta.get(key, default)
    ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
        isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                  for v in value))
    if not ok:
        what = "missing" if value is None else f"{value!r}"
        raise ArtifactError(f"{where}: metadata {key} is {what}, not a count llama.cpp can size the model by",
                            hint="reconvert it with `modelmint convert NAME`")
    return value


def read_layered_weights(path: Path) -> LayeredWeights:
    """A GGUF's weights per layer and the shape its KV cache and buffers are sized by, read through the checked
    reader `modelmint inspect` uses.

    Raises:
        ArtifactError: not a GGUF, a damaged one, metadata llama.cpp cannot size it by, or a header whose
            `<arch>.block_count` disagrees with the `blk.N` tensors it holds (llama.cpp would refuse to load it).
    """
    from pipelines.core.ggufheader import read_checked_gguf

    path = Path(path)
    info, header = read_checked_gguf(
        path, lambda key, found: key in _arch_keys(str(found.get(GGUFKey.ARCHITECTURE))))
    meta, arch, where = header.metadata, info.architecture, str(path)
    if info.split_count > 1:
        raise ArtifactError(f"{path} is one file of a {info.split_count}-file split",
                            hint="merge it first with `llama-gguf-split --merge`, then size the merged file")
    n_layer = _count(meta, f"{arch}.block_count", where)
    if not isinstance(n_layer, int):
        raise ArtifactError(f"{where}: metadata {arch}.block_count is a list, not one count",
                            hint="reconvert it with `modelmint convert NAME`")
    n_embd = _scalar(_count(meta, f"{arch}.embedding_length", where))
    n_ff = max(_as_list(_count(meta, f"{arch}.feed_forward_length", where), n_layer))
    n_head = max(_as_list(_count(meta, f"{arch}.attention.head_count", where), n_layer))
    heads_kv = _as_list(_count(meta, f"{arch}.attention.head_count_kv", where, n_head), n_layer)
    if n_head == 0:
        raise ArtifactError(f"{where}: metadata {arch}.attention.head_count is 0",
                            hint="reconvert it with `modelmint convert NAME`")
    head_k = _scalar(_count(meta, f"{arch}.attention.key_length", where, n_embd // n_head))
    head_v = _scalar(_count(meta, f"{arch}.attention.value_length", where, n_embd // n_head))

    layer_bytes = [0] * n_layer
    seen: set[int] = set()
    input_bytes = output_bytes = embd_bytes = out_matrix = 0
    n_vocab = 0
    blk = re.compile(r"blk\.(\d+)\.")
    for t in header.tensors:
        m = blk.match(t.name)
        if m:
            i = int(m.group(1))
            if i >= n_layer:
                raise ArtifactError(
                    f"{where}: it holds tensor {t.name} but metadata {arch}.block_count says {n_layer} layers",
                    hint="its header contradicts its tensors: rebuild it with `modelmint convert NAME`")
            seen.add(i)
            layer_bytes[i] += t.nbytes
        elif t.name.startswith("output_norm."):
            output_bytes += t.nbytes
        elif t.name.startswith("output."):
            output_bytes += t.nbytes
            out_matrix += t.nbytes
        else:
            input_bytes += t.nbytes
            if t.name == "token_embd.weight":
                embd_bytes = t.nbytes
                n_vocab = t.shape[1] if len(t.shape) > 1 else 0
    missing = sorted(set(range(n_layer)) - seen)
    if missing:
        shown = ", ".join(f"blk.{i}" for i in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3
                                                               else "")
        raise ArtifactError(
            f"{where}: metadata {arch}.block_count says {n_layer} layers but it holds tensors of {len(seen)} "
            f"({shown} missing); llama.cpp would refuse to load it",
            hint="its header contradicts its tensors: rebuild it with `modelmint convert NAME` (or `modelmint pull "
            "NAME:TAG` for a registered one)")
    if not n_vocab:
        raise ArtifactError(f"{where} has no token_embd.weight of [n_embd, n_vocab]",
                            hint="reconvert it with `modelmint convert NAME`")
    tied = out_matrix == 0
    if tied:
        output_bytes += embd_bytes
    return LayeredWeights(str(path), arch, n_layer, n_embd, n_ff, n_head, tuple(heads_kv), head_k, head_v, n_vocab,
                          tuple(layer_bytes), input_bytes, output_bytes, tied, embd_bytes)


def _scalar(value: int | list[int]) -> int:
    return max(value) if isinstance(value, list) else value


def _as_list(value: int | list[int], n_layer: int) -> list[int]:
    if isinstance(value, list):
        return (value + [value[-1]] * n_layer)[:n_layer] if value else [0] * n_layer
    return [value] * n_layer


# ------------------------------------------------------------------------------------------- llama.cpp's buffers


@dataclass(frozen=True)
class LlamaCppContext:
    """The context llama-server is started with (`-c`, `-np`, `-b`, `-ub`, `-ctk`, `-ctv`, `-kvu`, `-fa`)."""

    n_ctx: int
    n_parallel: int = 1
    n_batch: int = 2048
    n_ubatch: int = 512
    type_k: str = "f16"
    type_v: str = "f16"
    kv_unified: bool = False
    flash_attn: bool = True

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_parallel", "n_batch", "n_ubatch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive whole number, not {value!r}",
                                  hint="give the context, slots and batch sizes llama-server is started with")
        kv_type_bytes(self.type_k, 0)
        kv_type_bytes(self.type_v, 0)

    @property
    def n_ctx_seq(self) -> int:
        """Cells of each sequence (src/llama-context.cpp:289-305)."""
        n_ctx = _pad(self.n_ctx, _CTX_PAD)
        return n_ctx if self.kv_unified else _pad(n_ctx // self.n_parallel, _CTX_PAD)

    @property
    def n_ctx_total(self) -> int:
        """Cells of the whole cache, what llama.cpp logs as n_ctx."""
        return self.n_ctx_seq * (1 if self.kv_unified else self.n_parallel)

    @property
    def n_batch_eff(self) -> int:
        """min(-c, -b): taken from the context asked for, before it is rounded (src/llama-context.cpp:246, 290)."""
        return min(self.n_ctx, self.n_batch)

    @property
    def n_ubatch_eff(self) -> int:
        return min(self.n_batch_eff, self.n_ubatch)

    def argv(self) -> list[str]:
        """The llama-server flags that realise this context."""
        return ["-c", str(self.n_ctx), "-np", str(self.n_parallel), "-b", str(self.n_batch), "-ub",
                str(self.n_ubatch), "-ctk", self.type_k, "-ctv", self.type_v, "-fa", "on" if self.flash_attn else "off",
                "-kvu" if self.kv_unified else "-no-kvu"]


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def kv_layer_bytes(weights: LayeredWeights, ctx: LlamaCppContext) -> list[int]:
    """Each layer's K and V bytes (src/llama-kv-cache.cpp:233-234): all cells of every stream."""
    cells = ctx.n_ctx_total
    return [cells * (kv_type_bytes(ctx.type_k, h * weights.head_dim_k) + kv_type_bytes(ctx.type_v,
                                                                                          h * weights.head_dim_v))
            for h in weights.n_head_kv]


def output_buffer_bytes(weights: LayeredWeights, ctx: LlamaCppContext) -> int:
    """The logits buffer reserved at load: n_vocab floats for each of n_seq_max outputs (src/llama-context.cpp:377,
    2120, 2141)."""
    return weights.n_vocab * ctx.n_parallel * 4


def compute_buffer_bytes(weights: LayeredWeights, ctx: LlamaCppContext) -> int:
    """The CPU backend's compute buffer, fitted to its logs (module docstring; within COMPUTE_TOLERANCE there)."""
    ub, cells = ctx.n_ubatch_eff, ctx.n_ctx_seq
    if ctx.flash_attn:
        # one layer's FFN activations and the f16 mask over a sequence's cells; a float V cache keeps one more
        # n_embd-wide row per token alive, a quantized K or V a small conversion scratch instead
        per_token = 4 * (3 * weights.n_ff + 3 * weights.n_embd) + 2 * cells + _COMPUTE_PER_TOKEN
        per_token += 4 * weights.n_embd if ctx.type_v in _FLOAT_KV else 0
        layer = ub * per_token + _QUANT_SCRATCH * sum(t not in _FLOAT_KV for t in (ctx.type_k, ctx.type_v))
    else:
        # the KQ scores of every head and the f32 mask over a sequence's cells, beside the attention's inputs
        layer = ub * (cells * (4 * weights.n_head + 4) + 4 * (3 * weights.n_embd + weights.n_ff) + _COMPUTE_PER_TOKEN)
    outputs = min(ub, ctx.n_parallel)
    logits = 4 * outputs * (weights.n_vocab + weights.n_embd)
    return max(layer, logits)


@dataclass(frozen=True)
class LlamaCppMemory:
    """llama.cpp's buffers for one GGUF, context and `-ngl`, in bytes; `gpu` what the offloaded layers hold."""

    weights: int
    weights_gpu: int
    kv: int
    kv_gpu: int
    output: int
    compute: int
    n_gpu_layers: int
    context: LlamaCppContext = field(repr=False)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.output + self.compute

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["context"] = asdict(self.context)
        d["total"] = self.total
        return d


def llamacpp_memory(weights: LayeredWeights, ctx: LlamaCppContext, n_gpu_layers: int = 0) -> LlamaCppMemory:
    """What llama.cpp allocates for `weights` served with `ctx` and `-ngl n_gpu_layers` (negative: all layers).

    `weights` counts every tensor of the file plus, when the output layer is offloaded and tied, its copy of the
    token embedding; the KV of the offloaded blocks is `kv_gpu`. The compute buffer is the CPU backend's.
    """
    n = weights.n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, weights.n_layer + 1)
    kv_layers = kv_layer_bytes(weights, ctx)
    blocks_gpu = max(n - 1, 0)
    gpu_weights = weights.offloaded_bytes(n)
    tied_copy = weights.token_embd_bytes if weights.output_tied and n > 0 else 0
    return LlamaCppMemory(
        weights=weights.file_bytes + tied_copy,
        weights_gpu=gpu_weights,
        kv=sum(kv_layers),
        kv_gpu=sum(kv_layers[weights.n_layer - blocks_gpu:]) if blocks_gpu else 0,
        output=output_buffer_bytes(weights, ctx),
        compute=compute_buffer_bytes(weights, ctx),
        n_gpu_layers=n,
        context=ctx,
    )


# ------------------------------------------------------------------------------------------- llama-server's log


@dataclass(frozen=True)
class LoggedBuffers:
    """The buffers llama-server logged while loading (MiB, two decimals, per backend buffer name)."""

    model: dict[str, float]
    kv: dict[str, float]
    output: dict[str, float]
    compute: dict[str, float]
    n_ctx: int
    n_ctx_seq: int
    n_seq_max: int
    n_batch: int
    n_ubatch: int


_BUFFER = re.compile(r"(load_tensors|llama_kv_cache|llama_context|sched_reserve):\s+(\S+)\s+"
                     r"(model|KV|output|compute) buffer size =\s+([\d.]+) MiB")
_CPARAM = re.compile(r"llama_context: (n_ctx|n_ctx_seq|n_seq_max|n_batch|n_ubatch)\s+= (\d+)")


def parse_load_log(text: str) -> LoggedBuffers:
    """The buffer sizes and context in a llama-server load log (any verbosity from the default up).

    Raises:
        ArtifactError: the log lacks a buffer line or the context lines (the server stopped before it loaded).
    """
    found: dict[str, dict[str, float]] = {"model": {}, "KV": {}, "output": {}, "compute": {}}
    for m in _BUFFER.finditer(text):
        bucket = found[m.group(3)]
        bucket[m.group(2)] = bucket.get(m.group(2), 0.0) + float(m.group(4))
    cparams = {m.group(1): int(m.group(2)) for m in _CPARAM.finditer(text)}
    lacking = [k for k, v in found.items() if not v] + [k for k in ("n_ctx", "n_ctx_seq", "n_seq_max", "n_batch",
                                                                    "n_ubatch") if k not in cparams]
    if lacking:
        raise ArtifactError(f"the llama-server log has no {', '.join(lacking)} line: it stopped before the model "
                            "was loaded", hint="read the log's last lines for the cause")
    return LoggedBuffers(found["model"], found["KV"], found["output"], found["compute"], cparams["n_ctx"],
                         cparams["n_ctx_seq"], cparams["n_seq_max"], cparams["n_batch"], cparams["n_ubatch"])


def mib_as_logged(n_bytes: int) -> float:
    """`n_bytes` as llama.cpp prints a buffer size ("%8.2f MiB": rounded half to even on the exact binary value)."""
    return float(f"{n_bytes / MIB:.2f}")


def llama_server_load_log(server: Path, gguf: Path, ctx: LlamaCppContext, *, log: Path, threads: int = 1,
                          extra: Sequence[str] = ()) -> str:
    """Start llama-server on 127.0.0.1 (a port the kernel picks) with `ctx`, wait until it listens, stop it, and
    return its load log (`-lv 4`: every buffer line).

    Raises:
        ArtifactError: it exited or did not come up (the log's tail says why).
    """
    from pipelines.gguf.answers import llama_server

    with llama_server(gguf, server, threads=threads, log=log, args=["-lv", "4", *ctx.argv(), *extra]):
        pass
    return log.read_text(errors="replace")


# ----------------------------------------------------------------------------------------------- Ollama's estimate


@dataclass(frozen=True)
class OllamaOffload:
    """Ollama's estimate (llm/memory.go estimateGPULayers): the layers it offloads (its `-ngl`) and where."""

    layers: int
    """Offloaded layers, the output layer counted as one (0: it runs on the CPU)."""
    per_gpu: tuple[int, ...]
    """Layers on each GPU, in the order given (the tensor split on several)."""
    gpu_bytes: tuple[int, ...]
    """What the estimate charges each GPU (minimum + layers + graph)."""
    graph_partial: int
    graph_full: int
    kv: int
    fully_loaded: bool


def _ollama_graph(weights: LayeredWeights, kv_total: int, context: int, batch: int) -> tuple[int, int]:
    """(partial, full) graph sizes of GraphSize for the architectures modelmint builds (fs/ggml/ggml.go:550)."""
    embedding, heads, vocab = weights.n_embd, weights.n_head, weights.n_vocab
    heads_kv = max(weights.n_head_kv) or 1
    head_dim = embedding // heads
    if weights.architecture == "qwen2":  # fs/ggml/ggml.go:717-726
        full = max(4 * batch * (embedding + vocab), 4 * batch * (1 + 2 * embedding + context + context * heads))
        partial = max(4 * batch * (embedding + vocab) + embedding * vocab * 105 // 128,
                      4 * (batch * (1 + 2 * embedding + context * (1 + heads)) + embedding * (1 + context)))
        return partial, full
    if weights.architecture in ("llama", "llama4"):  # fs/ggml/ggml.go:614-624 (dense models)
        full = max(4 * batch * (1 + 4 * embedding + context * (1 + heads)), 4 * batch * (embedding + vocab))
        partial = 4 * batch * embedding + max(
            4 * batch * (1 + embedding + max(context, embedding)) + embedding * embedding * 9 // 16
            + 4 * context * (batch * heads + head_dim * heads_kv),
            4 * batch * (embedding + vocab) + embedding * vocab * 105 // 128)
        return partial, full
    partial = weights.n_head // (min(weights.n_head_kv) or 1) * kv_total // 6  # llm/memory.go:238-245
    return partial, partial


def ollama_layers(weights: LayeredWeights, free_vram: Sequence[int], *, num_ctx: int, num_parallel: int = 1,
                  num_batch: int = 512, num_gpu: int = -1, kv_cache_type: str = "f16", flash_attention: bool = False,
                  library: str = "cuda", gpu_overhead: int = 0) -> OllamaOffload:
    """How many layers Ollama's llama.cpp engine offloads to GPUs with `free_vram` bytes free each (one library),
    following estimateGPULayers (llm/memory.go:154-437 at ollama 3258a89b6e4c; rules in the module docstring).

    `kv_cache_type` (OLLAMA_KV_CACHE_TYPE) counts only with `flash_attention` (OLLAMA_FLASH_ATTENTION), as there;
    `gpu_overhead` is OLLAMA_GPU_OVERHEAD. The scheduler's choice of which GPUs to give it (the fewest that hold
    the whole model) is the caller's: pass those GPUs.

    Raises:
        ConfigError: a context, slot count or batch below 1.
    """
    if min(num_ctx, num_parallel, num_batch) < 1:
        raise ConfigError(f"num_ctx {num_ctx}, num_parallel {num_parallel} and num_batch {num_batch} must be at "
                          "least 1",
                          hint="give the Modelfile's num_ctx and the server's OLLAMA_NUM_PARALLEL")
    num_ctx = max(num_ctx, 4)  # server/sched.go:85-87
    per_value = _OLLAMA_KV_BYTES.get(kv_cache_type.lower(), 2.0) if flash_attention else 2.0
    context = num_ctx * num_parallel
    kv = [int(context * (weights.head_dim_k + weights.head_dim_v) * h * per_value) for h in weights.n_head_kv]
    kv_total = sum(kv)
    partial, full = _ollama_graph(weights, kv_total, context, min(num_ctx, num_batch))
    if library.lower() == "metal":
        partial = full
    elif len(free_vram) > 1:
        full = partial
    graph = max(partial, full)
    minimum = _MIN_MEMORY.get(library.lower(), _MIN_MEMORY_DEFAULT)

    layer_size = weights.layer_bytes[0] + kv[0] if weights.n_layer else 0
    n_gpus = len(free_vram)
    allocations = [0] * n_gpus
    per_gpu = [0] * n_gpus
    with_space: list[int] = []
    for i, free in enumerate(free_vram):  # llm/memory.go:278-304
        if free < gpu_overhead + graph + minimum + 2 * layer_size:
            continue
        with_space.append(i)
        allocations[i] += minimum + layer_size
    count = 0
    for i in range(weights.n_layer - 1, -1, -1):  # llm/memory.go:315-346
        layer_size = weights.layer_bytes[i] + kv[i]
        if 0 <= num_gpu <= count:
            continue
        for j in range(len(with_space), 0, -1):
            g = with_space[i % j]
            if free_vram[g] > gpu_overhead + allocations[g] + graph + layer_size:
                allocations[g] += layer_size
                per_gpu[g] += 1
                count += 1
                break
            del with_space[i % j]
    fully = count >= weights.n_layer
    last = weights.output_bytes  # llm/memory.go:258-266, 350-371
    if last > 0:
        if num_gpu < 0 or count < num_gpu:
            for j in range(len(with_space), 0, -1):
                g = with_space[count % j]
                if free_vram[g] > gpu_overhead + allocations[g] + graph + last:
                    allocations[g] += last
                    per_gpu[g] += 1
                    count += 1
                    break
        if count < weights.n_layer + 1:
            fully = False
    for i in range(n_gpus):  # llm/memory.go:373-383
        if per_gpu[i] > 0:
            allocations[i] += full if fully else partial
    if library.lower() == "cpu" or count == 0:
        return OllamaOffload(0, (0,) * n_gpus, (0,) * n_gpus, partial, full, kv_total, False)
    return OllamaOffload(count, tuple(per_gpu), tuple(allocations), partial, full, kv_total, fully)



# ---------------------------------------------------------------- a GGUF's plan on Ollama or llama-server

GIB = 1 << 30
OLLAMA_NUM_CTX = 4096
"""Ollama's default num_ctx: a GGUF is planned at it when no context is asked (capped at the model's maximum)."""
GPU_RESERVE = 457 * MIB
"""What each CUDA GPU keeps besides llama.cpp's buffers (driver and CUDA context): Ollama's per-GPU minimum
(ml/device.go:320-325 at ollama 3258a89b6e4c; 512 MiB on Metal), the llama.cpp engine's allowance too."""
METAL_RESERVE = 512 * MIB
LLAMA_MAX_SEQ = 256
"""The most sequences (slots) one llama.cpp context holds: LLAMA_MAX_SEQ (src/llama-cparams.h:8 in the pinned tree,
0c1e570); a larger n_seq_max (llama-server's -np) fails the load ("n_seq_max must be <= 256",
src/llama-context.cpp:101-102). Ollama sets no cap of its own: OLLAMA_NUM_PARALLEL is any unsigned number
(envconfig/config.go:275 at ollama fb30760), taken as it is (server/sched.go:497) and passed to llama-server as
`-np` (llm/llama_server.go:375-376), so it is the cap of each Ollama server too."""
SINGLE_GPU_SHARE = 0.80
"""Ollama puts a model on one GPU when its estimate is within 80 % of that GPU's free memory (bestSingleGPUFit,
server/sched.go:1060-1076 at fb30760)."""
KNOWN_CAPS = "llama.cpp's LLAMA_MAX_SEQ, src/llama-cparams.h:8; Ollama passes OLLAMA_NUM_PARALLEL to it as -np"


def size_text(n: int) -> str:
    """Bytes as people read a model's size: GiB from 1 GiB up, else MiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def gguf_num_ctx(context: int | None, max_context: int) -> int:
    """The tokens per sequence a GGUF is planned at: the asked context, else Ollama's default (OLLAMA_NUM_CTX) capped
    at the model's maximum."""
    return context or min(max_context, OLLAMA_NUM_CTX)


def ollama_planned_name(model: str, num_ctx: int) -> str:
    """The name a GGUF's plan creates `model` under in Ollama at `num_ctx` tokens: its tag (or `latest`) with
    `-ctxN` appended (the Modelfile's num_ctx is the model's own, so each planned context is a model of its own)."""
    name, sep, tag = model.rpartition(":")
    if not sep or "/" in tag:  # no tag (a colon before a slash is a registry's port)
        name, tag = model, "latest"
    return f"{name}:{tag}-ctx{num_ctx}"


@dataclass(frozen=True)
class GgufPlan:
    """A GGUF on Ollama or llama-server: the context per sequence, the parallel slots, the layers on the GPU (the
    output layer counted as one, as `-ngl` and Ollama's num_gpu count), and llama.cpp's buffers for them."""

    engine: str
    device: str
    kind: str
    num_ctx: int
    """Tokens per sequence: Ollama's num_ctx; llama-server's -c is num_ctx x parallel (split over its slots)."""
    parallel: int
    n_gpu_layers: int
    n_layers: int
    """The model's blocks plus the output layer: n_gpu_layers == n_layers is a full offload."""
    memory: LlamaCppMemory
    gpu_budget: int
    """The bytes the GPUs offer (their memory less GPU_RESERVE each; Metal: its working set); 0 on a CPU."""
    warnings: tuple[str, ...] = ()
    gpus: int = 1
    """The GPUs of the machine the plan uses."""
    instances: int = 1
    """Ollama servers, one per GPU (CUDA_VISIBLE_DEVICES) behind a proxy, each with `parallel` slots and its own
    copy of the model (`memory` is one server's); 1: one server over `gpus` GPUs."""
    spread: bool = False
    """One server whose layers go over every GPU (Ollama needs OLLAMA_SCHED_SPREAD for it: servefiles.
    ollama_start_script)."""

    @property
    def partial(self) -> bool:
        return self.kind != "cpu" and self.n_gpu_layers < self.n_layers

    @property
    def cpu_weight_share(self) -> float:
        """The share of the weights that stays in system memory, read by the CPU for every token."""
        return 1 - self.memory.weights_gpu / self.memory.weights if self.memory.weights else 0.0

    @property
    def host_bytes(self) -> int:
        """System memory the rest takes: weights and KV of the layers left on the CPU, and the CPU's buffers."""
        m = self.memory
        return m.weights - m.weights_gpu + m.kv - m.kv_gpu + m.output + m.compute

    @property
    def context(self) -> LlamaCppContext:
        """llama-server's context for this plan: -c num_ctx x parallel over -np parallel slots."""
        return LlamaCppContext(self.num_ctx * self.parallel, self.parallel)

    def summary(self) -> str:
        where = (
            "CPU only"
            if self.kind == "cpu"
            else f"{self.n_gpu_layers}/{self.n_layers} layers on the GPU"
            + (f" ({self.cpu_weight_share:.0%} of the weights on the CPU)" if self.partial else "")
        )
        over = (f" on each of {self.instances} GPUs (one Ollama per GPU)" if self.instances > 1
                else f" over {self.gpus} GPUs" if self.spread else "")
        return f"{self.engine}: {where}, num_ctx {self.num_ctx} x {self.parallel} slot(s){over}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "device": self.device,
            "kind": self.kind,
            "num_ctx": self.num_ctx,
            "parallel": self.parallel,
            "n_gpu_layers": self.n_gpu_layers,
            "n_layers": self.n_layers,
            "partial": self.partial,
            "cpu_weight_share": round(self.cpu_weight_share, 4),
            "gpu_budget": self.gpu_budget,
            "host_bytes": self.host_bytes,
            "memory": self.memory.to_dict(),
            "warnings": list(self.warnings),
            "gpus": self.gpus,
            "instances": self.instances,
            "spread": self.spread,
        }


def gguf_machine(cluster: Sequence[NodeGroup], weights: LayeredWeights, num_ctx: int, parallel: int) -> NodeGroup:
    """The machine of `cluster` one Ollama or llama-server serves a GGUF on (llama.cpp splits layers over the GPUs of
    one machine, never across machines), chosen as Ollama's scheduler chooses among unequal GPUs (server/sched.go at
    fb30760, selectLlamaServerPlacement :972-1031): the GPU with the most free memory whose free memory holds the
    whole model with SINGLE_GPU_SHARE to spare (bestSingleGPUFit :1060-1076; discrete before integrated, :1078-1084),
    else the group of GPUs with the most memory together (bestGPUGroupByAvailableMemory :1086-1108)."""
    if len(cluster) == 1:
        return cluster[0]
    whole = llamacpp_memory(weights, LlamaCppContext(num_ctx * parallel, parallel), weights.n_layer + 1)
    need = whole.weights_gpu + whole.kv_gpu + whole.compute + whole.output

    def discrete(g: NodeGroup) -> bool:
        return g.gpu.kind == "cuda"

    single = [g for g in cluster if g.gpu.kind != "cpu" and need <= g.gpu.memory_bytes * SINGLE_GPU_SHARE]
    if single:
        return max(single, key=lambda g: (discrete(g), g.gpu.memory_bytes))
    return max(cluster, key=lambda g: (discrete(g), g.gpu.memory_bytes * g.gpus_per_node))


def plan_gguf(
    weights: LayeredWeights, group: NodeGroup, engine: str, num_ctx: int, parallel: int
) -> GgufPlan:
    """The layers of `weights` Ollama (its own estimate, ollama_layers) or llama-server (the most whose buffers fit
    the GPUs less GPU_RESERVE each) offloads to one node of `group` at `num_ctx` tokens x `parallel` slots; on a
    `cpu:` machine none, within its memory. Ollama on several GPUs of one node runs one server per GPU where one
    GPU holds the model with its share of the slots, else one server over every GPU.

    Raises:
        PlanRefused: a server would hold more slots than llama.cpp's LLAMA_MAX_SEQ; on a CPU or an Apple machine,
            the buffers exceed its memory (the nearest context or slot count that fits named).
    """
    g = group.gpu
    ctx = LlamaCppContext(num_ctx * parallel, parallel)
    n_layers = weights.n_layer + 1
    warnings: list[str] = []
    n_gpus = group.gpus_per_node
    if g.kind == "cpu":
        _within_max_seq(parallel, 1, group, engine)
        mem = llamacpp_memory(weights, ctx, 0)
        if mem.total > g.memory_bytes:
            raise PlanRefused(
                f"{size_text(mem.total)} of weights, KV cache and buffers at num_ctx {num_ctx} x {parallel} slot(s) "
                f"exceed {g.name}'s {size_text(g.memory_bytes)} ({g.memory_source})",
                _nearest_gguf(weights, group, engine, num_ctx, parallel),
            )
        return GgufPlan(engine, str(group), "cpu", num_ctx, parallel, 0, n_layers, mem, 0, ())
    reserve = METAL_RESERVE if g.kind == "metal" else GPU_RESERVE
    budget = max(0, (g.memory_bytes - reserve) * n_gpus)
    library = "metal" if g.kind == "metal" else "cuda"
    if engine == "ollama" and n_gpus > 1:
        # several GPUs: where one GPU holds the whole model with its share of the slots, one Ollama per GPU serves
        # the sequences side by side (one server would put it on a single GPU anyway: server/sched.go:1009-1024 at
        # ollama fb30760); else one server splits the layers over every GPU (OLLAMA_SCHED_SPREAD)
        instances = min(n_gpus, parallel)
        per = math.ceil(parallel / instances)
        one = ollama_layers(weights, [g.memory_bytes], num_ctx=num_ctx, num_parallel=per, library=library)
        if one.layers == n_layers and per <= LLAMA_MAX_SEQ:
            mem = llamacpp_memory(weights, LlamaCppContext(num_ctx * per, per), n_layers)
            return GgufPlan(engine, str(group), g.kind, num_ctx, per, n_layers, n_layers, mem,
                            max(0, g.memory_bytes - reserve), (), instances, instances)
    if parallel > LLAMA_MAX_SEQ:
        per_gpu = engine == "ollama" and n_gpus > 1 and ollama_layers(
            weights, [g.memory_bytes], num_ctx=num_ctx, num_parallel=LLAMA_MAX_SEQ, library=library
        ).layers == n_layers
        _within_max_seq(parallel, n_gpus if per_gpu else 1, group, engine)
    if engine == "ollama":
        off = ollama_layers(weights, [g.memory_bytes] * n_gpus, num_ctx=num_ctx,
                            num_parallel=parallel, library=library)
        ngl = off.layers
    else:
        ngl = 0
        for n in range(n_layers, 0, -1):
            m = llamacpp_memory(weights, ctx, n)
            if m.weights_gpu + m.kv_gpu + m.compute + m.output <= budget:
                ngl = n
                break
    mem = llamacpp_memory(weights, ctx, ngl)
    plan = GgufPlan(engine, str(group), g.kind, num_ctx, parallel, ngl, n_layers, mem, budget, (), n_gpus, 1,
                    engine == "ollama" and n_gpus > 1 and ngl > 0)
    if g.kind == "metal" and g.ram_gib and mem.total > (g.ram_gib * GIB) - GPU_RESERVE:
        raise PlanRefused(
            f"{size_text(mem.total)} of weights, KV cache and buffers at num_ctx {num_ctx} x {parallel} slot(s) "
            f"exceed {g.name}'s {g.ram_gib:g} GiB of unified memory",
            _nearest_gguf(weights, group, engine, num_ctx, parallel),
        )
    if plan.partial:
        warnings.append(
            f"partial offload: {ngl} of {n_layers} layers fit {g.name}'s {size_text(budget)}; "
            f"{plan.cpu_weight_share:.0%} of the weights ({size_text(mem.weights - mem.weights_gpu)}) stay in "
            f"system memory and the CPU reads them for every token, so generation runs at the CPU's memory "
            f"bandwidth for that share (several times slower than a full offload); it needs "
            f"{size_text(plan.host_bytes)} of system memory. A smaller variant, a shorter --context or fewer "
            "sequences put more on the GPU"
        )
    return dataclasses.replace(plan, warnings=tuple(warnings))


def _within_max_seq(parallel: int, servers: int, group: NodeGroup, engine: str) -> None:
    """Raises PlanRefused where one server would hold more than LLAMA_MAX_SEQ slots (`servers`: how many Ollama
    servers, one per GPU, the sequences may be shared over)."""
    if parallel <= LLAMA_MAX_SEQ:
        return
    server = "llama-server's -np" if engine == "llama.cpp" else "OLLAMA_NUM_PARALLEL"
    most = LLAMA_MAX_SEQ * servers
    slots = math.ceil(parallel / servers)
    where = f"each of {servers} servers (one Ollama per GPU)" if servers > 1 else "one server"
    raise PlanRefused(
        f"{parallel} sequences at once are {slots} slots of {where} ({server}), past the {LLAMA_MAX_SEQ} "
        f"one llama.cpp context holds ({KNOWN_CAPS}): the server would fail to load the model",
        [f"--concurrency {most} on {group}"
         + (f" (one Ollama per GPU, {LLAMA_MAX_SEQ} slots each, where one GPU holds the model)" if servers > 1
            else "") + "; the other sequences queue"],
    )


def _nearest_gguf(weights: LayeredWeights, group: NodeGroup, engine: str, num_ctx: int, parallel: int) -> list[str]:
    """A shorter context (a multiple of 256) or fewer slots at which the buffers fit a CPU or Apple machine."""
    g = group.gpu
    limit = g.memory_bytes if g.kind == "cpu" else int(g.ram_gib * GIB) - GPU_RESERVE

    def fits(ctx_tokens: int, slots: int) -> bool:
        return llamacpp_memory(weights, LlamaCppContext(ctx_tokens * slots, slots), 0).total <= limit

    out = []
    shorter = next((c for c in range(num_ctx // 256 * 256, 255, -256) if fits(c, parallel)), None)
    if shorter is not None:
        out.append(f"--context {shorter} on {group}")
    fewer = next((p for p in range(parallel - 1, 0, -1) if fits(num_ctx, p)), None)
    if fewer is not None:
        out.append(f"--concurrency {fewer} on {group}")
    return out or [f"a smaller variant, or a machine with more than {size_text(limit)} of memory"]
