"""llama.cpp's memory for a GGUF, checked against the real llama-server's load log; Ollama's offload estimate on a
worked example; a GGUF whose header claims more layers than it holds, refused."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from pipelines.core.errors import ArtifactError
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.publish.llamacpp_memory import (
    COMPUTE_TOLERANCE,
    MIB,
    LayeredWeights,
    LlamaCppContext,
    llama_server_load_log,
    llamacpp_memory,
    mib_as_logged,
    ollama_layers,
    parse_load_log,
    read_layered_weights,
)


@dataclass(frozen=True)
class Tiny:
    f16: Path
    q4_k_m: Path
    settings: Settings


@pytest.fixture(scope="module")
def tiny(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """tiny-qwen2 converted to f16 and quantized to q4_k_m by modelmint's GGUF steps."""
    from pipelines.gguf.build import ensure_base, ensure_quant, plan_gguf
    from pipelines.source.catalog import load_catalog

    settings = replace(settings, work_dir=tmp_path_factory.mktemp("work"))
    plan = plan_gguf(load_catalog(settings.catalog_path).get("tiny-qwen2"), settings, quants=["q4_k_m"])
    ensure_base(plan)
    ensure_quant(plan, "q4_k_m")
    return Tiny(plan.base_path, plan.quant_path("q4_k_m"), settings)


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "ctx"), [
    ("q4_k_m", LlamaCppContext(2048, 2)),
    # -c 3000 over 3 slots: 1000 cells each, rounded up to 1024, so llama.cpp allocates 3072
    ("q4_k_m", LlamaCppContext(3000, 3)),
    ("f16", LlamaCppContext(8192, 4, type_k="q8_0", type_v="q8_0")),
], ids=["q4_k_m-c2048-np2", "q4_k_m-c3000-np3", "f16-c8192-np4-q8_0"])
def test_the_buffers_are_those_llama_server_logs(tiny: Tiny, variant: str, ctx: LlamaCppContext,
                                                 tmp_path: Path) -> None:
    gguf = tiny.f16 if variant == "f16" else tiny.q4_k_m
    # without repacking, the CPU backend maps exactly the file's tensors (with it, a second copy of some)
    text = llama_server_load_log(llama_cpp(tiny.settings).bin("llama-server"), gguf, ctx, log=tmp_path / "log",
                                 threads=1, extra=["--no-repack"])
    logged = parse_load_log(text)
    mem = llamacpp_memory(read_layered_weights(gguf), ctx)

    assert (logged.n_ctx, logged.n_ctx_seq) == (ctx.n_ctx_total, ctx.n_ctx_seq)
    assert mib_as_logged(mem.kv) == sum(logged.kv.values())
    assert mib_as_logged(mem.output) == sum(logged.output.values())
    assert mem.weights / MIB == pytest.approx(sum(logged.model.values()), rel=0.01)
    assert mem.compute / MIB == pytest.approx(sum(logged.compute.values()), rel=COMPUTE_TOLERANCE)


@pytest.mark.slow
def test_ngl_counts_the_output_layer_first(tiny: Tiny) -> None:
    """-ngl 1 puts the output layer alone on the GPU; a tied output takes its copy of the token embedding."""
    w = read_layered_weights(tiny.q4_k_m)
    assert w.output_tied and w.n_layer == 4
    assert w.offloaded_bytes(0) == 0
    assert w.offloaded_bytes(1) == w.output_bytes >= w.token_embd_bytes
    assert w.offloaded_bytes(3) == w.output_bytes + w.layer_bytes[2] + w.layer_bytes[3]
    assert w.offloaded_bytes(-1) == w.offloaded_bytes(99) == w.output_bytes + sum(w.layer_bytes)
    assert llamacpp_memory(w, LlamaCppContext(2048), n_gpu_layers=3).kv_gpu == 2 * 2048 * 2 * 2 * 64 * 2


# ---------------------------------------------------------------------------------------- a header that lies


def _qwen2_gguf(path: Path, *, block_count: int, layers: int) -> Path:
    """A small qwen2 GGUF (gguf-py's writer) holding `layers` blocks of tensors whose header says `block_count`."""
    import gguf

    hidden, heads, kv_heads, mlp, vocab = 64, 4, 2, 128, 32
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(block_count)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(mlp)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_context_length(512)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_eos_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((vocab, hidden), np.float16))
    for i in range(layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden // 2, hidden)),
                            ("attn_v", (hidden // 2, hidden)), ("attn_output", (hidden, hidden)),
                            ("ffn_gate", (mlp, hidden)), ("ffn_up", (mlp, hidden)), ("ffn_down", (hidden, mlp))):
            w.add_tensor(f"blk.{i}.{name}.weight", np.zeros(shape, np.float16))
    w.add_tensor("output_norm.weight", np.ones((hidden,), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_header_claiming_more_layers_than_it_holds_is_refused(tmp_path: Path) -> None:
    path = _qwen2_gguf(tmp_path / "lies.gguf", block_count=6, layers=4)
    with pytest.raises(ArtifactError) as err:
        read_layered_weights(path)
    assert "metadata qwen2.block_count says 6 layers but it holds tensors of 4 (blk.4, blk.5 missing)" in str(err.value)
    assert err.value.hint and "modelmint convert" in err.value.hint


def test_a_header_claiming_fewer_layers_than_it_holds_is_refused(tmp_path: Path) -> None:
    path = _qwen2_gguf(tmp_path / "lies.gguf", block_count=3, layers=4)
    with pytest.raises(ArtifactError, match=r"tensor blk\.3\.\S+ but metadata qwen2\.block_count says 3 layers"):
        read_layered_weights(path)


def test_a_consistent_header_is_sized(tmp_path: Path) -> None:
    w = read_layered_weights(_qwen2_gguf(tmp_path / "m.gguf", block_count=4, layers=4))
    per_layer = 2 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 128 * 64)
    assert (w.n_layer, w.n_vocab, w.layer_bytes) == (4, 32, (per_layer,) * 4)
    assert w.output_tied and w.output_bytes == 64 * 4 + 32 * 64 * 2


# ------------------------------------------------------------------------------------------ Ollama's estimate

_MODEL = LayeredWeights(
    path="worked-example", architecture="qwen2", n_layer=4, n_embd=1024, n_ff=4096, n_head=8, n_head_kv=(2,) * 4,
    head_dim_k=128, head_dim_v=128, n_vocab=32000, layer_bytes=(100 * MIB,) * 4, input_bytes=50 * MIB,
    output_bytes=60 * MIB, output_tied=False, token_embd_bytes=50 * MIB)
# By hand, from llm/memory.go and fs/ggml/ggml.go (ollama 3258a89b6e4c), num_ctx 2048, OLLAMA_NUM_PARALLEL 2,
# num_batch 512: context = 4096, batch = 512.
#   KV per layer = 4096 * (128 + 128) * 2 heads * 2 B             =     4,194,304 (kv total 16,777,216)
#   qwen2 full    = max(4*512*(1024+32000), 4*512*(1+2*1024+4096+4096*8))        =    79,693,824
#   qwen2 partial = max(4*512*33024 + 1024*32000*105/128,
#                       4*(512*(1+2*1024+4096*9) + 1024*(1+4096)))               =    96,475,136
#   graph = max(partial, full) = 96,475,136; minimum 457 MiB = 479,199,232; layer = 100 MiB + KV = 109,051,904
#   a GPU takes part when free >= graph + minimum + 2 layers                      =   793,778,176
#   and starts charged minimum + one layer                                        =   588,251,136
_GRAPH, _LAYER, _START = 96_475_136, 109_051_904, 588_251_136


def test_ollama_offloads_the_layers_that_fit_from_the_last() -> None:
    # one GPU with 1000 MiB (1,048,576,000) free: layer 3 needs > 588,251,136 + graph + layer = 793,778,176,
    # layer 2 > 902,830,080, layer 1 > 1,011,881,984 (fits), layer 0 > 1,120,933,888 (does not): 3 layers,
    # the output layer not tried (no GPU left), partial graph charged
    got = ollama_layers(_MODEL, [1000 * MIB], num_ctx=2048, num_parallel=2)
    assert (got.layers, got.per_gpu, got.fully_loaded) == (3, (3,), False)
    assert (got.graph_partial, got.graph_full, got.kv) == (_GRAPH, 79_693_824, 16_777_216)
    assert got.gpu_bytes == (_START + 3 * _LAYER + _GRAPH,) == (1_011_881_984,)
    # a second GPU below 793,778,176 free takes no part
    assert ollama_layers(_MODEL, [1000 * MIB, 600 * MIB], num_ctx=2048, num_parallel=2).per_gpu == (3, 0)


def test_ollama_splits_layers_round_robin_and_places_the_output_last() -> None:
    # two GPUs of 1000 MiB: layer i goes to gpusWithSpace[i % 2] (3 -> GPU 1, 2 -> GPU 0, 1 -> GPU 1, 0 -> GPU 0),
    # then the output layer (60 MiB) to gpusWithSpace[4 % 2] = GPU 0: 806,354,944 + graph + 62,914,560
    # = 965,744,640 < 1,048,576,000; all 5 layers on the GPUs, each charged the graph
    got = ollama_layers(_MODEL, [1000 * MIB, 1000 * MIB], num_ctx=2048, num_parallel=2)
    assert (got.layers, got.per_gpu, got.fully_loaded) == (5, (3, 2), True)
    assert got.gpu_bytes == (_START + 2 * _LAYER + 60 * MIB + _GRAPH, _START + 2 * _LAYER + _GRAPH)
    # num_gpu caps it, and the CPU library offloads nothing
    assert ollama_layers(_MODEL, [1000 * MIB] * 2, num_ctx=2048, num_parallel=2, num_gpu=2).layers == 2
    assert ollama_layers(_MODEL, [1000 * MIB], num_ctx=2048, library="cpu").layers == 0
