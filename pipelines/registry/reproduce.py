"""Reproduced-by attestations: a second builder rebuilt an artifact from its provenance and got the same bytes.

An attestation is a DSSE envelope (in-toto's, through securesystemslib) holding an in-toto statement whose subjects
are the registered files (all but the signature and the provenance) and whose predicate names the artifact, the
provenance it was rebuilt from (by sha256) and when. It is signed with the reproducing builder's key and kept in git
beside the manifest, registry/attestations/NAME/TAG/reproduced-<keyid16>.json: adding one changes nothing of the
artifact, its DVC record or its first signature.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipelines import __version__
from pipelines.core.errors import RegistryError, SignatureRefused
from pipelines.core.fsutil import HashCache, hash_cache, write_text_atomic
from pipelines.core.settings import Settings
from pipelines.registry import provenance
from pipelines.registry.manifest import Manifest
from pipelines.registry.signing import SIGNATURE, SigningKey
from pipelines.registry.trust import TrustPolicy

if TYPE_CHECKING:
    from pipelines.registry.register import Candidate

PREDICATE_TYPE: Final = "urn:modelmint:reproduced:v1"
PAYLOAD_TYPE: Final = "application/vnd.in-toto+json"
NOT_COMPARED: Final = (SIGNATURE, provenance.PROVENANCE)
"""What a rebuild does not reproduce byte for byte: the signature (ECDSA signatures differ on every signing) and the
provenance (its signing time)."""


class ReproductionDiffers(RegistryError):
    """A rebuild whose files are not the registered bytes: no attestation is written."""

    def __init__(self, ref: str, file: str, detail: str) -> None:
        super().__init__(
            f"{ref}: the rebuild differs from the registered artifact, first at {file} ({detail}); no attestation "
            "was written",
            hint="compare the toolchain pins and the source commit with `modelmint show NAME:TAG --provenance`; "
            "the rebuild is kept under MODELMINT_WORK_DIR/reproduce/ for a look",
        )
        self.ref = ref
        self.file = file


@dataclass(frozen=True)
class Attestation:
    path: Path
    keyid: str
    reproduced_on: datetime
    signer: str | None
    """The trust policy's name of the key that signed it (None: a key the policy does not name)."""
    matches: bool
    """Whether its subjects are the manifest's files (an attestation of an earlier registration does not)."""


def attestations_dir(settings: Settings, name: str, tag: str) -> Path:
    return settings.repo_dir / "registry" / "attestations" / name / tag


def compare(manifest: Manifest, rebuilt: Path, hashes: HashCache) -> None:
    """Check that `rebuilt` (an artifact directory placed from a rebuild) holds the registered files' bytes.

    Raises:
        ReproductionDiffers: naming the first file (in path order) that differs, is missing or is extra.
    """
    expected = {f.path: f.sha256 for f in manifest.files if f.path not in NOT_COMPARED}
    here = {
        p.relative_to(rebuilt).as_posix(): p
        for p in rebuilt.rglob("*")
        if p.is_file() and p.relative_to(rebuilt).as_posix() not in NOT_COMPARED
    }
    for rel in sorted(set(expected) | set(here)):
        if rel not in here:
            raise ReproductionDiffers(manifest.ref, rel, "the rebuild has no such file")
        if rel not in expected:
            raise ReproductionDiffers(manifest.ref, rel, "the registered artifact has no such file")
        actual = hashes.sha256(here[rel])
        if actual != expected[rel]:
            raise ReproductionDiffers(manifest.ref, rel, f"sha256 {actual}, registered {expected[rel]}")


def attest(
    settings: Settings, manifest: Manifest, rebuilt: Path, key: SigningKey, *, now: datetime | None = None
) -> Path:
    """Compare `rebuilt` with the registered artifact and, when every byte matches, write the attestation signed
    with `key` (a rerun with the same key replaces its own attestation).

    Raises:
        ReproductionDiffers: a file differs (nothing written).
        SigningKeyError: the key cannot sign.
    """
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    compare(manifest, rebuilt, hash_cache(settings))
    private = serialization.load_pem_private_key(key.key.read_bytes(), password=None)
    signer = CryptoSigner(private)
    prov = next((f.sha256 for f in manifest.files if f.path == provenance.PROVENANCE), None)
    when = (now or datetime.now(UTC)).replace(microsecond=0)
    stmt = {
        "_type": provenance.STATEMENT_TYPE,
        "subject": [
            {"name": f.path, "digest": {"sha256": f.sha256}}
            for f in sorted(manifest.files, key=lambda f: f.path)
            if f.path not in NOT_COMPARED
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "artifact": manifest.ref,
            "key": manifest.key,
            "provenance": {"sha256": prov} if prov else None,
            "reproducedBy": {
                "keyid": signer.public_key.keyid,
                "builder": provenance.BUILDER_ID,
                "modelmint": __version__,
            },
            "reproducedOn": when.isoformat().replace("+00:00", "Z"),
        },
    }
    envelope = Envelope(
        payload=json.dumps(stmt, sort_keys=True).encode(), payload_type=PAYLOAD_TYPE, signatures={}
    )
    envelope.sign(signer)
    path = (
        attestations_dir(settings, manifest.name, manifest.tag)
        / f"reproduced-{signer.public_key.keyid[:16]}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(envelope.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def attestations(settings: Settings, manifest: Manifest, policy: TrustPolicy | None) -> list[Attestation]:
    """The reproduced-by attestations of `manifest`, each checked: its DSSE signature by a key of the trust
    policy's rule for the model (else `signer` None), and whether its subjects are the manifest's files.

    Raises:
        SignatureRefused: an attestation file that is not a DSSE envelope of a reproduced-by statement.
    """
    out = []
    for path in sorted(attestations_dir(settings, manifest.name, manifest.tag).glob("reproduced-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            stmt = json.loads(base64.b64decode(data["payload"]))
            keyid = str(stmt["predicate"]["reproducedBy"]["keyid"])
            when = datetime.fromisoformat(stmt["predicate"]["reproducedOn"].replace("Z", "+00:00"))
            subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
        except (ValueError, KeyError, TypeError) as err:
            raise SignatureRefused(
                manifest.ref, f"{path} is not a reproduced-by attestation ({err})", file=str(path)
            ) from None
        expected = {f.path: f.sha256 for f in manifest.files if f.path not in NOT_COMPARED}
        matches = subjects == expected and stmt.get("predicateType") == PREDICATE_TYPE
        out.append(Attestation(path, keyid, when, _signer_of(data, manifest, policy), matches))
    return out


def _signer_of(data: dict[str, Any], manifest: Manifest, policy: TrustPolicy | None) -> str | None:
    """The policy's name of the key whose signature on the envelope verifies (public keys only)."""
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    rule = policy.rule_for(manifest.name) if policy is not None else None
    if rule is None:
        return None
    envelope = Envelope.from_dict(data)
    for s in rule.signers:
        if s.key.public_key is None:
            continue
        key = SSlibKey.from_crypto(serialization.load_pem_public_key(s.path.read_bytes()))
        try:
            envelope.verify([key], 1)
        except Exception:  # securesystemslib's VerificationError and key errors alike: not this key
            continue
        return s.name
    return None


def rebuild_and_attest(
    settings: Settings, ref: str, key: SigningKey, *, progress: Callable[[str], None] = lambda _m: None
) -> Path:
    """Rebuild registered `ref` in this checkout from its provenance (the catalog entry it records, at the source
    commit the manifest names), place it as registration would under MODELMINT_WORK_DIR/reproduce/artifacts/NAME/TAG
    (kept there for a look), and attest it
    when every byte matches.

    Raises:
        NotRegistered, ManifestInvalid: no usable manifest.
        RegistryError: no provenance to rebuild from (an unsigned artifact), or the rebuild failed its gate.
        ReproductionDiffers: the rebuild's bytes differ (naming the first file); no attestation is written.
        everything the format's build raises.
    """
    import shutil

    from pipelines.registry.formats import format_of
    from pipelines.registry.manifest import find_manifest
    from pipelines.source.catalog import CatalogEntry

    manifest = find_manifest(settings, ref)
    stmt = provenance.registered(settings, manifest)
    if stmt is None:
        raise RegistryError(
            f"{manifest.ref} has no provenance to rebuild from (it was registered unsigned)",
            hint="register it again with MODELMINT_SIGNING_KEY set",
        )
    entry = CatalogEntry.model_validate(
        stmt["predicate"]["buildDefinition"]["externalParameters"]["catalog_entry"]
    )
    fmt = format_of(manifest.tag)
    result = fmt.build_here(
        entry, settings, variants=[manifest.tag], revision=manifest.source.revision, progress=progress
    )
    if manifest.tag not in result.passed or result.plan is None:
        raise RegistryError(
            f"{manifest.ref}: the rebuild did not pass its gate here, so it reproduces nothing",
            hint=f"see the build's report under {settings.work_dir}",
        )
    c = fmt.candidate(result.plan, result.variants[manifest.tag])
    into = settings.work_dir / "reproduce"
    shutil.rmtree(into / manifest.dvc.path, ignore_errors=True)  # an earlier reproduction's placement
    return attest(settings, manifest, place_rebuild(settings, c, into), key)


def place_rebuild(settings: Settings, c: Candidate, into: Path) -> Path:
    """Place rebuilt candidate `c` as registration would (its files, Modelfile or vllm.yaml, card, serving plans) under
    `into` instead of the repository, unsigned and unrecorded: what `compare` reads."""
    from dataclasses import replace

    from pipelines.registry.register import artifact_dir, place

    scratch = replace(settings, repo_dir=into, signing_key=None, signing_cert=None)
    place(scratch, c)
    return artifact_dir(scratch, c.entry.name, c.tag)
