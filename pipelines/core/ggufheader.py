"""GGUF steps: convert Safetensors to f16/bf16, quantize, imatrix, split, and read a GGUF back to check it."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.core.errors import ArtifactError, ToolError, UnsupportedModel
from pipelines.core.fsutil import atomic_output, partial_path
from pipelines.core.runner import ToolRun, run
from pipelines.core.toolchains import LlamaCpp

GGUF_MAGIC = b"GGUF"
SUPPORTED_GGUF_VERSIONS = (2, 3)
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


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


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
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
    import mmap
    import struct

    path = Path(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, after the mmap
    except FileNotFoundError as err:
        raise ArtifactError(f"{path} does not exist", hint="check the path; `modelmint convert` writes to build/") from err
    except IsADirectoryError as err:
        raise ArtifactError(f"{path} is a directory, not a GGUF file",
                            hint=f"pass one of the .gguf files in it (`ls {path}`)") from err
    except OSError as err:
        raise ArtifactError(f"{path} cannot be read: {err.strerror or err}", hint="check the path and its "
                            "permissions") from err
    with fh:
        if path.stat().st_size < 24 or fh.read(4) != GGUF_MAGIC:
            fh.seek(0)
            raise ArtifactError(f"{path} is not a GGUF file (magic {fh.read(4)!r})", hint="pass a .gguf file")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    with mm:
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
        if version not in SUPPORTED_GGUF_VERSIONS:
            raise ArtifactError(f"{path}: GGUF version {version} is not supported (want {SUPPORTED_GGUF_VERSIONS})")
        pos = 24

        def string() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", mm, pos)
            if pos + 8 + n > len(mm):
                raise struct.error("string runs past the end of the file")
            pos += 8 + n
            return bytes(mm[pos - n : pos]).decode("utf-8", errors="replace")

        def value(kind: int, wanted: bool) -> Any:
            nonlocal pos
            if kind == _STRING:
                if wanted:
                    return string()
                (n,) = struct.unpack_from("<Q", mm, pos)
                pos += 8 + n
                return None
            if kind == _ARRAY:
                sub, count = struct.unpack_from("<IQ", mm, pos)
                pos += 12
                if sub in _SCALARS:
                    width = struct.calcsize(_SCALARS[sub])
                    items = list(struct.unpack_from(f"<{count}{_SCALARS[sub]}", mm, pos)) if wanted else None
                    pos += width * count
                    return items
                got = [value(sub, wanted) for _ in range(count)]
                return got if wanted else None
            fmt = _SCALARS.get(kind)
            if fmt is None:
                raise ValueError(f"unknown GGUF value type {kind}")
            (v,) = struct.unpack_from("<" + fmt, mm, pos)
            pos += struct.calcsize(fmt)
            return v

        found: dict[str, Any] = {}
        alignment = 32
        entries: list[tuple[str, tuple[int, ...], int, int]] = []
        try:
            for _ in range(n_kv):
                key = string()
                (kind,) = struct.unpack_from("<I", mm, pos)
                pos += 4
                wanted = keep(key, found)
                v = value(kind, wanted or key == "general.alignment")
                if key == "general.alignment" and isinstance(v, int) and v > 0:
                    alignment = v
                if wanted:
                    found[key] = v
            for _ in range(n_tensors):
                name = string()
                (n_dims,) = struct.unpack_from("<I", mm, pos)
                dims = struct.unpack_from(f"<{n_dims}Q", mm, pos + 4)
                pos += 4 + 8 * n_dims
                ggml_type, offset = struct.unpack_from("<IQ", mm, pos)
                pos += 12
                entries.append((name, tuple(int(d) for d in dims), ggml_type, offset))
        except (struct.error, ValueError, OverflowError, MemoryError) as err:
            raise ArtifactError(f"{path} is damaged or truncated inside its header: {err}",
                                hint="delete it and rerun the step that wrote it") from err
        data_start = pos + (-pos % alignment)
    tensors = [TensorEntry(n, shape, t, data_start + off) for n, shape, t, off in entries]
    return GGUFHeader(version, found, tensors)


_INFO_KEYS = frozenset({
    "general.architecture", "general.name", "general.file_type", "split.no", "split.count",
    "tokenizer.chat_template", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
})


def is_context_length(key: str, found: dict[str, Any]) -> bool:
    """Whether `key` is the model's `<arch>.context_length` (general.architecture precedes it in the header)."""
    return key == f"{found.get('general.architecture')}.context_length"


def _wanted_for_info(key: str, found: dict[str, Any]) -> bool:
    return key in _INFO_KEYS or bool(_PROVENANCE.match(key)) or is_context_length(key, found)


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read a GGUF's header, metadata and tensor table, checking magic, version and tensor bounds.

    Raises:
        ArtifactError: not a GGUF, an unsupported version, truncated, or missing required metadata.
    """
    from gguf import GGMLQuantizationType, LlamaFileType

    path = Path(path)
    header = read_gguf_header(path, _wanted_for_info)
    meta = header.metadata
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
    arch = meta.get("general.architecture")
    split_no = int(meta.get("split.no") or 0)
    if not arch and split_no > 0:
        arch = ""  # llama-gguf-split keeps the model's metadata in the first shard only
    elif not arch:
        raise ArtifactError(f"{path} has no general.architecture", hint="reconvert it with `modelmint convert`")
    ftype_val = meta.get("general.file_type")
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
    return GGUFInfo(
        path=str(path),
        size_bytes=size,
        version=header.version,
        architecture=str(arch),
        name=meta.get("general.name"),
        file_type=file_type,
        tensor_count=len(header.tensors),
        parameter_count=n_params,
        tensor_types=dict(sorted(tensor_types.items())),
        quantized_fraction=(quant_2d / params_2d) if params_2d else 0.0,
        chat_template=meta.get("tokenizer.chat_template"),
        tokenizer_model=meta.get("tokenizer.ggml.model"),
        tokenizer_pre=meta.get("tokenizer.ggml.pre"),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        eot_token_id=meta.get("tokenizer.ggml.eot_token_id"),
        context_length=meta.get(f"{arch}.context_length"),
        split_count=int(meta.get("split.count") or 1),
        metadata=metadata,
    )


def check_gguf(info: GGUFInfo, *, expect_file_type: str, require_chat_template: bool = True) -> None:
    """Check an output against what the step promised, beyond 'the tool exited 0'.

    Raises:
        ArtifactError: wrong file type, weights left unquantized, no tokenizer, no chat template, no eos.
    """
    problems = []
    want = expect_file_type.upper()
    if info.file_type != want:
        problems.append(f"general.file_type is {info.file_type}, expected {want}")
    if want not in _FLOAT_TYPES and info.quantized_fraction < 0.9:
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


def _converter_error(err: ToolError, model_dir: Path) -> Exception:
    tail = err.stderr_tail
    # before the architecture check: the converter raises this one as a NotImplementedError too
    if "BPE pre-tokenizer was not recognized" in tail:
        found = re.search(r"chkhsh:\s*([0-9a-f]{64})", err.stderr)
        return UnsupportedModel(
            f"the pinned llama.cpp converter does not recognise the vocabulary of {model_dir}: its pre-tokenizer "
            f"hash{' ' + found.group(1) if found else ''} is none llama.cpp knows, and converting with a guessed "
            f"pre-tokenizer would split text differently from the model's own tokenizer, so nothing was converted",
            hint="check tokenizer.json's pre_tokenizer against the model family's (a rebuilt tokenizer: the "
            "`tokenizer` of its wheel source in registry/catalog.yaml); a model llama.cpp has never seen needs a "
            "pre-tokenizer entry upstream (convert_hf_to_gguf_update.py) and a newer pin in toolchains/llama-cpp.env",
        )
    if "is not supported" in tail or "NotImplementedError" in tail or ("Model " in tail and "not supported" in tail):
        return UnsupportedModel(
            f"the pinned llama.cpp converter does not support the architecture of {model_dir}:\n{tail}",
            hint="check config.json's `architectures` against `convert_hf_to_gguf.py --print-supported-models`; "
            "a newer llama.cpp pin in toolchains/llama-cpp.env may add it",
        )
    return err


def convert(
    model_dir: Path,
    out: Path,
    llama: LlamaCpp,
    *,
    outtype: str = "f16",
    provenance: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> tuple[GGUFInfo, ToolRun]:
    """Convert a Safetensors model directory to a single GGUF at `out` (atomically), and check it.

    `provenance` entries are written through the converter's --metadata override (general.* keys).

    Raises:
        UnsupportedModel: the converter cannot handle the architecture or tokenizer.
        ToolError, DiskFullError: the converter failed.
        ArtifactError: the output does not read back as the expected GGUF.
    """
    meta = partial_path(out.with_suffix(".metadata.json"))
    with atomic_output(out, check=gguf_check(outtype)) as tmp:
        argv: list[str | Path] = [
            llama.python, llama.converter, model_dir, "--outfile", tmp, "--outtype", outtype,
        ]
        if provenance:
            meta.write_text(json.dumps(provenance), encoding="utf-8")
            argv += ["--metadata", meta]
        try:
            result = run(argv, timeout=timeout, output=tmp)
        except ToolError as err:
            raise _converter_error(err, model_dir) from err
        finally:
            meta.unlink(missing_ok=True)
    return inspect_gguf(out), result


def quantize(
    source: Path,
    out: Path,
    qtype: str,
    llama: LlamaCpp,
    *,
    threads: int,
    imatrix: Path | None = None,
    kv: dict[str, str | int] | None = None,
    timeout: float | None = None,
) -> tuple[GGUFInfo, ToolRun]:
    """Quantize a 16-bit GGUF to `qtype` with llama-quantize, atomically, and check the result.

    `kv` entries become `--override-kv` metadata in the output (provenance the manifest also records).
    llama-quantize copies the `--imatrix` argument into `quantize.imatrix.file` as given: it runs in the
    imatrix's directory and is given its bare name, so the output names no path of this machine.

    Raises:
        ToolError, DiskFullError: llama-quantize failed.
        ArtifactError: the output is not a `qtype` GGUF with tokenizer and chat template.
    """
    with atomic_output(out, check=gguf_check(qtype)) as tmp:
        argv: list[str | Path] = [llama.bin("llama-quantize")]
        if imatrix is not None:
            argv += ["--imatrix", imatrix.name]
        for key, value in (kv or {}).items():
            kind = "int" if isinstance(value, int) else "str"
            argv += ["--override-kv", f"{key}={kind}:{value}"]
        argv += [Path(source).resolve(), tmp.resolve(), qtype.upper(), str(threads)]
        result = run(argv, timeout=timeout, cwd=imatrix.parent if imatrix is not None else None, output=tmp)
    return inspect_gguf(out), result


def compute_imatrix(
    model: Path, text: Path, out: Path, llama: LlamaCpp, *, threads: int, ctx: int = 128, chunks: int = 32
) -> tuple[dict[str, Any], ToolRun]:
    """Compute an importance matrix over `text` with llama-imatrix (GGUF output), atomically.

    llama-imatrix records its `-f` argument as given in `imatrix.datasets` (and llama-quantize copies it
    into every quant as `quantize.imatrix.dataset`): it runs in the text's directory and is given the
    bare file name, so the matrix and the quants name `train.txt`, not a path of this machine. It exits 0
    even when writing its file failed: the file is read back (`check_imatrix`) before it is renamed into place.
    Returns what the matrix says of itself (datasets, chunks, chunk size) and the tool run.

    Raises:
        ToolError, DiskFullError: llama-imatrix failed.
        ArtifactError: the output is not an imatrix GGUF computed on `text`.
    """
    with atomic_output(out, check=check_imatrix) as tmp:
        result = run([
            llama.bin("llama-imatrix"), "-m", Path(model).resolve(), "-f", text.name, "-o", tmp.resolve(),
            "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks), "-t", str(threads), "--no-ppl",
            "--output-format", "gguf",
        ], cwd=text.parent, output=tmp)
        made = read_imatrix(tmp)
        if made["datasets"] != [text.name] or made["chunks"] < 1:
            raise ArtifactError(f"llama-imatrix wrote {made} for {text.name}",
                                hint="delete it and rerun the step that wrote it")
    return made, result


def read_imatrix(path: Path) -> dict[str, Any]:
    """The datasets, chunk count and chunk size an imatrix GGUF records (llama-imatrix --output-format gguf).

    Raises:
        ArtifactError: not a GGUF, or not an importance matrix.
    """
    keys = {"general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"}
    meta = read_gguf_header(path, lambda key, _found: key in keys).metadata
    if meta.get("general.type") != "imatrix":
        raise ArtifactError(f"{path} is not an importance matrix (general.type {meta.get('general.type')!r})",
                            hint="delete it and rerun the step that wrote it")
    return {
        "datasets": list(meta.get("imatrix.datasets") or []),
        "chunks": int(meta.get("imatrix.chunk_count") or 0),
        "chunk_size": int(meta.get("imatrix.chunk_size") or 0),
    }


def split(path: Path, max_size: str, llama: LlamaCpp) -> list[Path]:
    """Split `path` into shards of at most `max_size` with llama-gguf-split; returns the shard paths.

    Shards are written to a temporary directory and moved beside `path` only when all exist; the
    unsplit file is kept (it is what validation measured).
    """
    stem = path.name.removesuffix(".gguf")
    shard_dir = path.parent / f"{stem}.shards"

    def _check_shards(tmp: Path) -> None:
        shards = sorted(tmp.glob(f"{stem}-*-of-*.gguf"))
        if not shards:
            raise ArtifactError(f"llama-gguf-split wrote no shards for {path}")
        infos = [inspect_gguf(s) for s in shards]  # each shard's tensors must lie within the shard
        if infos[0].split_count != len(shards):
            raise ArtifactError(f"{shards[0]} says split.count={infos[0].split_count}, found {len(shards)} shards")

    with atomic_output(shard_dir, check=_check_shards) as tmp:
        tmp.mkdir()
        run([llama.bin("llama-gguf-split"), "--split", "--split-max-size", max_size, path, tmp / stem],
            output=tmp / stem)
    return sorted(shard_dir.glob(f"{stem}-*-of-*.gguf"))


def gguf_check(file_type: str) -> Callable[[Path], None]:
    """The read-back an output GGUF of `file_type` must pass before it is promoted (see fsutil.promote)."""

    def _check(path: Path) -> None:
        check_gguf(inspect_gguf(path), expect_file_type=file_type)

    return _check


def check_imatrix(path: Path) -> None:
    """Read an importance matrix GGUF back: its type, chunk count, and every tensor within the file.

    Raises:
        ArtifactError: not an imatrix GGUF, no data, or truncated.
    """
    header = read_gguf_header(path, lambda key, _found: key in ("general.type", "imatrix.chunk_count"))
    problems = []
    if header.metadata.get("general.type") != "imatrix":
        problems.append(f"general.type is {header.metadata.get('general.type')!r}, not 'imatrix'")
    if not header.metadata.get("imatrix.chunk_count"):
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
