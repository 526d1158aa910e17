"""Read a Safetensors file's header without loading a tensor, and the tensors of a model directory."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

from pipelines.core.errors import ArtifactError
from pipelines.core.fsutil import HashCache

INDEX_FILE = "model.safetensors.index.json"


def read_safetensors_header(path: Path, hashes: HashCache | None = None) -> dict[str, Any]:
    """Read and check a .safetensors file's header without loading a tensor.

    The `safetensors` library decides whether the file is valid (header length, UTF-8 JSON, known dtypes,
    shapes, byte ranges that match them and tile the data section up to the end of the file); modelmint words
    its refusal. Returns the header as stored: tensor name → {"dtype", "shape", "data_offsets"}, plus
    "__metadata__" when present. With `hashes`, a file that passed the library's check before and is unchanged
    since (same device, inode, size and mtime) is not checked again: a re-run of a build then needs no numpy
    (the library imports it to open a file).

    Raises:
        ArtifactError: the file is truncated, has trailing bytes, or its header is not valid.
    """
    from safetensors import SafetensorError, safe_open

    try:
        known = hashes is not None and hashes.checked(path, "safetensors-header")
        if not known:
            with safe_open(
                path, framework="numpy"
            ):  # numpy: no torch; opening checks the header, reads no tensor
                pass
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header: dict[str, Any] = json.loads(fh.read(n))
    except SafetensorError as err:
        raise ArtifactError(_refusal(path, str(err))) from err
    except OSError as err:
        raise ArtifactError(f"cannot read {path}: {err.strerror or err}") from err
    if hashes is not None and not known:
        hashes.passed(path, "safetensors-header")
    return header


# serde's words for a dtype outside the format's enum (the only enum in a safetensors header)
_UNKNOWN_DTYPE = re.compile(r"unknown variant `([^`]*)`, expected one of .*?(?= at line \d|$)")


def _refusal(path: Path, message: str) -> str:
    """The safetensors library's reason for refusing `path`, in modelmint's words (with the sizes involved)."""
    reason = message.removeprefix("Error while deserializing header: ")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        n = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else 0
        raw = fh.read(min(n, size))
    if reason == "header too small":
        return f"{path} is truncated: {size} bytes, shorter than a safetensors header"
    if reason == "header too large":
        return f"{path} is not a safetensors file: header length {n} is implausible"
    if reason == "invalid header length":
        return f"{path} is truncated: its header needs {8 + n} bytes, the file has {size}"
    if reason.startswith("incomplete metadata"):
        # The byte ranges do not end where the file does; which side of it tells truncation from trailing bytes.
        data_size = size - 8 - n
        try:
            header = json.loads(raw)
            end = max(
                (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            end = data_size + 1
        if end > data_size:
            return f"{path} is truncated: tensors need {end} data bytes, the file holds {data_size}"
        return f"{path} is corrupt: {data_size - end} bytes after the last tensor"
    if found := re.fullmatch(r"invalid offset for tensor `(.*)`", reason):
        return (
            f"{path} has a corrupt header: tensor {found[1]!r} does not start where the previous one ends "
            "(data ranges must be contiguous)"
        )
    if reason.startswith("invalid shape, data type, or offset"):
        reason = "a tensor's byte range does not match its dtype and shape"
    reason = _UNKNOWN_DTYPE.sub(lambda m: f"unknown dtype {m[1]!r}", reason)
    if at := re.search(r" at line (\d+) column (\d+)$", reason):
        # serde says where in the JSON it stopped, not which key: show the text that leads up to it
        lines = raw.decode("utf-8", errors="replace").split("\n")
        line = lines[int(at[1]) - 1] if 0 < int(at[1]) <= len(lines) else ""
        lead = line[: int(at[2])][-48:]
        reason += f" (after `{lead}`)" if lead else ""
    return f"{path} has a corrupt header: {reason}"


def safetensors_files(d: Path) -> list[Path]:
    if (d / INDEX_FILE).is_file():
        index = json.loads((d / INDEX_FILE).read_text())
        names = sorted(set(index.get("weight_map", {}).values()))
        if missing := [n for n in names if not (d / n).is_file()]:
            raise ArtifactError(f"{d / INDEX_FILE} names shards that are not there: {missing}")
        return [d / n for n in names]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ArtifactError(f"{d} holds no .safetensors weights")
    return files


def source_tensors(d: Path, hashes: HashCache | None = None) -> dict[str, dict[str, Any]]:
    """Every tensor's Safetensors header entry (dtype, shape) in a model directory, read without loading one
    (`hashes`: as read_safetensors_header).

    Raises:
        ArtifactError: no weights, a missing shard, or a header that does not read back.
    """
    out: dict[str, dict[str, Any]] = {}
    for f in safetensors_files(d):
        for name, info in read_safetensors_header(f, hashes).items():
            if name != "__metadata__":
                out[name] = info
    return out
