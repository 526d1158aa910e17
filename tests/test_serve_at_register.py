"""Serving plans written at registration: the planner run on the registered bytes for each GPU inventory of the
catalog entry, the files beside the artifact (DVC-tracked, listed in the manifest with their sha256), the plan
summary in the manifest, refusals recorded with the nearest plans that fit, and inventories checked when the
catalog loads. Real artifacts: tiny-qwen2's q8_0 from the pinned llama.cpp and its FP8 from llmcompressor."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from registry_env import Repo, dvc, git, make_repo

from pipelines.advice.serving import PLANS_FILE
from pipelines.core.errors import ConfigError
from pipelines.core.fsutil import sha256_file
from pipelines.core.settings import Settings
from pipelines.publish import planner
from pipelines.source.catalog import DEFAULT_SERVE_GPUS, KV_CACHE_DTYPES, load_catalog
from pipelines.store.manifest import Manifest, find_manifest

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


def _cli(repo: Repo, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MODELMINT, *args],
        env={**repo.env(), "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        cwd=repo.root,
    )


def _set_serve(repo: Repo, serve: dict[str, Any]) -> None:
    path = repo.root / "registry" / "catalog.yaml"
    raw = yaml.safe_load(path.read_text())
    for m in raw["models"]:
        m["serve"] = serve
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def _check_listed(repo: Repo, m: Manifest) -> dict[str, str]:
    """Every serving file is in the artifact directory, listed in the manifest with its real sha256 and
    tracked by DVC with the artifact; returns them by path."""
    d = repo.root / m.dvc.path
    listed = {f.path: f.sha256 for f in m.files}
    assert m.serving is not None and PLANS_FILE in listed
    on_disk = {p.relative_to(d).as_posix() for p in (d / "serve").rglob("*") if p.is_file()}
    named = {f for inv in m.serving.inventories for f in inv.files}
    assert on_disk == named | {PLANS_FILE}, "every file under serve/ is one a plan names (and the record)"
    for rel in on_disk:
        assert listed[rel] == sha256_file(d / rel), rel
    assert json.loads((d / PLANS_FILE).read_text()) == m.serving.model_dump(mode="json")
    assert "up to date" in dvc(repo.root, "status", m.dvc.stage).stdout
    return {rel: (d / rel).read_text() for rel in on_disk}


# ---------------------------------------------------------------- the catalog


def test_an_entry_without_serve_is_planned_for_the_default_inventories(tmp_path: Path) -> None:
    entry = load_catalog(Path(__file__).parents[1] / "registry" / "catalog.yaml").get("tiny-qwen2")
    assert entry.serve.gpus == ["1x1xL4-24G", "1x4xRTX4090-24G"] and len(DEFAULT_SERVE_GPUS) == 2
    assert entry.serve.context is None and entry.serve.concurrency == 1
    assert set(KV_CACHE_DTYPES.__args__) == set(planner.KV_BYTES)  # the catalog offers what the planner sizes


@pytest.mark.parametrize(
    ("serve", "complaint"),
    [
        ({"gpus": ["4xRTX4909-24G"]}, "unknown GPU 'RTX4909-24G'; known: A800-80G, "),
        ({"gpus": ["4RTX4090-24G"]}, "'4RTX4090-24G' is not a GPU group (write [NODESx]GPUSxNAME"),
        ({"gpus": ["4xRTX4090-24G", "1x4xRTX4090-24G"]}, "inventory 1x4xRTX4090-24G is named twice"),
        ({"gpu": ["1xL4-24G"]}, "unknown key 'gpu' (did you mean 'gpus'?)"),
        ({"gpus": []}, "gpus: List should have at least 1 item"),
    ],
)
def test_a_broken_inventory_is_refused_when_the_catalog_loads(
    tmp_path: Path, serve: dict[str, Any], complaint: str
) -> None:
    raw = yaml.safe_load((Path(__file__).parents[1] / "registry" / "catalog.yaml").read_text())
    raw["models"] = [m for m in raw["models"] if m["name"] == "tiny-qwen2"]
    raw["models"][0]["serve"] = serve
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError) as err:
        load_catalog(path)
    assert complaint in err.value.message and "entry 'tiny-qwen2'" in err.value.message, err.value.message
    if "unknown GPU" in complaint:  # the fix: the known names, and where a new one is added
        assert "H200-141G" in err.value.message and "add a profile to" in err.value.message


def test_the_setting_overrides_the_catalog_and_is_checked_when_read(tmp_path: Path) -> None:
    entry = load_catalog(Path(__file__).parents[1] / "registry" / "catalog.yaml").get("tiny-qwen2")
    settings = Settings.from_env({"MODELMINT_SERVE_GPUS": "2x8xH100-80G, 1xL20-48G"})
    assert settings.serve_gpus == ("2x8xH100-80G", "1xL20-48G")
    assert entry.with_serve_gpus(settings.serve_gpus).serve.gpus == ["2x8xH100-80G", "1x1xL20-48G"]
    assert entry.with_serve_gpus(None) is entry and Settings.from_env({}).serve_gpus is None
    with pytest.raises(
        ConfigError, match=r"(?s)MODELMINT_SERVE_GPUS: unknown GPU 'H100'; known: .*add a profile"
    ):
        Settings.from_env({"MODELMINT_SERVE_GPUS": "1xL4-24G,8xH100"})


def test_an_artifact_the_planner_cannot_size_is_registered_with_the_reason(
    repo: Repo, tmp_path: Path
) -> None:
    """A GGUF whose header lacks what sizes attention (registry_env's synthetic one): every inventory records the
    planner's refusal and the fix, no plan file is written, and the registration goes through."""
    from registry_env import candidate

    from pipelines.registry.register import register

    settings = repo.settings()
    m = register(settings, candidate(settings, tmp_path)).manifest
    assert [i.gpus for i in m.serving.inventories] == ["1x1xL4-24G", "1x4xRTX4090-24G"]
    for inv in m.serving.inventories:
        assert inv.plans == [] and inv.files == [] and "qwen2.block_count" in inv.refused
        assert inv.nearest == ["reconvert it with `modelmint convert`"]
    _check_listed(repo, m)
    assert m.dvc.pushed


# ---------------------------------------------------------------- a GGUF: tiny-qwen2 q8_0 from the pinned llama.cpp


@pytest.mark.slow
def test_a_registered_gguf_carries_its_plans_and_a_refusal_is_recorded(isolated, tmp_path: Path) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0"]})
    _set_serve(
        repo,
        {
            "gpus": ["1xL4-24G", "4xRTX4090-24G", "1x8xA800-80G+1x8xL20-48G"],
            "context": 4096,
            "concurrency": 8,
            "kv_cache_dtype": "fp8",  # vLLM's: said to change nothing for a GGUF
        },
    )
    done = _cli(repo, "convert", "tiny-qwen2", "--variants", "q8_0", "--register")
    assert done.returncode == 0, done.stderr
    settings = repo.settings()
    m = find_manifest(settings, "tiny-qwen2:q8_0")
    files = _check_listed(repo, m)
    single, box, mixed = m.serving.inventories
    assert (single.gpus, box.gpus, mixed.gpus) == (
        "1x1xL4-24G",
        "1x4xRTX4090-24G",
        "1x8xA800-80G+1x8xL20-48G",
    )
    # a GGUF is planned by llama.cpp's memory model alone, from every tensor of the registered GGUF: vLLM cannot
    # load one, so no vLLM sizing is recorded
    gguf = repo.root / m.dvc.path / m.file
    what = planner.served(gguf)
    assert 0 < what.weights_bytes < m.size_bytes
    assert [i.plans for i in (single, box, mixed)] == [[], [], []]
    (one,) = single.gguf
    assert (one.gpus, one.engine, one.num_ctx, one.parallel, one.instances, one.partial) == (
        "1x1xL4-24G", "ollama", 4096, 8, 1, False)
    # a GGUF gets no vLLM file (and why) but Ollama's files on every group, planned by llama.cpp's memory model
    # (tests/test_serve_at_register_gguf.py checks them against `modelmint recommend --engine ollama`)
    assert single.files == [f"serve/1x1xl4-24g/ollama/{f}" for f in ("Modelfile", "start.sh")]
    assert "no vLLM files for a GGUF" in single.notes[0] and "llama.cpp's memory model" in single.notes[0]
    assert any(n.startswith("serve.kv_cache_dtype fp8: vLLM's options, not applied to a GGUF") for n in single.notes)
    assert box.files == [f"serve/1x4xrtx4090-24g/ollama/{f}" for f in ("Modelfile", "start.sh")]
    assert [g.gpus for g in mixed.gguf] == ["1x8xA800-80G", "1x8xL20-48G"] and mixed.files == [
        f"serve/1x8xa800-80g+1x8xl20-48g/{g}/ollama/{f}"
        for g in ("1x8xa800-80g", "1x8xl20-48g")
        for f in ("Modelfile", "start.sh")
    ]
    assert (repo.root / m.dvc.path / box.files[1]).stat().st_mode & 0o111
    # the planned context and slots travel with the Ollama layout: 8 sequences over 4 GPUs, 2 slots each
    (planned,) = box.gguf
    assert (planned.engine, planned.num_ctx, planned.instances, planned.parallel) == ("ollama", 4096, 4, 2)
    assert "PARAMETER num_ctx 4096\n" in files[box.files[0]]
    assert files[box.files[1]].count("OLLAMA_NUM_PARALLEL=2 ") == 4
    shown = _cli(repo, "show", m.ref, "--plans")
    assert shown.returncode == 0, shown.stderr
    assert "1x4xRTX4090-24G" in shown.stdout and "4 servers, one per GPU" in shown.stdout and "TP " not in shown.stdout
    # its columns are Ollama's and llama.cpp's, not vLLM's
    assert "OLLAMA_NUM_PARALLEL" in shown.stdout and "GPU weights / KV cache / offered" in shown.stdout
    assert "max_model_len" not in shown.stdout and "max_num_seqs" not in shown.stdout
    assert f"{box.gguf[0].weights_gpu / (1 << 20):.1f} MiB" in shown.stdout  # one server's offloaded weights
    assert "2 file(s) in artifacts/tiny-qwen2/q8_0/serve/1x4xrtx4090-24g" in shown.stdout
    assert json.loads(_cli(repo, "show", m.ref).stdout)["serving"] == m.serving.model_dump(mode="json")

    # pull places them: a fresh clone gets the plans with the artifact, every file checked
    repo.commit_all("register tiny-qwen2 q8_0 with serving plans")
    git(tmp_path, "clone", "-q", str(repo.root), "clone")
    clone = Repo(tmp_path / "clone", repo.remote, repo.work)
    dest = tmp_path / "pulled"
    pulled = _cli(clone, "pull", m.ref, "--dest", str(dest), "--no-ollama")
    assert pulled.returncode == 0, pulled.stderr
    assert {rel: (dest / rel).read_text() for rel in files} == files
    assert (
        f"serving plans for 1x1xL4-24G, 1x4xRTX4090-24G, 1x8xA800-80G+1x8xL20-48G in {dest}/serve"
        in pulled.stdout
    )

    # other inventories are another registration of the same bytes; a plan that cannot fit (more slots than one
    # llama.cpp context holds) is recorded with the nearest plans that do, and no file; the registration goes through
    _set_serve(repo, {"gpus": ["1xL4-24G"], "context": 4096, "concurrency": 300})
    again = _cli(repo, "convert", "tiny-qwen2", "--variants", "q8_0", "--register")
    assert again.returncode == 0, again.stderr
    after = find_manifest(settings, "tiny-qwen2:q8_0")
    assert after.sha256 == m.sha256 and after.replaces is not None and after.replaces.key == m.key
    (refused,) = after.serving.inventories
    assert refused.plans == [] and refused.files == [] and refused.gguf is None
    assert refused.refused.startswith("1x1xL4-24G: ") and "LLAMA_MAX_SEQ" in refused.refused
    _check_listed(repo, after)
    assert not (repo.root / after.dvc.path / "serve" / "1x1xl4-24g").exists()
    # the suggestion is one `modelmint plan` accepts on the same GPUs
    (nearest,) = refused.nearest
    fits = re.match(r"--concurrency (\d+) on 1x1xL4-24G", nearest)
    assert fits, nearest
    proc = _cli(repo, "plan", m.ref, "--gpus", "1xL4-24G", "--context", "4096", "--concurrency", fits[1])
    assert proc.returncode == 0, (nearest, proc.stderr)
    listed = _cli(repo, "show", m.ref, "--plans")
    assert "refused" in listed.stdout and "nearest: --concurrency" in listed.stdout


# ---------------------------------------------------------------- a checkpoint: tiny-qwen2 FP8 from llmcompressor


@pytest.mark.slow
def test_a_registered_checkpoints_vllm_yaml_passes_vllms_own_parser(
    isolated, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, settings: Settings
) -> None:
    from test_compress import compress_work_dir
    from test_servefiles import _check

    repo = make_repo(tmp_path, models={"tiny-qwen2": ["fp8"]}, work=compress_work_dir(tmp_path_factory))
    _set_serve(repo, {"gpus": ["1xL4-24G", "1x8xA800-80G+1x8xL20-48G"], "context": 8192, "concurrency": 16})
    done = _cli(repo, "compress", "tiny-qwen2", "--register")
    assert done.returncode == 0, done.stderr
    m = find_manifest(repo.settings(), "tiny-qwen2:fp8")
    files = _check_listed(repo, m)
    single, mixed = m.serving.inventories
    assert single.files == [
        f"serve/1x1xl4-24g/{f}" for f in ("docker-run.sh", "helm-values.yaml", "kubernetes.yaml", "vllm.yaml")
    ]
    assert sorted({f.split("/")[2] for f in mixed.files}) == [
        "1x8xa800-80g",
        "1x8xl20-48g",
        "helm-values.yaml",
        "httproute.yaml",  # each type weighted by the sequences it holds
    ]
    # FP8 on the A800 (compute capability 8.0) runs weight-only: the plan says so, the L20 and L4 plans do not
    a800, l20 = mixed.plans
    assert "no FP8 compute" in a800.warnings[0] and l20.warnings == [] and single.plans[0].warnings == []
    configs = {rel: yaml.safe_load(text) for rel, text in files.items() if rel.endswith("vllm.yaml")}
    assert len(configs) == 3
    for cfg in configs.values():
        assert cfg["model"] == "/models/fp8" and cfg["served-model-name"] == "tiny-qwen2-fp8"
        assert cfg["max-model-len"] == 8192 and cfg["max-num-seqs"] >= 16
    # vLLM's own parser, then its engine config built against the placed checkpoint (no weights loaded)
    # (one vLLM process for them all; the last is the same file past the model's context, which must fail)
    d = repo.root / m.dvc.path
    paths = []
    for i, text in enumerate(dict.fromkeys(yaml.safe_dump(c, sort_keys=True) for c in configs.values())):
        paths.append(tmp_path / f"vllm-{i}.yaml")
        paths[-1].write_text(text)
    broken = tmp_path / "vllm-broken.yaml"
    broken.write_text(yaml.safe_dump({**next(iter(configs.values())), "max-model-len": 65536}))
    *verdicts, refused = _check([*paths, broken], d, settings)
    assert verdicts == ["ok"] * len(paths)
    # and it can fail: the same file past the model's context is refused at vLLM's engine-config stage
    assert "at the engine_config stage" in refused
