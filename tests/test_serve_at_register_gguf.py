"""A registered GGUF's serve files realise llama.cpp's memory model, as `modelmint recommend --engine ollama` plans
the same inventory: the Modelfile's num_ctx and num_gpu, start.sh's OLLAMA_NUM_PARALLEL and its servers (one per GPU
or one over every GPU), and serve/plans.json saying which engine's memory model planned them. Real parts:
tiny-qwen2's q4_k_m converted and quantized by the pinned llama.cpp, registered by the real code; recommend and
shellcheck run as subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from registry_env import Repo
from site_registry import modelmint_here, registered_q4_k_m_serving

from pipelines.store.manifest import Manifest

SERVE = {"gpus": ["1xL4-24G", "4xRTX4090-24G"], "context": 2048, "concurrency": 3}


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Repo, Manifest]]:
    """tiny-qwen2's real q4_k_m GGUF registered by the real code, its catalog entry asking for serving plans on one
    L4 and on a 4-GPU box at 2048 tokens x 3 sequences."""
    with registered_q4_k_m_serving(tmp_path_factory.mktemp("serve-gguf"), SERVE) as done:
        yield done


def _recommended(repo: Repo, gpus: str) -> Any:
    """The plan `modelmint recommend --engine ollama` prints for `gpus` at the catalog's context and concurrency."""
    proc = modelmint_here(repo, "recommend", "tiny-qwen2", "--gpus", gpus, "--engine", "ollama", "--context",
                str(SERVE["context"]), "--concurrency", str(SERVE["concurrency"]), "--json")
    assert proc.returncode == 0, proc.stderr
    (answer,) = json.loads(proc.stdout)
    assert answer["winner"] == "tiny-qwen2:q4_k_m", answer
    return answer["ranked"][0]["gguf_plan"]


@pytest.mark.slow
@pytest.mark.parametrize(("inventory", "gpus"), [(0, "1xL4-24G"), (1, "4xRTX4090-24G")])
def test_the_registered_ollama_files_carry_recommends_llamacpp_plan(
    registered: tuple[Repo, Manifest], inventory: int, gpus: str
) -> None:
    repo, m = registered
    inv = m.serving.inventories[inventory]
    d = repo.root / m.dvc.path
    assert f"{inv.dir}/ollama/Modelfile" in inv.files and f"{inv.dir}/ollama/start.sh" in inv.files, inv.files
    modelfile = (d / inv.dir / "ollama" / "Modelfile").read_text()
    start = (d / inv.dir / "ollama" / "start.sh").read_text()
    want = _recommended(repo, gpus)
    # the Modelfile: recommend's num_ctx (not vLLM's context) and its layers on the GPU
    params = [line.split()[1:] for line in modelfile.splitlines() if line.startswith("PARAMETER ")]
    assert params == [["num_ctx", str(want["num_ctx"])], ["num_gpu", str(want["n_gpu_layers"])]], modelfile
    assert "FROM tiny-qwen2:q4_k_m\n" in modelfile
    # start.sh: recommend's servers, each with its slots
    serves = [line.split() for line in start.splitlines() if "ollama serve" in line]
    assert len(serves) == want["instances"], start
    for words in serves:
        assert f"OLLAMA_NUM_PARALLEL={want['parallel']}" in words, start
        assert ("OLLAMA_SCHED_SPREAD=1" in words) == want["spread"], start
    assert (d / inv.dir / "ollama" / "start.sh").stat().st_mode & 0o111
    check = subprocess.run([str(Path(sys.executable).parent / "shellcheck"), "-s", "bash", "-S", "warning",
                            str(d / inv.dir / "ollama" / "start.sh")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    # the record says which memory model planned the files, with that plan
    written = json.loads((d / "serve" / "plans.json").read_text())
    assert written == m.serving.model_dump(mode="json")  # the manifest's block reads it back
    record = written["inventories"][inventory]
    (planned,) = record["gguf"]
    assert planned["engine"] == "ollama"
    assert {k: planned[k] for k in ("num_ctx", "parallel", "n_gpu_layers", "n_layers", "instances", "spread")} == {
        k: want[k] for k in ("num_ctx", "parallel", "n_gpu_layers", "n_layers", "instances", "spread")
    }

