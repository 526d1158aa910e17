"""A registered GGUF is planned by llama.cpp's memory model alone, as `modelmint plan NAME:TAG --out` plans it: on an
inventory vLLM's memory model refuses (a 2 GB card: too little for vLLM's activations) but llama.cpp's holds,
registration writes the Ollama files `plan --out` writes, byte for byte, and records the plan `plan --json` prints
with no vLLM sizing. Records registered before that, holding vLLM's sizing of a GGUF, still read. Real parts:
tiny-qwen2's q4_k_m converted and quantized by the pinned llama.cpp, registered by the real code; plan runs as a
subprocess."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from registry_env import Repo
from site_registry import modelmint_here, registered_q4_k_m_serving, text_files

from pipelines.store.manifest import Manifest, Serving

SMALL, MIXED = "1x2G", "1x2G+1xL4-24G"
SERVE = {"gpus": [SMALL, MIXED], "context": 2048, "concurrency": 3}


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Repo, Manifest]]:
    """tiny-qwen2's real q4_k_m registered by the real code, its catalog entry asking for serving plans on a 2 GB
    card and on that card beside an L4, at 2048 tokens x 3 sequences."""
    with registered_q4_k_m_serving(tmp_path_factory.mktemp("serve-gguf-llamacpp"), SERVE) as done:
        yield done


@pytest.mark.slow
@pytest.mark.parametrize("inventory", [0, 1])
def test_registration_writes_the_ollama_files_plan_out_writes_where_vllm_refuses(
    registered: tuple[Repo, Manifest], inventory: int, tmp_path: Path
) -> None:
    repo, m = registered
    inv = m.serving.inventories[inventory]
    assert inv.refused is None, inv
    ask = ("plan", "tiny-qwen2:q4_k_m", "--gpus", inv.gpus, "--context", str(SERVE["context"]), "--concurrency",
           str(SERVE["concurrency"]))
    written, as_json = modelmint_here(repo, *ask, "--out", str(tmp_path / "out")), modelmint_here(repo, *ask, "--json")
    for proc in (written, as_json):
        assert proc.returncode == 0, proc.stderr
    want = text_files(tmp_path / "out")
    assert want, written.stderr
    if "+" not in inv.gpus:  # registration merges a single group's folder into the inventory's
        (own,) = {k.split("/", 1)[0] + "/" for k in want}
        want = {k.removeprefix(own): v for k, v in want.items()}
    got = text_files(repo.root / m.dvc.path / inv.dir)
    assert got == want  # byte for byte: one plan, one writer
    assert sorted(f"{inv.dir}/{k}" for k in want) == inv.files
    # the record: the plan `plan --json` prints, per group, and no vLLM sizing of a GGUF
    assert inv.plans == [], inv.plans
    assert inv.gguf is not None
    printed = json.loads(as_json.stdout)
    keys = ("engine", "num_ctx", "parallel", "n_gpu_layers", "n_layers", "instances", "spread", "partial",
            "warnings")
    assert [{"gpus": g.gpus, **{k: getattr(g, k) for k in keys}} for g in inv.gguf] == [
        {"gpus": p["group"], **{k: p[k] for k in keys}} for p in printed
    ]
    on_disk = json.loads((repo.root / m.dvc.path / "serve" / "plans.json").read_text())
    assert on_disk == m.serving.model_dump(mode="json")


OLD_RECORD = {  # a GGUF's inventory as registration recorded it with vLLM's sizing beside llama.cpp's plan
    "gpus": "1x1xL4-24G",
    "dir": "serve/1x1xl4-24g",
    "plans": [{
        "gpus": "1x1xL4-24G", "layout": "TP 1 x PP 1, 1 replica(s)", "tp": 1, "pp": 1, "replicas": 1,
        "max_model_len": 32768, "max_num_seqs": 256, "kv_bytes_per_token": 2048, "layer_partition": [],
        "per_gpu": [{"gpu": "L4-24G", "total": 24148453621, "usable": 21733608258, "weights": 33811712,
                     "activations": 2061481733, "kv_pool": 19638314813, "headroom": 2414845363}],
        "warnings": [],
    }],
    "files": ["serve/1x1xl4-24g/ollama/Modelfile", "serve/1x1xl4-24g/ollama/start.sh"],
    "notes": ["no vLLM files for a GGUF"],
    "refused": None,
    "nearest": [],
    "gguf": [{"engine": "ollama", "gpus": "1x1xL4-24G", "num_ctx": 4096, "parallel": 1, "n_gpu_layers": 5,
              "n_layers": 5, "instances": 1, "spread": False, "partial": False, "warnings": []}],
}


def test_a_gguf_record_with_vllms_sizing_still_reads_without_it(tmp_path: Path) -> None:
    old = {"context": None, "concurrency": 1, "kv_cache_dtype": "auto", "gpu_memory_utilization": 0.9,
           "inventories": [OLD_RECORD]}
    (inv,) = Serving.model_validate_json(json.dumps(old)).inventories
    assert inv.plans == []  # vLLM cannot load a GGUF: its sizing is not the plan
    assert inv.gguf is not None and inv.gguf[0].n_gpu_layers == 5
    assert inv.files == OLD_RECORD["files"]
