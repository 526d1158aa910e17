"""A build's scratch files (the f16 GGUF and its KL reference logits) go once every variant asked for passed its gate,
before registration, unless MODELMINT_KEEP_SCRATCH=1, and a later run that needs them rebuilds them from their
receipts' absence.

The real CLI (`python -m pipelines.cli convert … --register`) on tiny-qwen2 with the pinned llama.cpp, in a real git +
DVC repository with a local remote (tests/registry_env.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from registry_env import Repo, dvc, make_repo

from pipelines.core.steps import receipt_path
from pipelines.store.manifest import find_manifest

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


def _convert(repo: Repo, *variants: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODELMINT, "convert", "tiny-qwen2", "--variants", ",".join(variants), "--register"],
                          env={**repo.env(), "COLUMNS": "200", **env}, capture_output=True, text=True, cwd=repo.root)


def _scratch(repo: Repo) -> list[Path]:
    """Every f16 and reference-logits file (and receipt) under the work dir (each build has its own directory)."""
    return sorted(p for p in repo.work.rglob("tiny-qwen2-f16.*") if p.name.endswith((".gguf", ".kld-base.bin",
                                                                                      ".receipt.json")))


@pytest.mark.slow
def test_the_f16_and_the_logits_go_after_registration_and_a_later_run_rebuilds_them(
    isolated: Path, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path)
    first = _convert(repo, "q8_0")
    assert first.returncode == 0, first.stderr
    assert list((repo.work / "tiny-qwen2").rglob("tiny-qwen2-q8_0.gguf")), "the build directory is not where it was"
    # the files go; their receipts stay, the record of what they were (the manifest's parent, the keys they fed)
    assert [p.name for p in _scratch(repo)] == sorted([receipt_path(Path("tiny-qwen2-f16.gguf")).name,
                                                       receipt_path(Path("tiny-qwen2-f16.kld-base.bin")).name])
    settings = repo.settings()
    q8 = find_manifest(settings, "tiny-qwen2:q8_0")
    # the same run again needs neither: every variant is finished, so nothing is converted or measured again
    again = _convert(repo, "q8_0")
    assert again.returncode == 0, again.stderr
    assert "convert →" not in again.stdout + again.stderr and "validate q8_0" not in again.stdout + again.stderr, (
        again.stdout + again.stderr)
    assert [p.suffix for p in _scratch(repo)] == [".json", ".json"]
    assert find_manifest(settings, "tiny-qwen2:q8_0") == q8
    # the registered variant is whole without them
    assert (repo.root / q8.dvc.path / q8.file).stat().st_size == q8.size_bytes
    # another variant needs the f16 and the logits: the run rebuilds them (the same bytes) and registers it; with
    # MODELMINT_KEEP_SCRATCH=1 they stay for the next build of the same source
    second = _convert(repo, "q4_k_m", MODELMINT_KEEP_SCRATCH="1")
    assert second.returncode == 0, second.stderr
    assert find_manifest(settings, "tiny-qwen2:q4_k_m").parent.sha256 == q8.parent.sha256
    kept_files = [p.name for p in _scratch(repo)]
    assert kept_files == sorted(["tiny-qwen2-f16.gguf", "tiny-qwen2-f16.kld-base.bin", receipt_path(
        Path("tiny-qwen2-f16.gguf")).name, receipt_path(Path("tiny-qwen2-f16.kld-base.bin")).name]), kept_files


@pytest.mark.slow
def test_the_f16_and_the_logits_go_before_registration_and_a_failed_push_is_resumed_without_them(
    isolated: Path, tmp_path: Path
) -> None:
    """Registration reads only the variants: the scratch files go once every variant passed, so they do not sit beside
    the DVC remote's and the registry's copies (at 7B, 14.5 GiB of the run's peak). A push that fails leaves them
    gone, and the rerun registers the finished variant without converting or measuring anything again."""
    repo = make_repo(tmp_path)
    # the remote's mount goes away under the run (the check before any work would refuse it up front otherwise)
    dvc(repo.root, "remote", "modify", "local", "url", "/proc/modelmint-no-such-mount/remote")
    failed = _convert(repo, "q8_0", MODELMINT_SKIP_RESOURCE_CHECK="1")
    assert failed.returncode != 0 and "RemoteError" in failed.stderr, failed.stderr
    assert [p.suffix for p in _scratch(repo)] == [".json", ".json"], "the scratch files outlived the validation"
    dvc(repo.root, "remote", "modify", "local", "url", str(repo.remote))
    again = _convert(repo, "q8_0")
    assert again.returncode == 0, again.stderr
    said = again.stdout + again.stderr
    assert "convert →" not in said and "validate q8_0" not in said, said
    assert find_manifest(repo.settings(), "tiny-qwen2:q8_0").dvc.pushed
