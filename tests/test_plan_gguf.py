"""`modelmint plan NAME:TAG --out DIR` for a GGUF writes what registration writes for the same GPUs, context and
sequences, and both say what `modelmint recommend --engine ollama` says: one llama.cpp plan (num_ctx,
OLLAMA_NUM_PARALLEL, num_gpu, the servers), one name for the model created at the planned context, one answer for a
mixed inventory, and a refusal naming llama.cpp's cap on parallel sequences. Real parts: tiny-qwen2's q4_k_m
converted and quantized by the pinned llama.cpp, registered by the real code; plan and recommend run as
subprocesses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ollama_pull import check_name
from registry_env import Repo
from site_registry import modelmint_here, registered_q4_k_m_serving, text_files

from pipelines.store.manifest import Manifest

MIXED = "1xRTX4090-24G+1xRTX3060-12G"
SERVE = {"gpus": ["1xL4-24G", "4xRTX4090-24G", MIXED], "context": 2048, "concurrency": 3}


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Repo, Manifest]]:
    """tiny-qwen2's real q4_k_m registered by the real code, its catalog entry asking for serving plans on one L4,
    a 4-GPU box and a mixed pair of cards at 2048 tokens x 3 sequences."""
    with registered_q4_k_m_serving(tmp_path_factory.mktemp("plan-gguf"), SERVE) as done:
        yield done


def _recommended(repo: Repo, gpus: str, *extra: str) -> Any:
    proc = modelmint_here(repo, "recommend", "tiny-qwen2", "--gpus", gpus, "--engine", "ollama", "--context",
                str(SERVE["context"]), "--concurrency", str(SERVE["concurrency"]), *extra, "--json")
    assert proc.returncode == 0, proc.stderr
    (answer,) = json.loads(proc.stdout)
    return answer


@pytest.mark.slow
@pytest.mark.parametrize("inventory", [0, 1, 2])
def test_plan_out_writes_the_registered_ollama_files(
    registered: tuple[Repo, Manifest], inventory: int, tmp_path: Path
) -> None:
    repo, m = registered
    inv = m.serving.inventories[inventory]
    registered_dir = repo.root / m.dvc.path / inv.dir
    want = {k: v for k, v in text_files(registered_dir).items() if "/ollama/" in f"/{k}"}
    assert want, inv.files
    proc = modelmint_here(repo, "plan", "tiny-qwen2:q4_k_m", "--gpus", inv.gpus, "--context", str(SERVE["context"]),
                "--concurrency", str(SERVE["concurrency"]), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    got = text_files(tmp_path / "out")
    assert got, proc.stderr  # a GGUF on one GPU gets its Ollama files too
    if "+" not in inv.gpus:  # registration merges a single group's folder into the inventory's
        own = next(iter(got)).split("/", 1)[0] + "/"
        got = {k.removeprefix(own): v for k, v in got.items()}
    got = {k: v for k, v in got.items() if "/ollama/" in f"/{k}"}
    assert got == want  # byte for byte: one plan, one writer


@pytest.mark.slow
def test_plan_out_sizes_a_gguf_at_ollamas_context_when_none_is_asked(
    registered: tuple[Repo, Manifest], tmp_path: Path
) -> None:
    """No --context: Ollama's default 4096, as recommend and registration plan it, not the model's 32768."""
    repo, _ = registered
    proc = modelmint_here(repo, "plan", "tiny-qwen2:q4_k_m", "--gpus", "1xL4-24G", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (modelfile,) = [v for k, v in text_files(tmp_path).items() if k.endswith("ollama/Modelfile")]
    proc = modelmint_here(repo, "recommend", "tiny-qwen2", "--gpus", "1xL4-24G", "--engine", "ollama", "--json")
    (answer,) = json.loads(proc.stdout)
    assert f"PARAMETER num_ctx {answer['ranked'][0]['gguf_plan']['num_ctx']}\n" in modelfile
    assert "PARAMETER num_ctx 4096\n" in modelfile


@pytest.mark.slow
def test_recommend_names_the_planned_model_as_the_registered_start_script(registered: tuple[Repo, Manifest]) -> None:
    repo, m = registered
    inv = m.serving.inventories[1]  # 4xRTX4090-24G: a start script on both sides
    start = (repo.root / m.dvc.path / inv.dir / "ollama" / "start.sh").read_text()
    (created,) = [w[w.index("create") + 1] for w in map(str.split, start.splitlines()) if "create" in w]
    check_name(created)  # a name Ollama takes (types/model/name.go, as tests/ollama_pull.py reads it)
    answer = _recommended(repo, inv.gpus)
    script = next(c for c in answer["commands"] if c.startswith("cat > "))
    assert f" ollama create {created} -f " in script
    assert answer["commands"][-1] == f"ollama run {created}"
    assert created == f"tiny-qwen2:q4_k_m-ctx{SERVE['context']}"
    one = _recommended(repo, "1xL4-24G")  # one GPU: the commands create it themselves
    assert f"ollama create {created} -f tiny-qwen2-q4_k_m.Modelfile" in one["commands"], one["commands"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ollama", "llama.cpp"])
def test_recommend_refuses_more_slots_than_llama_cpp_holds(registered: tuple[Repo, Manifest], engine: str) -> None:
    """llama.cpp refuses n_seq_max above LLAMA_MAX_SEQ (256) when it loads a model, and Ollama passes
    OLLAMA_NUM_PARALLEL to it as -np unchanged: a plan of 65,536 slots on one server would never load."""
    repo, _ = registered
    proc = modelmint_here(repo, "recommend", "tiny-qwen2", "--gpus", "1xL4-24G", "--engine", engine, "--context", "16",
                "--concurrency", "65536", "--json")
    assert proc.returncode == 0, proc.stderr
    (answer,) = json.loads(proc.stdout)
    assert answer["winner"] is None, answer
    assert answer["ranked"] == [], answer
    (choice,) = answer["unfit"]
    assert "gguf_plan" not in choice, choice
    assert "256" in choice["refused"] and "LLAMA_MAX_SEQ" in choice["refused"], choice
    assert "--concurrency 256" in " ".join(choice["nearest"]), choice
    # four GPUs, one Ollama each: 1,024 sequences are 256 slots per server, within the cap
    proc = modelmint_here(repo, "recommend", "tiny-qwen2", "--gpus", "4xRTX4090-24G", "--engine", "ollama", "--context", "16",
                "--concurrency", "1024", "--json")
    (answer,) = json.loads(proc.stdout)
    plan = answer["ranked"][0]["gguf_plan"]
    assert (plan["instances"], plan["parallel"]) == (4, 256), answer


@pytest.mark.slow
def test_recommend_on_unequal_gpus_takes_the_one_ollamas_scheduler_takes(registered: tuple[Repo, Manifest]) -> None:
    """Three RTX 3060s and an RTX 4090: the 4090 alone holds the model with a fifth of its memory to spare, and
    Ollama's scheduler puts a model on the GPU with the most free memory that does (server/sched.go at fb30760,
    bestSingleGPUFit), not over the group with the most memory together (the three 3060s)."""
    repo, m = registered
    plan = _recommended(repo, "1x3xRTX3060-12G+1xRTX4090-24G")["ranked"][0]["gguf_plan"]
    alone = _recommended(repo, "1xRTX4090-24G")["ranked"][0]["gguf_plan"]
    assert plan == alone
    assert plan["device"] == "1x1xRTX4090-24G" and plan["instances"] == 1, plan
    # the registered mixed inventory: each group's record is recommend's plan of that group alone (its files are
    # what `plan --out` writes: test_plan_out_writes_the_registered_ollama_files), and the whole inventory's answer
    # is the RTX 4090's, the card Ollama's scheduler takes
    inv = m.serving.inventories[2]
    assert inv.gguf is not None
    keys = ("num_ctx", "parallel", "n_gpu_layers", "instances", "spread")
    by_group = {g.gpus: g for g in inv.gguf}
    assert sorted(by_group) == ["1x1xRTX3060-12G", "1x1xRTX4090-24G"], by_group
    for group, rec in by_group.items():
        one = _recommended(repo, group)["ranked"][0]["gguf_plan"]
        assert {k: getattr(rec, k) for k in keys} == {k: one[k] for k in keys}, (group, rec, one)
    assert _recommended(repo, MIXED)["ranked"][0]["gguf_plan"] == alone


@pytest.mark.slow
@pytest.mark.parametrize("inventory", [0, 1, 2])
def test_plan_table_and_json_say_what_the_ollama_files_say(
    registered: tuple[Repo, Manifest], inventory: int, tmp_path: Path
) -> None:
    """`modelmint plan NAME:TAG --gpus ...` for a GGUF, as a table and as --json, shows the llama.cpp plan its
    --out files carry (num_ctx, OLLAMA_NUM_PARALLEL, num_gpu, the servers) and recommend's for the same group, and
    says the engine; it printed vLLM's max_model_len and max_num_seqs, which no file or answer carried."""
    repo, m = registered
    gpus = m.serving.inventories[inventory].gpus
    ask = ("plan", "tiny-qwen2:q4_k_m", "--gpus", gpus, "--context", str(SERVE["context"]), "--concurrency",
           str(SERVE["concurrency"]))
    as_json, table, written = modelmint_here(repo, *ask, "--json"), modelmint_here(repo, *ask), modelmint_here(repo, *ask, "--out", str(tmp_path))
    for proc in (as_json, table, written):
        assert proc.returncode == 0, proc.stderr
    plans = json.loads(as_json.stdout)
    files = text_files(tmp_path)
    assert sorted(files) == sorted(f"{p['group'].lower()}/ollama/{f}" for p in plans for f in ("Modelfile",
                                                                                                 "start.sh"))
    assert "max_model_len" not in table.stdout and "max_num_seqs" not in table.stdout, table.stdout
    for p in plans:
        assert p["engine"] == "ollama", p
        assert p["num_ctx"] == SERVE["context"], p
        modelfile = files[f"{p['group'].lower()}/ollama/Modelfile"]
        assert f"PARAMETER num_ctx {p['num_ctx']}\n" in modelfile and f"PARAMETER num_gpu {p['n_gpu_layers']}\n" \
            in modelfile, (modelfile, p)
        start = files[f"{p['group'].lower()}/ollama/start.sh"]
        assert f"OLLAMA_NUM_PARALLEL={p['parallel']} " in start, (start, p)
        said = (f"{p['group']}: engine ollama (llama.cpp); num_ctx {p['num_ctx']}, OLLAMA_NUM_PARALLEL "
                f"{p['parallel']}, num_gpu {p['n_gpu_layers']} of {p['n_layers']} layers")
        assert said in table.stdout, table.stdout
        plan = {k: v for k, v in p.items() if k != "group"}
        assert plan == _recommended(repo, p["group"])["ranked"][0]["gguf_plan"]  # one plan, one answer
    assert written.stdout.startswith(table.stdout), (written.stdout, table.stdout)


@pytest.mark.slow
def test_plan_refuses_vllms_options_for_a_gguf(registered: tuple[Repo, Manifest], tmp_path: Path) -> None:
    """vLLM cannot load a GGUF: its options are refused by name, not planned for, and nothing is written."""
    repo, _ = registered
    proc = modelmint_here(repo, "plan", "tiny-qwen2:q4_k_m", "--gpus", "4xRTX4090-24G", "--tensor-parallel-size", "2",
                "--out", str(tmp_path / "out"))
    assert proc.returncode != 0, proc.stdout
    assert "--tensor-parallel-size 2: vLLM's options" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
