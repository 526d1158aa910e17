"""Provenance: an in-toto statement with the SLSA provenance v1 predicate for each registered artifact.

The predicate follows https://slsa.dev/provenance/v1: `buildDefinition` (what was asked: the catalog entry and
recipe; what was resolved: the source files, the parent GGUF, the calibration and evaluation texts, by sha256),
`runDetails` (the builder: one id per signing key or certificate identity, modelmint's version and git commit and
the toolchain pins; the gate's figures and verdict, and the manifest's own fields, as byproducts). The statement is a
file of the artifact directory, `provenance.json`, and the artifact's signature (pipelines/trust/signing.py) covers
it: it is signed with the same key.

The manifest is bound whole: every field registration knows when it signs (all but `files`, which the signature
covers file by file, and `dvc` and `replaces`, written after it) is in the `manifest` byproduct, with the sha256 of
their canonical JSON; verification refuses a manifest whose fields differ from those, naming each one. Its
`created_at` is the time the statement records as `finishedOn` (an RFC 3161 timestamp on the signature bounds it:
signing.verify_directory). (A field registration fills from elsewhere than the candidate and its placed directory is
not in it: see draft_manifest.)
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import quote

from pipelines import __version__
from pipelines.core.fsutil import HashCache

if TYPE_CHECKING:
    from pipelines.core.settings import Settings
    from pipelines.core.toolchains import Installed
    from pipelines.source.catalog import CatalogEntry
    from pipelines.store.manifest import Manifest, ParentRef


log = logging.getLogger(__name__)


class SignerPaths(Protocol):
    """What the provenance reads of the signing key (signing.SigningKey): its paths, named here so that this module
    does not import signing (which imports it)."""

    @property
    def key(self) -> Path: ...

    @property
    def cert(self) -> Path | None: ...


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
    @property
    def tag(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def recipe_sha256(self) -> str: ...
    @property
    def stage(self) -> str: ...
    @property
    def dvc_path(self) -> str: ...
    @property
    def files(self) -> tuple[Path, ...]: ...
    def placed_as(self, f: Path) -> str: ...


PROVENANCE: Final = "provenance.json"
STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE: Final = "https://slsa.dev/provenance/v1"
BUILDER_ID: Final = "urn:modelmint:builder"
"""The prefix of every builder id. A builder is a trust boundary: the key that signs (`BUILDER_ID:key:<keyid>`) or
the certificate identity (`BUILDER_ID:identity:<name>`); no host is named: two machines signing with one key are one
builder."""
MANIFEST_BYPRODUCT: Final = "manifest"
UNBOUND: Final = ("files", "dvc", "replaces")
"""Manifest fields the `manifest` byproduct does not hold: `files` (the signature lists every file's sha256; the
manifest's list is checked against it), and what registration writes after signing (the DVC record, the version
replaced). `created_at` is bound: it is the statement's `finishedOn` (a statement written before it was bound does
not hold it: legacy_created_at)."""


def build_type(fmt: str) -> str:
    return f"urn:modelmint:build:{fmt}:v1"


def statement(
    c: Built, validation: dict[str, Any], outputs: dict[str, str], signed_at: datetime, hashes: HashCache,
    *, directory: Path | None = None, signer: SignerPaths | None = None, toolchains_dir: Path | None = None,
) -> dict[str, Any]:
    """The provenance of candidate `c`: `outputs` (path in the artifact directory → sha256) are its subjects,
    `validation` the manifest's validation block; `signed_at` the time registration signed it; `directory` the
    artifact directory as placed (the manifest's fields are bound from it and `c`); `signer` the key that signs (the
    builder's id); `toolchains_dir` where the toolchains are set up (Settings.toolchains_dir): the installation
    report of the venv that built `c` is read there (toolchain_dependencies)."""
    name = c.ref.partition(":")[0]
    byproducts: list[dict[str, Any]] = [
        {
            "name": "validation",
            "uri": f"modelmint:validation/{c.ref}",
            "mediaType": "application/vnd.modelmint.validation+json",
            "digest": {"sha256": canonical_sha256(validation)},
            "annotations": validation,
        }
    ]
    if directory is not None:
        draft = draft_manifest(c, validation, directory, signed_at, hashes)
        # the fields registration sets from what it knows here; one it adds from elsewhere is left out (unbound)
        fields = {k: v for k, v in draft.model_dump(mode="json", exclude_unset=True).items() if k not in UNBOUND}
        byproducts.append(
            {
                "name": MANIFEST_BYPRODUCT,
                "uri": f"modelmint:manifest/{name}/{c.tag}",
                "mediaType": "application/vnd.modelmint.manifest+json",
                "digest": {"sha256": canonical_sha256(fields)},
                "annotations": fields,
            }
        )
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
                "resolvedDependencies": _dependencies(c, hashes)
                + toolchain_dependencies(c.toolchain, toolchains_dir),
            },
            "runDetails": {
                "builder": {
                    "id": builder_id(signer),
                    "version": {"modelmint": __version__, "modelmint.commit": modelmint_commit(), **c.toolchain},
                },
                "metadata": {
                    "invocationId": c.key,
                    "finishedOn": statement_time(signed_at),
                },
                "byproducts": byproducts,
            },
        },
    }


def canonical_sha256(value: Any) -> str:
    """The sha256 of `value` as canonical JSON (sorted keys, no spaces): what a descriptor's digest names."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def bound(manifest: Manifest) -> dict[str, Any]:
    """The fields of `manifest` its signed provenance holds (all but UNBOUND), as JSON values."""
    data = manifest.model_dump(mode="json")
    return {k: v for k, v in data.items() if k not in UNBOUND}


def draft_manifest(
    c: Built, validation: dict[str, Any], directory: Path, signed_at: datetime, hashes: HashCache
) -> Manifest:
    """The manifest registration will write for `c` placed in `directory`, as far as it is known when signing
    (no DVC record yet; the provenance and the signature not yet written)."""
    from pipelines.core.weights import weights_bytes
    from pipelines.store.manifest import ArtifactFile, DvcRef, Manifest, SourceRef, read_serving

    files = [
        ArtifactFile(path=p.relative_to(directory).as_posix(), sha256=hashes.sha256(p), size=p.stat().st_size)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    ]
    src = c.source
    return Manifest(
        name=c.ref.partition(":")[0],
        tag=c.tag,
        format=c.format,
        file=c.placed_as(c.files[0]),
        sha256=c.sha256,
        size_bytes=c.size_bytes,
        weights_bytes=weights_bytes((f.path, f.size) for f in files),
        files=files,
        source=SourceRef(**{k: src.get(k) for k in ("kind", "repo", "revision", "content_sha256")},
                         **({"origin": src["origin"]} if src.get("origin") else {})),
        parent=c.parent,
        toolchain=c.toolchain,
        recipe=c.recipe,
        recipe_sha256=c.recipe_sha256,
        validation=validation,
        dvc=DvcRef(path=c.dvc_path, stage=c.stage, md5=None, pushed=False),
        key=c.key,
        created_at=signed_at,
        serving=read_serving(directory),
    )


def builder_id(signer: SignerPaths | None) -> str:
    """The builder's id: its trust boundary, the signing certificate's identity (its subject's common name) or the
    signing key (the first 16 hex of the sha256 of its public key, DER); BUILDER_ID alone for an unsigned build."""
    if signer is None:
        return BUILDER_ID
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    if signer.cert is not None:
        leaf = x509.load_pem_x509_certificates(signer.cert.read_bytes())[0]
        names = leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        if names:
            return f"{BUILDER_ID}:identity:{names[0].value!s}"
    private = serialization.load_pem_private_key(signer.key.read_bytes(), password=None)
    public = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return f"{BUILDER_ID}:key:{hashlib.sha256(public).hexdigest()[:16]}"


def modelmint_commit() -> str:
    """The git commit of the modelmint checkout running (`-dirty` when its tracked files differ from it); "unknown"
    outside a git checkout (an installed wheel)."""
    from pipelines.core.errors import ToolError
    from pipelines.core.runner import run

    root = Path(__file__).resolve().parents[2]
    try:
        commit = run(["git", "rev-parse", "HEAD"], cwd=root).stdout.strip()
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root).stdout.strip()
    except (ToolError, OSError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


NO_DIGEST: Final = (
    "recorded by version only: no digest recorded (the toolchain's setup installs this package from PyPI by its pinned "
    "version, without a hash pin, and no installation report of it was read)"
)


def toolchain_dependencies(toolchain: dict[str, str], toolchains_dir: Path | None = None) -> list[dict[str, Any]]:
    """The toolchains that built it, each with its pinned source and, where one is known, the digest of that source:
    llama.cpp's pinned commit and the sha256 of the llama-cpp-python sdist its tree is built from (pinned in
    toolchains/llama-cpp.env and checked by toolchains/setup-llama-cpp.sh before it builds); then every distribution
    of the Python venv the build ran in (the llmcompressor venv, or llama.cpp's converter venv), with the URL and
    sha256 pip downloaded, from the installation report its setup wrote in `toolchains_dir`. Without such a report
    (a toolchain set up before setups wrote one, other pins, no `toolchains_dir`), each Python tool by its pinned
    PyPI version, saying why no digest is known (none is made up)."""
    from pipelines.core.toolchains import read_pins

    deps: list[dict[str, Any]] = []
    rest = {k: v for k, v in toolchain.items() if k not in ("modelmint", "llama.cpp", "llama-cpp-python-sdist")}
    if "llama.cpp" in toolchain:
        pins = read_pins("llama-cpp")
        commit = toolchain["llama.cpp"]
        sdist = toolchain.get("llama-cpp-python-sdist") or (
            pins.get("LCPP_PY_VERSION") if pins.get("LLAMA_CPP_COMMIT") == commit else None
        )
        dep: dict[str, Any] = {
            "name": "toolchain:llama.cpp",
            "uri": f"pkg:pypi/llama-cpp-python@{sdist}" if sdist else f"pkg:github/ggml-org/llama.cpp@{commit}",
            "annotations": {"llama.cpp.commit": commit},
        }
        if sdist and pins.get("LCPP_PY_VERSION") == sdist and pins.get("LLAMA_CPP_COMMIT") == commit:
            dep["digest"] = {"sha256": pins["LCPP_SDIST_SHA256"]}
            dep["annotations"]["source"] = (
                "the llama-cpp-python sdist (its vendor/llama.cpp is the tree built), sha256 checked before the build"
            )
        else:
            dep["annotations"]["source"] = "no digest recorded: the checkout's pins are not the ones it was built with"
        deps.append(dep)
    found, why = _venv_installed(toolchain, toolchains_dir)
    if found is not None:
        deps.extend(found)
        named = {d["name"] for d in found}
        rest = {k: v for k, v in rest.items() if f"toolchain:{k.removeprefix('converter.')}" not in named}
    for name, version in sorted(rest.items()):
        deps.append({
            "name": f"toolchain:{name}",
            # the GGUF build records its converter venv's torch and transformers as converter.NAME
            "uri": f"pkg:pypi/{name.removeprefix('converter.')}@{version}",
            "annotations": {"source": why},
        })
    return deps


def _venv_installed(
    toolchain: dict[str, str], toolchains_dir: Path | None
) -> tuple[list[dict[str, Any]] | None, str]:
    """The descriptors of every distribution in the venv of the toolchain that recorded `toolchain`, from its
    setup's pip installation reports, or None and why there are none (the version-only entries' note)."""
    from pipelines.core.toolchains import ReportUnreadable, python_toolchain

    if toolchains_dir is None:
        return None, NO_DIGEST
    venv = python_toolchain(toolchains_dir, toolchain)
    if venv is None:
        return None, NO_DIGEST if not toolchain.keys() & {"llmcompressor", "llama.cpp"} else (
            "recorded by version only: this checkout's toolchain pins are not the ones the build recorded, so its "
            "toolchain's installation report does not describe the venv that ran"
        )
    # the statement is published: it names the toolchain's directory, not where this machine keeps it (the log does)
    again = (
        f"to record one, set the venv up again: remove .complete, .stages/venv and .stages/check from the toolchain "
        f"directory {venv.prefix.name}, then run `bash toolchains/{venv.script}`"
    )
    here = f"`{venv.setup_command}`"
    try:
        found = venv.installed()
    except ReportUnreadable as err:
        # the error's hint is the command to run here; registration goes on, recording the venv by version only
        log.warning("%s: the provenance records the %s by version only; to record it again, %s", err.message,
                    venv.label, err.hint)
        return None, f"recorded by version only: pip's installation report of the {venv.label} is unreadable " \
            f"({err.cause}); {again}"
    if found is None:
        log.info("the %s was set up without pip's installation report: the provenance records it by version only; "
                 "to record its wheels by sha256 run %s", venv.label, here)
        return None, (
            f"recorded by version only: the {venv.label} was set up without pip's installation report, so the wheels "
            f"it installed are not known by digest; {again}"
        )
    off = venv.disagreements(found)
    if off:
        log.warning("pip's installation report of the %s does not show the versions the build recorded (%s): the "
                    "provenance records it by version only; run %s", venv.label, ", ".join(off), here)
        return None, (
            f"recorded by version only: pip's installation report of the {venv.label} does not show the versions the "
            f"build recorded: {', '.join(off)}; {again}"
        )
    return [_descriptor(i, venv.label) for i in found], NO_DIGEST


def _descriptor(i: Installed, label: str) -> dict[str, Any]:
    """An installed distribution as an in-toto ResourceDescriptor: its download URL (a package URL naming the file,
    for one taken from a local file or folder, which no verifier can fetch) and the sha256 pip downloaded."""
    from pipelines.core.toolchains import normalized_name

    # a package URL percent-encodes its version ("2.13.0+cpu" is 2.13.0%2Bcpu); the file name comes encoded in the URL
    purl = f"pkg:pypi/{normalized_name(i.name)}@{quote(i.version, safe='')}"
    local = not i.url.startswith(("https://", "http://"))
    annotations = {"version": i.version, "toolchain": label}
    if i.sha256 is None:
        # a local folder is named by its last part only: the statement is published, this machine's paths are not
        where = f"the local folder {i.url.rstrip('/').rsplit('/', 1)[-1]}" if local else i.url
        annotations["source"] = f"installed from {where}, not from an archive: pip records no digest of it"
        return {"name": f"toolchain:{i.name}", "uri": purl, "annotations": annotations}
    annotations["source"] = "pip's installation report written when the toolchain's venv was set up"
    file_name = i.url.rsplit("/", 1)[-1]
    return {
        "name": f"toolchain:{i.name}",
        "uri": f"{purl}?file_name={file_name}" if local else i.url,
        "digest": {"sha256": i.sha256},
        "annotations": annotations,
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
    from pipelines.store.dvcrepo import read_remote_files

    raw = read_remote_files(settings, manifest.dvc.md5, [PROVENANCE]).get(PROVENANCE)
    return json.loads(raw) if raw else None


def statement_time(when: datetime) -> str:
    """A time as a statement writes it (finishedOn, created_at, reproducedOn): ISO 8601 in UTC, `Z`."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def read_time(text: str) -> datetime:
    """A statement's time (ISO 8601, `Z` read as UTC).

    Raises:
        ValueError: it is not one.
    """
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def signed_at(stmt: dict[str, Any]) -> datetime:
    """When registration signed it (runDetails.metadata.finishedOn)."""
    return read_time(stmt["predicate"]["runDetails"]["metadata"]["finishedOn"])


def bound_created_at(stmt: dict[str, Any] | None) -> datetime | None:
    """The `created_at` the statement binds the manifest to (its `finishedOn`); None for no statement, or one signed
    before created_at was bound (legacy_created_at)."""
    if stmt is None:
        return None
    fields = next((b for b in stmt["predicate"]["runDetails"]["byproducts"] if b.get("name") == MANIFEST_BYPRODUCT),
                  None)
    if fields is None or "created_at" not in (fields.get("annotations") or {}):
        return None
    return signed_at(stmt)


def legacy_created_at(stmt: dict[str, Any]) -> bool:
    """Whether `stmt` was signed before the manifest's created_at was bound (its manifest fields, or the statement's
    `manifest` byproduct altogether, lack it): such a manifest's created_at is the registering machine's word, and
    is read as it is (verification says so in a warning) rather than refused, so that older registrations stay
    pullable."""
    try:
        return bound_created_at(stmt) is None
    except (KeyError, TypeError, AttributeError, ValueError):
        return False  # not a statement modelmint wrote: disagreements says so


def disagreements(stmt: dict[str, Any], manifest: Manifest, outputs: dict[str, str]) -> list[str]:
    """Where the signed provenance and the manifest disagree, each as 'FIELD: the manifest records X, the signed
    provenance Y', both values in full (within a field that is an object, the differing member is named).

    `outputs` is what the signature covers (path → sha256, without the signature itself): the provenance's
    subjects must be those files but the provenance. A provenance with the `manifest` byproduct binds every field of
    the manifest but UNBOUND; an older one, the fields checked one by one below."""
    problems: list[str] = []
    checked: list[str] = []

    def differ(what: str, in_manifest: Any, in_provenance: Any, *, skip: tuple[str, ...] = ()) -> None:
        checked.append(what)
        for where, mine, theirs in _differences(in_manifest, in_provenance):
            full = f"{what}.{where}" if where and not where.startswith("[") else what + where
            if any(full == s or full.startswith((s + ".", s + "[")) for s in skip):
                continue  # already said, by the field-by-field checks
            inner = f"{where} = " if where else ""
            problems.append(
                f"{what}: the manifest records {inner}{_shown(mine)}, the signed provenance "
                f"{inner}{_shown(theirs)}"
            )

    try:
        pred = stmt["predicate"]
        build, run = pred["buildDefinition"], pred["runDetails"]
        source = next(d for d in build["resolvedDependencies"] if d.get("name") == "source")
        validation = next(b for b in run["byproducts"] if b.get("name") == "validation")["annotations"]
        fields = next((b for b in run["byproducts"] if b.get("name") == MANIFEST_BYPRODUCT), None)
        subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    except (KeyError, TypeError, StopIteration, AttributeError) as err:
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
    if fields is not None:
        held = fields.get("annotations")
        if not isinstance(held, dict) or canonical_sha256(held) != (fields.get("digest") or {}).get("sha256"):
            problems.append("the provenance's manifest fields do not hash to the digest it records")
        else:
            mine, said = bound(manifest), tuple(checked)
            for key in sorted(held):  # a field the statement does not hold was not known when it was signed
                differ(key, mine.get(key, "nothing"), held.get(key, "nothing"), skip=said)
            finished = run.get("metadata", {}).get("finishedOn")
            if "created_at" in held and _instant(held["created_at"]) != _instant(finished):
                # both are the signer's, in one statement: a created_at apart from finishedOn is not the signed time
                problems.append(
                    f"created_at: the signed provenance's manifest fields record {_shown(held['created_at'])}, its "
                    f"finishedOn {_shown(finished)}"
                )
    expected = {p: d for p, d in outputs.items() if p != PROVENANCE}
    for p in sorted(set(expected) | set(subjects)):
        differ(f"output {p}", expected.get(p, "no such file"), subjects.get(p, "no such file"))
    return problems


def _instant(value: Any) -> datetime | None:
    """An ISO 8601 time as a datetime (`Z` read as UTC); None when it is not one."""
    try:
        return read_time(str(value))
    except ValueError:
        return None


def _differences(mine: Any, theirs: Any, where: str = "") -> list[tuple[str, Any, Any]]:
    """The members where `mine` and `theirs` differ: (dotted path below the field, value, value); objects are
    followed member by member, lists of one length item by item; anything else is one difference."""
    if mine == theirs:
        return []
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return [
            d
            for k in sorted(set(mine) | set(theirs))
            for d in _differences(mine.get(k, "nothing"), theirs.get(k, "nothing"), f"{where}.{k}" if where else k)
        ]
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        return [d for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) for d in _differences(a, b, f"{where}[{i}]")]
    return [(where, mine, theirs)]


def _shown(value: Any) -> str:
    """A value as a message shows it: in full (a string as it is, anything else as JSON)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
