"""A compressed-tensors checkpoint as ModelPack, checked by a ModelPack consumer's rules (tests/modelpack_check.py:
model-spec's schema and media types, modctl's codec and file-path rules) and read back by skopeo.

The checkpoint is synthetic but laid out as a registered FP8 one is: the quantization_config llmcompressor writes,
a model card with its license, LICENSE, the vLLM serve config and the serving plans' files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import modelpack_check
import pytest
from ociregistry import RunningRegistry, start_registry

from pipelines.publish import modelpack
from pipelines.publish.oci import MODELMINT_MANIFEST, Blob, Image, OciClient, RegistryRef, is_carried_manifest

FP8_QUANT = {  # as llmcompressor 0.14 writes FP8_DYNAMIC (compressed-tensors 0.19)
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                              "dynamic": True}}},
}
AWQ_QUANT = {
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}}},
}


@dataclass(frozen=True)
class File:
    path: str
    sha256: str
    size: int


def _checkpoint(root: Path, quant: dict) -> list[File]:
    files = {
        "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
        "config.json": json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                                   "torch_dtype": "bfloat16", "quantization_config": quant}).encode(),
        "tokenizer.json": b'{"version": "1.0"}', "tokenizer_config.json": b"{}", "generation_config.json": b"{}",
        "recipe.yaml": b"default_stage: {}\n", "modelmint-recipe.yaml": b"scheme: FP8_DYNAMIC\n",
        "README.md": b"---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# tiny-qwen2:fp8\n",
        "LICENSE": b"Apache License\nVersion 2.0, January 2004\n",
        "vllm.yaml": b"dtype: auto\n",
        "serve/1x1xl4-24g/docker-run.sh": b"#!/bin/sh\nexec docker run vllm/vllm-openai\n",
        "serve/1x1xl4-24g/kubernetes.yaml": b"apiVersion: apps/v1\nkind: Deployment\n",
        "serve/plans.json": b"[]",
    }
    out = []
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        out.append(File(rel, hashlib.sha256(data).hexdigest(), len(data)))
    return out


def _image(tmp_path: Path, quant: dict = FP8_QUANT, tag: str = "fp8") -> tuple[Image, dict]:
    root = tmp_path / "ckpt"
    files = _checkpoint(root, quant)
    descriptor = {"createdAt": "2026-12-03T10:00:00Z", "name": "tiny-qwen2", "version": tag, "revision": None}
    image = modelpack.modelpack_image(root, files, descriptor, quantization=tag,
                                      extra=(Blob.of_bytes(MODELMINT_MANIFEST, b'{"name": "tiny-qwen2"}'),))
    assert image.config.data is not None
    return image, json.loads(image.config.data)


def test_an_fp8_checkpoint_is_a_conforming_modelpack_artifact(tmp_path: Path) -> None:
    image, config = _image(tmp_path)
    manifest = json.loads(image.manifest_bytes())
    assert modelpack_check.problems(manifest, config) == []
    by_path = {x["annotations"][modelpack.FILEPATH]: x["mediaType"] for x in manifest["layers"]}
    assert by_path["model.safetensors"] == modelpack.WEIGHT
    assert {by_path[p] for p in ("config.json", "tokenizer.json", "generation_config.json", "recipe.yaml")} == {
        modelpack.WEIGHT_CONFIG}
    assert {by_path[p] for p in ("LICENSE", "README.md", "vllm.yaml", "serve/1x1xl4-24g/kubernetes.yaml",
                                 "serve/plans.json")} == {modelpack.DOC}
    assert by_path["serve/1x1xl4-24g/docker-run.sh"] == modelpack.CODE
    # the carried modelmint manifest: a documentation layer modctl extracts, still found by modelmint's pull
    carried = [x for x in manifest["layers"] if is_carried_manifest(x)]
    assert len(carried) == 1 and carried[0]["mediaType"] == modelpack.DOC
    assert carried[0]["annotations"][modelpack.FILEPATH] == modelpack.CARRIED_MANIFEST_PATH
    assert config["config"] == {"architecture": "transformer", "format": "safetensors",
                                "precision": "bfloat16,float8_e4m3", "quantization": "fp8"}
    assert config["descriptor"]["family"] == "qwen2" and config["descriptor"]["licenses"] == ["Apache-2.0"]


def test_an_awq_checkpoint_says_its_compute_dtype_and_technique(tmp_path: Path) -> None:
    image, config = _image(tmp_path, AWQ_QUANT, "awq")
    assert modelpack_check.problems(json.loads(image.manifest_bytes()), config) == []
    assert config["config"]["precision"] == "bfloat16" and config["config"]["quantization"] == "awq"


def test_the_check_refuses_what_modctl_and_the_schema_refuse(tmp_path: Path) -> None:
    """The consumer's rules can fail: the layout modelmint published before (its manifest layer without a codec
    suffix or file path, precision naming the dtype only, an unknown config key) breaks them."""
    image, config = _image(tmp_path)
    manifest = json.loads(image.manifest_bytes())
    manifest["layers"][-1] = {"mediaType": MODELMINT_MANIFEST, "digest": manifest["layers"][-1]["digest"], "size": 1}
    config["config"]["precision"] = "fp8"
    config["config"]["bits"] = 8
    found = modelpack_check.problems(manifest, config)
    assert any("has no codec for modctl" in p for p in found), found
    assert any("precision 'fp8'" in p for p in found), found
    assert any("'bits' was unexpected" in p for p in found), found
    manifest = json.loads(image.manifest_bytes())
    manifest["layers"][0]["annotations"][modelpack.FILEPATH] = "../escape.safetensors"
    assert any("leaves the output directory" in p for p in modelpack_check.problems(manifest, json.loads(image.config.data or b"")))


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RunningRegistry]:
    reg = start_registry(tmp_path / "registry")
    try:
        yield reg
    finally:
        reg.stop()


@pytest.mark.skipif(shutil.which("skopeo") is None, reason="needs skopeo (bash toolchains/setup-registry.sh)")
def test_skopeo_reads_the_pushed_artifact_and_its_config(tmp_path: Path, registry: RunningRegistry) -> None:
    image, _ = _image(tmp_path)
    with OciClient(RegistryRef(registry.host, "modelmint", insecure=True)) as client:
        for blob in image.blobs:
            client.push_blob("modelmint/tiny-qwen2", blob)
        client.put_manifest("modelmint/tiny-qwen2", "fp8", image)
    where = f"docker://{registry.host}/modelmint/tiny-qwen2:fp8"
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", where], capture_output=True, timeout=60)
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == image.manifest_bytes()
    cfg = subprocess.run(["skopeo", "inspect", "--config", "--raw", "--tls-verify=false", where], capture_output=True,
                         timeout=60)
    assert cfg.returncode == 0, cfg.stderr
    assert cfg.stdout == image.config.data
