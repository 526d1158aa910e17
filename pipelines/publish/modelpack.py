"""A compressed-tensors checkpoint as a CNCF ModelPack artifact (github.com/modelpack/model-spec, specs-go/v1).

ModelPack rather than KitOps' ModelKit: ModelPack has `.raw` layer types, one unarchived file per layer with its path
in `org.cncf.model.filepath`, so every layer's digest is the sha256 modelmint's manifest already records for that
file (a ModelKit packs files into tar layers, whose digests are of the archives); and it is a vendor-neutral CNCF
format that container runtimes mount as an OCI image volume and modctl / Dragonfly / KServe read.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from pipelines.publish.oci import CARRIED, MODELMINT_MANIFEST, OCI_MANIFEST, Blob, Image

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
FILEPATH = "org.cncf.model.filepath"
CARRIED_MANIFEST_PATH = "modelmint.manifest.json"
"""Where modctl's extract writes the carried modelmint manifest: every layer of a ModelPack artifact needs a codec
suffix (`.raw` / `.tar`, modctl pkg/codec/codec.go TypeFromMediaType) and a file path, or the extract refuses it."""

_WEIGHT_CONFIG = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                  "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "recipe.yaml",
                  "modelmint-recipe.yaml")
"""What loading the weights reads (transformers, vLLM), and the recipes that made them: weight configuration."""
_CODE = (".sh", ".py")

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
    """Weights (*.safetensors and their index), the weights' configuration (config.json, tokenizer, generation
    config, recipes), code (the serving plans' scripts), else documentation: the model card, LICENSE, the vLLM
    serve config and the serving plans' manifests, which say how to run the model rather than being part of it."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".safetensors") or name == "model.safetensors.index.json":
        return WEIGHT
    if "/" not in path and name in _WEIGHT_CONFIG:
        return WEIGHT_CONFIG
    return CODE if name.endswith(_CODE) else DOC


def _as_layer(blob: Blob) -> Blob:
    """A blob modelmint adds to the checkpoint's files (the carried manifest) as a ModelPack layer modctl extracts:
    a documentation layer with a file path, still recognisable by its annotation (oci.is_carried_manifest)."""
    if blob.media_type != MODELMINT_MANIFEST:
        return blob
    return dataclasses.replace(blob, media_type=DOC, annotations={
        **blob.annotations, FILEPATH: CARRIED_MANIFEST_PATH, CARRIED: MODELMINT_MANIFEST})


def modelpack_image(root: Path, files: Sequence[PackFile], descriptor: dict[str, Any], *,
                    quantization: str | None = None, extra: tuple[Blob, ...] = ()) -> Image:
    """The ModelPack image of the checkpoint in `root`: one raw layer per file (weights first), then `extra`.

    `descriptor` is ModelPack's descriptor block (name, version, revision, createdAt, …); `family` and `licenses`
    are added from the checkpoint's config.json and model card. The model's config.json gives the precision;
    `quantization` names the technique ("fp8", "awq", "gptq", "w8a8"; default: config.json's quant_method).
    """
    order = {WEIGHT: 0, WEIGHT_CONFIG: 1, CODE: 2, DOC: 3}
    ranked = sorted(files, key=lambda f: (order[layer_type(f.path)], f.path))
    layers = tuple(Blob.of_file(layer_type(f.path), root / f.path, f.sha256, f.size, {FILEPATH: f.path})
                   for f in ranked)
    extra = tuple(_as_layer(b) for b in extra)
    lic = card_license(root)
    described = {"family": family(root), "licenses": [spdx(lic)] if lic else None, **descriptor}
    config = {
        "descriptor": {k: v for k, v in described.items() if v},
        "config": _model_config(root, quantization),
        "modelfs": {"type": "layers", "diffIds": [b.digest for b in (*layers, *extra)]},
    }
    blob = Blob.of_bytes(CONFIG, json.dumps(config, separators=(",", ":"), ensure_ascii=False).encode())
    return Image(OCI_MANIFEST, blob, (*layers, *extra), artifact_type=ARTIFACT_TYPE)


def _model_config(root: Path, quantization: str | None) -> dict[str, Any]:
    try:
        cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        cfg = {}
    quant = cfg.get("quantization_config") or {}
    out = {
        "architecture": "transformer",
        "format": "safetensors",
        "precision": precision(cfg),
        "quantization": quantization or quant.get("quant_method"),
    }
    return {k: v for k, v in out.items() if v}


_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "half": "float16",
           "float": "float32"}


def precision(cfg: dict[str, Any]) -> str | None:
    """model-spec's `precision` (docs/config.md): the dtype the model computes in, then the quantized weights'
    type where it has a name there ("bfloat16,float8_e4m3" for FP8, "bfloat16,int8" for W8A8); 4-bit integer
    weights have none (the list stops at int8), so an AWQ or GPTQ checkpoint says its compute dtype and
    `quantization` says the rest."""
    dtype = _DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or ""))
    names: list[str] = [dtype] if dtype else []
    groups = ((cfg.get("quantization_config") or {}).get("config_groups") or {}).values()
    for group in groups:
        w = (group or {}).get("weights") or {}
        bits, kind = w.get("num_bits"), w.get("type")
        names_by_kind: dict[tuple[Any, Any], str] = {(8, "float"): "float8_e4m3", (8, "int"): "int8",
                                                     (16, "float"): "float16"}
        name = names_by_kind.get((bits, kind))
        if name and name not in names:
            names.append(name)
    return ",".join(names) or None


_SPDX = {"apache-2.0": "Apache-2.0", "mit": "MIT", "bsd-3-clause": "BSD-3-Clause", "bsd-2-clause": "BSD-2-Clause",
         "cc-by-4.0": "CC-BY-4.0", "cc-by-sa-4.0": "CC-BY-SA-4.0", "cc-by-nc-4.0": "CC-BY-NC-4.0",
         "gpl-3.0": "GPL-3.0-only", "lgpl-3.0": "LGPL-3.0-only", "mpl-2.0": "MPL-2.0", "openrail": "LicenseRef-openrail"}


def spdx(license_id: str) -> str:
    """A Hugging Face card's `license` as an SPDX expression (model-spec's `licenses`): the SPDX identifier where
    the hub's id is one in other case, else a LicenseRef- of the hub's id ("llama3", "other", …)."""
    return _SPDX.get(license_id.lower(), f"LicenseRef-{re.sub(r'[^A-Za-z0-9.-]', '-', license_id)}")


def card_license(root: Path) -> str | None:
    """The `license` of the model card's front matter in `root` (README.md), or None."""
    try:
        text = (root / "README.md").read_text(encoding="utf-8")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    if not text.startswith("---\n") or "\n---" not in text[4:]:
        return None
    try:
        front = yaml.safe_load(text[4:text.index("\n---", 4)])
    except yaml.YAMLError:
        return None
    value = front.get("license") if isinstance(front, dict) else None
    return value if isinstance(value, str) and value else None


def family(root: Path) -> str | None:
    """model-spec's `family` ("qwen2", "llama"): the model's config.json `model_type`."""
    try:
        value = json.loads((root / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
