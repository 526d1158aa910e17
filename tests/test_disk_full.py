"""A full disk, on real size-limited filesystems: recognised whatever the tool prints, blamed on the directory
that filled, with the hint that moves that directory; and nothing a tool cut short is ever renamed into place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.core.errors import ArtifactError, DiskFullError, ToolError
from pipelines.core.fsutil import atomic_output, free_bytes, is_full, promote, write_text_atomic
from pipelines.core.runner import run
from pipelines.core.settings import Settings

# A writer that hides ENOSPC behind a C++ iostream message and exits 1, as llama-quantize does.
_IOSTREAM_WRITER = (
    "import sys\n"
    "try:\n"
    "    with open(sys.argv[1], 'wb') as f:\n"
    "        while True:\n"
    "            f.write(b'\\0' * (1 << 20)); f.flush()\n"
    "except OSError:\n"
    "    print('basic_ios::clear: iostream error', file=sys.stderr); sys.exit(1)\n"
)


def _remount(mnt: Path, size: int | str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)


# ---------------------------------------------------------------- the runner and promote


def test_a_tool_failing_on_a_full_disk_is_disk_full_whatever_it_prints(small_disk, tmp_path: Path) -> None:
    mnt = small_disk("4m")
    out = mnt / "out" / "model.gguf.partial-1"
    out.parent.mkdir()
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    with pytest.raises(DiskFullError) as exc:
        run([sys.executable, "-c", _IOSTREAM_WRITER, str(out)], cwd=elsewhere, output=out)
    # the output's directory, not the working directory of the tool (nor modelmint's)
    assert exc.value.path == str(out.parent)
    assert "basic_ios::clear" in str(exc.value)


def test_a_tool_failing_with_space_left_is_a_tool_error(small_disk) -> None:
    mnt = small_disk("64m")
    with pytest.raises(ToolError) as exc:
        run([sys.executable, "-c", "import sys; print('bad input', file=sys.stderr); sys.exit(2)"],
            output=mnt / "x.partial-1")
    assert not isinstance(exc.value, DiskFullError) and "bad input" in str(exc.value)


def test_no_space_message_names_the_output_directory_not_the_cwd(small_disk, tmp_path: Path) -> None:
    mnt = small_disk("2m")
    target = mnt / "x"
    with pytest.raises(DiskFullError) as exc:
        run([sys.executable, "-c", f"open({str(target)!r}, 'wb').write(b'0' * (8 << 20))"], output=target)
    assert exc.value.path == str(mnt) and str(Path.cwd()) not in str(exc.value)


def test_promote_refuses_an_empty_or_unchecked_output(tmp_path: Path) -> None:
    final = tmp_path / "out.bin"
    empty = tmp_path / "out.bin.partial-1"
    empty.touch()
    with pytest.raises(ArtifactError, match="empty"):
        promote(empty, final)
    assert not final.exists()

    def _needs_magic(p: Path) -> None:
        if p.read_bytes()[:4] != b"GGUF":
            raise ArtifactError(f"{p} has no GGUF magic")

    with pytest.raises(ArtifactError, match="magic"), atomic_output(final, check=_needs_magic) as tmp:
        tmp.write_bytes(b"junk")
    assert list(tmp_path.iterdir()) == [empty]
    with atomic_output(final, check=_needs_magic) as tmp:
        tmp.write_bytes(b"GGUF....")
    assert final.read_bytes() == b"GGUF...."


def test_an_output_cut_short_on_a_full_disk_is_disk_full(small_disk) -> None:
    mnt = small_disk("2m")

    def _complete(p: Path) -> None:
        if p.stat().st_size != 64 << 20:
            raise ArtifactError(f"{p} is truncated")

    # A tool that exits 0 after a short write (llama-perplexity, llama-imatrix do): the check catches it,
    # and a full filesystem says why.
    quiet_writer = _IOSTREAM_WRITER.replace("sys.exit(1)", "sys.exit(0)")
    with pytest.raises(DiskFullError) as exc, atomic_output(mnt / "logits.bin", check=_complete) as tmp:
        run([sys.executable, "-c", quiet_writer, str(tmp)], output=tmp)
    assert exc.value.path == str(mnt) and "truncated" in str(exc.value)
    assert not list(mnt.iterdir())


def test_text_is_promoted_only_if_it_reads_back(small_disk) -> None:
    mnt = small_disk("1m")
    write_text_atomic(mnt / "report.json", '{"passed": true}\n')
    assert (mnt / "report.json").read_text() == '{"passed": true}\n'
    with pytest.raises(DiskFullError):
        write_text_atomic(mnt / "big.json", "x" * (2 << 20))
    assert sorted(p.name for p in mnt.iterdir()) == ["report.json"]


def test_is_full_tracks_free_space(small_disk) -> None:
    mnt = small_disk("16m")
    assert not is_full(mnt)
    (mnt / "fill").write_bytes(b"\0" * (free_bytes(mnt) - 4096))
    assert is_full(mnt) and is_full(mnt / "not" / "there" / "yet")


# ---------------------------------------------------------------- which directory filled, and what moves it


def test_the_hint_depends_on_the_directory_that_filled(tmp_path: Path) -> None:
    s = Settings(home=tmp_path / "home", work_dir=tmp_path / "repo" / "build", catalog_path=tmp_path / "c.yaml",
                 repo_dir=tmp_path / "repo")
    cases = {
        s.work_dir / "tiny-qwen2" / "abc": ("work_dir", "MODELMINT_WORK_DIR"),
        s.artifacts_dir / "tiny-qwen2" / "q8_0": ("artifacts", "disk holding the repository"),
        s.repo_dir / ".dvc" / "cache" / "files": ("dvc_cache", "dvc cache dir"),
        s.home / "hub" / "models--acme--tiny": ("home", "MODELMINT_HOME"),
        s.repo_dir / "registry" / "manifests": ("repo", "disk holding the repository"),
    }
    for path, (location, hint) in cases.items():
        assert s.disk_location(path) == location, path
        err = DiskFullError(str(path), location=location)
        assert hint in str(err), (location, str(err))
        if location != "work_dir":
            assert "MODELMINT_WORK_DIR" not in (err.hint or "").replace("MODELMINT_WORK_DIR does not move", ""), err
    assert s.disk_location(tmp_path / "elsewhere") is None
    assert s.disk_location(tmp_path / "big" / "cache", dvc_cache=tmp_path / "big" / "cache") == "dvc_cache"


# ---------------------------------------------------------------- the real tools on a real full disk

@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, settings: Settings, tiny_qwen2: Path):
    """tiny-qwen2's f16 GGUF, converted once on an ordinary disk, and the pinned llama.cpp."""
    from pipelines.core.toolchains import llama_cpp
    from pipelines.gguf.tools import convert

    llama = llama_cpp(settings)
    out = tmp_path_factory.mktemp("base") / "tiny-qwen2-f16.gguf"
    convert(tiny_qwen2, out, llama)
    return out, llama


@pytest.mark.slow
def test_llama_quantize_on_a_full_disk(base, small_disk) -> None:
    from pipelines.gguf.tools import quantize

    f16, llama = base
    mnt = small_disk(str(f16.stat().st_size // 8))  # a Q8_0 is about half the f16: a quarter of it fits
    out_dir = mnt / "tiny-qwen2" / "0123456789ab"
    out_dir.mkdir(parents=True)
    with pytest.raises(DiskFullError) as exc:
        quantize(f16, out_dir / "tiny-qwen2-q8_0.gguf", "q8_0", llama, threads=2)
    assert exc.value.path == str(out_dir) and "llama-quantize" in str(exc.value)
    assert not list(out_dir.iterdir())  # nothing half-written, not even the partial


@pytest.mark.slow
def test_llama_perplexity_cut_short_by_a_full_disk_is_not_promoted(base, small_disk) -> None:
    from pipelines.core.texts import EVAL_TEXT, bundled_text
    from pipelines.gguf.build import GGUF_EVAL_CHUNKS, GGUF_EVAL_CTX
    from pipelines.gguf.validate import kld_base_logits

    f16, llama = base
    mnt = small_disk("8m")  # the logits of 16 x 128 tokens over a 151k vocabulary take ~300 MB
    out = mnt / "tiny-qwen2-f16.kld-base.bin"
    with pytest.raises(DiskFullError) as exc:
        kld_base_logits(f16, bundled_text(EVAL_TEXT), out, llama, threads=2, ctx=GGUF_EVAL_CTX, chunks=GGUF_EVAL_CHUNKS)
    assert exc.value.path == str(mnt) and "truncated" in str(exc.value)
    assert not list(mnt.iterdir())


@pytest.mark.slow
def test_a_truncated_logits_file_is_named_not_measured(base, tmp_path: Path) -> None:
    from pipelines.core.texts import EVAL_TEXT, bundled_text
    from pipelines.gguf.build import GGUF_EVAL_CTX
    from pipelines.gguf.validate import check_logits_file, kl_divergence, kld_base_logits

    f16, llama = base
    logits = kld_base_logits(f16, bundled_text(EVAL_TEXT), tmp_path / "base.kld-base.bin", llama, threads=2, ctx=GGUF_EVAL_CTX,
                             chunks=2)
    check_logits_file(logits, ctx=GGUF_EVAL_CTX, max_chunks=2)  # the size formula matches what the tool wrote
    with open(logits, "r+b") as fh:
        fh.truncate(logits.stat().st_size - 1000)
    with pytest.raises(ArtifactError, match="truncated"):
        check_logits_file(logits, ctx=GGUF_EVAL_CTX, max_chunks=2)
    # llama-perplexity itself exits 0 after "failed reading log-probs": the message says so and what to do
    with pytest.raises(ArtifactError) as exc:
        kl_divergence(f16, logits, llama, threads=2, ctx=GGUF_EVAL_CTX)
    assert "failed reading log-probs" in exc.value.message and f"delete {logits}" in (exc.value.hint or "")


@pytest.mark.slow
def test_llama_imatrix_on_a_full_disk(base, small_disk) -> None:
    from pipelines.core.texts import CALIBRATION_TEXT, bundled_text
    from pipelines.gguf.tools import compute_imatrix

    f16, llama = base
    mnt = small_disk("16k")  # its output is ~40 kB
    with pytest.raises(DiskFullError) as exc:
        compute_imatrix(f16, bundled_text(CALIBRATION_TEXT), mnt / "tiny-qwen2.imatrix.gguf", llama, threads=2, chunks=2)
    assert exc.value.path == str(mnt)
    assert not list(mnt.iterdir())


# ---------------------------------------------------------------- registration: artifacts/ and the DVC cache


def _register_env(repo, tmp_path: Path, mib: float):
    """A validated candidate whose GGUF is `mib` MiB (bigger than the 1 MiB disks below)."""
    from dataclasses import replace

    from registry_env import candidate, write_gguf

    from pipelines.core.fsutil import sha256_file

    settings = repo.settings()
    c = candidate(settings, tmp_path, tag="q8_0", seed=1)
    gguf = write_gguf(c.files[0], seed=1, mib=mib)
    return settings, replace(c, sha256=sha256_file(gguf), size_bytes=gguf.stat().st_size)


def test_a_full_artifacts_disk_names_the_repository_not_the_work_dir(repo, tmp_path: Path, small_disk) -> None:
    from pipelines.registry.register import register

    settings, c = _register_env(repo, tmp_path, mib=3)
    mnt = small_disk("1m")
    artifacts = repo.root / "artifacts"
    artifacts.mkdir(exist_ok=True)
    subprocess.run(["mount", "--bind", str(mnt), str(artifacts)], check=True)
    try:
        with pytest.raises(DiskFullError) as exc:
            register(settings, c, push=False)
        assert exc.value.location == "artifacts"
        assert str(artifacts) in exc.value.path and "disk holding the repository" in (exc.value.hint or "")
        assert not any(artifacts.rglob("*.gguf")) and not list(settings.manifests_dir.rglob("*.json"))
        _remount(mnt, "16m")
        assert register(settings, c, push=False).manifest.sha256 == c.sha256
    finally:
        subprocess.run(["umount", "-l", str(artifacts)], check=True)


def test_a_full_dvc_cache_says_how_to_move_it(repo, tmp_path: Path, small_disk) -> None:
    from pipelines.registry.register import register
    from pipelines.store import dvcrepo

    settings, c = _register_env(repo, tmp_path, mib=3)
    cache = dvcrepo.cache_dir(settings)
    cache.mkdir(parents=True, exist_ok=True)
    mnt = small_disk("1m")
    subprocess.run(["mount", "--bind", str(mnt), str(cache)], check=True)
    try:
        with pytest.raises(DiskFullError) as exc:
            register(settings, c, push=False)
        assert exc.value.location == "dvc_cache" and exc.value.path == str(cache)
        assert "dvc cache dir" in (exc.value.hint or "") and "MODELMINT_WORK_DIR" not in (exc.value.hint or "")
        assert not list(settings.manifests_dir.rglob("*.json"))
        _remount(mnt, "16m")
        assert register(settings, c, push=False).manifest.sha256 == c.sha256
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=True)


def test_a_full_dvc_cache_leaves_dvc_lock_naming_the_registered_version(repo, tmp_path: Path, small_disk) -> None:
    """A new version's `dvc commit` into a full cache: dvc.lock keeps naming the registered version (which the
    cache and the remote hold), so verify and pull go on working; the rerun after freeing space registers."""
    import shutil

    from registry_env import candidate

    from pipelines.registry.pull import pull
    from pipelines.registry.register import register
    from pipelines.registry.verify import verify_remote
    from pipelines.store import dvcrepo
    from pipelines.store.manifest import find_manifest

    settings = repo.settings()
    first = register(settings, candidate(settings, tmp_path / "v1", tag="q8_0")).manifest
    repo.commit_all("register tiny-qwen2:q8_0")
    lock = repo.root / "dvc.lock"
    before = lock.read_bytes()
    _, c = _register_env(repo, tmp_path / "v2", mib=3)
    cache = dvcrepo.cache_dir(settings)
    mnt = small_disk("8m")
    shutil.copytree(cache, mnt, dirs_exist_ok=True)  # the cache as it is, on a disk with 1 MiB left
    (mnt / "fill").write_bytes(b"\0" * (free_bytes(mnt) - (1 << 20)))
    subprocess.run(["mount", "--bind", str(mnt), str(cache)], check=True)
    try:
        with pytest.raises(DiskFullError) as exc:
            register(settings, c)
        assert exc.value.location == "dvc_cache"
        assert lock.read_bytes() == before
        assert find_manifest(settings, first.ref) == first
        assert verify_remote(settings, [first.ref]).ok
        done = pull(settings, first.ref)  # the workspace holds the refused version's files: put back
        assert (repo.root / first.dvc.path / first.file).read_bytes() == (tmp_path / "v1" / "build-0" / first.file).read_bytes()
        assert done.manifest == first
        (mnt / "fill").unlink()
        assert register(settings, c).manifest.sha256 == c.sha256
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=True)


def test_the_cli_prints_the_cause_and_the_next_step_without_a_traceback(small_disk, tiny_qwen2: Path) -> None:
    """A full work dir through the CLI: the message names the work dir, the hint MODELMINT_WORK_DIR."""
    mnt = small_disk("1m")
    # the disk fills under a run already started (the check before any work refuses it up front otherwise:
    # tests/faults/test_build_faults.py, test_a_run_too_large_for_its_disk_is_refused_before_any_tool_runs)
    env = {**os.environ, "MODELMINT_WORK_DIR": str(mnt), "MODELMINT_SKIP_RESOURCE_CHECK": "1"}
    (mnt / "fill").write_bytes(b"\0" * (free_bytes(mnt) - 4096))
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "convert", "tiny-qwen2", "--variants", "q8_0"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"no space left on the device holding {mnt}" in proc.stderr and "MODELMINT_WORK_DIR" in proc.stderr
