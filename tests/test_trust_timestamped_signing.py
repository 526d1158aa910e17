"""Signatures timestamped by an RFC 3161 Time-Stamp Authority at registration (MODELMINT_TSA_URL), and judged by the
authority's time at verification: real keys and certificates, a real git + DVC registry, a real `openssl ts` TSA on
127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from registry_env import Repo, candidate
from test_signing import _key, _pki, _trust
from tsa_server import Tsa, serve_tsa

from pipelines.core import timestamps
from pipelines.core.errors import SignatureRefused, SigningKeyError, TimestampUnavailable, TrustPolicyInvalid
from pipelines.registry.register import artifact_dir, register
from pipelines.store.manifest import Manifest, load_manifest, manifest_path
from pipelines.trust import signing
from pipelines.trust.policy import load_policy

REF = "tiny-qwen2:q4_k_m"
CODE = str(Path(__file__).resolve().parents[1])
"""The modelmint under test (the CLI runs in a registry checkout elsewhere: it must import this one)."""


def _policy(repo: Repo, *, key: Path, tsa: Path | None, key_extra: str = "") -> None:
    keys = repo.root / "registry" / "keys"
    keys.mkdir(exist_ok=True)
    shutil.copy(key, keys / "release.pub")
    text = f"keys:\n  release:\n    public_key: keys/release.pub\n{key_extra}"
    if tsa is not None:
        shutil.copy(tsa, keys / "tsa-root.pem")
        text += "timestamp_authorities:\n  team-tsa:\n    ca: keys/tsa-root.pem\n"
    _trust(repo, text + "models:\n  '*':\n    keys: [release]\n")


def _register(repo: Repo, tmp_path: Path, private: Path, tsa: Tsa | None, **env: object) -> tuple[Path, Manifest]:
    extra = {"MODELMINT_TSA_URL": tsa.url} if tsa is not None else {}
    settings = repo.settings(MODELMINT_SIGNING_KEY=private, **extra, **env)
    register(settings, candidate(settings, tmp_path / "build"))
    return artifact_dir(settings, "tiny-qwen2", "q4_k_m"), load_manifest(manifest_path(settings, "tiny-qwen2", "q4_k_m"))


def _bundle(directory: Path) -> dict[str, object]:
    return json.loads((directory / signing.SIGNATURE).read_text())  # type: ignore[no-any-return]


def _signature_bytes(bundle: dict[str, object]) -> bytes:
    return base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"])  # type: ignore[index]


def _replace_timestamp(directory: Path, m: Manifest, reply: bytes) -> Manifest:
    """The signature file with another RFC 3161 reply in it, and the manifest recording its new sha256 (what anyone
    who can write the registry could do: the signature file itself is not signed)."""
    bundle = _bundle(directory)
    bundle["verificationMaterial"]["timestampVerificationData"]["rfc3161Timestamps"][0][  # type: ignore[index]
        "signedTimestamp"
    ] = base64.b64encode(reply).decode()
    data = json.dumps(bundle).encode()
    (directory / signing.SIGNATURE).write_bytes(data)
    return _recorded_signature(m, data)


def test_registration_stores_a_timestamp_over_the_signature_and_verification_reports_its_time(
    repo: Repo, tmp_path: Path
) -> None:
    private, public = _key(tmp_path / "signing.pem")
    with serve_tsa(tmp_path / "tsa") as tsa:
        before = datetime.now(UTC).replace(microsecond=0)
        directory, m = _register(repo, tmp_path, private, tsa)
    bundle = _bundle(directory)
    # where sigstore's bundle carries RFC 3161 timestamps: verificationMaterial.timestampVerificationData
    stamps = bundle["verificationMaterial"]["timestampVerificationData"]["rfc3161Timestamps"]  # type: ignore[index]
    assert len(stamps) == 1
    reply = base64.b64decode(stamps[0]["signedTimestamp"])
    assert timestamps.check(reply, _signature_bytes(bundle), [("t", tsa.root)]).time >= before - timedelta(seconds=2)
    _policy(repo, key=public, tsa=tsa.root)
    verified = signing.verify_directory(directory, m, load_policy(repo.settings()), shown="m.json")
    assert verified.signer == "release" and verified.timestamp_authority == "team-tsa"
    assert verified.timestamped_at is not None and verified.timestamped_at >= before - timedelta(seconds=2)
    # `modelmint verify` on the command line says so too
    repo.commit_all("register tiny-qwen2:q4_k_m, signed and timestamped")
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "verify", REF],
        env={**repo.env(), "COLUMNS": "400", "PYTHONPATH": CODE},
        capture_output=True, text=True, cwd=repo.root, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # and a pull says who timestamped it, and when
    done = _cli(repo, "pull", REF, "--dest", str(tmp_path / "pulled"), "--no-ollama")
    assert done.returncode == 0, done.stderr
    assert "signed by release on " in done.stdout and "timestamped by team-tsa at " in done.stdout


def _cli(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        env={**repo.env(), "COLUMNS": "400", "PYTHONPATH": CODE},
        capture_output=True, text=True, cwd=repo.root, timeout=300,
    )


def test_a_timestamp_over_other_bytes_is_refused(repo: Repo, tmp_path: Path) -> None:
    private, public = _key(tmp_path / "signing.pem")
    with serve_tsa(tmp_path / "tsa") as tsa:
        directory, m = _register(repo, tmp_path, private, tsa)
        other = timestamps.request(tsa.url, b"some other signature")
    m = _replace_timestamp(directory, m, other)
    _policy(repo, key=public, tsa=tsa.root)
    with pytest.raises(SignatureRefused, match="timestamp") as err:
        signing.verify_directory(directory, m, load_policy(repo.settings()), shown="m.json")
    assert "over other bytes" in err.value.message and err.value.file == signing.SIGNATURE


def test_a_timestamp_by_an_authority_the_policy_does_not_name_is_refused(repo: Repo, tmp_path: Path) -> None:
    private, public = _key(tmp_path / "signing.pem")
    with serve_tsa(tmp_path / "tsa") as tsa, serve_tsa(tmp_path / "elsewhere", "someone else's tsa") as elsewhere:
        directory, m = _register(repo, tmp_path, private, elsewhere)
    _policy(repo, key=public, tsa=tsa.root)
    with pytest.raises(SignatureRefused, match="by no timestamp authority the trust policy accepts"):
        signing.verify_directory(directory, m, load_policy(repo.settings()), shown="m.json")
    # `modelmint verify` refuses it too: one error naming the cause and what to do, no traceback
    repo.commit_all("register tiny-qwen2:q4_k_m, timestamped elsewhere")
    done = _cli(repo, "verify", REF)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "its RFC 3161 timestamp does not hold" in done.stderr, done.stderr
    assert "timestamp_authorities" in done.stderr, done.stderr
    # a timestamp and no authority in the policy to check it against: refused too, naming the setting
    _policy(repo, key=public, tsa=None)
    with pytest.raises(SignatureRefused, match="timestamp_authorities"):
        signing.verify_directory(directory, m, load_policy(repo.settings()), shown="m.json")


def test_a_key_retired_after_the_timestamp_keeps_what_it_signed(repo: Repo, tmp_path: Path) -> None:
    """Retirement is judged at the authority's time (genTime); an untimestamped signature at verification time (its
    own finishedOn is the signer's claim)."""
    private, public = _key(tmp_path / "signing.pem")
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date()
    with serve_tsa(tmp_path / "tsa") as tsa:
        directory, m = _register(repo, tmp_path, private, tsa)
    _policy(repo, key=public, tsa=tsa.root, key_extra=f"    retired: {tomorrow}\n")
    policy = load_policy(repo.settings())
    stamped = signing.verify_directory(directory, m, policy, shown="m.json").timestamped_at
    assert stamped is not None
    later = datetime.now(UTC) + timedelta(days=3)
    assert signing.verify_directory(directory, m, policy, shown="m.json", now=later).signer == "release"
    # retired on the timestamp's day: refused, judged at the authority's time
    _policy(repo, key=public, tsa=tsa.root, key_extra=f"    retired: {stamped.date()}\n")
    with pytest.raises(SignatureRefused, match=rf"it was timestamped on {stamped.date()} by team-tsa, signed by key"):
        signing.verify_directory(directory, m, load_policy(repo.settings()), shown="m.json")
    # the same artifact signed again without a timestamp: judged now (three days on), after the retirement
    signing.sign_directory(signing.SigningKey(private), directory, name=REF)
    m = _replace_timestamp_free(directory, m)
    with pytest.raises(SignatureRefused, match=f"retired on {tomorrow}") as err:
        signing.verify_directory(directory, m, policy, shown="m.json", now=later)
    assert "no trusted timestamp" in err.value.message


def test_a_revoked_key_is_refused_though_the_authority_timestamped_it_before_the_revocation(
    repo: Repo, tmp_path: Path
) -> None:
    """A revoked key (lost or compromised) refuses every signature, whatever date it claims or is timestamped at:
    the timestamp shows the signature existed then, not that the key's rightful holder made it."""
    private, public = _key(tmp_path / "signing.pem")
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date()
    with serve_tsa(tmp_path / "tsa") as tsa:
        directory, m = _register(repo, tmp_path, private, tsa)
    _policy(repo, key=public, tsa=tsa.root, key_extra=f"    revoked: {tomorrow}\n")
    policy = load_policy(repo.settings())
    # before the revocation day the key is not revoked yet
    verified = signing.verify_directory(directory, m, policy, shown="m.json")
    assert verified.signer == "release" and verified.timestamped_at is not None
    assert verified.timestamped_at.date() < tomorrow  # a valid timestamp from before the revocation
    # from the revocation day on it is refused, timestamp or not, naming the day and the timestamp
    later = datetime.now(UTC) + timedelta(days=3)
    with pytest.raises(SignatureRefused, match=f"revoked on {tomorrow}") as err:
        signing.verify_directory(directory, m, policy, shown="m.json", now=later)
    assert "whatever date it claims or is timestamped at" in err.value.message
    assert "team-tsa timestamped this one on " in err.value.message and err.value.file == signing.SIGNATURE
    # signed again without a timestamp: refused the same way
    signing.sign_directory(signing.SigningKey(private), directory, name=REF)
    m = _replace_timestamp_free(directory, m)
    with pytest.raises(SignatureRefused, match=f"revoked on {tomorrow}"):
        signing.verify_directory(directory, m, policy, shown="m.json", now=later)


def _recorded_signature(m: Manifest, data: bytes) -> Manifest:
    """`m` recording the signature file's new bytes `data` (its sha256 and size), the other files as they were."""
    return m.model_copy(update={"files": [
        f.model_copy(update={"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
        if f.path == signing.SIGNATURE else f
        for f in m.files
    ]})


def _replace_timestamp_free(directory: Path, m: Manifest) -> Manifest:
    data = (directory / signing.SIGNATURE).read_bytes()
    assert b"timestampVerificationData" not in data or b"rfc3161Timestamps" not in data
    return _recorded_signature(m, data)


def test_a_certificate_expired_now_but_valid_at_the_timestamp_passes(repo: Repo, tmp_path: Path) -> None:
    now = datetime.now(UTC)
    key, chain, root = _pki(tmp_path, start=now - timedelta(days=30), end=now + timedelta(days=1))
    with serve_tsa(tmp_path / "tsa") as tsa:
        directory, m = _register(repo, tmp_path, key, tsa, MODELMINT_SIGNING_CERT=chain)
    keys = repo.root / "registry" / "keys"
    keys.mkdir(exist_ok=True)
    shutil.copy(root, keys / "root.pem")
    shutil.copy(tsa.root, keys / "tsa-root.pem")
    _trust(
        repo,
        "keys:\n  ci:\n    ca: keys/root.pem\n    identity: modelmint-ci\n"
        "timestamp_authorities:\n  team-tsa:\n    ca: keys/tsa-root.pem\n"
        "models:\n  tiny-*:\n    keys: [ci]\n",
    )
    policy = load_policy(repo.settings())
    later = now + timedelta(days=3)  # the certificate has expired by then
    verified = signing.verify_directory(directory, m, policy, shown="m.json", now=later)
    assert verified.signer == "ci" and verified.timestamp_authority == "team-tsa"
    # without the timestamp the same signature is judged at verification time: expired
    signing.sign_directory(signing.SigningKey(key, chain), directory, name=REF)
    m = _replace_timestamp_free(directory, m)
    with pytest.raises(SignatureRefused, match="expired") as err:
        signing.verify_directory(directory, m, policy, shown="m.json", now=later)
    assert "no trusted timestamp" in err.value.message


def test_a_timestamp_authority_that_is_down_stops_registration_naming_it(repo: Repo, tmp_path: Path) -> None:
    private, _ = _key(tmp_path / "signing.pem")
    with serve_tsa(tmp_path / "tsa") as tsa:
        url = tsa.url
    settings = repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_TSA_URL=url)
    with pytest.raises(TimestampUnavailable, match="cannot be reached") as err:
        register(settings, candidate(settings, tmp_path / "build"))
    assert "MODELMINT_TSA_URL" in (err.value.hint or "")
    assert not manifest_path(settings, "tiny-qwen2", "q4_k_m").exists()
    assert not artifact_dir(settings, "tiny-qwen2", "q4_k_m").exists()


def test_a_timestamp_authority_whose_root_is_not_there_is_refused_with_its_line(repo: Repo, tmp_path: Path) -> None:
    _, public = _key(tmp_path / "signing.pem")
    _policy(repo, key=public, tsa=None)
    text = (repo.root / "registry" / "trust.yaml").read_text()
    _trust(repo, text.replace("models:", "timestamp_authorities:\n  team-tsa:\n    ca: keys/nowhere.pem\nmodels:"))
    with pytest.raises(TrustPolicyInvalid, match=r"line 5: timestamp_authorities.team-tsa: .*nowhere.pem is not there"):
        load_policy(repo.settings())
    _trust(repo, text.replace("models:", "timestamp_authorities:\n  team-tsa:\n    root: keys/release.pub\nmodels:"))
    with pytest.raises(TrustPolicyInvalid, match=r"line 6: timestamp_authorities.team-tsa: unknown key 'root'"):
        load_policy(repo.settings())


@pytest.mark.parametrize("url", ["tsa.example.com:318", "ftp://tsa.example.com/tsr", "http://"])
def test_a_timestamp_authority_url_that_is_not_one_is_refused_before_any_build_work(
    repo: Repo, tmp_path: Path, url: str
) -> None:
    private, _ = _key(tmp_path / "signing.pem")
    with pytest.raises(SigningKeyError, match=r"MODELMINT_TSA_URL .* is not an http\(s\) URL") as err:
        signing.preflight(repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_TSA_URL=url))
    assert "unset it to sign without a timestamp" in (err.value.hint or "")


def test_a_timestamp_authority_without_a_signing_key_is_refused_before_any_build_work(repo: Repo) -> None:
    with pytest.raises(SigningKeyError, match="MODELMINT_TSA_URL is set but MODELMINT_SIGNING_KEY is not"):
        signing.preflight(repo.settings(MODELMINT_TSA_URL="http://127.0.0.1:9/tsr"))
