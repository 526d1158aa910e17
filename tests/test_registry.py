"""Manifests, dvc.yaml from the catalog, and registration into real git + DVC repositories."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError
from registry_env import Repo, candidate, dvc, git, judged, make_repo

import pipelines.store.dvcrepo
from pipelines.core.errors import ManifestInvalid, NotRegistered, RegistryError, RemoteError
from pipelines.core.settings import project_root
from pipelines.registry.register import register
from pipelines.source.catalog import load_catalog
from pipelines.store import dvcgen
from pipelines.store.manifest import (
    Manifest,
    find_manifest,
    list_manifests,
    load_manifest,
    manifest_path,
    parse_ref,
)

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


def _cli(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**repo.env(), "COLUMNS": "200"}
    return subprocess.run([*MODELMINT, *args], env=env, capture_output=True, text=True, cwd=repo.root)


def _count_dvc_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record every DVC process registration starts (the real one still runs)."""
    calls: list[list[str]] = []
    real = pipelines.store.dvcrepo.run

    def spy(argv, **kw):  # type: ignore[no-untyped-def]
        calls.append([str(a) for a in argv])
        return real(argv, **kw)

    monkeypatch.setattr(pipelines.store.dvcrepo, "run", spy)
    return calls


# ---------------------------------------------------------------- dvc.yaml


def test_the_checked_in_dvc_yaml_is_generated_from_the_catalog() -> None:
    root = project_root()
    assert (root / "dvc.yaml").read_text() == dvcgen.render(load_catalog(root / "registry" / "catalog.yaml")), (
        "dvc.yaml is stale: run `modelmint dvc-yaml`"
    )


def test_dvc_reads_one_stage_per_catalog_variant(repo: Repo) -> None:
    stages = dvc(repo.root, "stage", "list", "--name-only").stdout.split()
    assert stages == ["gguf@tiny-qwen2-q4_k_m", "gguf@tiny-qwen2-q8_0"]
    out = dvc(repo.root, "stage", "list").stdout
    assert "artifacts/tiny-qwen2/q4_k_m" in out


def test_cache_is_copy_and_analytics_off() -> None:
    config = (project_root() / ".dvc" / "config").read_text()
    assert 'type = "reflink,copy"' in config and "analytics = false" in config
    assert "symlink" not in config.split("[cache]")[1].split("[")[0].replace("symlinks", "")


# ---------------------------------------------------------------- manifests


def test_an_entry_edited_during_the_build_is_not_registered(repo: Repo, tmp_path: Path) -> None:
    """dvc.lock would record the catalog as it is at the end of the build: an artifact built from the entry as
    it was must not be recorded as up to date with the new one (an edit, or `watch --apply` moving its pin)."""
    settings = repo.settings()
    c = candidate(settings, tmp_path)
    catalog = repo.root / "registry" / "catalog.yaml"
    before = catalog.read_text()
    lock = repo.root / "dvc.lock"
    locked = lock.read_bytes() if lock.exists() else None
    catalog.write_text(before.replace("license: apache-2.0", "license: mit", 1))
    assert catalog.read_text() != before
    with pytest.raises(RegistryError, match=r"tiny-qwen2:q4_k_m: the catalog entry tiny-qwen2 changed while it was "
                                            r"being built \(license\)") as caught:
        register(settings, c)
    assert "modelmint convert tiny-qwen2 --variants q4_k_m --register" in (caught.value.hint or "")
    assert not (repo.root / "artifacts/tiny-qwen2/q4_k_m").exists()
    assert (lock.read_bytes() if lock.exists() else None) == locked
    assert not manifest_path(settings, "tiny-qwen2", "q4_k_m").exists()
    # an edit elsewhere in the catalog (a comment, another entry) is not this artifact's business, nor is the
    # narrower list of types a `--variants` build asked for
    catalog.write_text(before + "# a note\n")
    assert register(settings, dataclasses.replace(c, entry=c.entry.with_quants(["q4_k_m"]))).ran


def test_registration_records_lineage_hashes_and_dvc(repo: Repo, tmp_path: Path, monkeypatch) -> None:
    settings = repo.settings()
    c = candidate(settings, tmp_path)
    done = register(settings, c)
    assert done.ran
    m = done.manifest
    assert m.ref == "tiny-qwen2:q4_k_m" and m.sha256 == c.sha256 and m.size_bytes == c.size_bytes
    assert m.weights_bytes == c.size_bytes  # one GGUF: its weights are the main file (shards: test_weights_size.py)
    assert m.parent is not None and m.parent.artifact == "tiny-qwen2:f16"
    assert m.validation.passed and m.validation.figures.mean_kl == pytest.approx(0.0123)
    assert m.dvc.path == "artifacts/tiny-qwen2/q4_k_m" and m.dvc.pushed and m.dvc.md5.endswith(".dir")
    # the blob is in the workspace, in dvc.lock, in the DVC cache and in the remote
    placed = repo.root / "artifacts/tiny-qwen2/q4_k_m/tiny-qwen2-q4_k_m.gguf"
    assert placed.read_bytes() == c.files[0].read_bytes()
    lock = (repo.root / "dvc.lock").read_text()
    assert m.dvc.md5 in lock and "gguf@tiny-qwen2-q4_k_m" in lock
    remote_objects = {p.relative_to(repo.remote / "files" / "md5").as_posix().replace("/", "") for p in
                      (repo.remote / "files" / "md5").rglob("*") if p.is_file()}
    assert m.dvc.md5 in remote_objects
    assert dvc(repo.root, "status", "gguf@tiny-qwen2-q4_k_m", "--cloud").stdout.strip().endswith("in sync.")
    # written atomically, round-trips, and is what `show` prints
    path = manifest_path(settings, "tiny-qwen2", "q4_k_m")
    assert Manifest.model_validate_json(path.read_text()) == m
    shown = _cli(repo, "show", "tiny-qwen2:q4_k_m")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["sha256"] == c.sha256
    listed = _cli(repo, "list")
    assert listed.returncode == 0 and "tiny-qwen2:q4_k_m" in listed.stdout
    # piped (no terminal, no COLUMNS): whole rows; an 80-column terminal: the ref still whole, others give way
    env = {k: v for k, v in repo.env().items() if k != "COLUMNS"}
    piped = subprocess.run([*MODELMINT, "list"], env=env, capture_output=True, text=True, cwd=repo.root)
    assert m.source.ref in piped.stdout and m.sha256[:12] in piped.stdout
    narrow = subprocess.run([*MODELMINT, "list"], env={**env, "COLUMNS": "80"}, capture_output=True, text=True,
                            cwd=repo.root)
    assert "tiny-qwen2:q4_k_m" in narrow.stdout and max(map(len, narrow.stdout.splitlines())) <= 80

    # the same candidate again: registered already, no DVC process at all
    calls = _count_dvc_calls(monkeypatch)
    again = register(settings, c)
    assert not again.ran and calls == []
    assert again.manifest == m


def test_a_new_blob_for_the_same_tag_replaces_the_registration(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    first = register(settings, candidate(settings, tmp_path, seed=1)).manifest
    second = register(settings, candidate(settings, tmp_path, seed=2)).manifest
    assert first.sha256 != second.sha256 and first.dvc.md5 != second.dvc.md5
    assert find_manifest(settings, "tiny-qwen2:q4_k_m") == second
    assert second.dvc.md5 in (repo.root / "dvc.lock").read_text()


def _valid_manifest_dict(settings, tmp_path: Path) -> dict:
    from pipelines.registry.register import Tracked, _describe, _manifest

    c = candidate(settings, tmp_path)
    d = tmp_path / "dir"
    d.mkdir()
    (d / c.files[0].name).write_bytes(c.files[0].read_bytes())
    return json.loads(_manifest(c, Tracked(_describe(settings, d), "c" * 32 + ".dir"), pushed=True).to_json())


@pytest.mark.parametrize(
    "edit, complaint",
    [
        (lambda m: m.update(extra_field=1), "extra_field"),
        (lambda m: m.update(sha256="not-a-hash"), "sha256"),
        (lambda m: m["validation"].update(passed=False), "validation.passed"),
        (lambda m: m["validation"].update(failures=["mean KLD 0.9 > 0.1"]), "validation.failures"),
        (lambda m: m.update(size_bytes=m["size_bytes"] + 1), "differ"),
        (lambda m: m.update(weights_bytes=m["weights_bytes"] - 1), "weights_bytes"),
        (lambda m: m.pop("weights_bytes"), "weights_bytes"),
        (lambda m: m["dvc"].update(path="artifacts/other/q4_k_m"), "dvc.path"),
        (lambda m: m["files"][0].update(path="../escape.gguf"), "inside the artifact directory"),
        (lambda m: m.update(schema_version=4), "schema_version"),
        (lambda m: m.update(schema_version=1), "version-1 manifest whose validation cannot be read"),
    ],
)
def test_a_manifest_edited_into_an_invalid_state_is_refused(isolated, tmp_path: Path, edit, complaint) -> None:
    repo = make_repo(tmp_path / "r")
    settings = repo.settings()
    raw = _valid_manifest_dict(settings, tmp_path)
    Manifest.model_validate(raw)  # the untouched one is fine
    edit(raw)
    with pytest.raises(ValidationError, match=complaint.split(".")[-1]):
        Manifest.model_validate(raw)


def test_invalid_manifests_are_reported_by_list_show_and_find(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    register(settings, candidate(settings, tmp_path, tag="q4_k_m"))
    register(settings, candidate(settings, tmp_path, tag="q8_0", seed=3))
    bad = manifest_path(settings, "tiny-qwen2", "q8_0")
    original = bad.read_text()
    bad.write_text(original.replace('"passed": true', '"passed": false'))
    listing = list_manifests(settings)
    assert [m.ref for m in listing.manifests] == ["tiny-qwen2:q4_k_m"]
    assert len(listing.invalid) == 1 and "validation.passed" in listing.invalid[0].message
    with pytest.raises(ManifestInvalid, match="git checkout"):
        find_manifest(settings, "tiny-qwen2:q8_0")
    shown = _cli(repo, "show", "tiny-qwen2:q8_0")
    assert shown.returncode == 1 and "is invalid" in shown.stderr and "Traceback" not in shown.stderr
    listed = _cli(repo, "list")
    assert listed.returncode == 1 and "tiny-qwen2:q4_k_m" in listed.stdout and "invalid" in listed.stderr
    # filed under another name than it says
    moved = manifest_path(settings, "tiny-qwen2", "q5_k_m")
    moved.write_text(original)
    with pytest.raises(ManifestInvalid, match="filed as"):
        load_manifest(moved, settings.manifests_dir)
    # not JSON at all
    bad.write_text(original[:40])
    with pytest.raises(ManifestInvalid, match="not JSON"):
        find_manifest(settings, "tiny-qwen2:q8_0")
    # nothing was lost: the good one still reads, the blobs are still in the remote
    assert find_manifest(settings, "tiny-qwen2:q4_k_m").ref == "tiny-qwen2:q4_k_m"


def test_refs_and_unregistered_tags(repo: Repo) -> None:
    settings = repo.settings()
    assert parse_ref("qwen2.5:Q4_K_M") == ("qwen2.5", "q4_k_m")
    from pipelines.core.errors import ConfigError

    with pytest.raises(ConfigError, match="name:tag"):
        parse_ref("qwen2.5")
    with pytest.raises(NotRegistered, match="never registered"):
        find_manifest(settings, "tiny-qwen2:q2_k")


# ---------------------------------------------------------------- failures leave nothing half-registered


def test_missing_remote_is_a_configuration_error(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    dvc(repo.root, "remote", "remove", "local")
    with pytest.raises(RemoteError) as err:
        register(settings, candidate(settings, tmp_path))
    assert not err.value.transient and "remote" in str(err.value)
    assert not manifest_path(settings, "tiny-qwen2", "q4_k_m").exists()


def test_not_a_dvc_repository(isolated, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    (plain / "registry").mkdir(parents=True)
    (plain / "registry" / "catalog.yaml").write_text((project_root() / "registry/catalog.yaml").read_text())
    from pipelines.core.settings import Settings

    settings = Settings.from_env({**os.environ, "MODELMINT_REPO": str(plain)})
    with pytest.raises(RegistryError, match="not a DVC repository"):
        register(settings, candidate(settings, tmp_path))


def test_leftovers_of_a_killed_registration_are_cleaned(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    junk = repo.root / "artifacts/tiny-qwen2/q4_k_m.partial-99999"
    junk.mkdir(parents=True)
    (junk / "half.gguf").write_bytes(b"GGUF")
    register(settings, candidate(settings, tmp_path))
    assert not junk.exists()
    assert sorted(p.name for p in (repo.root / "artifacts/tiny-qwen2").iterdir()) == ["q4_k_m"]


def _register_in_child(repo_root: str, work: str, tmp: str, tag: str, seed: int) -> None:
    from registry_env import Repo, candidate

    r = Repo(Path(repo_root), Path(repo_root).parent / "remote", Path(work))
    settings = r.settings()
    register(settings, candidate(settings, Path(tmp), tag=tag, seed=seed))


def test_concurrent_registrations_share_dvc_lock(repo: Repo, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_register_in_child, args=(str(repo.root), str(repo.work), str(tmp_path / t), t, i))
        for i, t in enumerate(["q4_k_m", "q8_0"])
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    settings = repo.settings()
    refs = [m.ref for m in list_manifests(settings).manifests]
    assert refs == ["tiny-qwen2:q4_k_m", "tiny-qwen2:q8_0"]
    lock = (repo.root / "dvc.lock").read_text()
    for m in list_manifests(settings).manifests:
        assert m.dvc.md5 in lock
    assert git(repo.root, "status", "--porcelain", "artifacts") == ""  # DVC's .gitignore covers them


def test_dvc_lock_is_read_under_dvcs_own_lock(repo: Repo, tmp_path: Path) -> None:
    """DVC rewrites dvc.lock in place while holding .dvc/tmp/lock: a reader must not see it half-written."""
    from dvc.lock import make_lock

    settings = repo.settings()
    c = candidate(settings, tmp_path, tag="q4_k_m")
    reg = register(settings, c)
    lock_file = repo.root / "dvc.lock"
    whole = lock_file.read_text()
    got: list[object] = []
    dvc_lock = make_lock(str(repo.root / ".dvc" / "tmp" / "lock"), tmp_dir=str(repo.root / ".dvc" / "tmp"))
    with dvc_lock:
        lock_file.write_text(whole[: len(whole) // 3])  # what another `dvc commit` leaves mid-write
        reader = threading.Thread(target=lambda: got.append(pipelines.store.dvcrepo.locked_out(settings, c.stage, c.dvc_path)))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive(), "dvc.lock was read while DVC held its lock"
        lock_file.write_text(whole)
    reader.join(30)
    assert not reader.is_alive()
    assert isinstance(got[0], pipelines.store.dvcrepo.LockedOut) and got[0].md5 == reg.manifest.dvc.md5


def test_a_variant_outside_the_catalog_is_refused_before_any_work(repo: Repo) -> None:
    env = {**repo.env(), "COLUMNS": "200"}
    done = subprocess.run([*MODELMINT, "convert", "tiny-qwen2", "--variants", "q6_k", "--register"], env=env, capture_output=True,
                          text=True, cwd=repo.root)
    assert done.returncode == 1
    assert "dvc.yaml has no stage gguf@tiny-qwen2-q6_k" in done.stderr and "modelmint dvc-yaml" in done.stderr
    assert not repo.work.exists()  # nothing was fetched or built


@pytest.mark.slow
def test_dvc_repro_and_the_registry_share_one_record(isolated, tmp_path: Path, monkeypatch) -> None:
    """`dvc repro` builds through the same CLI; a later tracked registration finds DVC's record and pushes it."""
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0"]})
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(repo.work))  # not MODELMINT_REPO: DVC_ROOT says where
    done = dvc(repo.root, "repro", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    settings = repo.settings()
    m = find_manifest(settings, "tiny-qwen2:q8_0")
    assert m.dvc.md5 is None and not m.dvc.pushed  # recorded by DVC itself, not pushed yet
    locked = (repo.root / "dvc.lock").read_text()
    assert "gguf@tiny-qwen2-q8_0" in locked and "--register --no-track" in locked
    assert "didn't change, skipping" in dvc(repo.root, "repro").stdout
    # the CLI with tracking: nothing is rebuilt, DVC's record is kept, the blob is pushed, the manifest says so
    cli = subprocess.run([*MODELMINT, "convert", "tiny-qwen2", "--variants", "q8_0", "--register"],
                         env={**repo.env(), "COLUMNS": "200"}, capture_output=True, text=True, cwd=repo.root)
    assert cli.returncode == 0, cli.stderr
    after = find_manifest(settings, "tiny-qwen2:q8_0")
    assert after.dvc.pushed and after.dvc.md5 is not None and after.dvc.md5 in (repo.root / "dvc.lock").read_text()
    assert after.sha256 == m.sha256 and after.created_at == m.created_at
    assert "up to date" in dvc(repo.root, "status").stdout
    assert "in sync" in dvc(repo.root, "status", "--cloud").stdout


# ---------------------------------------------------------------- the registration key is what was registered


def _rebuilt_elsewhere(settings, c, where: Path, seconds: float):  # type: ignore[no-untyped-def]
    """The same candidate as a rebuild in another work dir hands it over: the same bytes and verdict, a report
    whose paths and timings differ (what llama-perplexity's report really holds), written elsewhere."""
    import dataclasses

    from pipelines.core.fsutil import sha256_file

    where.mkdir(parents=True)
    files = []
    for f in c.files:
        (where / f.name).write_bytes(f.read_bytes())
        files.append(where / f.name)
    report = c.report.but(path=str(files[0]), reference=str(where / "tiny-qwen2-f16.gguf"),
                          smoke={**(c.report.smoke or {}), "seconds": seconds, "prompt": "hello"})
    report_path = where / "report.json"
    report.write(report_path)
    return dataclasses.replace(c, files=tuple(files), report=report, report_sha256=sha256_file(report_path))


def test_rebuilding_the_same_bytes_elsewhere_leaves_the_manifest_unchanged(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    first = _rebuilt_elsewhere(settings, candidate(settings, tmp_path / "c"), tmp_path / "work-a", 1.25)
    done = register(settings, first)
    path = manifest_path(settings, "tiny-qwen2", "q4_k_m")
    before = path.read_bytes()
    again = _rebuilt_elsewhere(settings, first, tmp_path / "work-b", 7.5)
    assert again.report_sha256 != first.report_sha256 and again.files != first.files
    assert again.key == first.key
    second = register(settings, again)
    assert not second.ran and path.read_bytes() == before and second.manifest == done.manifest
    # the same through the words convert/compress print (pipelines.compose)
    from pipelines.compose import register_passed

    lines: list[str] = []
    register_passed(settings, {first.tag: lambda: _rebuilt_elsewhere(settings, first, tmp_path / "work-c", 3.0)},
                    say=lines.append)
    assert "already registered" in lines[0] and path.read_bytes() == before
    # with its workspace copy gone (a fresh clone that registers the same build): placed and pushed again,
    # and still the same manifest, byte for byte
    import shutil

    shutil.rmtree(repo.root / "artifacts/tiny-qwen2/q4_k_m")
    third = register(settings, _rebuilt_elsewhere(settings, first, tmp_path / "work-d", 9.0))
    assert third.ran and path.read_bytes() == before


def test_a_different_verdict_is_a_different_registration(repo: Repo, tmp_path: Path) -> None:
    import dataclasses

    settings = repo.settings()
    c = candidate(settings, tmp_path)
    other = dataclasses.replace(c, report=c.report.but(validation=judged(0.02, 93.5, ppl=(10.1, 10.5))))
    assert other.key != c.key
    assert dataclasses.replace(c, toolchain={**c.toolchain, "llama.cpp": "other"}).key != c.key
    assert dataclasses.replace(c, source={**c.source, "content_sha256": "c" * 64}).key != c.key


# ---------------------------------------------------------------- modelmint verify: the remote's copy


def _remote_object(repo: Repo, manifest, relpath: str) -> Path:  # type: ignore[no-untyped-def]
    """Where the local remote keeps one file of a registered artifact (through its `.dir` listing)."""
    md5 = manifest.dvc.md5
    listing = json.loads((repo.remote / "files/md5" / md5[:2] / md5[2:]).read_text())
    oid = next(e["md5"] for e in listing if e["relpath"] == relpath)
    return repo.remote / "files/md5" / oid[:2] / oid[2:]


def test_verify_checks_every_object_in_the_remote_and_repairs_it(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    q4 = register(settings, candidate(settings, tmp_path, tag="q4_k_m", seed=1)).manifest
    q8 = register(settings, candidate(settings, tmp_path, tag="q8_0", seed=2)).manifest
    repo.commit_all("register two")
    ok = _cli(repo, "verify")
    assert ok.returncode == 0, ok.stderr
    # the GGUF, Modelfile, card, serving record (serve/plans.json) and the directory listing
    assert "tiny-qwen2:q4_k_m: ok (5 objects" in ok.stdout and "tiny-qwen2:q8_0: ok" in ok.stdout

    # one object with bytes flipped in the middle, another gone; `dvc status -c` still says in sync
    damaged = _remote_object(repo, q4, q4.file)
    damaged.chmod(0o644)
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 16] = bytes(b ^ 0xFF for b in raw[len(raw) // 2 : len(raw) // 2 + 16])
    damaged.write_bytes(bytes(raw))
    gone = _remote_object(repo, q8, "Modelfile")
    gone.unlink()
    assert "in sync" in dvc(repo.root, "status", "--cloud").stdout
    bad = _cli(repo, "verify")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    text = " ".join(bad.stderr.split())
    assert f"tiny-qwen2:q4_k_m: {q4.file} (md5 {damaged.parent.name}{damaged.name})" in text and "holds other bytes" in text
    assert "tiny-qwen2:q8_0: Modelfile" in text and "missing" in text
    assert "modelmint verify tiny-qwen2:q4_k_m tiny-qwen2:q8_0 --repair" in text
    assert "modelmint convert tiny-qwen2 --variants q4_k_m --register" in text
    # one ref only: the other artifact is not looked at
    one = _cli(repo, "verify", "tiny-qwen2:q8_0")
    assert one.returncode == 1 and "q4_k_m" not in one.stdout + one.stderr.replace("tiny-qwen2:q8_0", "")

    # verify never pulls: a fresh clone checks the remote without placing anything or filling its cache
    git(tmp_path, "clone", "-q", str(repo.root), "clone")
    clone = Repo(tmp_path / "clone", repo.remote, repo.work)
    env = {**clone.env(), "COLUMNS": "200"}
    there = subprocess.run([*MODELMINT, "verify"], env=env, capture_output=True, text=True, cwd=clone.root)
    assert there.returncode == 1 and "holds other bytes" in " ".join(there.stderr.split())
    assert not (clone.root / "artifacts").exists() and not (clone.root / ".dvc/cache").exists()

    # --repair on the registering machine uploads its own copies again; then all is well
    fixed = _cli(repo, "verify", "--repair")
    assert fixed.returncode == 0, fixed.stderr
    assert "uploaded again" in fixed.stderr and gone.is_file()
    assert _cli(repo, "verify").returncode == 0
    from pipelines.registry.pull import pull

    assert pull(clone.settings(), "tiny-qwen2:q4_k_m").fetched


def test_verify_reports_invalid_manifests_and_unknown_refs(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    register(settings, candidate(settings, tmp_path))
    path = manifest_path(settings, "tiny-qwen2", "q4_k_m")
    path.write_text(path.read_text()[:50])
    done = _cli(repo, "verify")
    assert done.returncode == 1 and "is invalid" in done.stderr and "Traceback" not in done.stderr
    unknown = _cli(repo, "verify", "tiny-qwen2:q2_k")
    assert unknown.returncode == 1 and "never registered" in unknown.stderr


# ---------------------------------------------------------------- a registered version never moves backwards


def _at(settings, tmp_path: Path, revision: str, *, seed: int, tag: str = "q4_k_m"):
    """A candidate built from hub commit `revision` (a stale webhook delivery rebuilds an older one)."""
    from dataclasses import replace

    c = candidate(settings, tmp_path, seed=seed, tag=tag)
    return replace(c, source={**c.source, "kind": "hub", "repo": "Qwen/tiny", "revision": revision})


def test_an_older_source_commit_is_refused_unless_forced(repo: Repo, tmp_path: Path) -> None:
    settings = repo.settings()
    a, b = "a" * 40, "b" * 40
    register(settings, _at(settings, tmp_path, a, seed=1))
    repo.commit_all("register q4_k_m at A")
    current = register(settings, _at(settings, tmp_path, b, seed=2)).manifest
    repo.commit_all("register q4_k_m at B")
    lock = (repo.root / "dvc.lock").read_bytes()
    placed = sorted(p.name for p in (repo.root / "artifacts/tiny-qwen2/q4_k_m").iterdir())
    with pytest.raises(RegistryError, match="move it backwards") as refused:
        register(settings, _at(settings, tmp_path, a, seed=3))
    assert b in str(refused.value) and "--force" in str(refused.value)
    # nothing moved: manifest, dvc.lock, the artifact directory, git
    assert find_manifest(settings, "tiny-qwen2:q4_k_m") == current
    assert (repo.root / "dvc.lock").read_bytes() == lock
    assert sorted(p.name for p in (repo.root / "artifacts/tiny-qwen2/q4_k_m").iterdir()) == placed
    assert git(repo.root, "status", "--porcelain") == ""
    # the same commit again, or a commit the tag never had, is not an older version
    assert register(settings, _at(settings, tmp_path, b, seed=2)).manifest == current
    forced = register(settings, replace_force(_at(settings, tmp_path, a, seed=3))).manifest
    assert forced.source.revision == a and forced.replaces is not None and forced.replaces.revision == b
    assert find_manifest(settings, "tiny-qwen2:q4_k_m") == forced


def replace_force(c):
    from dataclasses import replace

    return replace(c, force=True)


def test_the_replaced_version_is_older_without_git_history(repo: Repo, tmp_path: Path) -> None:
    """Manifests not yet committed: what the current one `replaces` is still older."""
    settings = repo.settings()
    register(settings, _at(settings, tmp_path, "a" * 40, seed=1))
    register(settings, _at(settings, tmp_path, "b" * 40, seed=2))
    with pytest.raises(RegistryError, match="move it backwards"):
        register(settings, _at(settings, tmp_path, "a" * 40, seed=3))
    # a commit never registered for the tag is judged by no one here (the watcher orders upstream commits)
    assert register(settings, _at(settings, tmp_path, "c" * 40, seed=4)).manifest.source.revision == "c" * 40


def test_a_commit_the_tag_never_had_is_older_when_the_hubs_history_says_so(repo: Repo, tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The pin moved P -> A -> B and both conversions ran; B's registered first, A's (never registered for the tag)
    finishes last: the hub's history of B holds A, so A is refused. A later commit C is registered; with the hub
    unreachable, a commit is registered with a warning (registration cannot tell, and must not stop)."""
    from dataclasses import replace

    from hubserver import HubServer
    from registry_env import free_port

    with HubServer() as hub:
        hub.add_repo("Qwen/tiny", {"README.md": b"P\n"})
        a = hub.push("Qwen/tiny", {"README.md": b"A\n"}).commit
        b = hub.push("Qwen/tiny", {"README.md": b"B\n"}).commit
        settings = repo.settings(HF_ENDPOINT=hub.endpoint)
        current = register(settings, _at(settings, tmp_path, b, seed=2)).manifest
        lock = (repo.root / "dvc.lock").read_bytes()
        with pytest.raises(RegistryError, match="move it backwards") as refused:
            register(settings, _at(settings, tmp_path, a, seed=1))
        assert f"a later commit of Qwen/tiny than {a}" in refused.value.message and "--force" in str(refused.value)
        assert find_manifest(settings, "tiny-qwen2:q4_k_m") == current
        assert (repo.root / "dvc.lock").read_bytes() == lock
        c = hub.push("Qwen/tiny", {"README.md": b"C\n"}).commit
        assert register(settings, _at(settings, tmp_path, c, seed=3)).manifest.source.revision == c
    d = "d" * 40
    down = repo.settings(HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with caplog.at_level("WARNING", logger="pipelines.registry.register"):
        assert register(down, _at(down, tmp_path, d, seed=4)).manifest.source.revision == d
        assert f"the hub could not say whether Qwen/tiny@{d[:12]} is older than the registered {c[:12]}" in caplog.text
        # another upstream repo's commit is not judged by this one's history: the hub is not asked
        caplog.clear()
        other = _at(down, tmp_path, a, seed=5)
        other = replace(other, source={**other.source, "repo": "acme/other"})
        assert register(down, other).manifest.source.revision == a and "could not say" not in caplog.text


def test_a_refused_older_version_fails_that_variant_alone(repo: Repo, tmp_path: Path) -> None:
    from pipelines.compose import register_passed

    settings = repo.settings()
    register(settings, _at(settings, tmp_path / "1", "a" * 40, seed=1))
    register(settings, _at(settings, tmp_path / "2", "b" * 40, seed=2))
    refs, errors = register_passed(settings, {
        "q4_k_m": lambda: _at(settings, tmp_path / "3", "a" * 40, seed=3),
        "q8_0": lambda: _at(settings, tmp_path / "4", "a" * 40, seed=4, tag="q8_0"),
    })
    assert refs == {"q8_0": "tiny-qwen2:q8_0"} and list(errors) == ["q4_k_m"]
    refused = errors["q4_k_m"]
    assert refused.error == "OlderVersionRefused" and "b" * 40 in refused.message and "--force" in (refused.hint or "")
    refs, errors = register_passed(settings, {"q4_k_m": lambda: _at(settings, tmp_path / "5", "a" * 40, seed=5)},
                                   force=True)
    assert refs == {"q4_k_m": "tiny-qwen2:q4_k_m"} and errors == {}


def test_convert_and_compress_take_force() -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    for command in ("convert", "compress"):
        shown = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert shown.exit_code == 0 and "--force" in shown.output
