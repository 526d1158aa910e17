"""dvc.yaml from the catalog: one `foreach` item per variant, each running the same command as the CLI.

GGUF variants are items of stage `gguf` (`modelmint convert`), compressed-tensors variants items of stage
`compress` (`modelmint compress`); each depends on the toolchain pins of the tool that builds it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipelines.core.fsutil import write_text_atomic
from pipelines.source.catalog import Catalog
from pipelines.store.names import NAMES, Format, artifact_relpath, stage_name

HEADER = """\
# GENERATED from registry/catalog.yaml by `modelmint dvc-yaml`: edit the catalog, then regenerate.
#
# `dvc repro` runs the same command as the CLI and the Prefect flow, one catalog variant per stage item
# (stage gguf: llama.cpp variants; stage compress: llmcompressor's compressed-tensors variants), and
# records each artifact directory's hash in dvc.lock; `dvc push` then sends the blobs to the remote.
# The command registers with --no-track because DVC records the output itself after it returns; the
# Prefect flow runs the steps and then `dvc commit`s the same stage, so both share dvc.lock and never
# write each other's outputs. A catalog or toolchain change reruns every stage; content keys make a
# rerun whose recipe did not change run no tool and leave the same bytes.
# Run `dvc repro --keep-going`: stages are independent, so one variant that fails (refused before the work,
# a tool error, a failed gate) does not stop the others; DVC exits non-zero at the end, naming the failed ones.
"""


def render(catalog: Catalog) -> str:
    """The dvc.yaml text for `catalog` (deterministic: same catalog, same bytes): one stage per declared format that
    the catalog asks variants of, running that format's command (`FormatName.dvc_command`)."""
    items: dict[Format, dict[str, dict[str, str]]] = {fmt: {} for fmt in NAMES}
    for entry in catalog.models:
        for fmt, names in NAMES.items():
            for tag in names.catalog_variants(entry):
                item = stage_name(entry.name, tag).split("@", 1)[1]
                items[fmt][item] = {"model": entry.name, "tag": tag}
    stages = {
        names.stage: {
            "foreach": items[fmt],
            "do": {
                "cmd": names.dvc_command,
                "deps": ["registry/catalog.yaml", names.pins],
                "outs": [artifact_relpath("${item.model}", "${item.tag}")],
            },
        }
        for fmt, names in NAMES.items()
        if items[fmt]
    }
    return HEADER + str(yaml.safe_dump({"stages": stages}, sort_keys=False, default_flow_style=False))


def write(catalog: Catalog, path: Path) -> bool:
    """Write dvc.yaml at `path` when it differs from what the catalog gives; True when it changed."""
    text = render(catalog)
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except FileNotFoundError:
        pass
    write_text_atomic(path, text)
    return True
