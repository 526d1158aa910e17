"""Shared pytest configuration: fixture modules any test file may use (add yours to the list)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pipelines.core.settings import Settings

# registry_env: `isolated` (git/DVC/Prefect/modelmint caches in a temp dir) and `repo` (a git + DVC project).
# site_registry: `site_registry` (tiny-qwen2 and smollm2 registered by the real code, for recommend and the site).
pytest_plugins = ["registry_env", "site_registry"]

# what one run of the suite holds in its temp dir at its peak (models, GGUFs, DVC caches, registries), with margin
_SUITE_NEEDS_GIB = 6


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop before the first test when the temp dir's filesystem cannot hold a run, naming the cause.

    A full disk halfway through the suite shows as hundreds of unrelated errors from whichever tool wrote next.
    """
    tmp = os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free / 2**30
    if free < _SUITE_NEEDS_GIB and not session.config.option.collectonly:
        pytest.exit(
            f"error: {free:.1f} GiB free under {tmp}; the test suite needs about {_SUITE_NEEDS_GIB} GiB there.\n"
            f"→ free space (old pytest-of-* runs under {tmp}, `podman system df`), or point TMPDIR at a larger disk",
            returncode=1,
        )


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The persistent MODELMINT_HOME (built toolchains, generated models) with builds in a temp dir."""
    env = {k: os.environ[k] for k in ("MODELMINT_HOME", "MODELMINT_THREADS") if os.environ.get(k)}
    return Settings.from_env({**env, "MODELMINT_WORK_DIR": str(tmp_path_factory.mktemp("work"))})


@pytest.fixture(scope="session")
def tiny_qwen2(settings: Settings) -> Path:
    """The generated tiny-qwen2 model directory (generated on first use, about a minute)."""
    from pipelines.source.tinymodel import ensure_tiny_model

    return ensure_tiny_model("tiny-qwen2", settings)


@pytest.fixture(scope="session")
def tiny_llama(settings: Settings) -> Path:
    """The generated tiny-llama model directory (generated on first use, about a minute)."""
    from pipelines.source.tinymodel import ensure_tiny_model

    return ensure_tiny_model("tiny-llama", settings)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A factory for real size-limited filesystems (tmpfs of `size`, e.g. '256k'), unmounted afterwards."""
    import subprocess

    mounts: list[Path] = []

    def _mount(size: str) -> Path:
        mnt = tmp_path / f"small-{len(mounts)}"
        mnt.mkdir()
        if (
            os.geteuid() != 0
            or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]).returncode
        ):
            pytest.skip("needs root to mount a size-limited tmpfs")
        mounts.append(mnt)
        return mnt

    yield _mount
    for mnt in mounts:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
