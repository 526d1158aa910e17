"""One copy of each registered artifact on the builder: the checked build output, artifacts/ and the DVC cache share
one inode (a hard link, DVC's `reflink,hardlink,copy` cache type), and nothing modelmint does later rewrites it.

Real git, DVC and a local remote (tests/registry_env.py); the disk use is read from the filesystem (st_blocks of
every file once per inode), not computed.
"""

from __future__ import annotations

import os
from pathlib import Path

from registry_env import Repo, candidate

from pipelines.core.fsutil import sha256_file
from pipelines.registry import dvcrepo
from pipelines.registry.manifest import find_manifest
from pipelines.registry.register import artifact_dir, register

MIB = 8


def _bytes_on_disk(*roots: Path) -> int:
    """What the files under `roots` take on the disk, each inode counted once (as `du` counts hard links)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in roots:
        for p in root.rglob("*"):
            st = p.lstat()
            if p.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def test_a_registered_variant_is_one_copy_shared_by_the_build_artifacts_and_the_dvc_cache(
    repo: Repo, tmp_path: Path
) -> None:
    settings = repo.settings()
    c = candidate(settings, tmp_path / "work", mib=MIB)
    built = c.files[0]
    done = register(settings, c)
    placed = artifact_dir(settings, "tiny-qwen2", "q4_k_m") / done.manifest.file
    cache = dvcrepo.cache_dir(settings)
    obj = next(p for p in cache.rglob("*") if p.is_file() and p.stat().st_size == built.stat().st_size)
    assert os.path.samefile(built, placed) and os.path.samefile(placed, obj)
    assert placed.stat().st_nlink == 3
    # DVC made the shared inode read-only: a process that is not root cannot write through any of the three names
    assert placed.stat().st_mode & 0o222 == 0
    size = built.stat().st_size
    # everything registration added on the builder (artifacts/ and the cache, the build beside them) is one copy of
    # the variant plus its small serving files, not three copies
    used = _bytes_on_disk(tmp_path / "work", repo.root / "artifacts", cache)
    assert size <= used < 1.1 * size, (used, size)


def test_a_rebuild_replaces_the_build_output_without_touching_the_registered_one(repo: Repo, tmp_path: Path) -> None:
    """Every modelmint output is written under a temporary name and renamed: a build of other bytes at the same path
    gets a new inode, and the registered artifact (and the DVC cache) keep the registered bytes."""
    settings = repo.settings()
    first = candidate(settings, tmp_path / "work", mib=1)
    done = register(settings, first)
    placed = artifact_dir(settings, "tiny-qwen2", "q4_k_m") / done.manifest.file
    other = candidate(settings, tmp_path / "other", mib=1, seed=7)
    os.replace(other.files[0], first.files[0])  # what atomic_output's promote does
    assert not os.path.samefile(first.files[0], placed)
    assert sha256_file(placed) == find_manifest(settings, "tiny-qwen2:q4_k_m").sha256 == done.manifest.sha256
