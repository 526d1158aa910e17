"""The preflight for disk and memory: real Safetensors headers of a 7B model (sparse files), real filesystems."""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path

import pytest

from pipelines.core.errors import RunTooLarge, SourceError
from pipelines.core.resources import (
    KLReference,
    Places,
    compressed_run,
    gguf_f16_bytes,
    gguf_quant_bytes,
    gguf_run,
    require,
    source_shape,
)
from pipelines.core.runner import run
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp

GB = 10**9
GIB = 1 << 30
KL = KLReference(ctx=128, chunks=16)  # pipelines/gguf/build.py GGUF_EVAL_CTX, GGUF_EVAL_CHUNKS


def _qwen_shapes(layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
                 vocab: int) -> list[tuple[str, list[int]]]:
    """Every tensor of a Qwen2 checkpoint with untied embeddings, in the hub's order."""
    kv = hidden // heads * kv_heads
    out: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [hidden]), (p + "mlp.down_proj.weight", [hidden, intermediate]),
                (p + "mlp.gate_proj.weight", [intermediate, hidden]), (p + "mlp.up_proj.weight", [intermediate, hidden]),
                (p + "post_attention_layernorm.weight", [hidden]), (p + "self_attn.k_proj.bias", [kv]),
                (p + "self_attn.k_proj.weight", [kv, hidden]), (p + "self_attn.o_proj.weight", [hidden, hidden]),
                (p + "self_attn.q_proj.bias", [hidden]), (p + "self_attn.q_proj.weight", [hidden, hidden]),
                (p + "self_attn.v_proj.bias", [kv]), (p + "self_attn.v_proj.weight", [kv, hidden])]
    return [*out, ("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]


def write_sharded(d: Path, tensors: list[tuple[str, list[int]]], shards: int) -> list[Path]:
    """A bf16 Safetensors checkpoint split like the hub's (model-0000N-of-0000M + index), as sparse files: each
    header is real, the data section is only the file's length (truncate), no byte of it written."""
    d.mkdir(parents=True, exist_ok=True)
    total = sum(2 * math.prod(s) for _, s in tensors)
    groups: list[list[tuple[str, list[int]]]] = [[]]
    filled = 0
    for name, shape in tensors:
        if filled >= total * len(groups) / shards and len(groups) < shards:
            groups.append([])
        groups[-1].append((name, shape))
        filled += 2 * math.prod(shape)
    assert len(groups) == shards
    weight_map, files = {}, []
    for i, group in enumerate(groups, 1):
        path = d / f"model-{i:05d}-of-{shards:05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in group:
            n = 2 * math.prod(shape)
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = path.name
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(path, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
        os.truncate(path, 8 + len(raw) + offset)
        files.append(path)
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return files


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5-7B's shapes: 28 layers, hidden 3584, intermediate 18944, 28 heads / 4 KV heads, vocab 152064,
    untied embeddings, 4 shards and an index."""
    d = tmp_path_factory.mktemp("qwen2.5-7b")
    write_sharded(d, _qwen_shapes(28, 3584, 18944, 28, 4, 152064), 4)
    return d


# Qwen2.5-7B by hand:
#   embedding and output      2 x 152064 x 3584                                  = 1,089,994,752
#   one layer: q, o           2 x 3584 x 3584                                    =    25,690,112
#              k, v           2 x 512 x 3584                                     =     3,670,016
#              gate, up, down 3 x 18944 x 3584                                   =   203,685,888
#              q/k/v biases   3584 + 512 + 512                                   =         4,608
#              two norms      2 x 3584                                           =         7,168
#                                                                          layer =   233,057,792
#   28 layers                                                                    = 6,525,618,176
#   final norm                                                                   =         3,584
PARAMS_7B = 1_089_994_752 + 28 * 233_057_792 + 3_584  # 7,615,616,512: Qwen's "7.61B"
F16_7B = 2 * PARAMS_7B  # 15.23 GB
Q4_K_M_7B = PARAMS_7B * 4.89 / 8  # 4.655 GB (the hub's Qwen2.5-7B-Instruct Q4_K_M is 4.68 GB)
Q8_0_7B = PARAMS_7B * 8.5 / 8  # 8.092 GB (the hub's Q8_0 is 8.10 GB)
# the KL reference logits: 16 chunks x (128 - 1 - 64) scored tokens x (152064 + 4) uint16 log-probs, plus the
# 16 x 128 int32 tokens and a 20-byte header
LOGITS_7B = 16 * 63 * 152_068 * 2 + 16 * 128 * 4 + 20  # 306,577,300 bytes


def test_source_shape_of_a_sharded_7b(qwen7b: Path) -> None:
    shape = source_shape(qwen7b)
    assert shape.files == 4
    assert shape.params == PARAMS_7B
    assert shape.bytes == 2 * PARAMS_7B
    assert shape.vocab == 152064
    assert shape.largest_params == 152064 * 3584


def test_7b_peak_disk_is_f16_plus_variants_plus_logits(qwen7b: Path, tmp_path: Path) -> None:
    shape = source_shape(qwen7b)
    places = Places(tmp_path / "build", tmp_path / "repo" / "artifacts", tmp_path / "repo" / ".dvc" / "cache")
    check = gguf_run(shape, ["q4_k_m", "q8_0"], places, imatrix=False, kl=KL)
    (fs,) = check.filesystems  # one disk holds all three places
    # the peak is the last validation: the work dir holds f16, logits and both variants; registering links each
    # variant into artifacts/ and the DVC cache (one inode, no more bytes): 15.23 + 0.31 + 12.75 = 28.3 GB,
    # 1.01 x (f16 + variants)
    hand = F16_7B + LOGITS_7B + Q4_K_M_7B + Q8_0_7B
    assert fs.needed == pytest.approx(hand, rel=0.02)
    assert fs.peak_step == "quantize and validate q8_0"
    assert fs.needed / (F16_7B + Q4_K_M_7B + Q8_0_7B) < 1.03
    # without the f16: the same peak (it is read until the last validation)
    lean = gguf_run(shape, ["q4_k_m", "q8_0"], places, imatrix=False, kl=KL, keep_f16=False)
    assert lean.filesystems[0].needed == fs.needed
    # not registering: the work dir alone, f16 + logits + variants
    alone = gguf_run(shape, ["q4_k_m", "q8_0"], Places(tmp_path / "build"), imatrix=False, kl=KL)
    assert alone.filesystems[0].needed == pytest.approx(F16_7B + LOGITS_7B + Q4_K_M_7B + Q8_0_7B, rel=0.02)
    # memory: the converter holds ~3.5 x the largest bf16 tensor (the 152064 x 3584 embedding: 1.09 GB -> 3.8 GB);
    # llama-perplexity maps the f16 (15.2 GB) and holds one window of float logits (128 x 152064 x 4 = 78 MB)
    assert check.peak_resident.resident == pytest.approx(3.5 * 2 * 152064 * 3584, rel=0.01)
    assert check.peak_memory.total == pytest.approx(F16_7B + 128 * 152064 * 4, rel=0.02)


def test_an_earlier_runs_f16_is_already_on_the_disk(qwen7b: Path, tmp_path: Path) -> None:
    shape = source_shape(qwen7b)
    build = tmp_path / "build"
    build.mkdir()
    f16 = build / "qwen2.5-f16.gguf"
    fresh = gguf_run(shape, ["q4_k_m"], Places(build), imatrix=False, kl=KL, paths={"f16": f16})
    with open(f16, "wb") as fh:  # the finished f16 of a run that stopped at quantize (sparse)
        fh.truncate(2 * PARAMS_7B)
    resumed = gguf_run(shape, ["q4_k_m"], Places(build), imatrix=False, kl=KL, paths={"f16": f16})
    assert fresh.filesystems[0].needed - resumed.filesystems[0].needed == 2 * PARAMS_7B


def test_a_7b_run_on_small_disks_is_refused_with_both_figures(qwen7b: Path, tmp_path: Path, small_disk) -> None:
    work, repo = small_disk("40m"), small_disk("40m")
    places = Places(work / "build", repo / "artifacts", repo / ".dvc" / "cache")
    check = gguf_run(source_shape(qwen7b), ["q4_k_m", "q8_0"], places, imatrix=False, kl=KL, available_memory=1 << 40)
    assert len(check.filesystems) == 2 and not check.fits
    with pytest.raises(RunTooLarge) as err:
        require(check, what="qwen2.5: q4_k_m, q8_0")
    text = str(err.value)
    # the work dir's disk: f16 + logits + both variants = 28.3 GB = 26.3 GiB (+ a 2 MiB margin); 40 MiB free
    assert f"{(F16_7B + LOGITS_7B + Q4_K_M_7B + Q8_0_7B) / GIB:.1f} GiB" == "26.3 GiB"
    assert f"the work dir {work / 'build'} (peak at quantize and validate q8_0" in text
    assert "needs 26.3 GiB at its peak, 40.0 MiB free" in text
    # the repository's disk: artifacts/ copies both variants from the other disk (a hard link cannot cross it) and
    # the DVC cache links them = 12.75 GB = 11.9 GiB
    assert f"artifacts/ {repo / 'artifacts'} and the DVC cache {repo / '.dvc' / 'cache'}" in text
    assert "needs 11.9 GiB at its peak, 40.0 MiB free" in text
    assert "`--variants` (" in text and "q4_k_m 4.3 GiB, q8_0 7.5 GiB" in text
    assert "point MODELMINT_WORK_DIR at another disk (it takes 26.3 GiB there at its peak)" in text
    # the cache holds the same inodes as artifacts/ there: moving it would give nothing back
    assert "`dvc cache dir" not in text
    # the f16 is read until the last validation: dropping it after does not lower the work dir's peak here
    assert "do not keep the f16" not in text
    assert err.value.shortfalls[0][2] == 40 << 20


def test_one_small_disk_for_everything_counts_one_copy_and_offers_only_what_helps(qwen7b: Path, small_disk) -> None:
    disk = small_disk("40m")
    check = gguf_run(source_shape(qwen7b), ["q4_k_m", "q8_0"],
                     Places(disk / "build", disk / "artifacts", disk / ".dvc" / "cache"), imatrix=False, kl=KL,
                     available_memory=1 << 40)
    with pytest.raises(RunTooLarge) as err:
        require(check, what="qwen2.5: q4_k_m, q8_0")
    # f16 + logits + both variants, once: 28.3 GB = 26.3 GiB; the f16 is read until the last validation, and the
    # registered copies are links, so neither dropping the f16 nor moving the DVC cache lowers the peak
    assert "needs 26.3 GiB at its peak, 40.0 MiB free" in str(err.value)
    assert "do not keep the f16" not in str(err.value) and "dvc cache dir" not in str(err.value)
    assert "`--variants` (q4_k_m 4.3 GiB, q8_0 7.5 GiB)" in str(err.value)


def test_a_small_model_fits_a_small_disk(tmp_path: Path, small_disk) -> None:
    src = tmp_path / "tiny"
    write_sharded(src, _qwen_shapes(4, 256, 512, 4, 2, 2048), 2)  # 1.6 M parameters, 3.2 MB
    disk = small_disk("40m")
    check = gguf_run(source_shape(src), ["q4_k_m", "q8_0"],
                     Places(disk / "build", disk / "artifacts", disk / ".dvc" / "cache"), imatrix=True, kl=KL)
    assert require(check, what="tiny: q4_k_m, q8_0") is check  # real free space, real available memory


def test_memory_short_for_the_converter_is_refused(qwen7b: Path, tmp_path: Path) -> None:
    check = gguf_run(source_shape(qwen7b), ["q4_k_m"], Places(tmp_path / "build"), imatrix=False, kl=KL,
                     available_memory=2 * GIB, margin=0)
    assert not check.memory_fits
    with pytest.raises(RunTooLarge) as err:
        require(check, what="qwen2.5: q4_k_m")
    # 3.5 x 1.09 GB = 3.8 GB = 3.6 GiB for the converter
    assert "memory (convert): needs 3.6 GiB at its peak, 2.0 GiB free" in str(err.value)


def test_compressed_7b_needs_float32_memory_to_evaluate(qwen7b: Path, tmp_path: Path) -> None:
    shape = source_shape(qwen7b)
    check = compressed_run(shape, ["fp8", "awq"], Places(tmp_path / "build"), eval_ctx=256, eval_chunks=8,
                           available_memory=1 << 40)
    # fp8: the layers' 6.53 G parameters at 1 byte, the embedding, output and vectors (1.09 G) as bf16 = 8.70 GB;
    # awq: 4 bits plus a bf16 scale and a packed zero point per 128 = 3.42 GB + 2.18 GB = 5.60 GB
    layers = 28 * (233_057_792 - 4_608 - 7_168)
    kept = 2 * (PARAMS_7B - layers)
    assert check.variant_bytes["fp8"] == pytest.approx(layers + kept, rel=0.01)
    assert check.variant_bytes["awq"] == pytest.approx(layers * (0.5 + 3 / 128) + kept, rel=0.01)
    # the evaluation loads float32: 4 x 7.62 G = 30.5 GB, plus two sets of 8 x 256 x 152064 float log-probs (2.5 GB)
    assert check.peak_resident.resident == pytest.approx(4 * PARAMS_7B + 2 * 4 * 8 * 256 * 152064, rel=0.01)


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    files = write_sharded(tmp_path / "m", _qwen_shapes(4, 256, 512, 4, 2, 2048), 4)
    files[2].unlink()
    with pytest.raises(SourceError) as err:
        source_shape(tmp_path / "m")
    assert "lacks 1 of the 4 shards model.safetensors.index.json lists: model-00003-of-00004.safetensors" in str(err.value)
    assert "modelmint fetch" in str(err.value)


def test_a_missing_shard_without_an_index_is_named(tmp_path: Path) -> None:
    files = write_sharded(tmp_path / "m", _qwen_shapes(4, 256, 512, 4, 2, 2048), 4)
    (tmp_path / "m" / "model.safetensors.index.json").unlink()
    files[3].unlink()
    with pytest.raises(SourceError) as err:
        source_shape(tmp_path / "m")
    assert "lacks 1 of the 4 shards the other shards' names (-of-N) imply: model-00004-of-00004.safetensors" in str(err.value)


def test_a_truncated_shard_is_named(qwen7b: Path, tmp_path: Path) -> None:
    d = tmp_path / "cut"
    files = write_sharded(d, _qwen_shapes(28, 3584, 18944, 28, 4, 152064), 4)
    full = files[1].stat().st_size
    os.truncate(files[1], full // 2)  # a download cut off half-way
    with pytest.raises(SourceError) as err:
        source_shape(d)
    assert f"shard model-00002-of-00004.safetensors is truncated: its header declares {full:,} bytes" in str(err.value)
    assert f"the file holds {full // 2:,}" in str(err.value)


def _sparse_f16_gguf(path: Path, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
                     vocab: int) -> Path:
    """The f16 GGUF the converter would write for a Qwen2 shape: a real header (architecture, hyperparameters,
    a vocabulary of `vocab` tokens, every tensor's name, shape and type), the data section only a length."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(layers)
    w.add_context_length(32768)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(intermediate)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges(["t 1"])
    hf_to_gguf = {"model.embed_tokens": "token_embd", "lm_head": "output", "model.norm": "output_norm",
                  "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
                  "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                  "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    data = 0
    for name, shape in _qwen_shapes(layers, hidden, intermediate, heads, kv_heads, vocab):
        stem, _, kind = name.rpartition(".")
        if stem.startswith("model.layers."):
            i, _, part = stem.removeprefix("model.layers.").partition(".")
            stem = f"blk.{i}.{hf_to_gguf[part]}"
        else:
            stem = hf_to_gguf[stem]
        dtype = np.dtype(np.float32 if len(shape) == 1 else np.float16)
        n = math.prod(shape) * dtype.itemsize
        w.add_tensor_info(f"{stem}.{kind}", shape, dtype, n)
        data += n + (-n % w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    start = path.stat().st_size
    os.truncate(path, start + (-start % w.data_alignment) + data)
    return path


@pytest.mark.parametrize(("size", "shape"), [("7b", (28, 3584, 18944, 28, 4, 152064)),
                                             ("72b", (80, 8192, 29568, 64, 8, 152064))])
def test_variant_sizes_match_llama_quantize(size: str, shape: tuple[int, ...], tmp_path: Path,
                                            settings: Settings) -> None:
    """The f16's and each variant's predicted bytes against what the pinned llama-quantize reports for the same tensors
    (--dry-run: it picks every tensor's type and adds up the output, reading no weight).

    Measured: Q4_K_M 4460.45 MiB (7B) and 45213.44 MiB (72B: its 29568-column ffn_down cannot take 256-blocks and
    is stored as Q5_0 / Q8_0, 5.22 bits per weight in all, where the table's 4.89 alone would say 42,390 MiB);
    Q8_0 7717.68 and 73677.66 MiB."""
    src = tmp_path / "src"
    write_sharded(src, _qwen_shapes(*shape), 4)
    predicted = source_shape(src)
    f16 = _sparse_f16_gguf(tmp_path / f"{size}-f16.gguf", *shape)
    quantize = llama_cpp(settings).bin("llama-quantize")
    out = run([quantize, "--dry-run", f16, "Q8_0"])
    model = re.search(r"model size\s+=\s+([\d.]+) MiB", out.stdout + out.stderr)
    assert model, out.stderr[-2000:]
    assert gguf_f16_bytes(predicted) == pytest.approx(float(model[1]) * (1 << 20), rel=1e-5)  # 14526.27 MiB for 7B
    for q in ("q4_k_m", "q8_0"):
        out = run([quantize, "--dry-run", f16, q.upper()])
        reported = re.search(r"quant size\s+=\s+([\d.]+) MiB", out.stdout + out.stderr)
        assert reported, out.stderr[-2000:]
        assert gguf_quant_bytes(predicted, q) == pytest.approx(float(reported[1]) * (1 << 20), rel=0.02), q


# ---------------------------------------------------------------- the DVC remote and the OCI registry on this machine


def test_a_local_dvc_remote_and_registry_storage_each_count_one_copy_on_their_disk(qwen7b: Path, small_disk) -> None:
    """`dvc push` to a directory remote and a registry's blob upload each write the variants once more: on the
    work dir's disk they add to its peak (the f16 and the logits stay until the run has published), on a disk of
    their own they need room there."""
    disk = small_disk("40m")
    places = Places(disk / "build", disk / "artifacts", disk / ".dvc" / "cache", dvc_remote=disk / "remote",
                    oci_registry=disk / "registry" / "storage")
    check = gguf_run(source_shape(qwen7b), ["q4_k_m", "q8_0"], places, imatrix=False, kl=KL,
                     available_memory=1 << 40)
    (fs,) = check.filesystems
    # f16 + logits + both variants in the work dir (artifacts/ and the cache link them), once more in the remote
    # and once more in the registry: 15.23 + 0.31 + 3 x 12.75 = 53.8 GB = 50.1 GiB, at the last publication
    hand = F16_7B + LOGITS_7B + 3 * (Q4_K_M_7B + Q8_0_7B)
    assert fs.needed == pytest.approx(hand, rel=0.02)
    assert fs.peak_step == "publish q8_0"
    assert {loc for loc, _ in fs.locations} == {"work_dir", "artifacts", "dvc_cache", "dvc_remote", "oci_registry"}
    with pytest.raises(RunTooLarge) as err:
        require(check, what="qwen2.5: q4_k_m, q8_0")
    text = str(err.value)
    assert f"{hand / GIB:.1f} GiB" == "50.1 GiB" and "needs 50.1 GiB at its peak, 40.0 MiB free" in text
    assert f"the DVC remote {disk / 'remote'}" in err.value.hint or f"the DVC remote {disk / 'remote'}" in text
    assert "`dvc remote modify local url" in err.value.hint and "modelmint registry serve --dir" in err.value.hint
    # the scratch files are the runs' own to remove, after the publication: no setting to offer for them
    assert "do not keep the f16" not in text

    # the remote on a disk of its own: the variants once there, named with their way out
    work, remote = small_disk("40m"), small_disk("40m")
    apart = gguf_run(source_shape(qwen7b), ["q4_k_m", "q8_0"],
                     Places(work / "build", work / "artifacts", work / ".dvc" / "cache", dvc_remote=remote / "r"),
                     imatrix=False, kl=KL, available_memory=1 << 40)
    by_place = {fs.locations[0][0]: fs for fs in apart.filesystems}
    assert by_place["dvc_remote"].needed == pytest.approx(Q4_K_M_7B + Q8_0_7B, rel=0.02)
    assert by_place["dvc_remote"].peak_step == "register q8_0"
    assert by_place["work_dir"].needed == pytest.approx(F16_7B + LOGITS_7B + Q4_K_M_7B + Q8_0_7B, rel=0.02)
    with pytest.raises(RunTooLarge) as err:
        require(apart, what="qwen2.5: q4_k_m, q8_0")
    assert f"the DVC remote {remote / 'r'} (peak at register q8_0" in str(err.value)
    assert "needs 11.9 GiB at its peak, 40.0 MiB free" in str(err.value)


def test_where_a_run_writes_names_the_local_remote_and_a_local_registrys_storage(isolated: Path, tmp_path: Path) -> None:
    """registry_places reads the project's default DVC remote (a directory here) and finds the storage of a
    docker-registry served on this machine from its own configuration; a registry elsewhere is not counted."""
    from ociregistry import start_registry
    from registry_env import make_repo

    from pipelines.compose import registry_places
    from pipelines.publish.oci import RegistryRef

    repo = make_repo(tmp_path)
    settings = repo.settings()
    places = registry_places(settings)
    assert places.dvc_remote == repo.remote and places.oci_registry is None
    running = start_registry(tmp_path / "registry")
    try:
        published = registry_places(settings, oci=RegistryRef.parse(f"{running.host}/team", insecure=True))
    finally:
        running.stop()
    assert published.oci_registry == tmp_path / "registry" / "storage"
    elsewhere = registry_places(settings, oci=RegistryRef.parse("registry.example.com:5000/team"))
    assert elsewhere.oci_registry is None and elsewhere.dvc_remote == repo.remote
    # not pushing (track=False): no remote copy
    assert registry_places(settings, track=False).dvc_remote is None


@pytest.mark.slow
def test_convert_register_with_the_dvc_remote_on_a_small_disk_is_refused_before_any_work(
    isolated: Path, tmp_path: Path, small_disk
) -> None:
    """The real CLI on tiny-qwen2: a local DVC remote on a disk too small for the variant is named before any step
    runs, instead of the push filling it after the build and the validation."""
    import subprocess
    import sys

    from registry_env import dvc, make_repo

    from pipelines.core.settings import project_root

    repo = make_repo(tmp_path)
    disk = small_disk("8m")  # tiny-qwen2's q8_0 is tens of MB
    dvc(repo.root, "remote", "modify", "local", "url", str(disk))
    repo.commit_all("the DVC remote on a small disk")
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "convert", "tiny-qwen2", "--variants", "q8_0",
                           "--register"], env={**repo.env(), "COLUMNS": "200", "PYTHONPATH": str(project_root())},
                          capture_output=True, text=True,
                          cwd=repo.root)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not fit on this machine; nothing was started" in done.stderr, done.stderr
    assert f"the DVC remote {disk} (peak at register q8_0" in done.stderr
    assert "8.0 MiB free" in done.stderr and "dvc remote modify local url" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(repo.work.rglob("*.gguf")), "a step ran before the refusal"
    assert not list(disk.iterdir())
