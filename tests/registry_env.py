"""Fixtures for the registry, pull, flow and deployment tests: real git + DVC repositories in temp dirs.

Every cache and config those tools read is redirected: DVC's global, system and site directories, git's
global config, PREFECT_HOME, and MODELMINT_HOME (a temp dir that links to the real toolchains and
generated models, so that the pinned llama.cpp is not rebuilt per test).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipelines.core.report import parse_report
from pipelines.core.settings import Settings, project_root
from pipelines.source.catalog import COMPRESSED_VARIANTS, GGUF_QUANT_TYPES, load_catalog
from pipelines.store import dvcgen

ROOT = project_root()
VENV_BIN = Path(sys.executable).parent
REAL_HOME = Settings.from_env().home


def flip_middle(path: Path) -> None:
    """Damage a file in place, its size kept: 64 bytes in the middle inverted (a bad disk, a hand edit) - what only a
    hash finds."""
    path.chmod(0o644)
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid : mid + 64] = bytes(b ^ 0xFF for b in raw[mid : mid + 64])
    path.write_bytes(bytes(raw))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def dvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, check=check, capture_output=True, text=True)


def isolate(env: Path, mp: pytest.MonkeyPatch) -> Path:
    """Redirect every cache and config git, DVC, Prefect and modelmint read into `env`."""
    home = env / "modelmint"
    home.mkdir(parents=True)
    for shared in ("toolchains", "models"):
        (REAL_HOME / shared).mkdir(parents=True, exist_ok=True)
        (home / shared).symlink_to(REAL_HOME / shared)
    gitconfig = env / "gitconfig"
    gitconfig.write_text("[user]\n\tname = modelmint tests\n\temail = tests@modelmint.invalid\n[init]\n\tdefaultBranch = main\n")
    for key, value in {
        "MODELMINT_HOME": home,
        "PREFECT_HOME": env / "prefect",
        "MODELMINT_PREFECT_HOME": env / "prefect",
        "DVC_GLOBAL_CONFIG_DIR": env / "dvc-global",
        "DVC_SYSTEM_CONFIG_DIR": env / "dvc-system",
        "DVC_SITE_CACHE_DIR": env / "dvc-site",
        "DVC_NO_ANALYTICS": "1",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "GIT_CONFIG_GLOBAL": gitconfig,
        "GIT_CONFIG_NOSYSTEM": "1",
        "DOCKER_CONFIG": env / "docker",  # `registry serve` records its push credentials there, as `docker login`
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }.items():
        mp.setenv(key, str(value))
    # a registry set in the developer's shell must not make every flow test publish to it
    for key in ("MODELMINT_REPO", "MODELMINT_CATALOG", "MODELMINT_WORK_DIR", "PREFECT_API_URL", "PREFECT_PROFILES_PATH",
                "MODELMINT_OCI_REGISTRY", "MODELMINT_OCI_INSECURE", "MODELMINT_SERVE_GPUS"):
        mp.delenv(key, raising=False)
    return env


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Redirect every cache and config git, DVC, Prefect and modelmint read into `tmp_path/env`."""
    return isolate(tmp_path / "env", monkeypatch)


@dataclass
class Repo:
    root: Path
    remote: Path
    work: Path

    def settings(self, **overrides: Any) -> Settings:
        env = {**os.environ, "MODELMINT_REPO": str(self.root), "MODELMINT_WORK_DIR": str(self.work)}
        env.update({k: str(v) for k, v in overrides.items()})
        return Settings.from_env(env)

    def env(self) -> dict[str, str]:
        return {**os.environ, "MODELMINT_REPO": str(self.root), "MODELMINT_WORK_DIR": str(self.work)}

    def commit_all(self, message: str) -> None:
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "-m", message)


def make_repo(base: Path, *, models: dict[str, list[str]] | None = None, work: Path | None = None) -> Repo:
    """A git + DVC repository laid out like the project: catalog, toolchain pins, dvc.yaml, a local remote.

    `models` maps catalog names to the variants to keep: GGUF quant types and compressed-tensors schemes
    (default: tiny-qwen2 with q4_k_m and q8_0).
    """
    models = models or {"tiny-qwen2": ["q4_k_m", "q8_0"]}
    root, remote = base / "repo", base / "remote"
    (root / "registry").mkdir(parents=True)
    (root / "toolchains").mkdir()
    remote.mkdir()
    raw = yaml.safe_load((ROOT / "registry" / "catalog.yaml").read_text())
    raw["models"] = [m for m in raw["models"] if m["name"] in models]
    for m in raw["models"]:
        # Only the variants asked for: compressed-tensors ones (llmcompressor, minutes each) are asked for
        # by their own tests.
        keep = models[m["name"]]
        quants = [v for v in keep if v in GGUF_QUANT_TYPES]
        m["variants"] = {
            "gguf": {**m["variants"]["gguf"], "quants": quants} if quants else None,
            **{v: m["variants"].get(v) or {} for v in keep if v in COMPRESSED_VARIANTS},
        }
    (root / "registry" / "catalog.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    for pins in ("llama-cpp.env", "llmcompressor.env"):
        shutil.copy(ROOT / "toolchains" / pins, root / "toolchains" / pins)
    shutil.copy(ROOT / ".gitignore", root / ".gitignore")
    shutil.copytree(ROOT / ".dvc", root / ".dvc", ignore=shutil.ignore_patterns("config.local", "tmp", "cache"))
    shutil.copy(ROOT / ".dvcignore", root / ".dvcignore")
    git(root, "init", "-q")
    # The project's own .dvc/config, with the default remote pointed at this test's directory.
    dvc(root, "remote", "modify", "local", "url", str(remote))
    dvcgen.write(load_catalog(root / "registry" / "catalog.yaml"), root / "dvc.yaml")
    repo = Repo(root, remote, work or base / "work")
    repo.commit_all("a modelmint project")
    return repo


@pytest.fixture
def repo(isolated: Path, tmp_path: Path) -> Repo:
    return make_repo(tmp_path)


# ---------------------------------------------------------------- a small real GGUF and a validated candidate


def _qwen_template() -> str:
    """The real Qwen2.5 chat template from the pinned llama.cpp tree (what tiny-qwen2 carries too)."""
    from pipelines.core.toolchains import llama_cpp

    return (llama_cpp(Settings.from_env()).source / "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja").read_text()


def write_gguf(path: Path, *, seed: int = 0, mib: float = 0.25, tensors: dict[str, Any] | None = None,
               name: str | None = None) -> Path:
    """A small but well-formed GGUF (gguf-py's writer) with a ChatML tokenizer: enough for the registry and the
    Modelfile, not for inference. `tensors` (name -> array) replaces the one random tensor of `mib` MiB."""
    import gguf

    if tensors is None:
        rng = np.random.default_rng(seed)
        n = max(1, int(mib * (1 << 20) / 4))
        tensors = {"token_embd.weight": rng.standard_normal(n).astype(np.float32)}
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(name or f"synthetic-{seed}")
    w.add_context_length(2048)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b"])
    w.add_token_types([3, 3, 3, 1, 1])
    w.add_eos_token_id(2)
    w.add_bos_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(_qwen_template())
    for tensor, data in tensors.items():
        w.add_tensor(tensor, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def judged(mean_kl: float, same_top_pct: float, *, ppl: tuple[float, float] = (10.0, 10.0), gate: Any = None,
           fmt: str = "gguf") -> dict[str, Any]:
    """A report's validation block with these figures (ppl: the reference's, the variant's), as JSON."""
    from pipelines.core.gates import Gate
    from pipelines.core.report import Figures, Validation

    figures = Figures.of(mean_kl=mean_kl, same_top_pct=same_top_pct, ppl_reference=ppl[0], ppl=ppl[1], tokens=1008)
    return Validation.judge(format=fmt, reference="tiny-qwen2-f16.gguf",  # type: ignore[arg-type]
                            evaluation={"text": "eval.txt", "sha256": "e" * 64, "ctx": 128, "chunks": 16},
                            figures=figures, gate=gate or Gate(0.15, 85.0, 1.15, "tiny")).model_dump(mode="json")


def candidate(
    settings: Settings, tmp: Path, *, tag: str = "q4_k_m", seed: int = 0, name: str = "tiny-qwen2", mib: float = 0.25
) -> Any:
    """A registration candidate as a validated build would hand it over (synthetic GGUF and report)."""
    from pipelines.core.fsutil import sha256_file
    from pipelines.registry.register import Candidate
    from pipelines.store.manifest import ParentRef

    entry = load_catalog(settings.catalog_path).get(name)
    out = tmp / f"build-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    gguf_path = write_gguf(out / f"{name}-{tag}.gguf", seed=seed, mib=mib)
    report = {
        "variant": tag, "key": "0" * 64, "smoke": {"tokens_generated": 32},
        "validation": judged(0.0123, 93.5, ppl=(10.1, 10.5)),
    }
    report_path = out / f"{name}-{tag}.report.json"
    report_path.write_text(json.dumps(report))
    return Candidate(
        entry=entry, tag=tag, files=(gguf_path,), sha256=sha256_file(gguf_path),
        size_bytes=gguf_path.stat().st_size,
        source={"kind": "generated", "repo": None, "revision": None, "content_sha256": "a" * 64},
        parent=ParentRef(artifact=f"{name}:f16", file=f"{name}-f16.gguf", sha256="b" * 64, size=123),
        toolchain={"modelmint": "0.1.0", "llama.cpp": "0c1e570"},
        recipe={"format": "gguf", "quant": tag, "seed": seed},
        report=parse_report(report), report_sha256=sha256_file(report_path), source_dir=None,
    )


# ---------------------------------------------------------------- reading a flow run back from the Prefect API


def task_runs(client: Any, flow_run_id: Any) -> list[Any]:
    """Every task run of a flow run, in start order."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(runs, key=lambda r: (r.start_time or r.expected_start_time or r.created))


def artifacts(client: Any, flow_run_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    return client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


class PopenCounter:
    """Counts every process started (tools, DVC, git) while it is installed; the real Popen still runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.argv: list[list[str]] = []
        real = subprocess.Popen
        counter = self

        class Counting(real):  # type: ignore[misc,valid-type]
            def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
                counter.argv.append([str(x) for x in (args if isinstance(args, list | tuple) else [args])])
                super().__init__(args, *a, **kw)

        monkeypatch.setattr(subprocess, "Popen", Counting)
