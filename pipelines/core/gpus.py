"""GPU profiles (pipelines/data/gpus.yaml) and clusters of them: what the serving planner plans for, and what a
catalog entry's `serve.gpus` names (checked when the catalog loads)."""

from __future__ import annotations

import dataclasses
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
    kind: str = "cuda"
    """cuda (a GPU), metal (an Apple machine's unified memory, as Metal lets the GPU use it) or cpu (host memory):
    vLLM plans need cuda; llama.cpp and Ollama run on all three."""
    fp8: bool | None = None
    """FP8 compute as the user's inventory states it (None: from compute_capability)."""
    ram_gib: float = 0.0
    """A cpu or metal machine's whole memory (memory_gib is the share an engine may use); 0 for a GPU."""

    @property
    def memory_measured(self) -> bool:
        """Whether memory_gib is what CUDA reported somewhere (else the data sheet's size, a little too large, or an
        estimate below it)."""
        return not self.memory_source.startswith(("nominal", "estimated"))

    @property
    def memory_estimated(self) -> bool:
        """Whether memory_gib is the nominal size less CUDA_ALLOWANCE_GIB (no CUDA-reported figure found)."""
        return self.memory_source.startswith("estimated")

    @property
    def memory_basis(self) -> str:
        """How memory_gib was had, as a plan's reasons say it."""
        if self.kind != "cuda":
            return self.memory_source
        if self.memory_estimated:
            return f"estimated: nominal less {CUDA_ALLOWANCE_GIB} GiB"
        return "as CUDA reports it" if self.memory_measured else "nominal"

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def fp8_compute(self) -> bool:
        """FP8 tensor cores: Ada and Hopper (compute capability 8.9 and newer), or what the inventory says."""
        if self.fp8 is not None:
            return self.fp8
        if not re.fullmatch(r"\d+\.\d+", self.compute_capability):
            return False
        major, minor = (int(x) for x in self.compute_capability.split("."))
        return (major, minor) >= (8, 9)


@cache
def known_gpus(path: Path = GPUS_FILE) -> dict[str, GPU]:
    """The GPU profiles (pipelines/data/gpus.yaml), by name."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {name: GPU(name, **fields) for name, fields in raw.items()}


CUDA_ALLOWANCE_GIB = 0.45
"""What CUDA reports below a GDDR card's nominal size, where no log of the card has been found: the RTX 4090 reports
23.55 of its 24 GiB (the larger of the measured gaps in gpus.yaml: the RTX 3090's is 0.31)."""
HOST_RESERVE_GIB = 2.0
"""Host memory left to the operating system and other programs on a `cpu:` machine."""
METAL_SMALL_SHARE, METAL_LARGE_SHARE, METAL_SMALL_UP_TO_GIB = 2 / 3, 3 / 4, 36
"""The share of an Apple machine's unified memory Metal lets the GPU use by default: llama.cpp sizes the Metal device
by `recommendedMaxWorkingSetSize` (ggml/src/ggml-metal/ggml-metal-device.m:1503 in the pinned tree, "total" memory of
the device), which macOS sets to about 2/3 of RAM on machines of up to 36 GB and 3/4 above (measured: 10.67 GB on a
16 GB M4, exo-explore/exo#1672; 107.52 GiB on 128 GiB, antirez/ds4#893, so 3/4 is conservative on the largest);
`sudo sysctl iogpu.wired_limit_mb=N` raises it (then state the memory in an inventory file)."""
_GENERIC = re.compile(r"^(\d+(?:\.\d+)?)\s*G(?:I?B)?$", re.IGNORECASE)
_HOST = re.compile(r"^(cpu|apple):\s*(?:([A-Za-z0-9._ -]*?)-)?(\d+(?:\.\d+)?)\s*G(?:I?B)?$", re.IGNORECASE)
MAX_MEMORY_GIB = 16_384.0
"""More memory than any one GPU or host has (a bound on sizes typed or read from an inventory)."""


def generic_gpu(text: str) -> GPU | None:
    """A GPU known only by its size (`16G`): CUDA_ALLOWANCE_GIB below it, no FP8 assumed; None if `text` is not one.

    Raises:
        ConfigError: a size of 0 or beyond any GPU.
    """
    m = _GENERIC.match(text.strip())
    if not m:
        return None
    nominal = _size(float(m.group(1)), text)
    return GPU(
        f"{m.group(1)}G",
        max(nominal - CUDA_ALLOWANCE_GIB, 0.5 * nominal),
        0.0,
        "unknown",
        "pcie",
        "",
        f"estimated: nominal {m.group(1)} GiB less {CUDA_ALLOWANCE_GIB} GiB that CUDA reports below a card's "
        "nominal size (a GPU known only by its size)",
    )


def _size(gib: float, text: str) -> float:
    if not 0 < gib <= MAX_MEMORY_GIB:
        raise ConfigError(
            f"{text!r}: {gib:g} GiB is no memory size a GPU or host has",
            hint="give the memory in GiB, e.g. --gpus 1x16G, cpu:64G or apple:M3-Max-64G",
        )
    return gib


def host(text: str) -> GPU | None:
    """A machine without a CUDA GPU: `cpu:64G` (host memory, HOST_RESERVE_GIB left to the system) or
    `apple:M3-Max-64G` (unified memory, of which Metal uses METAL_SMALL_SHARE / METAL_LARGE_SHARE); None if `text`
    is neither.

    Raises:
        ConfigError: `cpu:` or `apple:` without a size in GiB, or a size no machine has.
    """
    t = text.strip()
    if not re.match(r"^(cpu|apple):", t, re.IGNORECASE):
        return None
    m = _HOST.match(t)
    if not m:
        raise ConfigError(
            f"{text!r} gives no memory size",
            hint="write cpu:RAMG or apple:CHIP-RAMG with the memory in GiB, e.g. cpu:64G or apple:M3-Max-64G",
        )
    ram = _size(float(m.group(3)), text)
    if m.group(1).lower() == "cpu":
        usable = max(ram - HOST_RESERVE_GIB, ram / 2)
        return GPU(f"cpu-{m.group(3)}G", usable, 0.0, "cpu", "none", "", f"host memory: {ram:g} GiB less "
                   f"{min(HOST_RESERVE_GIB, ram / 2):g} GiB left to the system", kind="cpu", fp8=False,
                   ram_gib=ram)
    share = METAL_SMALL_SHARE if ram <= METAL_SMALL_UP_TO_GIB else METAL_LARGE_SHARE
    chip = (m.group(2) or "").strip().replace(" ", "-")
    return GPU(
        f"apple-{chip + '-' if chip else ''}{m.group(3)}G",
        ram * share,
        0.0,
        "metal",
        "unified",
        "",
        f"Metal's default working set: {share:.0%} of {ram:g} GiB of unified memory (recommendedMaxWorkingSetSize)",
        kind="metal",
        fp8=False,
        ram_gib=ram,
    )


def gpu(name: str, *, written: str = "{}") -> GPU:
    """A GPU profile by name (case-insensitive); `written`: how the input around the name reads (`1x{}`), so that
    a suggestion is shown as it would be typed there.

    Raises:
        ConfigError: an unknown name: the known ones, the nearest (`suggest_gpu`), and how to add one.
    """
    gpus = known_gpus()
    found = {k.lower(): v for k, v in gpus.items()}.get(name.lower()) or generic_gpu(name)
    if found is None:
        near = suggest_gpu(name)
        raise ConfigError(
            f"unknown GPU {name!r}; known: {', '.join(gpus)}",
            hint=(f"did you mean {written.format(near)}? " if near else "")
            + "use one of the known names (`modelmint plan --list-gpus`), a size alone (e.g. 1x16G), or describe "
            f"the card in your own inventory file, e.g. --gpus cluster.yaml holding {CUSTOM_EXAMPLE} (memory_gib as "
            f"CUDA reports it; fp8: whether it has FP8 compute; groups of known GPUs read {INVENTORY_EXAMPLE}), "
            f"or add a profile to {GPUS_FILE}",
        )
    return found


INVENTORY_EXAMPLE = "- {nodes: 1, gpus: 8, type: A800-80G}"
"""One group of an inventory file, as the hints show it."""
CUSTOM_EXAMPLE = "- {gpus: 1, type: MyCard-20G, memory_gib: 19.5, fp8: false}"
"""A group of a GPU no profile names, described in the inventory itself."""


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


def parse_cluster(text: str, *, hosts: bool = False) -> list[NodeGroup]:
    """A cluster on the command line: `4xRTX4090-24G` (one node of 4), `2x8xH100-80G` (2 nodes of 8), `1x16G` (a
    GPU known by its size), mixed with `+`: `1x8xA800-80G+1x8xL20-48G`; with `hosts`, also one machine without a CUDA
    GPU, `cpu:64G` or `apple:M3-Max-64G` (llama.cpp and Ollama serve there, vLLM does not).

    Raises:
        ConfigError: a part that is not [NODESx]GPUSxNAME, a count below one, or an unknown GPU; a host where
            `hosts` is off.
    """
    machine = host(text)
    if machine is not None:
        if not hosts:
            raise ConfigError(
                f"{text!r} is a machine without a CUDA GPU: vLLM plans need CUDA GPUs",
                hint=f"llama.cpp and Ollama serve GGUF variants there: `modelmint recommend --gpus {text.strip()}`",
            )
        return [NodeGroup(1, 1, machine)]
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
    type: str = Field(description="a GPU profile name (modelmint plan --list-gpus), or your own card's name")
    memory_gib: float | None = Field(default=None, gt=0, le=MAX_MEMORY_GIB,
                                     description="the memory CUDA reports (a card no profile names needs it)")
    fp8: bool | None = Field(default=None, description="whether the card has FP8 compute (default: no)")


def load_inventory(path: Path) -> list[NodeGroup]:
    """A cluster as a YAML inventory: a list of groups, each `{nodes: N, gpus: GPUS_PER_NODE, type: NAME}` (nodes
    defaults to 1), in the order --gpus would join them with +. A card no profile names is described in the group:
    `memory_gib` (what CUDA reports) and `fp8` (FP8 compute, default no); given for a known profile they replace its
    figures.

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
                hint=f"each group has gpus and type, and may have nodes: {example}; a card no profile names "
                f"also gives its memory (a number of GiB) and fp8 (true or false): {CUSTOM_EXAMPLE}",
            ) from None
        try:
            profile = _custom(g) if g.memory_gib is not None else gpu(g.type, written="type: {}")
        except ConfigError as err:  # name where the typo is: an inventory has many groups
            raise ConfigError(f"{path}, group {i}: {err.message}", hint=err.hint) from None
        if g.fp8 is not None:
            profile = dataclasses.replace(profile, fp8=g.fp8)
        groups.append(NodeGroup(g.nodes, g.gpus, profile))
    return _within_bounds(merge_groups(groups), str(path))


def _custom(g: _InventoryGroup) -> GPU:
    """The group's own card: a known profile with the memory replaced, or a card described only by the file."""
    assert g.memory_gib is not None
    known = {k.lower(): v for k, v in known_gpus().items()}.get(g.type.lower())
    source = "your inventory file"
    if known is not None:
        return dataclasses.replace(known, memory_gib=g.memory_gib, memory_source=source)
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", g.type):
        raise ConfigError(f"type: {g.type!r} is not a GPU name (letters, digits, . _ -)",
                          hint=f"name your card plainly, e.g. {CUSTOM_EXAMPLE}")
    return GPU(g.type, g.memory_gib, 0.0, "unknown", "pcie", "", source, fp8=bool(g.fp8))


def _shown(value: object) -> str:
    """A YAML value as it was written, cut short."""
    text = str(yaml.safe_dump(value, default_flow_style=True, width=1 << 16)).strip().removesuffix("...").strip()
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


def cluster_of(text: str, *, hosts: bool = False) -> list[NodeGroup]:
    """--gpus: a YAML inventory file (.yaml / .yml) or the inline form parse_cluster reads (`hosts`: cpu: and
    apple: machines too)."""
    return load_inventory(Path(text)) if text.endswith((".yaml", ".yml")) else parse_cluster(text, hosts=hosts)


def cluster_label(groups: list[NodeGroup]) -> str:
    """A cluster as --gpus writes it in full (`4xRTX4090-24G` is `1x4xRTX4090-24G`), groups joined with +."""
    return "+".join(map(str, groups))
