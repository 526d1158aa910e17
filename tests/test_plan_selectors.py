"""`modelmint plan --out` for GPUs that have no product label (a card known only by its size, a card of the user's
own inventory): the Kubernetes files select nodes by the GPU memory label instead of an empty product label, say so,
and still pass Kubernetes' schemas, the CRDs and the Helm chart's values schema (tests/test_servefiles.py's checks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_servefiles import CORE, HELM, _errors, check_core, check_custom

ROOT = Path(__file__).resolve().parents[1]
GPU_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
"""NVIDIA GPU feature discovery's labels: the product name, and the GPU memory in MiB."""


def _plan(target: Path, gpus: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "plan", str(target), "--gpus", gpus, "--context",
                           "2048", "--out", str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def _selectors(doc: Any) -> list[tuple[str, Any]]:
    """Every nodeSelector map and node affinity requirement anywhere in `doc`, as (kind, value)."""
    found: list[tuple[str, Any]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == "nodeSelector":
                found.append(("nodeSelector", v))
            elif k == "matchExpressions":
                found += [("requirement", r) for r in v]
            else:
                found += _selectors(v)
    elif isinstance(doc, list):
        for v in doc:
            found += _selectors(v)
    return found


@pytest.mark.parametrize("gpus", ["1x16G", "2x1x16G", "inventory"])
def test_a_card_without_a_product_label_is_selected_by_its_memory(
    tiny_qwen2: Path, tmp_path: Path, gpus: str
) -> None:
    if gpus == "inventory":
        inv = tmp_path / "mine.yaml"
        inv.write_text("- {gpus: 2, type: MyCard-20G, memory_gib: 19.5}\n")
        gpus = str(inv)
    out = tmp_path / "out"
    proc = _plan(tiny_qwen2, gpus, out)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"no {GPU_LABEL} selector" in said and GPU_MEMORY_LABEL in said, said
    yamls = sorted(p for p in out.rglob("*.yaml") if p.name != "vllm.yaml")
    assert yamls, list(out.rglob("*"))
    seen = 0
    for path in yamls:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]  # each file is valid YAML
        for doc in docs:
            if path.name == "helm-values.yaml":
                assert _errors(HELM, doc) == [], path
            else:
                errors = check_core(doc) if doc["kind"] in CORE else check_custom(doc)
                assert errors == [], (path, errors)
            for kind, value in _selectors(doc):
                seen += 1
                if kind == "nodeSelector":
                    assert all(v for v in value.values()), (path, value)  # never an empty label value
                else:
                    assert value["key"] != GPU_LABEL and all(value["values"]), (path, value)
                    assert value["key"] == GPU_MEMORY_LABEL and value["operator"] == "Gt", (path, value)
                    assert int(value["values"][0]) >= 15 * 1024, (path, value)
    assert seen, "no file selects a node"


def test_a_card_with_a_product_label_keeps_its_selector(tiny_qwen2: Path, tmp_path: Path) -> None:
    proc = _plan(tiny_qwen2, "1xRTX4060Ti-16G", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert f"no {GPU_LABEL} selector" not in proc.stderr
    (k8s,) = (tmp_path / "out").rglob("kubernetes.yaml")
    selectors = [v for d in yaml.safe_load_all(k8s.read_text()) if d for kind, v in _selectors(d)
                 if kind == "nodeSelector"]
    assert selectors == [{GPU_LABEL: "NVIDIA-GeForce-RTX-4060-Ti"}], selectors
