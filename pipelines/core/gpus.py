"""GPU profiles (pipelines/data/gpus.yaml) and clusters of them: what the serving planner plans for, and what a
catalog entry's `serve.gpus` names (checked when the catalog loads)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines import PACKAGE
from pipelines.core.errors import ConfigError

GPUS_FILE = PACKAGE / "data" / "gpus.yaml"
GIB = 1 << 30


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    """The total memory CUDA reports (what vLLM multiplies by gpu_memory_utilization), not the nominal size."""
    bandwidth_gbs: float
    compute_capability: str
    interconnect: str
    node_label: str
    memory_source: str = "nominal"
    """Where memory_gib was read: a vLLM startup log or CUDA message that printed it, or "nominal" (data sheet)."""

    @property
    def memory_measured(self) -> bool:
        """Whether memory_gib is what CUDA reported somewhere (else the data sheet's size, a little too large)."""
        return not self.memory_source.startswith("nominal")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def fp8_compute(self) -> bool:
        """FP8 tensor cores: Ada and Hopper (compute capability 8.9 and newer)."""
        major, minor = (int(x) for x in self.compute_capability.split("."))
        return (major, minor) >= (8, 9)


@cache
def known_gpus(path: Path = GPUS_FILE) -> dict[str, GPU]:
    """The GPU profiles (pipelines/data/gpus.yaml), by name."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {name: GPU(name, **fields) for name, fields in raw.items()}


def gpu(name: str, *, written: str = "{}") -> GPU:
    """A GPU profile by name (case-insensitive); `written`: how the input around the name reads (`1x{}`), so that
    a suggestion is shown as it would be typed there.

    Raises:
        ConfigError: an unknown name: the known ones, the nearest (`suggest_gpu`), and how to add one.
    """
    gpus = known_gpus()
    found = {k.lower(): v for k, v in gpus.items()}.get(name.lower())
    if found is None:
        near = suggest_gpu(name)
        raise ConfigError(
            f"unknown GPU {name!r}; known: {', '.join(gpus)}",
            hint=(f"did you mean {written.format(near)}? " if near else "")
            + f"use one of the known names (`modelmint plan --list-gpus`), or add a profile to {GPUS_FILE} "
            "(memory_gib as CUDA reports it, memory_source, bandwidth_gbs, compute_capability, interconnect, "
            "node_label); a cluster of several groups can be an inventory file: --gpus cluster.yaml holding "
            f"{INVENTORY_EXAMPLE}",
        )
    return found


INVENTORY_EXAMPLE = "- {nodes: 1, gpus: 8, type: A800-80G}"
"""One group of an inventory file, as the hints show it."""


def _spelled(name: str) -> str:
    """`name` as the profiles spell a GPU: upper case, no vendor, dashes between words, GB/GiB as G
    (`nvidia a100 80GB` -> `A100-80G`)."""
    text = re.sub(r"[\s_]+", "-", name.strip().upper())
    text = re.sub(r"^(NVIDIA|GEFORCE)-?", "", text)
    text = re.sub(r"^(NVIDIA|GEFORCE)-?", "", text)  # "NVIDIA GeForce RTX 4090"
    text = re.sub(r"(\d+)-?GI?B?$", r"\1G", text)  # 80GB, 80GiB, 80-GB -> 80G
    return re.sub(r"^RTX-", "RTX", text)


def suggest_gpu(name: str) -> str | None:
    """The known GPU profile `name` most likely means, or None: the profile it is once spelled as the profiles
    are (`A100-80GB`), the plainest profile it begins (`H100` -> `H100-80G`, not `H100-PCIe-80G`) or is part of
    (`4090`), else the closest by difflib."""
    import difflib

    by_spelling = {_spelled(k): k for k in known_gpus()}
    wanted = _spelled(name)
    if wanted in by_spelling:
        return by_spelling[wanted]
    begun = sorted((k for k in by_spelling if k.startswith(wanted + "-")), key=len)
    within = sorted((k for k in by_spelling if len(wanted) >= 3 and wanted in k), key=len)  # `4090`
    if begun or within:
        return by_spelling[(begun or within)[0]]
    close = difflib.get_close_matches(wanted, list(by_spelling), n=1, cutoff=0.75)
    return by_spelling[close[0]] if close else None


@dataclass(frozen=True)
class NodeGroup:
    """`nodes` machines with `gpus_per_node` GPUs of one type each."""

    nodes: int
    gpus_per_node: int
    gpu: GPU

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}x{self.gpu.name}"


_GROUP = re.compile(r"^(?:(\d+)x)?(\d+)x([A-Za-z0-9._-]+)$")
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1_024
"""Beyond any cluster there is (the largest GPU nodes hold 8 to 16; NVL72 racks 72): the planner's searches over
splits of a count are bounded by them (a count of 10**20 GPUs per node searched for its divisors for hours)."""


def parse_cluster(text: str) -> list[NodeGroup]:
    """A cluster on the command line: `4xRTX4090-24G` (one node of 4), `2x8xH100-80G` (2 nodes of 8), mixed with
    `+`: `1x8xA800-80G+1x8xL20-48G`.

    Raises:
        ConfigError: a part that is not [NODESx]GPUSxNAME, a count below one, or an unknown GPU.
    """
    groups = []
    for part in (p.strip() for p in text.split("+")):
        m = _GROUP.match(part)
        if not m:
            raise ConfigError(
                f"{part!r} is not a GPU group",
                hint="write [NODESx]GPUSxNAME, e.g. 4xRTX4090-24G or "
                "2x8xH100-80G; join groups with +; `modelmint plan --list-gpus` lists the names",
            )
        nodes, per_node = int(m.group(1) or 1), int(m.group(2))
        if nodes < 1 or per_node < 1:
            raise ConfigError(f"{part!r} counts no GPU", hint="counts start at 1, e.g. 1x8xH100-80G")
        profile = gpu(m.group(3), written=part[: m.start(3)] + "{}")
        groups.append(NodeGroup(nodes, per_node, profile))
    return _within_bounds(merge_groups(groups), text)


def _within_bounds(groups: list[NodeGroup], what: str) -> list[NodeGroup]:
    """Raises ConfigError for a group of more nodes, or more GPUs per node, than any cluster has."""
    for g in groups:
        if g.nodes > MAX_NODES or g.gpus_per_node > MAX_GPUS_PER_NODE:
            raise ConfigError(
                f"{what!r} counts {g.nodes} node(s) of {g.gpus_per_node} {g.gpu.name}: more than any cluster has "
                f"(the planner sizes at most {MAX_NODES} nodes of at most {MAX_GPUS_PER_NODE} GPUs)",
                hint="write the cluster's real counts, e.g. 2x8xH100-80G",
            )
    return groups


class _InventoryGroup(BaseModel):
    # strict: YAML's `gpus: true` or `nodes: "2"` is a mistake to name, not a count of 1 or 2
    model_config = ConfigDict(extra="forbid", strict=True)

    nodes: int = Field(default=1, ge=1)
    gpus: int = Field(ge=1, description="GPUs per node")
    type: str = Field(description="a GPU profile name (modelmint plan --list-gpus)")


def load_inventory(path: Path) -> list[NodeGroup]:
    """A cluster as a YAML inventory: a list of groups, each `{nodes: N, gpus: GPUS_PER_NODE, type: NAME}` (nodes
    defaults to 1), in the order --gpus would join them with +.

    Raises:
        ConfigError: not YAML, not a list of such groups (an unknown or misspelled key, a count below one), or an
            unknown GPU: naming the file, the entry and the fix.
    """
    example = INVENTORY_EXAMPLE
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"cannot read the inventory {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
            f"{err.start})",
            hint=f"save it as UTF-8 text: a YAML list of groups, e.g. {example}",
        ) from None
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(
            f"cannot read the inventory {path}: {err}", hint=f"a YAML list of groups, e.g. {example}"
        ) from None
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"the inventory {path} is not a list of GPU groups", hint=f"write e.g. {example}")
    groups = []
    for i, entry in enumerate(raw, 1):
        try:
            g = _InventoryGroup.model_validate(entry)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'entry'}: "
                + ("not a mapping of nodes, gpus and type" if e["type"] == "model_type" else e["msg"])
                + ("" if e["type"] == "missing" else f" (got {_shown(e['input'])})")
                for e in err.errors()
            )
            raise ConfigError(
                f"{path}, group {i}: {problems}",
                hint=f"each group has gpus and type, and may have nodes: {example}",
            ) from None
        try:
            profile = gpu(g.type, written="type: {}")
        except ConfigError as err:  # name where the typo is: an inventory has many groups
            raise ConfigError(f"{path}, group {i}: {err.message}", hint=err.hint) from None
        groups.append(NodeGroup(g.nodes, g.gpus, profile))
    return _within_bounds(merge_groups(groups), str(path))


def _shown(value: object) -> str:
    """A YAML value as it was written, cut short."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("...").strip()
    return text if len(text) <= 40 else text[:37] + "..."


def merge_groups(groups: list[NodeGroup]) -> list[NodeGroup]:
    """`groups` with repeats of one shape (GPUs per node and type) joined into one group of all their nodes, in the
    order each shape first appears: `1x8xH100-80G+1x8xH100-80G` is the cluster `2x8xH100-80G`. Each group's plan
    writes its files under its own name, so two groups of one name would overwrite each other's."""
    merged: dict[tuple[int, str], NodeGroup] = {}
    for g in groups:
        key = (g.gpus_per_node, g.gpu.name)
        seen = merged.get(key)
        merged[key] = NodeGroup(g.nodes + (seen.nodes if seen else 0), g.gpus_per_node, g.gpu)
    return list(merged.values())


def cluster_of(text: str) -> list[NodeGroup]:
    """--gpus: a YAML inventory file (.yaml / .yml) or the inline form parse_cluster reads."""
    return load_inventory(Path(text)) if text.endswith((".yaml", ".yml")) else parse_cluster(text)


def cluster_label(groups: list[NodeGroup]) -> str:
    """A cluster as --gpus writes it in full (`4xRTX4090-24G` is `1x4xRTX4090-24G`), groups joined with +."""
    return "+".join(map(str, groups))
