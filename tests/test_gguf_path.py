"""The GGUF path end to end on the bundled tiny model, with the real pinned llama.cpp."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.core.errors import DiskFullError, UnsupportedModel
from pipelines.core.gates import EARLY_SIGMAS, Gate
from pipelines.core.ggufheader import inspect_gguf
from pipelines.core.report import Figures
from pipelines.core.settings import Settings, project_root
from pipelines.gguf.build import build_gguf
from pipelines.gguf.validate import EARLY_LOOKS
from pipelines.source.catalog import load_catalog

pytestmark = pytest.mark.slow

CATALOG = project_root() / "registry" / "catalog.yaml"
MODELMINT = [sys.executable, "-m", "pipelines.cli"]


def _settings(work: Path, catalog: Path = CATALOG) -> Settings:
    base = Settings.from_env()
    return Settings(home=base.home, work_dir=work, catalog_path=catalog, threads=base.threads)


def _cli_env(work: Path, catalog: Path = CATALOG) -> dict[str, str]:
    return {**os.environ, "MODELMINT_WORK_DIR": str(work), "MODELMINT_CATALOG": str(catalog)}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("work")
    settings = _settings(work)
    entry = load_catalog(CATALOG).get("tiny-qwen2")
    result = build_gguf(entry, settings, quants=["q4_k_m", "q8_0"])
    return settings, entry, result


def test_every_variant_is_checked_validated_and_gated(built) -> None:
    _, _, result = built
    assert set(result.variants) == {"q4_k_m", "q8_0"}
    assert result.passed == ["q4_k_m", "q8_0"], {q: v.failures for q, v in result.variants.items()}
    for q, v in result.variants.items():
        info = inspect_gguf(v.path)
        assert info.file_type == q.upper()
        assert info.architecture == "qwen2"
        assert info.quantized_fraction > 0.95
        assert info.tokenizer_pre == "qwen2" and info.chat_template and "<|im_start|>" in info.chat_template
        assert info.metadata["modelmint.llama_cpp.commit"] == "0c1e570"
        assert info.metadata["modelmint.variant"] == q
        assert "llama.cpp 0c1e570" in info.metadata["general.quantized_by"]
        report = json.loads(v.path.with_suffix(".report.json").read_text())
        judged = report["validation"]
        assert judged["passed"] and report["sha256"] == v.digest
        assert report["smoke"]["tokens_generated"] > 0
        # every chunk of the reference, or a look where every figure was 3 standard errors inside the gate
        if report["kld"]["chunks"] < 16:
            assert report["kld"]["chunks"] in EARLY_LOOKS and report["kld"]["of_chunks"] == 16
            assert Gate.from_dict(judged["gate"]).inside_by(Figures.model_validate(judged["figures"]), EARLY_SIGMAS)
        else:
            assert report["kld"]["chunks"] == 16 and report["kld"]["of_chunks"] is None
        assert 0 < judged["figures"]["mean_kl"] == report["kld"]["mean_kld"] < judged["gate"]["max_mean_kl"]
        assert judged["evaluation"]["text"] == "eval.txt" and judged["figures"]["tokens"] == report["kld"]["chunks"] * 63
    # Q8_0 is much closer to f16 than Q4_K_M: the measurement discriminates.
    k4 = result.variants["q4_k_m"].report.kld.mean_kld
    k8 = result.variants["q8_0"].report.kld.mean_kld
    assert k8 * 3 < k4
    base = inspect_gguf(result.out_dir / "tiny-qwen2-f16.gguf")
    assert base.file_type == "F16" and base.quantized_fraction == 0.0


def test_rerun_with_nothing_changed_runs_no_tool(built) -> None:
    settings, entry, first = built
    again = build_gguf(entry, settings, quants=["q4_k_m", "q8_0"])
    assert again.tools_run == []  # speed of the re-run is measured in benchmarks/bench_gguf.py
    assert {q: v.digest for q, v in again.variants.items()} == {q: v.digest for q, v in first.variants.items()}


def test_a_deleted_output_is_rebuilt_not_trusted(built) -> None:
    settings, entry, first = built
    first.variants["q8_0"].path.unlink()
    again = build_gguf(entry, settings, quants=["q4_k_m", "q8_0"])
    # llama-quantize is deterministic: the rebuilt file has the same sha256, so its validation report (keyed
    # by the quantize step's inputs, and naming that sha256, which the check reads once to compare) still
    # stands and is not recomputed.
    assert again.tools_run == ["llama-quantize tiny-qwen2-q8_0.gguf"]
    assert again.variants["q8_0"].digest == first.variants["q8_0"].digest
    assert again.variants["q8_0"].path.exists() and again.variants["q8_0"].passed


def _damage(src: Path, dst: Path) -> None:
    """A quant whose attention output and FFN-down blocks are zeroed (scales included), as a broken tool would."""
    from gguf import GGUFReader

    shutil.copy(src, dst)
    reader = GGUFReader(dst, "r+")
    hit = 0
    for t in reader.tensors:
        if t.name.endswith(("attn_output.weight", "ffn_down.weight")):
            t.data[...] = 0
            hit += 1
    reader.data.flush()
    assert hit >= 4


def test_a_broken_quant_fails_its_gate(built, tmp_path: Path) -> None:
    settings, _, result = built
    broken = tmp_path / "broken-q4_k_m.gguf"
    _damage(result.variants["q4_k_m"].path, broken)
    proc = subprocess.run(
        [*MODELMINT, "validate", str(broken), "--reference", str(result.out_dir / "tiny-qwen2-f16.gguf"),
         "--profile", "tiny", "--no-smoke"],
        capture_output=True, text=True, env=_cli_env(settings.work_dir),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failed its quality gate" in proc.stderr and "mean KL" in proc.stderr
    # the advice fits the failure: a miss by orders of magnitude is a broken file, not a type a few bits short
    assert "broken" in proc.stderr and "Try a higher-bit type" not in proc.stderr
    report = json.loads(broken.with_suffix(".report.json").read_text())
    judged = report["validation"]
    assert not judged["passed"] and judged["figures"]["mean_kl"] > judged["gate"]["max_mean_kl"]


def _wrong_scales(src: Path, dst: Path) -> None:
    """A q8_0 whose every block scale (the fp16 before each block's 32 int8) is negated, as a tool that wrote the
    scales with the wrong sign would: every weight keeps its magnitude, and points the other way."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader

    shutil.copy(src, dst)
    reader = GGUFReader(dst, "r+")
    hit = 0
    for t in reader.tensors:
        if t.tensor_type == GGMLQuantizationType.Q8_0 and t.name.startswith("blk."):
            blocks = t.data.reshape(-1, 34)  # 2 bytes of fp16 scale, 32 int8 quants
            scales = blocks[:, :2].copy().view(np.float16)
            blocks[:, :2] = (-scales).view(np.uint8).reshape(-1, 2)
            hit += 1
    reader.data.flush()
    assert hit >= 4


def test_a_quant_with_wrong_scales_fails_its_gate(built, tmp_path: Path) -> None:
    settings, _, result = built
    broken = tmp_path / "wrong-scales-q8_0.gguf"
    _wrong_scales(result.variants["q8_0"].path, broken)
    proc = subprocess.run(
        [*MODELMINT, "validate", str(broken), "--reference", str(result.out_dir / "tiny-qwen2-f16.gguf"),
         "--profile", "tiny", "--no-smoke"],
        capture_output=True, text=True, env=_cli_env(settings.work_dir),
    )
    assert proc.returncode == 1 and "failed its quality gate" in proc.stderr, proc.stdout + proc.stderr
    judged = json.loads(broken.with_suffix(".report.json").read_text())["validation"]
    assert not judged["passed"] and judged["figures"]["mean_kl"] > judged["gate"]["max_mean_kl"]


def test_the_intact_quant_passes_the_same_cli_gate(built) -> None:
    settings, _, result = built
    proc = subprocess.run(
        [*MODELMINT, "validate", str(result.variants["q4_k_m"].path),
         "--reference", str(result.out_dir / "tiny-qwen2-f16.gguf"), "--profile", "tiny", "--no-smoke",
         "--report", str(settings.work_dir / "cli-report.json")],
        capture_output=True, text=True, env=_cli_env(settings.work_dir),
    )
    assert proc.returncode == 0, proc.stderr
    assert "gate passed" in proc.stdout


def test_inspect_cli_reads_the_header(built) -> None:
    _, _, result = built
    proc = subprocess.run([*MODELMINT, "inspect", str(result.variants["q8_0"].path), "--json"],
                          capture_output=True, text=True, check=True)
    info = json.loads(proc.stdout)
    assert info["file_type"] == "Q8_0" and info["has_chat_template"] and info["eos_token_id"] == 151645


def _local_catalog(tmp_path: Path, model_dir: Path, **gguf: object) -> Path:
    import yaml

    cat = {"models": [{
        "name": "local-tiny", "source": {"path": str(model_dir)}, "license": "apache-2.0", "gate_profile": "tiny",
        "variants": {"gguf": {"outtype": "f16", "quants": ["q4_k_m"], **gguf}},
    }]}
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(cat))
    return path


def test_imatrix_and_split(built, tmp_path: Path) -> None:
    _, _, result = built
    catalog = _local_catalog(tmp_path, Path(result.source["path"]), imatrix=True, split_max_size="20M")
    settings = _settings(tmp_path / "work", catalog)
    out = build_gguf(load_catalog(catalog).get("local-tiny"), settings)
    v = out.variants["q4_k_m"]
    assert v.passed, v.failures
    info = inspect_gguf(v.path)
    assert info.metadata.get("quantize.imatrix.file"), info.metadata
    assert info.metadata.get("quantize.imatrix.chunks_count", 0) > 0
    assert len(v.shards) >= 2
    first = inspect_gguf(v.shards[0])
    assert first.split_count == len(v.shards)
    assert sum(inspect_gguf(s).tensor_count for s in v.shards) == info.tensor_count


def test_unsupported_architecture_is_named(built, tmp_path: Path) -> None:
    _, _, result = built
    model = tmp_path / "odd-model"
    shutil.copytree(result.source["path"], model)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["ModelmintUnknownForCausalLM"]
    config["model_type"] = "modelmint-unknown"
    (model / "config.json").write_text(json.dumps(config))
    catalog = _local_catalog(tmp_path, model)
    work = tmp_path / "work"
    with pytest.raises(UnsupportedModel) as exc:
        build_gguf(load_catalog(catalog).get("local-tiny"), _settings(work, catalog))
    assert "ModelmintUnknownForCausalLM" in str(exc.value) and "--print-supported-models" in str(exc.value)
    leftovers = [p.name for p in work.rglob("*") if p.is_file()]
    assert not [n for n in leftovers if n.endswith(".gguf")], leftovers


@pytest.fixture
def small_work(small_disk) -> Path:
    return small_disk("24m")


def test_disk_full_during_conversion(built, small_work: Path) -> None:
    _, entry, _ = built
    with pytest.raises(DiskFullError) as exc:
        build_gguf(entry, _settings(small_work), quants=["q8_0"])
    assert "MODELMINT_WORK_DIR" in str(exc.value)
    names = [p.name for p in small_work.rglob("*") if p.is_file()]
    assert not [n for n in names if n.endswith((".gguf", ".receipt.json"))], names
    assert not [n for n in names if ".partial-" in n], names


def test_sigkill_mid_conversion_then_rerun_finishes(built, tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = subprocess.Popen([*MODELMINT, "convert", "tiny-qwen2", "--variants", "q8_0"], env=_cli_env(work),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    partial = None
    while time.monotonic() < deadline and partial is None:
        partial = next((p for p in work.rglob("*.partial-*") if p.stat().st_size > 0), None)
        time.sleep(0.05)
    assert partial is not None, "conversion never started writing"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not list(work.rglob("*-f16.gguf")) and not list(work.rglob("*.receipt.json"))
    rerun = subprocess.run([*MODELMINT, "convert", "tiny-qwen2", "--variants", "q8_0"], env=_cli_env(work),
                           capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert not list(work.rglob("*.partial-*"))
    assert inspect_gguf(next(work.rglob("tiny-qwen2-q8_0.gguf"))).file_type == "Q8_0"


def test_unknown_name_cli_error_names_the_fix(tmp_path: Path) -> None:
    proc = subprocess.run([*MODELMINT, "convert", "qwen3"], capture_output=True, text=True, env=_cli_env(tmp_path))
    assert proc.returncode == 1
    assert "no catalog entry named 'qwen3'" in proc.stderr and "modelmint catalog list" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_cli_imports_no_heavy_toolchain() -> None:
    code = "import sys, pipelines.cli; print(sorted(m for m in ('torch', 'transformers', 'prefect') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
