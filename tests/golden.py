"""Golden files: what modelmint publishes (Modelfile, model cards, vllm.yaml, manifests, the flow's table, the
CLI's listings), pinned under tests/golden/ so that a change of shape is seen and named.

`check(name, text, **places)` compares `text` with tests/golden/<name> after normalising what is not the
published content's own: the places given (a temp repository, a work directory: written as <repo>, <work>) and
timestamps; in JSON also wall times and memory, and floats at 3 significant digits (the builds and measurements
are deterministic on one machine: tests/test_reproducible.py; the rounding keeps the files readable). A missing golden file, or
MODELMINT_UPDATE_GOLDEN=1, writes it instead, and the test then fails on a missing file so that a new golden
is never taken silently; commit the file and say in the commit what changed and why.

What a generated tiny model's builds contain depends on the machine's CPU as well as on modelmint: torch trains
it with the kernels the CPU has (AVX2 and AVX-512 round differently), so its weights, every hash derived from
them and every measured figure differ between machine kinds while staying identical run to run on one machine.
A golden built from a generated source therefore records that source's content digest
(tests/golden/sources.json). On a machine whose generated source is the recorded one, the comparison is exact;
on another, it is of the shape: every key, name, format, path, template and message, with digests, numbers and
the model's own sampled text masked (`shape`), and the failure says which comparison ran.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "golden"
SOURCES = GOLDEN / "sources.json"
"""golden file -> content digest of the generated source its builds came from."""
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


_DIGEST = re.compile(r"\b[0-9a-f]{12,}(?:\.dir)?\b")
_NUMBER = re.compile(r"(?<![\w<])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w>])")
_MODEL_TEXT = {"completion"}
"""Keys whose value is the model's own sampled text."""
_MODEL_COUNTED = {"running"}
"""Keys whose list is as long as the model's figures make it: the figures after each window measured
(report.RunningFigures), as many as the windows the check ran before its verdict was clear, which a tiny model
trained on another CPU reaches sooner or later."""
_EARLY_STOP = {"kl_p99", "kld_p99", "of_chunks"}
"""Keys that are a number or null by whether the check ran every window or stopped early (llama-perplexity
prints the 99th percentile only at the end of a full run; `of_chunks` names the windows a stopped run left)."""


def shape(text: str, *, is_json: bool) -> str:
    """`text` (already normalised) with what a generated model's weights decide masked: digests, numbers, its
    sampled text; in plain text also runs of spaces and table rules (a number's width moves a table's columns)."""
    if is_json:
        def mask(data: Any) -> Any:
            if isinstance(data, dict):
                return {k: _value(k, v) for k, v in data.items()}
            if isinstance(data, list):
                return [mask(v) for v in data]
            if isinstance(data, bool) or data is None:
                return data
            if isinstance(data, int | float):
                return "<number>"
            return _NUMBER.sub("<number>", _DIGEST.sub("<digest>", data)) if isinstance(data, str) else data

        def _value(key: str, value: Any) -> Any:
            if key in _MODEL_TEXT:
                return "<model text>"
            if key in _MODEL_COUNTED and isinstance(value, list):
                # the distinct shapes of the list's entries, not how many there are
                return sorted({json.dumps(mask(v), sort_keys=True) for v in value})
            if key in _EARLY_STOP and (value is None or isinstance(value, int | float)):
                return "<number or null>"
            return mask(value)

        return json.dumps(mask(json.loads(text)), indent=2, sort_keys=True) + "\n"
    text = _NUMBER.sub("<number>", _DIGEST.sub("<digest>", text))
    return re.sub(r"[━─]+", "─", re.sub(r"[ \t]+", " ", text))


def _sources() -> dict[str, str]:
    return json.loads(SOURCES.read_text()) if SOURCES.exists() else {}


def written_from(name: str) -> str | None:
    """The content digest of the generated source golden file `name` was built from (None: none recorded)."""
    return _sources().get(name)


def check(name: str, text: str, *, source: str | None = None, **places: Path | str) -> None:
    """Compare `text` (normalised) with tests/golden/`name`; JSON (by the name's suffix) is compared as data.

    `source`: the content digest of the generated source the text was built from (None: the text does not
    depend on one). Exact where it is the digest the golden was written from, by shape elsewhere."""
    path = GOLDEN / name
    is_json = name.endswith(".json")
    if is_json:
        got = json.dumps(normalize_json(json.loads(normalize_text(text, **places))), indent=2, sort_keys=True) + "\n"
    else:
        got = normalize_text(text, **places)
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        sources = _sources()
        if source is None:
            sources.pop(name, None)
        else:
            sources[name] = source
        SOURCES.write_text(json.dumps(dict(sorted(sources.items())), indent=2) + "\n")
        if not UPDATE:
            raise AssertionError(f"{path} did not exist and was written: look at it, commit it, rerun")
        return
    want = path.read_text()
    origin = written_from(name)
    if source is None or origin == source:
        how = "exactly"
    else:
        got, want = shape(got, is_json=is_json), shape(want, is_json=is_json)
        how = (f"by shape only: it was written from generated source {str(origin)[:12]}, this machine "
               f"generates {source[:12]} (its CPU trains the tiny model differently)")
    assert got == want, (
        f"{name} differs from its golden file {path} (compared {how}); if the change is intended, rerun with "
        f"MODELMINT_UPDATE_GOLDEN=1 and name the difference in the commit.\n--- golden\n{want}\n--- now\n{got}"
    )
