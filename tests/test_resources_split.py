"""The preflight against the Hub's per-file limit and llama-gguf-split: real Qwen2.5 shapes (sparse Safetensors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.core.errors import ConfigError, RunTooLarge
from pipelines.core.resources import (
    GIB,
    HUB_FILE_LIMIT,
    KLReference,
    Places,
    PlannedFile,
    gguf_run,
    require,
    source_shape,
)
from tests.test_resources import _qwen_shapes, write_sharded

KL = KLReference(ctx=128, chunks=16)  # pipelines/gguf/build.py GGUF_EVAL_CTX, GGUF_EVAL_CHUNKS
QUANTS = ["q4_k_m", "q8_0"]
ENOUGH = 1 << 42  # memory is not what these tests are about


@pytest.fixture(scope="module")
def qwen72b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5-72B's shapes: 80 layers, hidden 8192, intermediate 29568, 64 heads / 8 KV heads, vocab 152064."""
    d = tmp_path_factory.mktemp("qwen2.5-72b")
    write_sharded(d, _qwen_shapes(80, 8192, 29568, 64, 8, 152064), 8)
    return d


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("qwen2.5-7b")
    write_sharded(d, _qwen_shapes(28, 3584, 18944, 28, 4, 152064), 4)
    return d


def test_72b_f16_and_q8_0_cross_the_hub_limit_and_7b_does_not(qwen72b: Path, qwen7b: Path, tmp_path: Path) -> None:
    check = gguf_run(source_shape(qwen72b), QUANTS, Places(tmp_path), imatrix=False, kl=KL, available_memory=ENOUGH)
    files = {f.what: f for f in check.files}
    assert list(files) == ["f16 GGUF", "q4_k_m", "q8_0"]
    assert files["f16 GGUF"].bytes / GIB == pytest.approx(135.4, abs=0.1)
    assert files["q8_0"].bytes / GIB == pytest.approx(73677.66 / 1024, rel=0.002)  # llama-quantize --dry-run: 73677.66 MiB
    assert files["q4_k_m"].bytes < HUB_FILE_LIMIT  # 46.9 GB (43.6 GiB)
    assert [f.what for f in check.over_hub_limit] == ["f16 GGUF", "q8_0"]
    q8 = str(files["q8_0"].note)
    assert "q8_0 is one file of 77.3 GB (71.9 GiB)" in q8
    assert "the Hugging Face Hub's per-file limit of 50 GB" in q8
    assert "`split_max_size: 50G`" in q8 and "llama-gguf-split --split --split-max-size 50G" in q8
    assert "scratch" in str(files["f16 GGUF"].note)  # never registered: nothing to split
    assert files["q4_k_m"].note is None
    assert check.notes == [files["q8_0"].note]  # what the run says before its first step
    reported = {f["what"]: f for f in check.to_dict()["files"]}
    assert reported["q8_0"]["over_hub_limit"] and not reported["q4_k_m"]["over_hub_limit"]

    small = gguf_run(source_shape(qwen7b), QUANTS, Places(tmp_path), imatrix=False, kl=KL, available_memory=ENOUGH)
    assert small.over_hub_limit == [] and all(f.note is None for f in small.files) and small.notes == []


def test_a_variant_split_by_the_catalog_counts_its_parts_on_the_build_disk(qwen72b: Path, tmp_path: Path) -> None:
    """pipelines/gguf/tools.split writes the parts beside the whole file it keeps: the build disk holds q8_0 twice."""
    shape = source_shape(qwen72b)
    whole = gguf_run(shape, QUANTS, Places(tmp_path), imatrix=False, kl=KL, available_memory=ENOUGH)
    split = gguf_run(shape, QUANTS, Places(tmp_path), imatrix=False, kl=KL, available_memory=ENOUGH,
                     split_max_size="50G")
    files = {f.what: f for f in split.files}
    assert files["q8_0"].parts == 2 and files["q4_k_m"].parts == 1  # 46.9 GB: under 50G, not split
    assert files["q8_0"].largest <= HUB_FILE_LIMIT and not files["q8_0"].crosses
    assert split.filesystems[0].needed - whole.filesystems[0].needed == files["q8_0"].bytes
    assert "registered as 2 files of at most 50G" in str(files["q8_0"].note)
    # parts that are themselves over the limit are still flagged
    big = gguf_run(shape, QUANTS, Places(tmp_path), imatrix=False, kl=KL, available_memory=ENOUGH,
                   split_max_size="60G")
    assert [f.what for f in big.over_hub_limit] == ["f16 GGUF", "q8_0"]
    # a file between 50 GB and 50 GiB: over the limit, and split at 50G as llama-gguf-split counts it (10^9)
    edge = PlannedFile("q8_0", 52 * 10**9, split_max_size="50G")
    assert edge.parts == 2 and not edge.crosses


def test_publishing_a_variant_that_would_be_split_is_refused_before_any_work(qwen72b: Path, tmp_path: Path) -> None:
    """An Ollama image holds one GGUF: a publishing run that would register q8_0 as parts stops before its first
    step (the disks here are far too small for 72B: the refusal comes first, since no disk helps it)."""
    places = Places(tmp_path / "build", tmp_path / "artifacts", tmp_path / ".dvc" / "cache", publishes=True)
    check = gguf_run(source_shape(qwen72b), QUANTS, places, imatrix=False, kl=KL, available_memory=ENOUGH,
                     split_max_size="50G")
    with pytest.raises(ConfigError) as refused:
        require(check, what="qwen2.5-72b (q4_k_m, q8_0)")
    message = str(refused.value)
    assert "q8_0 (71.9 GiB: 2 parts)" in message and "an Ollama image holds one GGUF" in message
    assert "nothing was started" in message and "q4_k_m" not in message.split(":", 1)[1].split("would")[0]
    assert "remove `split_max_size`" in str(refused.value.hint)
    assert not (tmp_path / "build").exists() and not (tmp_path / "artifacts").exists()
    # not publishing: the split is fine, and only the disk is short
    alone = gguf_run(source_shape(qwen72b), QUANTS, Places(tmp_path / "build"), imatrix=False, kl=KL,
                     available_memory=ENOUGH, split_max_size="50G")
    with pytest.raises(RunTooLarge):
        require(alone, what="qwen2.5-72b (q4_k_m, q8_0)")
