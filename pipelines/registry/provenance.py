"""Provenance: an in-toto statement with the SLSA provenance v1 predicate for each registered artifact.

The predicate follows https://slsa.dev/provenance/v1: `buildDefinition` (what was asked: the catalog entry and
recipe; what was resolved: the source files, the parent GGUF, the calibration and evaluation texts, by sha256),
`runDetails` (the builder, host-independent: modelmint's version and the toolchain pins; the gate's figures and
verdict as a byproduct). The statement is a file of the artifact directory, `provenance.json`, and the artifact's
signature (pipelines/registry/signing.py) covers it: it is signed with the same key.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from pipelines import __version__
from pipelines.core.fsutil import HashCache

if TYPE_CHECKING:
    from pipelines.core.settings import Settings
    from pipelines.registry.manifest import Manifest, ParentRef
    from pipelines.source.catalog import CatalogEntry


class Built(Protocol):
    """What the provenance reads of a registration candidate (register.Candidate), named here so that this module
    does not import registration (which imports it)."""

    @property
    def ref(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def entry(self) -> CatalogEntry: ...
    @property
    def recipe(self) -> dict[str, Any]: ...
    @property
    def toolchain(self) -> dict[str, str]: ...
    @property
    def source(self) -> dict[str, Any]: ...
    @property
    def source_dir(self) -> Path | None: ...
    @property
    def parent(self) -> ParentRef | None: ...


PROVENANCE: Final = "provenance.json"
STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE: Final = "https://slsa.dev/provenance/v1"
BUILDER_ID: Final = "urn:modelmint:builder"
"""The builder's id names no host: two machines building the same pins are the same builder."""


def build_type(fmt: str) -> str:
    return f"urn:modelmint:build:{fmt}:v1"


def statement(
    c: Built, validation: dict[str, Any], outputs: dict[str, str], signed_at: datetime, hashes: HashCache
) -> dict[str, Any]:
    """The provenance of candidate `c`: `outputs` (path in the artifact directory → sha256) are its subjects,
    `validation` the manifest's validation block; `signed_at` the time registration signed it."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": p, "digest": {"sha256": d}} for p, d in sorted(outputs.items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": build_type(c.format),
                "externalParameters": {
                    "artifact": c.ref,
                    "catalog_entry": c.entry.model_dump(mode="json"),
                    "recipe": c.recipe,
                },
                "internalParameters": {"toolchain": c.toolchain, "key": c.key},
                "resolvedDependencies": _dependencies(c, hashes),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"modelmint": __version__, **c.toolchain}},
                "metadata": {
                    "invocationId": c.key,
                    "finishedOn": signed_at.isoformat().replace("+00:00", "Z"),
                },
                "byproducts": [
                    {
                        "name": "validation",
                        "mediaType": "application/vnd.modelmint.validation+json",
                        "annotations": validation,
                    }
                ],
            },
        },
    }


def _dependencies(c: Built, hashes: HashCache) -> list[dict[str, Any]]:
    """The inputs by sha256: the source (its content hash, then each file), the parent, the texts the recipe names."""
    src = c.source
    base = (
        f"hf://{src['repo']}@{src['revision']}"
        if src.get("repo") and src.get("revision")
        else f"modelmint:{src.get('kind')}-source"
    )
    deps: list[dict[str, Any]] = [
        {
            "uri": base,
            "name": "source",
            "digest": {"sha256": src["content_sha256"]},
            **({"annotations": src["origin"]} if src.get("origin") else {}),
        }
    ]
    if c.source_dir is not None and c.source_dir.is_dir():
        for f in sorted(p for p in c.source_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
            rel = f.relative_to(c.source_dir).as_posix()
            deps.append({"uri": f"{base}/{rel}", "name": rel, "digest": {"sha256": hashes.sha256(f)}})
    if c.parent is not None:
        deps.append(
            {
                "uri": f"modelmint:{c.parent.artifact}/{c.parent.file}",
                "name": c.parent.artifact,
                "digest": {"sha256": c.parent.sha256},
            }
        )
    for role in ("calibration", "eval"):
        text = c.recipe.get(role)
        if isinstance(text, dict) and text.get("sha256"):
            deps.append(
                {
                    "uri": f"modelmint:text/{text.get('text')}",
                    "name": role,
                    "digest": {"sha256": text["sha256"]},
                }
            )
    return deps


def read(directory: Path) -> dict[str, Any] | None:
    """The provenance statement of an artifact directory; None when it has none."""
    try:
        data: dict[str, Any] = json.loads((directory / PROVENANCE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return data


def registered(settings: Settings, manifest: Manifest) -> dict[str, Any] | None:
    """The provenance of a registered artifact: from its directory in this checkout, else from the DVC remote (one
    small object); None when it has none (registered unsigned).

    Raises:
        RemoteError, RemoteUnavailable: the checkout lacks it and the remote cannot be read.
    """
    placed = settings.repo_dir / manifest.dvc.path
    if (placed / PROVENANCE).is_file():
        return read(placed)
    if manifest.dvc.md5 is None or not any(f.path == PROVENANCE for f in manifest.files):
        return None
    from pipelines.registry.dvcrepo import read_remote_files

    raw = read_remote_files(settings, manifest.dvc.md5, [PROVENANCE]).get(PROVENANCE)
    return json.loads(raw) if raw else None


def signed_at(stmt: dict[str, Any]) -> datetime:
    """When registration signed it (runDetails.metadata.finishedOn)."""
    return datetime.fromisoformat(
        stmt["predicate"]["runDetails"]["metadata"]["finishedOn"].replace("Z", "+00:00")
    )


def disagreements(stmt: dict[str, Any], manifest: Manifest, outputs: dict[str, str]) -> list[str]:
    """Where the signed provenance and the manifest disagree, each as 'FIELD: manifest X, provenance Y'.

    `outputs` is what the signature covers (path → sha256, without the signature itself): the provenance's
    subjects must be those files but the provenance."""
    problems: list[str] = []

    def differ(what: str, in_manifest: Any, in_provenance: Any) -> None:
        if in_manifest != in_provenance:
            problems.append(
                f"{what}: the manifest records {_short(in_manifest)}, the signed provenance "
                f"{_short(in_provenance)}"
            )

    try:
        pred = stmt["predicate"]
        build, run = pred["buildDefinition"], pred["runDetails"]
        source = next(d for d in build["resolvedDependencies"] if d.get("name") == "source")
        validation = next(b for b in run["byproducts"] if b.get("name") == "validation")["annotations"]
        subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    except (KeyError, TypeError, StopIteration) as err:
        return [f"the provenance is not a statement modelmint wrote (no {err})"]
    differ("statement type", STATEMENT_TYPE, stmt.get("_type"))
    differ("predicate type", PREDICATE_TYPE, stmt.get("predicateType"))
    differ("artifact", manifest.ref, build["externalParameters"].get("artifact"))
    differ("buildType", build_type(manifest.format), build.get("buildType"))
    uri = (
        f"hf://{manifest.source.repo}@{manifest.source.revision}"
        if manifest.source.repo and manifest.source.revision
        else f"modelmint:{manifest.source.kind}-source"
    )
    differ("source", uri, source.get("uri"))
    differ("source.content_sha256", manifest.source.content_sha256, source["digest"].get("sha256"))
    recipe = build["externalParameters"].get("recipe")
    differ(
        "recipe_sha256",
        manifest.recipe_sha256,
        hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest(),
    )
    differ("toolchain", manifest.toolchain, build["internalParameters"].get("toolchain"))
    differ("key", manifest.key, build["internalParameters"].get("key"))
    differ("validation", manifest.validation.model_dump(mode="json"), validation)
    if manifest.parent is not None:
        parent: dict[str, Any] = next(
            (d for d in build["resolvedDependencies"] if d.get("name") == manifest.parent.artifact), {}
        )
        differ("parent.sha256", manifest.parent.sha256, (parent.get("digest") or {}).get("sha256"))
    expected = {p: d for p, d in outputs.items() if p != PROVENANCE}
    for p in sorted(set(expected) | set(subjects)):
        differ(f"output {p}", expected.get(p, "no such file"), subjects.get(p, "no such file"))
    return problems


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."
