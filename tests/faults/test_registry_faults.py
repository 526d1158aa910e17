"""Faults injected into the registry: a damaged or missing remote object, a tampered manifest, a push killed
mid-transfer, and a registration killed with SIGKILL at several moments. Real git, DVC and a local DVC remote;
each moment is found by watching the filesystem, never by mocking DVC.

Each fault asserts a clear message naming the cause and the next command, nothing half-registered (no
manifest whose blob the remote lacks), and that a rerun completes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from registry_env import Repo, candidate, dvc, flip_middle, git

from pipelines.core.errors import (
    BlobMismatch,
    ManifestDisagrees,
    RegistryError,
    RemoteError,
    RemoteObjectMissing,
)
from pipelines.registry.pull import pull
from pipelines.registry.register import register
from pipelines.registry.verify import verify_remote
from pipelines.store import dvcrepo
from pipelines.store.manifest import find_manifest, manifest_path

MODELMINT = [sys.executable, "-m", "pipelines.cli"]
TESTS = Path(__file__).resolve().parents[1]
REF, STAGE = "tiny-qwen2:q4_k_m", "gguf@tiny-qwen2-q4_k_m"
# Big enough that DVC's copy into the remote takes many chunks (the moments below are watched for, not timed).
MIB = 96

# Registers the synthetic candidate exactly as `modelmint convert --register` would, in its own process group.
_CHILD = """
import sys
from pathlib import Path
from registry_env import candidate
from pipelines.registry.register import register
from pipelines.core.settings import Settings

settings = Settings.from_env()
done = register(settings, candidate(settings, Path(sys.argv[1]), mib=float(sys.argv[2])))
state = "registered and pushed" if done.ran else "already registered"
print(f"{done.manifest.ref} {state}; re-uploaded {len(done.reuploaded)}")
"""


def _env(repo: Repo) -> dict[str, str]:
    return {**repo.env(), "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "COLUMNS": "200"}


def _register_child(repo: Repo, build: Path, mib: float = MIB) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(build), str(mib)], env=_env(repo), cwd=repo.root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _kill_when(proc: subprocess.Popen[str], moment: Callable[[], bool], what: str) -> None:
    """SIGKILL the process group (the registration and the DVC process it runs) as soon as `moment()` holds."""
    deadline = time.monotonic() + 300
    while proc.poll() is None:
        if moment():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        assert time.monotonic() < deadline, f"the registration never reached {what}"
        time.sleep(0.001)
    pytest.fail(f"the registration finished before {what} was seen:\n{proc.stdout.read() if proc.stdout else ''}")


def _rerun(repo: Repo, build: Path, mib: float = MIB) -> str:
    proc = _register_child(repo, build, mib)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    return out


def _remote_tmp(repo: Repo) -> list[Path]:
    return sorted((repo.remote / "files" / "md5").glob("*/.*.tmp"))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # renamed into place since it was listed
        return 0


def _remote_dirs(repo: Repo) -> list[Path]:
    return sorted((repo.remote / "files" / "md5").glob("*/*.dir"))


def _object(repo: Repo, md5: str, relpath: str | None = None) -> Path:
    """The remote's object for one file of a registered directory (None: the `.dir` listing itself)."""
    listing = repo.remote / "files" / "md5" / md5[:2] / md5[2:]
    if relpath is None:
        return listing
    oid = next(e["md5"] for e in json.loads(listing.read_text()) if e["relpath"] == relpath)
    return repo.remote / "files" / "md5" / oid[:2] / oid[2:]


def _clone(repo: Repo, dest: Path) -> Repo:
    git(repo.root, "add", "-A")
    if git(repo.root, "status", "--porcelain"):
        git(repo.root, "commit", "-q", "-m", "registry")
    shutil.rmtree(dest, ignore_errors=True)
    git(dest.parent, "clone", "-q", str(repo.root), dest.name)
    return Repo(dest, repo.remote, repo.work)


def _cli(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODELMINT, *args], env=_env(repo), capture_output=True, text=True, cwd=repo.root)


def _assert_whole_or_nothing(repo: Repo) -> None:
    """Nothing half-registered: no manifest, or a manifest whose every object the remote holds intact."""
    settings = repo.settings()
    if manifest_path(settings, "tiny-qwen2", "q4_k_m").exists():
        result = verify_remote(settings, [REF])
        assert result.ok, result.error()
    else:
        # what a user sees meanwhile names the cause and the next command
        shown = _cli(repo, "pull", REF)
        assert shown.returncode == 1 and "never registered" in shown.stderr and "modelmint convert" in shown.stderr


def _assert_pullable(repo: Repo, tmp: Path, build: Path) -> None:
    clone = _clone(repo, tmp / "clone")
    done = pull(clone.settings(), REF)
    gguf = next(build.glob("build-0/*.gguf"))
    assert done.fetched and (clone.root / done.manifest.dvc.path / gguf.name).read_bytes() == gguf.read_bytes()


# ---------------------------------------------------------------- the remote's copy


@pytest.fixture
def published(repo: Repo, tmp_path: Path) -> Repo:
    settings = repo.settings()
    register(settings, candidate(settings, tmp_path / "build"))
    repo.commit_all("register tiny-qwen2:q4_k_m")
    return repo


def test_a_damaged_remote_object_is_uploaded_again_by_registering_again(published: Repo, tmp_path: Path) -> None:
    settings = published.settings()
    m = find_manifest(settings, REF)
    obj = _object(published, m.dvc.md5, m.file)
    good = hashlib.sha256((published.root / m.dvc.path / m.file).read_bytes()).hexdigest()
    flip_middle(obj)
    assert "in sync" in dvc(published.root, "status", "--cloud", STAGE).stdout  # DVC cannot tell
    # a pull says what is wrong and what to run
    clone = _clone(published, tmp_path / "clone")
    with pytest.raises(BlobMismatch) as err:
        pull(clone.settings(), REF)
    assert f"modelmint verify {REF} --repair" in str(err.value) and "modelmint convert tiny-qwen2" in str(err.value)
    # the user follows the old advice: no workspace copy, no DVC cache, register again
    shutil.rmtree(published.root / m.dvc.path)
    shutil.rmtree(published.root / ".dvc" / "cache")
    again = register(settings, candidate(settings, tmp_path / "build"))
    assert again.ran and len(again.reuploaded) == 1 and m.file in again.reuploaded[0]
    assert hashlib.sha256(obj.read_bytes()).hexdigest() == good
    assert manifest_path(settings, "tiny-qwen2", "q4_k_m").read_text() == (
        git(published.root, "show", "HEAD:registry/manifests/tiny-qwen2/q4_k_m.json"))
    assert pull(clone.settings(), REF).fetched


def test_a_damaged_remote_object_is_repaired_even_when_nothing_local_changed(published: Repo, tmp_path: Path) -> None:
    settings = published.settings()
    m = find_manifest(settings, REF)
    obj = _object(published, m.dvc.md5, "Modelfile")
    flip_middle(obj)
    again = register(settings, candidate(settings, tmp_path / "build"))
    assert not again.ran and len(again.reuploaded) == 1
    assert verify_remote(settings, [REF]).ok


@pytest.mark.parametrize("which", ["gguf", "listing"])
def test_a_missing_remote_object_is_named_and_uploaded_again(published: Repo, tmp_path: Path, which: str) -> None:
    settings = published.settings()
    m = find_manifest(settings, REF)
    obj = _object(published, m.dvc.md5, m.file if which == "gguf" else None)
    obj.unlink()
    clone = _clone(published, tmp_path / "clone")
    if which == "gguf":
        # not "unreachable, check the network" and no retry: the object is gone from a reachable remote
        with pytest.raises(RemoteObjectMissing) as err:
            pull(clone.settings(), REF)
        assert not err.value.transient and "lacks an object" in err.value.message
        assert f"modelmint verify {REF} --repair" in str(err.value.hint)
        assert "modelmint convert tiny-qwen2 --variants q4_k_m --register" in str(err.value.hint)
        shown = _cli(clone, "pull", REF)
        assert shown.returncode == 1 and "lacks an object" in shown.stderr and "Traceback" not in shown.stderr
    else:
        with pytest.raises(RemoteError) as gone:
            pull(clone.settings(), REF)
        assert not gone.value.transient and "does not hold" in gone.value.message
    shutil.rmtree(published.root / m.dvc.path)
    shutil.rmtree(published.root / ".dvc" / "cache")
    again = register(settings, candidate(settings, tmp_path / "build"))
    # a missing listing makes `dvc push` itself look at every file; a missing file behind a present listing
    # is found by the check after the push and uploaded again
    assert again.ran and obj.is_file() and bool(again.reuploaded) == (which == "gguf")
    assert pull(clone.settings(), REF).fetched


# ---------------------------------------------------------------- a tampered manifest


def test_pull_against_a_tampered_manifest_deletes_nothing_and_names_the_manifest(published: Repo) -> None:
    settings = published.settings()
    path = manifest_path(settings, "tiny-qwen2", "q4_k_m")
    raw = json.loads(path.read_text())
    forged = "f" * 64
    raw["sha256"] = forged
    next(f for f in raw["files"] if f["path"] == raw["file"])["sha256"] = forged
    path.write_text(json.dumps(raw, indent=2))
    m = find_manifest(settings, REF)  # consistent: it passes the schema
    placed = published.root / m.dvc.path / m.file
    before = placed.read_bytes()
    cache = dvcrepo.cache_dir(settings)
    cached = sorted(p.relative_to(cache) for p in cache.rglob("*") if p.is_file())

    with pytest.raises(ManifestDisagrees) as err:
        pull(settings, REF)
    rel = "registry/manifests/tiny-qwen2/q4_k_m.json"
    assert forged in err.value.message and "nothing was replaced or deleted" in err.value.message
    assert f"git checkout -- {rel}" in str(err.value.hint) and f"git log -p -- {rel}" in str(err.value.hint)
    # the cache and the workspace are untouched; DVC still finds everything
    assert sorted(p.relative_to(cache) for p in cache.rglob("*") if p.is_file()) == cached
    assert placed.read_bytes() == before
    status = dvc(published.root, "status", STAGE).stdout
    assert "up to date" in status and "missing" not in status
    shown = _cli(published, "pull", REF)
    assert shown.returncode == 1 and f"git checkout -- {rel}" in shown.stderr and "Traceback" not in shown.stderr
    # verify says the same of the remote's copy, and --repair does not "repair" the genuine object
    checked = _cli(published, "verify", REF, "--repair")
    assert checked.returncode == 1 and "the manifest disagrees" in " ".join(checked.stderr.split())
    assert _object(published, m.dvc.md5, m.file).read_bytes() == before
    # the fix it names works
    git(published.root, "checkout", "--", rel)
    assert not pull(settings, REF).fetched


# ---------------------------------------------------------------- SIGKILL inside registration


def _dvc_lock_has_stage(repo: Repo) -> Callable[[], bool]:
    lock = repo.root / "dvc.lock"
    return lambda: lock.is_file() and STAGE in lock.read_text()


MOMENTS: dict[str, Callable[[Repo], Callable[[], bool]]] = {
    # copying the variant into artifacts/ (the directory is renamed into place when complete)
    "placing": lambda r: lambda: any((r.root / "artifacts" / "tiny-qwen2").glob("q4_k_m.partial-*")),
    # `dvc commit` has recorded it in dvc.lock; the push has not finished
    "after-commit": _dvc_lock_has_stage,
    # `dvc push` is copying the GGUF into the remote (DVC's `.<token>.tmp` beside the object); the artifact's small
    # files (card, serving plans) pass through a `.tmp` too, too briefly to be caught reliably: wait for the GGUF's
    "mid-push": lambda r: lambda: any(_size(t) >= 1 << 20 for t in _remote_tmp(r)),
    # the push is complete (DVC uploads the `.dir` listing last): the remote is being checked, no manifest yet
    "before-manifest": lambda r: lambda: bool(_remote_dirs(r)),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_registration_killed_at_any_moment_leaves_nothing_half_registered(
    repo: Repo, tmp_path: Path, moment: str
) -> None:
    build = tmp_path / "build"
    candidate(repo.settings(), build, mib=MIB)  # built beforehand, so that the child only registers
    _kill_when(_register_child(repo, build), MOMENTS[moment](repo), moment)
    _assert_whole_or_nothing(repo)
    out = _rerun(repo, build)
    assert f"{REF} registered and pushed" in out or f"{REF} already registered" in out
    assert verify_remote(repo.settings(), [REF]).ok
    _assert_pullable(repo, tmp_path, build)


def test_a_push_killed_mid_transfer_leaves_no_temporary_object_for_good(repo: Repo, tmp_path: Path) -> None:
    build = tmp_path / "build"
    candidate(repo.settings(), build, mib=MIB)
    _kill_when(_register_child(repo, build), MOMENTS["mid-push"](repo), "mid-push")
    [left] = _remote_tmp(repo)
    _assert_whole_or_nothing(repo)
    # the next push completes; a temporary object written to this recently may be a live writer's: kept
    assert "registered and pushed" in _rerun(repo, build)
    assert left.exists()
    # once nobody has written to it for longer than the bound, the next registration of the artifact removes it
    old = time.time() - dvcrepo.STALE_UPLOAD_S - 60
    os.utime(left, (old, old))
    live = left.with_name(".AAAAAAAAAAAAAAAAAAAAAA.tmp")
    live.write_bytes(b"a live writer's upload")
    assert "already registered" in _rerun(repo, build)
    assert not left.exists() and live.exists()
    # a nightly verify sweeps the whole remote: a stale one beside another artifact's objects too
    elsewhere = repo.remote / "files" / "md5" / "zz"
    elsewhere.mkdir()
    stray = elsewhere / ".BBBBBBBBBBBBBBBBBBBBBB.tmp"
    stray.write_bytes(b"half")
    os.utime(stray, (old, old))
    os.utime(live, (old, old))
    result = verify_remote(repo.settings())
    assert result.ok and sorted(result.removed_uploads) == sorted([str(stray), str(live)])
    assert _remote_tmp(repo) == []


def test_a_repair_killed_mid_upload_is_completed_by_the_next_registration(published: Repo, tmp_path: Path) -> None:
    build = tmp_path / "big"
    settings = published.settings()
    register(settings, candidate(settings, build, mib=MIB))
    m = find_manifest(settings, REF)
    obj = _object(published, m.dvc.md5, m.file)
    flip_middle(obj)
    # the repair uploads the damaged object again over the bad copy: killed while it copies
    _kill_when(_register_child(published, build), MOMENTS["mid-push"](published), "the re-upload")
    check = dvcrepo.check_remote(settings, m.dvc.md5, {f.path: f.sha256 for f in m.files})
    assert check.bad  # the manifest stayed, its remote copy is incomplete: what verify reports ...
    shown = _cli(published, "verify", REF)
    assert shown.returncode == 1 and f"modelmint verify {REF} --repair" in shown.stderr
    # ... and what the next registration completes
    out = _rerun(published, build)
    assert "already registered; re-uploaded" in out and "re-uploaded 0" not in out
    assert verify_remote(settings, [REF]).ok


def test_a_repair_racing_a_registration_of_the_tag_removes_nothing_and_says_so(published: Repo, tmp_path: Path) -> None:
    """`verify --repair` checked version 1 (its GGUF damaged in the remote); a registration of the same tag then
    moved dvc.lock to version 2 before the repair ran. The repair stops, saying so: version 1's intact listing
    and files stay in the remote (it is still in git history), and version 2 is whole."""
    from pipelines.registry.verify import repair_remote

    settings = published.settings()
    old = find_manifest(settings, REF)
    flip_middle(_object(published, old.dvc.md5, old.file))
    listing = _object(published, old.dvc.md5)
    intact = {listing: listing.read_bytes()}
    intact |= {(o := _object(published, old.dvc.md5, f.path)): o.read_bytes() for f in old.files if f.path != old.file}
    damaged = _object(published, old.dvc.md5, old.file).read_bytes()
    checked = verify_remote(settings, [REF])  # what `verify --repair` does first
    assert not checked.ok and checked.artifacts[0].md5 == old.dvc.md5
    new = register(settings, candidate(settings, tmp_path / "new", seed=1)).manifest  # meanwhile
    assert new.dvc.md5 != old.dvc.md5

    [a] = repair_remote(settings, checked).artifacts
    assert not a.ok and not a.repaired
    said = " ".join(" ".join(a.problems).split())
    assert f"dvc.lock no longer records {old.dvc.md5} for {STAGE} (it records {new.dvc.md5} now)" in said
    assert "nothing was uploaded or removed" in said and f"rerun `modelmint verify {REF} --repair`" in said
    assert all(path.read_bytes() == raw for path, raw in intact.items())
    assert _object(published, old.dvc.md5, old.file).read_bytes() == damaged  # not "repaired" from version 2
    assert verify_remote(settings, [REF]).ok
    # the rerun it names checks the version registered now, and finds nothing to do
    again = _cli(published, "verify", REF, "--repair")
    assert again.returncode == 0 and "uploaded again" not in again.stderr, again.stderr


def test_a_repair_uploads_only_the_damaged_object_and_removes_nothing(published: Repo) -> None:
    """The intact listing and files are not removed and pushed again (a push would follow dvc.lock, whatever it
    records by then): only the damaged object is replaced, from the DVC cache's copy."""
    settings = published.settings()
    m = find_manifest(settings, REF)
    gguf = _object(published, m.dvc.md5, m.file)
    flip_middle(gguf)
    others = [_object(published, m.dvc.md5)] + [_object(published, m.dvc.md5, f.path) for f in m.files
                                                if f.path != m.file]
    before = {p: p.stat().st_ino for p in others}
    fixed = _cli(published, "verify", REF, "--repair")
    assert fixed.returncode == 0, fixed.stderr
    assert " ".join(fixed.stderr.split()).count("uploaded again") == 1 and m.file in fixed.stderr
    assert {p: p.stat().st_ino for p in others} == before
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == m.sha256
    assert verify_remote(settings, [REF]).ok


def test_a_registration_overtaken_by_another_of_the_tag_uploads_nothing_and_writes_no_manifest(
    repo: Repo, tmp_path: Path
) -> None:
    """Registration A has committed its version; B registers the same tag whole before A's push is checked. A's
    check finds its objects missing from the remote, and uploads none of them: dvc.lock is B's now (RecordMoved),
    B's manifest and record stay."""
    from pipelines.core.errors import RecordMoved
    from pipelines.registry.register import place, publish, track

    settings = repo.settings()
    a = candidate(settings, tmp_path / "a", seed=1)
    tracked = track(settings, a, place(settings, a))  # A: placed and committed, not pushed yet
    b = register(settings, candidate(settings, tmp_path / "b", seed=2)).manifest  # B, whole
    lock = (repo.root / "dvc.lock").read_bytes()
    before = sorted(p.relative_to(repo.remote) for p in repo.remote.rglob("*") if p.is_file())
    with pytest.raises(RecordMoved) as moved:
        publish(settings, a, tracked)
    assert moved.value.checked == tracked.md5 and moved.value.now == b.dvc.md5
    assert (repo.root / "dvc.lock").read_bytes() == lock and find_manifest(settings, REF) == b
    assert sorted(p.relative_to(repo.remote) for p in repo.remote.rglob("*") if p.is_file()) == before
    assert verify_remote(settings, [REF]).ok


def test_a_remote_directory_that_does_not_exist_is_a_configuration_error(repo: Repo, tmp_path: Path) -> None:
    from pipelines.core.errors import RemoteError, RemoteUnavailable

    settings = repo.settings()
    dvc(repo.root, "remote", "modify", "local", "url", "/proc/modelmint-no-such-mount/remote")
    with pytest.raises(RemoteError) as err:
        register(settings, candidate(settings, tmp_path))
    assert not isinstance(err.value, RemoteUnavailable) and not err.value.transient
    assert "does not exist" in err.value.message and "dvc remote modify" in str(err.value.hint)
    assert not manifest_path(settings, "tiny-qwen2", "q4_k_m").exists()
    dvc(repo.root, "remote", "modify", "local", "url", str(repo.remote))
    assert register(settings, candidate(settings, tmp_path)).manifest.dvc.pushed


# ---------------------------------------------------------------- publication records


@pytest.mark.parametrize("text", ["[{\"image\": \"h/ns/tiny-qwen2:q4_k_m\"", "{\"image\": 1}", "[1, 2]", "\xff\xfe"])
def test_a_corrupt_publication_record_is_refused_and_never_overwritten(published: Repo, text: str) -> None:
    from pipelines.oci.images import Published, record_publication
    from pipelines.publish.oci import RegistryRef
    from pipelines.store.published import publications, publications_path

    settings = published.settings()
    m = find_manifest(settings, REF)
    path = publications_path(settings, m.name, m.tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("latin-1"))
    before = path.read_bytes()
    with pytest.raises(RegistryError, match="is not a publication record") as e:
        publications(settings, m)
    assert e.value.hint is not None and "git checkout" in e.value.hint
    registry = RegistryRef("127.0.0.1:5000", "ns", insecure=True)
    done = Published(m, registry, [f"127.0.0.1:5000/ns/{m.name}:{m.tag}"], "sha256:" + "0" * 64)
    with pytest.raises(RegistryError, match="is not a publication record"):
        record_publication(settings, done)
    assert path.read_bytes() == before


# ---------------------------------------------------------------- one variant's registration failing


def test_a_changed_report_fails_its_variant_alone_and_the_others_still_register(repo: Repo, tmp_path: Path) -> None:
    from pipelines.compose import register_passed

    settings = repo.settings()
    made = candidate(settings, tmp_path / "a", tag="q4_k_m")
    # the report as an older modelmint wrote it, before its validation block: nothing says what passed
    stale = dataclasses.replace(made, report=made.report.but(validation=None))
    assert stale.report.validation is None
    refs, errors = register_passed(settings, {"q4_k_m": lambda: stale,
                                              "q8_0": lambda: candidate(settings, tmp_path / "b", tag="q8_0")})
    assert refs == {"q8_0": "tiny-qwen2:q8_0"}
    assert list(errors) == ["q4_k_m"] and "validation block" in errors["q4_k_m"].cause
    assert not manifest_path(settings, "tiny-qwen2", "q4_k_m").exists()
    assert manifest_path(settings, "tiny-qwen2", "q8_0").exists()


# ---------------------------------------------------------------- dvc.lock after a failed commit or push


def test_a_failed_push_leaves_dvc_lock_as_it_was(published: Repo, tmp_path: Path) -> None:
    from pipelines.core.errors import RemoteError

    settings = published.settings()
    lock = published.root / "dvc.lock"
    before = lock.read_bytes()
    dvc(published.root, "remote", "modify", "local", "url", "/proc/modelmint-no-such-mount/remote")
    with pytest.raises(RemoteError):
        register(settings, candidate(settings, tmp_path / "new", seed=1))
    # dvc.lock still names the registered version, which the remote holds: verify and pull keep working
    assert lock.read_bytes() == before
    dvc(published.root, "remote", "modify", "local", "url", str(published.remote))
    assert verify_remote(settings, [REF]).ok
    m = find_manifest(settings, REF)
    locked = dvcrepo.locked_out(settings, STAGE, m.dvc.path)
    assert locked is not None and locked.md5 == m.dvc.md5
