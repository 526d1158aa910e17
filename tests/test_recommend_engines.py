"""`recommend` on the machines Ollama users have (a GPU by its size, consumer cards, a CPU, an Apple machine, cards
described in the user's own inventory), per engine: a GGUF sized by llama.cpp's own buffers for Ollama or
llama-server (partly offloaded when the GPU is short, with the cost said), a checkpoint on vLLM; the printed
llama-server command started for real and read back; bad input refused in one line naming the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.core.errors import ConfigError
from pipelines.core.gpus import CUDA_ALLOWANCE_GIB, cluster_of, known_gpus, load_inventory

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
    assert "less" in group.gpu.memory_source


@pytest.mark.parametrize(("name", "nominal"), [
    ("RTX3060-12G", 12), ("RTX4060-8G", 8), ("RTX4060Ti-16G", 16), ("RTX4070-12G", 12), ("RTX4080-16G", 16),
    ("RTX3090-24G", 24), ("RTX4090-24G", 24),
])
def test_consumer_cards_have_profiles_with_the_memory_cuda_reports(name: str, nominal: int) -> None:
    g = known_gpus()[name]
    assert nominal - 0.5 <= g.memory_gib < nominal, g  # what CUDA reports, or nominal less the stated allowance
    assert g.memory_source and g.node_label.startswith("NVIDIA-GeForce-RTX-")
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
