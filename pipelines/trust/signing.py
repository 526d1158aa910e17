"""Signing at registration and verification at pull, with model-signing (OpenSSF) over the whole artifact directory.

Registration writes the provenance (pipelines/trust/provenance.py) into the artifact directory, then signs every
file of it (weights, Modelfile or vllm.yaml, card, serving files, the provenance) with model-signing's key signer,
or its certificate signer when MODELMINT_SIGNING_CERT is set: `modelmint.sig`, a Sigstore bundle whose DSSE payload
lists each file's sha256. Both are files of the directory: DVC tracks them, the manifest lists them, the OCI image
carries them. The manifest itself is bound through the provenance (its source, recipe, toolchain, key, validation
and files): verification refuses a manifest that disagrees with what was signed.

With MODELMINT_TSA_URL set, the signature is timestamped by that RFC 3161 Time-Stamp Authority, the reply kept in
the bundle where sigstore's bundle format keeps it (verificationMaterial.timestampVerificationData.rfc3161Timestamps):
verification then judges the key's retirement and the certificate's validity at the authority's time, and a
signature without a trusted timestamp at the time it is verified. A revoked key's signatures are refused from its
revocation day on, timestamped or not.

Verification (verify_directory) is offline: a public key or the root certificates named in registry/trust.yaml.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipelines.core import timestamps
from pipelines.core.errors import ModelmintError, SignatureRefused, SigningKeyError, TimestampInvalid
from pipelines.core.fsutil import HashCache, hash_cache, write_text_atomic
from pipelines.core.settings import Settings
from pipelines.trust import provenance
from pipelines.trust.policy import Rule, Signer, TrustPolicy

if TYPE_CHECKING:
    from pipelines.store.manifest import Manifest

log = logging.getLogger(__name__)

SIGNATURE: Final = "modelmint.sig"
UNSIGNED_PARTS: Final = (SIGNATURE,)
"""Files of an artifact directory the signature does not cover (itself)."""
REPRODUCED_PREDICATE: Final = "urn:modelmint:reproduced:v1"
"""The predicate type of a reproduced-by attestation (pipelines/registry/reproduce.py writes them)."""


@dataclass(frozen=True)
class SigningKey:
    """The configured key (and certificate chain): paths only; the key's bytes are read when signing."""

    key: Path
    cert: Path | None = None
    tsa: str | None = None
    """The RFC 3161 Time-Stamp Authority (MODELMINT_TSA_URL) that timestamps the signature; None: no timestamp."""


def configured(settings: Settings) -> SigningKey | None:
    return (
        SigningKey(settings.signing_key, settings.signing_cert, settings.tsa_url)
        if settings.signing_key is not None
        else None
    )


def preflight(settings: Settings, *, now: datetime | None = None) -> SigningKey | None:
    """Check the configured signing key before any build work: readable, an EC private key, its certificate
    (when one is set) matching it and valid now, and the Time-Stamp Authority's URL (when one is set) one. None when
    no key is configured (artifacts are registered unsigned).

    Raises:
        SigningKeyError: the key or certificate is missing, unreadable, of another kind, mismatched or expired; a
            MODELMINT_TSA_URL that is not an http(s) URL, or set without a key.
    """
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    sk = configured(settings)
    if sk is None:
        if settings.signing_cert is not None:
            raise SigningKeyError(
                "MODELMINT_SIGNING_CERT is set but MODELMINT_SIGNING_KEY is not",
                hint="set MODELMINT_SIGNING_KEY to the certificate's private key (PEM)",
            )
        if settings.tsa_url is not None:
            raise SigningKeyError(
                "MODELMINT_TSA_URL is set but MODELMINT_SIGNING_KEY is not: there is no signature to timestamp",
                hint="set MODELMINT_SIGNING_KEY to your PEM EC private key, or unset MODELMINT_TSA_URL",
            )
        return None
    if sk.tsa is not None:
        _check_tsa_url(sk.tsa)
    hint = (
        "set MODELMINT_SIGNING_KEY to a readable PEM EC private key (e.g. `openssl ecparam -name prime256v1 "
        "-genkey -noout -out signing.pem`), or unset it to register unsigned"
    )
    try:
        data = sk.key.read_bytes()
    except OSError as err:
        raise SigningKeyError(
            f"MODELMINT_SIGNING_KEY {sk.key} cannot be read ({err.strerror or err}): nothing was built",
            hint=hint,
        ) from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise SigningKeyError(
            f"MODELMINT_SIGNING_KEY {sk.key} is not an unencrypted PEM private key ({err}): "
            "nothing was built",
            hint=hint,
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise SigningKeyError(
            f"MODELMINT_SIGNING_KEY {sk.key} is a {type(key).__name__}, not an elliptic-curve "
            "key (model-signing signs with EC keys): nothing was built",
            hint=hint,
        )
    if sk.cert is None:
        return sk
    try:
        chain = x509.load_pem_x509_certificates(sk.cert.read_bytes())
    except (OSError, ValueError) as err:
        raise SigningKeyError(
            f"MODELMINT_SIGNING_CERT {sk.cert} is not a readable PEM certificate ({err}): nothing was built",
            hint="set it to the key's certificate, then its chain, in one PEM file",
        ) from None
    leaf = chain[0]
    if len(chain) < 2:
        raise SigningKeyError(
            f"MODELMINT_SIGNING_CERT {sk.cert} holds only the signing certificate "
            f"({leaf.subject.rfc4514_string()}): a signature carries the chain up to the root, and its issuer's "
            "certificate is not there: nothing was built",
            hint="append the intermediate certificate(s) after the signing certificate in that file (`cat leaf.pem "
            "intermediate.pem > chain.pem`; a certificate issued by the root directly: append the root)",
        )
    for child, parent in itertools.pairwise(chain):
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature):
            raise SigningKeyError(
                f"MODELMINT_SIGNING_CERT {sk.cert}: {child.subject.rfc4514_string()} is not issued by the "
                f"certificate after it ({parent.subject.rfc4514_string()}): nothing was built",
                hint="order the file as the signing certificate, then its issuer, then that one's issuer",
            ) from None
    if leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise SigningKeyError(
            f"MODELMINT_SIGNING_CERT {sk.cert} certifies another key than MODELMINT_SIGNING_KEY: "
            "nothing was built",
            hint="put the signing key's own certificate first in that file",
        )
    at = now or datetime.now(UTC)
    if not leaf.not_valid_before_utc <= at <= leaf.not_valid_after_utc:
        raise SigningKeyError(
            f"MODELMINT_SIGNING_CERT {sk.cert} is valid from {leaf.not_valid_before_utc:%Y-%m-%d} to "
            f"{leaf.not_valid_after_utc:%Y-%m-%d}, not now ({at:%Y-%m-%d}): nothing was built",
            hint="renew the certificate (or unset MODELMINT_SIGNING_CERT to sign with the bare key)",
        )
    return sk


def _check_tsa_url(url: str) -> None:
    """An http(s) URL with a host: what a Time-Stamp Authority answers at (its reachability is asked when signing).

    Raises:
        SigningKeyError: anything else, before any build work.
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise SigningKeyError(
            f"MODELMINT_TSA_URL {url!r} is not an http(s) URL of a Time-Stamp Authority: nothing was built",
            hint="set MODELMINT_TSA_URL to the authority's RFC 3161 endpoint (e.g. https://tsa.example.com/tsr), "
            "or unset it to sign without a timestamp",
        )


def seal(settings: Settings, c: provenance.Built, directory: Path, validation: dict[str, Any]) -> None:
    """Write the provenance of `c` into its (not yet renamed) artifact directory and sign every file of it.

    No-op without a configured key. `validation` is the manifest's validation block, as it will be written.

    Raises:
        SigningKeyError: the key cannot sign (preflight's checks, again: it may have changed since the build began).
        TimestampUnavailable: MODELMINT_TSA_URL is set and its authority gave no timestamp.
        TimestampInvalid: the authority's time and this machine's disagree (verification would refuse the
            signature: _check_signed_time).
    """
    sk = preflight(settings)
    if sk is None:
        log.info("%s is registered unsigned: MODELMINT_SIGNING_KEY is not set", c.ref)
        return
    hashes = hash_cache(settings)
    outputs = {
        p.relative_to(directory).as_posix(): hashes.sha256(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
    now = datetime.now(UTC).replace(microsecond=0)
    stmt = provenance.statement(c, validation, outputs, now, hashes,
                                directory=directory, signer=sk, toolchains_dir=settings.toolchains_dir)
    write_text_atomic(directory / provenance.PROVENANCE, json.dumps(stmt, indent=2, sort_keys=True) + "\n")
    sign_directory(sk, directory, name=c.ref, hashes=hashes)
    stamped = _stamp_time(directory / SIGNATURE)
    if stamped is not None and not _in_time(now, stamped):
        # verification would refuse it (_check_signed_time): nothing is placed
        raise TimestampInvalid(
            f"{c.ref}: this machine's clock says it signed at {provenance.statement_time(now)}, and the Time-Stamp "
            f"Authority {sk.tsa} timestamped the signature at {provenance.statement_time(stamped)}: "
            f"{_apart(now, stamped)}; nothing was registered",
            hint="set this machine's clock (NTP) or fix the authority's, then rerun the same command",
        )


def sign_directory(
    sk: SigningKey, directory: Path, *, name: str | None = None, hashes: HashCache | None = None
) -> None:
    """model-signing over every file of `directory` but the signature itself, written to `directory/SIGNATURE`.

    `name` is the statement's subject name (NAME:TAG); model-signing would name the directory, which at
    registration is the temporary `TAG.partial-PID`. With `sk.tsa`, the signature is timestamped (_add_timestamp).
    `hashes`: each file's sha256 is taken from this hash cache (read only where it does not know the file) rather
    than by model-signing reading every byte again; the signature is the same, since model-signing's file
    serialization lists each file's plain sha256 (model-signing's own CLI verifies it by hashing the files).

    Raises:
        TimestampUnavailable: `sk.tsa` gave no timestamp (nothing is written).
    """
    from model_signing import signing

    config = signing.Config()
    tmp = directory / f".{SIGNATURE}.partial"
    with tempfile.TemporaryDirectory(prefix="modelmint-sign-") as scratch:
        if sk.cert is None:
            config.use_elliptic_key_signer(private_key=sk.key)
        else:
            leaf, chain = _split_chain(sk.cert, Path(scratch))
            config.use_certificate_signer(
                private_key=sk.key, signing_certificate=leaf, certificate_chain=chain
            )
        config.set_hashing_config(_named(name, hashes).set_ignored_paths(paths=list(UNSIGNED_PARTS)))
        try:
            config.sign(directory, tmp)
            if sk.tsa is not None:
                _add_timestamp(tmp, sk.tsa)
            tmp.replace(directory / SIGNATURE)
        finally:
            tmp.unlink(missing_ok=True)


def _stamp_time(sig: Path) -> datetime | None:
    """The time the (first) RFC 3161 timestamp in the bundle `sig` states, unverified; None: it has none."""
    bundle = json.loads(sig.read_text(encoding="utf-8"))
    found = ((bundle.get("verificationMaterial") or {}).get("timestampVerificationData") or {}).get(
        "rfc3161Timestamps") or []
    if not found:
        return None
    return timestamps.time_of(base64.b64decode(found[0]["signedTimestamp"]))


def _signature_bytes(bundle: dict[str, Any]) -> bytes:
    """The bytes of the bundle's (DSSE) signature: what an RFC 3161 timestamp is over."""
    return base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"], validate=True)


def _add_timestamp(sig: Path, url: str) -> None:
    """A timestamp over the signature in the bundle `sig`, from the authority at `url`, added to it as sigstore's
    bundle format carries one (verificationMaterial.timestampVerificationData.rfc3161Timestamps[].signedTimestamp:
    the DER TimeStampResp, base64)."""
    bundle = json.loads(sig.read_text(encoding="utf-8"))
    reply = timestamps.request(url, _signature_bytes(bundle))
    material = bundle.setdefault("verificationMaterial", {})
    material.setdefault("timestampVerificationData", {})["rfc3161Timestamps"] = [
        {"signedTimestamp": base64.b64encode(reply).decode("ascii")}
    ]
    sig.write_text(json.dumps(bundle), encoding="utf-8")


def _named(name: str | None, hashes: HashCache | None = None) -> Any:
    """model-signing's hashing configuration whose manifest names the model `name` (the in-toto subject name);
    model-signing takes the directory's name, and offers no setting for it. With `hashes`, each file's digest is
    its sha256 from the hash cache: what model-signing's file serialization (sha256, the default) computes by
    reading it, under the same digest name, so the manifest and its signature come out the same."""
    from model_signing import hashing

    class Named(hashing.Config):
        def __init__(self) -> None:  # typed, so that Named() is a typed call; model-signing's own __init__ is not
            hashing.Config.__init__(self)
            if hashes is not None:
                self._serializer = _cached_serializer(hashes)

        def hash(self, model_path: Any, *, files_to_hash: Any = None) -> Any:
            made = super().hash(model_path, files_to_hash=files_to_hash)
            if name is not None:
                made._name = name  # informative only: verification compares the files, not the name
            return made

    return Named()


def _cached_serializer(hashes: HashCache) -> Any:
    """model-signing's file serializer (one sha256 per file, its default) whose file hasher asks `hashes`."""
    from model_signing._hashing import hashing as ms_hashing
    from model_signing._hashing import io as ms_io
    from model_signing._serialization import file as ms_file

    class Cached(ms_io.FileHasher):
        def __init__(self, path: Path) -> None:
            self._path = path

        @property
        def digest_name(self) -> str:
            return "sha256"  # model-signing's SHA256 engine's name: the manifest records it, the verifier checks it

        def compute(self) -> Any:
            return ms_hashing.Digest("sha256", bytes.fromhex(hashes.sha256(self._path)))

        @property
        def digest_size(self) -> int:
            return 32

    return ms_file.Serializer(Cached)


def _split_chain(cert: Path, scratch: Path) -> tuple[Path, list[Path]]:
    """The leaf and the rest of a PEM chain file as model-signing's certificate signer takes them (one file each)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    certs = x509.load_pem_x509_certificates(cert.read_bytes())
    out = []
    for i, c in enumerate(certs):
        p = scratch / f".modelmint-cert-{i}.pem"
        p.write_bytes(c.public_bytes(serialization.Encoding.PEM))
        out.append(p)
    return out[0], out[1:]


# ---------------------------------------------------------------- verification


@dataclass(frozen=True)
class Verified:
    """What verification found: who signed (None: unsigned, allowed), when (as the provenance claims it, and as a
    trusted Time-Stamp Authority says it), and the provenance."""

    ref: str
    signer: str | None
    signed_at: datetime | None
    statement: dict[str, Any] | None
    warnings: tuple[str, ...] = ()
    timestamped_at: datetime | None = None
    """The time of the signature's RFC 3161 timestamp, checked; None: it has none."""
    timestamp_authority: str | None = None
    """The name (timestamp_authorities in the policy) of the authority that timestamped it."""


def payload_files(sig: Path) -> dict[str, str]:
    """Each file's sha256 as the signature's DSSE payload lists it (read it only after the signature checked)."""
    bundle = json.loads(sig.read_text(encoding="utf-8"))
    stmt = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    return {r["name"]: r["digest"] for r in stmt["predicate"]["resources"]}


def verify_directory(
    directory: Path,
    manifest: Manifest,
    policy: TrustPolicy | None,
    *,
    shown: str,
    allow_unsigned: bool = False,
    files_here: bool = True,
    require_signature: bool = False,
    now: datetime | None = None,
    reproductions: bool = True,
) -> Verified:
    """Check the artifact in `directory` (as fetched, before it replaces anything) against its signature, its
    provenance and the trust policy. `shown` names the manifest file in messages. `require_signature` (CI) refuses
    an unsigned artifact whatever the policy or `allow_unsigned` say.

    The key's retirement and the signing certificate's validity are judged at the time of the signature's RFC 3161
    timestamp when it has one (which must hold: over the signature, by an authority of the policy), else at `now`
    (the time of verification): the provenance's own time is the signer's claim, and must agree with the
    timestamp's (_check_signed_time). A key revoked by `now` refuses every signature, timestamped or not.

    A rule with `reproductions: N` also needs N reproduced-by attestations of these files (the policy's
    `attestations` directory) that verify with N keys of the rule other than the signer's, one key each;
    `reproductions=False` skips that (the check of the provenance a reproduction rebuilds from).

    Raises:
        SignatureRefused: signed but no trust policy to say who may sign it (fail closed), unsigned (and not
            allowed, or a signature required), signed by a key the policy does not accept for this model or
            retired before it signed, a file that differs from what was signed (named), a manifest or provenance
            that disagrees with the signed one, or a certificate that is expired, of another identity or another CA;
            a timestamp over other bytes or by an authority the policy does not name, or one the provenance's time
            does not agree with; a key revoked by now (whatever the timestamp's time); fewer reproductions by other
            keys than the rule asks for (naming those found and their keys).
    """
    ref = manifest.ref
    listed = {f.path for f in manifest.files}
    is_signed = SIGNATURE in listed or (directory / SIGNATURE).is_file()
    if policy is None:
        if is_signed:
            raise SignatureRefused(
                ref,
                "it is signed, but there is no trust policy to say whose signature counts (registry/trust.yaml, "
                "or the file MODELMINT_TRUST names): a signature by any key would pass",
                file=SIGNATURE,
                hint="add registry/trust.yaml naming the signer's public key (docs/trust.md), or set "
                "MODELMINT_TRUST to the team's policy file",
            )
        if require_signature:
            raise SignatureRefused(
                ref,
                f"it is not signed ({SIGNATURE} is missing) and a signature is required",
                file=SIGNATURE,
                hint="register it again with MODELMINT_SIGNING_KEY set",
            )
        log.info("%s: unsigned, and no trust policy (registry/trust.yaml) asks for a signature", ref)
        return Verified(ref, None, None, None, ("unsigned, and no trust policy asks for a signature",))
    rule = policy.rule_for(manifest.name)
    if SIGNATURE not in listed or not (directory / SIGNATURE).is_file():
        if require_signature:
            raise SignatureRefused(
                ref,
                f"it is not signed ({SIGNATURE} is missing) and a signature is required",
                file=SIGNATURE,
                hint="register it again with MODELMINT_SIGNING_KEY set",
            )
        if allow_unsigned or (rule is not None and rule.unsigned == "allow"):
            why = (
                "--allow-unsigned"
                if allow_unsigned
                else f"{policy.path.name} allows it ({rule.pattern if rule else ''})"
            )
            log.warning("%s is not signed: accepted because %s", ref, why)
            return Verified(ref, None, None, None, (f"unsigned, accepted because {why}",))
        raise SignatureRefused(
            ref,
            f"it is not signed ({SIGNATURE} is missing) and {policy.path} refuses unsigned "
            f"artifacts{f' for {rule.pattern}' if rule else ''}",
            file=SIGNATURE,
            hint="register it again with MODELMINT_SIGNING_KEY set, or pass --allow-unsigned "
            "to take it anyway (a warning says so)",
        )
    if rule is None or not rule.signers:
        raise SignatureRefused(
            ref,
            f"{policy.path} names no key for {manifest.name} (add it under models:)",
            hint=f"add a rule for {manifest.name} (or a pattern matching it) to {policy.path}",
        )
    if files_here:
        signer = _check_signature(directory, ref, rule)
    else:
        # Only the signature and the provenance are here (a check of the DVC remote, whose objects were hashed
        # against the manifest): the signature's own check, then the manifest's hashes against its payload.
        signer = _check_signature_only(directory / SIGNATURE, ref, rule)
    stamp = _trusted_timestamp(directory / SIGNATURE, ref, policy)
    today = now or datetime.now(UTC)
    judged = stamp.time if stamp is not None else today
    # A revoked key (lost or compromised) vouches for nothing from its revocation day on: its holder may have
    # signed anything, and a timestamp only shows that a signature existed then, not who made it.
    if signer.key.revoked is not None and max(today, judged).date() >= signer.key.revoked:
        raise SignatureRefused(
            ref,
            f"it is signed by key {signer.name}, which {policy.path} revoked on {signer.key.revoked}: a signature "
            "by a revoked key is refused, whatever date it claims or is timestamped at"
            + (f" ({stamp.authority} timestamped this one on {stamp.time:%Y-%m-%d %H:%M:%S}Z)" if stamp else ""),
            file=SIGNATURE,
            hint="register it again with a current key (and re-sign what that key signed before it was revoked)",
        )
    signed = payload_files(directory / SIGNATURE)
    if not files_here and _sha256(directory / provenance.PROVENANCE) != signed.get(provenance.PROVENANCE):
        raise SignatureRefused(
            ref, f"{provenance.PROVENANCE} differs from what was signed", file=provenance.PROVENANCE
        )
    # The manifest's file list and hashes must be the signed ones (a manifest rewritten to match other bytes).
    for f in manifest.files:
        if f.path == SIGNATURE:
            continue
        if signed.get(f.path) != f.sha256:
            raise SignatureRefused(
                ref,
                f"the manifest {shown} records sha256 {f.sha256} for {f.path}, the signature "
                + (f"{signed[f.path]}" if f.path in signed else "does not list it"),
                file=shown,
                hint=_restore_hint(shown),
            )
    extra = sorted(set(signed) - listed)
    if extra:
        raise SignatureRefused(
            ref,
            f"the manifest {shown} does not list {', '.join(extra)}, which was signed",
            file=shown,
            hint=_restore_hint(shown),
        )
    stmt = provenance.read(directory)
    if stmt is None:
        raise SignatureRefused(
            ref, f"it is signed but has no {provenance.PROVENANCE}", file=provenance.PROVENANCE
        )
    problems = provenance.disagreements(stmt, manifest, signed)
    if problems:
        raise SignatureRefused(
            ref,
            f"the manifest {shown} disagrees with the signed provenance: " + "; ".join(problems),
            file=shown,
            hint=_restore_hint(shown),
        )
    when = provenance.signed_at(stmt)
    warnings: tuple[str, ...] = ()
    if stamp is not None:
        _check_signed_time(ref, when, stamp)
    if provenance.legacy_created_at(stmt):
        warnings = (
            f"its created_at {manifest.created_at.isoformat()} is the registering machine's word, not covered by "
            "its signature (signed before modelmint bound it to the signed time, "
            f"{provenance.statement_time(when)}): register it again to bind it",
        )
    if signer.key.retired_at(judged):
        raise SignatureRefused(
            ref,
            f"{_judged_at(stamp, judged)}, signed by key {signer.name}, which {policy.path} "
            f"retired on {signer.key.retired}: signatures from then on are refused",
            hint="register it again with a current key",
        )
    if signer.key.ca is not None:
        _check_certificate(directory / SIGNATURE, ref, signer, judged, _judged_at(stamp, judged))
    if reproductions and rule.reproductions:
        _check_reproductions(manifest, policy, rule, signer, now or datetime.now(UTC))
    return Verified(
        ref,
        signer.name,
        when,
        stmt,
        warnings,
        timestamped_at=stamp.time if stamp is not None else None,
        timestamp_authority=stamp.authority if stamp is not None else None,
    )


SIGNING_TOLERANCE: Final = timedelta(minutes=10)
"""How long before its RFC 3161 timestamp a signature's statement may say it was signed: registration writes the
time (finishedOn, the manifest's created_at), then hashes the directory's files (mostly from the hash cache), signs,
and asks the authority; this leaves room for that and for a registering clock a few minutes behind the
authority's. A statement timed after its timestamp is refused outright: no signature is timestamped before it is
made."""


def _check_signed_time(ref: str, when: datetime, stamp: timestamps.Stamp) -> None:
    """The time the signed statement records (finishedOn, which the manifest's created_at must be) agrees with the
    signature's trusted timestamp: not after it, and not before it by more than SIGNING_TOLERANCE.

    Raises:
        SignatureRefused: it does not (both times in full, and the tolerance).
    """
    if _in_time(when, stamp.time):
        return
    raise SignatureRefused(
        ref,
        f"its signed provenance says it was signed at {provenance.statement_time(when)} (finishedOn, the manifest's "
        f"created_at), and {stamp.authority} timestamped the signature at {provenance.statement_time(stamp.time)}: "
        f"{_apart(when, stamp.time)}",
        file=provenance.PROVENANCE,
        hint="register it again from a trusted build, on a machine whose clock agrees with the Time-Stamp "
        "Authority's (check NTP)",
    )


def _in_time(when: datetime, stamped: datetime) -> bool:
    """Whether a statement's written time `when` agrees with its signature's timestamp: not after it, and not before
    it by more than SIGNING_TOLERANCE."""
    return stamped - SIGNING_TOLERANCE <= when <= stamped


def _apart(when: datetime, stamped: datetime) -> str:
    """Why a written signing time and its timestamp's time disagree, as a refusal says it."""
    if when > stamped:
        return "the written time is after the timestamp, and no signature is timestamped before it is made"
    return (
        f"the written time is more than {int(SIGNING_TOLERANCE.total_seconds() // 60)} minutes before the timestamp, "
        "and registration asks for the timestamp within minutes of writing it"
    )


def _judged_at(stamp: timestamps.Stamp | None, judged: datetime) -> str:
    """When a signature is judged, as a refusal says it."""
    if stamp is not None:
        return f"it was timestamped on {judged:%Y-%m-%d} by {stamp.authority}"
    return f"it has no trusted timestamp, so it is judged now ({judged:%Y-%m-%d})"


def _trusted_timestamp(sig: Path, ref: str, policy: TrustPolicy) -> timestamps.Stamp | None:
    """The time of the signature's RFC 3161 timestamp(s), each checked against the policy's authorities; None when
    the signature carries none.

    Raises:
        SignatureRefused: a timestamp that does not hold (over other bytes, by an authority the policy does not
            name, or not one), or the policy names no authority to check it against.
    """
    bundle = json.loads(sig.read_text(encoding="utf-8"))
    material = bundle.get("verificationMaterial") or {}
    found = (material.get("timestampVerificationData") or {}).get("rfc3161Timestamps") or []
    if not found:
        return None
    stamps = []
    try:
        signature = _signature_bytes(bundle)
        for entry in found:
            reply = base64.b64decode(entry["signedTimestamp"], validate=True)
            stamps.append(timestamps.check(reply, signature, policy.timestamp_roots()))
    except TimestampInvalid as err:
        problem = err.message
    except (KeyError, IndexError, TypeError, ValueError, binascii.Error):
        problem = "it is not a base64 RFC 3161 reply where the bundle keeps one"
    else:
        return min(stamps, key=lambda s: s.time)
    raise SignatureRefused(
        ref,
        f"its RFC 3161 timestamp does not hold: {problem}",
        file=SIGNATURE,
        hint=f"if the authority is trusted, add its root certificate under timestamp_authorities: in {policy.path} "
        "(docs/trust.md); otherwise register it again (with MODELMINT_TSA_URL naming a trusted authority)",
    )


def verify_image(
    image_manifest: dict[str, Any],
    blob: Callable[[str], Path],
    policy: TrustPolicy | None,
    *,
    image: str,
    allow_unsigned: bool = False,
    require_signature: bool = False,
) -> Verified:
    """verify_directory on a pulled image, then the image itself: the modelmint manifest it carries, each file it
    lists laid out from the layer of the same sha256 (`blob` maps a digest to the downloaded blob's path) in a
    temporary directory and verified; then every layer and the config rebuilt from those signed files (an Ollama
    image's template, system, params, licenses, messages and config from the signed Modelfile and GGUF) and the
    image accepted only when it is exactly that (check_image).

    What `ollama pull` would install is checked here before it is handed over (tests/ollama_pull.py's `check`).

    Raises:
        SignatureRefused: as verify_directory and check_image, or an image that carries no modelmint manifest.
    """
    from pipelines.publish.oci import is_carried_manifest
    from pipelines.store.manifest import Manifest

    layers = image_manifest.get("layers") or []
    carried = [x for x in layers if isinstance(x, dict) and is_carried_manifest(x)]
    if len(carried) != 1:
        raise SignatureRefused(image, "it carries no modelmint manifest: nothing says what was signed")
    manifest = Manifest.model_validate_json(blob(carried[0]["digest"]).read_bytes())
    with tempfile.TemporaryDirectory(prefix="modelmint-verify-") as scratch:
        root = Path(scratch)
        for f in manifest.files:
            out = root / f.path
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                src = blob("sha256:" + f.sha256)
            except KeyError:
                raise SignatureRefused(image, f"it has no layer for {f.path}", file=f.path) from None
            shutil.copyfile(src, out)
        verified = verify_directory(
            root,
            manifest,
            policy,
            shown=f"{image} (its manifest layer)",
            allow_unsigned=allow_unsigned,
            require_signature=require_signature,
        )
        check_image(image_manifest, root, manifest, lambda d: blob(d).read_bytes(), image=image)
    return verified


_LAYER_NAMES: Final = {
    "application/vnd.ollama.image.model": "model (GGUF)",
    "application/vnd.ollama.image.template": "template",
    "application/vnd.ollama.image.system": "system",
    "application/vnd.ollama.image.params": "params",
    "application/vnd.ollama.image.messages": "messages",
    "application/vnd.ollama.image.license": "license",
}


def check_image(
    got: dict[str, Any], directory: Path, manifest: Manifest, read: Callable[[str], bytes], *, image: str
) -> None:
    """The image manifest `got` is exactly the image publish builds from the signed files in `directory` (already
    verified against `manifest`): the same config and the same layers in the same order, nothing more. `read`
    returns a blob's bytes by digest (only the differing ones are read, to show them).

    Raises:
        SignatureRefused: a layer or the config differs (named, both values in full), or a layer is missing or
            added; nothing was pulled.
    """
    from pipelines.publish.oci import MODELMINT_MANIFEST, Blob, is_carried_manifest
    from pipelines.store.formats.base import format_of

    # a descriptor that is not an object (a manifest written by hand) differs like any other, shown as it is
    layers = [x if isinstance(x, dict) else {"descriptor": x} for x in got.get("layers") or []]
    carried = next(x for x in layers if is_carried_manifest(x))
    extra = (Blob.of_bytes(MODELMINT_MANIFEST, read(carried["digest"])),)
    want = format_of(manifest.tag).image(directory, manifest, extra)
    hint = (
        "the image in the registry is not the one `modelmint publish` pushed from the signed files: do not run it; "
        f"publish {manifest.ref} again with --force to put the signed image back, and find who can write to "
        "the registry"
    )
    expected = [("config", want.config), *((f"layer {i + 1}", b) for i, b in enumerate(want.layers))]
    config = got.get("config")
    there = [config if isinstance(config, dict) else {"descriptor": config}, *layers]
    for (where, blob), desc in zip(expected, there, strict=False):
        if desc == blob.descriptor():
            continue
        kind = "config" if where == "config" else _LAYER_NAMES.get(blob.media_type, blob.media_type)
        title = blob.annotations.get("org.opencontainers.image.title")
        named = f"{kind} {where}" + (f" ({title})" if title else "") if where != "config" else "config"
        if where != "config" and desc.get("mediaType") != blob.media_type:
            found = _LAYER_NAMES.get(str(desc.get("mediaType")), str(desc.get("mediaType")))
            named = f"{where}, a {found} layer where the signed files give a {kind} layer,"
        if desc.get("digest") == blob.digest:  # the same bytes, described otherwise (size, type, annotations)
            what, ours, theirs = f"{named} descriptor", json.dumps(desc, sort_keys=True), json.dumps(
                blob.descriptor(), sort_keys=True)
        else:
            what, ours, theirs = named, _shown_blob(read, desc), _shown_expected(blob)
        raise SignatureRefused(
            image,
            f"its {what} differs from the one the signed files give:\n"
            f"  in the image: {ours}\n"
            f"  signed:       {theirs}",
            file=_LAYER_FILE.get(blob.media_type, title),
            hint=hint,
        )
    if len(there) != len(expected):
        more = there[len(expected) :]
        if more:
            shown = "; ".join(
                f"{_LAYER_NAMES.get(str(d.get('mediaType')), d.get('mediaType'))} {_shown_blob(read, d)}"
                for d in more
            )
            problem = f"it has {len(more)} layer(s) the signed files do not give: {shown}"
        else:
            missing = want.layers[len(there) - 1 :]
            problem = "it lacks the layer(s) the signed files give: " + "; ".join(
                f"{_LAYER_NAMES.get(b.media_type, b.media_type)} {_shown_expected(b)}" for b in missing
            )
        raise SignatureRefused(image, problem, hint=hint)
    want_doc = json.loads(want.manifest_bytes())
    if got != want_doc:
        raise SignatureRefused(
            image,
            "its manifest differs from the one the signed files give:\n"
            f"  in the image: {json.dumps(got, sort_keys=True)}\n"
            f"  signed:       {json.dumps(want_doc, sort_keys=True)}",
            hint=hint,
        )


_LAYER_FILE: Final = {
    "application/vnd.ollama.image.model": None,
    "application/vnd.ollama.image.template": "Modelfile",
    "application/vnd.ollama.image.system": "Modelfile",
    "application/vnd.ollama.image.params": "Modelfile",
    "application/vnd.ollama.image.messages": "Modelfile",
    "application/vnd.ollama.image.license": "Modelfile",
    "application/vnd.docker.container.image.v1+json": "Modelfile",
}
"""The signed file a generated layer comes from (for SignatureRefused.file)."""

_SHOWN_MAX: Final = 1 << 16
"""Blobs up to this size are shown in full in a refusal (templates, parameters, configs); larger ones by digest."""


def _shown_blob(read: Callable[[str], bytes], desc: dict[str, Any]) -> str:
    """A layer of the image as a refusal shows it: its text in full (JSON-quoted), else its digest and size."""
    digest, size = str(desc.get("digest")), desc.get("size")
    if isinstance(size, int) and size <= _SHOWN_MAX:
        try:
            return json.dumps(read(digest).decode("utf-8"), ensure_ascii=False) + f" ({digest})"
        except (UnicodeDecodeError, OSError, LookupError, ModelmintError):
            pass  # not text, or not readable: its digest says which blob it is
    return f"{digest} ({size} bytes)"


def _shown_expected(blob: Any) -> str:
    if blob.data is not None and len(blob.data) <= _SHOWN_MAX:
        try:
            return json.dumps(blob.data.decode("utf-8"), ensure_ascii=False) + f" ({blob.digest})"
        except UnicodeDecodeError:
            pass
    return f"{blob.digest} ({blob.size} bytes)"


def _restore_hint(shown: str) -> str:
    return (
        f"the manifest was edited after signing: restore it (`git checkout -- {shown}`; `git log -p -- {shown}` "
        "shows who changed what), or register the artifact again"
    )


def _check_signature(directory: Path, ref: str, rule: Rule) -> Signer:
    """The first signer of `rule` whose key (or CA) verifies the signature over `directory`.

    Raises:
        SignatureRefused: none does, or a file differs from what was signed (named).
    """
    from model_signing import verifying

    tried = []
    for signer in rule.signers:
        config = verifying.Config()
        if signer.key.ca is None:
            config.use_elliptic_key_verifier(public_key=signer.path)
        else:
            config.use_certificate_verifier(certificate_chain=[signer.path])
        try:
            config.verify(directory, directory / SIGNATURE)
        except ValueError as err:
            if str(err).startswith("Signature mismatch"):
                raise SignatureRefused(
                    ref,
                    _mismatch(directory),
                    file=_first_mismatch(directory),
                    hint="what is signed is not what is here: fetch it again from the registry, "
                    "or register it again from a trusted build",
                ) from None
            tried.append(f"{signer.name}: {_reason(err)}")
        except Exception as err:  # model-signing's and OpenSSL's verification errors are of several types
            tried.append(f"{signer.name}: {_reason(err)}")
        else:
            return signer
    raise _no_accepted_signer(ref, rule, tried)


def _check_signature_only(sig: Path, ref: str, rule: Rule) -> Signer:
    """The first signer of `rule` whose key (or CA) verifies the signature's envelope, without the files it lists
    (model-signing's verifiers, which its Config.verify runs before hashing the files).

    Raises:
        SignatureRefused: none does.
    """
    from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb

    tried = []
    for signer in rule.signers:
        try:
            bundle = sign_sigstore_pb.Signature.read(sig)
            if signer.key.ca is None:
                sign_ec_key.Verifier(signer.path).verify(bundle)
            else:
                sign_certificate.Verifier([signer.path]).verify(bundle)
        except Exception as err:  # model-signing's and OpenSSL's verification errors are of several types
            tried.append(f"{signer.name}: {_reason(err)}")
        else:
            return signer
    raise _no_accepted_signer(ref, rule, tried)


def _public_keyid(path: Path) -> str:
    """securesystemslib's keyid of the PEM public key at `path` (what a DSSE signature names)."""
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.signer import SSlibKey

    return str(SSlibKey.from_crypto(serialization.load_pem_public_key(path.read_bytes())).keyid)


def reproduction_signer(data: dict[str, Any], signers: tuple[Signer, ...]) -> Signer | None:
    """The first of `signers` (public keys only) whose key verifies the DSSE envelope `data`; None: none does."""
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    try:
        envelope = Envelope.from_dict(data)
    except Exception:  # securesystemslib's format errors are of several types: not an envelope, no signer
        return None
    for s in signers:
        if s.key.public_key is None:
            continue
        key = SSlibKey.from_crypto(serialization.load_pem_public_key(s.path.read_bytes()))
        try:
            envelope.verify([key], 1)
        except Exception:  # securesystemslib's VerificationError and key errors alike: not this key
            continue
        return s
    return None


def _check_reproductions(manifest: Manifest, policy: TrustPolicy, rule: Rule, signer: Signer, now: datetime) -> None:
    """At least `rule.reproductions` reproduced-by attestations of `manifest`'s files, each verified by a key of the
    rule other than `signer`'s and than each other's (compared by the public key, not the name), none revoked or
    retired by `now`.

    Raises:
        SignatureRefused: fewer (naming what was found and why the others do not count).
    """
    found: dict[str, str] = {}  # keyid → the policy's key name
    ignored: list[str] = []
    own = _public_keyid(signer.path) if signer.key.public_key is not None else None
    expected = {f.path: f.sha256 for f in manifest.files if f.path not in (SIGNATURE, provenance.PROVENANCE)}
    folder = policy.attestations / manifest.name / manifest.tag if policy.attestations is not None else None
    paths = sorted(folder.glob("reproduced-*.json")) if folder is not None and folder.is_dir() else []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            stmt = json.loads(base64.b64decode(data["payload"]))
            subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
        except (ValueError, KeyError, TypeError, OSError):
            ignored.append(f"{path.name}: not a reproduced-by attestation")
            continue
        by = reproduction_signer(data, rule.signers)
        if by is None:
            ignored.append(f"{path.name}: signed by no key of the rule {rule.pattern}")
            continue
        keyid = _public_keyid(by.path)
        if stmt.get("predicateType") != REPRODUCED_PREDICATE or subjects != expected:
            ignored.append(f"{path.name} (key {by.name}): attests other files than this artifact's")
        elif keyid == own:
            ignored.append(f"{path.name} (key {by.name}): the artifact's own signer")
        elif by.key.revoked is not None and now.date() >= by.key.revoked:
            ignored.append(f"{path.name} (key {by.name}): revoked on {by.key.revoked}")
        elif by.key.retired_at(now):
            ignored.append(f"{path.name} (key {by.name}): retired on {by.key.retired}")
        elif keyid in found:
            ignored.append(f"{path.name} (key {by.name}): a second one by the same key as {found[keyid]}")
        else:
            found[keyid] = by.name
    if len(found) >= rule.reproductions:
        return
    have = f"{len(found)} ({', '.join(f'by key {n}' for n in found.values())})" if found else "none"
    raise SignatureRefused(
        manifest.ref,
        f"{policy.path} asks for {rule.reproductions} reproduction(s) of {rule.pattern} by keys other than its "
        f"signer's ({signer.name}), and {have} verified"
        + (f"; not counted: {'; '.join(ignored)}" if ignored else ""),
        file=str(folder) if folder is not None else None,
        hint=f"on another builder, with a key {policy.path.name} names for {rule.pattern}: "
        f"`modelmint reproduce {manifest.ref}` with MODELMINT_SIGNING_KEY set, then commit the attestation it writes",
    )


def _sha256(path: Path) -> str | None:
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _reason(err: Exception) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:160]


def _differing(directory: Path) -> list[str]:
    """The files that differ from the signature's payload (changed, missing or added), in order."""
    import hashlib

    signed = payload_files(directory / SIGNATURE)
    here = {
        p.relative_to(directory).as_posix(): p
        for p in directory.rglob("*")
        if p.is_file() and p.relative_to(directory).as_posix() not in UNSIGNED_PARTS
    }
    out = []
    for name in sorted(set(signed) | set(here)):
        if name not in here:
            out.append(f"{name} (missing)")
        elif name not in signed:
            out.append(f"{name} (not signed)")
        else:
            h = hashlib.sha256()
            with open(here[name], "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            if h.hexdigest() != signed[name]:
                out.append(name)
    return out


def _first_mismatch(directory: Path) -> str | None:
    found = _differing(directory)
    return found[0].split(" (")[0] if found else None


def _mismatch(directory: Path) -> str:
    found = _differing(directory)
    return f"{', '.join(found) or 'a file'} differ{'s' if len(found) == 1 else ''} from what was signed"


def _check_certificate(sig: Path, ref: str, signer: Signer, when: datetime, at: str) -> None:
    """The signing certificate names the policy's identity and was valid at `when` (the timestamp's time, else now;
    `at` says which) (model-signing checks the chain at the certificate's start, not its end: an expired
    certificate would pass)."""
    from cryptography import x509

    bundle = json.loads(sig.read_text(encoding="utf-8"))
    raw = bundle["verificationMaterial"]["x509CertificateChain"]["certificates"][0]["rawBytes"]
    leaf = x509.load_der_x509_certificate(base64.b64decode(raw))
    if not leaf.not_valid_before_utc <= when <= leaf.not_valid_after_utc:
        raise SignatureRefused(
            ref,
            f"its signing certificate ({leaf.subject.rfc4514_string()}) was valid from "
            f"{leaf.not_valid_before_utc:%Y-%m-%d} to {leaf.not_valid_after_utc:%Y-%m-%d}; {at}: expired",
            file=SIGNATURE,
            hint="register it again with a current certificate",
        )
    names = [a.value for a in leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names += [str(v) for v in san.get_values_for_type(x509.RFC822Name)]
        names += [str(v) for v in san.get_values_for_type(x509.UniformResourceIdentifier)]
        names += [str(v) for v in san.get_values_for_type(x509.DNSName)]
    except x509.ExtensionNotFound:
        pass
    if signer.key.identity not in names:
        raise SignatureRefused(
            ref,
            f"its signing certificate names {', '.join(map(str, names)) or 'no identity'}, "
            f"not {signer.key.identity} ({signer.name} in the trust policy)",
            file=SIGNATURE,
            hint="register it again with the certificate of the accepted identity",
        )


def _no_accepted_signer(ref: str, rule: Rule, tried: list[str]) -> SignatureRefused:
    """The refusal when no signer `rule` accepts verifies the signature (`tried`: each signer's reason)."""
    return SignatureRefused(
        ref,
        f"its signature is by no key {rule.pattern!r} accepts in the trust policy ({'; '.join(tried)})",
        file=SIGNATURE,
        hint="add the signer's public key to registry/trust.yaml if it is trusted, or register it again with an "
        "accepted key",
    )
