"""The Prefect executor asks `Step.current` of cache hits only: a result the task just made is current by
construction, and asking would read its outputs again (a registration's check of the remote's copy hashes every
object of a local remote: 12 GB more at 7B, and a remote lost in between would fail a run that had registered).

A real Prefect (the test server) runs a one-step list through flows.steps.prefect_runner twice: the first run makes the
result and asks nothing; the second is a cache hit, is asked, is told its output is gone, and runs the step again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
from prefect.testing.utilities import prefect_test_harness

from flows.steps import prefect_runner
from pipelines.core.settings import Settings
from pipelines.core.steps import Step, execute

pytestmark = pytest.mark.slow


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_only_a_cache_hit_is_asked_whether_its_output_still_stands(isolated: Path, tmp_path: Path) -> None:
    made, asked = tmp_path / "made.log", tmp_path / "asked.log"

    def run(_inputs: Any) -> str:
        with made.open("a") as f:
            f.write("made\n")
        return "out"

    def current(_result: Any) -> bool:
        with asked.open("a") as f:
            f.write("asked\n")
        return False  # as if the output were gone since

    step = Step(name="make", task="make", run=run, key=lambda _inputs: "the-same-content", output=tmp_path / "out")

    @flow
    def once() -> None:
        execute([Step(**{**step.__dict__, "current": current})], prefect_runner(Settings.from_env()))

    with (
        prefect_test_harness(server_startup_timeout=180),
        temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}),
    ):
        once()
        assert (_lines(made), _lines(asked)) == (1, 0), "a fresh result was asked whether it stands (and made again)"
        once()  # a cache hit: asked, told its output is gone, made again
        assert (_lines(made), _lines(asked)) == (2, 1)
