"""The signed provenance binds the whole manifest: an edited recipe, serving plan, parent or figure is refused by pull
and verify naming the field with both values in full; its descriptors, builder and version say what the in-toto and
SLSA specifications ask (real git + DVC repositories, real keys, the real CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from registry_env import Repo, candidate, git
from test_signing import _key, _policy_for

from pipelines.core.errors import SignatureRefused
from pipelines.registry.pull import pull
from pipelines.registry.register import artifact_dir, register
from pipelines.registry.verify import verify_remote
from pipelines.trust import provenance

MODELMINT = [sys.executable, "-m", "pipelines.cli"]
CODE = str(Path(provenance.__file__).resolve().parents[2])
"""The modelmint under test (the CLI is run from a registry checkout elsewhere: it must import this one)."""
REF = "tiny-qwen2:q4_k_m"
MANIFEST = "registry/manifests/tiny-qwen2/q4_k_m.json"


@pytest.fixture
def signed(repo: Repo, tmp_path: Path) -> Repo:
    """tiny-qwen2:q4_k_m registered, signed and pushed, the trust policy naming its key, all committed."""
    private, public = _key(tmp_path / "signing.pem")
    settings = repo.settings(MODELMINT_SIGNING_KEY=private)
    register(settings, candidate(settings, tmp_path / "build"))
    _policy_for(repo, public)
    repo.commit_all("register tiny-qwen2:q4_k_m, signed")
    return repo


def _edit(repo: Repo, change: Any) -> None:
    """Edit the committed manifest's JSON as a text editor would (nothing else changes), and commit it."""
    path = repo.root / MANIFEST
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    repo.commit_all("edit the manifest")


def _refused(repo: Repo, tmp_path: Path) -> str:
    """What a pull into a fresh clone and `verify` of the remote say, both refusing; nothing is placed."""
    clone_dir = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo.root), clone_dir.name)
    clone = Repo(clone_dir, repo.remote, tmp_path / "clone-work")
    with pytest.raises(SignatureRefused) as err:
        pull(clone.settings(), REF, ollama=False)
    assert err.value.file == MANIFEST
    assert not (clone_dir / "artifacts" / "tiny-qwen2" / "q4_k_m").exists()
    result = verify_remote(repo.settings(), [REF])
    assert not result.ok
    (problem,) = result.artifacts[0].problems
    return err.value.message + "\n" + problem


def test_an_edited_recipe_is_refused_though_its_sha256_is_left_as_signed(signed: Repo, tmp_path: Path) -> None:
    def forge(m: dict[str, Any]) -> None:
        m["recipe"]["quant"] = "q8_0"
        m["recipe"]["imatrix"] = True

    _edit(signed, forge)
    said = _refused(signed, tmp_path)
    assert "recipe: the manifest records quant = q8_0, the signed provenance quant = q4_k_m" in said
    assert "recipe: the manifest records imatrix = true, the signed provenance imatrix = nothing" in said


def test_an_edited_serving_plan_is_refused(signed: Repo, tmp_path: Path) -> None:
    def forge(m: dict[str, Any]) -> None:
        m["serving"]["context"] = 999999
        m["serving"]["concurrency"] = 64

    _edit(signed, forge)
    said = _refused(signed, tmp_path)
    assert "serving: the manifest records context = 999999, the signed provenance context = null" in said
    assert "serving: the manifest records concurrency = 64, the signed provenance concurrency = 1" in said


def test_an_edited_parent_is_refused(signed: Repo, tmp_path: Path) -> None:
    def forge(m: dict[str, Any]) -> None:
        m["parent"]["file"] = "tiny-qwen2-bf16.gguf"
        m["parent"]["size"] = 456

    _edit(signed, forge)
    said = _refused(signed, tmp_path)
    assert "parent: the manifest records file = tiny-qwen2-bf16.gguf, the signed provenance file = tiny-qwen2-f16.gguf" in said
    assert "parent: the manifest records size = 456, the signed provenance size = 123" in said


def test_a_differing_figure_is_shown_in_full_on_both_sides(signed: Repo, tmp_path: Path) -> None:
    """The validation block is longer than a line: the member that differs is named, with both values."""
    figures: dict[str, Any] = {}

    def forge(m: dict[str, Any]) -> None:
        figures.update(m["validation"]["figures"])
        m["validation"]["figures"]["same_top_pct"] = 99.5

    _edit(signed, forge)
    said = _refused(signed, tmp_path)
    assert (
        f"validation: the manifest records figures.same_top_pct = 99.5, the signed provenance figures.same_top_pct "
        f"= {figures['same_top_pct']}" in said
    )


def test_verify_on_the_command_line_names_the_edited_field_as_a_signature_refusal(signed: Repo) -> None:
    def forge(m: dict[str, Any]) -> None:
        m["recipe"]["quant"] = "q8_0"

    _edit(signed, forge)
    done = subprocess.run(
        [*MODELMINT, "verify", REF], env={**signed.env(), "COLUMNS": "400", "PYTHONPATH": CODE}, capture_output=True, text=True,
        cwd=signed.root, timeout=300,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "recipe: the manifest records quant = q8_0, the signed provenance quant = q4_k_m" in done.stderr
    # a signature refusal, not damage of the DVC remote: `--repair` (which uploads objects again) is not offered
    assert "the signature check refuses tiny-qwen2:q4_k_m (the DVC remote's objects are intact" in done.stderr
    assert "damaged" not in done.stderr and f"verify {REF} --repair" not in done.stderr


def test_the_statement_binds_the_manifest_and_describes_its_byproducts_and_builder(
    signed: Repo, tmp_path: Path
) -> None:
    directory = artifact_dir(signed.settings(), "tiny-qwen2", "q4_k_m")
    stmt = json.loads((directory / provenance.PROVENANCE).read_text())
    run = stmt["predicate"]["runDetails"]
    # every resource descriptor has a uri or a digest (in-toto ResourceDescriptor: one of uri, digest, content)
    for d in [*run["byproducts"], *stmt["predicate"]["buildDefinition"]["resolvedDependencies"]]:
        assert d.get("uri") or d.get("digest") or d.get("content"), d
    (bound,) = [b for b in run["byproducts"] if b["name"] == "manifest"]
    manifest = json.loads((signed.root / MANIFEST).read_text())
    assert bound["annotations"]["recipe"] == manifest["recipe"]
    assert bound["digest"]["sha256"] == provenance.canonical_sha256(bound["annotations"])
    # modelmint's version is the commit of the checkout that built it, not the package version alone
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(provenance.__file__).resolve().parents[2],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert run["builder"]["version"]["modelmint.commit"] in (head, f"{head}-dirty")
    # the builder is its trust boundary: another key is another builder
    other_key, _ = _key(tmp_path / "other.pem")
    settings = signed.settings(MODELMINT_SIGNING_KEY=other_key)
    register(settings, candidate(settings, tmp_path / "build-other", seed=2))
    other = json.loads((directory / provenance.PROVENANCE).read_text())["predicate"]["runDetails"]["builder"]["id"]
    assert run["builder"]["id"].startswith("urn:modelmint:builder:key:")
    assert other.startswith("urn:modelmint:builder:key:") and other != run["builder"]["id"]


def test_verify_reports_a_refused_signature_as_such_not_as_a_damaged_remote(signed: Repo) -> None:
    """An edit every version of modelmint refuses (a validation figure): the DVC remote's objects are intact, so
    `verify` must not call them damaged nor send the user to `--repair`."""

    def forge(m: dict[str, Any]) -> None:
        m["validation"]["figures"]["mean_kl"] = 0.0001

    _edit(signed, forge)
    done = subprocess.run(
        [*MODELMINT, "verify", REF], env={**signed.env(), "COLUMNS": "400", "PYTHONPATH": CODE}, capture_output=True, text=True,
        cwd=signed.root, timeout=300,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "the signature check refuses tiny-qwen2:q4_k_m" in done.stderr
    assert "figures.mean_kl = 0.0001" in done.stderr
    assert "damaged" not in done.stderr and f"verify {REF} --repair" not in done.stderr


def test_a_revoked_key_is_refused_whatever_date_its_provenance_claims(signed: Repo, tmp_path: Path) -> None:
    """The provenance's finishedOn is the signer's claim: a revoked key's signature without a trusted (RFC 3161)
    timestamp is refused whatever date it claims (tests/test_trust_timestamped_signing.py: with one)."""
    directory = artifact_dir(signed.settings(), "tiny-qwen2", "q4_k_m")
    stmt = json.loads((directory / provenance.PROVENANCE).read_text())
    assert stmt["predicate"]["runDetails"]["metadata"]["finishedOn"]
    keys = "keys:\n  release:\n    public_key: keys/release.pub\n    revoked: 2026-01-01\nmodels:\n  '*':\n    keys: [release]\n"
    (signed.root / "registry" / "trust.yaml").write_text(keys)
    signed.commit_all("revoke the release key")
    clone_dir = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(signed.root), clone_dir.name)
    clone = Repo(clone_dir, signed.remote, tmp_path / "clone-work")
    with pytest.raises(SignatureRefused) as err:
        pull(clone.settings(), REF, ollama=False)
    assert "revoked on 2026-01-01" in err.value.message and "whatever date it claims" in err.value.message
    assert not (clone_dir / "artifacts" / "tiny-qwen2" / "q4_k_m").exists()
    result = verify_remote(signed.settings(), [REF])
    assert not result.ok and "revoked on 2026-01-01" in result.artifacts[0].problems[0]
