"""An artifact's weights: which of its files hold them (every safetensors shard, every split GGUF) and their bytes."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from pipelines.core.errors import ArtifactError

WEIGHT_SUFFIXES = (".gguf", ".safetensors")
"""The files an engine loads weights from. Indexes (model.safetensors.index.json), configs, tokenizers, cards
and serving files are not weights, however large the tokenizer."""

_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
"""llama.cpp's split naming (llama_split_path: PREFIX-%05d-of-%05d.gguf), what llama-gguf-split writes."""


def is_weight_file(path: str) -> bool:
    """Whether a file of an artifact directory ('/'-separated, relative to it) holds weights: a top-level GGUF or
    safetensors file (engines load weights from the directory itself: serve/ holds plans, never weights)."""
    return "/" not in path and path.endswith(WEIGHT_SUFFIXES)


def weights_bytes(files: Iterable[tuple[str, int]]) -> int:
    """The bytes of every weight file among (path, size) pairs: a checkpoint's shards, a split GGUF's shards."""
    return sum(size for path, size in files if is_weight_file(path))


def gguf_shards(gguf: Path) -> list[Path]:
    """The files a GGUF's weights are in: itself, or every shard of its split when it is one.

    Raises:
        ArtifactError: a split shard is missing beside it.
    """
    m = _SPLIT.match(gguf.name)
    if m is None:
        return [gguf]
    count = int(m["count"])
    shards = [gguf.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    if missing := [s.name for s in shards if not s.is_file()]:
        raise ArtifactError(f"{gguf} is shard {int(m['no'])} of {count}, but {', '.join(missing)} is not beside it",
                            hint="place every shard llama-gguf-split wrote in the same directory")
    return shards


def weights_line(files: list[tuple[str, int]], kind: str) -> str:
    """A model card's sentence on the weights: their bytes and in how many files, e.g. `37.0 GiB in 8 safetensors
    files.` (`files`: the weight files' names and sizes; `kind`: what they are)."""
    total = sum(size for _, size in files)
    size = f"{total / (1 << 30):,.1f} GiB" if total >= 1 << 30 else f"{total / (1 << 20):,.1f} MiB"
    return f"The weights are {size} in {'one' if len(files) == 1 else len(files)} {kind} file{'s' * (len(files) != 1)}."
