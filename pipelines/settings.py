"""The one place modelmint reads its environment; everything else receives a Settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

_PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    home: Path
    """Caches that outlive a checkout: toolchains, generated models, the hub download cache."""
    work_dir: Path
    """Where builds are written (f16 and quantized GGUFs, reports)."""
    catalog_path: Path
    hf_endpoint: str | None = None
    hf_token: str | None = field(default=None, repr=False)
    threads: int = 0
    """Threads for llama.cpp tools; 0 means all cores."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home = Path(env.get("MODELMINT_HOME") or Path.home() / ".cache" / "modelmint").expanduser()
        work = Path(env.get("MODELMINT_WORK_DIR") or _PROJECT_ROOT / "build").expanduser()
        catalog = Path(env.get("MODELMINT_CATALOG") or _PROJECT_ROOT / "registry" / "catalog.yaml")
        return cls(
            home=home,
            work_dir=work,
            catalog_path=catalog,
            hf_endpoint=env.get("HF_ENDPOINT") or None,
            hf_token=env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None,
            threads=int(env.get("MODELMINT_THREADS") or 0),
        )

    @property
    def toolchains_dir(self) -> Path:
        return self.home / "toolchains"

    @property
    def models_dir(self) -> Path:
        """Generated models (the bundled tiny ones) and local snapshots of hub sources."""
        return self.home / "models"

    @property
    def effective_threads(self) -> int:
        return self.threads or os.cpu_count() or 1


def project_root() -> Path:
    return _PROJECT_ROOT
