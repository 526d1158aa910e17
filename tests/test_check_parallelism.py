"""How many variants' checks run at once: all of them while their files fit in half the memory available."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import psutil

from pipelines.gguf.build import check_parallelism


def _plan(tmp_path: Path, sizes: dict[str, int], threads: int = 2) -> SimpleNamespace:
    for q, size in sizes.items():
        with open(tmp_path / f"m-{q}.gguf", "wb") as fh:  # sparse: the size without the disk
            fh.truncate(size)
    return SimpleNamespace(quant_path=lambda q: tmp_path / f"m-{q}.gguf",
                           settings=SimpleNamespace(effective_threads=threads), weights=[])


def test_every_variant_is_checked_at_once_while_their_files_fit(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"q4_k_m": 10**8, "q6_k": 14 * 10**7, "q8_0": 15 * 10**7}, threads=2)
    assert check_parallelism(plan, ["q4_k_m", "q6_k", "q8_0"]) == (3, 1)  # one thread each on two cores
    assert check_parallelism(_plan(tmp_path, {}, threads=16), ["q4_k_m", "q6_k", "q8_0"]) == (3, 5)


def test_files_past_half_the_memory_are_checked_fewer_at_a_time(tmp_path: Path) -> None:
    third = int(psutil.virtual_memory().available * 0.3)  # two of them are past half of it
    plan = _plan(tmp_path, {"q4_k_m": third, "q6_k": third, "q8_0": third}, threads=4)
    assert check_parallelism(plan, ["q4_k_m", "q6_k", "q8_0"]) == (1, 4)
    huge = _plan(tmp_path, {"q8_0": 2 * psutil.virtual_memory().total}, threads=4)
    assert check_parallelism(huge, ["q8_0"]) == (1, 4)  # alone even past the budget: it is checked all the same


def test_nothing_to_check_keeps_every_thread(tmp_path: Path) -> None:
    assert check_parallelism(_plan(tmp_path, {}, threads=os.cpu_count() or 1), []) == (1, os.cpu_count() or 1)
