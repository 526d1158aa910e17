"""What `modelmint plan` reads before it plans, through the real CLI on real files: a config.json or GGUF metadata
that no model has (or that its weights contradict), a GGUF `modelmint inspect` refuses, an inventory of the wrong
types or encoding, a GPU name spelled another way, a damaged publication record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
UNEXPECTED = "this is a bug in modelmint"  # the edge's words for an exception no library code names

# A small decoder, consistent: config.json / GGUF keys and the tensors of its 2 layers agree.
LAYERS, HEADS, KV_HEADS, HIDDEN, MLP, VOCAB = 2, 4, 2, 64, 128, 32
CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "hidden_size": HIDDEN,
    "intermediate_size": MLP, "vocab_size": VOCAB, "max_position_embeddings": 512, "tie_word_embeddings": True,
}


def _modelmint(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, importing this checkout's modelmint; a time limit only so that a hang fails."""
    env = {**(env or os.environ), "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def _refused(proc: subprocess.CompletedProcess[str], *said: str) -> str:
    """The one error line of a refusal of bad input (not a traceback, not the edge's "bug"), holding each of `said`."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "Traceback" not in text and UNEXPECTED not in text, text
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    for s in said:
        assert s in proc.stderr, (s, proc.stderr)
    return proc.stderr


def _plan(tmp_path: Path, what: Path | str, gpus: str = "1xL4-24G") -> subprocess.CompletedProcess[str]:
    return _modelmint(tmp_path, "plan", str(what), "--gpus", gpus)


def _planned(proc: subprocess.CompletedProcess[str], said: str = "1x1xL4-24G: TP 1") -> None:
    assert proc.returncode == 0 and said in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------- a checkpoint directory


def _checkpoint(path: Path, config: dict[str, Any], *, tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A checkpoint directory: `config` as config.json and, unless `tensors` replaces them, the tensors of CONFIG's
    model (Qwen2's names, float16 zeros) in model.safetensors."""
    from safetensors.numpy import save_file

    if tensors is None:
        head_dim = HIDDEN // HEADS
        tensors = {"model.embed_tokens.weight": np.zeros((VOCAB, HIDDEN), np.float16)}
        for i in range(LAYERS):
            for name, shape in (("self_attn.q_proj", (HEADS * head_dim, HIDDEN)),
                                ("self_attn.k_proj", (KV_HEADS * head_dim, HIDDEN)),
                                ("self_attn.v_proj", (KV_HEADS * head_dim, HIDDEN)),
                                ("self_attn.o_proj", (HIDDEN, HEADS * head_dim)),
                                ("mlp.gate_proj", (MLP, HIDDEN)), ("mlp.up_proj", (MLP, HIDDEN)),
                                ("mlp.down_proj", (HIDDEN, MLP))):
                tensors[f"model.layers.{i}.{name}.weight"] = np.zeros(shape, np.float16)
    path.mkdir(parents=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def test_a_consistent_checkpoint_is_planned(tmp_path: Path) -> None:
    _planned(_plan(tmp_path, _checkpoint(tmp_path / "model", CONFIG)))


@pytest.mark.parametrize(("field", "value", "bound"), [
    ("num_hidden_layers", 10**7, "1,024"),  # ten million layers: the planner searched for hours
    ("vocab_size", 10**9, "4,194,304"),
    ("max_position_embeddings", 10**12, "134,217,728"),
    ("hidden_size", 10**7, "131,072"),
    ("num_experts_per_tok", 10**6, "1,024"),
])
def test_a_config_number_no_model_has_is_refused_naming_the_field_and_the_bound(
    tmp_path: Path, field: str, value: int, bound: str
) -> None:
    model = _checkpoint(tmp_path / "model", {**CONFIG, field: value})
    _refused(_plan(tmp_path, model), f"config.json: {field} is {value:,}", f"at most {bound}", "modelmint pull")


def test_a_multimodal_configs_text_model_is_bounded_too(tmp_path: Path) -> None:
    config = {"architectures": ["X"], "text_config": {**CONFIG, "num_hidden_layers": 10**7}}
    _refused(_plan(tmp_path, _checkpoint(tmp_path / "model", config)), "text_config.num_hidden_layers is 10,000,000")


@pytest.mark.parametrize(("config", "tensors", "holds"), [
    # the layer count made up (within the bounds): the planner sized 64 layers' KV cache for 2 layers' weights
    ({**CONFIG, "num_hidden_layers": 64}, None, "hold 75,776 (151,552 bytes)"),
    # the config of the model, the weights of none: 4 parameters planned as "0.0 GiB of weights"
    (CONFIG, {"w": np.zeros((2, 2), np.float16)}, "hold 4 (8 bytes)"),
])
def test_a_config_its_weights_contradict_is_refused_naming_both_figures(
    tmp_path: Path, config: dict[str, Any], tensors: dict[str, np.ndarray] | None, holds: str
) -> None:
    model = _checkpoint(tmp_path / "model", config, tensors=tensors)
    _refused(_plan(tmp_path, model), "config.json implies", f"({config['num_hidden_layers']} layers, hidden 64",
             holds, "not one model's", "every shard")


def test_a_packed_4_bit_checkpoint_is_counted_by_the_values_it_packs(tmp_path: Path) -> None:
    """compressed-tensors' pack-quantized weights: eight 4-bit values in each int32, not one parameter."""
    head_dim = HIDDEN // HEADS
    tensors = {"model.embed_tokens.weight": np.zeros((VOCAB, HIDDEN), np.float16)}
    for i in range(LAYERS):
        for name, rows, cols in (("q_proj", HEADS * head_dim, HIDDEN), ("k_proj", KV_HEADS * head_dim, HIDDEN),
                                 ("v_proj", KV_HEADS * head_dim, HIDDEN), ("o_proj", HIDDEN, HEADS * head_dim),
                                 ("gate_proj", MLP, HIDDEN), ("up_proj", MLP, HIDDEN), ("down_proj", HIDDEN, MLP)):
            tensors[f"model.layers.{i}.{name}.weight_packed"] = np.zeros((rows, cols // 8), np.int32)
            tensors[f"model.layers.{i}.{name}.weight_scale"] = np.zeros((rows, 1), np.float16)
    quantization = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                    "config_groups": {"group_0": {"weights": {"num_bits": 4}, "targets": ["Linear"]}}}
    model = _checkpoint(tmp_path / "model", {**CONFIG, "quantization_config": quantization}, tensors=tensors)
    _planned(_plan(tmp_path, model))


# ---------------------------------------------------------------- a GGUF


def _gguf(path: Path, *, layers: int = LAYERS, tensors: bool = True, keys: dict[str, Any] | None = None) -> Path:
    """A qwen2 GGUF (gguf-py's writer) of CONFIG's model; `layers` sets block_count only (the tensors stay those of
    LAYERS layers); `keys` adds or replaces metadata (a value's Python type chooses its GGUF type)."""
    import gguf

    arch = "qwen2"
    w = gguf.GGUFWriter(str(path), arch)
    meta: dict[str, Any] = {f"{arch}.block_count": layers, f"{arch}.attention.head_count": HEADS,
                            f"{arch}.attention.head_count_kv": KV_HEADS, f"{arch}.embedding_length": HIDDEN,
                            f"{arch}.feed_forward_length": MLP, f"{arch}.context_length": 512, **(keys or {})}
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_eos_token_id(0)
    if tensors:
        head_dim = HIDDEN // HEADS
        w.add_tensor("token_embd.weight", np.zeros((VOCAB, HIDDEN), np.float16))
        for i in range(LAYERS):
            for name, shape in (("attn_q", (HEADS * head_dim, HIDDEN)), ("attn_k", (KV_HEADS * head_dim, HIDDEN)),
                                ("attn_v", (KV_HEADS * head_dim, HIDDEN)), ("attn_output", (HIDDEN, HIDDEN)),
                                ("ffn_gate", (MLP, HIDDEN)), ("ffn_up", (MLP, HIDDEN)), ("ffn_down", (HIDDEN, MLP))):
                w.add_tensor(f"blk.{i}.{name}.weight", np.zeros(shape, np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("keys", [{}, {"qwen2.attention.head_count_kv": [KV_HEADS, 0]}],
                         ids=["scalars", "a per-layer list holding 0"])
def test_a_consistent_gguf_is_planned(tmp_path: Path, keys: dict[str, Any]) -> None:
    _planned(_plan(tmp_path, _gguf(tmp_path / "m.gguf", keys=keys)), "1x1xL4-24G: engine ollama (llama.cpp)")


@pytest.mark.parametrize(("keys", "said"), [
    # what `modelmint inspect` refuses, refused by plan alike (one checked reader)
    ({"split.no": "1"}, "metadata split.no is a string ('1'), not an integer"),
    ({"general.file_type": [1, 2]}, "metadata general.file_type is an array ([1, 2]), not an integer"),
    # what sizes the plan: a context of 0 tokens was planned as 4096
    ({"qwen2.context_length": 0}, "metadata qwen2.context_length is 0: a model has at least 1"),
    ({"qwen2.block_count": "2"}, 'metadata qwen2.block_count is "2", not a whole number'),
    ({"qwen2.attention.head_count_kv": 10**9},
     "metadata qwen2.attention.head_count_kv is 1,000,000,000: more than any model has"),
])
def test_gguf_metadata_inspect_or_a_plan_refuses_is_named(tmp_path: Path, keys: dict[str, Any], said: str) -> None:
    _refused(_plan(tmp_path, _gguf(tmp_path / "m.gguf", keys=keys)), said)


def test_a_gguf_without_tensors_is_refused(tmp_path: Path) -> None:
    _refused(_plan(tmp_path, _gguf(tmp_path / "m.gguf", tensors=False)), "holds no tensors", "modelmint convert")


def test_a_gguf_whose_block_count_is_made_up_is_refused_in_time(tmp_path: Path) -> None:
    """Ten million layers over 2 layers' tensors: bounded, not searched (it was, for hours)."""
    _refused(_plan(tmp_path, _gguf(tmp_path / "m.gguf", layers=10**7)),
             "metadata qwen2.block_count is 10,000,000: more than any model has (the planner takes at most 1,024")


def test_a_gguf_its_tensors_contradict_is_refused_naming_both_figures(tmp_path: Path) -> None:
    # a width its tensors do not have (a layer count they contradict is named as such: the test below)
    _refused(_plan(tmp_path, _gguf(tmp_path / "m.gguf", keys={"qwen2.embedding_length": 1024})),
             "its metadata implies", "(2 layers, hidden 1,024", "its tensors hold 75,776 (", "modelmint convert")


@pytest.mark.parametrize(("layers", "said"), [
    (1, "metadata qwen2.block_count says 1 layers but it holds tensors of layer blk.1 (2 layers)"),
    (3, "metadata qwen2.block_count says 3 layers but it holds tensors of 2 (none for blk.2)"),
])
def test_a_gguf_whose_header_lies_about_its_layers_is_refused(tmp_path: Path, layers: int, said: str) -> None:
    """A block count one off the `blk.N` tensors (within the parameter tolerance): llama.cpp refuses to load it, and
    it was planned with the KV cache of layers it does not have."""
    gguf = _gguf(tmp_path / "m.gguf", layers=layers)
    _refused(_plan(tmp_path, gguf), said, "contradicts its tensors", "modelmint convert")
    out = tmp_path / "out"
    _refused(_modelmint(tmp_path, "plan", str(gguf), "--gpus", "2x16G", "--out", str(out)), said)
    assert not out.exists()  # nothing half-written


# ---------------------------------------------------------------- the GPUs: an inventory file, a name


@pytest.mark.parametrize(("text", "said"), [
    (b"- {gpus: true, type: L4-24G}\n", "group 1: gpus: Input should be a valid integer (got true)"),
    (b"- {nodes: '2', gpus: 1, type: L4-24G}\n", "group 1: nodes: Input should be a valid integer (got '2')"),
    (b"- {gpus: 1, type: 4090}\n", "group 1: type: Input should be a valid string (got 4090)"),
    (b"- 8xL4-24G\n", "group 1: entry: not a mapping of nodes, gpus and type (got 8xL4-24G)"),
    (b"\xff\xfe- {gpus: 1, type: L4-24G}\n", "not UTF-8 text (byte 0xff at offset 0)"),
])
def test_an_inventory_of_the_wrong_types_or_encoding_is_named(tmp_path: Path, text: bytes, said: str) -> None:
    inventory = tmp_path / "cluster.yaml"
    inventory.write_bytes(text)
    _refused(_plan(tmp_path, _gguf(tmp_path / "m.gguf"), str(inventory)), f"{inventory}", said)


@pytest.mark.parametrize(("typed", "meant"), [
    ("1xRTX4090", "1xRTX4090-24G"),
    ("1xH100", "1xH100-80G"),
    ("1xA100-80GB", "1xA100-80G"),
    ("2x8xnvidia-h100-80gb", "2x8xH100-80G"),
    ("1xL4-24G+4x4090", "4xRTX4090-24G"),
])
def test_a_gpu_name_spelled_another_way_gets_the_name_it_means(tmp_path: Path, typed: str, meant: str) -> None:
    said = _refused(_plan(tmp_path, _gguf(tmp_path / "m.gguf"), typed), "unknown GPU", f"did you mean {meant}?")
    assert "--gpus cluster.yaml" in said and "- {nodes: 1, gpus: 8, type: A800-80G}" in said  # an inventory's form


def test_a_misspelled_gpu_in_an_inventory_gets_the_line_to_write(tmp_path: Path) -> None:
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("- {gpus: 8, type: A800-80G}\n- {gpus: 8, type: H100}\n")
    _refused(_plan(tmp_path, _gguf(tmp_path / "m.gguf"), str(inventory)), "group 2: unknown GPU 'H100'",
             "did you mean type: H100-80G?")


def test_a_gpu_name_like_none_is_refused_without_a_guess(tmp_path: Path) -> None:
    said = _refused(_plan(tmp_path, _gguf(tmp_path / "m.gguf"), "1xTPUv5"), "unknown GPU 'TPUv5'")
    assert "did you mean" not in said


# ---------------------------------------------------------------- a publication record


@pytest.fixture
def registered(repo: Any, tmp_path: Path) -> Any:
    """A project with tiny-qwen2:q4_k_m registered (a synthetic GGUF, by the real registration)."""
    from registry_env import candidate

    from pipelines.registry.register import register

    register(repo.settings(), candidate(repo.settings(), tmp_path / "build"))
    return repo


def _record(repo: Any, entries: list[dict[str, Any]]) -> Path:
    from pipelines.store.manifest import find_manifest
    from pipelines.store.published import publications_path

    m = find_manifest(repo.settings(), "tiny-qwen2:q4_k_m")
    path = publications_path(repo.settings(), m.name, m.tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    whole = {"image": "127.0.0.1:5000/ns/tiny-qwen2:q4_k_m", "registry": "127.0.0.1:5000",
             "repository": "ns/tiny-qwen2", "tags": ["q4_k_m"], "pinned": "127.0.0.1:5000/ns/tiny-qwen2:q4_k_m-x",
             "digest": "sha256:" + "0" * 64, "key": m.key, "sha256": m.sha256, "published_at": "2026-12-01T00:00:00Z"}
    path.write_text(json.dumps([{k: v for k, v in {**whole, **e}.items() if v is not None} for e in entries]))
    return path


@pytest.mark.parametrize(("entry", "said"), [
    ({"image": None}, "entry 1 has no image"),
    ({"published_at": None}, "entry 1 has no published_at"),
    ({"key": None, "sha256": None}, "entry 1 has no key (or sha256)"),
    ({"image": 5}, "entry 1 field image is 5, not a string"),
    ({"tags": "q4_k_m"}, 'entry 1 field tags is "q4_k_m", not a list of strings'),
])
def test_a_publication_record_missing_a_field_is_named_where_it_is_read(
    registered: Any, entry: dict[str, Any], said: str
) -> None:
    path = _record(registered, [entry])
    for command in (["show", "tiny-qwen2:q4_k_m"], ["list"]):
        proc = _modelmint(registered.root, *command, env=registered.env())
        _refused(proc, f"{path} is not a publication record: {said}", "git checkout --")


def test_a_publication_is_not_recorded_over_a_record_missing_a_field(registered: Any) -> None:
    """The next publication sorted the record by each entry's image: KeyError: 'image'."""
    from pipelines.core.errors import RegistryError
    from pipelines.oci.images import Published, record_publication
    from pipelines.publish.oci import RegistryRef
    from pipelines.store.manifest import find_manifest

    path = _record(registered, [{"image": None}])
    before = path.read_bytes()
    m = find_manifest(registered.settings(), "tiny-qwen2:q4_k_m")
    done = Published(m, RegistryRef("127.0.0.1:5000", "ns", insecure=True), ["127.0.0.1:5000/ns/tiny-qwen2:b"],
                     "sha256:" + "1" * 64)
    with pytest.raises(RegistryError, match="entry 1 has no image"):
        record_publication(registered.settings(), done)
    assert path.read_bytes() == before


def test_a_whole_publication_record_is_shown(registered: Any) -> None:
    _record(registered, [{}])
    proc = _modelmint(registered.root, "show", "tiny-qwen2:q4_k_m", env=registered.env())
    assert proc.returncode == 0 and "published: 127.0.0.1:5000/ns/tiny-qwen2:q4_k_m" in proc.stderr, proc.stderr
