"""The trust policy fails closed: a signed artifact without a policy is refused, the policy can live outside the
checkout (MODELMINT_TRUST), CI can require a signature; a policy with a bad date or a key given twice is refused by
line; a certificate file without its chain is refused before the build; the signature names the artifact."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from registry_env import Repo, candidate
from test_signing import REF, _key, _pki, _policy_for, _trust

from pipelines.core.errors import SignatureRefused, SigningKeyError, TrustPolicyInvalid
from pipelines.registry.pull import pull
from pipelines.registry.register import artifact_dir, register
from pipelines.store.manifest import load_manifest, manifest_path
from pipelines.trust import signing
from pipelines.trust.policy import load_policy

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture
def signed(repo: Repo, tmp_path: Path) -> tuple[Repo, Path]:
    """tiny-qwen2:q4_k_m registered and signed, under a policy naming its key `release`; (repo, public key)."""
    private, public = _key(tmp_path / "signing.pem")
    settings = repo.settings(MODELMINT_SIGNING_KEY=private)
    register(settings, candidate(settings, tmp_path / "build"))
    _policy_for(repo, public)
    repo.commit_all("register tiny-qwen2:q4_k_m, signed")
    return repo, public


def _cli(repo: Repo, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        env={**repo.env(), "PYTHONPATH": str(PROJECT), "COLUMNS": "400", **env},
        capture_output=True,
        text=True,
        cwd=repo.root,
        timeout=300,
    )


def test_a_signed_artifact_with_no_trust_policy_is_refused(signed: tuple[Repo, Path], tmp_path: Path) -> None:
    """Without a policy any key's signature would pass: refused, not a warning."""
    repo, _ = signed
    (repo.root / "registry" / "trust.yaml").unlink()
    repo.commit_all("no trust policy")
    done = _cli(repo, "pull", REF, "--dest", str(tmp_path / "out"), "--no-ollama")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no trust policy" in done.stderr and "MODELMINT_TRUST" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_modelmint_trust_is_read_instead_of_the_checkouts_policy(signed: tuple[Repo, Path], tmp_path: Path) -> None:
    repo, public = signed
    outside = tmp_path / "outside"
    outside.mkdir()
    _, other = _key(outside / "other.pem")
    (outside / "trust.yaml").write_text(f"keys:\n  team:\n    public_key: {other.name}\nmodels:\n  '*':\n    keys: [team]\n")
    # the checkout's policy accepts the signer; the team's policy outside it does not, and is the one read
    with pytest.raises(SignatureRefused, match="by no key") as err:
        pull(repo.settings(MODELMINT_TRUST=outside / "trust.yaml"), REF, dest=tmp_path / "a", ollama=False)
    assert "team" in err.value.message
    assert not (tmp_path / "a").exists()
    (outside / "release.pub").write_bytes(public.read_bytes())
    (outside / "trust.yaml").write_text("keys:\n  release:\n    public_key: release.pub\nmodels:\n  '*':\n    keys: [release]\n")
    done = pull(repo.settings(MODELMINT_TRUST=outside / "trust.yaml"), REF, dest=tmp_path / "b", ollama=False)
    assert done.verified is not None and done.verified.signer == "release"
    # a policy file that is not there is never read as "no policy"
    with pytest.raises(TrustPolicyInvalid, match=r"MODELMINT_TRUST names .*gone\.yaml, which is not there"):
        load_policy(repo.settings(MODELMINT_TRUST=outside / "gone.yaml"))


def test_require_signature_refuses_an_unsigned_artifact_the_policy_allows(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    register(settings, candidate(settings, tmp_path / "build"))
    _, public = _key(tmp_path / "k.pem")
    _policy_for(repo, public)
    _trust(repo, (repo.root / "registry" / "trust.yaml").read_text() + "    unsigned: allow\n")
    directory = artifact_dir(settings, "tiny-qwen2", "q4_k_m")
    m = load_manifest(manifest_path(settings, "tiny-qwen2", "q4_k_m"))
    assert signing.verify_directory(directory, m, load_policy(settings), shown="m.json").signer is None
    with pytest.raises(SignatureRefused, match=r"not signed .* a signature is required"):
        signing.verify_directory(directory, m, load_policy(settings), shown="m.json", require_signature=True)
    with pytest.raises(SignatureRefused, match="a signature is required"):
        signing.verify_directory(
            directory, m, load_policy(settings), shown="m.json", allow_unsigned=True, require_signature=True
        )


def test_a_date_that_is_not_one_is_refused_naming_the_file_and_line(signed: tuple[Repo, Path]) -> None:
    repo, _ = signed
    path = _trust(
        repo,
        "keys:\n  release:\n    public_key: keys/release.pub\n    retired: 2027-13-01\n"
        "models:\n  '*':\n    keys: [release]\n",
    )
    with pytest.raises(TrustPolicyInvalid) as err:
        load_policy(repo.settings())
    assert str(path) in err.value.message and "line 4" in err.value.message and "retired" in err.value.message
    done = _cli(repo, "pull", REF, "--no-ollama")
    assert done.returncode == 1 and "Traceback" not in done.stderr and "line 4" in done.stderr, done.stderr


def test_a_key_given_twice_is_refused_naming_both_lines(signed: tuple[Repo, Path]) -> None:
    """YAML keeps the second of two equal keys: a second rule with `unsigned: allow` would win unseen."""
    repo, _ = signed
    _trust(
        repo,
        "keys:\n  release:\n    public_key: keys/release.pub\nmodels:\n"
        "  '*':\n    keys: [release]\n  '*':\n    unsigned: allow\n",
    )
    with pytest.raises(TrustPolicyInvalid) as err:
        load_policy(repo.settings())
    assert "lines 5 and 7" in err.value.message and "models.*" in err.value.message


def test_a_certificate_file_without_its_chain_is_refused_before_the_build(repo: Repo, tmp_path: Path) -> None:
    now = datetime.now(UTC)
    key, chain, _ = _pki(tmp_path, start=now - timedelta(days=1), end=now + timedelta(days=30))
    leaf = tmp_path / "leaf-only.pem"
    leaf.write_bytes(x509.load_pem_x509_certificates(chain.read_bytes())[0].public_bytes(serialization.Encoding.PEM))
    with pytest.raises(SigningKeyError) as err:
        signing.preflight(repo.settings(MODELMINT_SIGNING_KEY=key, MODELMINT_SIGNING_CERT=leaf))
    assert "holds only the signing certificate" in err.value.message and "nothing was built" in err.value.message
    assert "intermediate" in (err.value.hint or "")
    assert signing.preflight(repo.settings(MODELMINT_SIGNING_KEY=key, MODELMINT_SIGNING_CERT=chain)) is not None


def test_the_signature_names_the_artifact_not_the_temporary_directory(signed: tuple[Repo, Path]) -> None:
    repo, _ = signed
    sig = artifact_dir(repo.settings(), "tiny-qwen2", "q4_k_m") / signing.SIGNATURE
    payload = json.loads(base64.b64decode(json.loads(sig.read_text())["dsseEnvelope"]["payload"]))
    assert [s["name"] for s in payload["subject"]] == [REF], payload["subject"]


def test_require_signature_on_the_command_line_refuses_an_unsigned_pull_and_publish(
    repo: Repo, tmp_path: Path
) -> None:
    settings = repo.settings()
    register(settings, candidate(settings, tmp_path / "build"))
    _, public = _key(tmp_path / "k.pem")
    _policy_for(repo, public)
    _trust(repo, (repo.root / "registry" / "trust.yaml").read_text() + "    unsigned: allow\n")
    repo.commit_all("unsigned, allowed")
    done = _cli(repo, "pull", REF, "--dest", str(tmp_path / "out"), "--no-ollama", "--require-signature")
    assert done.returncode == 1 and "a signature is required" in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()
    # refused before the registry is asked anything: nothing listens on this port
    done = _cli(repo, "publish", REF, "--registry", "127.0.0.1:9/modelmint", "--insecure", "--require-signature")
    assert done.returncode == 1 and "a signature is required" in done.stderr, done.stdout + done.stderr
