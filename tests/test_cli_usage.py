"""Every command-line usage error is typer's usage text and exit code 2, never a Python traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from pipelines.cli import app
from pipelines.core.settings import project_root

# The installed console script: what a user runs (pipelines.cli:main), not typer's test runner.
MODELMINT = str(Path(sys.executable).parent / "modelmint")


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command and group of the app, walked from the root so that a new command is covered by itself."""
    found = [(path, command)]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))


def _is_group(command: Any) -> bool:
    return hasattr(command, "commands")


ONE_OF = {"convert": ("name", "every")}
"""Commands that need one of two parameters (a NAME or --all): neither is required alone."""


def _needs_arguments(command: Any) -> bool:
    return _is_group(command) or any(p.required for p in command.params) or command.name in ONE_OF


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A fresh repository, home and work dir: a command that runs without arguments touches nothing real."""
    tmp = tmp_path_factory.mktemp("fresh")
    return {
        **os.environ,
        "MODELMINT_REPO": str(tmp / "repo"),
        "MODELMINT_HOME": str(tmp / "home"),
        "MODELMINT_WORK_DIR": str(tmp / "work"),
        "DOCKER_CONFIG": str(tmp / "docker"),  # `registry serve` records its push credentials there
        "MODELMINT_CATALOG": str(project_root() / "registry" / "catalog.yaml"),
        # nothing listens there: `modelmint watch` asks this "hub" about the catalog's tracked refs, never the real one
        "HF_ENDPOINT": "http://127.0.0.1:9",
        # nor here: `modelmint stack status / doctor / down` ask this "Prefect server", never a real stack's
        "MODELMINT_PREFECT_PORT": "9",
        "COLUMNS": "120",
    }


# Commands that run without arguments but need something a fresh machine lacks: modelmint's message, exit 1.
NEEDS_SETUP = {
    ("watch",): "could not be checked",
    ("webhook", "serve"): "MODELMINT_WEBHOOK_SECRET is not set",
    ("stack", "status"): "is not up",
    ("stack", "doctor"): "no Prefect server answers",
    ("site", "serve"): "holds no registry site",
}


# Commands that would start a long-lived stack: run with their port held by something that is not Prefect, they
# must refuse at once (exit 1) instead of starting anything.
PORT_HELD = {("stack", "up"): "is taken by something that is not a Prefect server"}


def _port_held(env: dict[str, str], tmp_path: Path, path: tuple[str, ...]) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        proc = _run({**env, "MODELMINT_PREFECT_PORT": str(held.getsockname()[1])}, tmp_path, *path)
    both = proc.stdout + proc.stderr
    assert proc.returncode == 1 and PORT_HELD[path] in proc.stderr and "Traceback" not in both, both


# Commands that run without arguments as a server: it must start (its banner on stderr), and SIGTERM stop it.
SERVES = {("registry", "serve"): "registry on http://127.0.0.1:5000"}


def _serves(env: dict[str, str], tmp_path: Path, path: tuple[str, ...]) -> None:
    import signal
    import threading

    proc = subprocess.Popen([MODELMINT, *path], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    banner = threading.Event()

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if SERVES[path] in line:
                banner.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert banner.wait(60), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    both = "".join(lines)
    assert proc.returncode == 0 and "Traceback" not in both, both


def _run(env: dict[str, str], tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MODELMINT, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"", "catalog", "catalog list", "convert", "compress", "validate", "pull", "list", "inspect"} <= names


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "modelmint" for p, _ in COMMANDS])
def test_no_arguments(env: dict[str, str], tmp_path: Path, path: tuple[str, ...], command: Any) -> None:
    if path in SERVES:
        _serves(env, tmp_path, path)
        return
    if path in PORT_HELD:
        _port_held(env, tmp_path, path)
        return
    proc = _run(env, tmp_path, *path)
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    if _needs_arguments(command):
        assert proc.returncode == 2, both
        assert f"Usage: modelmint {' '.join(path)}".rstrip() in both
        if not _is_group(command):  # a group prints its help (with the usage) instead of an error
            assert "Usage:" in proc.stderr and "Missing" in proc.stderr, proc.stderr
    elif path in NEEDS_SETUP:
        assert proc.returncode == 1 and NEEDS_SETUP[path] in proc.stderr, both
    else:  # catalog list, list, dvc-yaml: their normal run, here on a fresh repository
        assert proc.returncode == 0, both


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "modelmint" for p, _ in COMMANDS])
def test_a_bogus_option(env: dict[str, str], tmp_path: Path, path: tuple[str, ...], command: Any) -> None:
    proc = _run(env, tmp_path, *path, "--bogus")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"Usage: modelmint {' '.join(path)}".rstrip() in proc.stderr
    assert "No such option: --bogus" in proc.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["convert", "tiny-qwen2", "--bogus"], "No such option: --bogus"),
    (["validate", "x.gguf"], "Missing option '--reference'"),
    (["convert", "tiny-qwen2", "--variants"], "Option '--variants' requires an argument"),
    (["inspect", "a.gguf", "b.gguf"], "Got unexpected extra argument"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
])
def test_other_usage_errors(env: dict[str, str], tmp_path: Path, args: list[str], says: str) -> None:
    proc = _run(env, tmp_path, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and says in proc.stderr, proc.stderr


def test_help_still_exits_0(env: dict[str, str], tmp_path: Path) -> None:
    proc = _run(env, tmp_path, "convert", "--help")
    assert proc.returncode == 0 and "Usage: modelmint convert" in proc.stdout, proc.stderr
