"""`recommend` on the machines Ollama users have (a GPU by its size, consumer cards, a CPU, an Apple machine, cards
described in the user's own inventory), per engine: a GGUF sized by llama.cpp's own buffers for Ollama or
llama-server (partly offloaded when the GPU is short, with the cost said), a checkpoint on vLLM; the printed
llama-server command started for real and read back; bad input refused in one line naming the field."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from registry_env import Repo, isolate, make_repo
from site_registry import candidate_for, register_built_q4_k_m

from pipelines.advice.recommend import GPU_RESERVE, Advice, Request, recommend
from pipelines.core.errors import ConfigError
from pipelines.core.gpus import CUDA_ALLOWANCE_GIB, cluster_of, known_gpus, load_inventory
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.publish.llamacpp_memory import (
    LayeredWeights,
    LlamaCppContext,
    llamacpp_memory,
    parse_load_log,
    read_layered_weights,
)
from pipelines.store.manifest import find_manifest

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """modelmint from this tree (python -m, so a checkout's own code runs), one command."""
    full = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=full, capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=300)


def _one_error_line(proc: subprocess.CompletedProcess[str], *says: str) -> None:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error:"), proc.stderr
    for s in says:
        assert s in proc.stderr, (s, proc.stderr)


# ------------------------------------------------------------------------------------------------- any hardware


def test_a_gpu_known_only_by_its_size_is_planned_below_its_nominal_memory() -> None:
    (group,) = cluster_of("1x16G")
    assert group.gpus == 1 and group.gpu.kind == "cuda"
    assert group.gpu.memory_gib == pytest.approx(16 - CUDA_ALLOWANCE_GIB)
    assert not group.gpu.fp8_compute  # nothing is assumed of a card known by its size
    assert group.gpu.memory_estimated and not group.gpu.memory_measured  # said as an estimate, not as measured


@pytest.mark.parametrize(("name", "nominal"), [
    ("RTX3060-12G", 12), ("RTX4060-8G", 8), ("RTX4060Ti-16G", 16), ("RTX4070-12G", 12), ("RTX4080-16G", 16),
    ("RTX3090-24G", 24), ("RTX4090-24G", 24),
])
def test_consumer_cards_have_profiles_with_the_memory_cuda_reports(name: str, nominal: int) -> None:
    g = known_gpus()[name]
    assert nominal - 0.5 <= g.memory_gib < nominal, g  # what CUDA reports, or nominal less the stated allowance
    assert g.node_label.startswith("NVIDIA-GeForce-RTX-")
    assert g.memory_measured or (g.memory_estimated and g.memory_gib == nominal - CUDA_ALLOWANCE_GIB)
    (group,) = cluster_of(f"1x{name}")
    assert group.gpu == g


def test_a_cpu_and_an_apple_machine_are_hosts_with_their_usable_memory() -> None:
    (cpu,) = cluster_of("cpu:64G", hosts=True)
    assert cpu.gpu.kind == "cpu" and cpu.gpu.ram_gib == 64 and 60 <= cpu.gpu.memory_gib < 64
    # Metal's default working set (recommendedMaxWorkingSetSize): 3/4 of RAM above 36 GB, 2/3 up to it
    (big,) = cluster_of("apple:M3-Max-64G", hosts=True)
    assert big.gpu.kind == "metal" and big.gpu.memory_gib == pytest.approx(48)
    (small,) = cluster_of("apple:M2-16G", hosts=True)
    assert small.gpu.memory_gib == pytest.approx(16 * 2 / 3)
    assert "M3-Max" in big.gpu.name
    # vLLM plans (modelmint plan) need CUDA GPUs: a host is refused there, pointing at recommend
    with pytest.raises(ConfigError, match="without a CUDA GPU") as err:
        cluster_of("cpu:64G")
    assert "modelmint recommend --gpus cpu:64G" in (err.value.hint or "")


def test_an_inventory_describes_cards_no_profile_names(tmp_path: Path) -> None:
    inv = tmp_path / "mine.yaml"
    inv.write_text("- {gpus: 2, type: MyCard-20G, memory_gib: 19.5, fp8: true}\n"
                   "- {gpus: 1, type: RTX4060-8G, memory_gib: 7.6}\n")
    mine, known = load_inventory(inv)
    assert (mine.gpus, mine.gpu.name, mine.gpu.memory_gib, mine.gpu.fp8_compute) == (2, "MyCard-20G", 19.5, True)
    assert mine.gpu.memory_source == "your inventory file"
    assert known.gpu.memory_gib == 7.6 and known.gpu.fp8_compute  # the profile's FP8, the file's memory


@pytest.mark.parametrize(("text", "says"), [
    ("- {gpus: 1, type: MyCard, memory_gib: lots}", "memory_gib"),
    ("- {gpus: 1, type: MyCard, memory_gib: 12, fp8: maybe}", "fp8"),
    ("- {gpus: 1, type: MyCard, memory_gib: -3}", "memory_gib"),
    ("- {gpus: 1, type: MyCard, memory_gb: 12}", "memory_gb"),
])
def test_an_inventory_with_wrong_types_names_the_field(tmp_path: Path, text: str, says: str) -> None:
    inv = tmp_path / "bad.yaml"
    inv.write_text(text + "\n")
    with pytest.raises(ConfigError, match=says) as err:
        load_inventory(inv)
    assert "memory_gib" in (err.value.hint or "")  # the custom-card syntax
    proc = _cli("recommend", "--gpus", str(inv), env={"MODELMINT_REPO": str(tmp_path)})
    _one_error_line(proc, f"{inv}, group 1", says)


def test_a_gpu_nothing_matches_says_did_you_mean_and_the_inventory_syntax(tmp_path: Path) -> None:
    proc = _cli("recommend", "--gpus", "1xRTX4061-8G", env={"MODELMINT_REPO": str(tmp_path)})
    _one_error_line(proc, "unknown GPU 'RTX4061-8G'", "did you mean 1xRTX4060-8G?", "memory_gib", "fp8",
                    "1x16G")


# ------------------------------------------------------------------------------------ recommend, per engine


@dataclass
class Registered:
    repo: Repo
    settings: Settings
    gguf: Path
    """tiny-qwen2:q4_k_m as registered (a real GGUF built by modelmint's steps), in the checkout."""
    weights: LayeredWeights


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registered]:
    """tiny-qwen2's real q4_k_m GGUF (converted and quantized here) and a compressed fp8 checkpoint with
    Qwen2.5-0.5B's shape, registered in a git + DVC repository (its figures: the GGUF measured better)."""
    from pipelines.registry.register import register

    base = tmp_path_factory.mktemp("engines")
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        repo = make_repo(base, models={"tiny-qwen2": ["q4_k_m", "fp8"]})
        settings = repo.settings()
        register_built_q4_k_m(settings, base / "builds")
        register(settings, candidate_for(settings, base / "builds", "tiny-qwen2", "fp8",
                                         (0.0300, 0.0009, 88.0, 0.7, 4.0, 1.0)))
        repo.commit_all("register tiny-qwen2 q4_k_m and fp8")
        m = find_manifest(settings, "tiny-qwen2:q4_k_m")
        gguf = settings.repo_dir / m.dvc.path / m.file
        yield Registered(repo, settings, gguf, read_layered_weights(gguf))


def _advice(reg: Registered, request: Request) -> Advice:
    (a,) = recommend(reg.settings, request, ["tiny-qwen2"])
    return a


def test_a_gguf_is_planned_for_ollama_and_the_modelfile_carries_the_plan(registered: Registered) -> None:
    w = registered.weights
    a = _advice(registered, Request("1x16G", context=2048, concurrency=2))
    assert a.winner is not None and a.winner.tag == "q4_k_m" and a.winner.gguf is not None
    g = a.winner.gguf
    assert (g.engine, g.num_ctx, g.parallel, g.n_gpu_layers, g.n_layers) == ("ollama", 2048, 2, w.n_layer + 1,
                                                                             w.n_layer + 1)
    assert not g.partial and a.warnings == []
    # llama.cpp's own buffers for that context: KV for 2 x 2048 cells
    assert g.memory == llamacpp_memory(w, LlamaCppContext(4096, 2), w.n_layer + 1)
    assert a.commands[1:] == [
        f"printf 'FROM tiny-qwen2:q4_k_m\\nPARAMETER num_ctx 2048\\nPARAMETER num_gpu {w.n_layer + 1}\\n' > "
        "tiny-qwen2-q4_k_m.Modelfile",
        "ollama create tiny-qwen2:q4_k_m-ctx2048 -f tiny-qwen2-q4_k_m.Modelfile",
        "OLLAMA_NUM_PARALLEL=2 ollama serve",
        "ollama run tiny-qwen2:q4_k_m-ctx2048",
    ]


def test_too_little_vram_gives_the_partial_offload_that_fits_and_its_cost(registered: Registered,
                                                                          tmp_path: Path) -> None:
    w = registered.weights
    ctx = LlamaCppContext(1024, 1)

    def need(n: int) -> int:
        m = llamacpp_memory(w, ctx, n)
        return m.weights_gpu + m.kv_gpu + m.compute + m.output

    # a card whose memory, less the GPU's reserve, holds the output layer and one block, not two
    inv = tmp_path / "small.yaml"
    inv.write_text(f"- {{gpus: 1, type: Tiny-Card, memory_gib: {(GPU_RESERVE + (need(2) + need(3)) / 2) / (1 << 30)}}}\n")
    a = _advice(registered, Request(str(inv), context=1024, engine="llama.cpp"))
    assert a.winner is not None and a.winner.gguf is not None
    g = a.winner.gguf
    assert g.n_gpu_layers == 2 and g.partial
    m = llamacpp_memory(w, ctx, g.n_gpu_layers)
    assert m.weights_gpu + m.kv_gpu + m.compute + m.output <= g.gpu_budget  # what it puts there fits
    more = llamacpp_memory(w, ctx, g.n_gpu_layers + 1)
    assert more.weights_gpu + more.kv_gpu + more.compute + more.output > g.gpu_budget  # one more does not
    share = 1 - m.weights_gpu / m.weights
    assert f"{g.n_gpu_layers} of {w.n_layer + 1} layers" in a.warnings[0]
    assert f"{share:.0%} of the weights" in a.warnings[0] and "slower" in a.warnings[0]
    assert any("partial offload" in r for r in a.reasons)
    assert f" -ngl {g.n_gpu_layers} " in a.commands[-1]


def test_a_cpu_machine_runs_llama_server_with_no_layer_offloaded(registered: Registered) -> None:
    a = _advice(registered, Request("cpu:8G", context=1024, concurrency=3, engine="llama.cpp"))
    assert a.winner is not None and a.winner.gguf is not None and a.winner.gguf.kind == "cpu"
    rel = registered.gguf.relative_to(registered.settings.repo_dir)
    assert a.commands == [
        "modelmint pull tiny-qwen2:q4_k_m",
        f"llama-server -m {rel} --host 127.0.0.1 --port 8080 -ngl 0 -c 3072 -np 3 -b 2048 -ub 512 -ctk f16 "
        "-ctv f16 -fa on -no-kvu",
    ]
    # a checkpoint is no answer there: vLLM needs CUDA GPUs
    (fp8,) = [c for c in _advice(registered, Request("cpu:8G")).unfit if c.tag == "fp8"]
    assert "vLLM plans need CUDA GPUs" in (fp8.refused or "")


def test_at_high_concurrency_a_vllm_checkpoint_is_said_to_serve_better(registered: Registered) -> None:
    a = _advice(registered, Request("1xRTX4090-24G", context=2048, concurrency=200))
    assert a.winner is not None and a.winner.tag == "q4_k_m"  # the better figures
    note = next(r for r in a.reasons if "serves better" in r)
    assert "tiny-qwen2:fp8 on vLLM" in note and "max_num_seqs 256" in note and "paged" in note
    assert "--engine vllm" in note
    # past llama.cpp's 256 slots (LLAMA_MAX_SEQ) no GGUF server loads: the checkpoint serves
    past = _advice(registered, Request("1xRTX4090-24G", context=2048, concurrency=300))
    assert past.winner is not None and past.winner.tag == "fp8"
    assert any(c.tag == "q4_k_m" and c.refused and "LLAMA_MAX_SEQ" in c.refused for c in past.unfit), past.unfit
    on_vllm = _advice(registered, Request("1xRTX4090-24G", context=2048, concurrency=300, engine="vllm"))
    assert on_vllm.winner is not None and on_vllm.winner.tag == "fp8"
    # the planner's cap is said, not swallowed
    assert any("capped at 256 sequences" in w and "other 44 wait" in w for w in on_vllm.warnings)
    assert on_vllm.commands[-1].startswith("vllm serve ")


def test_the_cli_prints_the_plan_and_the_commands_per_engine(registered: Registered) -> None:
    env = registered.repo.env()
    proc = _cli("recommend", "tiny-qwen2", "--gpus", "1xRTX4060-8G", "--engine", "llama.cpp", "--context", "1024",
                cwd=registered.repo.root, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "llama.cpp: 5/5 layers on the GPU, num_ctx 1024 x 1 slot(s)" in proc.stdout, proc.stdout
    assert "  llama-server -m artifacts/tiny-qwen2/q4_k_m/" in proc.stdout
    proc = _cli("recommend", "tiny-qwen2", "--gpus", "apple:M3-Max-64G", "--json", cwd=registered.repo.root, env=env)
    assert proc.returncode == 0, proc.stderr
    (answer,) = json.loads(proc.stdout)
    assert answer["winner"] == "tiny-qwen2:q4_k_m" and answer["ranked"][0]["gguf_plan"]["kind"] == "metal"


@pytest.mark.parametrize(("args", "says"), [
    (["--context", "10000000"], "--context 10000000 is longer than tiny-qwen2 supports"),
    (["--concurrency", "0"], "--concurrency 0"),
    (["--concurrency", "1000000000"], "--concurrency 1000000000 is more sequences"),
    (["--engine", "olama"], "did you mean --engine ollama?"),
    (["--gpus", "cpu:lots"], "cpu:RAMG"),
])
def test_bad_input_is_one_error_line_naming_the_field(registered: Registered, args: list[str], says: str) -> None:
    full = ["--gpus", "1x16G", *args] if "--gpus" not in args else args
    proc = _cli("recommend", "tiny-qwen2", *full, cwd=registered.repo.root, env=registered.repo.env())
    _one_error_line(proc, says)


def test_an_empty_registry_answers_with_the_next_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate(tmp_path / "env", monkeypatch)
    repo = make_repo(tmp_path)
    proc = _cli("recommend", "--gpus", "1xRTX4060-8G", cwd=repo.root, env=repo.env())
    _one_error_line(proc, "nothing is registered", "modelmint convert NAME --variants q4_k_m --register")


@pytest.mark.slow
def test_the_printed_llama_server_command_serves_the_planned_context_and_slots(registered: Registered,
                                                                               tmp_path: Path) -> None:
    """The command recommend prints, started as printed (the real llama-server, on 127.0.0.1, a port the kernel
    picks; one thread, no warm-up and the verbose log added, none of which changes what is planned): its /props and
    /slots report the planned context per slot and slot count, its load log the cells."""
    a = _advice(registered, Request("cpu:8G", context=1024, concurrency=3, engine="llama.cpp"))
    assert a.winner is not None and a.winner.gguf is not None
    plan = a.winner.gguf
    argv = shlex.split(a.commands[-1])
    assert argv[0] == "llama-server" and argv[argv.index("--port") + 1] == "8080"
    argv[0] = str(llama_cpp(registered.settings).bin("llama-server"))
    argv[argv.index("--port") + 1] = "0"
    log = tmp_path / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*argv, "-t", "1", "--no-warmup", "-lv", "4"], cwd=registered.repo.root, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        port = None
        for _ in range(1200):  # at most 120 s to load
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
            if found or proc.poll() is not None:
                port = int(found.group(1)) if found else None
                break
            time.sleep(0.1)
        assert port is not None, log.read_text(errors="replace")[-2000:]
        props = _get_json(f"http://127.0.0.1:{port}/props")
        slots = _get_json(f"http://127.0.0.1:{port}/slots")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert props["total_slots"] == plan.parallel == 3
    assert props["default_generation_settings"]["n_ctx"] == plan.num_ctx == plan.context.n_ctx_seq == 1024
    assert [s["n_ctx"] for s in slots] == [plan.num_ctx] * plan.parallel
    logged = parse_load_log(log.read_text(errors="replace"))
    assert (logged.n_ctx, logged.n_ctx_seq, logged.n_seq_max) == (plan.context.n_ctx_total, 1024, 3)


def _get_json(url: str) -> Any:
    for _ in range(100):  # the model may still be loading just after it listens (503)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            if err.code != 503:
                raise
        time.sleep(0.2)
    raise AssertionError(f"{url} kept answering 503")
