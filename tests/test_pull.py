"""`modelmint pull`: from a fresh clone, through the real DVC remote, checked against the manifest."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from registry_env import Repo, candidate, dvc, git

import pipelines.store.dvcrepo
from pipelines.core.errors import BlobMismatch, ManifestInvalid, NotRegistered, RemoteError
from pipelines.registry.pull import pull
from pipelines.registry.register import register
from pipelines.store.manifest import manifest_path

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


@pytest.fixture
def published(repo: Repo, tmp_path: Path) -> Repo:
    """A project with tiny-qwen2:q4_k_m registered and pushed, and the registry committed to git."""
    settings = repo.settings()
    c = candidate(settings, tmp_path / "build")
    register(settings, c)
    repo.commit_all("register tiny-qwen2:q4_k_m")
    return repo


def _clone(repo: Repo, dest: Path) -> Repo:
    git(dest.parent, "clone", "-q", str(repo.root), dest.name)
    return Repo(dest, repo.remote, repo.work)


def _pull_cli(clone: Repo, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**clone.env(), "COLUMNS": "200"}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([*MODELMINT, "pull", *args], env=env, capture_output=True, text=True, cwd=clone.root)


def test_pull_into_a_fresh_clone(published: Repo, tmp_path: Path) -> None:
    clone = _clone(published, tmp_path / "clone")
    assert not (clone.root / "artifacts").exists()
    done = _pull_cli(clone, "tiny-qwen2:q4_k_m")
    assert done.returncode == 0, done.stderr
    assert "fetched and verified" in done.stdout
    placed = clone.root / "artifacts/tiny-qwen2/q4_k_m/tiny-qwen2-q4_k_m.gguf"
    original = published.root / "artifacts/tiny-qwen2/q4_k_m/tiny-qwen2-q4_k_m.gguf"
    assert placed.read_bytes() == original.read_bytes()
    # DVC agrees the workspace is what dvc.lock records
    assert "up to date" in dvc(clone.root, "status", "gguf@tiny-qwen2-q4_k_m").stdout
    # again: already in place, nothing fetched
    again = pull(clone.settings(), "tiny-qwen2:q4_k_m")
    assert not again.fetched


def test_pull_to_a_destination_prints_the_ollama_commands(published: Repo, tmp_path: Path) -> None:
    clone = _clone(published, tmp_path / "clone")
    dest = tmp_path / "models" / "tiny"
    no_ollama = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    done = _pull_cli(clone, "tiny-qwen2:q4_k_m", "--dest", str(dest), path=no_ollama)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["Modelfile", "README.md", "serve", "tiny-qwen2-q4_k_m.gguf"]
    assert [p.name for p in (dest / "serve").iterdir()] == ["plans.json"]  # a synthetic GGUF: refusals only
    assert "FROM ./tiny-qwen2-q4_k_m.gguf" in (dest / "Modelfile").read_text()
    assert f"ollama create tiny-qwen2:q4_k_m -f {dest / 'Modelfile'}" in done.stdout
    assert not (clone.root / "artifacts").exists()


def test_pull_to_a_destination_that_is_a_file_is_one_error_line(published: Repo, tmp_path: Path) -> None:
    clone = _clone(published, tmp_path / "clone")
    dest = tmp_path / "notes.txt"
    dest.write_text("mine\n")
    done = _pull_cli(clone, "tiny-qwen2:q4_k_m", "--dest", str(dest))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(dest) in errors[0] and "not a directory" in errors[0], done.stderr
    assert dest.read_text() == "mine\n"


def test_pull_runs_ollama_create_when_it_is_on_path(published: Repo, tmp_path: Path) -> None:
    clone = _clone(published, tmp_path / "clone")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ollama.log"
    # A stand-in that records its arguments (no Ollama server here); `ollama run` must answer something.
    shim = bin_dir / "ollama"
    shim.write_text(f"#!/bin/sh\necho \"$1 $2 $3 $4\" >> {log}\necho hello\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    done = _pull_cli(clone, "tiny-qwen2:q4_k_m", path=f"{bin_dir}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    modelfile = clone.root / "artifacts/tiny-qwen2/q4_k_m/Modelfile"
    assert "FROM ./tiny-qwen2-q4_k_m.gguf" in modelfile.read_text()
    assert log.read_text().splitlines()[0] == f"create tiny-qwen2:q4_k_m -f {modelfile}"
    assert log.read_text().splitlines()[1].startswith("run tiny-qwen2:q4_k_m")
    assert "ollama create tiny-qwen2:q4_k_m done" in done.stdout


def _corrupt_remote_blob(repo: Repo, sha_source: Path) -> Path:
    """Overwrite the remote's copy of the GGUF with other bytes of the same size."""
    from pipelines.core.fsutil import sha256_file

    md5 = __import__("hashlib").md5(sha_source.read_bytes()).hexdigest()
    obj = repo.remote / "files" / "md5" / md5[:2] / md5[2:]
    assert obj.is_file(), sha256_file(sha_source)
    size = obj.stat().st_size
    obj.chmod(0o644)
    obj.write_bytes(b"\0" * size)
    return obj


def test_a_sha256_mismatch_refuses_and_keeps_what_was_there(published: Repo, tmp_path: Path) -> None:
    original = published.root / "artifacts/tiny-qwen2/q4_k_m/tiny-qwen2-q4_k_m.gguf"
    _corrupt_remote_blob(published, original)
    clone = _clone(published, tmp_path / "clone")
    dest = clone.root / "artifacts/tiny-qwen2/q4_k_m"
    dest.mkdir(parents=True)
    (dest / "tiny-qwen2-q4_k_m.gguf").write_bytes(b"what the user had")
    with pytest.raises(BlobMismatch, match="nothing was replaced") as err:
        pull(clone.settings(), "tiny-qwen2:q4_k_m")
    assert err.value.expected != err.value.actual
    assert (dest / "tiny-qwen2-q4_k_m.gguf").read_bytes() == b"what the user had"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["q4_k_m"]  # no partial left behind
    # the CLI says it in one message, without a traceback
    done = _pull_cli(clone, "tiny-qwen2:q4_k_m")
    assert done.returncode == 1 and "sha256" in done.stderr and "Traceback" not in done.stderr


def test_pull_of_a_tag_never_registered(published: Repo) -> None:
    with pytest.raises(NotRegistered, match=r"tiny-qwen2:q8_0 was never registered \(registered: tiny-qwen2:q4_k_m\)"):
        pull(published.settings(), "tiny-qwen2:q8_0")
    done = _pull_cli(published, "nope:q4_k_m")
    assert done.returncode == 1 and "never registered" in done.stderr and "modelmint list" in done.stderr


def test_pull_with_no_remote_configured(published: Repo, tmp_path: Path) -> None:
    clone = _clone(published, tmp_path / "clone")
    dvc(clone.root, "remote", "default", "--unset")
    with pytest.raises(RemoteError, match="remote"):
        pull(clone.settings(), "tiny-qwen2:q4_k_m")
    assert not (clone.root / "artifacts").exists()


def test_pull_from_a_remote_that_lacks_the_blob(published: Repo, tmp_path: Path) -> None:
    clone = _clone(published, tmp_path / "clone")
    empty = tmp_path / "empty-remote"
    empty.mkdir()
    dvc(clone.root, "remote", "modify", "--local", "local", "url", str(empty))
    with pytest.raises(RemoteError, match="does not hold"):
        pull(clone.settings(), "tiny-qwen2:q4_k_m")
    assert not (clone.root / "artifacts").exists()


def test_manifest_and_dvc_lock_must_agree(published: Repo, tmp_path: Path) -> None:
    settings = published.settings()
    path = manifest_path(settings, "tiny-qwen2", "q4_k_m")
    text = path.read_text()
    import json

    raw = json.loads(text)
    raw["dvc"]["md5"] = "0" * 32 + ".dir"
    path.write_text(json.dumps(raw))
    # the workspace copy is removed so that pull has to go to DVC
    import shutil

    shutil.rmtree(published.root / "artifacts/tiny-qwen2/q4_k_m")
    with pytest.raises(ManifestInvalid, match=r"dvc\.lock records"):
        pull(settings, "tiny-qwen2:q4_k_m")


def test_pull_runs_dvc_only_when_something_is_missing(published: Repo, monkeypatch) -> None:
    calls: list[list[str]] = []
    real = pipelines.store.dvcrepo.run
    monkeypatch.setattr(pipelines.store.dvcrepo, "run", lambda argv, **kw: calls.append(list(map(str, argv))) or real(argv, **kw))
    assert not pull(published.settings(), "tiny-qwen2:q4_k_m").fetched
    assert calls == []


# ---------------------------------------------------------------- an S3 remote (moto_server on 127.0.0.1)


@pytest.fixture
def s3(isolated, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A local S3 endpoint (moto's server, the real S3 protocol) with a bucket."""
    import time
    import urllib.request

    from registry_env import free_port

    port = free_port()
    log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError((tmp_path / "moto.log").read_text()) from None
            time.sleep(0.2)
    req = urllib.request.Request(f"{url}/modelmint-test", method="PUT")
    urllib.request.urlopen(req, timeout=5)
    yield url, proc
    proc.terminate()
    proc.wait(10)
    log.close()


def _use_s3(repo_root: Path, url: str) -> None:
    dvc(repo_root, "remote", "add", "-d", "-f", "s3", "s3://modelmint-test/registry")
    dvc(repo_root, "remote", "modify", "s3", "endpointurl", url)
    # Credentials belong in .dvc/config.local (not in git); moto accepts any.
    dvc(repo_root, "remote", "modify", "--local", "s3", "access_key_id", "testing")
    dvc(repo_root, "remote", "modify", "--local", "s3", "secret_access_key", "testing")


def test_push_and_pull_through_an_s3_remote(s3, tmp_path: Path) -> None:
    from registry_env import make_repo

    url, moto = s3
    repo = make_repo(tmp_path / "p")
    _use_s3(repo.root, url)
    repo.commit_all("S3 remote")
    settings = repo.settings()
    register(settings, candidate(settings, tmp_path / "build"))
    repo.commit_all("register")
    listing = urllib_list(url, "modelmint-test")
    assert any(k.startswith("registry/files/md5/") for k in listing)

    git(tmp_path, "clone", "-q", str(repo.root), "clone")
    clone = Repo(tmp_path / "clone", repo.remote, repo.work)
    _use_s3(clone.root, url)  # config.local (credentials) is per checkout
    done = pull(clone.settings(), "tiny-qwen2:q4_k_m")
    assert done.fetched and (clone.root / "artifacts/tiny-qwen2/q4_k_m/tiny-qwen2-q4_k_m.gguf").is_file()

    # The endpoint goes away: pushing is a transient error, and nothing is registered.
    moto.terminate()
    moto.wait(10)
    from pipelines.core.errors import RemoteUnavailable

    with pytest.raises(RemoteUnavailable):
        register(settings, candidate(settings, tmp_path / "build2", tag="q8_0", seed=5))
    assert not manifest_path(settings, "tiny-qwen2", "q8_0").exists()


def test_an_object_gone_from_an_s3_remote_is_uploaded_again(s3, tmp_path: Path) -> None:
    """The re-upload writes each bad object through DVC's own object store, to S3 as to a directory: by registering
    again, and by verify --repair (which hashes the remote's copies)."""
    import json

    from registry_env import make_repo

    from pipelines.registry.verify import verify_remote
    from pipelines.store import dvcrepo

    url, _moto = s3
    repo = make_repo(tmp_path / "p")
    _use_s3(repo.root, url)
    repo.commit_all("S3 remote")
    settings = repo.settings()
    m = register(settings, candidate(settings, tmp_path / "build")).manifest
    listing = json.loads(dvcrepo.cache_object(dvcrepo.cache_dir(settings), m.dvc.md5).read_text())
    oid = next(e["md5"] for e in listing if e["relpath"] == m.file)
    key = f"registry/files/md5/{oid[:2]}/{oid[2:]}"

    def delete() -> None:
        import boto3

        boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").delete_object(Bucket="modelmint-test", Key=key)
        assert key not in urllib_list(url, "modelmint-test")

    delete()
    again = register(settings, candidate(settings, tmp_path / "build"))
    assert not again.ran and len(again.reuploaded) == 1 and m.file in again.reuploaded[0]
    assert key in urllib_list(url, "modelmint-test")
    delete()
    assert not verify_remote(settings, [m.ref]).ok
    fixed = verify_remote(settings, [m.ref], repair=True)
    assert fixed.ok and len(fixed.artifacts[0].repaired) == 1, fixed.error()
    assert key in urllib_list(url, "modelmint-test")


def urllib_list(url: str, bucket: str) -> list[str]:
    import re
    import urllib.request

    body = urllib.request.urlopen(f"{url}/{bucket}?list-type=2", timeout=5).read().decode()
    return re.findall(r"<Key>([^<]+)</Key>", body)


# ---------------------------------------------------------------- pull while the same tag is being registered


def _half_registered(published: Repo, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A registration of a new version stopped between `dvc commit` and its push + manifest (real DVC)."""
    from pipelines.registry import register as reg

    settings = published.settings()
    c = candidate(settings, tmp_path / "build-2", seed=2)
    return settings, c, reg.track(settings, c, reg.place(settings, c))


def test_pull_waits_for_a_registration_of_the_same_tag(published: Repo, tmp_path: Path) -> None:
    import time

    from pipelines.core.fsutil import sha256_file
    from pipelines.registry import register as reg

    settings, c, tracked = _half_registered(published, tmp_path)
    started = time.monotonic()
    proc = subprocess.Popen([*MODELMINT, "pull", "tiny-qwen2:q4_k_m", "--no-ollama"], env={**published.env(),
                            "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=published.root)
    time.sleep(4)
    assert proc.poll() is None, proc.communicate()  # still waiting, not failed
    done = reg.publish(settings, c, tracked)  # the push and the manifest: the registration ends
    out, errs = proc.communicate(timeout=120)
    assert proc.returncode == 0, errs
    assert "invalid" not in out + errs and "waiting" in errs
    assert time.monotonic() - started < 60
    placed = published.root / done.manifest.dvc.path / done.manifest.file
    assert sha256_file(placed) == done.manifest.sha256 == c.sha256


def test_pull_after_a_registration_stopped_midway_says_so(published: Repo, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import pipelines.registry.pull as pulling
    from pipelines.core.errors import RegistryError

    settings, _c, _tracked = _half_registered(published, tmp_path)
    monkeypatch.setattr(pulling, "REGISTRATION_WAIT_S", 1.0, raising=False)
    with pytest.raises(RegistryError) as stopped:
        pull(settings, "tiny-qwen2:q4_k_m", dest=tmp_path / "out", ollama=False)
    assert not isinstance(stopped.value, ManifestInvalid)
    assert "registration" in stopped.value.message and "--register" in (stopped.value.hint or "")
    assert not (tmp_path / "out").exists()
