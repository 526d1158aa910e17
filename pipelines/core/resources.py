"""Disk and memory a run needs at its peak, from the source's Safetensors headers, checked before any work."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipelines.core.errors import (
    ArtifactError,
    ConfigError,
    DiskLocation,
    RunTooLarge,
    ShapeRefused,
    SourceError,
)
from pipelines.core.fsutil import HashCache
from pipelines.core.preflight import Weight, gguf_fallback, source_weights
from pipelines.core.safetensorsheader import INDEX_FILE, read_safetensors_header
from pipelines.core.vocab import COMPRESSED_SCHEMES, GROUPED_PRESETS, gguf_type

GIB = 1 << 30

HUB_FILE_LIMIT = 50 * 10**9
"""The largest single file modelmint plans to hand to the Hugging Face Hub: 50 GB. hub-docs' upload guide
(docs/hub/datasets-upload-guide-llm.md) gives "Per file: 50GB max, 20GB recommended"; its storage-limits page has
since raised the hard limit to 500 GB and recommends chunks under 200 GB, but 50 GB is the figure GGUF uploaders cut
their llama-gguf-split parts to (`--split-max-size 50G`), and a file under it uploads under either rule."""

# ---------------------------------------------------------------- what the source holds

_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
                "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}
_SHARD = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.safetensors$")
"""The hub's shard naming (transformers' save_pretrained): model-00001-of-00004.safetensors."""


@dataclass(frozen=True)
class SourceShape:
    """What a Safetensors model directory holds, from its headers alone: what every size below is computed from."""

    params: int
    bytes: int
    """The tensors' bytes as stored (bf16: 2 per parameter)."""
    vector_params: int
    """Parameters of 1-D tensors (norms, biases): the GGUF converter keeps these in F32."""
    embedding_params: int
    """Parameters of the token embedding and output matrices (kept unquantized by compressed-tensors recipes)."""
    largest: str
    largest_params: int
    vocab: int
    """Rows of the token embedding (or output) matrix: the n_vocab llama.cpp scores (the converter pads the
    tokenizer's vocabulary to it)."""
    files: int
    weights: tuple[Weight, ...] = ()
    """The 2-D weights (name, row length, parameters): which rows llama-quantize's blocks cannot take."""

    @property
    def largest_bf16(self) -> int:
        return 2 * self.largest_params


def source_shape(directory: Path, hashes: HashCache | None = None) -> SourceShape:
    """The parameters, vocabulary and largest tensor of a Safetensors model directory, from its headers only.

    Every shard is checked before anything else: it is there, and it holds the bytes its header declares.

    Raises:
        SourceError: a shard the index (or the shards' own `-of-N` names) lists is missing, a shard is shorter than
            its header declares, or a header does not read back.
    """
    files = _shards(directory)
    for f in files:
        _check_length(f)
    params = stored = vectors = embedding = largest_params = vocab = 0
    largest = ""
    tensors: dict[str, dict[str, Any]] = {}
    for f in files:
        try:
            header = read_safetensors_header(f, hashes)
        except ArtifactError as err:
            raise _incomplete(directory, str(err)) from err
        for name, info in header.items():
            if name == "__metadata__":
                continue
            tensors[name] = info
            shape = [int(d) for d in info["shape"]]
            n = math.prod(shape)
            params += n
            stored += n * _DTYPE_BYTES.get(info["dtype"], 2)
            if len(shape) == 1:
                vectors += n
            if _is_embedding(name) and len(shape) == 2:
                embedding += n
                vocab = max(vocab, shape[0])
            if n > largest_params:
                largest, largest_params = name, n
    if not params:
        raise _incomplete(directory, f"{directory} holds no tensors")
    return SourceShape(params, stored, vectors, embedding, largest, largest_params, vocab, len(files),
                       tuple(source_weights(tensors)))


def _is_embedding(name: str) -> bool:
    return "embed_tokens" in name or name.startswith("lm_head") or name.endswith(("wte.weight", "output.weight"))


def _shards(d: Path) -> list[Path]:
    index = d / INDEX_FILE
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise _incomplete(d, f"{index} is not a Safetensors index (no weight_map of tensor → shard)") from err
    else:
        names = sorted(p.name for p in d.glob("*.safetensors"))
        if not names:
            raise _incomplete(d, f"{d} holds no .safetensors weights")
        # no index: the shards' own names say how many there are
        for m in filter(None, map(_SHARD.match, names)):
            count = int(m["count"])
            names = sorted({*names, *(f"{m['prefix']}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1))})
    if missing := [n for n in names if not (d / n).is_file()]:
        listed = f"{index.name} lists" if index.is_file() else "the other shards' names (-of-N) imply"
        raise _incomplete(d, f"{d} lacks {len(missing)} of the {len(names)} shards {listed}: {', '.join(missing)}")
    return [d / n for n in names]


def _check_length(path: Path) -> None:
    """Refuse a shard shorter than its header declares (a download cut off), naming it and both sizes."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n)) if 8 + n <= size else None
    except (struct.error, ValueError) as err:
        raise _incomplete(path.parent, f"shard {path.name} has no readable Safetensors header ({size} bytes)") from err
    if header is None:
        raise _incomplete(path.parent, f"shard {path.name} is truncated: its header alone needs {8 + n} bytes, the "
                          f"file holds {size}")
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        return  # a malformed header: read_safetensors_header words that refusal
    if 8 + n + end > size:
        raise _incomplete(path.parent, f"shard {path.name} is truncated: its header declares {8 + n + end:,} bytes "
                          f"({_gib(8 + n + end)}), the file holds {size:,} ({_gib(size)})")


def _incomplete(d: Path, message: str) -> SourceError:
    return SourceError(message + "; nothing was started",
                       hint=f"the download in {d} is incomplete: rerun `modelmint fetch NAME` to download the "
                       "missing bytes again (a file you placed there yourself: copy it again)")


# ---------------------------------------------------------------- what a run writes


@dataclass(frozen=True)
class Places:
    """Where a run writes: its build directory (under MODELMINT_WORK_DIR), and when it registers, the repository's
    artifacts/ and the DVC cache (pipelines/store/dvcrepo.cache_dir), the default DVC remote when it is a directory
    of this machine (dvcrepo.local_remote_dir), and when it publishes, the storage of an OCI registry served from
    this machine (registry_storage), each possibly on its own filesystem."""

    work_dir: Path
    artifacts: Path | None = None
    dvc_cache: Path | None = None
    dvc_remote: Path | None = None
    """A local DVC remote: `dvc push` writes one more copy of each registered variant there."""
    oci_registry: Path | None = None
    """The blob storage of the registry the run publishes to, where it is known: one more copy of each variant."""
    publishes: bool = False
    """The run pushes each registered variant's image to an OCI registry (wherever that keeps its blobs)."""

    def of(self, location: DiskLocation) -> Path | None:
        return {"work_dir": self.work_dir, "artifacts": self.artifacts, "dvc_cache": self.dvc_cache,
                "dvc_remote": self.dvc_remote, "oci_registry": self.oci_registry}.get(location)


@dataclass(frozen=True)
class Output:
    """One file (or directory) a run writes: what it is, where, its predicted bytes, and the steps it lives through
    (`first` to `last`, indexes into the run's steps; `last` None: it stays after the run)."""

    what: str
    location: DiskLocation
    bytes: int
    first: int
    last: int | None = None
    path: Path | None = None
    """Where it will be; a finished one of an earlier run found there is already on the disk and needs nothing more."""
    scratch: bool = False
    """Needed only until every variant was validated (the f16, the importance matrix, the reference logits)."""

    def present_at(self, step: int, scratch_until: int | None = None) -> bool:
        last = scratch_until if self.scratch and scratch_until is not None else self.last
        return self.first <= step and (last is None or step <= last)


@dataclass(frozen=True)
class Memory:
    """One step's memory: `resident` bytes it allocates (the converter's tensors, a torch model) and `mapped` bytes
    of a file it maps (llama.cpp's tools mmap the model: short of memory they run, reading it from disk again)."""

    step: str
    resident: int
    mapped: int = 0

    @property
    def total(self) -> int:
        return self.resident + self.mapped


@dataclass(frozen=True)
class Filesystem:
    """One filesystem a run writes to, and what its peak needs there."""

    device: int
    locations: tuple[tuple[DiskLocation, Path], ...]
    needed: int
    """Bytes more than it holds now at the run's peak (finished outputs of an earlier run already count)."""
    free: int
    margin: int
    peak_step: str
    outputs: tuple[str, ...]
    """What is on it at that step."""

    @property
    def fits(self) -> bool:
        return self.needed + self.margin <= self.free

    @property
    def label(self) -> str:
        return " and ".join(f"{_WHAT[loc]} {path}" for loc, path in self.locations)


@dataclass(frozen=True)
class ResourceCheck:
    """A run's peak disk need per filesystem and its peak memory, against what the machine has now."""

    steps: tuple[str, ...]
    outputs: tuple[Output, ...]
    filesystems: tuple[Filesystem, ...]
    memory: tuple[Memory, ...]
    available_memory: int
    validated_at: int
    """The step after which no scratch output is read any more (the last variant's validation)."""
    variant_bytes: Mapping[str, int] = field(default_factory=dict)
    files: tuple[PlannedFile, ...] = ()
    """Each GGUF the run writes (the f16 and every variant), against the Hub's per-file limit."""
    publishes: bool = False

    @property
    def over_hub_limit(self) -> list[PlannedFile]:
        """The planned files one of which (or one of whose split parts) is larger than the Hub takes."""
        return [f for f in self.files if f.crosses]

    @property
    def notes(self) -> list[str]:
        """What the run's registered files mean for the Hub and Ollama (a variant over the Hub's per-file limit, or
        one registered as split parts), said before any work; the scratch f16's note stays in `files`."""
        return [f.note for f in self.files if f.note and not f.scratch]

    @property
    def unpublishable(self) -> list[PlannedFile]:
        """Variants the run would register as split parts and then fail to publish (an Ollama image holds one
        GGUF): refused before any work when the run publishes."""
        return [f for f in self.files if f.parts > 1] if self.publishes else []

    @property
    def peak_memory(self) -> Memory:
        return max(self.memory, key=lambda m: m.total)

    @property
    def peak_resident(self) -> Memory:
        return max(self.memory, key=lambda m: m.resident)

    @property
    def short(self) -> list[Filesystem]:
        return [fs for fs in self.filesystems if not fs.fits]

    @property
    def memory_fits(self) -> bool:
        """Whether what the steps allocate fits the available memory (a step short of it is killed)."""
        return self.peak_resident.resident <= self.available_memory

    @property
    def mapped_fits(self) -> bool:
        """Whether the model a llama.cpp tool maps fits in memory too (short of it, the tool reads it from disk
        again for every pass: slow, not refused)."""
        return self.peak_memory.total <= self.available_memory

    @property
    def fits(self) -> bool:
        return not self.short and self.memory_fits

    def to_dict(self) -> dict[str, Any]:
        return {
            "filesystems": [{"device": fs.device, "locations": {loc: str(p) for loc, p in fs.locations},
                             "needed": fs.needed, "free": fs.free, "margin": fs.margin, "peak_step": fs.peak_step,
                             "outputs": list(fs.outputs), "fits": fs.fits} for fs in self.filesystems],
            "memory": {"peak_step": self.peak_memory.step, "peak": self.peak_memory.total,
                       "resident": self.peak_resident.resident, "available": self.available_memory,
                       "fits": self.memory_fits},
            "files": [{"what": f.what, "bytes": f.bytes, "parts": f.parts, "largest": f.largest, "limit": f.limit,
                       "over_hub_limit": f.crosses, "scratch": f.scratch, "note": f.note} for f in self.files],
        }


_WHAT: dict[str, str] = {"work_dir": "the work dir", "artifacts": "artifacts/", "dvc_cache": "the DVC cache",
                         "dvc_remote": "the DVC remote", "oci_registry": "the OCI registry's storage"}

CONVERTER_RSS_PER_LARGEST_BF16 = 3.5
"""The GGUF converter's peak RSS over the bf16 bytes of the source's largest tensor (docs/scale.md: measured on a
983 M-parameter Qwen2-shaped model, 2.3 GB peak; it converts tensor by tensor, the embedding is the largest)."""
_LOGITS_HEADER = 20  # "_logits_", n_ctx (u32), n_vocab (i32), n_chunk (i32)


def logits_file_size(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    """The exact size of a complete `llama-perplexity --kl-divergence-base` file.

    A 20-byte header, the n_chunk x n_ctx evaluation tokens (int32), then per chunk the log-probabilities of the
    scored second half of the window (n_ctx - 1 - n_ctx/2 rows) as uint16 rows of nv = 2 * ceil(n_vocab / 2) + 4
    values (tools/perplexity/perplexity.cpp of the pinned tree: the header at 466-467 and 521-523, `first = n_ctx/2`
    at 540, process_logits called with n_ctx - 1 - first tokens at 612-614, nv at 147 and 524, each row written at
    172).
    """
    nv = 2 * ((n_vocab + 1) // 2) + 4
    return _LOGITS_HEADER + 4 * n_chunk * n_ctx + n_chunk * (n_ctx - 1 - n_ctx // 2) * nv * 2


def gguf_f16_bytes(shape: SourceShape) -> int:
    """The converter's f16 (or bf16) GGUF: 2 bytes per parameter, 4 for 1-D tensors (kept F32), header aside."""
    return 2 * (shape.params - shape.vector_params) + 4 * shape.vector_params


def gguf_quant_bytes(shape: SourceShape, qtype: str) -> int:
    """A llama-quantize output of `qtype`: the parameters at the type's bits per weight (llama.cpp's own figure for
    the whole file, its mix of types included; pipelines/core/vocab.GGUF_TYPES), plus what the weights whose rows
    its blocks cannot take cost in their fallback type (pipelines/core/preflight.gguf_fallback: Qwen2.5-72B's
    29568-column ffn_down, a quarter of its parameters, is Q5_0 in a Q4_K_M file)."""
    row = gguf_type(qtype)
    if row is None:
        raise ValueError(f"{qtype!r} is not a llama.cpp file type")
    extra = 0.0
    try:
        fallback = gguf_fallback(qtype, list(shape.weights)).fallback
    except ShapeRefused:
        fallback = []  # the variant is refused before any tool starts: its bytes do not matter
    for t in fallback:
        extra += t["params"] * (_bits(t["to"]) - _bits(row.ggml_type)) / 8
    return math.ceil(shape.params * row.bpw / 8 + extra)


def _bits(ggml_type: str) -> float:
    """Bits per weight of one ggml type: its block's bytes over its weights (gguf-py's GGML_QUANT_SIZES)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    return 8 * size / block


def imatrix_bytes(shape: SourceShape) -> int:
    """An importance matrix (llama-imatrix's GGUF): a sum of squares and a count per input column of each weight,
    bounded here by 8 bytes per row of every matrix (far under 1 % of the f16)."""
    return 8 * max(shape.params // 1024, 1) + (1 << 20)


def compressed_bytes(shape: SourceShape, scheme: str) -> int:
    """A compressed-tensors checkpoint of `scheme`: the transformer's matrices at the scheme's bits plus one bf16
    scale (and for asymmetric groups a packed zero point) per group or row; embeddings, output and 1-D tensors
    stay as stored."""
    row = COMPRESSED_SCHEMES.get(scheme)
    if row is None:
        raise ValueError(f"{scheme!r} is not a compressed-tensors scheme")
    quantized = shape.params - shape.embedding_params - shape.vector_params
    kept = shape.bytes * (shape.params - quantized) // shape.params
    group = GROUPED_PRESETS.get(row.presets[0])
    scales = quantized * (2 + 1) // group if group else 0  # a bf16 scale and half a byte of zero point per group
    return math.ceil(quantized * row.bits / 8) + scales + kept


def gguf_split_bytes(max_size: str) -> int:
    """llama-gguf-split's `--split-max-size N(M|G)` in bytes: decimal units, G = 10^9 (tools/gguf-split/gguf-split.cpp
    of the pinned tree, `split_str_to_n_bytes`, lines 74-90)."""
    n, unit = int(max_size[:-1]), max_size[-1]
    return n * (10**9 if unit == "G" else 10**6)


@dataclass(frozen=True)
class PlannedFile:
    """One GGUF a run writes (the f16, or a variant), the files it ends up as, and whether the Hub takes them."""

    what: str
    bytes: int
    scratch: bool = False
    """The f16: read by the build only, never registered or published."""
    split_max_size: str | None = None
    """The catalog's `split_max_size`: a variant larger than it is registered as llama-gguf-split's parts."""
    limit: int = HUB_FILE_LIMIT

    @property
    def parts(self) -> int:
        if self.scratch or self.split_max_size is None or self.bytes <= gguf_split_bytes(self.split_max_size):
            return 1
        return math.ceil(self.bytes / gguf_split_bytes(self.split_max_size))

    @property
    def largest(self) -> int:
        """The largest single file it is written as (one part of a split: at most `split_max_size`)."""
        return self.bytes if self.parts == 1 else min(self.bytes, gguf_split_bytes(str(self.split_max_size)))

    @property
    def crosses(self) -> bool:
        return self.largest > self.limit

    @property
    def note(self) -> str | None:
        """What it means for the run, when it crosses the Hub's limit or is split; None when neither."""
        limit = f"the Hugging Face Hub's per-file limit of {self.limit / 10**9:,.0f} GB"
        size = f"{self.bytes / 10**9:,.1f} GB ({_gib(self.bytes)})"
        if self.scratch:
            return (f"the {self.what}, {size}, is over {limit}; it is scratch (the build reads it, nothing registers "
                    "or publishes it), so it needs no split") if self.crosses else None
        if self.parts > 1:
            over = (f"; each part is still over {limit}: set a `split_max_size` of at most "
                    f"{self.limit // 10**9}G") if self.crosses else ""
            return (f"{self.what}, {size}, is registered as {self.parts} files of at most {self.split_max_size} "
                    f"(llama-gguf-split's NAME-00001-of-{self.parts:05d}.gguf …; llama.cpp loads them from the first)"
                    f"{over}; an Ollama image holds one GGUF, so it is not published for `ollama pull`")
        if self.crosses:
            return (f"{self.what} is one file of {size}, over {limit}: modelmint registers and publishes it whole and "
                    "splits nothing unless the catalog asks; to upload it to the Hub set `split_max_size: "
                    f"{self.limit // 10**9}G` under the entry's `gguf:` in registry/catalog.yaml (it is then registered "
                    "as llama-gguf-split's parts and gets no Ollama image), or cut a copy with `llama-gguf-split "
                    f"--split --split-max-size {self.limit // 10**9}G FILE PREFIX`")
        return None


def gguf_files(shape: SourceShape, quants: Sequence[str], *, split_max_size: str | None = None,
               limit: int = HUB_FILE_LIMIT) -> tuple[PlannedFile, ...]:
    """The f16 and each variant a GGUF run writes, with their predicted bytes, the parts a `split_max_size`
    cuts them into, and whether each file stays under the Hub's per-file `limit`."""
    return (PlannedFile("f16 GGUF", gguf_f16_bytes(shape), scratch=True, limit=limit),
            *(PlannedFile(q, gguf_quant_bytes(shape, q), split_max_size=split_max_size, limit=limit) for q in quants))


@dataclass(frozen=True)
class KLReference:
    """The evaluation the GGUF variants are measured with: llama-perplexity's window and chunk count."""

    ctx: int
    chunks: int


def gguf_run(shape: SourceShape, quants: Sequence[str], places: Places, *, imatrix: bool, kl: KLReference,
             keep_f16: bool = True, paths: Mapping[str, Path] | None = None,
             available_memory: int | None = None, margin: int | None = None,
             split_max_size: str | None = None) -> ResourceCheck:
    """The disk and memory a GGUF run (convert → imatrix → reference logits → quantize and validate each variant →
    register each) needs at its peak, against what the machine has now.

    The f16, the importance matrix and the reference logits stay until every variant was validated; with
    `keep_f16` False they are removed then, before the first registration. A run that registers (places.artifacts
    set) links each variant into artifacts/ and the DVC cache: a copy only where those are on another filesystem.
    `paths` names where each output goes ("f16", "imatrix", "logits", each quant type): one already there from an
    earlier run needs nothing more. Memory: the converter holds about 3.5x the largest tensor in bf16;
    llama-imatrix, llama-perplexity and llama-quantize map the f16, plus one window of float logits.

    With `split_max_size` (the catalog's), a passed variant larger than it is also written as llama-gguf-split's
    parts beside the whole file (pipelines/gguf/tools.split keeps what validation measured), and those parts are
    what registers. The result's `files` says, for the f16 and every variant, whether a file crosses the Hub's
    per-file limit (HUB_FILE_LIMIT).
    """
    f16 = gguf_f16_bytes(shape)
    steps = ["convert", *(["imatrix"] if imatrix else []), "reference logits",
             *(f"quantize and validate {q}" for q in quants), *_registration_steps(quants, places)]
    last_check = steps.index(f"quantize and validate {quants[-1]}") if quants else steps.index("reference logits")
    scratch_last = None if keep_f16 else last_check
    paths = paths or {}
    outputs = [Output("f16 GGUF", "work_dir", f16, 0, scratch_last, paths.get("f16"), scratch=True)]
    if imatrix:
        outputs.append(Output("importance matrix", "work_dir", imatrix_bytes(shape), steps.index("imatrix"),
                              scratch_last, paths.get("imatrix"), scratch=True))
    outputs.append(Output("KL reference logits", "work_dir", logits_file_size(kl.ctx, shape.vocab, kl.chunks),
                          steps.index("reference logits"), scratch_last, paths.get("logits"), scratch=True))
    files = gguf_files(shape, quants, split_max_size=split_max_size)
    sizes = {f.what: f.bytes for f in files if not f.scratch}
    for f in files[1:]:
        q = f.what
        outputs.append(Output(q, "work_dir", sizes[q], steps.index(f"quantize and validate {q}"), None, paths.get(q)))
        if f.parts > 1:  # the parts beside the whole file, in the build directory
            outputs.append(Output(f"{q} ({f.parts} split parts)", "work_dir", sizes[q],
                                  steps.index(f"quantize and validate {q}")))
        outputs += _registered(q, sizes[q], places, steps)
    window = 4 * kl.ctx * shape.vocab
    memory = [Memory("convert", math.ceil(CONVERTER_RSS_PER_LARGEST_BF16 * shape.largest_bf16)),
              *([Memory("imatrix", window, f16)] if imatrix else []),
              Memory("reference logits", window, f16),
              *(Memory(f"quantize {q}", 0, f16) for q in quants),
              *(Memory(f"validate {q}", window, sizes[q]) for q in quants)]
    check = _check(steps, outputs, memory, places, last_check, sizes, available_memory, margin)
    return replace(check, files=files, publishes=places.publishes or places.oci_registry is not None)


def compressed_run(shape: SourceShape, schemes: Sequence[str], places: Places, *, eval_ctx: int, eval_chunks: int,
                   paths: Mapping[str, Path] | None = None, available_memory: int | None = None,
                   margin: int | None = None) -> ResourceCheck:
    """The disk and memory a compressed-tensors run (quantize and evaluate each scheme → register each) needs at
    its peak, against what the machine has now.

    Memory: llmcompressor loads the source as stored (bf16); the evaluation loads the source and then each variant
    in float32 (4 bytes per parameter, pipelines/scripts/llmc_evaluate.py) and keeps the source's log-probabilities
    of every window (float32 over the vocabulary) while it does.
    """
    steps = [*(f"quantize and evaluate {s}" for s in schemes), *_registration_steps(schemes, places)]
    paths = paths or {}
    sizes = {s: compressed_bytes(shape, s) for s in schemes}
    outputs: list[Output] = []
    for s in schemes:
        outputs.append(Output(s, "work_dir", sizes[s], steps.index(f"quantize and evaluate {s}"), None, paths.get(s)))
        outputs += _registered(s, sizes[s], places, steps)
    reference = 4 * eval_chunks * eval_ctx * shape.vocab
    memory = [Memory("quantize", shape.bytes), Memory("evaluate", 4 * shape.params + 2 * reference)]
    return _check(steps, outputs, memory, places, len(schemes) - 1, sizes, available_memory, margin)


def _registration_steps(tags: Sequence[str], places: Places) -> list[str]:
    """The run's steps after its builds: each variant registered (with its push to the DVC remote), then, with a
    known registry storage, each published (the convert flow's order: scratch files stay until all are done)."""
    if places.artifacts is None:
        return []
    return [*(f"register {t}" for t in tags), *(f"publish {t}" for t in tags if places.oci_registry is not None)]


def _registered(tag: str, size: int, places: Places, steps: list[str]) -> list[Output]:
    """The registered copies of a variant: artifacts/ takes the build output's weights as a hard link, and the DVC
    cache the placed inode (pipelines/registry/register.py `place` and `track`), so artifacts/ costs bytes only on
    a filesystem other than the work dir's, and the cache only on one other than artifacts/'. A local DVC remote
    and a local registry's storage each get a copy of their own (`dvc push` and the registry's blob upload write
    new files, whatever disk they are on)."""
    if places.artifacts is None:
        return []
    at = steps.index(f"register {tag}")
    artifacts = _device(places.artifacts)
    out = []
    if artifacts != _device(places.work_dir):
        out.append(Output(f"{tag} (artifacts/)", "artifacts", size, at))
    if places.dvc_cache is not None and _device(places.dvc_cache) != artifacts:
        out.append(Output(f"{tag} (DVC cache)", "dvc_cache", size, at))
    if places.dvc_cache is not None and places.dvc_remote is not None:
        out.append(Output(f"{tag} (DVC remote)", "dvc_remote", size, at))
    if places.oci_registry is not None:
        out.append(Output(f"{tag} (OCI registry)", "oci_registry", size, steps.index(f"publish {tag}")))
    return out


def _device(path: Path) -> int:
    return os.stat(_existing(path)).st_dev


def _check(steps: list[str], outputs: list[Output], memory: list[Memory], places: Places, validated_at: int,
           sizes: dict[str, int], available_memory: int | None, margin: int | None) -> ResourceCheck:
    devices: dict[int, list[tuple[DiskLocation, Path]]] = {}
    kinds: tuple[DiskLocation, ...] = ("work_dir", "artifacts", "dvc_cache", "dvc_remote", "oci_registry")
    for loc in kinds:
        if (p := places.of(loc)) is not None:
            devices.setdefault(os.stat(_existing(p)).st_dev, []).append((loc, p))
    filesystems = []
    for dev, locations in devices.items():
        here = {loc for loc, _ in locations}
        mine = [o for o in outputs if o.location in here]
        usage = shutil.disk_usage(_existing(locations[0][1]))
        best, at = _peak(mine, len(steps))
        filesystems.append(Filesystem(
            dev, tuple(locations), best, usage.free, _margin(usage.total) if margin is None else margin, steps[at],
            tuple(o.what for o in mine if o.present_at(at))))
    if available_memory is None:
        import psutil

        available_memory = int(psutil.virtual_memory().available)
    return ResourceCheck(tuple(steps), tuple(outputs), tuple(filesystems), tuple(memory), available_memory,
                         validated_at, sizes)


def _peak(outputs: list[Output], steps: int, scratch_until: int | None = None, *,
          held: bool = True) -> tuple[int, int]:
    """The most bytes `outputs` take at once over the run's steps (with `held`, less what is already on the disk),
    and the step where they do."""
    best, at = 0, 0
    for i in range(steps):
        total = sum(_still_needed(o) if held else o.bytes for o in outputs if o.present_at(i, scratch_until))
        if total > best:
            best, at = total, i
    return best, at


def _still_needed(o: Output) -> int:
    """Bytes `o` still has to take: none for a finished output of an earlier run found in place."""
    if o.path is None or not o.path.exists():
        return o.bytes
    held = o.path.stat().st_size if o.path.is_file() else sum(
        f.stat().st_size for f in o.path.rglob("*") if f.is_file())
    return max(0, o.bytes - held)


def _margin(total: int) -> int:
    """Space kept free on a filesystem beyond the run's peak: 5 % of it, at most 1 GiB (logs, receipts, DVC's
    state, other writers)."""
    return min(GIB, total // 20)


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB else f"{n / (1 << 20):,.1f} MiB"


# ---------------------------------------------------------------- the refusal


def require(check: ResourceCheck, *, what: str, variants_option: str = "--variants") -> ResourceCheck:
    """`check` when the run fits; otherwise a refusal naming each short filesystem (or the memory) with what the
    run needs there at its peak and what is free, and the ways out with what each gives back.

    Raises:
        ConfigError: the run publishes and a variant would be registered as split parts (the catalog's
            split_max_size), which no Ollama image holds: refused before it registers anything.
        RunTooLarge: a filesystem lacks space for the run's peak (plus its margin), or a step's own allocations
            exceed the available memory.
    """
    if parts := check.unpublishable:
        names = ", ".join(f"{f.what} ({_gib(f.bytes)}: {f.parts} parts)" for f in parts)
        raise ConfigError(
            f"{what}: {names} would be registered as llama-gguf-split parts (the catalog's split_max_size "
            f"{parts[0].split_max_size}) and then fail to publish: an Ollama image holds one GGUF; nothing was started",
            hint="remove `split_max_size` from the entry's `gguf:` in registry/catalog.yaml to register and publish "
            "each variant whole (a file over the Hub's 50 GB limit is then split only for an upload: `llama-gguf-split "
            "--split --split-max-size 50G FILE PREFIX`), or run without publishing (MODELMINT_OCI_REGISTRY unset), then rerun the "
            "same command")
    if check.fits:
        return check
    shortfalls = [(f"{fs.label} (peak at {fs.peak_step}, plus a margin of {_gib(fs.margin)})", fs.needed + fs.margin,
                   fs.free) for fs in check.short]
    ways = []
    if check.short:
        if check.variant_bytes:
            each = ", ".join(f"{v} {_gib(b)}" for v, b in check.variant_bytes.items())
            copies = "each registered variant is copied to artifacts/ or the DVC cache on their own disk; " if any(
                o.location in ("artifacts", "dvc_cache") for o in check.outputs) else ""
            ways.append(f"ask for fewer variants with `{variants_option}` ({copies}{each})")
        # (no way out offered for the f16 and the logits: a registering run removes them itself once every variant
        # passed, before its first registration, register.drop_scratch; no setting removes them sooner)
        for fs in check.short:
            locs = {loc for loc, _ in fs.locations}
            if "work_dir" in locs:
                ways.append(f"point MODELMINT_WORK_DIR at another disk (it takes {_gib(_work_need(check))} there at "
                            f"its peak{_gives_back(check, fs, 'work_dir')})")
            if "dvc_cache" in locs and any(o.location == "dvc_cache" for o in _on(check, fs)):
                # (a cache beside artifacts/ holds the same inodes: moving it elsewhere gives nothing back)
                ways.append("move the DVC cache to another disk with `dvc cache dir /path/on/a/larger/disk` (run in "
                            f"the repository{_gives_back(check, fs, 'dvc_cache')})")
            if "dvc_remote" in locs:
                ways.append("point the DVC remote at another disk (`dvc remote modify local url /path/on/a/larger/disk`"
                            f", or a remote that is not a directory of this machine{_gives_back(check, fs, 'dvc_remote')})")
            if "oci_registry" in locs:
                ways.append("serve the OCI registry from another disk (`modelmint registry serve --dir "
                            f"/path/on/a/larger/disk`{_gives_back(check, fs, 'oci_registry')}), or publish later with "
                            "`modelmint publish` once the build's scratch files are gone")
            if "artifacts" in locs and "work_dir" not in locs:
                ways.append(f"free {_gib(fs.needed + fs.margin - fs.free)} more on the disk holding the repository "
                            "(artifacts/ is part of it)")
    if not check.memory_fits:
        m = check.peak_resident
        shortfalls.append((f"memory ({m.step})", m.resident, check.available_memory))
        ways.append(f"run on a machine with more than {_gib(m.resident)} of memory available (or stop what else "
                    "holds it)")
    raise RunTooLarge(what, shortfalls, hint="; or ".join(ways) + ", then rerun the same command")


def _on(check: ResourceCheck, fs: Filesystem) -> list[Output]:
    here = {loc for loc, _ in fs.locations}
    return [o for o in check.outputs if o.location in here]


def _gives_back(check: ResourceCheck, fs: Filesystem, location: DiskLocation) -> str:
    """How much lower `fs`'s peak is without `location` on it (nothing when it is the only place there)."""
    if len(fs.locations) < 2:
        return ""
    rest = [o for o in _on(check, fs) if o.location != location]
    return f": {_gib(fs.needed - _peak(rest, len(check.steps))[0])} less on this one"


def _work_need(check: ResourceCheck) -> int:
    """The work dir's own peak, alone on an empty disk."""
    return _peak([o for o in check.outputs if o.location == "work_dir"], len(check.steps), held=False)[0]
