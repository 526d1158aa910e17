"""A client that finds and verifies an image's signature and attestation as OCI tooling does, written from the
specifications (not from modelmint's code), with httpx and cryptography only:

- opencontainers/distribution-spec spec.md (commit 967efdc): "Listing Referrers" (lines 612-640: GET
  /v2/<name>/referrers/<digest>; each descriptor carries artifactType and the manifest's annotations), the
  fallback on a 404 (line 708: pull the referrers tag schema; lines 709-710: no valid index means no referrers)
  and "Referrers Tag Schema" (lines 787-803: `<alg truncated to 32>-<encoded truncated to 64>`);
- opencontainers/image-spec manifest.md (v1.1.0, "Image Manifest Property Descriptions"): `subject` is the
  descriptor of the manifest a referrer refers to;
- sigstore/cosign specs/SIGNATURE_SPEC.md (commit d6d86c2): the tag `sha256-<hex>.sig` (lines 155-169), the
  simple-signing payload as a layer of media type application/vnd.dev.cosign.simplesigning.v1+json (lines 200-212),
  its base64 signature in the layer annotation dev.cosignproject.cosign/signature (lines 217-218), `critical.type`
  "cosign container image signature" and `critical.image.docker-manifest-digest` (lines 262-283), ECDSA-P256 with
  SHA-256 (lines 294, 391-402);
- sigstore/cosign (commit d6d86c2): an RFC 3161 timestamp of the signature in the layer annotation
  dev.sigstore.cosign/rfc3161timestamp (pkg/oci/static/signature.go:36), the JSON {"SignedRFC3161Timestamp":
  base64 DER TimeStampResp} (pkg/cosign/bundle/tsa.go:18-24, pkg/oci/static/options.go:64-69), over the base64-decoded
  signature (pkg/cosign/verify.go:1440-1445); checked with `openssl ts -verify` against the authority's root (RFC 3161);
- secure-systems-lab/dsse protocol.md (commit eebf7b5): the signature is over PAE(payloadType, payload) (lines
  16, 57-64, 97), with in-toto's payloadType application/vnd.in-toto+json.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_KEY = "dev.cosignproject.cosign/signature"
TIMESTAMP_KEY = "dev.sigstore.cosign/rfc3161timestamp"
DSSE = "application/vnd.dsse.envelope.v1+json"
IN_TOTO = "application/vnd.in-toto+json"


class Refused(Exception):
    """No referrer verifies: each one's reason in the message."""


@dataclass(frozen=True)
class Referrers:
    via: str
    """"api" (the referrers API answered) or the referrers tag the descriptors came from."""
    descriptors: list[dict[str, Any]]


def referrers_tag(digest: str) -> str:
    algorithm, _, encoded = digest.partition(":")
    clean = "".join(c if c.isalnum() or c in "_.-" else "-" for c in f"{algorithm[:32]}-{encoded[:64]}")
    return clean


def discover(base: str, name: str, digest: str) -> Referrers:
    """The referrers of `digest` in repository `name`: the referrers API, else the referrers tag schema."""
    r = httpx.get(f"{base}/v2/{name}/referrers/{digest}")
    if r.status_code == 200:
        return Referrers("api", list(r.json()["manifests"]))
    assert r.status_code == 404, f"the referrers API answered {r.status_code}"
    tag = referrers_tag(digest)
    r = httpx.get(f"{base}/v2/{name}/manifests/{tag}", headers={"Accept": INDEX})
    if r.status_code != 200:
        return Referrers(tag, [])
    index = r.json()
    if index.get("mediaType") != INDEX or not isinstance(index.get("manifests"), list):
        return Referrers(tag, [])
    return Referrers(tag, list(index["manifests"]))


def _manifest(base: str, name: str, reference: str) -> tuple[str, dict[str, Any]]:
    r = httpx.get(f"{base}/v2/{name}/manifests/{reference}", headers={"Accept": f"{OCI_MANIFEST}, {INDEX}"})
    r.raise_for_status()
    digest = "sha256:" + hashlib.sha256(r.content).hexdigest()
    if reference.startswith("sha256:") and digest != reference:
        raise Refused(f"manifest {reference} holds bytes of digest {digest}")
    return digest, r.json()


def _blob(base: str, name: str, digest: str) -> bytes:
    r = httpx.get(f"{base}/v2/{name}/blobs/{digest}", follow_redirects=True)
    r.raise_for_status()
    if "sha256:" + hashlib.sha256(r.content).hexdigest() != digest:
        raise Refused(f"blob {digest} holds other bytes")
    return r.content


def _verify(public: ec.EllipticCurvePublicKey, signature_b64: str, data: bytes) -> bool:
    try:
        public.verify(base64.b64decode(signature_b64), data, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def _referrers_of(base: str, name: str, digest: str, artifact_type: str) -> list[tuple[str, dict[str, Any]]]:
    """The manifests of the referrers of `artifact_type`, each checked to name `digest` as its subject."""
    found = []
    for d in discover(base, name, digest).descriptors:
        if d.get("artifactType") != artifact_type:
            continue
        at, manifest = _manifest(base, name, d["digest"])
        if (manifest.get("subject") or {}).get("digest") != digest:
            continue  # listed, but not a referrer of this image
        found.append((at, manifest))
    return found


def _timestamp_problem(annotations: dict[str, Any], signature_b64: str, tsa_root: Path) -> str | None:
    """Why the layer's RFC 3161 timestamp does not hold (None: it does): missing, not cosign's JSON, or not a reply
    over sha256 of the raw signature that chains to `tsa_root`."""
    text = annotations.get(TIMESTAMP_KEY)
    if not text:
        return f"no {TIMESTAMP_KEY} annotation"
    try:
        reply = base64.b64decode(json.loads(text)["SignedRFC3161Timestamp"])
    except (ValueError, KeyError, TypeError) as err:
        return f"{TIMESTAMP_KEY} is not cosign's RFC3161Timestamp JSON ({err})"
    with tempfile.TemporaryDirectory() as scratch:
        data, tsr = Path(scratch) / "sig", Path(scratch) / "reply.tsr"
        data.write_bytes(base64.b64decode(signature_b64))
        tsr.write_bytes(reply)
        done = subprocess.run(["openssl", "ts", "-verify", "-data", str(data), "-in", str(tsr),
                               "-CAfile", str(tsa_root)], capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"the timestamp does not verify: {done.stdout}{done.stderr}".strip()


def verify_signature(base: str, name: str, digest: str, public: ec.EllipticCurvePublicKey, *,
                     tsa_root: Path | None = None) -> dict[str, Any]:
    """The simple-signing payload of the first cosign signature among the referrers of `digest` that `public`
    verifies and that names `digest`; with `tsa_root`, one whose RFC 3161 timestamp over its signature verifies
    against that root.

    Raises:
        Refused: none does (each signature's reason listed).
    """
    reasons = []
    for at, manifest in _referrers_of(base, name, digest, "application/vnd.dev.cosign.artifact.sig.v1+json"):
        for layer in manifest.get("layers") or []:
            if layer.get("mediaType") != SIMPLE_SIGNING:
                continue
            payload = _blob(base, name, layer["digest"])
            signature = (layer.get("annotations") or {}).get(SIGNATURE_KEY)
            if not signature or not _verify(public, signature, payload):
                reasons.append(f"{at}: the signature does not verify with the key")
                continue
            critical = json.loads(payload)["critical"]
            stamp = _timestamp_problem(layer.get("annotations") or {}, signature, tsa_root) if tsa_root else None
            if stamp is not None:
                reasons.append(f"{at}: {stamp}")
            elif critical.get("type") != "cosign container image signature":
                reasons.append(f"{at}: critical.type is {critical.get('type')!r}")
            elif critical["image"].get("docker-manifest-digest") != digest:
                reasons.append(f"{at}: it signs {critical['image'].get('docker-manifest-digest')}, not {digest}")
            else:
                return dict(json.loads(payload))
    raise Refused("; ".join(reasons) or f"no signature of {digest} was found")


def pae(payload_type: str, body: bytes) -> bytes:
    return b"DSSEv1 %d %s %d %s" % (len(payload_type.encode()), payload_type.encode(), len(body), body)


def verify_attestation(base: str, name: str, digest: str, public: ec.EllipticCurvePublicKey) -> dict[str, Any]:
    """The in-toto statement of the first DSSE attestation among the referrers of `digest` that `public` verifies
    and whose subject is `digest`.

    Raises:
        Refused: none does.
    """
    reasons = []
    for at, manifest in _referrers_of(base, name, digest, DSSE):
        for layer in manifest.get("layers") or []:
            if layer.get("mediaType") != DSSE:
                continue
            for line in _blob(base, name, layer["digest"]).splitlines():
                envelope = json.loads(line)
                body = base64.b64decode(envelope["payload"])
                if envelope.get("payloadType") != IN_TOTO:
                    reasons.append(f"{at}: payloadType {envelope.get('payloadType')!r}")
                    continue
                if not any(_verify(public, s["sig"], pae(IN_TOTO, body)) for s in envelope.get("signatures") or []):
                    reasons.append(f"{at}: no signature of the envelope verifies with the key")
                    continue
                statement = json.loads(body)
                if not any(s.get("digest", {}).get("sha256") == digest.partition(":")[2]
                           for s in statement.get("subject") or []):
                    reasons.append(f"{at}: its subject is not {digest}")
                    continue
                return dict(statement)
    raise Refused("; ".join(reasons) or f"no attestation of {digest} was found")
