"""A published image's signature and attestation where OCI tooling looks: cosign's tags and OCI 1.1 referrers.

After publish pushes an image by its digest, and before it writes any tag (oci/images.py), the configured signing
key signs its manifest digest twice:

- a cosign signature (sigstore/cosign specs/SIGNATURE_SPEC.md, "Simple Signing" and "OCI Image Manifest V1"): the
  simple-signing payload naming the image's digest as a layer of media type SIMPLE_SIGNING, its base64 ECDSA
  signature in the layer's `dev.cosignproject.cosign/signature` annotation, tagged `sha256-<hex>.sig`; with a
  Time-Stamp Authority configured, its RFC 3161 timestamp in `dev.sigstore.cosign/rfc3161timestamp`;
- an in-toto attestation: the artifact's provenance statement with the image as its subject, in a DSSE envelope
  (secure-systems-lab/dsse protocol.md: the signature is over PAE(payloadType, payload)), tagged `sha256-<hex>.att`
  (cosign's attestation tag) with the layer titled `NAME.intoto.jsonl`.

Both manifests name the image as their `subject` (OCI image-spec 1.1 manifest.md), so they are its referrers. A
registry without the referrers API (distribution 2.8 answers 404 to GET /v2/NAME/referrers/DIGEST) gets the
referrers tag schema instead (distribution-spec 1.1 spec.md, "Pushing Manifests with Subject" and "Referrers Tag
Schema"): an image index tagged `sha256-<hex>` listing each referrer's descriptor with its artifactType and
annotations, kept by the client that pushes. ECDSA signatures are deterministic (RFC 6979): publishing again signs
the same bytes and writes no tag.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipelines.core.errors import OciError
from pipelines.publish.oci import MANIFEST_TYPES, OCI_INDEX, OCI_MANIFEST, Blob, Image, OciClient

if TYPE_CHECKING:
    from pipelines.trust.signing import SigningKey

log = logging.getLogger(__name__)

SIMPLE_SIGNING: Final = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION: Final = "dev.cosignproject.cosign/signature"
CERTIFICATE_ANNOTATION: Final = "dev.sigstore.cosign/certificate"
CHAIN_ANNOTATION: Final = "dev.sigstore.cosign/chain"
TIMESTAMP_ANNOTATION: Final = "dev.sigstore.cosign/rfc3161timestamp"
"""cosign's annotation for an RFC 3161 timestamp over the signature's raw bytes (cosign pkg/oci/static/signature.go:36
names it, pkg/oci/static/options.go:64-69 writes it as the JSON of pkg/cosign/bundle/tsa.go's RFC3161Timestamp,
{"SignedRFC3161Timestamp": base64 DER TimeStampResp}; pkg/cosign/verify.go:1440-1445 checks it over the base64-decoded
signature)."""
COSIGN_TYPE: Final = "cosign container image signature"
SIGNATURE_ARTIFACT: Final = "application/vnd.dev.cosign.artifact.sig.v1+json"
"""The artifactType cosign gives a signature it stores as an OCI 1.1 referrer."""
DSSE: Final = "application/vnd.dsse.envelope.v1+json"
IN_TOTO: Final = "application/vnd.in-toto+json"
PREDICATE_ANNOTATION: Final = "predicateType"
"""The annotation cosign puts on an attestation layer: the statement's predicateType."""
IMAGE_CONFIG: Final = "application/vnd.oci.image.config.v1+json"
CREATED: Final = "org.opencontainers.image.created"


def tag_of(digest: str, suffix: str = "") -> str:
    """The referrers tag schema's tag for `digest` (`sha256-<hex>`), or cosign's with `suffix` (`sig`, `att`)."""
    algorithm, _, encoded = digest.partition(":")
    tag = f"{algorithm[:32]}-{encoded[:64]}"
    return f"{tag}.{suffix}" if suffix else tag


def simple_signing(reference: str, digest: str) -> bytes:
    """cosign's simple-signing payload for the image `digest` of repository `reference` (HOST/NAMESPACE/NAME)."""
    payload = {"critical": {"identity": {"docker-reference": reference},
                            "image": {"docker-manifest-digest": digest},
                            "type": COSIGN_TYPE},
               "optional": None}
    return json.dumps(payload, separators=(",", ":")).encode()


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what a DSSE signature signs."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


@dataclass(frozen=True)
class Attached:
    """What attach pushed: the referrers' manifest digests, and the tags it wrote (none when all were there)."""

    subject: str
    signature: str
    attestation: str | None
    tagged: list[str] = field(default_factory=list)


class _Signer:
    """The configured EC key, signing deterministically (the same bytes give the same signature)."""

    def __init__(self, sk: SigningKey) -> None:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key = serialization.load_pem_private_key(sk.key.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey), "signing.preflight admits EC keys only"
        self._key = key
        digest = {384: hashes.SHA384(), 521: hashes.SHA512()}.get(key.curve.key_size, hashes.SHA256())
        self._algorithm = ec.ECDSA(digest, deterministic_signing=True)
        spki = key.public_key().public_bytes(serialization.Encoding.DER,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
        self.keyid = hashlib.sha256(spki).hexdigest()
        self.certificate: str | None = None
        self.chain: str | None = None
        if sk.cert is not None:
            from cryptography import x509

            certs = x509.load_pem_x509_certificates(sk.cert.read_bytes())
            pem = [c.public_bytes(serialization.Encoding.PEM).decode() for c in certs]
            self.certificate, self.chain = pem[0], "".join(pem[1:]) or None

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self._key.sign(data, self._algorithm)).decode()


def _config_of(layers: tuple[Blob, ...]) -> Blob:
    """The image config cosign writes for a signature or attestation manifest (its layers' digests as diff_ids)."""
    config = {"architecture": "", "os": "", "config": {},
              "rootfs": {"type": "layers", "diff_ids": [b.digest for b in layers]}}
    return Blob.of_bytes(IMAGE_CONFIG, json.dumps(config, separators=(",", ":")).encode())


def signature_image(sk: SigningKey, reference: str, subject: dict[str, Any], *,
                    kept: tuple[bytes, str, str] | None = None) -> Image:
    """The cosign signature manifest over the image `subject` (a descriptor) of repository `reference`. With a
    Time-Stamp Authority configured (sk.tsa, MODELMINT_TSA_URL) the signature layer carries its RFC 3161 timestamp
    over the signature's bytes (TIMESTAMP_ANNOTATION); the one of the same signature in `kept` (the manifest its
    `.sig` tag holds) is reused, so that publishing again writes nothing.

    Raises:
        TimestampUnavailable: the authority cannot be reached or refuses (nothing of the signature is pushed).
    """
    signer = _Signer(sk)
    payload = simple_signing(reference, subject["digest"])
    annotations = {SIGNATURE_ANNOTATION: signer.sign(payload)}
    if sk.tsa is not None:
        annotations[TIMESTAMP_ANNOTATION] = _kept_timestamp(kept, annotations[SIGNATURE_ANNOTATION]) or json.dumps(
            {"SignedRFC3161Timestamp": base64.b64encode(
                _timestamp(sk.tsa, base64.b64decode(annotations[SIGNATURE_ANNOTATION]))).decode()},
            separators=(",", ":"),
        )
    if signer.certificate is not None:
        annotations[CERTIFICATE_ANNOTATION] = signer.certificate
        if signer.chain:
            annotations[CHAIN_ANNOTATION] = signer.chain
    layer = Blob.of_bytes(SIMPLE_SIGNING, payload, annotations)
    return Image(OCI_MANIFEST, _config_of((layer,)), (layer,), artifact_type=SIGNATURE_ARTIFACT,
                 subject=_descriptor(subject))


def _timestamp(url: str, signature: bytes) -> bytes:
    from pipelines.core import timestamps

    return timestamps.request(url, signature)


def _kept_timestamp(kept: tuple[bytes, str, str] | None, signature: str) -> str | None:
    """The timestamp annotation of the layer of `kept` (a manifest as OciClient.get_manifest gives it) that carries
    this very signature; None: none does."""
    if kept is None:
        return None
    try:
        layers = json.loads(kept[0]).get("layers") or []
        for layer in layers:
            annotations = layer.get("annotations") or {}
            if annotations.get(SIGNATURE_ANNOTATION) == signature and isinstance(
                annotations.get(TIMESTAMP_ANNOTATION), str
            ):
                return str(annotations[TIMESTAMP_ANNOTATION])
    except (ValueError, AttributeError, TypeError):
        return None
    return None


def attestation_image(sk: SigningKey, reference: str, subject: dict[str, Any], statement: dict[str, Any],
                      *, title: str) -> Image:
    """The in-toto attestation manifest: `statement` (an in-toto statement whose predicate is kept) made about the
    image `subject`, in a DSSE envelope signed with `sk`, one line of `title` (a `.intoto.jsonl` file)."""
    signer = _Signer(sk)
    about = {**statement, "subject": [{"name": reference, "digest": {"sha256": subject["digest"].partition(":")[2]}}]}
    body = json.dumps(about, sort_keys=True, separators=(",", ":")).encode()
    envelope = {"payloadType": IN_TOTO, "payload": base64.b64encode(body).decode(),
                "signatures": [{"keyid": signer.keyid, "sig": signer.sign(pae(IN_TOTO, body))}]}
    line = json.dumps(envelope, separators=(",", ":")).encode() + b"\n"
    predicate = str(statement.get("predicateType", ""))
    layer = Blob.of_bytes(DSSE, line, {PREDICATE_ANNOTATION: predicate, "org.opencontainers.image.title": title})
    return Image(OCI_MANIFEST, _config_of((layer,)), (layer,), artifact_type=DSSE, subject=_descriptor(subject),
                 annotations={PREDICATE_ANNOTATION: predicate})


def _descriptor(d: dict[str, Any]) -> dict[str, Any]:
    return {"mediaType": d["mediaType"], "digest": d["digest"], "size": d["size"]}


def referrer_descriptor(image: Image) -> dict[str, Any]:
    """The descriptor of `image` as the referrers list holds it: its artifactType (else its config's media type)
    and all its annotations (spec.md, "Pushing Manifests with Subject")."""
    data = image.manifest_bytes()
    d: dict[str, Any] = {"mediaType": image.media_type, "digest": image.digest, "size": len(data),
                         "artifactType": image.artifact_type or image.config.media_type}
    return d | ({"annotations": dict(image.annotations)} if image.annotations else {})


def attach(client: OciClient, repository: str, reference: str, subject: dict[str, Any], sk: SigningKey,
           statement: dict[str, Any] | None, *, title: str) -> Attached:
    """Sign the image `subject` (its manifest's descriptor) of `repository` and push the signature and, when there
    is a provenance `statement`, the attestation: blobs, then each manifest under its cosign tag, then the
    referrers list under `sha256-<hex>` with both added (descriptors already listed are not added twice; a tag
    that points at the same manifest already is not written again).

    Raises:
        OciError: the registry refuses, or the referrers tag holds something other than an image index (nothing
            is overwritten there).
        TimestampUnavailable: MODELMINT_TSA_URL's authority cannot timestamp the signature (nothing is pushed).
        OciUnavailable, OciAuthRefused: as OciClient.
    """
    kept = client.get_manifest(repository, tag_of(subject["digest"], "sig")) if sk.tsa is not None else None
    made: list[tuple[str, Image]] = [("sig", signature_image(sk, reference, subject, kept=kept))]
    if statement is not None:
        made.append(("att", attestation_image(sk, reference, subject, statement, title=title)))
    tagged: list[str] = []
    for at, (suffix, image) in enumerate(made):
        tag = tag_of(subject["digest"], suffix)
        there = client.get_manifest(repository, tag)
        image = _joined(image, there)
        made[at] = (suffix, image)
        for blob in image.blobs:
            if blob.data is not None:  # the layers kept from the tag's manifest are there already
                client.push_blob(repository, blob)
        if there is None or there[2] != image.digest:
            client.put_manifest(repository, tag, image)
            tagged.append(tag)
    index_tag = tag_of(subject["digest"])
    listed = _referrers_list(client, repository, index_tag)
    manifests = list(listed["manifests"])
    for _, image in made:
        if not any(isinstance(d, dict) and d.get("digest") == image.digest for d in manifests):
            manifests.append(referrer_descriptor(image))
    if manifests != listed["manifests"]:
        data = json.dumps({**listed, "manifests": manifests}, separators=(",", ":")).encode()
        client.put_manifest_bytes(repository, index_tag, OCI_INDEX, data)
        tagged.append(index_tag)
    return Attached(subject["digest"], made[0][1].digest, made[1][1].digest if len(made) > 1 else None, tagged)


def _joined(image: Image, there: tuple[bytes, str, str] | None) -> Image:
    """`image` with the layers of the manifest its cosign tag holds already kept before its own (cosign's
    SIGNATURE_SPEC.md: one manifest per signed object, several signatures in it): another signer's signature
    stays. The kept layers are in the repository already (push_blob finds them there)."""
    if there is None:
        return image
    try:
        layers = json.loads(there[0]).get("layers") or []
        kept = [Blob(x["mediaType"], x["digest"], x["size"], annotations=dict(x.get("annotations") or {}))
                for x in layers if isinstance(x, dict)]
    except (ValueError, AttributeError, KeyError, TypeError):
        return image  # not a manifest cosign could read either: replaced
    own = image.layers[0]
    joined = tuple(kept) if any(b.descriptor() == own.descriptor() for b in kept) else (*kept, own)
    if [b.descriptor() for b in joined] == [own.descriptor()]:
        return image
    return Image(image.media_type, _config_of(joined), joined, artifact_type=image.artifact_type,
                 annotations=image.annotations, subject=image.subject)


def _referrers_list(client: OciClient, repository: str, tag: str) -> dict[str, Any]:
    """The image index the referrers tag holds, or an empty one when the tag is not there.

    Raises:
        OciError: the tag holds something other than an image index (spec.md: the client reports a failure).
    """
    # every manifest type accepted: distribution 2.8 answers a narrower Accept with 400 MANIFEST_INVALID
    there = client.get_manifest(repository, tag, accept=(OCI_INDEX, *MANIFEST_TYPES))
    if there is None:
        return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    try:
        index = json.loads(there[0])
        ok = index.get("mediaType") == OCI_INDEX and isinstance(index.get("manifests"), list)
    except (ValueError, AttributeError):
        ok = False
    if not ok:
        raise OciError(f"{repository}:{tag}, the referrers tag of the image, holds {there[1] or 'a manifest'} "
                       f"({there[2]}), not an image index: its signature is not listed there",
                       registry=client.registry.host,
                       hint=f"delete the tag {tag} in the registry (`DELETE /v2/{repository}/manifests/{there[2]}`: it "
                       "was not written by an OCI 1.1 client), then publish again to list the signature")
    return dict(index)


def provenance_statement(directory: Path) -> dict[str, Any] | None:
    """The artifact's signed provenance statement (provenance.json), or None when it was registered unsigned."""
    from pipelines.trust.provenance import PROVENANCE

    path = directory / PROVENANCE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None
