"""The deployment handbooks' worked cases as planner inputs (../shared/notes/handbook-scenarios.md): shared by the
planner's tests, the serving files' tests and their golden files under tests/golden/plans/."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.publish.planner import GIB, Ask, Plan, parse_cluster, plan, shape_of
from pipelines.publish.servefiles import Artifact

QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
             "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768}
QWEN25_32B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 64,
              "num_attention_heads": 40, "num_key_value_heads": 8, "hidden_size": 5120,
              "intermediate_size": 27648, "vocab_size": 152064, "max_position_embeddings": 32768}
DENSE_80G = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 64,
             "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192,
             "intermediate_size": 22016, "vocab_size": 32000, "max_position_embeddings": 8192}
"""A 40B-class dense model: 80 GiB of weights in FP16, 64 layers, 64 heads / 8 KV heads (MLP and vocabulary as a
Llama-2 model of that width would have them)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    ask: Ask
    gpus: str
    artifact: Artifact
    pp_across_types: bool = False

    def plans(self) -> list[Plan]:
        return plan(self.ask, parse_cluster(self.gpus), pp_across_types=self.pp_across_types)


def _ckpt(name: str, gib: float) -> Artifact:
    return Artifact(name, name, False, int(gib * GIB))


SCENARIOS = [
    # 1. one node, 4 × 40 GiB, an 80 GiB model: TP 4
    Scenario("tp4-one-node", Ask(80 * GIB, shape_of(DENSE_80G), context=8192), "1x4xA100-40G",
             _ckpt("dense-80g", 80)),
    # 3. two nodes × 2 × 40 GiB: TP 2 inside each node × PP 2 across them
    Scenario("tp2-pp2-two-nodes", Ask(80 * GIB, shape_of(DENSE_80G), context=4096), "2x2xA100-40G",
             _ckpt("dense-80g", 80)),
    # 4 and 5. an A800 node and an L20 node, an FP8 checkpoint: independent instances per type
    Scenario("a800-l20-fp8", Ask(int(8.9 * GIB), shape_of(QWEN25_7B), context=8192, concurrency=16, fp8_weights=True),
             "1x8xA800-80G+1x8xL20-48G", _ckpt("qwen2-5-7b-fp8", 8.9)),
    # 4, the model larger than the L20: PP 2 across the two types when asked, stages sized by free memory
    Scenario("a800-l20-pp", Ask(64 * GIB, shape_of(QWEN25_32B), context=8192, concurrency=4),
             "1x1xA800-80G+1x1xL20-48G", _ckpt("qwen2-5-32b", 64), pp_across_types=True),
    # 6. a GGUF on a consumer 4-GPU box: one model per GPU, Ollama's one-instance-per-GPU layout
    Scenario("gguf-4x4090", Ask(int(4.4 * GIB), shape_of(QWEN25_7B), context=8192, concurrency=32), "4xRTX4090-24G",
             Artifact("qwen2-5-7b-q4-k-m", "qwen2.5-7b-q4_k_m.gguf", True, int(4.4 * GIB),
                      ollama_model="qwen2.5-7b:q4_k_m")),
]
