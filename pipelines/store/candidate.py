"""A validated variant as registration takes it (`Candidate`), whatever format built it, and what it was judged on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.core.errors import ArtifactError
from pipelines.core.fsutil import HashCache
from pipelines.core.report import VariantReport
from pipelines.core.steps import content_key
from pipelines.source.catalog import CatalogEntry
from pipelines.store.manifest import ParentRef
from pipelines.store.names import Format, artifact_relpath, format_name, stage_name


@dataclass(frozen=True)
class Candidate:
    """A validated variant, whatever built it: what registration copies, records and describes."""

    entry: CatalogEntry
    tag: str
    files: tuple[Path, ...]
    """The artifact's own files, main file first (a GGUF, or its shards when it was split; a checkpoint's
    weights, then its other files)."""
    sha256: str
    size_bytes: int
    """The main file's (files[0]) size; the manifest's `weights_bytes` sums every weight file placed."""
    source: dict[str, Any]
    parent: ParentRef | None
    toolchain: dict[str, str]
    recipe: dict[str, Any]
    report: VariantReport
    """The validation report as its file has it (what `report_sha256` names)."""
    report_sha256: str
    source_dir: Path | None = None
    """The source model directory (its tokenizer and generation config feed the Modelfile)."""
    root: Path | None = None
    """The directory `files` are placed relative to (a checkpoint); None: each is placed by its name."""
    force: bool = False
    """Register it even when its source commit is older than the current version's (`--force`); not part of
    what it is made of (`key`)."""

    @property
    def ref(self) -> str:
        return f"{self.entry.name}:{self.tag}"

    @property
    def format(self) -> Format:
        return format_name(self.tag).name

    @property
    def recipe_sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.recipe, sort_keys=True).encode()).hexdigest()

    @property
    def key(self) -> str:
        """What this registration is made of: the bytes, the source, the recipe, the toolchain, and the gate's
        verdict with the metrics it judged. Not the report file: its timings and build paths change on every
        rebuild of the same bytes, and the manifest would be rewritten each time. The serving plans' inventories are
        part of it: other GPUs are other plans."""
        return content_key(
            "register",
            self.sha256,
            self.source,
            self.recipe_sha256,
            self.toolchain,
            verdict(self.report),
            self.entry.serve.model_dump(mode="json"),
        )

    @property
    def stage(self) -> str:
        return stage_name(self.entry.name, self.tag)

    @property
    def dvc_path(self) -> str:
        return artifact_relpath(self.entry.name, self.tag)

    def placed_as(self, f: Path) -> str:
        """Where file `f` goes inside the artifact directory ('/'-separated)."""
        return f.relative_to(self.root).as_posix() if self.root is not None else f.name


class ValidatedOutputChanged(ArtifactError, FileNotFoundError):
    """What was validated (an output, its base or its report) changed or is gone before registration: a
    ModelmintError, so the flow fails that variant alone with an `error:` line (still a FileNotFoundError for
    callers that asked for one)."""

    def __init__(self, message: str, *, rerun: str) -> None:
        super().__init__(message, hint=f"rerun `{rerun}` to build and validate it again, then register")


def verdict(report: VariantReport) -> dict[str, Any]:
    """What a validation report decided and on which figures (its validation block: no timings, no paths)."""
    judged = report.validation
    if judged is None:
        raise ValidatedOutputChanged(
            "the validation report predates its validation block", rerun="modelmint convert"
        )
    return judged.model_dump(mode="json")


def report_sha256(hashes: HashCache, path: Path, rerun: str) -> str:
    try:
        return hashes.sha256(path)
    except FileNotFoundError as e:
        raise ValidatedOutputChanged(
            f"the validation report {path} is gone since it was validated", rerun=rerun
        ) from e
