"""With MODELMINT_TSA_URL set, the cosign signature publish pushes carries an RFC 3161 timestamp of its bytes where
cosign keeps one (the layer annotation dev.sigstore.cosign/rfc3161timestamp), checked by the client written from
the specifications (tests/cosign_verify.py): a real registry and a real `openssl ts` TSA on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cosign_verify import TIMESTAMP_KEY, Refused, verify_signature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from ociregistry import start_registry
from registry_env import Repo, candidate, free_port
from test_referrers import registered_signed
from test_signing import REF
from tsa_server import make_pki, serve_tsa

from pipelines.registry.register import register

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


def _tag(base: str, tag: str) -> str | None:
    """The digest `tag` names in the registry, or None when it is not there."""
    from pipelines.publish.oci import MANIFEST_TYPES

    r = httpx.get(f"{base}/v2/{NAME}/manifests/{tag}", headers={"Accept": ", ".join(MANIFEST_TYPES)})
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return "sha256:" + hashlib.sha256(r.content).hexdigest()


def test_a_timestamp_authority_that_is_down_moves_no_tag_off_the_signed_image_and_a_rerun_publishes(
    repo: Repo, tmp_path: Path
) -> None:
    """A new registration published while the Time-Stamp Authority is down: its image is pushed by digest and
    unsigned, both tags still name the earlier, signed image, the record does not list it; once the authority is up,
    publishing again signs it and only then moves the tags."""
    from pipelines.core.errors import TimestampUnavailable
    from pipelines.oci.images import pinned_tag, publish_image
    from pipelines.publish.oci import RegistryRef
    from pipelines.store.published import publications_path

    private, public, settings = registered_signed(repo, tmp_path)
    pub = serialization.load_pem_public_key(public.read_bytes())
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    down = f"http://127.0.0.1:{free_port()}/tsr"
    reg = start_registry(tmp_path / "registry")
    try:
        base = f"http://{reg.host}"
        target = RegistryRef(reg.host, "modelmint", insecure=True)
        with serve_tsa(tmp_path / "tsa") as tsa:
            first = publish_image(repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_TSA_URL=tsa.url), REF, target)
            newer = register(settings, candidate(settings, tmp_path / "build-2", seed=1)).manifest
            repo.commit_all("register tiny-qwen2:q4_k_m again")
            tags = [pinned_tag(newer), newer.tag]
            assert tags == first.tags
            record = publications_path(settings, newer.name, newer.tag).read_bytes()

            with pytest.raises(TimestampUnavailable, match="cannot be reached") as err:
                publish_image(repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_TSA_URL=down), REF, target)
            assert [_tag(base, t) for t in tags] == [first.digest, first.digest]  # no tag moved
            assert f"{reg.host}/{NAME}:q4_k_m still names {first.digest}" in err.value.message
            assert "nothing was registered" not in err.value.message
            assert "no tag was moved" in err.value.message
            again = f"modelmint publish {REF} --registry {reg.host}/modelmint --insecure"
            assert f"`{again}`" in (err.value.hint or "") and "MODELMINT_TSA_URL" in (err.value.hint or "")
            assert publications_path(settings, newer.name, newer.tag).read_bytes() == record
            # the earlier image still verifies as cosign checks it, timestamp included
            verify_signature(base, NAME, first.digest, pub, tsa_root=tsa.root)

            done = publish_image(repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_TSA_URL=tsa.url), REF, target)
            assert done.digest != first.digest and sorted(done.tagged) == sorted(tags)
            assert done.retagged == {t: first.digest for t in tags}
            assert [_tag(base, t) for t in tags] == [done.digest, done.digest]
            payload = verify_signature(base, NAME, done.digest, pub, tsa_root=tsa.root)
            assert payload["critical"]["image"]["docker-manifest-digest"] == done.digest
    finally:
        reg.stop()


def test_a_first_publish_with_the_timestamp_authority_down_tags_nothing_and_says_what_to_run(
    repo: Repo, tmp_path: Path
) -> None:
    """`modelmint publish` with the authority down: one error naming it and the command to run again, no
    traceback, no tag and no signature in the registry; run again with the authority up, the image is tagged and
    its signature verifies."""
    private, public, _ = registered_signed(repo, tmp_path)
    pub = serialization.load_pem_public_key(public.read_bytes())
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    reg = start_registry(tmp_path / "registry")
    try:
        base = f"http://{reg.host}"
        argv = [sys.executable, "-m", "pipelines.cli", "publish", REF, "--registry", f"{reg.host}/modelmint",
                "--insecure"]
        env = {**repo.env(), "COLUMNS": "1000", "MODELMINT_SIGNING_KEY": str(private),
               "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        down = f"http://127.0.0.1:{free_port()}/tsr"
        failed = subprocess.run(argv, env={**env, "MODELMINT_TSA_URL": down}, capture_output=True, text=True,
                                cwd=repo.root)
        assert failed.returncode != 0 and "Traceback" not in failed.stderr
        assert _tag(base, "q4_k_m") is None
        listed = httpx.get(f"{base}/v2/{NAME}/tags/list").json().get("tags") or []
        assert not [t for t in listed if t.startswith("q4_k_m")]  # neither TAG nor TAG-<source12>
        assert not [t for t in listed if t.endswith(".sig")]
        assert down in failed.stderr and "is not in the registry" in failed.stderr
        assert f"modelmint publish {REF} --registry {reg.host}/modelmint --insecure" in failed.stderr

        with serve_tsa(tmp_path / "tsa") as tsa:
            ok = subprocess.run(argv, env={**env, "MODELMINT_TSA_URL": tsa.url}, capture_output=True, text=True,
                                cwd=repo.root)
            assert ok.returncode == 0, ok.stderr
            digest = _tag(base, "q4_k_m")
            assert digest is not None
            listed = httpx.get(f"{base}/v2/{NAME}/tags/list").json()["tags"]
            assert len([t for t in listed if t.startswith("q4_k_m")]) == 2
            verify_signature(base, NAME, digest, pub, tsa_root=tsa.root)
    finally:
        reg.stop()
