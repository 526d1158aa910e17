"""Shape checks before any tool starts, on a generated model whose hidden size is 576 (SmolLM2-135M's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from wide_model import write_wide_model

from pipelines.compressed.build import preflight_group_size, recipe_for, source_tensors
from pipelines.core.errors import ShapeRefused
from pipelines.core.preflight import block_size, gguf_fallback, indivisible, source_weights

PROJECTIONS_576 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")  # every one but down_proj


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wide_model(tmp_path_factory.mktemp("wide") / "m", vocab=512)


def test_awq_falls_back_to_the_largest_group_size_that_divides_every_layer(wide: Path) -> None:
    tensors = source_tensors(wide)
    choice = preflight_group_size("awq", recipe_for("awq"), tensors, [128, 64, 32])
    assert choice is not None and choice.group_size == 64 and choice.fell_back
    rejected = choice.rejected[128]
    # every projection whose input is the 576-wide hidden state, in both layers; down_proj (1536 = 12 x 128) is fine
    assert len(rejected) == 2 * len(PROJECTIONS_576)
    assert all("(576 columns)" in r for r in rejected) and not any("down_proj" in r for r in rejected)
    assert choice.to_dict()["group_size"] == 64 and choice.to_dict()["fell_back"] is True


def test_a_recipe_without_fallback_is_refused_with_the_layers_and_the_sizes_that_work(wide: Path) -> None:
    with pytest.raises(ShapeRefused) as exc:
        preflight_group_size("awq", recipe_for("awq"), source_tensors(wide), [128])
    err = exc.value
    assert err.variant == "awq" and len(err.layers) == 12
    assert "model.layers.0.self_attn.q_proj (576 columns)" in err.message
    assert err.works == ["64", "32", "16"]  # 576 = 9 x 64: neither 256 nor 128 divides it
    assert "group_sizes: [64]" in (err.hint or "") and "registry/catalog.yaml" in (err.hint or "")


def test_gptq_is_checked_like_awq_and_fp8_has_no_group_constraint(wide: Path) -> None:
    tensors = source_tensors(wide)
    gptq = preflight_group_size("gptq", recipe_for("gptq"), tensors, [128, 64])
    assert gptq is not None and gptq.group_size == 64
    assert preflight_group_size("fp8", recipe_for("fp8"), tensors, []) is None
    assert preflight_group_size("w8a8", recipe_for("w8a8"), tensors, []) is None


def test_ignored_layers_are_not_checked(wide: Path) -> None:
    from pipelines.source.catalog import AWQVariant

    spec = AWQVariant(ignore=["lm_head", "re:.*self_attn\\..*", "re:.*mlp\\.(gate|up)_proj$"], group_sizes=[128])
    choice = preflight_group_size("awq", recipe_for("awq", spec), source_tensors(wide), spec.group_sizes)
    assert choice is not None and choice.group_size == 128 and not choice.fell_back


def test_the_group_size_rule_is_llmcompressors() -> None:
    from pipelines.core.preflight import Weight

    layers = [Weight("a.weight", 576, 1), Weight("b.weight", 96, 1), Weight("c.weight", 1536, 1)]
    # columns smaller than the group are not "indivisible" (validate_group_size_divisibility skips them)
    assert [w.name for w in indivisible(layers, 128)] == ["a.weight"]
    assert [w.name for w in indivisible(layers, 64)] == ["b.weight"]


def test_a_chosen_group_size_reaches_the_recipe_and_its_structure_check(wide: Path) -> None:
    recipe = recipe_for("awq").with_group_size(64)
    assert recipe.group_size == 64 and recipe_for("awq").group_size == 128
    assert recipe.modifiers[1].group_size == 64  # what llmc_quantize.py turns into the modifier's config group
    assert recipe_for("fp8").group_size is None


def test_k_quant_fallback_share_is_predicted_from_the_headers(wide: Path) -> None:
    weights = source_weights(source_tensors(wide))
    total = sum(w.params for w in weights)
    down = sum(w.params for w in weights if "down_proj" in w.name)
    fb = gguf_fallback("q4_k_m", weights)
    assert fb.block == 256 and block_size("q8_0") == 32
    # every 576-wide row falls back (576 = 2.25 x 256): all but down_proj (1536 = 6 x 256), embeddings included
    assert fb.fallback_params == total - down and fb.share == pytest.approx((total - down) / total)
    assert {t["to"] for t in fb.fallback} == {"Q5_0"} and fb.f16_share == 0
    assert "model.embed_tokens.weight" in {t["name"] for t in fb.fallback}
    assert {t["to"] for t in gguf_fallback("q6_k", weights).fallback} == {"Q8_0"}
    assert {t["to"] for t in gguf_fallback("q5_k_m", weights).fallback} == {"Q5_1"}
    assert gguf_fallback("q8_0", weights).fallback == []  # 576 = 18 x 32
    assert fb.to_dict()["share"] == round(fb.share, 6)


def test_rows_not_even_a_multiple_of_32_are_refused(tmp_path: Path) -> None:
    odd = write_wide_model(tmp_path / "odd", hidden=360, intermediate=960, heads=9, kv_heads=3, vocab=512)
    weights = source_weights(source_tensors(odd))
    for q in ("q8_0", "q4_k_m"):
        with pytest.raises(ShapeRefused) as exc:
            gguf_fallback(q, weights)
        assert "not multiples of 32" in exc.value.message and "model.layers.0.self_attn.q_proj.weight" in exc.value.message
