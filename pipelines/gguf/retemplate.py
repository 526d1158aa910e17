"""A chat-template-only upstream change: the GGUFs already built from the same weights, given the new template.

The weights key hashes every source file the converter reads except the chat template (chat_template.jinja / .json,
and the `chat_template` key of tokenizer_config.json). Two commits with one weights key convert to the same
tensors, so an f16 or a quant of the earlier commit is copied with the new template and provenance written into its
metadata (gguf-py's writer, in process) instead of running the converter or llama-quantize again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.core.fsutil import atomic_output
from pipelines.core.ggufheader import GGUFInfo, inspect_gguf
from pipelines.core.steps import content_key, load_receipt, receipt_path
from pipelines.gguf.tools import gguf_check
from pipelines.source.upstream import classify


def weights_key(root: Path, files: Mapping[str, str]) -> str:
    """A content key over `files` (relpath → sha256 under `root`) that ignores the chat template alone."""
    parts = []
    for name, sha in sorted(files.items()):
        if classify(name) == "chat template":
            continue
        if name == "tokenizer_config.json":
            config = json.loads((root / name).read_text(encoding="utf-8"))
            config.pop("chat_template", None)
            sha = content_key(json.dumps(config, sort_keys=True))
        parts.append((name, sha))
    return content_key("weights", parts)


def chat_template(model_dir: Path) -> str | None:
    """The chat template the converter writes for `model_dir` (gguf-py's SpecialVocab, as convert_hf_to_gguf reads
    it); None when there is none or it is a list of named templates (those take the converter)."""
    import gguf

    template: Any = gguf.SpecialVocab(model_dir, load_merges=False).chat_template
    return template if isinstance(template, str) else None


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


def retemplate(donor: Path, out: Path, *, file_type: str, template: str,
               metadata: Mapping[str, str | int]) -> GGUFInfo:
    """Copy GGUF `donor` to `out` (atomically) with `template` as its chat template and `metadata` set; every
    tensor and every other key stays as it is.

    Raises:
        ArtifactError: the copy does not read back as a `file_type` GGUF with its chat template.
    """
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(donor, "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert arch is not None, f"{donor} has no general.architecture (it was checked when it was built)"
    new: dict[str, MetadataDetails] = {
        gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(gguf.GGUFValueType.STRING, template)}
    for key, value in metadata.items():
        kind = gguf.GGUFValueType.INT64 if isinstance(value, int) else gguf.GGUFValueType.STRING
        new[key] = MetadataDetails(kind, value)
    with atomic_output(out, check=gguf_check(file_type)) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=str(arch.contents()), endianess=reader.endianess)
        alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
        if alignment is not None:
            writer.data_alignment = int(alignment.contents())
        copy_with_new_metadata(reader, writer, new, [])
    return inspect_gguf(out)
