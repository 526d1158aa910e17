"""Read a GGUF back without loading it: the header walk, what a build checks in it, an importance matrix's record."""

from __future__ import annotations

import functools
import math
import mmap
import re
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from pipelines.core.errors import ArtifactError
from pipelines.core.fsutil import open_input
from pipelines.core.vocab import GGUFKey

GGUF_MAGIC = b"GGUF"
SUPPORTED_GGUF_VERSIONS = (2, 3)
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})
MIN_QUANTIZED_SHARE = 0.9
"""check_gguf refuses a quantized output with less than this share of its 2-D weights quantized (and pre-flight refuses
a build it predicts would end so)."""


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file says about itself, read from its header (read_gguf_header)."""

    path: str
    size_bytes: int
    version: int
    architecture: str
    name: str | None
    file_type: str | None
    tensor_count: int
    parameter_count: int
    tensor_types: dict[str, int]
    """ggml type → number of tensors of that type."""
    quantized_fraction: float
    """Share of the parameters of 2-D weight tensors stored in a quantized (non-float) type."""
    chat_template: str | None
    tokenizer_model: str | None
    tokenizer_pre: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    eot_token_id: int | None
    context_length: int | None
    split_count: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)
    """Provenance keys: general.* source and quantization fields, modelmint.*, quantize.imatrix.*."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("chat_template")
        d["has_chat_template"] = self.chat_template is not None
        return d


_PROVENANCE = re.compile(r"^(modelmint\.|quantize\.imatrix\.|general\.(source|quantized_by|base_model|name|license|file_type|quantization_version))")


SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    """Absolute byte offset of the tensor's data in the file."""

    @property
    def nbytes(self) -> int:
        """The bytes its data takes in the file (ValueError for a ggml type gguf-py does not know)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        return math.prod(self.shape) // block * type_size


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    """Only the keys asked for (every other value is skipped over, not decoded)."""
    tensors: list[TensorEntry]


def read_gguf_header(path: Path, keep: Callable[[str, dict[str, Any]], bool]) -> GGUFHeader:
    """Walk a GGUF's header once: the metadata values `keep(key, found_so_far)` asks for, and the tensor table.

    gguf-py's GGUFReader maps every array item into its own numpy view (a 150k-token vocabulary takes
    5-15 s); this decodes only what is asked for, so reading back a multi-GB output costs milliseconds.

    Raises:
        ArtifactError: not a GGUF, an unsupported version, or a header that is truncated or damaged.
    """
    with _mapped(Path(path)) as mm:
        version, n_tensors, n_kv = _counts(mm, path)
        cur = _Cursor(mm, 24)
        found: dict[str, Any] = {}
        alignment = 32
        entries: list[tuple[str, tuple[int, ...], int, int]] = []
        try:
            for _ in range(n_kv):
                key = cur.string()
                wanted = keep(key, found)
                v = cur.value(cur.scalar("I"), wanted or key == GGUFKey.ALIGNMENT)
                if key == GGUFKey.ALIGNMENT and isinstance(v, int) and v > 0:
                    alignment = v
                if wanted:
                    found[key] = v
            for _ in range(n_tensors):
                name = cur.string()
                dims = cur.scalars(f"{cur.scalar('I')}Q")
                ggml_type, offset = cur.scalars("IQ")
                entries.append((name, tuple(int(d) for d in dims), ggml_type, offset))
        except _DAMAGED as err:
            raise _damaged(path, err) from err
        data_start = cur.pos + (-cur.pos % alignment)
    tensors = [TensorEntry(n, shape, t, data_start + off) for n, shape, t, off in entries]
    return GGUFHeader(version, found, tensors)


@dataclass(frozen=True)
class GGUFLayout:
    """Where each part of a GGUF's header lies: what a metadata rewrite copies byte for byte around the keys it
    changes (tensor offsets count from `data_start`, so the tensor table and the data move as they are)."""

    version: int
    n_tensors: int
    kv: list[tuple[str, int, int]]
    """Each metadata entry: its key, and the byte range of the whole entry (key, type, value)."""
    tensor_table: tuple[int, int]
    data_start: int
    alignment: int


def gguf_layout(path: Path) -> GGUFLayout:
    """The byte layout of a GGUF's header (read_gguf_header's walk, keeping positions instead of values).

    Raises:
        ArtifactError: not a GGUF, an unsupported version, or a header that is truncated or damaged.
    """
    with _mapped(Path(path)) as mm:
        version, n_tensors, n_kv = _counts(mm, path)
        cur, kv, alignment = _Cursor(mm, 24), [], 32
        try:
            for _ in range(n_kv):
                start = cur.pos
                key = cur.string()
                value = cur.value(cur.scalar("I"), key == GGUFKey.ALIGNMENT)
                if key == GGUFKey.ALIGNMENT and isinstance(value, int) and value > 0:
                    alignment = value
                kv.append((str(key), start, cur.pos))
            table = cur.pos
            for _ in range(n_tensors):
                cur.string(False)
                cur.scalars(f"{cur.scalar('I')}Q")
                cur.scalars("IQ")
        except _DAMAGED as err:
            raise _damaged(path, err) from err
        return GGUFLayout(version, n_tensors, kv, (table, cur.pos), cur.pos + (-cur.pos % alignment), alignment)


# llama.cpp's reader refuses an array whose items are arrays ("key '%s' has invalid GGUF type", gguf_init_from_file_impl
# in ggml/src/gguf.cpp:606 of the pinned tree, 0c1e570); gguf-py writes them, so a bound keeps a hostile file from
# walking this reader into a RecursionError while leaving room for whatever gguf-py tools nest.
_MAX_ARRAY_DEPTH = 16

_DAMAGED = (struct.error, ValueError, OverflowError, MemoryError)
"""What walking a truncated or damaged header raises."""


def _counts(mm: mmap.mmap, path: Path) -> tuple[int, int, int]:
    """The header's version, tensor count and metadata count, after checking the version is one this walker reads."""
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
    if version not in SUPPORTED_GGUF_VERSIONS:
        raise ArtifactError(f"{path}: GGUF version {version} is not supported (want {SUPPORTED_GGUF_VERSIONS})")
    return version, n_tensors, n_kv


def _damaged(path: Path, err: BaseException) -> ArtifactError:
    return ArtifactError(f"{path} is damaged or truncated inside its header: {err}",
                         hint="delete it and rerun the step that wrote it")


def _mapped(path: Path) -> mmap.mmap:
    """The file mapped read-only, after checking it is a GGUF (clear errors for a missing path or a directory)."""
    fh = open_input(path, lambda msg, hint: ArtifactError(msg, hint=hint),
                    missing=(f"{path} does not exist", "check the path; `modelmint convert` writes to build/"),
                    directory=(f"{path} is a directory, not a GGUF file",
                               f"pass one of the .gguf files in it (`ls {path}`)"))
    with fh:
        if path.stat().st_size < 24 or fh.read(4) != GGUF_MAGIC:
            fh.seek(0)
            raise ArtifactError(f"{path} is not a GGUF file (magic {fh.read(4)!r})", hint="pass a .gguf file")
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


_U64 = struct.Struct("<Q")


@functools.lru_cache(maxsize=64)
def _struct(fmt: str) -> struct.Struct:
    return struct.Struct("<" + fmt)


class _Cursor:
    """A position in a mapped GGUF header, reading little-endian values forward."""

    def __init__(self, mm: mmap.mmap, pos: int) -> None:
        self.mm, self.pos = mm, pos

    def scalars(self, fmt: str) -> tuple[Any, ...]:
        packed = _struct(fmt)
        got = packed.unpack_from(self.mm, self.pos)
        self.pos += packed.size
        return got

    def scalar(self, fmt: str) -> Any:
        return self.scalars(fmt)[0]

    @overload
    def string(self) -> str: ...
    @overload
    def string(self, wanted: Literal[True]) -> str: ...
    @overload
    def string(self, wanted: bool) -> str | None: ...
    def string(self, wanted: bool = True) -> str | None:
        n = _U64.unpack_from(self.mm, self.pos)[0]
        start = self.pos + 8
        if start + n > len(self.mm):
            raise struct.error("string runs past the end of the file")
        self.pos = start + n
        return bytes(self.mm[start : self.pos]).decode("utf-8", errors="replace") if wanted else None

    def strings(self, count: int, wanted: bool) -> list[str] | None:
        """An array of `count` strings (a vocabulary: 150k items), in one tight loop; decoded only when wanted."""
        mm, pos, end, unpack = self.mm, self.pos, len(self.mm), _U64.unpack_from
        items: list[str] | None = [] if wanted else None
        for _ in range(count):
            n = unpack(mm, pos)[0]
            pos += 8
            if pos + n > end:
                raise struct.error("string runs past the end of the file")
            if items is not None:
                items.append(bytes(mm[pos : pos + n]).decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return items

    def value(self, kind: int, wanted: bool, depth: int = 0) -> Any:
        """One metadata value of GGUF type `kind`; decoded only when wanted (skipped otherwise)."""
        if kind == _STRING:
            return self.string(wanted)
        if kind == _ARRAY:
            if depth >= _MAX_ARRAY_DEPTH:
                raise ValueError(f"metadata arrays nested more than {_MAX_ARRAY_DEPTH} deep (llama.cpp reads no "
                                 "array of arrays)")
            sub, count = self.scalars("IQ")
            if sub in SCALAR_FORMATS:
                width = struct.calcsize(SCALAR_FORMATS[sub])
                items = list(struct.unpack_from(f"<{count}{SCALAR_FORMATS[sub]}", self.mm, self.pos)) if wanted else None
                self.pos += width * count
                return items
            if sub == _STRING:
                return self.strings(count, wanted)
            got = [self.value(sub, wanted, depth + 1) for _ in range(count)]
            return got if wanted else None
        fmt = SCALAR_FORMATS.get(kind)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self.scalar(fmt)


_INFO_KEYS = frozenset({
    GGUFKey.ARCHITECTURE, GGUFKey.NAME, GGUFKey.FILE_TYPE, GGUFKey.SPLIT_NO, GGUFKey.SPLIT_COUNT,
    GGUFKey.CHAT_TEMPLATE, GGUFKey.TOKENIZER_MODEL, GGUFKey.TOKENIZER_PRE, GGUFKey.BOS_ID,
    GGUFKey.EOS_ID, GGUFKey.EOT_ID,
})


def is_context_length(key: str, found: dict[str, Any]) -> bool:
    """Whether `key` is the model's `<arch>.context_length` (general.architecture precedes it in the header)."""
    return key == GGUFKey.context_length(found.get(GGUFKey.ARCHITECTURE))


def _wanted_for_info(key: str, found: dict[str, Any]) -> bool:
    return key in _INFO_KEYS or bool(_PROVENANCE.match(key)) or is_context_length(key, found)


_STR, _INT = "a string", "an integer"
# The type llama.cpp asks for each key it reads (llama_model_loader::get_key throws "key %s has wrong type %s but
# expected type %s", src/llama-model-loader.cpp:168 of the pinned tree): a file that disagrees would not load.
_INFO_TYPES = {
    GGUFKey.ARCHITECTURE: _STR, GGUFKey.NAME: _STR, GGUFKey.FILE_TYPE: _INT, GGUFKey.SPLIT_NO: _INT,
    GGUFKey.SPLIT_COUNT: _INT, GGUFKey.CHAT_TEMPLATE: _STR, GGUFKey.TOKENIZER_MODEL: _STR, GGUFKey.TOKENIZER_PRE: _STR,
    GGUFKey.BOS_ID: _INT, GGUFKey.EOS_ID: _INT, GGUFKey.EOT_ID: _INT,
}


def _described(value: Any) -> str:
    kind = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array"}.get(
        type(value), type(value).__name__)
    shown = repr(value)
    return f"{kind} ({shown[:40]}{'…' if len(shown) > 40 else ''})"


def _check_info_types(path: Path, meta: dict[str, Any]) -> None:
    """Raises ArtifactError naming the first metadata key inspect reads whose value has the wrong GGUF type."""
    arch = meta.get(GGUFKey.ARCHITECTURE)
    wants = {**_INFO_TYPES, **({GGUFKey.context_length(arch): _INT} if isinstance(arch, str) else {})}
    for key, want in wants.items():
        if key not in meta:
            continue
        value = meta[key]
        ok = isinstance(value, str) if want == _STR else isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            raise ArtifactError(f"{path}: metadata {key} is {_described(value)}, not {want} as llama.cpp reads it",
                                hint="the file was written wrong: delete it and rerun the step that wrote it "
                                "(`modelmint convert NAME`, or `modelmint pull NAME:TAG` for a registered one)")


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read a GGUF's header, metadata and tensor table, checking magic, version and tensor bounds.

    Raises:
        ArtifactError: not a GGUF, an unsupported version, truncated, missing required metadata, or metadata
            of the wrong type.
    """
    return read_checked_gguf(path)[0]


def read_checked_gguf(
    path: Path, also: Callable[[str, dict[str, Any]], bool] = lambda _key, _found: False
) -> tuple[GGUFInfo, GGUFHeader]:
    """inspect_gguf's reading and checks, with the header itself: its metadata holds the keys inspect reads and
    those `also(key, found_so_far)` asks for (what a plan sizes a model by), so every reader checks alike.

    Raises:
        ArtifactError: as inspect_gguf.
    """
    from gguf import GGMLQuantizationType, LlamaFileType

    path = Path(path)
    header = read_gguf_header(path, lambda key, found: _wanted_for_info(key, found) or also(key, found))
    meta = header.metadata
    _check_info_types(path, meta)
    size = path.stat().st_size
    tensor_types: Counter[str] = Counter()
    params_2d = 0
    quant_2d = 0
    n_params = 0
    for t in header.tensors:
        try:
            qtype = GGMLQuantizationType(t.ggml_type)
        except ValueError:
            raise ArtifactError(f"{path}: tensor {t.name} has unknown ggml type {t.ggml_type}",
                                hint="delete it and rerun the step that wrote it") from None
        n = math.prod(t.shape)
        end = t.offset + t.nbytes
        if end > size:
            raise ArtifactError(
                f"{path} is truncated: tensor {t.name} ends at byte {end}, file has {size}",
                hint="an interrupted write or copy cut it short: delete it and rerun the step that wrote it "
                "(`modelmint convert NAME` rebuilds a build output, `modelmint pull NAME:TAG` fetches a registered "
                "artifact again)",
            )
        tensor_types[qtype.name] += 1
        n_params += n
        if len([d for d in t.shape if d > 1]) >= 2:
            params_2d += n
            if qtype.name not in _FLOAT_TYPES:
                quant_2d += n
    arch = meta.get(GGUFKey.ARCHITECTURE)
    split_no = int(meta.get(GGUFKey.SPLIT_NO) or 0)
    if not arch and split_no > 0:
        arch = ""  # llama-gguf-split keeps the model's metadata in the first shard only
    elif not arch:
        raise ArtifactError(f"{path} has no general.architecture", hint="reconvert it with `modelmint convert`")
    ftype_val = meta.get(GGUFKey.FILE_TYPE)
    try:
        file_type = LlamaFileType(int(ftype_val)).name.removeprefix("MOSTLY_") if ftype_val is not None else None
    except ValueError:
        file_type = str(ftype_val)
    metadata = {}
    for key, val in meta.items():
        if _PROVENANCE.match(key) and (
            isinstance(val, (str, int, float, bool)) or val is None or (isinstance(val, list) and len(val) < 64)
        ):
            metadata[key] = val
    info = GGUFInfo(
        path=str(path),
        size_bytes=size,
        version=header.version,
        architecture=str(arch),
        name=meta.get(GGUFKey.NAME),
        file_type=file_type,
        tensor_count=len(header.tensors),
        parameter_count=n_params,
        tensor_types=dict(sorted(tensor_types.items())),
        quantized_fraction=(quant_2d / params_2d) if params_2d else 0.0,
        chat_template=meta.get(GGUFKey.CHAT_TEMPLATE),
        tokenizer_model=meta.get(GGUFKey.TOKENIZER_MODEL),
        tokenizer_pre=meta.get(GGUFKey.TOKENIZER_PRE),
        bos_token_id=meta.get(GGUFKey.BOS_ID),
        eos_token_id=meta.get(GGUFKey.EOS_ID),
        eot_token_id=meta.get(GGUFKey.EOT_ID),
        context_length=meta.get(GGUFKey.context_length(arch)),
        split_count=int(meta.get(GGUFKey.SPLIT_COUNT) or 1),
        metadata=metadata,
    )
    return info, header


def architecture_problem(path: Path) -> str | None:
    """What contradicts a GGUF's declared architecture in its tensor table (tensor names gguf-py's MODEL_TENSORS
    does not list for it), or None: nothing does, it is a later split shard, or gguf-py does not know the name.

    llama.cpp loads a model by its declared architecture and refuses one holding tensors that architecture does
    not create ("wrong number of tensors", llama_model_loader::done_getting_tensors, src/llama-model-loader.cpp:1398
    of the pinned tree), so a file that contradicts itself would only fail where it is served.

    Raises:
        ArtifactError: not a GGUF, or a damaged header.
    """
    from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

    header = read_gguf_header(Path(path), lambda key, _found: key == GGUFKey.ARCHITECTURE)
    arch = header.metadata.get(GGUFKey.ARCHITECTURE)
    by_name = {name: a for a, name in MODEL_ARCH_NAMES.items()}
    if not isinstance(arch, str) or arch not in by_name:
        return None
    known = [re.compile(re.sub(r"\\\{\w+\\\}", r"\\d+", re.escape(TENSOR_NAMES[t])))
             for t in MODEL_TENSORS[by_name[arch]]]
    foreign = [t.name for t in header.tensors
               if not any(p.fullmatch(re.sub(r"\.(weight|bias)$", "", t.name)) for p in known)]
    if not foreign:
        return None
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    return (f"it declares architecture {arch!r} but {len(foreign)} of its {len(header.tensors)} tensors are not "
            f"ones {arch} has ({shown}); llama.cpp would refuse to load it")


def refuse_contradicting_architecture(path: Path) -> None:
    """Raises ArtifactError when a GGUF's tensors are not ones its declared architecture has (architecture_problem):
    llama.cpp would refuse to load it, and a plan would size it by the wrong architecture."""
    problem = architecture_problem(path)
    if problem:
        raise ArtifactError(f"{path}: {problem}", hint="its general.architecture or its tensors are wrong: rebuild it "
                            "with `modelmint convert NAME` (or `modelmint pull NAME:TAG` for a registered one)")


def check_gguf(info: GGUFInfo, *, expect_file_type: str, require_chat_template: bool = True) -> None:
    """Check an output against what the step promised, beyond 'the tool exited 0'.

    Raises:
        ArtifactError: wrong file type, weights left unquantized, no tokenizer, no chat template, no eos.
    """
    problems = []
    want = expect_file_type.upper()
    if info.file_type != want:
        problems.append(f"general.file_type is {info.file_type}, expected {want}")
    if want not in _FLOAT_TYPES and info.quantized_fraction < MIN_QUANTIZED_SHARE:
        problems.append(
            f"only {info.quantized_fraction:.0%} of the 2-D weights are quantized (types: {info.tensor_types})"
        )
    if not info.tokenizer_model:
        problems.append("no tokenizer.ggml.model (tokenizer missing)")
    if info.eos_token_id is None:
        problems.append("no tokenizer.ggml.eos_token_id: generation would never stop")
    if require_chat_template and not info.chat_template:
        problems.append("no tokenizer.chat_template: chat front-ends would guess the prompt format")
    if problems:
        raise ArtifactError(f"{info.path}: " + "; ".join(problems), hint="delete it and rerun the step")


def read_imatrix(path: Path) -> dict[str, Any]:
    """The datasets, chunk count and chunk size an imatrix GGUF records (llama-imatrix --output-format gguf).

    Raises:
        ArtifactError: not a GGUF, or not an importance matrix.
    """
    keys = {GGUFKey.TYPE, GGUFKey.IMATRIX_DATASETS, GGUFKey.IMATRIX_CHUNK_COUNT, GGUFKey.IMATRIX_CHUNK_SIZE}
    meta = read_gguf_header(path, lambda key, _found: key in keys).metadata
    if meta.get(GGUFKey.TYPE) != "imatrix":
        raise ArtifactError(f"{path} is not an importance matrix (general.type {meta.get(GGUFKey.TYPE)!r})",
                            hint="delete it and rerun the step that wrote it")
    return {
        "datasets": list(meta.get(GGUFKey.IMATRIX_DATASETS) or []),
        "chunks": int(meta.get(GGUFKey.IMATRIX_CHUNK_COUNT) or 0),
        "chunk_size": int(meta.get(GGUFKey.IMATRIX_CHUNK_SIZE) or 0),
    }


def check_imatrix(path: Path) -> None:
    """Read an importance matrix GGUF back: its type, chunk count, and every tensor within the file.

    Raises:
        ArtifactError: not an imatrix GGUF, no data, or truncated.
    """
    header = read_gguf_header(path, lambda key, _found: key in (GGUFKey.TYPE, GGUFKey.IMATRIX_CHUNK_COUNT))
    problems = []
    if header.metadata.get(GGUFKey.TYPE) != "imatrix":
        problems.append(f"general.type is {header.metadata.get(GGUFKey.TYPE)!r}, not 'imatrix'")
    if not header.metadata.get(GGUFKey.IMATRIX_CHUNK_COUNT):
        problems.append("imatrix.chunk_count is 0: no calibration text was processed")
    if not header.tensors:
        problems.append("it holds no tensors")
    size = path.stat().st_size
    for t in header.tensors:
        try:
            end = t.offset + t.nbytes
        except ValueError:
            problems.append(f"tensor {t.name} has unknown ggml type {t.ggml_type}")
            break
        if end > size:
            problems.append(f"truncated: tensor {t.name} ends at byte {end}, the file has {size}")
            break
    if problems:
        raise ArtifactError(f"{path} is not a complete importance matrix: " + "; ".join(problems),
                            hint="rerun the same command to compute it again")
