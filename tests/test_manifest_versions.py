"""Manifests registered before the one validation block (schema version 1) and before `weights_bytes` (version 2)
still load, read as the current version (3).

The fixtures under tests/data/ were written by the version-1 code (Manifest.to_json at schema_version 1): a
GGUF variant with llama-perplexity's figures and a compressed-tensors one with the torch evaluation's; and by the
version-2 code (manifest-v2-compressed.json). Their weight bytes are derived from the sizes their files list records.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipelines.core.errors import ManifestInvalid
from pipelines.store.manifest import SCHEMA_VERSION, Manifest, load_manifest

DATA = Path(__file__).parent / "data"


def _old(name: str) -> dict:
    raw = json.loads((DATA / name).read_text())
    assert raw["schema_version"] == 1 and "metrics" in raw["validation"]  # the fixture is the old shape
    return raw


def test_a_version_1_gguf_manifest_reads_as_the_current_version() -> None:
    m = load_manifest(DATA / "manifest-v1-gguf.json")
    assert m.schema_version == SCHEMA_VERSION == 3
    assert m.weights_bytes == m.size_bytes == 1234  # one GGUF; the Modelfile is not weights
    f = m.validation.figures
    assert f is not None and f.mean_kl == 0.00151 and f.same_top_pct == 97.22 and f.kl_p99 == 0.0121
    assert f.ppl_reference == 21.35 and f.ppl == 21.4 and f.ppl_ratio == pytest.approx(21.4 / 21.35)
    assert f.tokens == 16 * 63  # llama-perplexity scores ctx - 1 - ctx/2 positions of each window
    assert m.validation.gate.model_dump() == {"max_mean_kl": 0.005, "min_same_top_pct": 97.0, "max_ppl_ratio": 1.02,
                                 "max_dppl_pct": 2.0, "basis": "tiny-model profile for q4_k_m",
                                 "noise_sigmas": 0.0}  # recorded before the noise was read: figures compared as they are
    assert m.validation.format == "gguf" and m.validation.passed and m.validation.smoke["tokens_generated"] == 32
    assert m.validation.report_sha256 == "9" * 64 and m.mean_kl == 0.00151


def test_a_version_1_compressed_manifest_reads_as_the_current_version() -> None:
    m = load_manifest(DATA / "manifest-v1-compressed.json")
    assert m.weights_bytes == 999  # model.safetensors; config.json is not weights
    f = m.validation.figures
    assert f is not None and f.mean_kl == 0.00059 and f.same_top_pct == pytest.approx(99.3) and f.tokens == 2040
    assert f.ppl_reference == 30.1 and f.dppl_pct == pytest.approx((30.12 / 30.1 - 1) * 100, abs=1e-4)
    assert m.validation.gate.min_same_top_pct == 95.0 and m.validation.gate.max_ppl_ratio == 1.02
    assert m.validation.format == "compressed-tensors" and m.parent is None


def test_read_back_it_is_written_as_the_current_version_and_round_trips(tmp_path: Path) -> None:
    for name in ("manifest-v1-gguf.json", "manifest-v1-compressed.json", "manifest-v2-compressed.json"):
        m = load_manifest(DATA / name)
        again = json.loads(m.to_json())
        assert again["schema_version"] == 3 and "figures" in again["validation"] and "metrics" not in again["validation"]
        assert again["weights_bytes"] == m.weights_bytes
        assert Manifest.model_validate(again) == m


def test_an_old_manifest_that_was_invalid_is_still_refused(tmp_path: Path) -> None:
    raw = _old("manifest-v1-gguf.json")
    raw["validation"]["failures"] = ["mean KLD 0.9 > 0.1"]  # a manifest exists only for a passed variant
    bad = tmp_path / "tiny-qwen2" / "q4_k_m.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps(raw))
    with pytest.raises(ManifestInvalid, match=r"validation\.failures"):
        load_manifest(bad, tmp_path)
    shutil.copy(DATA / "manifest-v1-gguf.json", bad)
    assert load_manifest(bad, tmp_path).ref == "tiny-qwen2:q4_k_m"


def test_a_version_2_manifest_from_before_serving_plans_reads_and_keeps_its_shape() -> None:
    """tests/data/manifest-v2-compressed.json was written by the code before serving plans (main at 3d8c64c, the
    version-1 compressed fixture read and written back): no `serving` block. It reads as one without plans and is
    written back as it was but for the version and its weight bytes (no `serving` block); a `serving` block naming a
    file the manifest does not list is refused."""
    from pipelines.store.manifest import InventoryPlans, Serving

    text = (DATA / "manifest-v2-compressed.json").read_text()
    m = load_manifest(DATA / "manifest-v2-compressed.json")
    assert m.serving is None
    assert json.loads(m.to_json()) == {**json.loads(text), "schema_version": 3, "weights_bytes": 999}
    plans = Serving(context=None, concurrency=1, kv_cache_dtype="auto", gpu_memory_utilization=0.9, inventories=[
        InventoryPlans(gpus="1x1xL4-24G", dir="serve/1x1xl4-24g", refused="does not fit", nearest=["--gpus 2xL4-24G"])])
    assert json.loads(m.model_copy(update={"serving": plans}).to_json())["serving"]["inventories"][0]["refused"]
    raw = json.loads(text)
    raw["serving"] = plans.model_dump(mode="json")
    raw["serving"]["inventories"][0].update(refused=None, nearest=[], files=["serve/1x1xl4-24g/vllm.yaml"],
                                            plans=[])
    with pytest.raises(ValidationError, match="either plans or a refusal"):
        Manifest.model_validate(raw)


def _sharded_v2() -> dict:
    """What the version-2 code wrote for a sharded checkpoint: the index as the main file (its size as
    size_bytes), the shards beside it, no total."""
    raw = json.loads((DATA / "manifest-v2-compressed.json").read_text())
    assert raw["schema_version"] == 2 and "weights_bytes" not in raw
    index = {"path": "model.safetensors.index.json", "sha256": "3" * 64, "size": 210_000}
    shards = [{"path": f"model-0000{i}-of-00002.safetensors", "sha256": str(i) * 64, "size": size}
              for i, size in ((1, 20_000_000_000), (2, 19_700_000_000))]
    card = {"path": "README.md", "sha256": "4" * 64, "size": 3_000}
    raw.update(file=index["path"], sha256=index["sha256"], size_bytes=index["size"],
               files=[index, *shards, raw["files"][1], card])
    return raw


def test_a_version_2_sharded_checkpoint_reads_with_every_shards_bytes(tmp_path: Path) -> None:
    """Its total is what its files list records of the shards: not the index (0.2 MiB), not config or card."""
    path = tmp_path / "tiny-qwen2" / "fp8.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_sharded_v2()))
    m = load_manifest(path, tmp_path)
    assert m.size_bytes == 210_000 and m.weights_bytes == 39_700_000_000
    assert json.loads(m.to_json())["weights_bytes"] == 39_700_000_000


def test_a_current_manifest_whose_total_disagrees_with_its_files_is_refused() -> None:
    raw = {**_sharded_v2(), "schema_version": 3, "weights_bytes": 210_000}  # the index's size, as v2 listed it
    with pytest.raises(ValidationError, match="weights_bytes 210000 is not the 39700000000 bytes"):
        Manifest.model_validate(raw)
    raw.pop("weights_bytes")
    with pytest.raises(ValidationError, match="weights_bytes"):
        Manifest.model_validate(raw)  # a version-3 manifest records it: it is not derived
