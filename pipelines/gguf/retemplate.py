"""A metadata-only upstream change (chat template, generation config): the outputs already built from the same
weights, given the new metadata.

The weights key hashes every source file the converter reads except what it only copies into metadata: the chat
template (chat_template.jinja / .json, and the `chat_template` key of tokenizer_config.json) and the sampling
defaults of generation_config.json (gguf-py's Metadata.load maps them to `general.sampling.*`). Two commits with one
weights key convert to the same tensors, so an f16, an importance matrix or a quant of the earlier commit is copied
with the new template, sampling keys and provenance written into its metadata (in process, every other byte
copied) instead of running the converter, llama-imatrix or llama-quantize again. The sampling keys come from the pinned
tree's own gguf-py, run once per build in the converter venv (pipelines/scripts/gguf_sampling.py): the gguf on
PyPI of the same version reads generation_config.json differently.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipelines.core.fsutil import atomic_output
from pipelines.core.ggufheader import (
    GGUF_MAGIC,
    SCALAR_FORMATS,
    GGUFInfo,
    check_imatrix,
    gguf_layout,
)
from pipelines.core.runner import run
from pipelines.core.steps import load_receipt, receipt_path
from pipelines.core.toolchains import LlamaCpp
from pipelines.core.vocab import GGUFKey
from pipelines.gguf.tools import gguf_check
from pipelines.source import upstream

SAMPLING_PREFIX = GGUFKey.SAMPLING_PREFIX
SAMPLING_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gguf_sampling.py"
# The pinned converter reads generation_config.json in gguf-py's Metadata.load (its sampling defaults become
# general.sampling.*, rewritten here) and, for two families, eos_token_id (HunYuan) and suppress_tokens (Gemma 4):
# those two stay in the weights key, so a change to them converts again.
_GENERATION_READ = ("eos_token_id", "suppress_tokens")


def weights_key(root: Path, files: Mapping[str, str]) -> str:
    """A content key over `files` (relpath → sha256 under `root`) that ignores what only lands in a GGUF's metadata:
    the chat template, and the sampling defaults of generation_config.json."""
    return upstream.weights_key(root, files, generation_read=_GENERATION_READ)


def chat_template(model_dir: Path) -> str | None:
    """The chat template the converter writes for `model_dir` (gguf-py's SpecialVocab, as convert_hf_to_gguf reads
    it); None when there is none or it is a list of named templates (those take the converter)."""
    import gguf

    template: Any = gguf.SpecialVocab(model_dir, load_merges=False).chat_template
    return template if isinstance(template, str) else None


def sampling_metadata(model_dir: Path, llama: LlamaCpp) -> dict[str, Any]:
    """The `general.sampling.*` keys the pinned converter writes for `model_dir` (key → gguf-py MetadataDetails):
    its own gguf-py (Metadata.load, set_gguf_meta_model) in the converter venv, which reads generation_config.json
    as the converter does (the gguf on PyPI of the same version does not read repetition_penalty).

    Raises:
        ToolError: the converter venv's python failed.
    """
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails

    found = json.loads(run([llama.python, SAMPLING_SCRIPT, model_dir.resolve()]).stdout)
    return {key: MetadataDetails(gguf.GGUFValueType(kind), value) for key, (kind, value) in found.items()}


def find_donor(out: Path, same: str) -> tuple[Path, dict[str, Any]] | None:
    """A finished output of another build of the same model (a sibling build directory) whose receipt records the
    weights key `same`, and its receipt; None when there is none."""
    for other in sorted(out.parent.parent.glob(f"*/{out.name}")):
        if other == out:
            continue
        try:
            key = json.loads(receipt_path(other).read_text()).get("key")
        except (FileNotFoundError, ValueError):
            continue
        receipt = load_receipt(other, key) if isinstance(key, str) else None
        if receipt is not None and receipt.get("weights_key") == same:
            return other, receipt
    return None


def retemplate(donor: Path, out: Path, *, file_type: str, template: str, sampling: Mapping[str, Any],
               metadata: Mapping[str, str | int]) -> GGUFInfo:
    """Copy GGUF `donor` to `out` (atomically) with `template` as its chat template, `sampling` as its
    general.sampling.* keys (sampling_metadata; the donor's others are removed) and `metadata` set; every tensor
    and every other key stays byte for byte.

    Raises:
        ArtifactError: the donor's header does not read, or the copy does not read back as a `file_type` GGUF.
    """
    import gguf

    new: dict[str, tuple[int, Any]] = {gguf.Keys.Tokenizer.CHAT_TEMPLATE: (gguf.GGUFValueType.STRING, template)}
    new |= {key: (int(v.type), v.value) for key, v in sampling.items()}
    for key, value in metadata.items():
        new[key] = (gguf.GGUFValueType.INT64 if isinstance(value, int) else gguf.GGUFValueType.STRING, value)
    checked = gguf_check(file_type)
    with atomic_output(out, check=checked) as tmp:
        rewrite_metadata(donor, tmp, new, drop=lambda key: key.startswith(SAMPLING_PREFIX))
    return checked.info(out)


def _entry(key: str, kind: int, value: Any) -> bytes:
    """One GGUF metadata entry: the key, the value type, the value (a string or a scalar)."""
    def text(t: str) -> bytes:
        raw = t.encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw

    return text(key) + struct.pack("<I", kind) + (text(value) if kind == 8 else struct.pack("<" + SCALAR_FORMATS[kind], value))


def rewrite_metadata(donor: Path, out: Path, new: Mapping[str, tuple[int, Any]], drop: Callable[[str], bool]) -> None:
    """Write GGUF `donor` to `out` with the metadata entries `new` (key → (GGUF value type, value)) set in place or
    appended and the other keys `drop` accepts left out; every other entry, the tensor table and the tensor data are
    copied as bytes (tensor offsets count from the data's start, which is re-aligned). gguf-py's reader would decode
    every vocabulary entry first: seconds for a 150k-token vocabulary, minutes under load.

    Raises:
        ArtifactError: the donor's header does not read.
    """
    layout = gguf_layout(donor)
    entries: list[bytes] = []
    with open(donor, "rb") as src:
        for key, start, end in layout.kv:
            if key in new:
                entries.append(_entry(key, *new[key]))
            elif not drop(key):
                src.seek(start)
                entries.append(src.read(end - start))
        entries += [_entry(key, *v) for key, v in new.items() if key not in {k for k, _, _ in layout.kv}]
        src.seek(layout.tensor_table[0])
        table = src.read(layout.tensor_table[1] - layout.tensor_table[0])
        with open(out, "wb") as dst:
            dst.write(GGUF_MAGIC + struct.pack("<IQQ", layout.version, layout.n_tensors, len(entries)))
            for raw in entries:
                dst.write(raw)
            dst.write(table)
            dst.write(bytes(-dst.tell() % layout.alignment))
            src.seek(layout.data_start)
            shutil.copyfileobj(src, dst, 16 << 20)


def copy_imatrix(donor: Path, out: Path) -> None:
    """Copy importance matrix `donor` to `out` as it is (atomically): it holds statistics of the f16's activations
    on the calibration text, which the metadata does not touch.

    Raises:
        ArtifactError: the copy does not read back as an importance matrix.
    """
    with atomic_output(out, check=check_imatrix) as tmp:
        shutil.copyfile(donor, tmp)
