"""What `llama-perplexity --kl-divergence` prints, as validation reads it: outputs of the pinned llama.cpp
(tests/data/llama_perplexity_kld_*.txt: stdout, then stderr, as the runner hands them over; smollm2_kld_*.txt: the
standard output of SmolLM2's q4_k_m, q6_k and q8_0 against its f16 on eval.txt, 16 x 128 tokens, one thread)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipelines.core.errors import ArtifactError, ToolStoppedShort
from pipelines.core.gates import EARLY_SIGMAS, Gate, gguf_gate
from pipelines.gguf.validate import early_pass, kld_stopped_short, parse_kld_output, parse_kld_rows

DATA = Path(__file__).parent / "data"


def test_a_complete_output_is_parsed() -> None:
    text = (DATA / "llama_perplexity_kld_full.txt").read_text()
    assert kld_stopped_short(text) is None
    stats = parse_kld_output(text, 128)
    assert stats.chunks == 16 and stats.mean_kld == pytest.approx(0.001271)


def test_an_output_that_stops_before_its_last_chunk_is_a_transient_error() -> None:
    # one flow run under load: 15 of 16 rows, no statistics, no error line, exit 0 (was "printed no mean KLD",
    # a verdict-like error the flow never retried)
    text = (DATA / "llama_perplexity_kld_cut.txt").read_text()
    assert kld_stopped_short(text) == (15, 16)
    assert issubclass(ToolStoppedShort, ArtifactError) and ToolStoppedShort("x").transient
    with pytest.raises(ArtifactError, match="printed no mean KLD"):
        parse_kld_output(text, 128)


SMOLLM2 = 134_515_008


def _smollm2(q: str) -> str:
    return (DATA / f"smollm2_kld_{q}.txt").read_text()


@pytest.mark.parametrize("q", ["q4_k_m", "q6_k", "q8_0"])
def test_every_row_holds_the_running_figures_and_the_last_is_the_summary(q: str) -> None:
    text = _smollm2(q)
    rows = parse_kld_rows(text, 128)
    assert [r.chunks for r in rows] == list(range(1, 17))
    last, summary = rows[-1], parse_kld_output(text, 128)
    # the row prints 5 decimals of KL and 3 of same top; PPL(base) is derived from PPL(Q) and the ratio
    assert last.mean_kld == pytest.approx(summary.mean_kld, abs=1e-5)
    assert last.same_top_pct == pytest.approx(summary.same_top_pct, abs=1e-3)
    assert last.ppl_base == pytest.approx(summary.ppl_base, rel=1e-4)
    assert last.figures().ppl_ratio == pytest.approx(summary.figures().ppl_ratio, abs=2e-5)
    assert last.mean_kld_stderr == pytest.approx(summary.mean_kld_stderr, abs=1e-5)
    assert last.ln_ppl_ratio_stderr == pytest.approx(summary.ln_ppl_ratio_stderr, abs=1e-5)


def test_clear_variants_pass_at_a_look_and_a_close_one_is_read_to_the_end() -> None:
    looked = {q: early_pass(_smollm2(q), 128, gguf_gate(q, "reference", SMOLLM2), 16)
              for q in ("q4_k_m", "q6_k", "q8_0")}
    # q6_k: after 4 chunks its ln PPL ratio is 3.9 standard errors inside; q8_0: 1.7 after 4, 3.2 after 8;
    # q4_k_m's same top is 2.1 standard errors from its floor even after 16
    assert looked["q4_k_m"] is None
    q6, q8 = looked["q6_k"], looked["q8_0"]
    assert q6 is not None and (q6.chunks, q6.of_chunks, q6.mean_kld, q6.same_top_pct) == (4, 16, 0.01066, 94.841)
    assert q8 is not None and (q8.chunks, q8.of_chunks, q8.mean_kld, q8.same_top_pct) == (8, 16, 0.00423, 94.048)
    for q, stats in (("q6_k", q6), ("q8_0", q8)):
        gate = gguf_gate(q, "reference", SMOLLM2)
        assert gate.inside_by(stats.figures(), EARLY_SIGMAS) and gate.check(stats.figures()) == []


def test_no_look_passes_a_variant_short_of_three_standard_errors() -> None:
    # q6_k's gate tightened until its figures after 4, 8 and 12 chunks are each under 3 standard errors inside
    rows = parse_kld_rows(_smollm2("q6_k"), 128)
    ln_inside = min(math.log(r.figures().ppl_ratio) + 2.9 * r.ln_ppl_ratio_stderr for r in (rows[3], rows[7], rows[11]))
    tight = Gate(0.0436, 86.0, math.exp(ln_inside), "test")
    assert early_pass(_smollm2("q6_k"), 128, tight, 16) is None
    # a row cut mid-line is no row; a reference of 4 chunks leaves no look before its last
    cut = _smollm2("q6_k").split("\n   4 ")[0] + "\n   4      27.7531 ±    4.8092       0.00699 ±"
    assert len(parse_kld_rows(cut, 128)) == 3
    assert early_pass(cut, 128, gguf_gate("q6_k", "reference", SMOLLM2), 16) is None
    assert early_pass(_smollm2("q6_k"), 128, gguf_gate("q6_k", "reference", SMOLLM2), 4) is None
    # no standard error, no early pass
    q6 = rows[3].figures()
    assert not gguf_gate("q6_k", "reference", SMOLLM2).inside_by(q6.model_copy(update={"same_top_stderr": None}), 3)
