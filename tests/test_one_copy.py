"""One copy of each registered weight file on the builder: the checked build output, artifacts/ and the DVC cache
share one read-only inode, while the small files beside the weights (serving scripts, cards) stay copies that keep
their modes through DVC's own commands.

Real git, DVC and a local remote (tests/registry_env.py); disk use is read from the filesystem (st_blocks of every
file once per inode), not computed.
"""

from __future__ import annotations

import os
from pathlib import Path

from registry_env import Repo, candidate, dvc

from pipelines.core.fsutil import sha256_file
from pipelines.registry.register import artifact_dir, register
from pipelines.store import dvcrepo
from pipelines.store.manifest import find_manifest

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


def _cache_object_of(cache: Path, size: int) -> Path:
    return next(p for p in cache.rglob("*") if p.is_file() and p.stat().st_size == size)


def test_a_registered_variant_is_one_copy_shared_by_the_build_artifacts_and_the_dvc_cache(
    repo: Repo, tmp_path: Path
) -> None:
    settings = repo.settings()
    c = candidate(settings, tmp_path / "work", mib=MIB)
    built = c.files[0]
    size = built.stat().st_size
    done = register(settings, c)
    placed = artifact_dir(settings, "tiny-qwen2", "q4_k_m") / done.manifest.file
    cache = dvcrepo.cache_dir(settings)
    obj = _cache_object_of(cache, size)
    assert os.path.samefile(built, placed) and os.path.samefile(placed, obj)
    assert placed.stat().st_nlink == 3
    # read-only, as DVC keeps its objects: a process that is not root cannot write through any of the three names
    assert placed.stat().st_mode & 0o222 == 0
    # everything registration added on the builder (artifacts/ and the cache, the build beside them) is one copy
    # of the variant plus its small files, not three copies
    used = _bytes_on_disk(tmp_path / "work", repo.root / "artifacts", cache)
    assert size <= used < 1.1 * size, (used, size)
    # the small files stay copies of their own: DVC's commands leave their modes (an executable stays one)
    others = [p for p in placed.parent.rglob("*") if p.is_file() and p != placed]
    assert others and all(p.stat().st_nlink == 1 for p in others)
    script = others[0]
    script.chmod(0o755)
    assert "artifacts/tiny-qwen2/q4_k_m" not in dvc(repo.root, "status", c.stage).stdout  # (no change to the out)
    dvc(repo.root, "checkout", c.stage)
    assert script.stat().st_mode & 0o777 == 0o755
    assert os.path.samefile(placed, obj) and os.path.samefile(built, placed)
    # registering the same bytes again finds them in place: no tool rewrites the shared inode
    assert not register(settings, c).ran or os.path.samefile(placed, obj)


def test_a_rebuild_replaces_the_build_output_and_leaves_the_registered_bytes(repo: Repo, tmp_path: Path) -> None:
    """Every modelmint output is written under a temporary name and renamed: a build of other bytes at the same path
    gets a new inode, and the registered artifact and its cache object keep the registered bytes."""
    settings = repo.settings()
    first = candidate(settings, tmp_path / "work", mib=1)
    done = register(settings, first)
    placed = artifact_dir(settings, "tiny-qwen2", "q4_k_m") / done.manifest.file
    assert os.path.samefile(first.files[0], placed)
    other = candidate(settings, tmp_path / "other", mib=1, seed=7)
    os.replace(other.files[0], first.files[0])  # what atomic_output's promote does
    assert not os.path.samefile(first.files[0], placed)
    assert sha256_file(placed) == find_manifest(settings, "tiny-qwen2:q4_k_m").sha256 == done.manifest.sha256
    assert "artifacts/tiny-qwen2/q4_k_m" not in dvc(repo.root, "status", first.stage).stdout


def test_a_work_dir_on_another_disk_is_copied_once_and_the_cache_shares_the_copy(
    repo: Repo, tmp_path: Path, small_disk
) -> None:
    """A hard link cannot cross filesystems: artifacts/ takes a copy of the build output, and the DVC cache (on the
    repository's disk) shares that copy's inode."""
    settings = repo.settings()
    c = candidate(settings, small_disk("64m"), mib=MIB)
    done = register(settings, c)
    placed = artifact_dir(settings, "tiny-qwen2", "q4_k_m") / done.manifest.file
    obj = _cache_object_of(dvcrepo.cache_dir(settings), c.files[0].stat().st_size)
    assert not os.path.samefile(c.files[0], placed) and os.path.samefile(placed, obj)
    assert sha256_file(placed) == done.manifest.sha256 == sha256_file(c.files[0])
