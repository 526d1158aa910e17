"""Compressed-tensors variants (FP8_DYNAMIC, AWQ W4A16) with the real pinned llmcompressor on the tiny model."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.compressed.build import build_compressed
from pipelines.compressed.checkpoint import VERBATIM_FILES, check_structure
from pipelines.compressed.llmc import _raise_for_failure, evaluate, figures_of, quantize
from pipelines.compressed.recipes import RECIPE_FILE, Recipe, parse_schemes, recipe_for
from pipelines.core.errors import ArtifactError, ConfigError, ToolError, UnsupportedModel
from pipelines.core.gates import compressed_gate
from pipelines.core.report import Figures
from pipelines.core.runner import run
from pipelines.core.safetensorsheader import read_safetensors_header
from pipelines.core.settings import Settings, project_root
from pipelines.core.steps import load_dir_receipt, write_dir_receipt
from pipelines.core.toolchains import llmcompressor
from pipelines.publish.vllm import VllmServeConfig
from pipelines.source.catalog import COMPRESSED_VARIANTS, CalibrationSpec, Variants, load_catalog

CATALOG = project_root() / "registry" / "catalog.yaml"
SCHEMES = ["fp8", "awq"]


def _settings(work: Path, catalog: Path = CATALOG) -> Settings:
    base = Settings.from_env()
    return Settings(home=base.home, work_dir=work, catalog_path=catalog, threads=base.threads)


def compress_work_dir(factory: pytest.TempPathFactory) -> Path:
    """One work dir per session for every module that builds tiny-qwen2's compressed variants (receipts hit)."""
    work = factory.getbasetemp() / "compress-work"
    work.mkdir(exist_ok=True)
    return work


def zero_scales(checkpoint: Path) -> int:
    """Overwrite every `*.weight_scale` tensor with zeros in place: headers and structure stay valid."""
    count = 0
    for f in sorted(checkpoint.glob("*.safetensors")):
        header = read_safetensors_header(f)
        with open(f, "r+b") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            for name, info in header.items():
                if name.endswith(".weight_scale"):
                    begin, end = info["data_offsets"]
                    fh.seek(8 + n + begin)
                    fh.write(bytes(end - begin))
                    count += 1
    return count


# ---------------------------------------------------------------- recipes, catalog, gates (no tools)


@pytest.mark.parametrize("variant", sorted(COMPRESSED_VARIANTS))
def test_recipes_round_trip_through_yaml(variant: str) -> None:
    recipe = recipe_for(variant)
    text = recipe.to_yaml()
    assert Recipe.from_yaml(text) == recipe
    assert yaml.safe_load(text)["variant"] == variant
    assert recipe.ignore == ["lm_head"]
    assert recipe.evaluation_text == "eval.txt"


def test_awq_recipe_is_smoothing_then_asymmetric_w4a16() -> None:
    recipe = recipe_for("awq")
    assert [m.type for m in recipe.modifiers] == ["AWQModifier", "QuantizationModifier"]
    assert recipe.modifiers[1].scheme == "W4A16_ASYM" and recipe.modifiers[1].targets == ["Linear"]
    assert recipe.calibration is not None and recipe.calibration.bundled == "train.txt"
    fp8 = recipe_for("fp8")
    assert fp8.scheme == "FP8_DYNAMIC" and fp8.calibration is None  # data-free


def test_recipe_rejects_unknown_keys_and_modifiers() -> None:
    raw = yaml.safe_load(recipe_for("awq").to_yaml())
    with pytest.raises(ConfigError):
        Recipe.from_yaml(yaml.safe_dump({**raw, "group_size": 64}))
    raw["modifiers"][0] = {"type": "AWQModifer"}
    with pytest.raises(ConfigError):
        Recipe.from_yaml(yaml.safe_dump(raw))


def _catalog_with(tmp_path: Path, variants: dict) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"name": "m", "source": {"generated": "tiny-qwen2"}, "license": "apache-2.0", "variants": variants}
    ]}))
    return path


def test_a_misspelled_scheme_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_catalog(_catalog_with(tmp_path, {"awq": {"scheme": "W4A16_ASYMM"}}))
    assert "variants.awq.scheme" in exc.value.message and "'W4A16_ASYM'" in exc.value.message
    with pytest.raises(ConfigError) as exc:
        load_catalog(_catalog_with(tmp_path, {"awk": {}}))
    assert "unknown variant 'awk' (did you mean 'awq'?)" in exc.value.message
    with pytest.raises(ConfigError, match="did you mean 'fp8'"):
        parse_schemes("fp8,fp9")
    assert parse_schemes(" FP8, awq,fp8") == ["fp8", "awq"]
    entry = load_catalog(_catalog_with(tmp_path, {"fp8": {}, "awq": {"calibration": {"num_samples": 8}}})).get("m")
    assert list(entry.variants.compressed()) == ["fp8", "awq"]


def test_calibration_spec_is_checked_at_the_edge() -> None:
    with pytest.raises(ValueError):
        CalibrationSpec(num_samples=0)
    with pytest.raises(ValueError, match="40-hex"):
        CalibrationSpec.model_validate({"hub_dataset": {"repo": "org/data", "revision": "main"}})
    with pytest.raises(ValueError):
        CalibrationSpec.model_validate({"bundled": "eval.txt"})  # the held-out evaluation text
    assert Variants.model_validate({"gguf": None}).compressed() == {}


def test_gates_follow_published_figures_and_reject_nan() -> None:
    fp8_large = compressed_gate("fp8", "reference", 8_000_000_000)
    awq_large = compressed_gate("awq", "reference", 8_000_000_000)
    awq_small = compressed_gate("awq", "reference", 500_000_000)
    assert fp8_large.max_ppl_ratio <= 1.02 and "99 %" in fp8_large.basis
    assert awq_large.max_ppl_ratio < awq_small.max_ppl_ratio and "0.5B" in awq_small.basis
    tiny = compressed_gate("awq", "tiny")
    assert tiny.check(Figures.of(mean_kl=3e-5, same_top_pct=99.6, ppl_reference=10.0, ppl=10.02)) == []
    nan = float("nan")
    assert len(tiny.check(Figures.of(mean_kl=nan, same_top_pct=nan, ppl_reference=10.0, ppl=nan))) == 3
    assert tiny.to_dict()["basis"].startswith("tiny")


def test_serve_config_round_trips_with_vllm_option_names(tmp_path: Path) -> None:
    cfg = VllmServeConfig(model="/m", served_model_name="m-fp8-dynamic", max_model_len=4096)
    text = cfg.to_yaml()
    assert "max-model-len: 4096" in text and "served-model-name: m-fp8-dynamic" in text
    assert VllmServeConfig.from_yaml(text) == cfg
    with pytest.raises(ConfigError):
        VllmServeConfig.from_yaml(text + "max-modle-len: 1\n")


def test_directory_receipts_miss_when_anything_changes(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "a.json").write_text("{}")
    receipt = write_dir_receipt(d, "k1")
    assert load_dir_receipt(d, "k1") == receipt
    assert load_dir_receipt(d, "k2") is None
    (d / "b.json").write_text("{}")
    assert load_dir_receipt(d, "k1") is None
    (d / "b.json").unlink()
    (d / "a.json").write_text('{"x": 1}')
    assert load_dir_receipt(d, "k1") is None


def test_out_of_memory_says_how_to_fix_it(tmp_path: Path) -> None:
    # A process killed by SIGKILL is what the kernel's OOM killer leaves behind.
    tool = run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], check=False)
    with pytest.raises(ToolError) as exc:
        _raise_for_failure(tool, tmp_path / "absent.json", recipe_for("awq"), tmp_path)
    assert "out of memory" in exc.value.hint and "num_samples" in exc.value.hint and "sequential" in exc.value.hint
    # ... and llmcompressor's own OOM, which the script reports as such
    (tmp_path / "r.json").write_text(json.dumps({"ok": False, "error": {"kind": "oom", "message": "CUDA OOM"}}))
    tool = run([sys.executable, "-c", "raise SystemExit(3)"], check=False)
    with pytest.raises(ToolError, match="CUDA OOM") as exc:
        _raise_for_failure(tool, tmp_path / "r.json", recipe_for("awq"), tmp_path)
    assert "bigger" in exc.value.hint or "more memory" in exc.value.hint


# ---------------------------------------------------------------- the real toolchain on tiny-qwen2


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory):
    settings = _settings(compress_work_dir(tmp_path_factory))
    entry = load_catalog(CATALOG).get("tiny-qwen2")
    result = build_compressed(entry, settings, schemes=SCHEMES)
    return settings, entry, result


@pytest.mark.slow
def test_fp8_and_awq_pass_their_gates(built) -> None:
    _, _, result = built
    assert list(result.variants) == SCHEMES
    assert result.passed == SCHEMES, {v: o.failures for v, o in result.variants.items()}
    for v, o in result.variants.items():
        m = o.report.metrics
        print(f"{v}: KL {m['mean_kl']:.3g}  top-1 {m['top1_agreement']:.4f}  ppl ratio {m['ppl_ratio']:.4f}  "
              f"(quantize {o.report.quantize['wall_s']} s, eval {o.report.evaluation['wall_s']} s)")
        assert m["nonfinite_positions"] == 0 and m["tokens"] >= 1000
        assert o.validation.gate.basis.startswith("tiny-model profile")
        assert json.loads(Path(o.path.with_name(o.path.name + ".report.json")).read_text())["validation"]["passed"]


@pytest.mark.slow
def test_outputs_are_compressed_tensors_checkpoints(built) -> None:
    _, _, result = built
    source = result.plan.snapshot.path
    fp8, awq = result.variants["fp8"].path, result.variants["awq"].path
    qc = json.loads((fp8 / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "float-quantized"
    assert qc["ignore"] == ["lm_head"] and qc["config_groups"]["group_0"]["input_activations"]["dynamic"] is True
    qc = json.loads((awq / "config.json").read_text())["quantization_config"]
    w = qc["config_groups"]["group_0"]["weights"]
    assert qc["format"] == "pack-quantized" and (w["num_bits"], w["group_size"], w["symmetric"]) == (4, 128, False)

    fp8_t = read_safetensors_header(fp8 / "model.safetensors")
    awq_t = read_safetensors_header(awq / "model.safetensors")
    assert fp8_t["model.layers.0.mlp.down_proj.weight"]["dtype"] == "F8_E4M3"
    assert awq_t["model.layers.0.mlp.down_proj.weight_packed"]["dtype"] == "I32"
    for header in (fp8_t, awq_t):
        assert not any(n.startswith("lm_head.") and "weight_" in n for n in header)  # lm_head stays unquantized
        assert header["model.embed_tokens.weight"]["dtype"] == "BF16"
    for o in result.variants.values():
        assert o.report.structure["quantized_linears"] == 28  # 4 layers x 7 projections
        for name in VERBATIM_FILES:
            if (source / name).is_file():
                assert (o.path / name).read_bytes() == (source / name).read_bytes(), name
        assert Recipe.from_yaml((o.path / RECIPE_FILE).read_text()) == result.plan.recipes[o.variant]
        assert (o.path / "recipe.yaml").is_file()  # llmcompressor's own expansion of it
        assert all((p.stat().st_mode & 0o777) == 0o644 for p in o.path.iterdir())
        cfg = VllmServeConfig.from_yaml(Path(o.serve_config).read_text())
        assert cfg.model == str(o.path)
    awq_run = result.variants["awq"].report.quantize
    assert awq_run["calibration"]["origin"] == "train.txt" and awq_run["awq_mappings"]["resolved"] >= 3
    assert awq_run["cpu_pin_memory_fix"].startswith(("applied", "not needed"))
    assert not list(result.out_dir.glob("*.partial-*"))


@pytest.mark.slow
def test_a_second_build_runs_nothing(built) -> None:
    settings, entry, first = built
    again = build_compressed(entry, settings, schemes=SCHEMES)
    assert again.tools_run == []
    assert {v: o.digest for v, o in again.variants.items()} == {v: o.digest for v, o in first.variants.items()}
    assert all(o.cached and o.passed for o in again.variants.values())


@pytest.mark.slow
def test_cli_prints_the_cached_build(built) -> None:
    settings, _, _ = built
    env = {**os.environ, "MODELMINT_WORK_DIR": str(settings.work_dir)}
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "compress", "tiny-qwen2", "--schemes", "fp8,awq",
                           "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert {v: s["passed"] for v, s in summary["variants"].items()} == {"fp8": True, "awq": True}
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "compress", "tiny-qwen2", "--schemes", "awk"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "did you mean 'awq'" in proc.stderr


@pytest.mark.slow
def test_zeroed_scales_fail_the_gate(built, tmp_path: Path) -> None:
    settings, _, result = built
    broken = {}
    for v, o in result.variants.items():
        broken[v] = shutil.copytree(o.path, tmp_path / f"{v}-zeroed")
        assert zero_scales(broken[v]) == 28
        check_structure(broken[v], result.plan.snapshot.path, result.plan.recipes[v])  # still well-formed
    measured = evaluate(result.plan.snapshot.path, broken, llmcompressor(settings), settings=settings, sample=False)
    for v in broken:
        metrics = measured["variants"][v]
        failures = result.plan.gate(v).check(figures_of(metrics))
        print(f"{v} with zeroed scales: KL {metrics['mean_kl']:.3g}  top-1 {metrics['top1_agreement']:.4f}  "
              f"ppl ratio {metrics['ppl_ratio']:.4f}  → {failures}")
        assert len(failures) == 3, failures
        good = result.variants[v].report.metrics
        assert metrics["mean_kl"] > 100 * good["mean_kl"]


@pytest.mark.slow
def test_structure_check_catches_a_bad_checkpoint(built, tmp_path: Path) -> None:
    _, _, result = built
    source, recipe = result.plan.snapshot.path, result.plan.recipes["fp8"]
    bad = shutil.copytree(result.variants["fp8"].path, tmp_path / "fp8")
    config = json.loads((bad / "config.json").read_text())
    qc = config.pop("quantization_config")
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match="no quantization_config"):
        check_structure(bad, source, recipe)
    (bad / "config.json").write_text(json.dumps({**config, "quantization_config": {**qc, "ignore": []}}))
    with pytest.raises(ArtifactError, match=r"ignore is \[\], the recipe says \['lm_head'\]"):
        check_structure(bad, source, recipe)
    with pytest.raises(ArtifactError, match="format is 'float-quantized'"):
        check_structure(bad, source, result.plan.recipes["awq"])
    (bad / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    (bad / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ArtifactError, match=r"tokenizer_config\.json is not the source's file"):
        check_structure(bad, source, recipe)


@pytest.mark.slow
def test_a_calibration_set_too_small_is_refused(built, tmp_path: Path) -> None:
    settings, _, result = built
    recipe = recipe_for("awq").model_copy(update={"calibration": CalibrationSpec(num_samples=512, max_seq_length=2048)})
    out = tmp_path / "awq"
    with pytest.raises(ConfigError, match="calibration set too small") as exc:
        quantize(result.plan.snapshot.path, out, recipe, llmcompressor(settings), settings=settings)
    assert "num_samples" in exc.value.hint
    assert not out.exists() and not list(tmp_path.glob("*.partial-*"))


@pytest.mark.slow
def test_an_architecture_without_awq_mappings_is_refused(built, tmp_path: Path) -> None:
    settings, _, _ = built
    src = tmp_path / "gpt2"
    src.mkdir()
    # GPT-2's blocks (ln_1, attn.c_attn, mlp.c_fc) match none of llmcompressor's AWQ mappings
    (src / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1,
        "n_positions": 128, "vocab_size": 256,
    }))
    with pytest.raises(UnsupportedModel, match="no AWQ mappings for GPT2LMHeadModel") as exc:
        quantize(src, tmp_path / "out", recipe_for("awq"), llmcompressor(settings), settings=settings)
    assert "fp8" in exc.value.hint


def test_parameter_band_uses_source_size() -> None:
    assert "[small model band: " in compressed_gate("awq", "reference", None).basis
    assert math.isclose(compressed_gate("fp8", "reference", 70_000_000_000).max_ppl_ratio, 1.02)
