"""A registry for the recommend and site tests: real registrations (DVC add and push, git commits, serving plans)
of small synthetic artifacts shaped like real models, with figures and standard errors as their gates measured them.

Building SmolLM2's four GGUF and two compressed variants for real costs many CPU minutes (tests/test_smollm2.py);
these tests need the registry's records, not the weights: the GGUFs are headers with SmolLM2-135M's and
Qwen2.5-0.5B's shapes (the planner reads those) and a small tensor, the checkpoints a config.json and one
safetensors file. The figures are SmolLM2's measured ones (the feasibility notes, reference gate profile).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from registry_env import Repo, _qwen_template, isolate, make_repo

from pipelines.core.fsutil import sha256_file
from pipelines.core.gates import Gate
from pipelines.core.report import Figures, Validation, parse_report
from pipelines.core.settings import Settings
from pipelines.registry.register import Candidate, register
from pipelines.source.catalog import load_catalog
from pipelines.store.manifest import Manifest, ParentRef, find_manifest

ROOT = Path(__file__).resolve().parents[1]

# (mean KL, its s.e., same top %, its s.e., dPPL %, MiB of weights)
SMOLLM2 = {
    "q4_k_m": (0.0571, 0.0017, 84.3, 0.7, 8.64, 1.0),
    "q6_k": (0.0104, 0.0003, 92.1, 0.6, 0.96, 1.4),
    "q8_0": (0.0042, 0.00013, 94.6, 0.5, 0.77, 1.8),
    "fp8": (0.0255, 0.0008, 88.7, 0.7, 2.9, 1.6),
    "awq": (0.060, 0.0019, 83.9, 0.8, 9.1, 0.9),
}
TINY = {"q4_k_m": (0.0123, 0.0006, 93.5, 0.6, 3.9, 0.5), "q8_0": (0.0119, 0.0006, 93.9, 0.6, 3.5, 0.9)}
"""tiny-qwen2's two GGUFs tie: their mean KL lie within one standard error of each other."""

SHAPES = {  # llama.cpp's GGUF keys and transformers' config.json fields of the real models
    "smollm2": dict(arch="llama", layers=30, hidden=576, ffn=1536, heads=9, kv=3, ctx=8192, vocab=49152),
    "tiny-qwen2": dict(
        arch="qwen2", layers=24, hidden=896, ffn=4864, heads=14, kv=2, ctx=32768, vocab=151936
    ),
}
EVIL = '<script>alert("x")</script>'


def shaped_gguf(path: Path, model: str, *, mib: float, seed: int = 0, name: str | None = None) -> Path:
    """A well-formed GGUF with the model's real shape keys and ChatML tokens, one random tensor of `mib` MiB."""
    import gguf

    s = SHAPES[model]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), str(s["arch"]))
    w.add_name(name or f"{model}-{seed}")
    w.add_context_length(int(s["ctx"]))
    w.add_block_count(int(s["layers"]))
    w.add_embedding_length(int(s["hidden"]))
    w.add_feed_forward_length(int(s["ffn"]))
    w.add_head_count(int(s["heads"]))
    w.add_head_count_kv(int(s["kv"]))
    w.add_vocab_size(int(s["vocab"]))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b"])
    w.add_token_types([3, 3, 3, 1, 1])
    w.add_eos_token_id(2)
    w.add_bos_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(_qwen_template())
    w.add_tensor(
        "token_embd.weight", rng.standard_normal(max(1, int(mib * (1 << 20) / 4))).astype(np.float32)
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def checkpoint(directory: Path, model: str, *, mib: float, seed: int = 0) -> Path:
    """A compressed-tensors-shaped checkpoint: config.json with the model's shape and one safetensors file."""
    from safetensors.numpy import save_file

    s = SHAPES[model]
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM" if s["arch"] == "llama" else "Qwen2ForCausalLM"],
        "model_type": s["arch"],
        "num_hidden_layers": s["layers"],
        "hidden_size": s["hidden"],
        "intermediate_size": s["ffn"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv"],
        "max_position_embeddings": s["ctx"],
        "vocab_size": s["vocab"],
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized"},
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)
    save_file(
        {
            "model.embed_tokens.weight": rng.standard_normal(max(1, int(mib * (1 << 20) / 4))).astype(
                np.float32
            )
        },
        str(directory / "model.safetensors"),
    )
    return directory


def report(tag: str, figures: tuple[float, ...], *, passed: bool = True, fmt: str = "gguf") -> dict[str, Any]:
    kl, kl_se, top, top_se, dppl, _ = figures
    f = Figures.of(
        mean_kl=kl,
        same_top_pct=top,
        ppl_reference=20.0,
        ppl=20.0 * (1 + dppl / 100),
        tokens=1008,
        mean_kl_stderr=kl_se,
        same_top_stderr=top_se,
        ln_ppl_ratio_stderr=0.004,
    )
    gate = (
        Gate(0.15, 80.0, 1.15, "a test profile all of these pass", noise_sigmas=2.0)
        if passed
        else Gate(0.0001, 99.9, 1.0001, "a gate this variant misses (tests)")
    )
    v = Validation.judge(
        format=fmt,
        reference=f"{tag} reference",  # type: ignore[arg-type]
        evaluation={"text": "eval.txt", "sha256": "e" * 64, "ctx": 128, "chunks": 16},
        figures=f,
        gate=gate,
    )
    return {
        "variant": tag,
        "key": "0" * 64,
        "smoke": {"tokens_generated": 32},
        "validation": v.model_dump(mode="json"),
    }


def candidate_for(
    settings: Settings,
    tmp: Path,
    model: str,
    tag: str,
    figures: tuple[float, ...],
    *,
    seed: int = 0,
    revision_seed: int = 0,
    name: str | None = None,
) -> Candidate:
    """A validated variant as a build would hand it over, for the real registration code."""
    entry = load_catalog(settings.catalog_path).get(model)
    out = tmp / f"build-{model}-{tag}-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    compressed = tag in ("fp8", "awq")
    rep = report(tag, figures, fmt="compressed-tensors" if compressed else "gguf")
    (out / f"{model}-{tag}.report.json").write_text(json.dumps(rep))
    source = {
        "kind": "generated",
        "repo": None,
        "revision": None,
        "content_sha256": f"{revision_seed:x}" * 64,
    }
    common: dict[str, Any] = dict(
        entry=entry,
        tag=tag,
        source=source,
        report=parse_report(rep),
        toolchain={"modelmint": "0.1.0", "llama.cpp": "0c1e570"},
        recipe={
            "format": "compressed-tensors" if compressed else "gguf",
            "quant": tag,
            "seed": seed,
            **({"recipe": {"scheme": "FP8_DYNAMIC"}} if tag == "fp8" else {}),
        },
        report_sha256=sha256_file(out / f"{model}-{tag}.report.json"),
    )
    if compressed:
        ckpt = checkpoint(out / f"{model}-{tag}", model, mib=figures[5], seed=seed)
        files = (ckpt / "model.safetensors", ckpt / "config.json")
        return Candidate(
            files=files,
            sha256=sha256_file(files[0]),
            size_bytes=files[0].stat().st_size,
            parent=None,
            root=ckpt,
            **common,
        )
    g = shaped_gguf(out / f"{model}-{tag}.gguf", model, mib=figures[5], seed=seed, name=name)
    return Candidate(
        files=(g,),
        sha256=sha256_file(g),
        size_bytes=g.stat().st_size,
        parent=ParentRef(artifact=f"{model}:f16", file=f"{model}-f16.gguf", sha256="b" * 64, size=123),
        **common,
    )


@dataclass
class SiteRegistry:
    repo: Repo
    settings: Settings



def register_built_q4_k_m(settings: Settings, builds: Path, model: str = "tiny-qwen2") -> Candidate:
    """`model`'s q4_k_m really built (the f16 converted and quantized by llama.cpp) and registered by the real code,
    with candidate_for's validation figures: what recommend and the serving plans read from a registered GGUF."""
    import dataclasses
    import shutil

    from pipelines.gguf.build import ensure_base, ensure_quant, plan_gguf

    plan = plan_gguf(load_catalog(settings.catalog_path).get(model), settings, quants=["q4_k_m"])
    ensure_base(plan)
    ensure_quant(plan, "q4_k_m")
    shaped = candidate_for(settings, builds, model, "q4_k_m", (0.0123, 0.0006, 93.5, 0.6, 3.9, 0.5))
    real = shaped.files[0]
    shutil.copyfile(plan.quant_path("q4_k_m"), real)  # the real GGUF in place of the header-only one
    built = dataclasses.replace(shaped, sha256=sha256_file(real), size_bytes=real.stat().st_size)
    register(settings, built)
    return built


@contextmanager
def registered_q4_k_m_serving(base: Path, serve: dict[str, Any]) -> Iterator[tuple[Repo, Manifest]]:
    """tiny-qwen2's real q4_k_m registered by the real code (register_built_q4_k_m) in a fresh repository under
    `base`, its catalog entry's `serve:` block set to `serve` first, so that registration writes those serving plans."""
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        repo = make_repo(base, models={"tiny-qwen2": ["q4_k_m"]})
        catalog = repo.root / "registry" / "catalog.yaml"
        raw = yaml.safe_load(catalog.read_text())
        for entry in raw["models"]:
            entry["serve"] = serve
        catalog.write_text(yaml.safe_dump(raw, sort_keys=False))
        settings = repo.settings()
        register_built_q4_k_m(settings, base / "builds")
        yield repo, find_manifest(settings, "tiny-qwen2:q4_k_m")


def text_files(root: Path) -> dict[str, str]:
    """Every file under `root` by its relative path, with its text: two trees compared byte for byte."""
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def modelmint_here(repo: Repo, *args: str) -> subprocess.CompletedProcess[str]:
    """modelmint from this tree (python -m, so this checkout's own code runs), in `repo`."""
    env = {**repo.env(), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env, capture_output=True, text=True,
                          cwd=repo.root, timeout=300)


def build(base: Path, *, evil: bool = True) -> SiteRegistry:
    """tiny-qwen2 (two GGUFs that tie) and smollm2 (three GGUFs, fp8 and awq; q4_k_m registered twice, its second
    version worse), committed to git; with `evil`, a description, model name and card holding <script>."""
    repo = make_repo(
        base, models={"tiny-qwen2": ["q4_k_m", "q8_0"], "smollm2": ["q4_k_m", "q6_k", "q8_0", "fp8", "awq"]}
    )
    settings = repo.settings()
    tmp = base / "builds"
    for tag, fig in TINY.items():
        register(settings, candidate_for(settings, tmp, "tiny-qwen2", tag, fig, name=EVIL if evil else None))
    for tag, fig in SMOLLM2.items():
        register(settings, candidate_for(settings, tmp, "smollm2", tag, fig))
    repo.commit_all("register tiny-qwen2 and smollm2")
    worse = (0.0702, 0.0021, 82.0, 0.7, 10.2, 1.0)  # a later source commit made q4_k_m worse
    register(settings, candidate_for(settings, tmp, "smollm2", "q4_k_m", worse, seed=1, revision_seed=1))
    repo.commit_all("smollm2:q4_k_m from a newer source commit")
    if evil:  # after registering: a changed catalog entry would refuse further registrations of it
        card = settings.repo_dir / "artifacts" / "tiny-qwen2" / "q8_0" / "README.md"
        card.write_text(card.read_text() + f"\n{EVIL}\n")
        catalog = yaml.safe_load(settings.catalog_path.read_text())
        for m in catalog["models"]:
            m["description"] = f"{m.get('description', '')} {EVIL} & more"
        settings.catalog_path.write_text(yaml.safe_dump(catalog, sort_keys=False))
    return SiteRegistry(repo, settings)


@pytest.fixture(scope="module")
def site_registry(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("site-registry")
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        yield build(base)
