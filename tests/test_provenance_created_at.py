"""A manifest's created_at is the time its signed provenance records (finishedOn), and that time agrees with the
signature's RFC 3161 timestamp: an edited created_at is refused by pull and verify with both values, a statement
timed long before or after its timestamp is refused, a re-registration still verifies, and a manifest signed before
created_at was bound is read with a warning (real git + DVC repositories, real keys, a real `openssl ts` TSA on
127.0.0.1, the real CLI)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from registry_env import Repo, candidate
from test_provenance_bound import MANIFEST, REF, _edit, _refused, signed  # noqa: F401 (a fixture)
from test_signing import _key
from test_trust_timestamped_signing import _policy, _register
from tsa_server import serve_tsa

from pipelines.core.errors import SignatureRefused
from pipelines.registry.register import artifact_dir, register
from pipelines.registry.verify import verify_remote
from pipelines.store.manifest import Manifest, load_manifest, manifest_path
from pipelines.trust import provenance, signing
from pipelines.trust.policy import load_policy

CODE = str(Path(provenance.__file__).resolve().parents[2])
"""The modelmint under test (the CLI runs in a registry checkout elsewhere: it must import this one)."""


def _finished_on(directory: Path) -> str:
    stmt = json.loads((directory / provenance.PROVENANCE).read_text())
    return str(stmt["predicate"]["runDetails"]["metadata"]["finishedOn"])


def _bound_created_at(directory: Path) -> object:
    """The created_at the signed statement's manifest fields hold ("nothing": none)."""
    stmt = json.loads((directory / provenance.PROVENANCE).read_text())
    (fields,) = [b for b in stmt["predicate"]["runDetails"]["byproducts"] if b["name"] == "manifest"]
    return fields["annotations"].get("created_at", "nothing")


def test_the_manifests_created_at_is_the_signed_time(signed: Repo) -> None:  # noqa: F811
    directory = artifact_dir(signed.settings(), "tiny-qwen2", "q4_k_m")
    manifest = json.loads((signed.root / MANIFEST).read_text())
    assert _bound_created_at(directory) == manifest["created_at"] == _finished_on(directory)


def test_a_backdated_created_at_is_refused_by_pull_and_verify_with_both_values(
    signed: Repo, tmp_path: Path  # noqa: F811
) -> None:
    directory = artifact_dir(signed.settings(), "tiny-qwen2", "q4_k_m")
    when = _finished_on(directory)

    def forge(m: dict[str, Any]) -> None:
        m["created_at"] = "2020-01-01T00:00:00Z"

    _edit(signed, forge)
    said = _refused(signed, tmp_path)
    assert f"created_at: the manifest records 2020-01-01T00:00:00Z, the signed provenance {when}" in said
    # `modelmint verify` on the command line: one refusal naming the field, no traceback
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "verify", REF],
        env={**signed.env(), "COLUMNS": "400", "PYTHONPATH": CODE}, capture_output=True, text=True,
        cwd=signed.root, timeout=300,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"created_at: the manifest records 2020-01-01T00:00:00Z, the signed provenance {when}" in done.stderr


def test_a_registration_placed_and_signed_again_still_verifies(repo: Repo, tmp_path: Path) -> None:
    """Registered unpushed, then registered again (the artifact placed and signed again, the manifest's record of it
    kept): the manifest's created_at is the new signature's time, and it verifies."""
    private, public = _key(tmp_path / "signing.pem")
    settings = repo.settings(MODELMINT_SIGNING_KEY=private)
    c = candidate(settings, tmp_path / "build")
    register(settings, c, push=False)
    first = load_manifest(manifest_path(settings, "tiny-qwen2", "q4_k_m"))
    again = register(settings, c)
    assert again.manifest.dvc.pushed and again.manifest.key == first.key
    directory = artifact_dir(settings, "tiny-qwen2", "q4_k_m")
    written = again.manifest.created_at.isoformat().replace("+00:00", "Z")
    assert _bound_created_at(directory) == written == _finished_on(directory)
    from test_signing import _policy_for

    _policy_for(repo, public)
    repo.commit_all("register tiny-qwen2:q4_k_m again, signed")
    result = verify_remote(repo.settings(), [REF])
    assert result.ok, result.artifacts[0].problems


def _resign(
    repo: Repo, directory: Path, m: Manifest, private: Path, tsa_url: str, change: Callable[[dict[str, Any]], None]
) -> Manifest:
    """What a holder of the signing key can do: change the provenance (`change`), sign it again with a fresh
    timestamp, and write a manifest whose files and created_at match."""
    path = directory / provenance.PROVENANCE
    stmt = json.loads(path.read_text())
    change(stmt)
    for b in stmt["predicate"]["runDetails"]["byproducts"]:
        if b["name"] == provenance.MANIFEST_BYPRODUCT:
            b["digest"]["sha256"] = provenance.canonical_sha256(b["annotations"])
    path.write_text(json.dumps(stmt, indent=2, sort_keys=True) + "\n")
    signing.sign_directory(signing.SigningKey(private, tsa=tsa_url), directory, name=REF)
    files = []
    for f in m.files:
        if f.path in (provenance.PROVENANCE, signing.SIGNATURE):
            data = (directory / f.path).read_bytes()
            f = f.model_copy(update={"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
        files.append(f)
    return m.model_copy(update={"files": files, "created_at": provenance.signed_at(stmt)})


def _timed(when: str) -> Callable[[dict[str, Any]], None]:
    def change(stmt: dict[str, Any]) -> None:
        stmt["predicate"]["runDetails"]["metadata"]["finishedOn"] = when
        for b in stmt["predicate"]["runDetails"]["byproducts"]:
            if b["name"] == provenance.MANIFEST_BYPRODUCT:
                b["annotations"]["created_at"] = when

    return change


def _z(t: datetime) -> str:
    return t.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def test_a_signed_time_long_before_or_after_its_timestamp_is_refused(repo: Repo, tmp_path: Path) -> None:
    private, public = _key(tmp_path / "signing.pem")
    with serve_tsa(tmp_path / "tsa") as tsa:
        directory, m = _register(repo, tmp_path, private, tsa)
        _policy(repo, key=public, tsa=tsa.root)
        policy = load_policy(repo.settings())
        signed_at = provenance.signed_at(json.loads((directory / provenance.PROVENANCE).read_text()))
        # as registered: the written time is the timestamp's or just before it
        verified = signing.verify_directory(directory, m, policy, shown="m.json")
        assert verified.timestamped_at is not None and verified.signed_at == m.created_at
        assert verified.timestamped_at - signing.SIGNING_TOLERANCE <= m.created_at <= verified.timestamped_at
        assert not verified.warnings

        # re-signed by the key's holder with a backdated time, and timestamped now: refused, both times in full
        backdated = _z(signed_at - timedelta(days=400))
        forged = _resign(repo, directory, m, private, tsa.url, _timed(backdated))
        with pytest.raises(SignatureRefused) as err:
            signing.verify_directory(directory, forged, policy, shown="m.json")
        assert f"says it was signed at {backdated} (finishedOn, the manifest's created_at)" in err.value.message
        assert "team-tsa timestamped the signature at 20" in err.value.message
        assert "more than 10 minutes before the timestamp" in err.value.message
        assert err.value.file == provenance.PROVENANCE

        # a time after its timestamp: refused too
        ahead = _z(datetime.now(signed_at.tzinfo) + timedelta(hours=1))
        forged = _resign(repo, directory, m, private, tsa.url, _timed(ahead))
        with pytest.raises(SignatureRefused, match="the written time is after the timestamp"):
            signing.verify_directory(directory, forged, policy, shown="m.json")

        # a few minutes early (a slow signing, a clock a little behind): within the stated tolerance, accepted
        early = _z(datetime.now(signed_at.tzinfo) - timedelta(minutes=3))
        forged = _resign(repo, directory, m, private, tsa.url, _timed(early))
        assert signing.verify_directory(directory, forged, policy, shown="m.json").signer == "release"


def test_a_statement_signed_before_created_at_was_bound_is_read_with_a_warning(repo: Repo, tmp_path: Path) -> None:
    """An older statement (its manifest fields without created_at): the manifest's created_at cannot be checked, so
    it verifies, and says so."""
    private, public = _key(tmp_path / "signing.pem")
    with serve_tsa(tmp_path / "tsa") as tsa:
        directory, m = _register(repo, tmp_path, private, tsa)
        _policy(repo, key=public, tsa=tsa.root)

        def older(stmt: dict[str, Any]) -> None:
            for b in stmt["predicate"]["runDetails"]["byproducts"]:
                if b["name"] == provenance.MANIFEST_BYPRODUCT:
                    del b["annotations"]["created_at"]

        legacy = _resign(repo, directory, m, private, tsa.url, older)
    legacy = legacy.model_copy(update={"created_at": legacy.created_at + timedelta(seconds=40)})
    verified = signing.verify_directory(directory, legacy, load_policy(repo.settings()), shown="m.json")
    assert verified.signer == "release"
    (warning,) = verified.warnings
    assert "not covered by its signature" in warning and "register it again" in warning
