"""`reproduce` rebuilds from nothing and from a checked provenance: a tampered provenance is refused before any build
work, and a reproduction in the very checkout whose work directory holds the build still runs the tools and says
which ran, on which builder, for how long (real git + DVC repositories, real keys, the real toolchain)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from registry_env import Repo, git
from test_provenance_bound import signed  # noqa: F401  (the fixture)
from test_signing import _key, _trust

from pipelines.registry.register import artifact_dir
from pipelines.trust import provenance, signing

MODELMINT = [sys.executable, "-m", "pipelines.cli"]
CODE = str(Path(provenance.__file__).resolve().parents[2])
"""The modelmint under test (the CLI is run from a registry checkout elsewhere: it must import this one)."""
REF = "tiny-qwen2:q4_k_m"


def _cli(repo: Repo, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MODELMINT, *args], env={**repo.env(), "COLUMNS": "400", "PYTHONPATH": CODE, **env}, capture_output=True, text=True,
        cwd=repo.root, timeout=600,
    )


def test_reproduce_refuses_a_provenance_edited_in_the_checkout_before_any_build_work(
    signed: Repo, tmp_path: Path  # noqa: F811
) -> None:
    directory = artifact_dir(signed.settings(), "tiny-qwen2", "q4_k_m")
    stmt = json.loads((directory / provenance.PROVENANCE).read_text())
    stmt["predicate"]["buildDefinition"]["externalParameters"]["catalog_entry"]["source"] = {"generated": "evil"}
    (directory / provenance.PROVENANCE).write_text(json.dumps(stmt, indent=2, sort_keys=True) + "\n")
    second, _ = _key(tmp_path / "second.pem")
    done = _cli(signed, "reproduce", REF, MODELMINT_SIGNING_KEY=str(second))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{provenance.PROVENANCE} differs from what was signed" in done.stderr
    assert not (signed.work / "reproduce").exists()
    assert not (signed.root / "registry" / "attestations").exists()


@pytest.mark.slow
def test_reproduce_in_the_checkout_that_built_it_rebuilds_from_nothing_and_records_what_ran(
    repo: Repo, tmp_path: Path
) -> None:
    """The registering checkout's work directory holds the build (every step's output and receipt): the
    reproduction must not take them, but run the converter and the quantizer again in a directory of its own."""
    from pipelines.compose import run_model
    from pipelines.source.catalog import load_catalog
    from pipelines.store.formats import FORMATS

    first, first_pub = _key(tmp_path / "first.pem")
    second, second_pub = _key(tmp_path / "second.pem")
    settings = repo.settings(MODELMINT_SIGNING_KEY=first)
    entry = load_catalog(settings.catalog_path).get("tiny-qwen2")
    run = run_model(entry, settings, [(FORMATS["gguf"], ["q4_k_m"])], register=True).runs[0]
    assert run.failure() is None and run.registered == {"q4_k_m": REF}
    keys = repo.root / "registry" / "keys"
    keys.mkdir()
    shutil.copy(first_pub, keys / "first.pub")
    shutil.copy(second_pub, keys / "second.pub")
    _trust(
        repo,
        "keys:\n  first: {public_key: keys/first.pub}\n  second: {public_key: keys/second.pub}\n"
        "models:\n  '*': {keys: [first, second]}\n",
    )
    repo.commit_all("register tiny-qwen2:q4_k_m, signed")
    done = _cli(repo, "reproduce", REF, MODELMINT_SIGNING_KEY=str(second))
    assert done.returncode == 0, done.stderr
    (path,) = (repo.root / "registry" / "attestations" / "tiny-qwen2" / "q4_k_m").glob("reproduced-*.json")
    pred = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))["predicate"]
    rebuild = pred["rebuild"]
    ran = {t["name"]: t["runs"] for t in rebuild["tools"]}
    assert "llama-quantize" in ran and "convert_hf_to_gguf.py" in ran, ran
    assert rebuild["machine"]["cpus"] and rebuild["machine"]["arch"]
    assert rebuild["seconds"] > 0 and rebuild["startedOn"] <= rebuild["finishedOn"]
    assert pred["reproducedBy"]["builder"] == provenance.builder_id(signing.SigningKey(second))
    # the rebuild had a work directory of its own, under the checkout's
    (fresh,) = (repo.work / "reproduce" / "runs").iterdir()
    assert any(fresh.joinpath("work").rglob("*.gguf"))
    assert git(repo.root, "status", "--porcelain", "registry/manifests") == ""


def test_show_provenance_prints_only_a_statement_whose_signature_checks(signed: Repo) -> None:  # noqa: F811
    shown = _cli(signed, "show", REF, "--provenance")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["predicate"]["buildDefinition"]["externalParameters"]["artifact"] == REF
    directory = artifact_dir(signed.settings(), "tiny-qwen2", "q4_k_m")
    stmt = json.loads((directory / provenance.PROVENANCE).read_text())
    stmt["predicate"]["buildDefinition"]["externalParameters"]["recipe"]["quant"] = "q8_0"
    (directory / provenance.PROVENANCE).write_text(json.dumps(stmt, indent=2, sort_keys=True) + "\n")
    refused = _cli(signed, "show", REF, "--provenance")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"{provenance.PROVENANCE} differs from what was signed" in refused.stderr
    assert "q8_0" not in refused.stdout
