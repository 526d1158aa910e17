"""Golden files: what modelmint publishes (Modelfile, model cards, vllm.yaml, manifests, the flow's table, the
CLI's listings), pinned under tests/golden/ so that a change of shape is seen and named.

`check(name, text, **places)` compares `text` with tests/golden/<name> after normalising what is not the
published content's own: the places given (a temp repository, a work directory: written as <repo>, <work>) and
timestamps; in JSON also wall times and memory, and floats at 3 significant digits (the builds and measurements
are deterministic on one machine: tests/test_reproducible.py; the rounding keeps the files readable). A missing golden file, or
MODELMINT_UPDATE_GOLDEN=1, writes it instead, and the test then fails on a missing file so that a new golden
is never taken silently; commit the file and say in the commit what changed and why.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("MODELMINT_UPDATE_GOLDEN") == "1"

_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")
_VOLATILE = {"created", "registered_at", "wall_s", "seconds", "timings", "peak_rss", "peak_rss_bytes", "mtime_ns",
             "report_sha256", "pid"}
"""Keys whose values change on every run (times, memory, the report file's hash: its timings change)."""


def normalize_text(text: str, **places: Path | str) -> str:
    for label, place in sorted(places.items(), key=lambda kv: -len(str(kv[1]))):
        text = text.replace(str(place), f"<{label}>")
    return _STAMP.sub("<time>", text)


def normalize_json(data: Any) -> Any:
    """`data` without its volatile keys, floats at 3 significant digits."""
    if isinstance(data, dict):
        return {k: ("<volatile>" if k in _VOLATILE else normalize_json(v)) for k, v in sorted(data.items())}
    if isinstance(data, list):
        return [normalize_json(v) for v in data]
    if isinstance(data, float):
        return float(f"{data:.3g}")
    return data


def check(name: str, text: str, **places: Path | str) -> None:
    """Compare `text` (normalised) with tests/golden/`name`; JSON (by the name's suffix) is compared as data."""
    path = GOLDEN / name
    if name.endswith(".json"):
        got = json.dumps(normalize_json(json.loads(normalize_text(text, **places))), indent=2, sort_keys=True) + "\n"
    else:
        got = normalize_text(text, **places)
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        if not UPDATE:
            raise AssertionError(f"{path} did not exist and was written: look at it, commit it, rerun")
        return
    want = path.read_text()
    assert got == want, (
        f"{name} differs from its golden file {path}; if the change is intended, rerun with "
        f"MODELMINT_UPDATE_GOLDEN=1 and name the difference in the commit.\n--- golden\n{want}\n--- now\n{got}"
    )
