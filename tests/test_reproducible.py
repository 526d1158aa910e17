"""The same catalog entry at the same pins gives the same bytes in another checkout and work directory.

tiny-qwen2 with an importance matrix (the GGUF path), and its FP8 checkpoint (the compressed-tensors path).
The imatrix variant's provenance (calibration text, the matrix's sha256 and format) reaches its report,
manifest and model card, and names no path of the machine that built it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.compressed.build import ensure_compressed, plan_compressed
from pipelines.core.fsutil import sha256_file
from pipelines.core.ggufheader import inspect_gguf, read_imatrix
from pipelines.core.settings import Settings, project_root
from pipelines.core.texts import EVAL_TEXT, text_ref
from pipelines.gguf.build import build_gguf
from pipelines.source.catalog import load_catalog

pytestmark = pytest.mark.slow

NAME = "tiny-qwen2"

# Builds the entry's f16, imatrix and q4_k_m with the steps of pipelines.gguf.build, in whichever checkout
# PYTHONPATH names, and prints where the package and the outputs are.
_STEPS = """
import json
import pipelines
from pipelines.gguf.build import ensure_base, ensure_imatrix, ensure_quant, plan_gguf
from pipelines.source.catalog import load_catalog
from pipelines.core.settings import Settings

settings = Settings.from_env()
plan = plan_gguf(load_catalog(settings.catalog_path).get("tiny-qwen2"), settings)
ensure_base(plan)
ensure_imatrix(plan)
ensure_quant(plan, "q4_k_m")
print(json.dumps({"package": pipelines.__file__, "files": [str(plan.base_path), str(plan.imatrix_path),
                                                           str(plan.quant_path("q4_k_m"))]}))
"""


def _catalog(path: Path) -> Path:
    entry = {
        "name": NAME, "source": {"generated": "tiny-qwen2"}, "license": "apache-2.0", "chat_family": "chatml",
        "gate_profile": "tiny", "variants": {"gguf": {"outtype": "f16", "quants": ["q4_k_m"], "imatrix": True},
                                             "fp8": {}},
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"models": [entry]}))
    return path


def _settings(work: Path, catalog: Path, repo: Path | None = None) -> Settings:
    base = Settings.from_env()
    return Settings(home=base.home, work_dir=work, catalog_path=catalog, threads=base.threads,
                    repo_dir=repo or base.repo_dir)


def _checkout_copy(dest: Path) -> Path:
    """A second checkout of this tree at another path: the package, its data and the toolchain pins."""
    root = project_root()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("pipelines", "toolchains"):
        shutil.copytree(root / part, dest / part, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def imatrix_build(tmp_path_factory: pytest.TempPathFactory):
    """tiny-qwen2 with an importance matrix, built and validated in this checkout."""
    tmp = tmp_path_factory.mktemp("repro")
    settings = _settings(tmp / "work-a", _catalog(tmp / "catalog.yaml"), tmp / "repo-a")
    entry = load_catalog(settings.catalog_path).get(NAME)
    return settings, build_gguf(entry, settings)


def test_imatrix_gguf_is_byte_identical_in_another_checkout_and_work_dir(imatrix_build, tmp_path: Path) -> None:
    settings, result = imatrix_build
    plan = result.plan
    assert plan is not None
    mine = [plan.base_path, plan.imatrix_path, plan.quant_path("q4_k_m")]

    other = _checkout_copy(tmp_path / "checkout-b")
    work_b = tmp_path / "work-b"
    env = {**os.environ, "PYTHONPATH": str(other), "MODELMINT_WORK_DIR": str(work_b),
           "MODELMINT_CATALOG": str(settings.catalog_path), "MODELMINT_REPO": str(other)}
    proc = subprocess.run([sys.executable, "-c", _STEPS], cwd=other, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(theirs["package"]).resolve().is_relative_to(other.resolve())  # really the other checkout

    for a, b in zip(mine, map(Path, theirs["files"]), strict=True):
        assert a is not None and a.name == b.name and b.is_relative_to(work_b)
        assert sha256_file(a) == sha256_file(b), f"{a.name} differs between the two builds"
        data = a.read_bytes()
        for where in (settings.work_dir, work_b, project_root(), other):
            assert str(where).encode() not in data, f"{a.name} names {where}"


def test_imatrix_variant_names_its_calibration_portably(imatrix_build) -> None:
    _, result = imatrix_build
    plan = result.plan
    assert plan is not None and plan.imatrix_path is not None
    train, evaluation = text_ref("train.txt"), text_ref(EVAL_TEXT)
    imatrix_sha = sha256_file(plan.imatrix_path)

    made = read_imatrix(plan.imatrix_path)
    assert made["datasets"] == ["train.txt"] and made["chunks"] > 0 and made["chunk_size"] == 128
    meta = inspect_gguf(plan.quant_path("q4_k_m")).metadata
    assert meta["quantize.imatrix.dataset"] == "train.txt"
    assert meta["quantize.imatrix.file"] == plan.imatrix_path.name
    assert meta["quantize.imatrix.chunks_count"] == made["chunks"]
    assert meta["modelmint.imatrix.dataset.sha256"] == train.sha256 != evaluation.sha256
    assert meta["modelmint.imatrix.sha256"] == imatrix_sha
    assert meta["modelmint.imatrix.format"] == "gguf"

    v = result.variants["q4_k_m"]
    assert v.passed, v.failures
    assert v.report.calibration == {
        "text": "train.txt", "sha256": train.sha256, "ctx": 128, "chunks": made["chunks"],
        "imatrix": {"file": plan.imatrix_path.name, "sha256": imatrix_sha, "format": "gguf"},
    }  # fmt: skip
    assert v.report.evaluation == {"text": EVAL_TEXT, "sha256": evaluation.sha256, "ctx": 128, "chunks": 16}


def test_imatrix_provenance_reaches_the_manifest_and_the_card(imatrix_build) -> None:
    from pipelines.registry.register import register
    from pipelines.store.formats.gguf import candidate_from_gguf

    settings, result = imatrix_build
    plan = result.plan
    assert plan is not None and plan.imatrix_path is not None
    reg = register(settings, candidate_from_gguf(plan, result.variants["q4_k_m"]), track_with_dvc=False, push=False)
    recipe = reg.manifest.recipe
    imatrix_sha = sha256_file(plan.imatrix_path)
    assert recipe["imatrix"] is True
    assert recipe["calibration"]["text"] == "train.txt"
    assert recipe["calibration"]["sha256"] == text_ref("train.txt").sha256
    assert recipe["calibration"]["chunks"] > 0
    assert recipe["calibration"]["imatrix"] == {"file": plan.imatrix_path.name, "sha256": imatrix_sha, "format": "gguf"}
    assert recipe["eval"] == {"text": EVAL_TEXT, "sha256": text_ref(EVAL_TEXT).sha256, "ctx": 128, "chunks": 16}

    card = (settings.repo_dir / "artifacts" / NAME / "q4_k_m" / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])["modelmint"]
    assert front["calibration"] == recipe["calibration"] and front["evaluation"] == recipe["eval"]
    assert f"GGUF imatrix `{plan.imatrix_path.name}`, sha256 `{imatrix_sha}`" in card
    assert f"`train.txt` (sha256 `{text_ref('train.txt').sha256}`)" in card
    assert f"held-out `{EVAL_TEXT}` (sha256 `{text_ref(EVAL_TEXT).sha256}`, 16 chunks" in card
    assert str(settings.work_dir) not in card and str(project_root()) not in card


def test_fp8_checkpoint_is_byte_identical_in_another_work_dir(tmp_path: Path) -> None:
    catalog = _catalog(tmp_path / "catalog.yaml")
    trees = []
    for work in (tmp_path / "work-a", tmp_path / "elsewhere" / "work-b"):
        settings = _settings(work, catalog)
        plan = plan_compressed(load_catalog(catalog).get(NAME), settings, schemes=["fp8"])
        step = ensure_compressed(plan, "fp8")
        trees.append({p.relative_to(step.path).as_posix(): sha256_file(p) for p in step.path.rglob("*") if p.is_file()})
        for p in step.path.rglob("*"):
            if p.is_file():
                assert str(work).encode() not in p.read_bytes(), f"{p.name} names its work dir"
    assert trees[0] == trees[1], {k: (trees[0].get(k), trees[1].get(k)) for k in trees[0].keys() | trees[1].keys()
                                  if trees[0].get(k) != trees[1].get(k)}
    assert any(name.endswith(".safetensors") for name in trees[0])
