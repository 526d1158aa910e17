"""`recommend`: the registered variants that fit the asked GPUs (the planner), ranked by their measured figures with
their standard errors; gate-failed builds shown and never chosen; an inventory nothing fits answered with what would."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from site_registry import SiteRegistry, report

from pipelines.advice.recommend import (
    Basis,
    Choice,
    Request,
    advise,
    rank,
    rank_comparable,
    recommend,
    versus,
)
from pipelines.core.errors import ConfigError, NotRegistered
from pipelines.core.report import Figures
from pipelines.store.manifest import list_manifests


def _choice(tag: str, kl: float, se: float, mib: float) -> Choice:
    f = Figures.of(mean_kl=kl, same_top_pct=90.0, ppl_reference=10.0, ppl=10.5, mean_kl_stderr=se)
    return Choice(f"m:{tag}", tag, "gguf", int(mib * (1 << 20)), f)


def test_a_variant_that_passed_early_is_never_ranked_against_the_whole_text_ones() -> None:
    """SmolLM2's figures as its early passes left them: q6_k scored on 4 of 16 chunks reads better than q8_0 on 8
    and q4_k_m on all 16, but over other, shorter text: it follows the whole-text ones and is said not comparable."""
    q6 = dataclasses.replace(_choice("q6_k", 0.0104, 0.0006, 130), on=Basis(4, 16, 252))
    q8 = dataclasses.replace(_choice("q8_0", 0.0042, 0.0003, 140), on=Basis(8, 16, 504))
    q4 = dataclasses.replace(_choice("q4_k_m", 0.0571, 0.0020, 100), on=Basis(16, 16, 1008))
    assert [c.tag for c in rank([q6, q8, q4])] == ["q8_0", "q6_k", "q4_k_m"]  # the figures alone
    assert [c.tag for c in rank_comparable([q6, q8, q4])] == ["q4_k_m", "q8_0", "q6_k"]
    said = versus(q4, q6, q4.scored, q6.scored)
    assert "not comparable" in said and "4/16 chunks, 252 tokens" in said and "measurably" not in said
    # figures without both standard errors are never called measurably worse
    bare = dataclasses.replace(q4, figures=q4.figures.model_copy(update={"mean_kl_stderr": None}))
    whole = Basis(16, 16, 1008)
    assert "not known to differ measurably" in versus(q4, bare, whole, whole)


def test_variants_within_their_standard_errors_tie_and_the_smaller_wins() -> None:
    a = _choice("q8_0", 0.0119, 0.0006, 900)  # best figure, largest
    b = _choice("q6_k", 0.0125, 0.0006, 700)  # within a + b's standard errors of a: a tie
    c = _choice("q4_k_m", 0.0300, 0.0010, 500)  # measurably worse
    assert [x.tag for x in rank([c, a, b])] == ["q6_k", "q8_0", "q4_k_m"]
    # without standard errors nothing ties: the lower figure wins, whatever the size
    bare = [
        dataclasses.replace(x, figures=x.figures.model_copy(update={"mean_kl_stderr": None}))
        for x in (a, b, c)
    ]
    assert [x.tag for x in rank(bare)] == ["q8_0", "q6_k", "q4_k_m"]
    # just outside: 0.0119 + 2 x 0.0006 < 0.0132
    far = _choice("q6_k", 0.0132, 0.0006, 700)
    assert [x.tag for x in rank([a, far])] == ["q8_0", "q6_k"]


def test_recommend_ranks_what_fits_with_a_reason_and_the_commands(site_registry: SiteRegistry) -> None:
    got = {
        a.name: a for a in recommend(site_registry.settings, Request("1xL4-24G", context=4096, concurrency=4))
    }
    assert sorted(got) == ["smollm2", "tiny-qwen2"]
    smol = got["smollm2"]
    assert [c.tag for c in smol.ranked] == ["q8_0", "q6_k", "fp8", "awq", "q4_k_m"]
    # a GGUF is planned for Ollama with llama.cpp's buffers: num_ctx per sequence, one slot per sequence
    assert smol.winner is not None and smol.winner.gguf is not None and smol.winner.plan is None
    g = smol.winner.gguf
    assert (g.engine, g.num_ctx, g.parallel, g.n_gpu_layers, g.n_layers) == ("ollama", 4096, 4, 31, 31)
    assert smol.commands == [
        "modelmint pull smollm2:q8_0",
        "printf 'FROM smollm2:q8_0\\nPARAMETER num_ctx 4096\\nPARAMETER num_gpu 31\\n' > smollm2-q8_0.Modelfile",
        "ollama create smollm2:q8_0-ctx4096 -f smollm2-q8_0.Modelfile",
        "OLLAMA_NUM_PARALLEL=4 ollama serve",
        "ollama run smollm2:q8_0-ctx4096",
    ]
    # these GGUFs are headers with the model's shape and one tensor: sized from the header, and said so
    assert any("holds no per-layer tensors" in w for w in smol.warnings)
    assert "smollm2:q6_k is measurably worse (mean KL" in smol.reasons[0]
    tiny = got["tiny-qwen2"]
    # tiny-qwen2's q4_k_m (0.0123 ± 0.0006) and q8_0 (0.0119 ± 0.0006) tie: the smaller wins, and says so
    assert [c.tag for c in tiny.ranked] == ["q4_k_m", "q8_0"]
    assert "ties within the standard errors with tiny-qwen2:q8_0" in tiny.reasons[0]
    assert "the smaller wins" in tiny.reasons[0]
    json.dumps([a.to_dict() for a in got.values()])  # --json


def test_a_compressed_winner_gets_the_plan_and_vllm_commands(site_registry: SiteRegistry) -> None:
    s = site_registry.settings
    compressed = [
        m for m in list_manifests(s).manifests if m.name == "smollm2" and m.format == "compressed-tensors"
    ]
    advice = advise(s, "smollm2", compressed, Request("4xRTX4090-24G", context=8192))
    assert advice.winner is not None and advice.winner.tag == "fp8"
    assert advice.commands == [
        "modelmint pull smollm2:fp8",
        "modelmint plan smollm2:fp8 --gpus 1x4xRTX4090-24G --context 8192 --out plans/smollm2-fp8",
        "vllm serve artifacts/smollm2/fp8 --config plans/smollm2-fp8/1x4xrtx4090-24g/vllm.yaml",
    ]


def test_a_build_that_failed_its_gate_is_shown_and_never_recommended(site_registry: SiteRegistry) -> None:
    s = site_registry.settings
    failed = report("q2_k", (0.0010, 0.0001, 99.0, 0.1, 0.1, 0.1), passed=False)  # the best figure of all
    assert failed["validation"]["passed"] is False
    out = s.work_dir / "smollm2" / "0123456789ab"
    out.mkdir(parents=True, exist_ok=True)
    (out / "smollm2-q2_k.report.json").write_text(json.dumps(failed))
    only = s.work_dir / "qwen2.5" / "7ae557604adf"
    only.mkdir(parents=True, exist_ok=True)
    (only / "qwen2.5-q4_k_m.report.json").write_text(json.dumps({**failed, "variant": "q4_k_m"}))
    try:
        smol, qwen = recommend(s, Request("1xL4-24G"), ["smollm2", "qwen2.5"])
        assert [f.tag for f in smol.failed] == ["q2_k"] and smol.failed[0].failures
        assert "q2_k" not in [c.tag for c in smol.ranked + smol.unfit]
        assert smol.winner is not None and smol.winner.tag == "q8_0"
        # a model with only failed builds: shown, none recommended
        assert qwen.winner is None and [f.tag for f in qwen.failed] == ["q4_k_m"]
        assert qwen.problem is not None and "nothing is recommended" in qwen.problem
    finally:
        (out / "smollm2-q2_k.report.json").unlink()
        (only / "qwen2.5-q4_k_m.report.json").unlink()


def test_an_inventory_nothing_fits_says_what_would(site_registry: SiteRegistry) -> None:
    """The registered variants made 24-60 GiB (their records, not their files): an L4 holds no checkpoint on vLLM,
    a 20 GiB CPU machine no GGUF."""
    s = site_registry.settings
    big = [
        m.model_copy(update={"weights_bytes": int(m.weights_bytes * 27 * 1024)})
        for m in list_manifests(s).manifests
        if m.name == "smollm2"
    ]
    advice = advise(s, "smollm2", big, Request("1xL4-24G", engine="vllm"))
    assert advice.winner is None and advice.ranked == []
    assert "no registered variant fits 1x1xL4-24G" in advice.reasons[0]
    # more GPUs, the planner's own nearest: SmolLM2's 9 heads split over no TP 2, so two L4s in a pipeline
    assert advice.would_fit[0] == "--gpus 2x1xL4-24G"
    on_cpu = advise(s, "smollm2", big, Request("cpu:20G", engine="ollama"))
    assert on_cpu.winner is None and "no registered variant fits 1x1xcpu-20G" in on_cpu.reasons[0]
    would = "\n".join(on_cpu.would_fit)
    # a smaller variant not built yet, with the catalog line to add and the command that builds it
    assert "smollm2:q2_k (not built yet" in would
    assert "quants: [q4_k_m, q6_k, q8_0, q2_k]" in would
    assert "modelmint convert smollm2 --variants q2_k --register" in would


def test_a_shorter_context_is_offered_when_the_asked_one_does_not_fit(site_registry: SiteRegistry) -> None:
    s = site_registry.settings
    # 2 GiB of weights, 64 sequences of Ollama's 4096 tokens on a 6 GiB CPU machine: the KV cache is what is short
    big = [
        m.model_copy(update={"weights_bytes": 2 << 30})
        for m in list_manifests(s).manifests
        if m.name == "tiny-qwen2"
    ]
    advice = advise(s, "tiny-qwen2", big, Request("cpu:6G", concurrency=64))
    assert advice.winner is None
    assert any(w.startswith("--context ") and "on 1x1xcpu-6G" in w for w in advice.would_fit), (
        advice.would_fit
    )


def test_artifacts_not_in_the_checkout_are_named_with_the_pull(
    site_registry: SiteRegistry, tmp_path: Path
) -> None:
    s = site_registry.settings
    # registered before the model's shape was recorded in the manifest: only the bytes give it
    manifests = [m.model_copy(update={"shape": None}) for m in list_manifests(s).manifests if m.name == "smollm2"]
    elsewhere = dataclasses.replace(s, repo_dir=tmp_path)
    advice = advise(elsewhere, "smollm2", manifests, Request("1xL4-24G"))
    assert advice.winner is None and advice.problem is not None
    assert "modelmint pull smollm2:" in advice.problem


def test_bad_input_is_refused_with_the_next_command(site_registry: SiteRegistry) -> None:
    s = site_registry.settings
    with pytest.raises(NotRegistered, match="nope") as err:
        recommend(s, Request("1xL4-24G"), ["nope"])
    assert "smollm2" in err.value.message  # the registered names
    with pytest.raises(ConfigError, match="not a GPU group") as bad:
        recommend(s, Request("one L4"))
    assert "--list-gpus" in (bad.value.hint or "")
    with pytest.raises(ConfigError, match="--context 0"):
        recommend(s, Request("1xL4-24G", context=0))


def test_a_published_winner_is_pulled_from_its_registry_and_a_damaged_record_falls_back(
    site_registry: SiteRegistry,
) -> None:
    from pipelines.store.manifest import find_manifest
    from pipelines.store.published import publications_path

    s = site_registry.settings
    m = find_manifest(s, "smollm2:q8_0")
    record = publications_path(s, "smollm2", "q8_0")
    record.parent.mkdir(parents=True, exist_ok=True)
    image = "registry.internal/modelmint/smollm2:q8_0"
    try:
        record.write_text(
            json.dumps([{"image": image, "key": m.key, "sha256": m.sha256, "published_at": "x"}])
        )
        (smol,) = recommend(s, Request("1xL4-24G"), ["smollm2"])
        assert smol.commands[0] == f"ollama pull {image}" and f"FROM {image}\\n" in smol.commands[1]
        record.write_text("{not json")
        (smol,) = recommend(s, Request("1xL4-24G"), ["smollm2"])
        assert smol.commands[0] == "modelmint pull smollm2:q8_0" and "FROM smollm2:q8_0\\n" in smol.commands[1]
    finally:
        shutil.rmtree(record.parent.parent)
