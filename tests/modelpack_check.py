"""A ModelPack consumer's rules, for the tests: what an artifact modelmint publishes must satisfy to be read by
tools that follow the CNCF model-spec and by modctl's extract, written from their sources at the commits in
tests/data/modelpack/pin.json (cited as file:line there). Not modelmint's own reader: nothing here imports it.

- model-spec docs/spec.md:23-37: the manifest's mediaType is the OCI image manifest, its artifactType
  `application/vnd.cncf.model.manifest.v1+json`, its config `application/vnd.cncf.model.config.v1+json`;
  docs/spec.md:41-85: the layer media types ModelPack defines (weight, weight.config, doc, code, dataset; raw or tar);
- model-spec schema/config-schema.json (tests/data/modelpack/config-schema.json, verbatim): the config blob, with
  its date-time formats; docs/config.md:103-128: each comma-separated `precision` is one of its table's names;
  docs/config.md:70-72: `licenses` are SPDX expressions;
- modctl pkg/codec/codec.go:62-74 (TypeFromMediaType): a layer whose media type ends in neither `.tar` nor `.raw`
  has no codec and pkg/backend/extract.go:119-131 (extractLayer) fails the whole extract on it;
  pkg/codec/raw.go:122-123: a raw layer is written to filepath.Join(output, the `org.cncf.model.filepath`
  annotation), so it needs one, relative and inside the output;
- the OCI image spec's config.rootfs analogue: modelfs.diffIds are the layers' digests (raw layers: uncompressed).
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import Any

import jsonschema

DATA = Path(__file__).parent / "data" / "modelpack"
SCHEMA = json.loads((DATA / "config-schema.json").read_text())
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG = "application/vnd.cncf.model.config.v1+json"
LAYER_TYPES = {f"application/vnd.cncf.model.{kind}.v1.{codec}"
               for kind in ("weight", "weight.config", "doc", "code", "dataset")
               for codec in ("raw", "tar", "tar+gzip", "tar+zstd")}
PRECISIONS = {"float32", "float64", "float16", "bfloat16", "float8_e4m3", "float8_e5m2", "complex32", "complex64",
              "complex128", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"}
FILEPATH = "org.cncf.model.filepath"
_SPDX_ID = re.compile(r"(LicenseRef-[A-Za-z0-9.-]+|[A-Za-z0-9][A-Za-z0-9.+-]*)")


def problems(manifest: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """Every rule above that the image manifest and its config blob break (empty: a conforming artifact)."""
    found: list[str] = []
    if manifest.get("mediaType") != OCI_MANIFEST:
        found.append(f"manifest mediaType {manifest.get('mediaType')!r} is not {OCI_MANIFEST}")
    if manifest.get("artifactType") != ARTIFACT_TYPE:
        found.append(f"artifactType {manifest.get('artifactType')!r} is not {ARTIFACT_TYPE}")
    if (manifest.get("config") or {}).get("mediaType") != CONFIG:
        found.append(f"config mediaType {(manifest.get('config') or {}).get('mediaType')!r} is not {CONFIG}")
    paths: list[str] = []
    for i, layer in enumerate(manifest.get("layers") or []):
        kind = layer.get("mediaType", "")
        if kind not in LAYER_TYPES:
            found.append(f"layer {i}: {kind!r} is not a ModelPack layer type")
        if not (kind.endswith(".tar") or kind.endswith(".raw")):
            found.append(f"layer {i}: {kind!r} has no codec for modctl (neither .tar nor .raw)")
        path = (layer.get("annotations") or {}).get(FILEPATH, "")
        if kind.endswith(".raw"):
            norm = posixpath.normpath(path) if path else ""
            if not path:
                found.append(f"layer {i}: a raw layer without {FILEPATH}")
            elif path.startswith("/") or norm == ".." or norm.startswith("../"):
                found.append(f"layer {i}: {FILEPATH} {path!r} leaves the output directory")
            paths.append(norm)
    if len(paths) != len(set(paths)):
        found.append(f"two layers extract to one path: {sorted(p for p in paths if paths.count(p) > 1)}")
    validator = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    found += [f"config: {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
              for e in validator.iter_errors(config)]
    precision = ((config.get("config") or {}).get("precision")) or ""
    found += [f"config: precision {p!r} is not one model-spec names" for p in precision.split(",") if p and p not in PRECISIONS]
    for lic in (config.get("descriptor") or {}).get("licenses") or []:
        if not isinstance(lic, str) or not _SPDX_ID.fullmatch(lic):
            found.append(f"config: license {lic!r} is not an SPDX identifier or LicenseRef-")
    diff_ids = ((config.get("modelfs") or {}).get("diffIds")) or []
    if diff_ids != [x.get("digest") for x in manifest.get("layers") or []]:
        found.append("config: modelfs.diffIds are not the layers' digests in order")
    return found
