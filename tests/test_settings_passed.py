"""Settings are read once, at an entry point (the CLI, the start of a flow run), and passed down: never re-read
inside the library, never at import time."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

READERS = {
    "pipelines/core/settings.py": "the settings module itself",
    "pipelines/cli/_app.py": "the command line's load_settings",
    "flows/raycluster.py": "RunTaskRunner.duplicate: the task runner chosen when a run starts",
    "pipelines/chat/coverage.py": "the conversation suite's toolchain (still read there)",
}
"""Modules that may call Settings.from_env() anywhere in them, and why."""


def _is_flow(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "flow" for d in fn.decorator_list)


def _reads(path: Path) -> list[str]:
    """Each Settings.from_env() call in `path` that is not the first statement of a @flow function."""
    tree = ast.parse(path.read_text())
    allowed: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and _is_flow(fn):
            body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
            allowed |= {id(n) for n in ast.walk(body[0])}
    return [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "from_env"
            and getattr(n.func.value, "id", None) == "Settings" and id(n) not in allowed]


def test_settings_are_read_only_at_entry_points() -> None:
    """The library takes `settings` as an argument; a flow reads them once, in its first statement."""
    found = [r for folder in ("pipelines", "flows") for p in sorted((ROOT / folder).rglob("*.py"))
             if str(p.relative_to(ROOT)) not in READERS for r in _reads(p)]
    assert found == []


def test_the_check_finds_a_read_inside_the_library(tmp_path: Path) -> None:
    bad = ROOT / "flows" / "_settings_probe.py"
    assert not bad.exists()
    text = ("from prefect import flow\n\n@flow(name='x')\ndef f():\n    '''doc'''\n    s = Settings.from_env()\n"
            "    t = Settings.from_env()\n\ndef g(settings=None):\n    return settings or Settings.from_env()\n")
    bad.write_text(text)
    try:
        assert _reads(bad) == ["flows/_settings_probe.py:7", "flows/_settings_probe.py:10"]
    finally:
        bad.unlink()


def test_importing_the_flows_reads_no_settings() -> None:
    """A deployment loading the flow files, or a worker importing them, does not depend on the environment: an
    unusable setting is an error of the run that reads it, not of the import."""
    env = {**os.environ, "MODELMINT_GPU_SLOTS": "many", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", "import flows.convert, flows.watch, flows.webhook, flows.site"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
