"""The command line stays a thin layer: each command module is one concern, short enough to read at once."""

from __future__ import annotations

from pathlib import Path

import pipelines

CLI = Path(pipelines.__file__).parent / "cli"
MAX_LINES = 300


def test_each_command_module_is_at_most_300_lines() -> None:
    long = {p.name: n for p in sorted(CLI.glob("*.py")) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these by concern (one command group each): {long}"
