"""The artifact formats modelmint builds, each declared once in a module of this package that registers itself.

The CLI, the flow, registration, pull and dvc.yaml dispatch through `FORMATS` / `format_of`; no other module
asks "which format is this?". A new format (an OCI model package, another quantizer) is one more module that
declares its names (pipelines/store/names.py) and calls `implement` with its hooks, not a branch in each of
those places. A format's module is imported the first time one of its hooks is asked for (`FORMATS[name]`,
`format_of(tag)`), so reading a manifest or pulling a GGUF never imports the compressed-tensors build.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import cast

from pipelines.core.vocab import Format
from pipelines.store.formats.base import ArtifactFormat, format_of, implement, implementation
from pipelines.store.names import NAMES, format_name

FORMAT_MODULES = ("gguf", "compressed")
"""The built-in format modules (pipelines/store/formats/<module>.py), in declaration order (names.py)."""

# Format (core/vocab.py) is the built-in formats' names, for static typing; the tables hold every declared one
# (names.Format is any name).


class _Formats(Mapping[str, ArtifactFormat]):
    """Every declared format by name, in declaration order; a format's module is imported when it is looked up."""

    def __getitem__(self, name: str) -> ArtifactFormat:
        return implementation(name)

    def __iter__(self) -> Iterator[str]:
        return iter(list(NAMES))

    def __len__(self) -> int:
        return len(NAMES)


FORMATS = cast("Mapping[Format, ArtifactFormat]", _Formats())


def split_by_format(tags: list[str]) -> dict[str, list[str]]:
    """`tags` grouped by format, in declaration order, each in the order given."""
    return {name: [t for t in tags if format_name(t).name == name] for name in NAMES}


__all__ = [
    "FORMATS",
    "FORMAT_MODULES",
    "ArtifactFormat",
    "Format",
    "format_of",
    "implement",
    "implementation",
    "split_by_format",
]
