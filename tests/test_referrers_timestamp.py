"""With MODELMINT_TSA_URL set, the cosign signature publish pushes carries an RFC 3161 timestamp of its bytes where
cosign keeps one (the layer annotation dev.sigstore.cosign/rfc3161timestamp), checked by the client written from
the specifications (tests/cosign_verify.py): a real registry and a real `openssl ts` TSA on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from cosign_verify import TIMESTAMP_KEY, Refused, verify_signature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from ociregistry import start_registry
from registry_env import Repo
from test_referrers import registered_signed
from test_signing import REF
from tsa_server import make_pki, serve_tsa

NAME = "modelmint/tiny-qwen2"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _sig_tag(digest: str) -> str:
    """cosign's signature tag for `digest` (SIGNATURE_SPEC.md: `sha256-<hex>.sig`)."""
    return digest.replace(":", "-") + ".sig"


def test_the_published_cosign_signature_carries_a_timestamp_that_verifies_and_is_kept_on_republish(
    repo: Repo, tmp_path: Path
) -> None:
    from pipelines.oci.images import publish_image
    from pipelines.publish.oci import RegistryRef

    private, public, _ = registered_signed(repo, tmp_path)
    pub = serialization.load_pem_public_key(public.read_bytes())
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    other_root, _, _ = make_pki(tmp_path / "other-tsa", "another tsa")
    reg = start_registry(tmp_path / "registry")
    try:
        with serve_tsa(tmp_path / "tsa") as tsa:
            target = RegistryRef(reg.host, "modelmint", insecure=True)
            done = publish_image(repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_TSA_URL=tsa.url), REF, target)
            base = f"http://{reg.host}"
            payload = verify_signature(base, NAME, done.digest, pub, tsa_root=tsa.root)
            assert payload["critical"]["image"]["docker-manifest-digest"] == done.digest
            sig = httpx.get(f"{base}/v2/{NAME}/manifests/{_sig_tag(done.digest)}",
                            headers={"Accept": OCI_MANIFEST}).json()
            (layer,) = sig["layers"]
            assert set(json.loads(layer["annotations"][TIMESTAMP_KEY])) == {"SignedRFC3161Timestamp"}
            # another authority's root does not vouch for it
            with pytest.raises(Refused, match="the timestamp does not verify"):
                verify_signature(base, NAME, done.digest, pub, tsa_root=other_root)
            # publishing again keeps the timestamp of the same signature: no tag is written, no layer added
            again = publish_image(repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_TSA_URL=tsa.url), REF, target)
            assert again.digest == done.digest
            after = httpx.get(f"{base}/v2/{NAME}/manifests/{_sig_tag(done.digest)}",
                              headers={"Accept": OCI_MANIFEST}).json()
            assert after == sig
    finally:
        reg.stop()
