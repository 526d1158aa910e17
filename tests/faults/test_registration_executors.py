"""Registration faults through both executors of one step list: the local one (`modelmint convert --register`, the
real CLI in a subprocess) and the Prefect one (the `convert` flow against Prefect's test server, as in
tests/test_flows.py). Each fault is a real tool failing for a real cause: an unreachable DVC remote, a DVC cache on
a full filesystem, the catalog entry edited while the run validates.

Whichever executor runs it, the same promises hold: the run fails with the cause and the next command (no
traceback), dvc.lock is byte for byte what it was, the registered version stays whole (its manifest unchanged, its
remote copy intact), and the rerun once the cause is gone registers the new version without building it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
from prefect.testing.utilities import prefect_test_harness
from registry_env import Repo, candidate, dvc, flip_middle, make_repo

from pipelines.core.fsutil import free_bytes
from pipelines.registry.register import register
from pipelines.registry.verify import verify_remote
from pipelines.store import dvcrepo
from pipelines.store.manifest import find_manifest, manifest_path

pytestmark = pytest.mark.slow

MODEL, VARIANT = "tiny-qwen2", "q4_k_m"
REF = f"{MODEL}:{VARIANT}"
REBUILD = f"modelmint convert {MODEL} --variants {VARIANT} --register"
EXECUTORS = ["cli", "flow"]
_TIMEOUT_S = 900  # a bound, so that a hang fails the test instead of blocking the suite


@dataclass(frozen=True)
class Ran:
    """How a run ended: whether it completed, and what it said of its failure (the CLI's stderr; the flow run's
    final state message), whitespace folded so that a wrapped line still reads as one."""

    ok: bool
    said: str


@pytest.fixture(scope="module")
def harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="module")
def shared_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build directory for the module: every run after the first finds its build steps' receipts."""
    return tmp_path_factory.mktemp("work")


@pytest.fixture
def project(harness: None, isolated: Path, tmp_path: Path, shared_work: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Repo]:
    """A git + DVC project whose tiny-qwen2:q4_k_m is registered already (a synthetic version), so that a failed
    registration of the real build has a dvc.lock record and a manifest to leave as they were."""
    repo = make_repo(tmp_path, work=shared_work)
    for key, value in {"MODELMINT_REPO": repo.root, "MODELMINT_WORK_DIR": shared_work,
                       "MODELMINT_KEEP_SCRATCH": "1"}.items():
        monkeypatch.setenv(key, str(value))
    settings = repo.settings()
    register(settings, candidate(settings, tmp_path / "earlier", tag=VARIANT, seed=7))
    repo.commit_all(f"register {REF}")
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        yield repo


def _run_cli(repo: Repo) -> Ran:
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "convert", MODEL, "--variants", VARIANT, "--register"],
                          env={**os.environ, "COLUMNS": "400"}, capture_output=True, text=True, cwd=repo.root,
                          timeout=_TIMEOUT_S)
    assert "Traceback" not in done.stderr, done.stderr
    return Ran(done.returncode == 0, " ".join(done.stderr.split()))


def _run_flow(_repo: Repo) -> Ran:
    from flows.convert import convert

    state = convert(model=MODEL, variants=[VARIANT], return_state=True)
    return Ran(state.is_completed(), " ".join((state.message or "").split()))


RUN: dict[str, Callable[[Repo], Ran]] = {"cli": _run_cli, "flow": _run_flow}


@dataclass(frozen=True)
class Before:
    lock: bytes
    manifest: bytes


def _before(repo: Repo) -> Before:
    return Before((repo.root / "dvc.lock").read_bytes(),
                  manifest_path(repo.settings(), MODEL, VARIANT).read_bytes())


def _assert_failed_and_nothing_moved(repo: Repo, ran: Ran, before: Before, *said: str) -> None:
    """The run failed saying `said`; dvc.lock and the registered version are as they were, and whole."""
    assert not ran.ok, "the run completed despite the fault"
    for text in said:
        assert text in ran.said, (text, ran.said)
    assert (repo.root / "dvc.lock").read_bytes() == before.lock
    assert manifest_path(repo.settings(), MODEL, VARIANT).read_bytes() == before.manifest
    checked = verify_remote(repo.settings(), [REF])
    assert checked.ok, checked.error()


def _assert_rerun_registers(repo: Repo, run: Callable[[Repo], Ran], shared_work: Path) -> None:
    """The rerun registers the built variant (pushed, recorded in dvc.lock), building nothing again."""
    [built] = shared_work.rglob(f"{MODEL}-{VARIANT}.gguf")
    stamp = built.stat().st_mtime_ns
    again = run(repo)
    assert again.ok, again.said
    m = find_manifest(repo.settings(), REF)
    assert m.dvc.pushed and m.dvc.md5 is not None and m.dvc.md5 in (repo.root / "dvc.lock").read_text()
    assert m.source.kind == "generated" and m.parent is not None and m.parent.artifact == f"{MODEL}:f16"
    assert built.stat().st_mtime_ns == stamp, "the rerun quantized again"
    assert verify_remote(repo.settings(), [REF]).ok


# ---------------------------------------------------------------- the faults


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_unreachable_remote_fails_the_registration_and_the_rerun_registers(
    project: Repo, shared_work: Path, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    # the remote's mount goes away under a run already started (the check before any work refuses a remote
    # directory that does not exist up front otherwise: tests/test_resources.py)
    monkeypatch.setenv("MODELMINT_SKIP_RESOURCE_CHECK", "1")
    before = _before(project)
    dvc(project.root, "remote", "modify", "local", "url", "/proc/modelmint-no-such-mount/remote")
    ran = RUN[executor](project)
    dvc(project.root, "remote", "modify", "local", "url", str(project.remote))
    _assert_failed_and_nothing_moved(project, ran, before, f"{VARIANT}: register: RemoteError", "does not exist",
                                     "dvc remote modify")
    _assert_rerun_registers(project, RUN[executor], shared_work)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_full_dvc_cache_fails_the_registration_and_the_rerun_registers(
    project: Repo, shared_work: Path, small_disk: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    # the disk fills under a run already started (the check before any work refuses it up front otherwise:
    # tests/test_resources.py)
    monkeypatch.setenv("MODELMINT_SKIP_RESOURCE_CHECK", "1")
    before = _before(project)
    cache = dvcrepo.cache_dir(project.settings())
    mnt = small_disk("64m")  # room for the built q4_k_m (24.5 MiB) once the fill is gone
    shutil.copytree(cache, mnt, dirs_exist_ok=True)  # the cache as it is, on a disk with 1 MiB left
    fill = mnt / "fill"
    fill.write_bytes(b"\0" * (free_bytes(mnt) - (1 << 20)))
    subprocess.run(["mount", "--bind", str(mnt), str(cache)], check=True)
    try:
        ran = RUN[executor](project)
        # a full disk stops every variant alike: the run's own error, not one variant's
        _assert_failed_and_nothing_moved(project, ran, before, f"no space left on the device holding {cache}",
                                         "(the DVC cache)", "dvc cache dir /path/on/a/larger/disk")
        fill.unlink()
        _assert_rerun_registers(project, RUN[executor], shared_work)
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=True)


def _validating(work: Path) -> bool:
    """Whether a validation tool (llama-completion, llama-perplexity) of a build in `work` runs now, seen in /proc."""
    mark = str(work).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if mark in argv and (b"llama-completion" in argv or b"llama-perplexity" in argv):
            return True
    return False


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_catalog_entry_edited_while_validating_registers_nothing_and_the_rerun_registers(
    project: Repo, shared_work: Path, executor: str
) -> None:
    """`watch --apply` or a hand edit moving the entry while the run validates: the registration refuses the build,
    naming the change and the rebuild."""
    # the report gone, validation runs again (from the receipts of the steps before it): a window to edit in
    for report in shared_work.rglob(f"{MODEL}-{VARIANT}.report.json"):
        report.unlink()
    before = _before(project)
    catalog = project.root / "registry" / "catalog.yaml"
    text = catalog.read_text()
    assert "license: apache-2.0" in text
    edited: list[str] = []

    def edit_when_validating() -> None:
        deadline = time.monotonic() + _TIMEOUT_S
        while time.monotonic() < deadline:
            if _validating(shared_work):
                catalog.write_text(text.replace("license: apache-2.0", "license: mit", 1))
                edited.append("license")
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=edit_when_validating, daemon=True)
    watcher.start()
    ran = RUN[executor](project)
    watcher.join(timeout=5)
    assert edited, "the run was never seen validating"
    _assert_failed_and_nothing_moved(project, ran, before,
                                     f"the catalog entry {MODEL} changed while it was being built (license)", REBUILD)
    # refused before anything was placed: the workspace holds the registered version's files still
    assert not any((project.root / "artifacts" / MODEL).glob(f"{VARIANT}.partial-*"))
    m = find_manifest(project.settings(), REF)
    assert hashlib.sha256((project.root / m.dvc.path / m.file).read_bytes()).hexdigest() == m.sha256
    _assert_rerun_registers(project, RUN[executor], shared_work)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_remote_that_cannot_be_reached_fails_the_registration_and_the_rerun_registers(
    project: Repo, shared_work: Path, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    """An S3 remote whose endpoint refuses connections: transient, so the flow retries the registration (here at
    once) where the CLI does not; each attempt puts dvc.lock back, and the last one's error is the run's."""
    from registry_env import free_port

    monkeypatch.setattr("pipelines.compose.RETRY_DELAYS", (0, 0, 0))
    before = _before(project)
    configs = {p: p.read_bytes() if p.is_file() else None
               for p in (project.root / ".dvc" / "config", project.root / ".dvc" / "config.local")}
    dvc(project.root, "remote", "add", "-d", "s3", "s3://modelmint-test/registry")
    dvc(project.root, "remote", "modify", "s3", "endpointurl", f"http://127.0.0.1:{free_port()}")  # nothing listens
    dvc(project.root, "remote", "modify", "--local", "s3", "access_key_id", "testing")
    dvc(project.root, "remote", "modify", "--local", "s3", "secret_access_key", "testing")
    try:
        ran = RUN[executor](project)
    finally:  # the local remote the default again
        for path, raw in configs.items():
            path.unlink(missing_ok=True)
            if raw is not None:
                path.write_bytes(raw)
    _assert_failed_and_nothing_moved(project, ran, before, f"{VARIANT}: register: RemoteUnavailable",
                                     "could not be reached", "rerun the same command")
    _assert_rerun_registers(project, RUN[executor], shared_work)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_remote_object_damaged_after_registration_is_uploaded_again_by_the_rerun(
    project: Repo, executor: str
) -> None:
    """The remote's copy of a registered GGUF damaged since (a bad disk, a hand edit): registering again is how it is
    repaired (tests/faults/test_registry_faults.py), by the flow's rerun as by the CLI's, whose registration step the
    flow would otherwise take from its cache without looking at the remote."""
    first = RUN[executor](project)
    assert first.ok, first.said
    m = find_manifest(project.settings(), REF)
    listing = project.remote / "files" / "md5" / m.dvc.md5[:2] / m.dvc.md5[2:]
    oid = next(e["md5"] for e in json.loads(listing.read_text()) if e["relpath"] == m.file)
    obj = project.remote / "files" / "md5" / oid[:2] / oid[2:]
    flip_middle(obj)
    assert not verify_remote(project.settings(), [REF]).ok
    before = _before(project)
    again = RUN[executor](project)
    assert again.ok, again.said
    assert hashlib.sha256(obj.read_bytes()).hexdigest() == m.sha256
    assert verify_remote(project.settings(), [REF]).ok
    # repaired in place: the registration itself stands as it was
    assert (project.root / "dvc.lock").read_bytes() == before.lock
    assert manifest_path(project.settings(), MODEL, VARIANT).read_bytes() == before.manifest
