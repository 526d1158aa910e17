"""GGUF steps: convert Safetensors to f16/bf16, quantize, imatrix, split, and read a GGUF back to check it."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.errors import ArtifactError, ToolError, UnsupportedModel
from pipelines.fsutil import atomic_output, partial_path
from pipelines.runner import ToolRun, run
from pipelines.toolchains import LlamaCpp

GGUF_MAGIC = b"GGUF"
SUPPORTED_GGUF_VERSIONS = (2, 3)
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file says about itself, read with gguf-py's GGUFReader."""

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


def _field_value(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:
        return None


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read a GGUF's header, metadata and tensor table, checking magic, version and tensor bounds.

    Raises:
        ArtifactError: not a GGUF, an unsupported version, truncated, or missing required metadata.
    """
    from gguf import GGMLQuantizationType, GGUFReader, LlamaFileType

    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except FileNotFoundError as err:
        raise ArtifactError(f"{path} does not exist", hint="check the path; `modelmint convert` writes to build/") from err
    if head[:4] != GGUF_MAGIC:
        raise ArtifactError(f"{path} is not a GGUF file (magic {head[:4]!r})", hint="pass a .gguf file")
    version = int.from_bytes(head[4:8], "little")
    if version not in SUPPORTED_GGUF_VERSIONS:
        raise ArtifactError(f"{path}: GGUF version {version} is not supported (want {SUPPORTED_GGUF_VERSIONS})")
    size = path.stat().st_size
    try:
        reader = GGUFReader(path)
    except Exception as err:  # gguf-py raises ValueError/IndexError/struct errors on damaged headers
        raise ArtifactError(
            f"{path} is damaged: {err}", hint="delete it and rerun the step that wrote it"
        ) from err
    tensor_types: Counter[str] = Counter()
    params_2d = 0
    quant_2d = 0
    n_params = 0
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ArtifactError(f"{path} is truncated: tensor {t.name} ends at byte {end}, file has {size}")
        tname = GGMLQuantizationType(t.tensor_type).name
        tensor_types[tname] += 1
        n = int(t.n_elements)
        n_params += n
        if len([d for d in t.shape if d > 1]) >= 2:
            params_2d += n
            if tname not in _FLOAT_TYPES:
                quant_2d += n
    arch = _field_value(reader, "general.architecture")
    split_no = int(_field_value(reader, "split.no") or 0)
    if not arch and split_no > 0:
        arch = ""  # llama-gguf-split keeps the model's metadata in the first shard only
    elif not arch:
        raise ArtifactError(f"{path} has no general.architecture", hint="reconvert it with `modelmint convert`")
    ftype_val = _field_value(reader, "general.file_type")
    try:
        file_type = LlamaFileType(int(ftype_val)).name.removeprefix("MOSTLY_") if ftype_val is not None else None
    except ValueError:
        file_type = str(ftype_val)
    metadata = {}
    for key in reader.fields:
        if _PROVENANCE.match(key):
            val = _field_value(reader, key)
            if isinstance(val, (str, int, float, bool)) or val is None or (isinstance(val, list) and len(val) < 64):
                metadata[key] = val
    return GGUFInfo(
        path=str(path),
        size_bytes=size,
        version=version,
        architecture=str(arch),
        name=_field_value(reader, "general.name"),
        file_type=file_type,
        tensor_count=len(reader.tensors),
        parameter_count=n_params,
        tensor_types=dict(sorted(tensor_types.items())),
        quantized_fraction=(quant_2d / params_2d) if params_2d else 0.0,
        chat_template=_field_value(reader, "tokenizer.chat_template"),
        tokenizer_model=_field_value(reader, "tokenizer.ggml.model"),
        tokenizer_pre=_field_value(reader, "tokenizer.ggml.pre"),
        bos_token_id=_field_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field_value(reader, "tokenizer.ggml.eos_token_id"),
        eot_token_id=_field_value(reader, "tokenizer.ggml.eot_token_id"),
        context_length=_field_value(reader, f"{arch}.context_length"),
        split_count=int(_field_value(reader, "split.count") or 1),
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
    if "is not supported" in tail or "NotImplementedError" in tail or ("Model " in tail and "not supported" in tail):
        return UnsupportedModel(
            f"the pinned llama.cpp converter does not support the architecture of {model_dir}:\n{tail}",
            hint="check config.json's `architectures` against `convert_hf_to_gguf.py --print-supported-models`; "
            "a newer llama.cpp pin in toolchains/llama-cpp.env may add it",
        )
    if "BPE pre-tokenizer was not recognized" in tail:
        return UnsupportedModel(
            f"the converter does not recognise the tokenizer of {model_dir}:\n{tail}",
            hint="the tokenizer needs a llama.cpp pre-tokenizer entry (convert_hf_to_gguf_update.py upstream)",
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
    with atomic_output(out) as tmp:
        argv: list[str | Path] = [
            llama.python, llama.converter, model_dir, "--outfile", tmp, "--outtype", outtype,
        ]
        if provenance:
            meta.write_text(json.dumps(provenance), encoding="utf-8")
            argv += ["--metadata", meta]
        try:
            result = run(argv, timeout=timeout)
        except ToolError as err:
            raise _converter_error(err, model_dir) from err
        finally:
            meta.unlink(missing_ok=True)
        info = inspect_gguf(tmp)
        check_gguf(info, expect_file_type=outtype)
    return _relocated(info, out), result


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

    Raises:
        ToolError, DiskFullError: llama-quantize failed.
        ArtifactError: the output is not a `qtype` GGUF with tokenizer and chat template.
    """
    with atomic_output(out) as tmp:
        argv: list[str | Path] = [llama.bin("llama-quantize")]
        if imatrix is not None:
            argv += ["--imatrix", imatrix]
        for key, value in (kv or {}).items():
            kind = "int" if isinstance(value, int) else "str"
            argv += ["--override-kv", f"{key}={kind}:{value}"]
        argv += [source, tmp, qtype.upper(), str(threads)]
        result = run(argv, timeout=timeout)
        info = inspect_gguf(tmp)
        check_gguf(info, expect_file_type=qtype)
    return _relocated(info, out), result


def compute_imatrix(
    model: Path, text: Path, out: Path, llama: LlamaCpp, *, threads: int, ctx: int = 128, chunks: int = 32
) -> ToolRun:
    """Compute an importance matrix over `text` with llama-imatrix (GGUF output), atomically."""
    with atomic_output(out) as tmp:
        return run([
            llama.bin("llama-imatrix"), "-m", model, "-f", text, "-o", tmp, "-c", str(ctx), "-b", str(ctx),
            "--chunks", str(chunks), "-t", str(threads), "--no-ppl", "--output-format", "gguf",
        ])


def split(path: Path, max_size: str, llama: LlamaCpp) -> list[Path]:
    """Split `path` into shards of at most `max_size` with llama-gguf-split; returns the shard paths.

    Shards are written to a temporary directory and moved beside `path` only when all exist; the
    unsplit file is kept (it is what validation measured).
    """
    stem = path.name.removesuffix(".gguf")
    shard_dir = path.parent / f"{stem}.shards"
    with atomic_output(shard_dir) as tmp:
        tmp.mkdir()
        run([llama.bin("llama-gguf-split"), "--split", "--split-max-size", max_size, path, tmp / stem])
        shards = sorted(tmp.glob(f"{stem}-*-of-*.gguf"))
        if not shards:
            raise ArtifactError(f"llama-gguf-split wrote no shards for {path}")
        first = inspect_gguf(shards[0])
        if first.split_count != len(shards):
            raise ArtifactError(f"{shards[0]} says split.count={first.split_count}, found {len(shards)} shards")
    return sorted(shard_dir.glob(f"{stem}-*-of-*.gguf"))


def _relocated(info: GGUFInfo, final: Path) -> GGUFInfo:
    from dataclasses import replace

    return replace(info, path=str(final))
