"""publish signs the image where OCI tooling looks: a cosign signature and an in-toto attestation, OCI 1.1 referrers
of the image listed under the referrers tag schema (distribution 2.8 has no referrers API), found and verified by a
client written from the specifications (tests/cosign_verify.py); a changed payload or another key is refused."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from cosign_verify import Refused, discover, verify_attestation, verify_signature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from ociregistry import start_registry
from registry_env import Repo, candidate
from test_signing import REF, _key, _policy_for

from pipelines.core.settings import Settings
from pipelines.registry.register import register

NAME = "modelmint/tiny-qwen2"
INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
def published(repo: Repo, tmp_path: Path) -> Any:
    """tiny-qwen2:q4_k_m registered, signed and published with the signing key configured:
    (repo, base URL, Published, private key path, public key)."""
    from pipelines.oci.images import publish_image
    from pipelines.publish.oci import RegistryRef

    private, public, _ = registered_signed(repo, tmp_path)
    reg = start_registry(tmp_path / "registry")
    done = publish_image(repo.settings(MODELMINT_SIGNING_KEY=private), REF,
                         RegistryRef(reg.host, "modelmint", insecure=True))
    pub = serialization.load_pem_public_key(public.read_bytes())
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    yield repo, f"http://{reg.host}", done, private, pub
    reg.stop()



def registered_signed(repo: Repo, tmp_path: Path) -> tuple[Path, Path, Settings]:
    """tiny-qwen2:q4_k_m registered signed by a new key that the committed trust policy names: (private, public,
    the settings that sign with it)."""
    private, public = _key(tmp_path / "signing.pem")
    settings = repo.settings(MODELMINT_SIGNING_KEY=private)
    register(settings, candidate(settings, tmp_path / "build"))
    _policy_for(repo, public)
    repo.commit_all("register tiny-qwen2:q4_k_m, signed")
    return private, public, settings


def test_the_signature_and_the_attestation_are_found_through_the_referrers_tag_and_verify(published: Any) -> None:
    repo, base, done, _, pub = published
    digest = done.digest
    found = discover(base, NAME, digest)
    assert found.via == "sha256-" + digest.removeprefix("sha256:")  # the referrers API answered 404: the fallback
    assert {d["artifactType"] for d in found.descriptors} == {
        "application/vnd.dev.cosign.artifact.sig.v1+json", "application/vnd.dsse.envelope.v1+json"}

    payload = verify_signature(base, NAME, digest, pub)
    host = base.removeprefix("http://")
    assert payload["critical"] == {"identity": {"docker-reference": f"{host}/{NAME}"},
                                   "image": {"docker-manifest-digest": digest},
                                   "type": "cosign container image signature"}

    statement = verify_attestation(base, NAME, digest, pub)
    provenance = json.loads((repo.root / done.manifest.dvc.path / "provenance.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"] == [{"name": f"{host}/{NAME}", "digest": {"sha256": digest.removeprefix("sha256:")}}]
    assert (statement["predicateType"], statement["predicate"]) == (provenance["predicateType"],
                                                                   provenance["predicate"])

    # cosign's own tags name the same manifests the referrers list does
    for suffix in ("sig", "att"):
        r = httpx.get(f"{base}/v2/{NAME}/manifests/sha256-{digest.removeprefix('sha256:')}.{suffix}",
                      headers={"Accept": OCI_MANIFEST})
        assert r.status_code == 200
        assert "sha256:" + hashlib.sha256(r.content).hexdigest() in {d["digest"] for d in found.descriptors}
        assert r.json()["subject"]["digest"] == digest


def test_publishing_again_signs_the_same_bytes_and_writes_no_tag(published: Any) -> None:
    from pipelines.oci.images import publish_image

    repo, base, done, private, _ = published
    again = publish_image(repo.settings(MODELMINT_SIGNING_KEY=private), REF, done.registry)
    assert again.referrers is not None and done.referrers is not None
    assert again.referrers.tagged == [] and again.tagged == []
    assert (again.referrers.signature, again.referrers.attestation) == (done.referrers.signature,
                                                                         done.referrers.attestation)
    assert len(discover(base, NAME, done.digest).descriptors) == 2


def test_a_signature_by_another_key_is_refused(published: Any) -> None:
    _, base, done, _, _ = published
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(Refused, match="does not verify with the key"):
        verify_signature(base, NAME, done.digest, other)
    with pytest.raises(Refused, match="no signature of the envelope verifies"):
        verify_attestation(base, NAME, done.digest, other)


def _push(base: str, data: bytes, media_type: str, reference: str | None = None) -> str:
    """A blob (or, with `reference`, a manifest) pushed through the distribution API as anyone who may write."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if reference is not None:
        r = httpx.put(f"{base}/v2/{NAME}/manifests/{reference}", content=data, headers={"Content-Type": media_type})
        assert r.status_code == 201, r.text
        return digest
    started = httpx.post(f"{base}/v2/{NAME}/blobs/uploads/")
    r = httpx.put(httpx.URL(base).join(started.headers["location"]).copy_merge_params({"digest": digest}),
                  content=data, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    return digest


def _replace_signature(base: str, digest: str, payload: bytes, signature: str) -> None:
    """The signature manifest rewritten with `payload` and `signature`, and the referrers tag pointed at it alone."""
    tag = "sha256-" + digest.removeprefix("sha256:")
    index = httpx.get(f"{base}/v2/{NAME}/manifests/{tag}", headers={"Accept": INDEX}).json()
    d = next(x for x in index["manifests"] if x["artifactType"].endswith("sig.v1+json"))
    mf = httpx.get(f"{base}/v2/{NAME}/manifests/{d['digest']}", headers={"Accept": OCI_MANIFEST}).json()
    layer = mf["layers"][0]
    layer.update(digest=_push(base, payload, layer["mediaType"]), size=len(payload),
                 annotations={**layer["annotations"], "dev.cosignproject.cosign/signature": signature})
    data = json.dumps(mf).encode()
    changed = _push(base, data, OCI_MANIFEST, reference=tag + ".sig")
    index["manifests"] = [x if x is not d else {**d, "digest": changed, "size": len(data)} for x in index["manifests"]]
    _push(base, json.dumps(index).encode(), INDEX, reference=tag)


def test_a_changed_payload_is_refused(published: Any) -> None:
    """The payload edited after signing (another docker-reference), its signature kept."""
    _, base, done, _, pub = published
    tag = "sha256-" + done.digest.removeprefix("sha256:")
    mf = httpx.get(f"{base}/v2/{NAME}/manifests/{tag}.sig", headers={"Accept": OCI_MANIFEST}).json()
    layer = mf["layers"][0]
    payload = json.loads(httpx.get(f"{base}/v2/{NAME}/blobs/{layer['digest']}").content)
    payload["critical"]["identity"]["docker-reference"] = "attacker.example/evil/model"
    _replace_signature(base, done.digest, json.dumps(payload).encode(),
                       layer["annotations"]["dev.cosignproject.cosign/signature"])
    with pytest.raises(Refused, match="does not verify with the key"):
        verify_signature(base, NAME, done.digest, pub)


def test_a_signature_over_another_image_is_refused(published: Any) -> None:
    """A valid signature by the trusted key, but over another image's digest, listed as this image's referrer."""
    _, base, done, private, pub = published
    key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    other = "sha256:" + hashlib.sha256(b"another image").hexdigest()
    payload = json.dumps({"critical": {"identity": {"docker-reference": NAME}, "image": {"docker-manifest-digest": other},
                                       "type": "cosign container image signature"}, "optional": None}).encode()
    signature = base64.b64encode(key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()
    _replace_signature(base, done.digest, payload, signature)
    with pytest.raises(Refused, match=f"it signs {other}, not {done.digest}"):
        verify_signature(base, NAME, done.digest, pub)


def test_a_referrers_tag_that_is_not_an_index_is_refused_naming_it(repo: Repo, tmp_path: Path) -> None:
    """Something else under the image's sha256-<hex> tag is never overwritten: publish names it and what to run."""
    from pipelines.core.errors import OciError
    from pipelines.oci.images import publish_image
    from pipelines.publish.oci import RegistryRef

    _, _, settings = registered_signed(repo, tmp_path)
    reg = start_registry(tmp_path / "registry")
    try:
        where = RegistryRef(reg.host, "modelmint", insecure=True)
        done = publish_image(repo.settings(), REF, where)  # no key: the image alone
        base = f"http://{reg.host}"
        tag = "sha256-" + done.digest.removeprefix("sha256:")
        docker = "application/vnd.docker.distribution.manifest.v2+json"
        mf = httpx.get(f"{base}/v2/{NAME}/manifests/q4_k_m", headers={"Accept": docker})
        assert mf.headers["content-type"] == docker
        _push(base, mf.content, docker, reference=tag)
        with pytest.raises(OciError, match=f"{tag}, the referrers tag of the image, holds") as err:
            publish_image(settings, REF, where)
        assert f"modelmint publish {REF} --registry {reg.host}/modelmint --insecure" in (err.value.hint or "")
        assert httpx.get(f"{base}/v2/{NAME}/manifests/{tag}", headers={"Accept": docker}).content == mf.content
    finally:
        reg.stop()


def test_another_signers_cosign_signature_under_the_sig_tag_is_kept(repo: Repo, tmp_path: Path) -> None:
    """cosign keeps every signature of an image in the one manifest its .sig tag names: publish adds its own
    beside a signature another key made there before, and both verify."""
    from pipelines.oci.images import publish_image
    from pipelines.publish.oci import RegistryRef

    _, public, settings = registered_signed(repo, tmp_path)
    reg = start_registry(tmp_path / "registry")
    try:
        where = RegistryRef(reg.host, "modelmint", insecure=True)
        done = publish_image(repo.settings(), REF, where)  # no key: the image alone
        base = f"http://{reg.host}"
        team = ec.generate_private_key(ec.SECP256R1())
        payload = json.dumps({"critical": {"identity": {"docker-reference": f"{reg.host}/{NAME}"},
                                           "image": {"docker-manifest-digest": done.digest},
                                           "type": "cosign container image signature"}, "optional": None}).encode()
        layer = {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                 "digest": _push(base, payload, "application/octet-stream"), "size": len(payload),
                 "annotations": {"dev.cosignproject.cosign/signature": base64.b64encode(
                     team.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()}}
        config = json.dumps({"architecture": "", "os": "", "config": {},
                             "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}}).encode()
        mf = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
              "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                         "digest": _push(base, config, "application/octet-stream"), "size": len(config)},
              "layers": [layer]}
        _push(base, json.dumps(mf).encode(), OCI_MANIFEST, reference=f"sha256-{done.digest[7:]}.sig")

        publish_image(settings, REF, where)
        sig = httpx.get(f"{base}/v2/{NAME}/manifests/sha256-{done.digest[7:]}.sig", headers={"Accept": OCI_MANIFEST})
        assert [x["digest"] for x in sig.json()["layers"]][:1] == [layer["digest"]] and len(sig.json()["layers"]) == 2
        pub = serialization.load_pem_public_key(public.read_bytes())
        assert isinstance(pub, ec.EllipticCurvePublicKey)
        for key in (pub, team.public_key()):
            assert verify_signature(base, NAME, done.digest, key)["critical"]["image"] == {
                "docker-manifest-digest": done.digest}
    finally:
        reg.stop()


def test_with_a_certificate_chain_the_signature_carries_the_certificate_and_chain(repo: Repo, tmp_path: Path) -> None:
    """cosign's SIGNATURE_SPEC.md lines 228-258: the signing certificate and its chain as annotations of the layer,
    so a verifier that trusts the root finds the key in the signature itself."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from test_signing import _ca_policy, _pki

    from pipelines.oci.images import publish_image
    from pipelines.publish.oci import RegistryRef

    now = datetime.now(UTC)
    key, chain, root = _pki(tmp_path, start=now - timedelta(days=1), end=now + timedelta(days=30))
    settings = repo.settings(MODELMINT_SIGNING_KEY=key, MODELMINT_SIGNING_CERT=chain)
    register(settings, candidate(settings, tmp_path / "build"))
    _ca_policy(repo, root, "modelmint-ci")
    repo.commit_all("register tiny-qwen2:q4_k_m, signed by certificate")
    reg = start_registry(tmp_path / "registry")
    try:
        done = publish_image(settings, REF, RegistryRef(reg.host, "modelmint", insecure=True))
        base = f"http://{reg.host}"
        sig = httpx.get(f"{base}/v2/{NAME}/manifests/sha256-{done.digest[7:]}.sig", headers={"Accept": OCI_MANIFEST})
        annotations = sig.json()["layers"][0]["annotations"]
        leaf = x509.load_pem_x509_certificate(annotations["dev.sigstore.cosign/certificate"].encode())
        intermediates = x509.load_pem_x509_certificates(annotations["dev.sigstore.cosign/chain"].encode())
        trusted = x509.load_pem_x509_certificate(root.read_bytes())
        for child, parent in zip([leaf, *intermediates], [*intermediates, trusted], strict=True):
            child.verify_directly_issued_by(parent)
        assert leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "modelmint-ci"
        public = leaf.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert verify_signature(base, NAME, done.digest, public)["critical"]["image"]["docker-manifest-digest"] == (
            done.digest)
        assert verify_attestation(base, NAME, done.digest, public)["subject"][0]["digest"]["sha256"] == done.digest[7:]
    finally:
        reg.stop()


def test_a_signing_key_that_cannot_sign_refuses_the_publish_before_anything_is_pushed(
    repo: Repo, tmp_path: Path
) -> None:
    from pipelines.core.errors import SigningKeyError
    from pipelines.oci.images import publish_image
    from pipelines.publish.oci import RegistryRef

    registered_signed(repo, tmp_path)
    reg = start_registry(tmp_path / "registry")
    try:
        gone = tmp_path / "moved.pem"
        with pytest.raises(SigningKeyError, match=f"MODELMINT_SIGNING_KEY {gone} cannot be read"):
            publish_image(repo.settings(MODELMINT_SIGNING_KEY=gone), REF,
                          RegistryRef(reg.host, "modelmint", insecure=True))
        assert reg.requests("PUT") == [] and reg.requests("POST") == []  # no blob, no image without its signature
    finally:
        reg.stop()
