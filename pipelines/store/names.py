"""Which format a variant tag is, its dvc.yaml stage and its artifact path: the names every registry module shares.

The built-in formats' facts (their stages, quant types and schemes, the artifact path) are pipelines/core/vocab.py's;
this table adds what a registry needs to dispatch on them and lets a format be declared beside them (one in a test).

A leaf: it imports no format's implementation and no other registry module, so manifest, dvcrepo and dvcgen read
it without pulling in a build (pipelines/store/formats/ holds the implementations; each registers itself there,
and `module` says where a name's implementation is, imported on first use as llama.cpp's conversion table does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.core.vocab import COMPRESSED_SCHEMES, GGUF_QUANT_TYPES, STAGES
from pipelines.core.vocab import artifact_relpath as artifact_relpath
from pipelines.source.catalog import CatalogEntry

Format = str
"""A format's name: gguf, compressed-tensors (or one a test declares)."""


@dataclass(frozen=True)
class FormatName:
    """What the registry needs of a format without building anything: its names, commands and variants."""

    name: Format
    stage: str
    """The dvc.yaml stage that builds it (its `foreach` items are name-tag): gguf@qwen2.5-q4_k_m."""
    command: str
    """The CLI command that builds, validates and (with --register) registers it."""
    option: str
    """That command's option naming variants."""
    owns: Callable[[str], bool]
    """Whether a variant tag is of this format."""
    catalog_variants: Callable[[CatalogEntry], list[str]]
    """The variants of this format a catalog entry asks for."""
    pins: str
    """The toolchain pin file its dvc.yaml stage depends on (a changed toolchain rebuilds it)."""
    module: str
    """The module implementing it (pipelines/store/formats/<x>.py); imported when a hook is first asked for."""
    fallback: bool = False
    """The format of a tag no other format owns (GGUF: what a tag was before compressed-tensors existed)."""
    built_from: Callable[[dict[str, Any], str], Any] = lambda variants, tag: variants.get(tag)
    """(a catalog entry's `variants` block as data, a tag) → the part of it that tag's bytes depend on (by default
    the block named by the tag), which registration compares with the catalog as it is when it records the build."""

    def rebuild_command(self, name: str, tag: str) -> str:
        """The command that builds, validates and registers (uploads) this variant again on a machine."""
        return f"modelmint {self.command} {name} {self.option} {tag} --register"

    @property
    def dvc_command(self) -> str:
        """The command of its dvc.yaml stage (DVC records the output itself: --no-track)."""
        return f"modelmint {self.command} ${{item.model}} {self.option} ${{item.tag}} --register --no-track"


NAMES: dict[Format, FormatName] = {}
"""Every declared format, in declaration order (the order of dvc.yaml's stages, of runs and of reports)."""


def declare(fmt: FormatName) -> FormatName:
    """Add a format's names (again: the same name replaces its entry, keeping its place)."""
    NAMES[fmt.name] = fmt
    return fmt


def undeclare(name: Format) -> None:
    """Remove a declared format (a test's own, when it ends)."""
    NAMES.pop(name, None)


def format_name(tag: str) -> FormatName:
    """The format a variant tag builds: the one that owns it (fp8, awq, … are compressed-tensors), else GGUF."""
    owner = next((f for f in NAMES.values() if not f.fallback and f.owns(tag)), None)
    return owner or next(f for f in NAMES.values() if f.fallback)


def owner(tag: str) -> FormatName | None:
    """The format that owns `tag` outright; None when no format names it (a typo, an unknown type)."""
    return next((f for f in NAMES.values() if f.owns(tag)), None)


def stage_name(name: str, tag: str) -> str:
    """The dvc.yaml stage whose output is that directory: gguf@qwen2.5-q4_k_m, compress@qwen2.5-fp8."""
    return f"{format_name(tag).stage}@{name}-{tag}"


def _gguf_variants(entry: CatalogEntry) -> list[str]:
    spec = entry.variants.gguf
    return [q.lower() for q in spec.quants] if spec else []


def _gguf_built_from(variants: dict[str, Any], tag: str) -> Any:
    """One block holds every GGUF type: a type's bytes depend on all of it but the list of types (`--variants`
    narrows that list, and a type is made the same whichever others are built beside it)."""
    block = variants.get("gguf")
    return {**block, "quants": None} if block and tag in (block.get("quants") or []) else variants.get(tag)


declare(
    FormatName(
        name="gguf",
        stage=STAGES["gguf"],
        command="convert",
        option="--variants",
        owns=lambda tag: tag in GGUF_QUANT_TYPES,
        catalog_variants=_gguf_variants,
        pins="toolchains/llama-cpp.env",
        module="pipelines.store.formats.gguf",
        fallback=True,
        built_from=_gguf_built_from,
    )
)
declare(
    FormatName(
        name="compressed-tensors",
        stage=STAGES["compressed-tensors"],
        command="compress",
        option="--schemes",
        owns=lambda tag: tag in COMPRESSED_SCHEMES,
        catalog_variants=lambda entry: list(entry.variants.compressed()),
        pins="toolchains/llmcompressor.env",
        module="pipelines.store.formats.compressed",
    )
)
