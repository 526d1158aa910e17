"""`modelmint publish` and `pull --from-registry` against a real distribution registry (Debian's docker-registry 2.8).

One tiny GGUF (q4_k_m) and one synthetic compressed-tensors checkpoint (fp8) are registered once for the module
into a real git + DVC project; one registry runs for the module on 127.0.0.1. Tests that need a clean namespace use
their own (the registry creates repositories on first push).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import modelpack_check
import numpy as np
import pytest
from ociregistry import RunningRegistry, TokenServer, make_tls, start_registry
from registry_env import ROOT, PopenCounter, Repo, candidate, free_port, isolate, judged, make_repo

from pipelines.core.errors import (
    ArtifactError,
    ConfigError,
    ManifestInvalid,
    NotRegistered,
    OciAuthRefused,
    OciBlobMismatch,
    OciError,
    OciUnavailable,
    RegistryError,
    TagConflict,
)
from pipelines.core.fsutil import sha256_file
from pipelines.core.report import parse_report
from pipelines.core.settings import Settings
from pipelines.oci.images import (
    build_image,
    pinned_tag,
    publish_image,
    pull_image,
)
from pipelines.publish import modelpack, ollama_image
from pipelines.publish.oci import MODELMINT_MANIFEST, Blob, OciClient, RegistryRef, is_carried_manifest
from pipelines.registry.register import Candidate, register
from pipelines.source.catalog import load_catalog
from pipelines.store.formats import FORMATS
from pipelines.store.manifest import Manifest, manifest_path
from pipelines.store.published import publications, publications_path

MODELMINT = [sys.executable, "-m", "pipelines.cli"]
FORMAT = json.loads((ROOT / "tests" / "data" / "ollama_image_format.json").read_text())


@dataclass
class Env:
    repo: Repo
    settings: Settings
    gguf: Manifest
    fp8: Manifest
    registry: RunningRegistry

    def ref(self, namespace: str) -> RegistryRef:
        return RegistryRef(self.registry.host, namespace, insecure=True)

    def client(self, namespace: str = "modelmint") -> OciClient:
        return OciClient(self.ref(namespace))

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MODELMINT, *args], env={**self.repo.env(), "COLUMNS": "200", **env},
                              capture_output=True, text=True, cwd=self.repo.root)


def _checkpoint(settings: Settings, out: Path) -> Candidate:
    """A compressed-tensors candidate as a validated build hands it over (tiny synthetic weights, real layout)."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True)
    save_file({"model.embed_tokens.weight": np.arange(4096, dtype=np.float32).reshape(64, 64)},
              str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "compressed-tensors"}}))
    (out / "tokenizer.json").write_text('{"version": "1.0"}')
    report = {"variant": "fp8", "scheme": "FP8_DYNAMIC",
              "validation": judged(0.001, 99.0, ppl=(10.0, 10.1), fmt="compressed-tensors")}
    (out.parent / "fp8.report.json").write_text(json.dumps(report))
    files = tuple(out / n for n in ("model.safetensors", "config.json", "tokenizer.json"))
    return Candidate(
        entry=load_catalog(settings.catalog_path).get("tiny-qwen2"), tag="fp8", files=files,
        sha256=sha256_file(files[0]), size_bytes=files[0].stat().st_size,
        source={"kind": "generated", "repo": None, "revision": None, "content_sha256": "a" * 64}, parent=None,
        toolchain={"modelmint": "0.1.0", "llmcompressor": "0.14.0.1"},
        recipe={"format": "compressed-tensors", "recipe": {"scheme": "FP8_DYNAMIC"}}, report=parse_report(report),
        report_sha256=sha256_file(out.parent / "fp8.report.json"), root=out,
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("oci")
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        repo = make_repo(base, models={"tiny-qwen2": ["q4_k_m", "fp8"]})
        settings = repo.settings()
        gguf = register(settings, candidate(settings, base / "build")).manifest
        fp8 = register(settings, _checkpoint(settings, base / "build" / "fp8")).manifest
        repo.commit_all("register tiny-qwen2:q4_k_m and tiny-qwen2:fp8")
        registry = start_registry(base / "registry")
        try:
            yield Env(repo, settings, gguf, fp8, registry)
        finally:
            registry.stop()


def _pushed(env: Env, namespace: str, tag: str, name: str = "tiny-qwen2") -> dict[str, Any]:
    with env.client(namespace) as c:
        got = c.get_manifest(f"{namespace}/{name}", tag)
    assert got is not None, f"{namespace}/{name}:{tag} is not in the registry"
    return json.loads(got[0])


def test_the_pinned_tag_names_the_upstream_commit_or_the_source_content(env: Env) -> None:
    """TAG-<source12> comes from the manifest alone (a flow run commits nothing): the hub commit a user finds
    upstream, or for a source without one (this generated model) the source's content hash."""
    assert pinned_tag(env.gguf) == "q4_k_m-" + "a" * 12 == f"q4_k_m-{env.gguf.source.content_sha256[:12]}"
    hub = env.gguf.model_copy(update={"source": env.gguf.source.model_copy(update={
        "kind": "hub", "repo": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "7ae557604adf67be50417f59c2c2f167def9a775"})})
    assert pinned_tag(hub) == "q4_k_m-7ae557604adf"


# ---------------------------------------------------------------- Ollama's format, from its source


def test_ollama_numbers_and_file_types_as_ollama_prints_them() -> None:
    for n, shown in FORMAT["human_number"].items():
        assert ollama_image.human_number(int(n)) == shown, n
    for llama, shown in FORMAT["file_type"].items():
        assert ollama_image.ollama_file_type(None if llama == "none" else llama.removeprefix("MOSTLY_")) == shown


def test_params_are_typed_as_ollama_options() -> None:
    from pipelines.chat.modelfile import Modelfile, Parameter

    mf = Modelfile(from_="./m.gguf", parameters=(
        Parameter("stop", "<|im_end|>"), Parameter("stop", "a&b"), Parameter("num_ctx", 8192),
        Parameter("temperature", 0.7), Parameter("top_p", 0.8), Parameter("repeat_penalty", 1.05),
        Parameter("use_mmap", True)))
    raw = ollama_image.params_json(mf)
    assert raw == (b'{"num_ctx":8192,"repeat_penalty":1.05,"stop":["\\u003c|im_end|\\u003e","a\\u0026b"],'
                   b'"temperature":0.7,"top_p":0.8,"use_mmap":true}\n')
    kinds = FORMAT["params"]
    for key, value in json.loads(raw).items():
        kind = next(k for k in ("float32", "int", "bool", "string_list") if key in kinds[k])
        assert isinstance(value, {"float32": float, "int": int, "bool": bool, "string_list": list}[kind])


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (bash toolchains/setup-go.sh)")
def test_go_json_is_what_go_writes(tmp_path: Path) -> None:
    """The same values through Go's own encoding/json (a program written here, not Ollama's code)."""
    (tmp_path / "main.go").write_text(
        'package main\nimport ("encoding/json"; "os")\nfunc main() {\n'
        ' e := json.NewEncoder(os.Stdout)\n'
        ' e.Encode(map[string]any{"t": float32(0.7), "p": float32(1.05), "z": float32(1e-7), "big": float32(3e21),'
        ' "one": float32(1), "n": int64(8192), "s": []string{"<|im_end|>", "a&b", "\\u2028é\\t"}})\n'
        ' e.Encode([]float64{0.1, 1e-7, 1e21, 123456789})\n}\n')
    (tmp_path / "go.mod").write_text("module gojsoncheck\ngo 1.19\n")
    go = subprocess.run(["go", "run", "."], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                        env={"HOME": str(tmp_path), "GOCACHE": str(tmp_path / "cache"), "GOFLAGS": "-mod=mod",
                             "PATH": str(Path(shutil.which("go")).parent)})
    assert go.returncode == 0, go.stderr
    f32 = ollama_image._Float32
    ours = [
        ollama_image.go_json(dict(sorted({"t": f32(0.7), "p": f32(1.05), "z": f32(1e-7), "big": f32(3e21),
                                          "one": f32(1), "n": 8192, "s": ["<|im_end|>", "a&b", "\u2028é\t"]}.items()))),
        ollama_image.go_json([0.1, 1e-7, 1e21, 123456789.0]),
    ]
    assert go.stdout.splitlines() == ours


def test_a_modelfile_whose_from_is_not_the_artifact_is_refused(env: Env, tmp_path: Path) -> None:
    d = env.settings.repo_dir / env.gguf.dvc.path
    (tmp_path / "Modelfile").write_text((d / "Modelfile").read_text().replace(
        f"FROM ./{env.gguf.file}", "FROM ./another.gguf"))
    with pytest.raises(ArtifactError, match=r"FROM \./another\.gguf"):
        ollama_image.ollama_image(d / env.gguf.file, env.gguf.sha256, tmp_path / "Modelfile")


def test_registry_and_image_references_are_checked_at_the_edge() -> None:
    from pipelines.publish.oci import parse_image

    assert RegistryRef.parse("https://registry.internal:5000/modelmint/").image("qwen2.5", "q4_k_m") == (
        "registry.internal:5000/modelmint/qwen2.5:q4_k_m")
    for bad in ("registry.internal", "registry.internal/a/b", "registry.internal/mod.elmint", "Registry/x"):
        with pytest.raises(ConfigError, match="HOST"):
            RegistryRef.parse(bad)
    registry, name, tag = parse_image("127.0.0.1:5000/modelmint/qwen2.5:q4_k_m-0123456789ab", insecure=True)
    assert (registry.url, registry.namespace, name, tag) == ("http://127.0.0.1:5000", "modelmint", "qwen2.5",
                                                            "q4_k_m-0123456789ab")
    with pytest.raises(ConfigError, match="HOST/NAMESPACE/NAME:TAG"):
        parse_image("modelmint/qwen2.5")


def test_registry_credentials_stay_out_of_reprs_cache_keys_and_stored_settings() -> None:
    from pipelines.source.catalog import load_catalog
    from pipelines.store.formats import implementation

    s = Settings.from_env({"MODELMINT_REGISTRY_USERNAME": "team", "MODELMINT_REGISTRY_PASSWORD": "s3cret-pw",
                           "HF_TOKEN": "hf_secret", "MODELMINT_WEBHOOK_SECRET": "wh-s3cret"})
    assert s.registry_password == "s3cret-pw" and "s3cret-pw" not in repr(s)
    said = json.dumps(s.plan_fields())  # what the fetch step's cache key hashes of the settings
    assert not any(secret in said for secret in ("s3cret-pw", "team", "hf_secret", "wh-s3cret"))
    # the fetch step's key is the same with or without credentials: none of them is part of it
    entry = load_catalog(s.catalog_path).get("tiny-qwen2")
    keys = {implementation("gguf").fetch_step(entry, settings).key({}) for settings in (s, s.without_secrets())}
    assert len(keys) == 1
    stored = s.without_secrets()
    assert (stored.hf_token, stored.registry_username, stored.registry_password) == (None, None, None)
    # the webhook's shared secret too: a stored plan (the fetch step's cached result) must not carry it
    assert stored.webhook_secret is None
    assert stored.repo_dir == s.repo_dir


def test_the_format_table_recognises_the_layouts_it_pushes() -> None:
    assert FORMATS["gguf"].image_config == ollama_image.CONFIG
    assert FORMATS["compressed-tensors"].image_config == modelpack.CONFIG


# ---------------------------------------------------------------- a GGUF as an Ollama image


def test_publish_pushes_an_ollama_image_whose_digests_are_the_manifests(env: Env) -> None:
    m = env.gguf
    done = env.cli("publish", m.ref, "--registry", f"{env.registry.host}/modelmint", "--insecure")
    assert done.returncode == 0, done.stderr
    pinned = pinned_tag(m)
    image = f"{env.registry.host}/modelmint/tiny-qwen2:q4_k_m"
    assert f"{env.registry.host}/modelmint/tiny-qwen2:{pinned}" in done.stdout
    assert f"ollama pull --insecure {image}" in done.stdout

    pushed = _pushed(env, "modelmint", "q4_k_m")
    assert pushed == _pushed(env, "modelmint", pinned)
    with env.client() as c:
        digest = c.get_manifest("modelmint/tiny-qwen2", "q4_k_m")[2]  # type: ignore[index]
    listed = env.cli("list", COLUMNS="300")
    assert listed.returncode == 0 and f"{image} +:{pinned} ({digest[7:19]})" in listed.stdout, listed.stdout
    shown = env.cli("show", m.ref)
    assert json.loads(shown.stdout)["sha256"] == m.sha256 and f"published: {image}" in shown.stderr
    record = json.loads((env.repo.root / "registry/published/tiny-qwen2/q4_k_m.json").read_text())
    assert [(r["registry"], r["repository"], r["tags"], r["digest"], r["key"]) for r in record] == [
        (env.registry.host, "modelmint/tiny-qwen2", [pinned, "q4_k_m"], digest, m.key)]
    assert list(pushed) == FORMAT["manifest"]["keys"]
    assert pushed["mediaType"] == FORMAT["manifest"]["mediaType"] and pushed["schemaVersion"] == 2
    assert pushed["config"]["mediaType"] == FORMAT["config"]["mediaType"]
    kinds = [x["mediaType"] for x in pushed["layers"]]
    ollama_kinds = [k for k in kinds if k.startswith("application/vnd.ollama.image.")]
    order = [FORMAT["layers"][k] for k in FORMAT["layer_order"]]
    assert ollama_kinds == sorted(ollama_kinds, key=order.index)
    assert ollama_kinds[:2] == [FORMAT["layers"]["model"], FORMAT["layers"]["template"]]
    assert FORMAT["layers"]["params"] in kinds and MODELMINT_MANIFEST in kinds
    assert kinds.index(MODELMINT_MANIFEST) > max(kinds.index(k) for k in ollama_kinds)

    # every layer read back through the API: its bytes hash to its digest; registered files are byte-identical
    d = env.settings.repo_dir / m.dvc.path
    registered = {"sha256:" + f.sha256: d / f.path for f in m.files}
    assert pushed["layers"][0]["digest"] == "sha256:" + m.sha256
    blobs: dict[str, bytes] = {}
    with env.client() as c:
        for x in [*pushed["layers"], pushed["config"]]:
            assert set(FORMAT["descriptor"]["required"]) <= set(x)
            data = c.read_blob("modelmint/tiny-qwen2", x["digest"])
            assert len(data) == x["size"] and "sha256:" + hashlib.sha256(data).hexdigest() == x["digest"]
            blobs[x["mediaType"]] = data
            if x["digest"] in registered:
                assert data == registered[x["digest"]].read_bytes()
    assert set(registered) <= {x["digest"] for x in pushed["layers"]}
    assert blobs[MODELMINT_MANIFEST] == manifest_path(env.settings, m.name, m.tag).read_bytes()

    from pipelines.chat.modelfile import Modelfile

    mf = Modelfile.parse((d / "Modelfile").read_text())
    assert blobs[FORMAT["layers"]["template"]].decode() == mf.template
    params = json.loads(blobs[FORMAT["layers"]["params"]])
    assert params["stop"] == mf.parameter("stop") and params["num_ctx"] == mf.parameter("num_ctx")[0]
    config_raw = blobs[FORMAT["config"]["mediaType"]]
    config = json.loads(config_raw)
    assert config_raw.endswith(b"}\n") and list(config) == FORMAT["config"]["keys_in_order"]
    assert {k: config[k] for k in FORMAT["config"]["constant"]} == FORMAT["config"]["constant"]
    assert config["model_family"] == "qwen2" and config["model_families"] == ["qwen2"]
    assert config["file_type"] == "unknown" and config["model_type"] == "66K"  # 65,536 float32 elements


def test_a_second_publish_uploads_no_blob(env: Env) -> None:
    where = env.ref("again")
    first = publish_image(env.settings, env.gguf.ref, where)
    assert first.uploaded + first.mounted and not first.present
    posts, puts = len(env.registry.requests("POST")), len(env.registry.requests("PUT"))
    stamps = {p: p.stat().st_mtime_ns for p in env.registry.storage.joinpath("blobs").rglob("data")}
    record = publications_path(env.settings, "tiny-qwen2", "q4_k_m")
    recorded = record.stat().st_mtime_ns
    second = publish_image(env.settings, env.gguf.ref, where)
    assert second.uploaded == second.mounted == [] and sorted(second.present) == sorted(first.uploaded + first.mounted)
    assert second.digest == first.digest and len(first.tagged) == 2 and second.tagged == []
    # the registry's own log: no upload started, no tag written again (both point at the image already)
    assert len(env.registry.requests("POST")) == posts
    assert len(env.registry.requests("PUT")) == puts
    assert {p: p.stat().st_mtime_ns for p in env.registry.storage.joinpath("blobs").rglob("data")} == stamps
    assert record.stat().st_mtime_ns == recorded  # the publication record is not rewritten either


def test_a_blob_in_another_repository_of_the_registry_is_mounted_not_sent(env: Env) -> None:
    publish_image(env.settings, env.gguf.ref, env.ref("mount-from"))  # (mounted from earlier tests' or uploaded)
    puts = len(env.registry.requests("PUT"))
    done = publish_image(env.settings, env.gguf.ref, env.ref("mount-to"))
    _, image = build_image(env.settings, env.gguf.ref)
    assert done.uploaded == done.present == [] and sorted(done.mounted) == sorted(b.digest for b in image.blobs)
    mounts = [ln for ln in env.registry.requests("POST") if "/v2/mount-to/tiny-qwen2/blobs/uploads/?" in ln]
    assert len(mounts) == len(image.blobs) and all("mount=sha256" in ln for ln in mounts)
    assert len(env.registry.requests("PUT")) == puts + 2  # the two tags, no blob bytes
    assert _pushed(env, "mount-to", "q4_k_m")["layers"][0]["digest"] == "sha256:" + env.gguf.sha256


def test_pull_from_the_registry_without_dvc(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    publish_image(env.settings, env.gguf.ref, env.ref("nodvc"))
    started = PopenCounter(monkeypatch)
    elsewhere = Settings.from_env({"MODELMINT_HOME": str(tmp_path / "home"), "MODELMINT_REPO": str(tmp_path / "no-repo")})
    dest = tmp_path / "pulled"
    got = pull_image(elsewhere, f"{env.registry.host}/nodvc/tiny-qwen2:q4_k_m", insecure=True, dest=dest, ollama=False)
    assert got.fetched and got.manifest == env.gguf
    d = env.settings.repo_dir / env.gguf.dvc.path
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == sorted(
        f.path for f in env.gguf.files)  # serve/plans.json included: a registered artifact's files, nested too
    for f in env.gguf.files:
        assert (dest / f.path).read_bytes() == (d / f.path).read_bytes()
    assert got.commands[0][:2] == ["ollama", "create"]
    again = pull_image(elsewhere, f"{env.registry.host}/nodvc/tiny-qwen2:q4_k_m", insecure=True, dest=dest,
                       ollama=False)
    assert not again.fetched
    assert started.argv == []  # no DVC, no git: a machine with neither pulls the same bytes


def test_a_tampered_blob_in_the_registry_is_caught_on_pull(env: Env, tmp_path: Path) -> None:
    publish_image(env.settings, env.gguf.ref, env.ref("tamper"))
    data = env.registry.blob_data("sha256:" + env.gguf.sha256)
    original = data.read_bytes()
    dest = tmp_path / "pulled"
    dest.mkdir()
    (dest / "kept").write_text("what was here before")
    try:
        data.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))  # same size, one byte flipped
        with pytest.raises(OciBlobMismatch, match=env.gguf.sha256) as caught:
            pull_image(env.settings, f"{env.registry.host}/tamper/tiny-qwen2:q4_k_m", insecure=True, dest=dest,
                       ollama=False)
        assert "delete the blob" in (caught.value.hint or "")
        assert [p.name for p in dest.iterdir()] == ["kept"]
        assert not list(tmp_path.glob("pulled.partial*"))
    finally:
        data.write_bytes(original)


def test_a_moved_tag_is_refused_on_pull_before_any_blob_is_fetched(env: Env, tmp_path: Path) -> None:
    """Issue 25 item 2: q4_k_m moved to the fp8 image; the pull must not install tiny-qwen2:fp8 as q4_k_m."""
    publish_image(env.settings, env.fp8.ref, env.ref("moved"))
    with env.client("moved") as c:
        there = c.get_manifest("moved/tiny-qwen2", "fp8")
        assert there is not None
        c._send("PUT", "/v2/moved/tiny-qwen2/manifests/q4_k_m", content=there[0],
                headers={"Content-Type": there[1]}).raise_for_status()
    elsewhere = Settings.from_env({"MODELMINT_HOME": str(tmp_path / "home"), "MODELMINT_REPO": str(tmp_path / "none")})
    blob_gets = len(env.registry.requests("GET"))
    for settings in (elsewhere, env.settings):  # without a checkout, and in one that registers both
        with pytest.raises(RegistryError, match=r"moved/tiny-qwen2:q4_k_m holds tiny-qwen2:fp8") as caught:
            pull_image(settings, f"{env.registry.host}/moved/tiny-qwen2:q4_k_m", insecure=True,
                       dest=tmp_path / "pulled", ollama=False)
        assert "--force" in (caught.value.hint or "")
    weights = {"sha256:" + f.sha256 for f in env.fp8.files}
    fetched = [ln for ln in env.registry.requests("GET")[blob_gets:] if any(d in ln for d in weights)]
    assert fetched == [] and not (tmp_path / "pulled").exists()
    ok = pull_image(elsewhere, f"{env.registry.host}/moved/tiny-qwen2:{pinned_tag(env.fp8)}", insecure=True,
                    dest=tmp_path / "by-pin", ollama=False)
    assert ok.manifest == env.fp8  # its own pinned tag still pulls


# ---------------------------------------------------------------- a checkpoint as a ModelPack artifact


def test_a_checkpoint_is_pushed_as_a_modelpack_artifact_and_pulled_back(env: Env, tmp_path: Path) -> None:
    m = env.fp8
    done = env.cli("publish", m.ref, "--registry", f"{env.registry.host}/modelmint", "--insecure")
    assert done.returncode == 0, done.stderr
    assert f"modelmint pull tiny-qwen2:fp8 --from-registry {env.registry.host}/modelmint --insecure" in done.stdout
    pushed = _pushed(env, "modelmint", "fp8")
    assert pushed["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert pushed["artifactType"] == modelpack.ARTIFACT_TYPE and pushed["config"]["mediaType"] == modelpack.CONFIG
    by_path = {x["annotations"][modelpack.FILEPATH]: x for x in pushed["layers"] if not is_carried_manifest(x)}
    assert set(by_path) == {f.path for f in m.files}
    for f in m.files:
        assert by_path[f.path]["digest"] == "sha256:" + f.sha256 and by_path[f.path]["size"] == f.size
    assert by_path["model.safetensors"]["mediaType"] == modelpack.WEIGHT
    assert by_path["config.json"]["mediaType"] == modelpack.WEIGHT_CONFIG
    assert by_path["vllm.yaml"]["mediaType"] == modelpack.DOC
    assert pushed["layers"][0]["mediaType"] == modelpack.WEIGHT
    with env.client() as c:
        config = json.loads(c.read_blob("modelmint/tiny-qwen2", pushed["config"]["digest"]))
    assert config["modelfs"] == {"type": "layers", "diffIds": [x["digest"] for x in pushed["layers"]]}
    assert config["config"]["format"] == "safetensors" and config["descriptor"]["name"] == "tiny-qwen2"
    assert modelpack_check.problems(pushed, config) == []  # model-spec's schema and modctl's extract rules

    dest = tmp_path / "fp8"
    pulled = env.cli("pull", m.ref, "--from-registry", f"{env.registry.host}/modelmint", "--insecure",
                     "--dest", str(dest))
    assert pulled.returncode == 0, pulled.stderr
    assert "fetched from" in pulled.stdout and "vllm serve" in pulled.stdout
    d = env.settings.repo_dir / m.dvc.path
    for f in m.files:
        assert (dest / f.path).read_bytes() == (d / f.path).read_bytes()


# ---------------------------------------------------------------- bad input


def test_a_tag_pointing_at_other_bytes_is_refused_unless_forced(env: Env) -> None:
    where = env.ref("conflict")
    publish_image(env.settings, env.fp8.ref, where)
    with env.client("conflict") as c:  # point q4_k_m at the fp8 image (its blobs are in the repository)
        there = c.get_manifest("conflict/tiny-qwen2", "fp8")
        assert there is not None
        c._send("PUT", "/v2/conflict/tiny-qwen2/manifests/q4_k_m", content=there[0],
                headers={"Content-Type": there[1]}).raise_for_status()
    before = len(env.registry.requests("POST"))
    with pytest.raises(TagConflict, match=r"q4_k_m already points at sha256:\w+ \(tiny-qwen2:fp8, model.safetensors"):
        publish_image(env.settings, env.gguf.ref, where)
    assert len(env.registry.requests("POST")) == before  # refused before any upload
    refused = env.cli("publish", env.gguf.ref, "--registry", f"{env.registry.host}/conflict", "--insecure")
    assert refused.returncode == 1 and "--force" in refused.stderr and "tiny-qwen2:fp8" in refused.stderr
    forced = publish_image(env.settings, env.gguf.ref, where, force=True)
    assert forced.retagged == {"q4_k_m": there[2]}
    assert _pushed(env, "conflict", "q4_k_m")["layers"][0]["digest"] == "sha256:" + env.gguf.sha256


def test_a_new_registration_moves_the_tags_and_an_older_checkout_cannot_move_them_back(
    env: Env, tmp_path: Path
) -> None:
    """Two checkouts register tiny-qwen2:q4_k_m (other bytes, the same source: the same pinned tag). The newer
    registration's image holds the tags; the older checkout is refused (it would roll the tag back) until it
    registers anew, whose publish moves both tags and leaves the earlier image pullable by its digest."""
    where = env.ref("versions")
    old, new = make_repo(tmp_path / "old"), make_repo(tmp_path / "new")
    first = register(old.settings(), candidate(old.settings(), tmp_path / "old-build", seed=1)).manifest
    publish_image(old.settings(), first.ref, env.ref("versions-old"))
    newer = register(new.settings(), candidate(new.settings(), tmp_path / "new-build", seed=2)).manifest
    assert pinned_tag(first) == pinned_tag(newer) and first.sha256 != newer.sha256
    there = publish_image(new.settings(), newer.ref, where)
    with pytest.raises(TagConflict, match=r"newer|tiny-qwen2:q4_k_m") as caught:
        publish_image(old.settings(), first.ref, where)
    assert "git pull" in (caught.value.hint or "") and "--force" in (caught.value.hint or "")
    assert _pushed(env, "versions", "q4_k_m")["layers"][0]["digest"] == "sha256:" + newer.sha256

    latest = register(old.settings(), candidate(old.settings(), tmp_path / "old-build-2", seed=3)).manifest
    assert latest.replaces is not None and latest.replaces.sha256 == first.sha256
    moved = publish_image(old.settings(), latest.ref, where)
    assert moved.retagged == {pinned_tag(latest): there.digest, "q4_k_m": there.digest}
    for tag in (pinned_tag(latest), "q4_k_m"):
        assert _pushed(env, "versions", tag)["layers"][0]["digest"] == "sha256:" + latest.sha256
    with env.client("versions") as c:
        assert c.get_manifest("versions/tiny-qwen2", there.digest) is not None  # still pullable by digest
    # the record keeps the earlier registration's entry; what is listed is this registration's
    record = json.loads(publications_path(old.settings(), "tiny-qwen2", "q4_k_m").read_text())
    assert sorted(e["key"] for e in record) == sorted([first.key, latest.key])
    assert [e["image"] for e in publications(old.settings(), latest)] == [f"{env.registry.host}/versions/tiny-qwen2:q4_k_m"]


def test_a_registry_that_is_down(env: Env) -> None:
    down = RegistryRef(f"127.0.0.1:{free_port()}", "modelmint", insecure=True)
    with pytest.raises(OciUnavailable, match="cannot be reached") as caught:
        publish_image(env.settings, env.gguf.ref, down)
    assert "--insecure" in (caught.value.hint or "")
    shown = env.cli("publish", env.gguf.ref, "--registry", f"{down.host}/modelmint", "--insecure")
    assert shown.returncode == 1 and "cannot be reached" in shown.stderr and "Traceback" not in shown.stderr


def test_never_registered_or_not_passed_is_never_published(env: Env) -> None:
    with pytest.raises(NotRegistered):
        publish_image(env.settings, "tiny-qwen2:q8_0", env.ref("modelmint"))
    path = manifest_path(env.settings, "tiny-qwen2", "q4_k_m")
    original = path.read_text()
    try:
        data = json.loads(original)
        data["validation"]["passed"] = False
        path.write_text(json.dumps(data))
        with pytest.raises(ManifestInvalid, match=r"validation\.passed"):
            publish_image(env.settings, env.gguf.ref, env.ref("failed"))
    finally:
        path.write_text(original)
    with env.client("failed") as c:
        assert c.get_manifest("failed/tiny-qwen2", "q4_k_m") is None


def test_a_blob_the_registry_refuses_stops_before_any_tag(env: Env) -> None:
    """Bytes that are not their digest: the registry refuses the upload, the error says so, nothing is tagged."""
    bad = Blob(ollama_image.MODEL, "sha256:" + "0" * 64, 3, data=b"abc")
    with env.client("halfway") as c:
        with pytest.raises(OciError, match="DIGEST_INVALID") as caught:
            c.push_blob("halfway/tiny-qwen2", bad)
        assert "nothing was tagged" in (caught.value.hint or "")
        assert c.get_manifest("halfway/tiny-qwen2", "q4_k_m") is None


# ---------------------------------------------------------------- auth


def _htpasswd(path: Path, user: str, password: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # bcrypt through the C library: distribution's htpasswd accepts bcrypt only

        path.write_text(f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")


def test_htpasswd_basic_auth_from_the_environment_and_the_docker_config(env: Env, tmp_path: Path) -> None:
    import base64

    _htpasswd(tmp_path / "htpasswd", "team", "s3cret-pw")
    locked = start_registry(tmp_path / "locked", auth=tmp_path / "htpasswd")
    try:
        where = RegistryRef(locked.host, "modelmint", insecure=True)
        with pytest.raises(OciAuthRefused) as caught:
            publish_image(env.settings, env.gguf.ref, where)
        assert "MODELMINT_REGISTRY_USERNAME" in (caught.value.hint or "")
        wrong = env.repo.settings(MODELMINT_REGISTRY_USERNAME="team", MODELMINT_REGISTRY_PASSWORD="nope")
        with pytest.raises(OciAuthRefused):
            publish_image(wrong, env.gguf.ref, where)
        done = env.cli("publish", env.gguf.ref, "--registry", f"{locked.host}/modelmint", "--insecure",
                       MODELMINT_REGISTRY_USERNAME="team", MODELMINT_REGISTRY_PASSWORD="s3cret-pw")
        assert done.returncode == 0, done.stderr
        assert "s3cret-pw" not in done.stdout + done.stderr
        docker = tmp_path / "docker"
        docker.mkdir()
        (docker / "config.json").write_text(json.dumps(
            {"auths": {locked.host: {"auth": base64.b64encode(b"team:s3cret-pw").decode()}}}))
        got = pull_image(env.repo.settings(DOCKER_CONFIG=docker), f"{locked.host}/modelmint/tiny-qwen2:q4_k_m",
                         insecure=True, dest=tmp_path / "pulled", ollama=False)
        assert got.fetched
        assert "s3cret-pw" not in locked.log.read_text()
    finally:
        locked.stop()


def test_bearer_tokens_from_the_registrys_token_service(env: Env, tmp_path: Path) -> None:
    tokens = TokenServer(tmp_path / "tokens", {"team": "s3cret-pw"})
    locked = start_registry(tmp_path / "bearer", token=tokens)
    try:
        where = RegistryRef(locked.host, "modelmint", insecure=True)
        with pytest.raises(OciAuthRefused):
            publish_image(env.settings, env.gguf.ref, where)  # anonymous: the token service refuses
        creds = env.repo.settings(MODELMINT_REGISTRY_USERNAME="team", MODELMINT_REGISTRY_PASSWORD="s3cret-pw")
        done = publish_image(creds, env.gguf.ref, where)
        # the push token's scope holds both actions; the registry's challenge orders them as it likes (after
        # publish's pull-only probe of a blob GET it asks for push,pull)
        scopes = [s.rsplit(":", 1) for s in tokens.issued]
        assert done.uploaded and ["repository:modelmint/tiny-qwen2", {"pull", "push"}] in [
            [r, set(a.split(","))] for r, a in scopes]
        got = pull_image(creds, f"{locked.host}/modelmint/tiny-qwen2:q4_k_m", insecure=True, dest=tmp_path / "pulled",
                         ollama=False)
        assert (tmp_path / "pulled" / env.gguf.file).read_bytes() == (
            env.settings.repo_dir / env.gguf.dvc.path / env.gguf.file).read_bytes() and got.fetched
    finally:
        locked.stop()
        tokens.stop()


def test_https_with_the_teams_own_ca(env: Env, tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    secure = start_registry(tmp_path / "https", tls=tls)
    try:
        where = RegistryRef(secure.host, "modelmint")  # https, no --insecure
        with pytest.raises(OciError, match="not signed by a CA") as caught:
            publish_image(env.settings, env.gguf.ref, where)
        assert "MODELMINT_REGISTRY_CA" in (caught.value.hint or "")
        done = env.cli("publish", env.gguf.ref, "--registry", f"{secure.host}/modelmint",
                       MODELMINT_REGISTRY_CA=str(tls.ca))
        assert done.returncode == 0, done.stderr
        assert f"ollama pull {secure.host}/modelmint/tiny-qwen2:q4_k_m" in done.stdout
        got = pull_image(env.repo.settings(MODELMINT_REGISTRY_CA=tls.ca),
                         f"{secure.host}/modelmint/tiny-qwen2:q4_k_m", dest=tmp_path / "pulled", ollama=False)
        assert got.fetched
    finally:
        secure.stop()


def test_a_registry_out_of_space_mid_upload_leaves_nothing_tagged(env: Env, small_disk) -> None:
    import subprocess as sp

    mnt = small_disk("128k")  # less than the GGUF (its first layer)
    full = start_registry(mnt / "registry")
    try:
        where = RegistryRef(full.host, "modelmint", insecure=True)
        with pytest.raises(OciUnavailable, match="answered 5") as caught:
            publish_image(env.settings, env.gguf.ref, where)
        assert "full disk" in (caught.value.hint or "")
        with OciClient(where) as c:
            assert c.get_manifest("modelmint/tiny-qwen2", "q4_k_m") is None
        assert list(full.storage.glob("repositories/modelmint/tiny-qwen2/_manifests/tags/*")) == []
        sp.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        done = publish_image(env.settings, env.gguf.ref, where)  # the same command again, with space
        assert "sha256:" + env.gguf.sha256 in done.uploaded
    finally:
        full.stop()


def test_renderer_parser_and_requires_travel_in_the_config_blob(tmp_path: Path) -> None:
    """A family Ollama renders in Go code publishes RENDERER / PARSER / REQUIRES; `ollama create` keeps them in
    ConfigV2 (types/model/config.go), not in layers, so the image's config must carry them in the struct's order."""
    from types import SimpleNamespace

    from pipelines.chat.modelfile import Modelfile
    from pipelines.publish.ollama_image import config_json

    info = SimpleNamespace(architecture="qwen3", parameter_count=8_000_000_000, file_type="Q4_K_M")
    mf = Modelfile(from_="m.gguf", renderer="qwen3-coder", parser="qwen3-coder", requires="0.14.0")
    config = json.loads(config_json(info, mf))
    assert list(config) == FORMAT["config"]["keys_in_order_with_renderer"]
    assert (config["renderer"], config["parser"], config["requires"]) == ("qwen3-coder", "qwen3-coder", "0.14.0")
    assert list(json.loads(config_json(info, Modelfile(from_="m.gguf")))) == FORMAT["config"]["keys_in_order"]


@pytest.mark.parametrize("auth", ["not base64!", base64.b64encode(b"\xff\xfe:x").decode(), "c29tZQ"])
def test_a_docker_config_auth_that_is_not_base64_user_colon_password_is_one_config_error(
        tmp_path: Path, auth: str) -> None:
    # `docker login` writes base64("user:password"); a hand-edited entry must not surface as a binascii or
    # UnicodeDecodeError traceback from the CLI (issue 25 item 12).
    from pipelines.publish.oci import credentials_for
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"auths": {"127.0.0.1:5000": {"auth": auth}}}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"auths\.127\.0\.0\.1:5000\.auth") as info:
        credentials_for("127.0.0.1:5000", username=None, password=None, docker_config=cfg)
    assert "docker login" in info.value.hint
    assert auth not in str(info.value) and auth not in info.value.hint


def test_publish_warns_when_the_registry_answers_blob_gets_without_a_redirect(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Filesystem storage answers 200 with the bytes; Ollama's download needs a Location (issue 24).
    with caplog.at_level("WARNING", logger="pipelines.oci.images"):
        publish_image(env.settings, env.gguf.ref, env.ref("noredirect"))
    said = [r.getMessage() for r in caplog.records if "Location" in r.getMessage()]
    assert len(said) == 1 and "ollama/ollama#7244" in said[0] and "redirect" in said[0], said
    assert env.registry.host in said[0]


def test_the_redirecting_registry_answers_307_to_a_range_capable_static_host(
        env: Env, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reg = start_registry(tmp_path / "redirecting", redirect=True)
    try:
        where = RegistryRef.parse(f"{reg.host}/modelmint", insecure=True)
        with caplog.at_level("WARNING", logger="pipelines.oci.images"):
            publish_image(env.settings, env.gguf.ref, where)
        assert not [r for r in caplog.records if "Location" in r.getMessage()]
        digest = "sha256:" + env.gguf.sha256
        r = httpx.get(f"http://{reg.host}/v2/modelmint/tiny-qwen2/blobs/{digest}", follow_redirects=False)
        assert r.status_code == 307 and reg.static is not None
        location = r.headers["location"]
        assert location.startswith(f"http://{reg.static.host}/")
        whole = (env.settings.repo_dir / env.gguf.dvc.path / env.gguf.file).read_bytes()
        part = httpx.get(location, headers={"Range": "bytes=10-99"})
        assert part.status_code == 206 and part.content == whole[10:100]
        assert part.headers["content-range"] == f"bytes 10-99/{len(whole)}"
        got = pull_image(env.settings, f"{reg.host}/modelmint/tiny-qwen2:q4_k_m", insecure=True,
                         dest=tmp_path / "pulled", ollama=False)
        assert got.manifest == env.gguf and (tmp_path / "pulled" / env.gguf.file).read_bytes() == whole
    finally:
        reg.stop()


def test_blob_gets_redirect_only_with_the_redirect_middleware(tmp_path: Path) -> None:
    """The two storages side by side with one blob: filesystem answers 200 with the bytes (Ollama fails there);
    with the middleware, a 307 to the static host, whose Range answers are the blob's bytes."""
    data = np.random.default_rng(7).bytes(300_000)
    blob = Blob.of_bytes(ollama_image.MODEL, data)
    for redirect in (False, True):
        reg = start_registry(tmp_path / f"redirect-{redirect}", redirect=redirect)
        try:
            with OciClient(RegistryRef.parse(f"{reg.host}/modelmint", insecure=True)) as c:
                c.push_blob("modelmint/m", blob)
                assert c.blob_redirects("modelmint/m", blob.digest) is redirect
                c.fetch_blob("modelmint/m", blob.digest, tmp_path / f"got-{redirect}")  # modelmint reads both
            assert (tmp_path / f"got-{redirect}").read_bytes() == data
            r = httpx.get(f"http://{reg.host}/v2/modelmint/m/blobs/{blob.digest}", follow_redirects=False)
            if not redirect:
                assert r.status_code == 200 and "location" not in r.headers
                continue
            assert r.status_code == 307 and reg.static is not None
            assert r.headers["location"].startswith(f"http://{reg.static.host}/docker/registry/v2/blobs/")
            part = httpx.get(r.headers["location"], headers={"Range": "bytes=100-199999"})
            assert part.status_code == 206 and part.content == data[100:200_000]
            assert part.headers["content-range"] == f"bytes 100-199999/{len(data)}"
        finally:
            reg.stop()


def test_names_ollama_would_refuse_are_refused_before_anything_is_pushed() -> None:
    # types/model/name.go isValidLen: host <= 350, namespace/model/tag <= 80 characters
    from pipelines.publish.oci import check_ollama_name
    ok = RegistryRef.parse("127.0.0.1:5000/" + "n" * 80, insecure=True)
    check_ollama_name(ok, "m" * 80, "t" * 80)
    for registry, name, tag, part in ((RegistryRef.parse("127.0.0.1:5000/" + "n" * 81), "m", "t", "namespace"),
                                      (ok, "m" * 81, "t", "model name"), (ok, "m", "q4_k_m-" + "t" * 74, "tag")):
        with pytest.raises(ConfigError, match=f"the {part} of .* has 81 characters; `ollama pull` refuses"):
            check_ollama_name(registry, name, tag)


# ---------------------------------------------------------------- `ollama pull`'s own rules (tests/ollama_pull.py)


@pytest.fixture(scope="module")
def redirecting(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """A registry whose blob GETs answer 307 to a static server (what `ollama pull` needs), holding the module's
    GGUF image and checkpoint artifact under modelmint/."""
    reg = start_registry(tmp_path_factory.mktemp("redirecting"), redirect=True)
    try:
        where = RegistryRef(reg.host, "modelmint", insecure=True)
        publish_image(env.settings, env.gguf.ref, where)
        publish_image(env.settings, env.fp8.ref, where)
        yield reg
    finally:
        reg.stop()


def test_the_ollama_pin_is_the_commit_the_format_was_read_from() -> None:
    import ollama_pull

    pin = ollama_pull.PIN
    assert pin["repo"] == "ollama/ollama" and re.fullmatch(r"[0-9a-f]{40}", pin["commit"])
    assert pin["commit"] in FORMAT["source"] and pin["version"] in FORMAT["source"]
    assert pin["commit"] in (ollama_pull.__doc__ or "") and pin["version"] in (ollama_pull.__doc__ or "")


@pytest.mark.parametrize(("raw", "want"), [
    ("127.0.0.1:5000/modelmint/qwen2.5:q4_k_m", ("127.0.0.1:5000", "modelmint", "qwen2.5", "q4_k_m", "https")),
    ("qwen2.5", ("registry.ollama.ai", "library", "qwen2.5", "latest", "https")),
    ("team/m", ("registry.ollama.ai", "team", "m", "latest", "https")),
    ("http://h.internal:5000/ns/m:t", ("h.internal:5000", "ns", "m", "t", "http")),
    ("h/ns/m:local", ("h", "ns", "m", "latest", "https")),  # the source suffix, not a tag
    ("h/ns/m:q4-cloud", ("h", "ns", "m", "q4-cloud", "https")),
    ("h/" + "n" * 80 + "/" + "m" * 80 + ":" + "t" * 80, ("h", "n" * 80, "m" * 80, "t" * 80, "https")),
])
def test_ollama_name_rules_accept(raw: str, want: tuple[str, ...]) -> None:
    from ollama_pull import check_name

    n = check_name(raw)
    assert (n.host, n.namespace, n.model, n.tag, n.scheme) == want


@pytest.mark.parametrize(("raw", "problem"), [
    ("h/mod.elmint/m:t", "namespace has a '.'"),
    ("h/" + "n" * 81 + "/m:t", "namespace has 81 characters"),
    ("h/ns/" + "m" * 81 + ":t", "model has 81 characters"),
    ("h/ns/m:" + "t" * 81, "tag has 81 characters"),
    ("h" * 351 + "/ns/m:t", "host has 351 characters"),
    ("h/-ns/m:t", "namespace starts with '-'"),
    ("h/ns/m:", "tag is missing"),
    ("h//m:t", "namespace is missing"),
    ("h/ns/m:a:b", "model has a ':'"),
    ("h/ns/modèle:t", "model has 'è'"),
    ("h/ns/m:t@x", "tag has '@'"),
])
def test_ollama_name_rules_refuse(raw: str, problem: str) -> None:
    from ollama_pull import InvalidName, check_name

    with pytest.raises(InvalidName) as caught:
        check_name(raw)
    assert caught.value.ollama == "invalid model name" and any(problem in p for p in caught.value.problems), (
        caught.value.problems)


def test_ollama_pull_fails_where_blob_gets_answer_with_the_bytes(env: Env, tmp_path: Path) -> None:
    """Filesystem storage without redirects: the manifest GET and the HEAD work, the blob GET answers 200 with the
    bytes, and Ollama's download stops there with Go's ErrNoLocation (ollama/ollama#7244)."""
    from ollama_pull import MANIFEST_ACCEPT, OllamaPull, OllamaPullError

    publish_image(env.settings, env.gguf.ref, env.ref("ollama-noloc"))
    client = OllamaPull(tmp_path / "models", insecure=True)
    with pytest.raises(OllamaPullError) as caught:
        client.pull(f"{env.registry.host}/ollama-noloc/tiny-qwen2:q4_k_m")
    assert caught.value.ollama == "http: no Location header in response"
    blob = f"http://{env.registry.host}/v2/ollama-noloc/tiny-qwen2/blobs/sha256:{env.gguf.sha256}"
    assert [(h.method, h.url, h.status, h.accept, h.location) for h in client.log] == [
        ("GET", f"http://{env.registry.host}/v2/ollama-noloc/tiny-qwen2/manifests/q4_k_m", 200, MANIFEST_ACCEPT, None),
        ("HEAD", blob, 200, None, None),
        ("GET", blob, 200, None, None)]
    assert not (tmp_path / "models" / "blobs" / f"sha256-{env.gguf.sha256}").exists()


def test_ollama_pull_speaks_https_unless_insecure(env: Env, tmp_path: Path) -> None:
    """images.go:1017-1019 and :1371-1373: an http:// name needs --insecure; without it the registry is asked over
    https (which this plain-HTTP registry does not speak), with it over http."""
    from ollama_pull import OllamaPull, OllamaPullError

    publish_image(env.settings, env.gguf.ref, env.ref("ollama-scheme"))
    image = f"{env.registry.host}/ollama-scheme/tiny-qwen2:q4_k_m"
    plain = OllamaPull(tmp_path / "plain")
    with pytest.raises(OllamaPullError) as caught:
        plain.pull(f"http://{image}")
    assert caught.value.ollama == "insecure protocol http" and plain.log == []
    with pytest.raises(OllamaPullError) as caught:
        plain.pull(image)
    assert caught.value.ollama.startswith("pull model manifest: ") and plain.log[0].url.startswith("https://")
    insecure = OllamaPull(tmp_path / "insecure", insecure=True)
    with pytest.raises(OllamaPullError) as caught:  # past the manifest, to the blob answer this registry gives
        insecure.pull(f"https://{image}")
    assert caught.value.ollama == "http: no Location header in response"
    assert insecure.log[0].url == f"http://{env.registry.host}/v2/ollama-scheme/tiny-qwen2/manifests/q4_k_m"


def _manifest_bytes(host: str, repository: str, tag: str) -> bytes:
    r = httpx.get(f"http://{host}/v2/{repository}/manifests/{tag}",
                  headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    r.raise_for_status()
    return r.content


def test_ollama_pull_pulls_the_published_gguf_image_through_the_redirects(
        env: Env, redirecting: RunningRegistry, tmp_path: Path) -> None:
    from ollama_pull import MANIFEST_ACCEPT, OPTIONS, OllamaPull

    from pipelines.chat.modelfile import Modelfile

    models = tmp_path / "models"
    part = 64 * 1024  # Ollama's parts are 100 MB at least; small ones here, so the GGUF takes several Range GETs
    client = OllamaPull(models, insecure=True, token="registry-token", min_part_size=part)
    got = client.pull(f"{redirecting.host}/modelmint/tiny-qwen2:q4_k_m")
    assert redirecting.static is not None
    static, registry = redirecting.static.host, redirecting.host
    assert got.manifest_data == _manifest_bytes(registry, "modelmint/tiny-qwen2", "q4_k_m")
    assert (models / "manifests" / registry / "modelmint" / "tiny-qwen2" / "q4_k_m").read_bytes() == got.manifest_data
    first = client.log[0]
    assert (first.method, first.accept, first.host) == ("GET", MANIFEST_ACCEPT, registry)

    # the GGUF's requests, in Ollama's order: HEAD (redirect followed), GET (307 kept), Range GETs on the target
    size = next(f.size for f in env.gguf.files if f.sha256 == env.gguf.sha256)
    gguf = [h for h in client.log if env.gguf.sha256 in h.url]
    assert [(h.method, h.host, h.status) for h in gguf[:4]] == [
        ("HEAD", registry, 307), ("HEAD", static, 200), ("GET", registry, 307), ("GET", static, 206)]
    ranges = [h.range for h in gguf[3:]]
    assert ranges == [f"bytes={o}-{min(o + part, size) - 1}" for o in range(0, size, part)] and len(ranges) > 1
    assert all(h.authorization for h in client.log if h.host == registry)
    assert not any(h.authorization for h in client.log if h.host == static)  # no registry credentials there

    # every layer and the config, hashed as verifyBlob does; the registered files byte for byte
    layers = [*got.manifest["layers"], got.manifest["config"]]
    assert set(got.blobs) == {x["digest"] for x in layers} and got.cache_hits == set()
    for digest, path in got.blobs.items():
        assert "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() == digest
    d = env.settings.repo_dir / env.gguf.dvc.path
    assert got.model.model_path is not None and got.model.model_path.read_bytes() == (d / env.gguf.file).read_bytes()

    # what Ollama reads: ConfigV2 with no field it lacks, typed options, the template of a tool-calling family
    m = got.model
    assert m.problems == [] and sorted(set(m.ignored)) == sorted({"application/vnd.modelmint.file.v1",
                                                                  MODELMINT_MANIFEST})
    assert (m.config["model_format"], m.config["model_family"], m.config["file_type"]) == ("gguf", "qwen2", "unknown")
    mf = Modelfile.parse((d / "Modelfile").read_text())
    assert m.template == mf.template and ".Tools" in (m.template or "") and ".ToolCalls" in (m.template or "")
    if shutil.which("go") is not None:  # Go's text/template parses the pulled layer; Ollama offers tools for it
        from pipelines.chat.gotemplate import analyze

        read = analyze(m.template or "", env.settings)
        assert "tools" in read.vars and read.tool_tag, read
    assert m.options["num_ctx"] == mf.parameter("num_ctx")[0] and m.options["stop"] == mf.parameter("stop")
    assert set(m.params or {}) <= set(OPTIONS)

    # the pinned tag: the same blobs, all there already (cache hits), so only its manifest is asked for
    before = len(client.log)
    pinned = client.pull(f"{registry}/modelmint/tiny-qwen2:{pinned_tag(env.gguf)}")
    assert pinned.cache_hits == set(got.blobs) and [h.method for h in client.log[before:]] == ["GET"]


def test_ollama_pull_of_the_checkpoint_artifact_finds_no_docker_manifest(
        env: Env, redirecting: RunningRegistry, tmp_path: Path) -> None:
    """The ModelPack artifact is an OCI image manifest; Ollama asks only for Docker v2 schema 2, which the
    registry cannot give for it: `ollama pull` of a checkpoint fails at the manifest (it is for vLLM)."""
    from ollama_pull import OllamaPull, OllamaPullError

    with pytest.raises(OllamaPullError) as caught:
        OllamaPull(tmp_path / "models", insecure=True).pull(f"{redirecting.host}/modelmint/tiny-qwen2:fp8")
    assert caught.value.ollama == "pull model manifest: file does not exist"


def test_a_tampered_blob_is_refused_by_ollama_pull_and_by_modelmint_pull(
        env: Env, redirecting: RunningRegistry, tmp_path: Path) -> None:
    from ollama_pull import OllamaPull, OllamaPullError

    data = redirecting.blob_data("sha256:" + env.gguf.sha256)
    original = data.read_bytes()
    try:
        data.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))  # same size, one byte flipped
        client = OllamaPull(tmp_path / "models", insecure=True)
        with pytest.raises(OllamaPullError) as caught:
            client.pull(f"{redirecting.host}/modelmint/tiny-qwen2:q4_k_m")
        flipped = hashlib.sha256(data.read_bytes()).hexdigest()
        assert caught.value.ollama == (f"digest mismatch, file must be downloaded again: want sha256:{env.gguf.sha256}"
                                       f", got sha256:{flipped}")
        assert not (tmp_path / "models" / "blobs" / f"sha256-{env.gguf.sha256}").exists()  # removed, as Ollama does
        assert not (tmp_path / "models" / "manifests").exists()
        refused = env.cli("pull", env.gguf.ref, "--from-registry", f"{redirecting.host}/modelmint", "--insecure",
                          "--dest", str(tmp_path / "dest"))
        assert refused.returncode == 1 and env.gguf.sha256 in refused.stderr and flipped in refused.stderr
        assert "Traceback" not in refused.stderr and not (tmp_path / "dest").exists()
    finally:
        data.write_bytes(original)


def test_ollama_pull_with_the_redirect_target_down_midway_fails_and_a_rerun_completes(
        env: Env, redirecting: RunningRegistry, tmp_path: Path) -> None:
    from ociregistry import StaticBlobServer
    from ollama_pull import OllamaPull, OllamaPullError, Progress

    assert redirecting.static is not None
    target = redirecting.static
    host, port = target.host.rsplit(":", 1)
    layers = json.loads(_manifest_bytes(redirecting.host, "modelmint/tiny-qwen2", "q4_k_m"))["layers"]
    second = layers[1]["digest"]
    assert layers[0]["digest"] == "sha256:" + env.gguf.sha256

    def stop_at_the_second_blob(p: Progress) -> None:  # after its HEAD, before its direct URL and Range GET
        if p.digest == second and p.completed == 0 and redirecting.static is target:
            target.stop()
            redirecting.static = None

    sleeps: list[float] = []
    models = tmp_path / "models"
    first = OllamaPull(models, insecure=True, sleep=sleeps.append, progress=stop_at_the_second_blob)
    try:
        with pytest.raises(OllamaPullError) as caught:
            first.pull(f"{redirecting.host}/modelmint/tiny-qwen2:q4_k_m")
        assert caught.value.ollama.startswith(f'max retries exceeded: Get "http://{target.host}/docker/registry/v2/')
        assert caught.value.ollama.endswith(f"dial tcp {target.host}: connect: connection refused")
        assert sleeps == [1, 2, 4, 8, 16, 32]  # 2^try s between Ollama's six tries
        blobs = models / "blobs"
        assert (blobs / f"sha256-{env.gguf.sha256}").exists()  # the first blob finished
        kept = sorted(p.name for p in blobs.glob(second.replace(":", "-") + "*"))
        assert kept == [f"{second.replace(':', '-')}-partial", f"{second.replace(':', '-')}-partial-0"]
        assert not (models / "manifests").exists()
    finally:
        if redirecting.static is None:
            redirecting.static = StaticBlobServer(redirecting.root / "storage", host, int(port))
    rerun = OllamaPull(models, insecure=True)
    got = rerun.pull(f"{redirecting.host}/modelmint/tiny-qwen2:q4_k_m")
    assert "sha256:" + env.gguf.sha256 in got.cache_hits
    assert not [h for h in rerun.log if env.gguf.sha256 in h.url]  # the finished blob is not asked for again
    again = [(h.method, h.host, h.status) for h in rerun.log if second.removeprefix("sha256:") in h.url]
    assert again == [("GET", redirecting.host, 307), ("GET", target.host, 206)]  # from its part file: no HEAD
    assert all("sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() == d for d, p in got.blobs.items())


def test_names_ollama_refuses_are_refused_by_ollama_pull_and_by_publish(env: Env) -> None:
    from ollama_pull import InvalidName, check_name

    long_ns, dotted = "n" * 81, "mod.elmint"
    for namespace, problem in ((long_ns, "namespace has 81 characters"), (dotted, "namespace has a '.'")):
        with pytest.raises(InvalidName) as caught:
            check_name(f"{env.registry.host}/{namespace}/tiny-qwen2:q4_k_m")
        assert any(problem in p for p in caught.value.problems)
    refused = env.cli("publish", env.gguf.ref, "--registry", f"{env.registry.host}/{long_ns}", "--insecure")
    said = " ".join(refused.stderr.split())  # the CLI wraps its lines
    assert refused.returncode == 1 and "has 81 characters; `ollama pull` refuses one over 80" in said, said
    assert "Traceback" not in said
    refused = env.cli("publish", env.gguf.ref, "--registry", f"{env.registry.host}/{dotted}", "--insecure")
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 1 and "is not a registry and namespace" in said and "Traceback" not in said
    # and the other way round: a name publish accepts is one `ollama pull` accepts
    from pipelines.publish.oci import check_ollama_name

    for where, name, tag in (("127.0.0.1:5000/modelmint", "qwen2.5", "q4_k_m-7ae557604adf"),
                             ("registry.internal/team_a-1", "tiny-qwen2", "fp8"),
                             ("h.internal/" + "n" * 80, "m" * 80, "t" * 80)):
        registry = RegistryRef.parse(where)
        check_ollama_name(registry, name, tag)
        check_name(registry.image(name, tag))


class _BlobAnswers:
    """A registry stand-in with one image (a model layer and a config) whose blob GETs answer as `answer` says,
    the bytes behind the redirects on a static server: on 127.0.0.2 (another host), or on 127.0.0.1 itself."""

    def __init__(self, root: Path, answer: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from ociregistry import StaticBlobServer

        root.mkdir(parents=True)
        config = b'{"model_format":"gguf","model_family":"qwen2","model_families":["qwen2"],"model_type":"1K",' \
                 b'"file_type":"F16","architecture":"amd64","os":"linux"}\n'
        blobs = {"sha256:" + hashlib.sha256(b).hexdigest(): b for b in (np.random.default_rng(1).bytes(5000), config)}
        for digest, data in blobs.items():
            (root / digest[7:]).write_bytes(data)
        (model, _), (cfg, _) = blobs.items()
        self.manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": ollama_image.CONFIG, "digest": cfg, "size": len(config)},
            "layers": [{"mediaType": ollama_image.MODEL, "digest": model, "size": len(blobs[model])}]}).encode()
        self.blobs = blobs
        self.other = StaticBlobServer(root, "127.0.0.2")
        self.same = StaticBlobServer(root, "127.0.0.1")
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, *, body: bool) -> None:
                digest = self.path.rsplit("/", 1)[-1]
                if self.path.endswith("/manifests/t"):
                    status, data, headers = 200, stub.manifest, {}
                elif digest not in stub.blobs:
                    status, data, headers = 404, b"", {}
                elif self.command == "HEAD" or answer == "200":
                    status, data, headers = 200, stub.blobs[digest], {}
                else:
                    status, server = {"307": (307, stub.other), "302": (302, stub.other),
                                      "200+location": (200, stub.other), "307-same-host": (307, stub.same)}[answer]
                    data, headers = b"", {"Location": f"http://{server.host}/{digest[7:]}"}
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.other.stop()
        self.same.stop()


@pytest.mark.parametrize(("answer", "ollama_fails"), [
    ("307", None),
    ("200+location", None),  # resp.Location() reads the header whatever the status (download.go:267-270)
    ("302", "unexpected status code 302"),
    ("307-same-host", "http: no Location header in response"),  # same hostname, another port: followed
    ("200", "http: no Location header in response"),
])
def test_which_blob_answers_ollama_pull_accepts_and_publish_agrees(
        tmp_path: Path, answer: str, ollama_fails: str | None) -> None:
    """Ollama takes the blob GET's answer only as a 307 or a 200 with a Location, and follows a redirect to the
    registry's own hostname (whatever the port) itself; publish's warning must say so for the same answers."""
    from ollama_pull import OllamaPull, OllamaPullError

    stub = _BlobAnswers(tmp_path / "blobs", answer)
    try:
        client = OllamaPull(tmp_path / "models", insecure=True)
        if ollama_fails is None:
            got = client.pull(f"{stub.host}/ns/m:t")
            assert {d: p.read_bytes() for d, p in got.blobs.items()} == stub.blobs and got.model.problems == []
        else:
            with pytest.raises(OllamaPullError) as caught:
                client.pull(f"{stub.host}/ns/m:t")
            assert caught.value.ollama == ollama_fails
        with OciClient(RegistryRef(stub.host, "ns", insecure=True)) as c:
            assert c.blob_redirects("ns/m", next(iter(stub.blobs))) is (ollama_fails is None)
    finally:
        stub.stop()


def _read(tmp_path: Path, config: Any = None, params: Any = None, layers: tuple[tuple[str, bytes], ...] = ()) -> Any:
    """read_model over blobs written here: a config, a params layer, and more layers (media type, bytes)."""
    from ollama_pull import read_model

    blobs: dict[str, Path] = {}

    def blob(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = tmp_path / digest[7:]
        blobs[digest].write_bytes(data)
        return digest

    manifest: dict[str, Any] = {"layers": []}
    if config is not None:
        manifest["config"] = {"digest": blob(json.dumps(config).encode())}
    all_layers = [*layers, *((("application/vnd.ollama.image.params", json.dumps(params).encode()),)
                             if params is not None else ())]
    manifest["layers"] = [{"mediaType": kind, "digest": blob(data)} for kind, data in all_layers]
    return read_model(manifest, blobs)


def test_ollama_decodes_config_and_params_as_its_structs_do(tmp_path: Path) -> None:
    """encoding/json into ConfigV2 (keys matched case-insensitively, unknown ones ignored) and Options.FromMap
    (unknown options warned about, JSON numbers taken for ints): what Ollama takes silently is reported."""
    m = _read(tmp_path, config={"model_format": "gguf", "Model_Family": "qwen2", "context_length": 4096,
                                "shiny": True, "draft": {"architecture": "qwen2", "glow": 1},
                                "architecture": "amd64", "os": "linux"},
              params={"num_ctx": 8192.9, "temperature": 1, "stop": ["<|im_end|>"], "use_mmap": False,
                      "main_gpu": 0, "seed": None, "num_ctxx": 1},
              layers=(("application/vnd.ollama.image.template", b"{{ .Prompt }}"),
                      ("application/vnd.ollama.image.bogus", b"?"), (MODELMINT_MANIFEST, b"{}")))
    assert m.config["model_family"] == "qwen2" and m.config["draft"] == {"architecture": "qwen2"}
    assert m.options == {"num_ctx": 8192, "temperature": 1.0, "stop": ["<|im_end|>"], "use_mmap": False,
                         "main_gpu": 0}
    assert m.template == "{{ .Prompt }}" and m.ignored == ["application/vnd.ollama.image.bogus", MODELMINT_MANIFEST]
    assert sorted(m.problems) == sorted([
        "invalid option provided: num_ctxx", "unknown field ConfigV2.shiny (Ollama ignores it)",
        "unknown field ConfigV2.draft.glow (Ollama ignores it)",
        f"layer sha256:{hashlib.sha256(b'?').hexdigest()} has application/vnd.ollama.image.bogus, a media type "
        "Ollama does not know"])
    msgs = _read(tmp_path, layers=(("application/vnd.ollama.image.messages",
                                    b'[{"role": "USER", "content": "hi"}]'),))
    assert msgs.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("config", "params", "refused"), [
    ({"model_families": "qwen2"}, None,
     "json: cannot unmarshal string into Go struct field ConfigV2.model_families of type []string"),
    ({"context_length": 1.5}, None,
     "json: cannot unmarshal number 1.5 into Go struct field ConfigV2.context_length of type int"),
    ({"model_format": 1}, None, "json: cannot unmarshal number into Go struct field ConfigV2.model_format of type "
                                "string"),
    ({"draft": {"config": []}}, None,
     "json: cannot unmarshal array into Go struct field Draft.draft.config of type string"),
    (["gguf"], None, "json: cannot unmarshal array into Go value of type model.ConfigV2"),
    (None, {"num_ctx": "8192"}, 'option "num_ctx" must be of type integer'),
    (None, {"temperature": "warm"}, 'option "temperature" must be of type float32'),
    (None, {"use_mmap": 1}, 'option "use_mmap" must be of type boolean'),
    (None, {"stop": "<|im_end|>"}, 'option "stop" must be of type array'),
    (None, {"stop": [1]}, 'option "stop" must be of an array of strings'),
    (None, [1], "json: cannot unmarshal array into Go value of type map[string]interface {}"),
])
def test_ollama_refuses_mistyped_config_and_params(tmp_path: Path, config: Any, params: Any, refused: str) -> None:
    from ollama_pull import OllamaPullError

    with pytest.raises(OllamaPullError) as caught:
        _read(tmp_path, config=config, params=params)
    assert caught.value.ollama == refused


_CONFIG_CASES = [
    {"model_families": "qwen2"}, {"context_length": 1.5}, {"model_format": 1}, ["gguf"], {"draft": {"config": []}},
    {"Model_Format": "gguf", "shiny": 1}, {"capabilities": [1]}, {"embedding_length": 1e3}, {"os": None},
]


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (bash toolchains/setup-go.sh)")
def test_config_decoding_errors_are_what_go_says(tmp_path: Path) -> None:
    """The same blobs through Go's own encoding/json into a struct with ConfigV2's fields and tags
    (types/model/config.go at the pin; a program written here, no Ollama code): the same refusals, word for word."""
    from ollama_pull import OllamaPullError, go_decode

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.go").write_text(
        "package model\ntype ConfigV2 struct {\n" + "".join(
            f' F{i} {t} `json:"{k}"`\n' for i, (k, t) in enumerate([
                ("model_format", "string"), ("model_family", "string"), ("model_families", "[]string"),
                ("model_type", "string"), ("file_type", "string"), ("renderer", "string"), ("parser", "string"),
                ("requires", "string"), ("remote_host", "string"), ("remote_model", "string"),
                ("capabilities", "[]string"), ("context_length", "int"), ("embedding_length", "int"),
                ("base_name", "string"), ("draft", "*Draft"), ("architecture", "string"), ("os", "string")]))
        + "}\ntype Draft struct {\n" + "".join(
            f' F{i} string `json:"{k}"`\n' for i, k in enumerate(["model_format", "architecture", "tensor_prefix",
                                                                  "config"])) + "}\n")
    (tmp_path / "main.go").write_text(
        'package main\nimport ("bufio"; "encoding/json"; "fmt"; "os"; "gochk/model")\nfunc main() {\n'
        ' s := bufio.NewScanner(os.Stdin)\n for s.Scan() {\n  var c model.ConfigV2\n'
        '  if err := json.Unmarshal(s.Bytes(), &c); err != nil { fmt.Println(err) } else { fmt.Println("ok") }\n'
        ' }\n}\n')
    (tmp_path / "go.mod").write_text("module gochk\ngo 1.19\n")
    go = subprocess.run(["go", "run", "."], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                        input="".join(json.dumps(c) + "\n" for c in _CONFIG_CASES),
                        env={"HOME": str(tmp_path), "GOCACHE": str(tmp_path / "cache"), "GOFLAGS": "-mod=mod",
                             "PATH": str(Path(shutil.which("go") or "go").parent)})
    assert go.returncode == 0, go.stderr
    ours = []
    for case in _CONFIG_CASES:
        try:
            go_decode(case, "ConfigV2")
            ours.append("ok")
        except OllamaPullError as err:
            ours.append(err.ollama)
    assert go.stdout.splitlines() == ours


def test_every_modelfile_parameter_is_an_ollama_option_of_its_type() -> None:
    """Each PARAMETER modelmint accepts, through params_json, is one Options field of the same kind to
    Options.FromMap; the one option modelmint does not offer is listed here."""
    from ollama_pull import OPTIONS, apply_options

    from pipelines.chat.modelfile import PARAMETER_TYPES, Modelfile, Parameter

    value = {int: 2, float: 0.5, bool: True, str: "</s>"}
    mf = Modelfile(from_="./m.gguf", parameters=tuple(Parameter(k, value[t]) for k, t in PARAMETER_TYPES.items()))
    warned: list[str] = []
    options = apply_options(json.loads(ollama_image.params_json(mf) or b"{}"), warned)
    assert warned == [] and set(options) == set(PARAMETER_TYPES)
    kinds = {int: ("int", "*int"), float: ("float32",), bool: ("*bool",), str: ("[]string",)}
    assert {k: OPTIONS[k] for k in PARAMETER_TYPES if OPTIONS[k] not in kinds[PARAMETER_TYPES[k]]} == {}
    assert set(OPTIONS) - set(PARAMETER_TYPES) == {"draft_num_predict"}


def test_every_image_name_the_catalog_can_publish_is_one_ollama_pull_takes_as_is() -> None:
    """Each catalog model under each tag modelmint can build (and its TAG-<source12>) parses to the same
    namespace, model and tag in Ollama: nothing is refused, and no tag is read as a :local / :cloud source suffix."""
    from ollama_pull import check_name

    from pipelines.source.catalog import COMPRESSED_VARIANTS, GGUF_QUANT_TYPES

    names = [m.name for m in load_catalog(ROOT / "registry" / "catalog.yaml").models]
    tags = [t.lower() for t in (*GGUF_QUANT_TYPES, *COMPRESSED_VARIANTS)]
    assert names and "q4_k_m" in tags and "fp8" in tags
    registry = RegistryRef.parse("registry.internal/modelmint")
    for name in names:
        for tag in (t for base in tags for t in (base, f"{base}-7ae557604adf")):
            check_ollama = check_name(registry.image(name, tag))
            assert (check_ollama.namespace, check_ollama.model, check_ollama.tag) == ("modelmint", name, tag)


def test_the_documented_local_registry_is_one_ollama_pull_pulls_from(env: Env, tmp_path: Path) -> None:
    """docs/oci.md's path for one machine, as a new user runs it: `modelmint registry serve`, `modelmint publish`,
    then a pull by Ollama's rules (tests/ollama_pull.py) of what was published."""
    import signal

    from ollama_pull import OllamaPull

    port = free_port()
    serve = subprocess.Popen([*MODELMINT, "registry", "serve", "--port", str(port), "--dir", str(tmp_path / "reg")],
                             env=env.repo.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert serve.poll() is None, serve.communicate()[1]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "modelmint registry serve did not answer"
                time.sleep(0.2)
        done = env.cli("publish", env.gguf.ref, "--registry", f"127.0.0.1:{port}/modelmint", "--insecure")
        assert done.returncode == 0, done.stderr
        assert "ollama/ollama#7244" not in done.stderr, done.stderr  # publish's check: Ollama can pull from it
        client = OllamaPull(tmp_path / "models", insecure=True, min_part_size=64 * 1024)
        got = client.pull(f"127.0.0.1:{port}/modelmint/tiny-qwen2:q4_k_m")
        assert got.model.problems == []
        d = env.settings.repo_dir / env.gguf.dvc.path
        assert got.model.model_path is not None and got.model.model_path.read_bytes() == (d / env.gguf.file).read_bytes()
        assert {h.host.split(":")[0] for h in client.log if h.method == "GET" and h.range} == {"127.0.0.2"}
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)


@pytest.mark.skipif(shutil.which("ollama") is None,
                    reason="no ollama binary on PATH: none is installable on this machine (not in Debian 12, PyPI or "
                    "npm; building it needs Go 1.24+ and its module downloads), so tests/ollama_pull.py stands in")
def test_a_real_ollama_pulls_and_runs_the_published_image(env: Env, tmp_path: Path) -> None:
    """Where an `ollama` binary exists: `ollama pull --insecure` from `modelmint registry serve`, then one prompt."""
    import signal

    port, api = free_port(), free_port()
    ollama_env = {**os.environ, "OLLAMA_HOST": f"127.0.0.1:{api}", "OLLAMA_MODELS": str(tmp_path / "models"),
                  "HOME": str(tmp_path)}
    serve = subprocess.Popen([*MODELMINT, "registry", "serve", "--port", str(port), "--dir", str(tmp_path / "reg")],
                             env=env.repo.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemon = subprocess.Popen(["ollama", "serve"], env=ollama_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for url in (f"http://127.0.0.1:{port}/v2/", f"http://127.0.0.1:{api}/api/version"):
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, f"{url} did not answer"
                    time.sleep(0.2)
        done = env.cli("publish", env.gguf.ref, "--registry", f"127.0.0.1:{port}/modelmint", "--insecure")
        assert done.returncode == 0, done.stderr
        image = f"127.0.0.1:{port}/modelmint/tiny-qwen2:q4_k_m"
        pulled = subprocess.run(["ollama", "pull", "--insecure", image], env=ollama_env, capture_output=True,
                                text=True, timeout=600)
        assert pulled.returncode == 0, pulled.stderr
        ran = subprocess.run(["ollama", "run", image, "Say hello."], env=ollama_env, capture_output=True, text=True,
                             timeout=600)
        assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    finally:
        for proc in (daemon, serve):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
