"""The llama.cpp tools of a GGUF build: convert Safetensors to f16/bf16, quantize, imatrix, split; each output is
read back (core/ggufheader.py) before it is promoted."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from pipelines.core.errors import ArtifactError, ToolError, UnsupportedModel
from pipelines.core.fsutil import HashCache, WrittenDigest, atomic_output, partial_path
from pipelines.core.ggufheader import GGUFInfo, check_gguf, check_imatrix, inspect_gguf, read_imatrix
from pipelines.core.runner import ToolRun, run
from pipelines.core.toolchains import LlamaCpp


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
    hashes: HashCache | None = None,
) -> tuple[GGUFInfo, ToolRun]:
    """Convert a Safetensors model directory to a single GGUF at `out` (atomically), and check it.

    `provenance` entries are written through the converter's --metadata override (general.* keys). `hashes`: the
    output's sha256, computed as the converter writes it (fsutil.WrittenDigest), is remembered there, so that its
    receipt does not read the file back.

    Raises:
        UnsupportedModel: the converter cannot handle the architecture or tokenizer.
        ToolError, DiskFullError: the converter failed.
        ArtifactError: the output does not read back as the expected GGUF.
    """
    meta = partial_path(out.with_suffix(".metadata.json"))
    checked = gguf_check(outtype)
    with atomic_output(out, check=checked) as tmp:
        argv: list[str | Path] = [
            llama.python, llama.converter, model_dir, "--outfile", tmp, "--outtype", outtype,
        ]
        if provenance:
            meta.write_text(json.dumps(provenance), encoding="utf-8")
            argv += ["--metadata", meta]
        try:
            with WrittenDigest(tmp) as digest:
                result = run(argv, timeout=timeout, output=tmp)
        except ToolError as err:
            raise _converter_error(err, model_dir) from err
        finally:
            meta.unlink(missing_ok=True)
    if hashes is not None and digest.sha256 is not None and digest.stat is not None:
        hashes.learn(out, digest.stat, digest.sha256)  # the rename kept its inode, size and mtime
    return checked.info(out), result


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
    checked = gguf_check(qtype)
    with atomic_output(out, check=checked) as tmp:
        argv: list[str | Path] = [llama.bin("llama-quantize")]
        if imatrix is not None:
            argv += ["--imatrix", imatrix.name]
        for key, value in (kv or {}).items():
            kind = "int" if isinstance(value, int) else "str"
            argv += ["--override-kv", f"{key}={kind}:{value}"]
        argv += [Path(source).resolve(), tmp.resolve(), qtype.upper(), str(threads)]
        result = run(argv, timeout=timeout, cwd=imatrix.parent if imatrix is not None else None, output=tmp)
    return checked.info(out), result


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


class GGUFCheck:
    """The read-back an output GGUF of `file_type` must pass before it is promoted (see fsutil.promote); it keeps
    what it read, so the caller does not walk the header a second time (`info(out)`)."""

    def __init__(self, file_type: str) -> None:
        self.file_type = file_type
        self._info: GGUFInfo | None = None

    def __call__(self, path: Path) -> None:
        info = inspect_gguf(path)
        check_gguf(info, expect_file_type=self.file_type)
        self._info = info

    def info(self, out: Path) -> GGUFInfo:
        """What the check read, for the promoted file at `out` (its size and header are the checked file's)."""
        if self._info is None:
            return inspect_gguf(out)
        return dataclasses.replace(self._info, path=str(out))


def gguf_check(file_type: str) -> GGUFCheck:
    """The read-back an output GGUF of `file_type` must pass before it is promoted (see fsutil.promote)."""
    return GGUFCheck(file_type)


