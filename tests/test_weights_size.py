"""An artifact's size is its whole weight bytes: every shard of a sharded checkpoint and of a split GGUF, recorded at
registration (the manifest's `weights_bytes`), and what `modelmint list`, `show`, the model cards and the planner's
"smaller registered variant" read.

The main file alone is an index (model.safetensors.index.json) or a first shard: a 37 GiB checkpoint listed as
0.2 MiB, a 70B AWQ offered to the planner as 0.0 GiB. Here a real DVC repository registers a checkpoint of two
safetensors shards with its index, a GGUF split by the pinned llama-gguf-split into three shards, and one plain GGUF.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml
from registry_env import Repo, candidate, isolate, judged, make_repo, write_gguf

from pipelines.core.fsutil import sha256_file
from pipelines.core.report import parse_report
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.gguf.tools import split
from pipelines.registry.register import Candidate, artifact_dir, register
from pipelines.source.catalog import load_catalog
from pipelines.store.manifest import Manifest, ParentRef

MODELMINT = [sys.executable, "-m", "pipelines.cli"]
INDEX = "model.safetensors.index.json"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"  # as `modelmint list` shows a size


def _sharded_checkpoint(settings: Settings, out: Path, tag: str = "fp8", scheme: str = "FP8_DYNAMIC",
                        scale: int = 1) -> Candidate:
    """A compressed-tensors candidate (FP8 by default) as candidate_from_compressed hands a sharded checkpoint over:
    the index first (the main file), then the two shards it names and the other files."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True)
    rng = np.random.default_rng(1)
    shards = {"model-00001-of-00002.safetensors": ("model.embed_tokens.weight", 400_000 // scale),
              "model-00002-of-00002.safetensors": ("lm_head.weight", 250_000 // scale)}
    for name, (tensor, n) in shards.items():
        save_file({tensor: rng.standard_normal(n).astype(np.float32)}, str(out / name))
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": 4 * 650_000 // scale},
                                         "weight_map": {t: name for name, (t, _) in shards.items()}}))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "compressed-tensors"}}))
    (out / "tokenizer.json").write_text('{"version": "1.0"}')
    report = {"variant": tag, "scheme": scheme,
              "validation": judged(0.001, 99.0, ppl=(10.0, 10.1), fmt="compressed-tensors")}
    (out.parent / f"{tag}.report.json").write_text(json.dumps(report))
    files = tuple(out / n for n in (INDEX, *sorted(shards), "config.json", "tokenizer.json"))
    return Candidate(
        entry=load_catalog(settings.catalog_path).get("tiny-qwen2"), tag=tag, files=files,
        sha256=sha256_file(files[0]), size_bytes=files[0].stat().st_size,
        source={"kind": "generated", "repo": None, "revision": None, "content_sha256": "a" * 64}, parent=None,
        toolchain={"modelmint": "0.1.0", "llmcompressor": "0.14.0.1"},
        recipe={"format": "compressed-tensors", "recipe": {"scheme": scheme, "variant": tag}},
        report=parse_report(report), report_sha256=sha256_file(out.parent / f"{tag}.report.json"), root=out,
    )


def _split_gguf(settings: Settings, out: Path) -> Candidate:
    """A q4_k_m candidate as candidate_from_gguf hands a split GGUF over: the shards llama-gguf-split wrote, the
    first one the main file."""
    out.mkdir(parents=True)
    rng = np.random.default_rng(2)
    path = write_gguf(out / "tiny-qwen2-q4_k_m.gguf", name="synthetic-split", tensors={
        f"blk.{i}.ffn_up.weight": rng.standard_normal(200_000).astype(np.float32) for i in range(3)})
    shards = split(path, "1M", llama_cpp(settings))
    assert len(shards) == 3, shards  # three tensors of 0.76 MiB, at most 1 MiB a shard
    report = {"variant": "q4_k_m", "key": "0" * 64, "smoke": {"tokens_generated": 32},
              "validation": judged(0.0123, 93.5, ppl=(10.1, 10.5))}
    (out / "q4_k_m.report.json").write_text(json.dumps(report))
    return Candidate(
        entry=load_catalog(settings.catalog_path).get("tiny-qwen2"), tag="q4_k_m", files=tuple(shards),
        sha256=sha256_file(shards[0]), size_bytes=shards[0].stat().st_size,
        source={"kind": "generated", "repo": None, "revision": None, "content_sha256": "a" * 64},
        parent=ParentRef(artifact="tiny-qwen2:f16", file="tiny-qwen2-f16.gguf", sha256="b" * 64, size=123),
        toolchain={"modelmint": "0.1.0", "llama.cpp": "0c1e570"},
        recipe={"format": "gguf", "quant": "q4_k_m", "split_max_size": "1M"},
        report=parse_report(report), report_sha256=sha256_file(out / "q4_k_m.report.json"), source_dir=None,
    )


@dataclass
class Registered:
    repo: Repo
    settings: Settings
    checkpoint: Manifest
    split: Manifest
    plain: Manifest
    awq: Manifest
    """A second compressed-tensors variant, a quarter of the FP8's size."""
    shard_sizes: dict[str, list[int]]
    """tag -> the sizes of its weight files as built."""

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MODELMINT, *args], env={**self.repo.env(), "COLUMNS": "200"}, capture_output=True,
                              text=True, cwd=self.repo.root)


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registered]:
    base = tmp_path_factory.mktemp("sizes")
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        repo = make_repo(base, models={"tiny-qwen2": ["q4_k_m", "q8_0", "fp8", "awq"]})
        settings = repo.settings()
        ckpt, gg = _sharded_checkpoint(settings, base / "build" / "fp8"), _split_gguf(settings, base / "build" / "q4")
        plain = candidate(settings, base / "build", tag="q8_0", mib=0.5)
        awq = _sharded_checkpoint(settings, base / "build" / "awq", tag="awq", scheme="W4A16_ASYM", scale=4)
        sizes = {"fp8": [f.stat().st_size for f in ckpt.files if f.name.endswith(".safetensors")],
                 "awq": [f.stat().st_size for f in awq.files if f.name.endswith(".safetensors")],
                 "q4_k_m": [f.stat().st_size for f in gg.files], "q8_0": [plain.size_bytes]}
        yield Registered(repo, settings, register(settings, ckpt).manifest, register(settings, gg).manifest,
                         register(settings, plain).manifest, register(settings, awq).manifest, sizes)


def _card(reg: Registered, m: Manifest) -> tuple[dict[str, Any], str]:
    text = (artifact_dir(reg.settings, m.name, m.tag) / "README.md").read_text()
    _, head, body = text.split("---\n", 2)
    return yaml.safe_load(head), body


def test_a_sharded_checkpoint_records_every_shards_bytes(reg: Registered) -> None:
    m, shards = reg.checkpoint, reg.shard_sizes["fp8"]
    assert m.file == INDEX and m.size_bytes == next(f.size for f in m.files if f.path == INDEX) < 1000
    assert len(shards) == 2 and m.weights_bytes == sum(shards) > 2 << 20
    # not the index, the config, the tokenizer, the card, the serving plans
    assert sum(f.size for f in m.files) > m.weights_bytes
    assert json.loads((reg.settings.manifests_dir / "tiny-qwen2" / "fp8.json").read_text())["weights_bytes"] == sum(shards)


def test_a_split_gguf_records_every_shards_bytes(reg: Registered) -> None:
    m, shards = reg.split, reg.shard_sizes["q4_k_m"]
    assert m.file == "tiny-qwen2-q4_k_m-00001-of-00003.gguf" and m.size_bytes == shards[0]
    assert len(shards) == 3 and m.weights_bytes == sum(shards)
    assert sorted(f.path for f in m.files if f.path.endswith(".gguf")) == [
        f"tiny-qwen2-q4_k_m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert reg.plain.weights_bytes == reg.plain.size_bytes == reg.shard_sizes["q8_0"][0]  # one file: the same


def test_list_show_and_pull_give_the_whole_size(reg: Registered) -> None:
    listed = reg.cli("list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[1]: line for line in listed.stdout.splitlines() if "tiny-qwen2:" in line}
    for m in (reg.checkpoint, reg.split, reg.plain):
        assert _mib(m.weights_bytes) in rows[m.ref], rows[m.ref]
    assert _mib(reg.checkpoint.size_bytes) not in rows["tiny-qwen2:fp8"]  # the index's 0.0 MiB
    assert _mib(reg.split.size_bytes) not in rows["tiny-qwen2:q4_k_m"]  # the first shard's
    shown = reg.cli("show", "tiny-qwen2:fp8")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["weights_bytes"] == sum(reg.shard_sizes["fp8"]) and data["schema_version"] == 3
    pulled = reg.cli("pull", "tiny-qwen2:fp8")  # in place already: verified, and said with its size
    assert pulled.returncode == 0, pulled.stderr
    assert f"tiny-qwen2:fp8 ({_mib(reg.checkpoint.weights_bytes)}, sha256" in pulled.stdout


def test_the_model_cards_give_the_whole_size(reg: Registered) -> None:
    front, body = _card(reg, reg.checkpoint)
    assert front["modelmint"]["weights_bytes"] == reg.checkpoint.weights_bytes
    assert front["modelmint"]["shards"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert f"The weights are {_mib(reg.checkpoint.weights_bytes)} in 2 safetensors files." in body
    front, body = _card(reg, reg.split)
    card = front["modelmint"]
    assert card["file"] == reg.split.file and card["size_bytes"] == reg.split.size_bytes
    assert card["weights_bytes"] == reg.split.weights_bytes and len(card["shards"]) == 3
    assert f"The weights are {_mib(reg.split.weights_bytes)} in 3 GGUF files." in body
    front, body = _card(reg, reg.plain)
    assert front["modelmint"]["weights_bytes"] == reg.plain.weights_bytes and "shards" not in front["modelmint"]
    assert f"The weights are {_mib(reg.plain.weights_bytes)} in one GGUF file." in body


def test_the_planner_is_offered_the_other_variants_whole_sizes(reg: Registered,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`modelmint plan NAME:TAG` of a checkpoint hands vLLM's planner the model's other registered variants that vLLM
    serves, for its "smaller registered variant" suggestion: each with its whole weight bytes (every shard), and no
    GGUF (vLLM has no GGUF loader; a GGUF is planned by llama.cpp's memory model). The planner is stopped there, and
    the synthetic checkpoint asked for is not sized: it has no transformer shape."""
    from typer.testing import CliRunner

    from pipelines.cli import app
    from pipelines.publish import planner

    asked: list[planner.Ask] = []

    def stop(ask: planner.Ask, *a: Any, **kw: Any) -> list[Any]:
        asked.append(ask)
        raise SystemExit(0)

    monkeypatch.setattr(planner, "plan", stop)
    monkeypatch.setattr(planner, "served", lambda path: SimpleNamespace(weights_bytes=1, shape=None, fp8_weights=False))
    for k, v in reg.repo.env().items():
        monkeypatch.setenv(k, v)
    run = CliRunner().invoke(app, ["plan", "tiny-qwen2:fp8", "--gpus", "1xL4-24G"], env={"COLUMNS": "200"})
    assert len(asked) == 1, (run.exit_code, run.output, repr(run.exception))
    offered = {v.ref: v for v in asked[0].smaller}
    assert offered == {"tiny-qwen2:awq": planner.Variant("tiny-qwen2:awq", sum(reg.shard_sizes["awq"]), False)}
    assert reg.awq.weights_bytes == sum(reg.shard_sizes["awq"]) > 10 * reg.awq.size_bytes  # not the index's
