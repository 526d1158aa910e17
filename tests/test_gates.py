"""The gates: one scale across types and formats, banded by model size, honest about noise, and still able to fail."""

from __future__ import annotations

import itertools

import pytest

from pipelines.core.gates import (
    NOISE_SIGMAS,
    SIZE_BANDS,
    Gate,
    compressed_gate,
    gguf_gate,
    ladder_conflicts,
    size_band,
)
from pipelines.core.report import Figures

SMOLLM2 = 134_515_008


def measured(kl: float, kl_se: float, top: float, top_se: float, ratio: float, ln_ratio_se: float) -> Figures:
    return Figures.of(mean_kl=kl, same_top_pct=top, ppl_reference=30.237022, ppl=30.237022 * ratio,
                      mean_kl_stderr=kl_se, same_top_stderr=top_se, ln_ppl_ratio_stderr=ln_ratio_se)


# SmolLM2-135M-Instruct against its f16, llama-perplexity on eval.txt, 16 x 128 tokens (docs/quality.md)
SMOLLM2_GGUF = {
    "q4_k_m": measured(0.057061, 0.001445, 84.325, 1.146, 1.086450, 0.011886),
    "q6_k": measured(0.010364, 0.000292, 92.063, 0.852, 1.009630, 0.004827),
    "q8_0": measured(0.004191, 0.000110, 94.643, 0.710, 1.007694, 0.003068),
}
SMOLLM2_IMATRIX_Q4_K_M = measured(0.035453, 0.001055, 87.599, 1.039, 1.043746, 0.009429)
# SmolLM2's q8_0 with its attention-output and FFN-down blocks zeroed (tests/test_smollm2.py does the same to the
# build's own q8_0), measured by llama-perplexity against the f16 as above: ln(PPL ratio) 110.29 ± 1.30
BROKEN = Figures.of(mean_kl=110.875182, same_top_pct=0.992, ppl_reference=30.237022, ppl=30.237022 * 7.9e47,
                    mean_kl_stderr=1.104438, same_top_stderr=0.312, ln_ppl_ratio_stderr=1.302203)


def test_smollm2_verdicts_are_consistent_across_types() -> None:
    verdicts = {q: (f, not gguf_gate(q, "reference", SMOLLM2).check(f)) for q, f in SMOLLM2_GGUF.items()}
    assert {q: ok for q, (_f, ok) in verdicts.items()} == {"q4_k_m": True, "q6_k": True, "q8_0": True}
    assert ladder_conflicts(verdicts) == []
    assert gguf_gate("q4_k_m", "reference", SMOLLM2).check(SMOLLM2_IMATRIX_Q4_K_M) == []


def test_the_ladder_check_can_fail_it_finds_the_old_contradiction() -> None:
    # the gate of an 8B model, applied to SmolLM2, refuses q8_0 while q6_k, worse on every figure, passes
    big = 8_000_000_000
    verdicts = {q: (f, not gguf_gate(q, "reference", big).check(f)) for q, f in SMOLLM2_GGUF.items()}
    assert not verdicts["q8_0"][1] and verdicts["q6_k"][1]
    [conflict] = ladder_conflicts(verdicts)
    assert conflict.startswith("q8_0 was refused although q6_k, a type with fewer bits, passed")


@pytest.mark.parametrize("params", [SMOLLM2, 2_000_000_000, 8_000_000_000])
def test_bars_fall_with_the_published_kld_of_the_type_in_every_band(params: int) -> None:
    ladder = ["q2_k", "q3_k_m", "q4_0", "q4_k_s", "q4_k_m", "q5_k_m", "q6_k", "q8_0"]
    gates = [gguf_gate(q, "reference", params) for q in ladder]
    for lo, hi in itertools.pairwise(gates):
        assert hi.max_mean_kl < lo.max_mean_kl
        assert hi.min_same_top_pct > lo.min_same_top_pct
        assert hi.max_ppl_ratio < lo.max_ppl_ratio


def test_smaller_models_get_looser_bars_each_band_naming_its_source() -> None:
    q8 = [gguf_gate("q8_0", "reference", p) for p in (8_000_000_000, 2_000_000_000, SMOLLM2)]
    assert q8[0].max_mean_kl < q8[1].max_mean_kl < q8[2].max_mean_kl
    assert q8[0].min_same_top_pct > q8[1].min_same_top_pct > q8[2].min_same_top_pct
    assert [size_band(p).name for p in (8e9, 2e9, SMOLLM2, None)] == ["large", "medium", "small", "small"]
    for band, gate in zip(SIZE_BANDS, q8, strict=True):
        assert f"[{band.name} model band: " in gate.basis and "0.001355" in gate.basis
    # the large band keeps llama.cpp's Llama-3-8B q8_0 (KLD 0.001355, same top 97.674 %) at x2 / -4 points
    assert q8[0].max_mean_kl == 0.00271 and q8[0].min_same_top_pct == 93.67


def test_compressed_schemes_face_the_bar_of_the_gguf_type_with_their_bits() -> None:
    for params in (SMOLLM2, 8_000_000_000):
        fp8, awq = compressed_gate("fp8", "reference", params), compressed_gate("awq", "reference", params)
        q8, q4 = gguf_gate("q8_0", "reference", params), gguf_gate("q4_k_m", "reference", params)
        assert (fp8.max_mean_kl, fp8.min_same_top_pct) == (q8.max_mean_kl, q8.min_same_top_pct)
        assert (awq.max_mean_kl, awq.min_same_top_pct) == (q4.max_mean_kl, q4.min_same_top_pct)
    assert compressed_gate("fp8", "reference", 70_000_000_000).max_ppl_ratio == 1.02
    assert "99 %" in compressed_gate("fp8", "reference", None).basis


def test_a_figure_fails_only_when_past_its_limit_by_more_than_its_noise() -> None:
    gate = gguf_gate("q8_0", "reference", SMOLLM2)
    assert gate.noise_sigmas == NOISE_SIGMAS == 2.0
    top = gate.min_same_top_pct
    within = measured(0.004, 0.0001, top - 1.0, 0.71, 1.0, 0.003)  # 1.4 standard errors short: noise
    beyond = measured(0.004, 0.0001, top - 1.6, 0.71, 1.0, 0.003)  # 2.3 standard errors short: evidence
    assert gate.check(within) == []
    [miss] = gate.check(beyond)
    assert "± 0.71 % <" in miss and "by more than 2 standard errors" in miss
    # a gate recorded before the noise was measured compares the figures themselves, as it did then
    old = Gate.from_dict({k: v for k, v in gate.to_dict().items() if k != "noise_sigmas"})
    assert old.noise_sigmas == 0.0 and len(old.check(within)) == 1
    # figures without an uncertainty (older reports) are compared as they are
    plain = Figures.of(mean_kl=0.004, same_top_pct=top - 1.0, ppl_reference=30.0, ppl=30.0)
    assert len(gate.check(plain)) == 1


@pytest.mark.parametrize("params", [SMOLLM2, 2_000_000_000, 8_000_000_000])
@pytest.mark.parametrize("q", ["q4_k_m", "q6_k", "q8_0"])
def test_a_broken_quant_fails_every_figure_by_orders_of_magnitude(q: str, params: int) -> None:
    misses = gguf_gate(q, "reference", params).misses(BROKEN)
    assert [m.figure for m in misses] == ["mean KL", "same top token", "ΔPPL"]
    assert min(m.factor for m in misses) > 4 and max(m.factor for m in misses) > 400
