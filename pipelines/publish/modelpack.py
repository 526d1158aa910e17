"""A compressed-tensors checkpoint as a CNCF ModelPack artifact (github.com/modelpack/model-spec, specs-go/v1).

ModelPack rather than KitOps' ModelKit: ModelPack has `.raw` layer types, one unarchived file per layer with its path
in `org.cncf.model.filepath`, so every layer's digest is the sha256 modelmint's manifest already records for that
file (a ModelKit packs files into tar layers, whose digests are of the archives); and it is a vendor-neutral CNCF
format that container runtimes mount as an OCI image volume and modctl / Dragonfly / KServe read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from pipelines.publish.oci import OCI_MANIFEST, Blob, Image

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
FILEPATH = "org.cncf.model.filepath"

_DOCS = ("README.md", "vllm.yaml")
"""The model card and the vLLM serve config: documentation of how to serve it, not part of the weights."""


class PackFile(Protocol):
    """One file of the checkpoint directory with the sha256 and size registration recorded (a manifest's
    ArtifactFile)."""

    @property
    def path(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def size(self) -> int: ...


def layer_type(path: str) -> str:
    """Weights (*.safetensors and their index), documents (card, serve config), else the weights' configuration
    (config.json, tokenizer, generation config, recipe)."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".safetensors") or name == "model.safetensors.index.json":
        return WEIGHT
    return DOC if name in _DOCS else WEIGHT_CONFIG


def modelpack_image(root: Path, files: Sequence[PackFile], descriptor: dict[str, Any], *,
                    extra: tuple[Blob, ...] = ()) -> Image:
    """The ModelPack image of the checkpoint in `root`: one raw layer per file (weights first), then `extra`.

    `descriptor` is ModelPack's descriptor block (name, family, revision, licenses, createdAt); the model's own
    config.json gives the architecture and quantization.
    """
    order = {WEIGHT: 0, WEIGHT_CONFIG: 1, DOC: 2}
    ranked = sorted(files, key=lambda f: (order[layer_type(f.path)], f.path))
    layers = tuple(Blob.of_file(layer_type(f.path), root / f.path, f.sha256, f.size, {FILEPATH: f.path})
                   for f in ranked)
    config = {
        "descriptor": {k: v for k, v in descriptor.items() if v},
        "config": _model_config(root),
        "modelfs": {"type": "layers", "diffIds": [b.digest for b in (*layers, *extra)]},
    }
    blob = Blob.of_bytes(CONFIG, json.dumps(config, separators=(",", ":"), ensure_ascii=False).encode())
    return Image(OCI_MANIFEST, blob, (*layers, *extra), artifact_type=ARTIFACT_TYPE)


def _model_config(root: Path) -> dict[str, Any]:
    try:
        cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        cfg = {}
    quant = cfg.get("quantization_config") or {}
    out = {
        "architecture": "transformer",
        "format": "safetensors",
        "precision": cfg.get("torch_dtype") or cfg.get("dtype"),
        "quantization": quant.get("quant_method"),
    }
    return {k: v for k, v in out.items() if v}
