"""What `modelmint site build --out` may replace, and `site serve` on bad requests and a busy port: the real CLI
(`python -m pipelines.cli` of this tree) on real folders, a real git checkout and a real server on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from registry_env import Repo, git

from pipelines.site.build import KEY_FILE, build_site, refresh_site

ROOT = Path(__file__).resolve().parents[1]


def _env(repo: Repo, **extra: str) -> dict[str, str]:
    return {**repo.env(), "PYTHONPATH": str(ROOT), "COLUMNS": "200", **extra}


def _cli(repo: Repo, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        env=_env(repo, **env),
        cwd=cwd or repo.root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` (`.git` included) with its bytes (None for a folder)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


def _refused(proc: subprocess.CompletedProcess[str], says: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "a bug in modelmint" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: will not build the site in"), proc.stderr
    assert says in proc.stderr and "→ give --out a new or empty folder" in proc.stderr, proc.stderr


def test_a_folder_of_notes_is_refused_and_kept(repo: Repo, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    (notes / "2026").mkdir(parents=True)
    (notes / "todo.md").write_text("- ship the site\n")
    (notes / "2026" / "march.md").write_text("nothing to lose\n")
    before = _tree(notes)
    _refused(_cli(repo, "site", "build", "--out", str(notes)), "is not a modelmint site")
    assert _tree(notes) == before
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_a_git_checkout_is_refused_and_keeps_its_history(repo: Repo, tmp_path: Path) -> None:
    clone = tmp_path / "pages"
    clone.mkdir()
    git(clone, "init", "-q")
    (clone / "README.md").write_text("the published site\n")
    git(clone, "add", "README.md")
    git(clone, "commit", "-q", "-m", "first")
    before = _tree(clone)
    _refused(_cli(repo, "site", "build", "--out", str(clone)), "is a git checkout")
    assert _tree(clone) == before
    assert git(clone, "log", "--format=%s").strip() == "first"
    # a git checkout that an earlier build's marker found its way into is still a git checkout
    (clone / KEY_FILE).write_text(json.dumps({"key": "x"}))
    _refused(_cli(repo, "site", "build", "--out", str(clone)), "is a git checkout")
    assert (clone / ".git").is_dir() and (clone / "README.md").is_file()


def test_the_folder_you_are_in_is_refused(repo: Repo, tmp_path: Path) -> None:
    # in the registry repository: `.` is the repository
    before = _tree(repo.root)
    _refused(_cli(repo, "site", "build", "--out", "."), "it is the registry repository")
    assert _tree(repo.root) == before
    # in an empty folder (which a build could otherwise have): still refused, the shell would stand in a deleted one
    empty = tmp_path / "a" / "empty"
    empty.mkdir(parents=True)
    _refused(_cli(repo, "site", "build", "--out", ".", cwd=empty), "it is the folder you are in")
    _refused(_cli(repo, "site", "build", "--out", "..", cwd=empty), "it holds the folder you are in")
    assert empty.is_dir() and list(empty.iterdir()) == []


def test_home_and_the_root_are_refused(repo: Repo, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "documents").mkdir(parents=True)
    (home / "documents" / "letter.txt").write_text("dear reader\n")
    before = _tree(home)
    for out, says in ((home, "it is your home folder"), (tmp_path, "it holds your home folder")):
        _refused(_cli(repo, "site", "build", "--out", str(out), HOME=str(home)), says)
    # with a marker planted in it, home is still never replaced
    (home / KEY_FILE).write_text(json.dumps({"key": "x"}))
    _refused(_cli(repo, "site", "build", "--out", str(home), HOME=str(home)), "it is your home folder")
    (home / KEY_FILE).unlink()
    assert _tree(home) == before
    root_before = sorted(os.listdir("/"))
    _refused(_cli(repo, "site", "build", "--out", "/", HOME=str(home)), "it is the root folder")
    assert sorted(os.listdir("/")) == root_before


def test_a_modelmint_site_is_replaced_whichever_front_end_built_it(repo: Repo, tmp_path: Path) -> None:
    out = tmp_path / "site"
    built = _cli(repo, "site", "build", "--out", str(out))
    assert built.returncode == 0, built.stderr
    assert (out / KEY_FILE).is_file()  # the CLI writes the marker the flow's rebuild reads
    assert refresh_site(repo.settings(), out) == (out / "index.html", False)  # one build, one marker
    (out / "models" / "stale.html").write_text("from an earlier build")
    again = _cli(repo, "site", "build", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert not (out / "models" / "stale.html").exists() and (out / "index.html").is_file()
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
    # an empty folder is built into; a relative --out names the page by its absolute file:// URL
    (tmp_path / "fresh").mkdir()
    rel = _cli(repo, "site", "build", "--out", "fresh", cwd=tmp_path)
    assert rel.returncode == 0, rel.stderr
    assert (tmp_path / "fresh" / "index.html").as_uri() in rel.stdout


def test_a_site_built_before_the_marker_is_replaced(repo: Repo, tmp_path: Path) -> None:
    out = tmp_path / "site"
    build_site(repo.settings(), out)
    (out / KEY_FILE).unlink()  # what `site build` wrote before it wrote the marker
    proc = _cli(repo, "site", "build", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / KEY_FILE).is_file()


def test_a_build_that_fails_leaves_the_earlier_site(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipelines.site.build as site

    out = tmp_path / "out" / "site"
    build_site(repo.settings(), out)
    before = _tree(out)

    def broken(*_: object) -> str:
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(site, "index_page", broken)
    with pytest.raises(RuntimeError):
        build_site(repo.settings(), out)
    assert _tree(out) == before
    assert [p.name for p in out.parent.iterdir()] == ["site"]


# ---------------------------------------------------------------- site serve


@pytest.fixture
def served(repo: Repo, tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """`modelmint site serve --port 0` on a built site: the port it printed and its process."""
    build_site(repo.settings(), tmp_path / "site")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "site",
            "serve",
            "--dir",
            str(tmp_path / "site"),
            "--port",
            "0",
        ],
        # PYTHONFAULTHANDLER: a server that outlives Ctrl-C is aborted with every thread's stack on stderr (_ctrl_c)
        env=_env(repo, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield int(found[1]), proc
    finally:
        if proc.poll() is None:
            _ctrl_c(proc)


def _ctrl_c(proc: subprocess.Popen[str]) -> None:
    """Stop the server as a user does, with Ctrl-C; one still running 30 s later fails the test with the stack of
    each of its threads (SIGABRT, which PYTHONFAULTHANDLER dumps them on), so that a hang says where it hangs."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"`modelmint site serve` still ran 30 s after Ctrl-C; its threads:\n{err[-8000:]}")


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_serve_answers_a_nul_byte_path_with_404_and_keeps_serving(
    served: tuple[int, subprocess.Popen[str]],
) -> None:
    port, proc = served
    for path in ("/index.html%00.txt", "/%00", "/models/%00x.html"):
        status, body = _get(port, path)
        assert status == 404, (path, status, body)
    status, body = _get(port, "/index.html")
    assert status == 200 and b"No model is registered yet." in body
    _ctrl_c(proc)
    assert proc.stderr is not None
    assert "Traceback" not in proc.stderr.read()


def test_a_busy_port_is_refused_with_a_port_that_is_free(repo: Repo, tmp_path: Path) -> None:
    build_site(repo.settings(), tmp_path / "site")
    holders = []
    try:
        for wanted in (8765, 0):  # 8765: the port the hint used to offer whatever was busy
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holders.append(s)
            try:
                s.bind(("127.0.0.1", wanted))
                s.listen()
                busy = s.getsockname()[1]
            except OSError:  # something else holds it already: busy all the same
                busy = wanted
            proc = _cli(repo, "site", "serve", "--dir", str(tmp_path / "site"), "--port", str(busy))
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
            assert proc.stderr.startswith(f"error: cannot serve on 127.0.0.1:{busy}"), proc.stderr
            offered = [int(p) for p in re.findall(r"--port (\d+)", proc.stderr)]
            assert busy not in offered and 0 in offered, proc.stderr
            free = [p for p in offered if p]
            assert free, proc.stderr
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind(("127.0.0.1", free[0]))  # it was free when offered, and still is
    finally:
        for s in holders:
            s.close()
