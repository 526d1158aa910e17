"""`recommend` for a GGUF registered by the real code (tiny-qwen2's q4_k_m, converted and quantized here):

- in a checkout that holds the registry but not the artifacts' bytes (a fresh clone), the model's shape recorded in
  its manifests at registration gives the same answer as the builder's, who has the files; a manifest registered
  before the shape was recorded still asks for a pull;
- on a machine with several GPUs, the commands for Ollama realise the plan: a start script with one Ollama per GPU
  (CUDA_VISIBLE_DEVICES, OLLAMA_NUM_PARALLEL) behind nginx, or one Ollama over every GPU with OLLAMA_SCHED_SPREAD,
  written by the printed command itself (bash), checked by shellcheck and nginx's parser."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crossplane
import pytest
from registry_env import Repo, git, isolate, make_repo
from site_registry import register_built_q4_k_m

from pipelines.publish.llamacpp_memory import read_layered_weights
from pipelines.store.manifest import find_manifest, manifest_path

ROOT = Path(__file__).resolve().parents[1]


def _cli(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    """modelmint from this tree (python -m, so this checkout's own code runs), in `repo`."""
    env = {**repo.env(), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env, capture_output=True, text=True,
                          cwd=repo.root, timeout=300)


@dataclass
class Builder:
    repo: Repo
    base: Path


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builder]:
    """tiny-qwen2's real q4_k_m GGUF (converted and quantized here) registered and pushed by the real code, the
    registry committed to git."""

    base = tmp_path_factory.mktemp("offline")
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        repo = make_repo(base, models={"tiny-qwen2": ["q4_k_m"]})
        settings = repo.settings()
        register_built_q4_k_m(settings, base / "builds")
        repo.commit_all("register tiny-qwen2 q4_k_m")
        yield Builder(repo, base)


def _clone(builder: Builder, name: str) -> Repo:
    dest = builder.base / name
    git(builder.base, "clone", "-q", str(builder.repo.root), name)
    clone = Repo(dest, builder.repo.remote, builder.base / f"{name}-work")
    assert not (dest / "artifacts").exists()  # the bytes are in the DVC remote, not in git
    return clone


ASKED = [
    ["--gpus", "1x16G", "--context", "2048", "--concurrency", "2"],
    ["--gpus", "1xRTX4060-8G", "--engine", "llama.cpp", "--context", "1024"],
    ["--gpus", "cpu:8G", "--engine", "llama.cpp", "--context", "1024", "--concurrency", "3"],
    ["--gpus", "apple:M3-Max-64G"],
    ["--gpus", "2xRTX4090-24G", "--concurrency", "4"],
]


def _answer(repo: Repo, args: list[str]) -> Any:
    proc = _cli(repo, "recommend", "tiny-qwen2", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    (answer,) = json.loads(proc.stdout)
    return answer


def test_the_manifest_records_the_shape_llama_cpp_sizes_the_gguf_by(builder: Builder) -> None:
    settings = builder.repo.settings()
    m = find_manifest(settings, "tiny-qwen2:q4_k_m")
    assert m.shape is not None and m.shape.llamacpp is not None
    gguf = settings.repo_dir / m.dvc.path / m.file
    from_file = read_layered_weights(gguf)
    assert m.shape.llamacpp.weights(str(gguf)) == from_file  # every count and every layer's bytes
    assert (m.shape.layers, m.shape.kv_heads) == (from_file.n_layer, max(from_file.n_head_kv))


def test_a_fresh_clone_without_the_artifacts_gets_the_builders_recommendation(builder: Builder) -> None:
    clone = _clone(builder, "clone")
    for args in ASKED:
        built = _answer(builder.repo, args)
        assert built["winner"] == "tiny-qwen2:q4_k_m" and built["problem"] is None, (args, built)
        assert _answer(clone, args) == built, args
    assert not (clone.root / "artifacts").exists()  # answered without pulling anything


def test_a_manifest_registered_before_the_shape_was_recorded_asks_for_a_pull(builder: Builder) -> None:
    clone = _clone(builder, "old-clone")
    path = manifest_path(clone.settings(), "tiny-qwen2", "q4_k_m")
    data = json.loads(path.read_text())
    del data["shape"]  # as registrations made before the shape was recorded wrote it
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    proc = _cli(clone, "recommend", "tiny-qwen2", "--gpus", "1x16G")
    assert "Traceback" not in proc.stderr, proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())  # as wrapped for the terminal
    assert "registered before modelmint recorded the model's shape" in said, said
    assert "run `modelmint pull tiny-qwen2:q4_k_m`" in said, said


# ------------------------------------------------------------------------------------------- several GPUs, Ollama


def _script(answer: Any, tmp: Path) -> tuple[str, Path]:
    """Run the printed command that writes the start script (real bash, in `tmp`); its text and path."""
    scripts = [c for c in answer["commands"] if c.startswith("cat > ")]
    assert len(scripts) == 1, answer["commands"]  # the start script is written by a command of its own
    writes = scripts[0]
    name = writes.split()[2]
    assert answer["commands"][answer["commands"].index(writes) + 1] == f"bash {name}"
    done = subprocess.run(["bash", "-c", writes], cwd=tmp, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    script = tmp / name
    check = subprocess.run([str(Path(sys.executable).parent / "shellcheck"), "-s", "bash", "-S", "warning",
                            str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    return script.read_text(), script


def test_one_ollama_per_gpu_when_one_gpu_holds_the_model(builder: Builder, tmp_path: Path) -> None:
    answer = _answer(builder.repo, ["--gpus", "2xRTX4090-24G", "--context", "2048", "--concurrency", "3"])
    text, script = _script(answer, tmp_path)
    plan = answer["ranked"][0]["gguf_plan"]
    assert (plan["instances"], plan["parallel"], plan["num_ctx"], plan["spread"]) == (2, 2, 2048, False)
    serves = [line for line in text.splitlines() if "ollama serve" in line]
    assert [line.split()[:3] for line in serves] == [
        ["CUDA_VISIBLE_DEVICES=0", "OLLAMA_HOST=127.0.0.1:11435", "OLLAMA_NUM_PARALLEL=2"],
        ["CUDA_VISIBLE_DEVICES=1", "OLLAMA_HOST=127.0.0.1:11436", "OLLAMA_NUM_PARALLEL=2"],
    ]
    assert "OLLAMA_SCHED_SPREAD" not in text
    # the Modelfile the commands write is the one the script creates the planned model from
    local = "tiny-qwen2:q4_k_m-ctx2048"
    assert f'ollama create {local} -f "$HERE/tiny-qwen2-q4_k_m.Modelfile"' in text
    assert any(c.startswith("printf 'FROM tiny-qwen2:q4_k_m\\nPARAMETER num_ctx 2048\\n") and
               c.endswith("> tiny-qwen2-q4_k_m.Modelfile") for c in answer["commands"]), answer["commands"]
    # the proxy in front of them, as nginx parses it
    conf = text.split("<<'NGINX'\n", 1)[1].split("\nNGINX\n", 1)[0]
    (tmp_path / "nginx.conf").write_text(conf + "\n")
    parsed = crossplane.parse(str(tmp_path / "nginx.conf"), strict=True, check_ctx=True, check_args=True)
    assert parsed["status"] == "ok", parsed["errors"]
    upstream = next(d for d in parsed["config"][0]["parsed"] if d["directive"] == "http")["block"][0]
    assert [d["args"] for d in upstream["block"] if d["directive"] == "server"] == [["127.0.0.1:11435"],
                                                                                   ["127.0.0.1:11436"]]
    assert script.stat().st_size > 0
    # one sequence: one Ollama on one GPU, where the scheduler puts it anyway; no script
    single = _answer(builder.repo, ["--gpus", "2xRTX4090-24G", "--context", "2048"])
    assert single["ranked"][0]["gguf_plan"]["instances"] == 1
    assert not any(c.startswith("cat > ") for c in single["commands"])
    assert "OLLAMA_NUM_PARALLEL=1 ollama serve" in single["commands"]


def test_one_ollama_spread_over_the_gpus_when_none_holds_it_alone(builder: Builder, tmp_path: Path) -> None:
    inv = tmp_path / "small.yaml"
    inv.write_text("- {gpus: 2, type: Small-Card, memory_gib: 0.8}\n")
    answer = _answer(builder.repo, ["--gpus", str(inv), "--context", "4096", "--concurrency", "4"])
    text, _ = _script(answer, tmp_path)
    plan = answer["ranked"][0]["gguf_plan"]
    assert (plan["instances"], plan["parallel"], plan["spread"]) == (1, 4, True)
    assert plan["n_gpu_layers"] > 0
    (serve,) = [line for line in text.splitlines() if "ollama serve" in line]
    assert serve.split()[:4] == ["CUDA_VISIBLE_DEVICES=0,1", "OLLAMA_HOST=127.0.0.1:11434", "OLLAMA_NUM_PARALLEL=4",
                                 "OLLAMA_SCHED_SPREAD=1"]
    assert "nginx" not in text
    assert f"PARAMETER num_gpu {plan['n_gpu_layers']}" in " ".join(answer["commands"])



def test_plan_in_a_fresh_clone_writes_the_builders_files_without_a_pull(builder: Builder, tmp_path: Path) -> None:
    clone = _clone(builder, "plan-clone")
    outputs = {}
    for repo, name in ((builder.repo, "built"), (clone, "cloned")):
        proc = _cli(repo, "plan", "tiny-qwen2:q4_k_m", "--gpus", "4xRTX4090-24G", "--context", "4096", "--out",
                    str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr
        files = {p.relative_to(tmp_path / name).as_posix(): p.read_text()
                 for p in sorted((tmp_path / name).rglob("*")) if p.is_file()}
        outputs[name] = (proc.stdout.replace(str(tmp_path / name), "OUT"), files)
    assert outputs["cloned"] == outputs["built"]
    assert any(f.endswith("ollama/start.sh") for f in outputs["built"][1]), outputs["built"][1]
    assert not (clone.root / "artifacts").exists()
