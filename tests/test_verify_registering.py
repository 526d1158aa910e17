"""`modelmint verify` while a registration of the same tag is pushing: dvc.lock already names the new version, its
manifest not yet. That is no damage of the remote: verify waits for the registration as pull does (real DVC, real
git, the real CLI)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from registry_env import Repo, candidate

from pipelines.registry.register import register

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


@pytest.fixture
def published(repo: Repo, tmp_path: Path) -> Repo:
    """tiny-qwen2:q4_k_m registered and pushed, the registry committed to git."""
    settings = repo.settings()
    register(settings, candidate(settings, tmp_path / "build"))
    repo.commit_all("register tiny-qwen2:q4_k_m")
    return repo


def _half_registered(published: Repo, tmp_path: Path) -> tuple[Any, Any, Any]:
    """A registration of a new version stopped between `dvc commit` and its push + manifest."""
    from pipelines.registry import register as reg

    settings = published.settings()
    c = candidate(settings, tmp_path / "build-2", seed=2)
    return settings, c, reg.track(settings, c, reg.place(settings, c))


def test_verify_repair_during_a_registration_waits_instead_of_calling_the_remote_damaged(
        published: Repo, tmp_path: Path) -> None:
    from pipelines.registry import register as reg

    settings, c, tracked = _half_registered(published, tmp_path)
    proc = subprocess.Popen([*MODELMINT, "verify", "tiny-qwen2:q4_k_m", "--repair"],
                            env={**published.env(), "COLUMNS": "200"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=published.root)
    for _ in range(40):  # still waiting after 4 s, not failed
        time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
    done = reg.publish(settings, c, tracked)  # the push and the manifest: the registration ends
    out, errs = proc.communicate(timeout=180)
    assert proc.returncode == 0, out + errs
    assert "damaged" not in out + errs and "being registered" in errs, out + errs
    assert "tiny-qwen2:q4_k_m: ok" in out and "uploaded again" not in errs, out + errs
    assert done.manifest.sha256 == c.sha256


def test_verify_after_a_registration_stopped_midway_says_so_not_damaged(
        published: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipelines.registry.pull as pulling
    from pipelines.core.errors import RemoteIntegrityError
    from pipelines.registry.verify import verify_remote

    settings, _c, _tracked = _half_registered(published, tmp_path)
    monkeypatch.setattr(pulling, "REGISTRATION_WAIT_S", 1.0)
    result = verify_remote(settings, ["tiny-qwen2:q4_k_m"], repair=True)
    error = result.error()
    assert error is not None and not isinstance(error, RemoteIntegrityError), error
    assert "not checked" in error.message and "registration" in error.message, error.message
    assert "modelmint verify tiny-qwen2:q4_k_m" in (error.hint or ""), error.hint
