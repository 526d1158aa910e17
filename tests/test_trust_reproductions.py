"""A rule's `reproductions: N` accepts a signed artifact only with N reproduced-by attestations of its files, each
by another key of the rule than its signer's and than each other's; a bad count is refused by line (real git + DVC
repositories, real keys, the real CLI)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from registry_env import Repo, candidate, git
from test_signing import REF, _key, _trust

from pipelines.core.errors import SignatureRefused, TrustPolicyInvalid
from pipelines.registry.pull import pull
from pipelines.registry.register import artifact_dir, register
from pipelines.registry.reproduce import attest
from pipelines.store.manifest import find_manifest
from pipelines.trust.policy import load_policy
from pipelines.trust.signing import SigningKey

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture
def keyed(repo: Repo, tmp_path: Path) -> tuple[Repo, dict[str, Path]]:
    """tiny-qwen2:q4_k_m registered and signed by `release`; keys release, b, c, d (private key paths) all public
    under registry/keys/, committed; no trust policy yet."""
    keys = {n: _key(tmp_path / f"{n}.pem") for n in ("release", "b", "c", "d")}
    settings = repo.settings(MODELMINT_SIGNING_KEY=keys["release"][0])
    register(settings, candidate(settings, tmp_path / "build"))
    (repo.root / "registry" / "keys").mkdir()
    for n, (_, pub) in keys.items():
        shutil.copy(pub, repo.root / "registry" / "keys" / f"{n}.pub")
    return repo, {n: private for n, (private, _) in keys.items()}


def _policy(repo: Repo, rule: str) -> None:
    _trust(
        repo,
        "keys:\n" + "".join(f"  {n}: {{public_key: keys/{n}.pub}}\n" for n in ("release", "b", "c", "d"))
        + f"models:\n  '*': {rule}\n",
    )


def _reproduce_with(repo: Repo, key: Path) -> Path:
    """What `modelmint reproduce` writes when its rebuild matches: an attestation signed with `key`."""
    settings = repo.settings()
    return attest(settings, find_manifest(settings, REF), artifact_dir(settings, "tiny-qwen2", "q4_k_m"),
                  SigningKey(key))


def _keyid16(repo: Repo, name: str) -> str:
    from pipelines.trust.signing import _public_keyid

    return _public_keyid(repo.root / "registry" / "keys" / f"{name}.pub")[:16]


def _pull(repo: Repo, tmp_path: Path, name: str) -> None:
    """Pull into a fresh clone of the committed checkout (what another machine sees)."""
    git(tmp_path, "clone", "-q", str(repo.root), name)
    clone = Repo(tmp_path / name, repo.remote, tmp_path / f"{name}-work")
    pull(clone.settings(), REF, ollama=False)


def test_reproductions_by_the_signer_or_one_key_twice_do_not_count_and_the_refusal_says_what_to_run(
    keyed: tuple[Repo, dict[str, Path]], tmp_path: Path
) -> None:
    repo, keys = keyed
    _policy(repo, "{keys: [release, b, c, d], reproductions: 2}")
    _reproduce_with(repo, keys["release"])  # the signer attesting its own build
    _reproduce_with(repo, keys["b"])
    repo.commit_all("signed, two reproductions: one by the signer")
    with pytest.raises(SignatureRefused) as err:
        _pull(repo, tmp_path, "one")
    said = err.value.message + "\n" + (err.value.hint or "")
    assert "asks for 2 reproduction(s)" in said and "1 (by key b) verified" in said, said
    assert "(key release): the artifact's own signer" in said
    assert f"`modelmint reproduce {REF}`" in said and "another builder" in said
    assert not (tmp_path / "one" / "artifacts" / "tiny-qwen2" / "q4_k_m").exists()
    # a second copy of b's attestation, and b's key under a second name, are still one key
    (b_attestation,) = [p for p in (repo.root / "registry" / "attestations" / "tiny-qwen2" / "q4_k_m").iterdir()
                        if p.name != f"reproduced-{_keyid16(repo, 'release')}.json"]
    shutil.copy(b_attestation, b_attestation.with_name("reproduced-copy.json"))
    shutil.copy(repo.root / "registry" / "keys" / "b.pub", repo.root / "registry" / "keys" / "b2.pub")
    _trust(repo, (repo.root / "registry" / "trust.yaml").read_text()
           .replace("models:", "  b2: {public_key: keys/b2.pub}\nmodels:").replace("[release,", "[release, b2,"))
    repo.commit_all("b's attestation twice, b's key under a second name")
    with pytest.raises(SignatureRefused, match=r"and 1 \(by key b2?\) verified.*a second one by the same key"):
        _pull(repo, tmp_path, "alias")
    # the CLI says the same, without a traceback
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "pull", REF, "--dest", str(tmp_path / "cli"), "--no-ollama"],
        env={**repo.env(), "PYTHONPATH": str(PROJECT), "COLUMNS": "400"}, capture_output=True, text=True,
        cwd=repo.root, timeout=300,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "asks for 2 reproduction(s)" in done.stderr and f"modelmint reproduce {REF}" in done.stderr
    _reproduce_with(repo, keys["c"])
    repo.commit_all("a third builder reproduced it")
    _pull(repo, tmp_path, "two")
    assert (tmp_path / "two" / "artifacts" / "tiny-qwen2" / "q4_k_m" / "modelmint.sig").is_file()


def test_an_edited_reproduction_does_not_count(
    keyed: tuple[Repo, dict[str, Path]], tmp_path: Path
) -> None:
    repo, keys = keyed
    _policy(repo, "{keys: [release, b], reproductions: 1}")
    path = _reproduce_with(repo, keys["b"])
    repo.commit_all("reproduced by b")
    _pull(repo, tmp_path, "ok")
    # an attestation whose signature does not verify (its payload edited) is not counted
    data = json.loads(path.read_text())
    stmt = json.loads(base64.b64decode(data["payload"]))
    stmt["subject"][0]["digest"]["sha256"] = "0" * 64
    data["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    path.write_text(json.dumps(data))
    repo.commit_all("an edited attestation")
    with pytest.raises(SignatureRefused, match="signed by no key of the rule"):
        _pull(repo, tmp_path, "edited")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0", "greater than or equal to 1"),
        ("-2", "greater than or equal to 1"),
        ("two", "valid integer"),
        ("1.5", "valid integer"),
        ("'2'", "valid integer"),
        ("3", "names only 2 key(s)"),
    ],
)
def test_a_bad_reproductions_count_is_refused_with_its_line(repo: Repo, tmp_path: Path, value: str, said: str) -> None:
    (repo.root / "registry" / "keys").mkdir()
    for n in ("a", "b"):
        shutil.copy(_key(tmp_path / f"{n}.pem")[1], repo.root / "registry" / "keys" / f"{n}.pub")
    _trust(repo, "keys:\n  a: {public_key: keys/a.pub}\n  b: {public_key: keys/b.pub}\nmodels:\n  '*':\n"
                 f"    keys: [a, b]\n    reproductions: {value}\n")
    with pytest.raises(TrustPolicyInvalid) as err:
        load_policy(repo.settings())
    assert "line 7" in err.value.message and said in err.value.message, err.value.message
    assert "reproductions" in err.value.message
