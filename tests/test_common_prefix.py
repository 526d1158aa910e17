"""Variants that passed their gate early are compared with the others on the chunks they share: a GGUF's figures
keep llama-perplexity's running figures after each chunk, and `recommend` and the registry site rank every variant
on the first chunks all of them were scored on, each figure shown with the tokens it was scored on.

The figures are SmolLM2's real ones (tests/data/smollm2_kld_*.txt: what llama-perplexity printed for its q4_k_m,
q6_k and q8_0 against its f16 on eval.txt, 16 x 128 tokens), read by the validation code; the registry is
tests/site_registry.py's real registrations, their GGUF figures replaced by these as test_site.early_passes does."""

from __future__ import annotations

from pathlib import Path

import pytest
from site_registry import SiteRegistry

from pipelines.advice.recommend import Basis, Choice, Request, advise, rank_comparable
from pipelines.core.gates import gguf_gate
from pipelines.core.report import Figures, GGUFReport, Validation, parse_report
from pipelines.site.build import collect
from pipelines.site.render import ModelPage, model_page
from pipelines.store.manifest import Manifest, list_manifests

DATA = Path(__file__).parent / "data"
SMOLLM2 = 134_515_008
EVAL = {"text": "eval.txt", "sha256": "e" * 64, "ctx": 128, "chunks": 16}


def measured(q: str) -> Figures:
    """`q`'s figures as validation records them: q6_k passes after 4 chunks, q8_0 after 8, q4_k_m is read to 16."""
    from pipelines.gguf.validate import early_pass, parse_kld_output

    text = (DATA / f"smollm2_kld_{q}.txt").read_text()
    stats = early_pass(text, 128, gguf_gate(q, "reference", SMOLLM2), 16) or parse_kld_output(text, 128)
    return stats.with_running(text).figures()


def test_validation_keeps_the_running_figures_of_every_chunk_it_scored() -> None:
    q6, q8, q4 = measured("q6_k"), measured("q8_0"), measured("q4_k_m")
    assert [r.chunks for r in q6.running or ()] == [1, 2, 3, 4]
    assert [r.chunks for r in q8.running or ()] == list(range(1, 9))
    assert [r.chunks for r in q4.running or ()] == list(range(1, 17))
    # the figures q8_0 and q4_k_m had after 4 chunks, on the tokens q6_k was scored on (rows of 63 positions)
    at4 = {q: f.on_first(4) for q, f in (("q6_k", q6), ("q8_0", q8), ("q4_k_m", q4))}
    assert {q: (f.mean_kl, f.same_top_pct, f.tokens) for q, f in at4.items() if f} == {
        "q6_k": (0.01066, 94.841, 252), "q8_0": (0.00427, 92.857, 252), "q4_k_m": (0.06384, 83.73, 252)}
    assert q6.on_first(4) == q6.model_copy(update={"running": None, "kl_p99": None})
    assert q6.on_first(8) is None  # never scored there
    # a report holding them reads back as the same bytes; the kld block and the model card keep their keys
    v = Validation.judge(format="gguf", reference="f16", evaluation=EVAL, figures=q8,
                         gate=gguf_gate("q8_0", "reference", SMOLLM2))
    report = GGUFReport(variant="q8_0", validation=v)
    again = parse_report(__import__("json").loads(report.to_json()))
    assert again.to_json() == report.to_json() and again.judged.figures == q8
    assert "running" not in Figures.of(mean_kl=0.1, same_top_pct=90.0, ppl_reference=1.0, ppl=1.0).model_dump_json()


def _choice(q: str, f: Figures, mib: float) -> Choice:
    tokens = f.tokens or 0
    return Choice(f"smollm2:{q}", q, "gguf", int(mib * (1 << 20)), f,
                  on=Basis(tokens // 63, 16, tokens, "e" * 64, 128))


def test_variants_are_ranked_on_the_first_chunks_they_all_were_scored_on() -> None:
    """On their own figures q6_k (4 chunks) reads a higher same top than q8_0 (8 chunks: 94.84 % against 94.05 %)
    and today's ranking put q4_k_m, alone over all 16 chunks, first; on the first 4 chunks, which all three were
    scored on, q8_0 is best on every figure (same top 92.86 %), then q6_k, then q4_k_m."""
    q6 = _choice("q6_k", measured("q6_k"), 130)
    q8 = _choice("q8_0", measured("q8_0"), 140)
    q4 = _choice("q4_k_m", measured("q4_k_m"), 100)
    ranked = rank_comparable([q4, q6, q8])
    assert [c.tag for c in ranked] == ["q8_0", "q6_k", "q4_k_m"]
    assert {c.tag: c.scored.text() for c in ranked} == dict.fromkeys(["q8_0", "q6_k", "q4_k_m"],
                                                                       "4/16 chunks, 252 tokens")
    best = ranked[0]
    assert best.figures is not None and (best.figures.mean_kl, best.figures.same_top_pct) == (0.00427, 92.857)
    assert best.measured is not None and best.measured[0].same_top_pct == 94.048  # its own, kept beside
    said = best.figures_text()
    assert "same top 92.9 %" in said and "on 4/16 chunks, 252 tokens" in said
    assert "over its own 8/16 chunks, 504 tokens: mean KL 0.00423, same top 94.0 %" in said
    # without running figures (a manifest registered before they were kept) q6_k cannot be put on a prefix: as before
    old = _choice("q4_k_m", measured("q4_k_m").model_copy(update={"running": None}), 100)
    assert [c.tag for c in rank_comparable([old, q6, q8])] == ["q4_k_m", "q8_0", "q6_k"]


def _scored_early(m: Manifest) -> Manifest:
    if m.format != "gguf":
        return m
    v = m.validation.model_copy(update={"figures": measured(m.tag)})
    return m.model_copy(update={"validation": v})


def test_recommend_and_the_site_rank_on_the_shared_chunks(site_registry: SiteRegistry) -> None:
    s = site_registry.settings
    manifests = [_scored_early(m) for m in list_manifests(s).manifests if m.name == "smollm2"]
    advice = advise(s, "smollm2", manifests, Request("1xL4-24G", context=4096))
    # the GGUFs on their first 4 chunks; fp8 and awq (the torch evaluation's figures, other positions) as measured
    assert [c.tag for c in advice.ranked] == ["q8_0", "q6_k", "fp8", "awq", "q4_k_m"]
    assert "smollm2:q8_0: mean KL 0.00427 ± 0.00019, same top 92.9 % ± 1.6, ΔPPL -0.01 % on 4/16 chunks, 252 " \
        "tokens" in advice.reasons[0]
    assert "smollm2:q6_k is measurably worse (mean KL 0.01066 ± 0.00068 against 0.00427 ± 0.00019)" \
        in advice.reasons[0]
    assert "not comparable" not in advice.reasons[0].split("smollm2:fp8")[0]
    as_json = {c["tag"]: c for c in advice.to_dict()["ranked"]}
    assert as_json["q8_0"]["scored_on"]["tokens"] == 252 and as_json["q8_0"]["measured"]["scored_on"]["chunks"] == 8

    page: ModelPage = next(p for p in collect(s) if p.name == "smollm2")
    page.variants = [_scored_early(m) for m in page.variants]
    text = model_page(page)

    def cells(ref: str) -> str:
        start = text.index(f'<tr data-ref="{ref}"')
        return text[start : text.index("</tr>", start)]

    q8 = cells("smollm2:q8_0")
    assert "92.86 %" in q8 and "(4/16 chunks, 252 tokens)" in q8  # compared on q6_k's chunks
    assert "own: " in q8 and "94.05 %" in q8 and "(8/16 chunks, 504 tokens)" in q8  # its own beside
    assert "early, on 8 of 16 chunks" in q8 and "not comparable" not in q8
    assert "94.84 %" in cells("smollm2:q6_k") and "own: " not in cells("smollm2:q6_k")
    assert 'class="point partial"' not in text  # none hollow: every GGUF is on the shared chunks
    assert 'data-ref="smollm2:q8_0" data-kl="0.00427"' in text
    assert "Best measured variant that fits, on 4/16 chunks, 252 tokens, the first chunks the variants share: " \
        "<strong>smollm2:q8_0</strong>" in text
    assert "smollm2:q6_k is measurably worse" in text


@pytest.mark.parametrize("q", ["q6_k", "q8_0"])
def test_a_manifest_with_running_figures_reads_back_as_the_same_bytes(site_registry: SiteRegistry, q: str) -> None:
    m = next(m for m in list_manifests(site_registry.settings).manifests if m.ref == f"smollm2:{q}")
    text = _scored_early(m).to_json()
    again = Manifest.model_validate_json(text)
    assert again.to_json() == text and again.validation.figures == measured(q)


def test_the_recommend_table_says_what_each_figure_was_scored_on(site_registry: SiteRegistry) -> None:
    import subprocess
    import sys

    env = {**site_registry.repo.env(), "COLUMNS": "200"}
    proc = subprocess.run([str(Path(sys.executable).parent / "modelmint"), "recommend", "--gpus", "1xL4-24G",
                           "smollm2"], env=env, capture_output=True, text=True, cwd=site_registry.repo.root,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if "smollm2:q6_k" in line and "│" in line)
    assert "│ 16/16 chunks, 1,008 tokens │" in row
    assert "ΔPPL +0.77 % on 16/16 chunks, 1,008 tokens" in proc.stdout
