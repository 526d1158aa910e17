"""`modelmint recommend` and `modelmint site build|serve` through the installed console script: thin commands over
pipelines/advice/recommend.py and site.py, their output, --json, and bad input as one error line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from site_registry import SiteRegistry

MODELMINT = str(Path(sys.executable).parent / "modelmint")


def _cli(reg: SiteRegistry, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**reg.repo.env(), "COLUMNS": "200"}
    return subprocess.run(
        [MODELMINT, *args], env=env, capture_output=True, text=True, cwd=reg.repo.root, timeout=120
    )


def test_recommend_prints_the_ranking_why_and_the_commands(site_registry: SiteRegistry) -> None:
    proc = _cli(site_registry, "recommend", "--gpus", "1xL4-24G", "--context", "4096", "smollm2")
    assert proc.returncode == 0, proc.stderr
    assert "smollm2 on 1xL4-24G, context 4096" in proc.stdout
    assert "why: smollm2:q8_0: mean KL 0.0042 ± 0.00013" in proc.stdout
    assert "  modelmint pull smollm2:q8_0\n" in proc.stdout
    assert "  OLLAMA_NUM_PARALLEL=1 ollama serve\n  ollama run smollm2:q8_0-ctx4096\n" in proc.stdout
    as_json = _cli(site_registry, "recommend", "--gpus", "1xL4-24G", "--json")
    assert as_json.returncode == 0, as_json.stderr
    answers = {a["name"]: a for a in json.loads(as_json.stdout)}
    assert answers["tiny-qwen2"]["winner"] == "tiny-qwen2:q4_k_m"  # the tie, to the smaller
    assert [c["tag"] for c in answers["smollm2"]["ranked"]] == ["q8_0", "q6_k", "fp8", "awq", "q4_k_m"]


def test_recommend_bad_input_is_one_error_line(site_registry: SiteRegistry) -> None:
    for args, says in (
        (["--gpus", "1xNOPE-1G"], "NOPE"),
        (["--gpus", "1xL4-24G", "nope"], "nope was never registered"),
        (["--gpus", "1xL4-24G", "--context", "0"], "--context 0"),
    ):
        proc = _cli(site_registry, "recommend", *args)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("error:") and says in proc.stderr, proc.stderr


def test_site_build_writes_the_pages_and_names_how_to_open_them(
    site_registry: SiteRegistry, tmp_path: Path
) -> None:
    out = tmp_path / "site"
    proc = _cli(site_registry, "site", "build", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 4 pages to {out}" in proc.stdout and f"modelmint site serve --dir {out}" in proc.stdout
    assert (out / "models" / "smollm2.html").is_file()
    (tmp_path / "a-file").write_text("x")
    refused = _cli(site_registry, "site", "build", "--out", str(tmp_path / "a-file"))
    assert refused.returncode == 1 and "is a file, not a folder for the site" in refused.stderr, (
        refused.stderr
    )
