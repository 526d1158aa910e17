"""The one place modelmint reads its environment; everything else receives a Settings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pipelines import PACKAGE

if TYPE_CHECKING:
    from pipelines.core.errors import DiskLocation

_PROJECT_ROOT = PACKAGE.parent
DEFAULT_PACKAGE_INDEX = "https://pypi.org/simple"


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
    repo_dir: Path = _PROJECT_ROOT
    """The git + DVC repository holding the catalog, dvc.yaml, the manifests and the registered artifacts."""
    prefect_home: Path | None = None
    """PREFECT_HOME of the embedded server and worker (SQLite database, task results); default home/prefect."""
    prefect_port: int = 4200
    gpu_slots: int = 1
    """Size of the `gpu` global concurrency limit that every GPU step holds a slot of."""
    prefect_crash_after_s: int = 120
    """A run of the embedded stack silent this long (no heartbeat; runs send one every 30 s) is marked Crashed."""
    webhook_secret: str | None = field(default=None, repr=False)
    """The secret a Hugging Face webhook sends in X-Webhook-Secret (MODELMINT_WEBHOOK_SECRET)."""
    package_index: str = DEFAULT_PACKAGE_INDEX
    """The simple repository API (PEP 503 / 691) wheel sources are downloaded from: MODELMINT_PACKAGE_INDEX, else
    pip's PIP_INDEX_URL, else PyPI."""
    ray_address: str | None = None
    """MODELMINT_RAY_ADDRESS: a Ray cluster (host:port of its GCS) the convert flow's tasks run on; None runs
    them in the flow's own process (docs/ray.md)."""
    ray_resources: str | None = None
    """MODELMINT_RAY_RESOURCES: JSON, step name → extra Ray resources its tasks ask for, e.g.
    {"compress": {"gpu-H100-80G": 1}} to place a step on the nodes that offer that custom resource."""
    registry_username: str | None = None
    """OCI registry credentials (MODELMINT_REGISTRY_USERNAME / _PASSWORD); else the docker config's entry for the host."""
    registry_password: str | None = field(default=None, repr=False)
    docker_config: Path | None = None
    """The docker config file whose `auths` hold registry credentials ($DOCKER_CONFIG/config.json, ~/.docker/…)."""
    registry_ca: Path | None = None
    """A CA bundle (PEM) that signs the OCI registry's certificate (MODELMINT_REGISTRY_CA); None: the system's."""
    serve_gpus: tuple[str, ...] | None = None
    """MODELMINT_SERVE_GPUS: comma-separated GPU inventories (`1xL4-24G,2x8xH100-80G`) every registered variant gets
    serving plans for, instead of its catalog entry's serve.gpus (docs/serving.md)."""
    oci_registry: str | None = None
    """MODELMINT_OCI_REGISTRY: HOST[:PORT]/NAMESPACE the convert flow publishes every registered variant to (checked
    by pipelines.publish.oci.RegistryRef when a run starts); None publishes nothing."""
    oci_insecure: bool = False
    """MODELMINT_OCI_INSECURE=1: speak plain HTTP to that registry (a registry on a trusted network)."""
    signing_key: Path | None = field(default=None, repr=False)
    """MODELMINT_SIGNING_KEY: the PEM private key (EC) registration signs every artifact with; never in the
    repository, never logged (pipelines/registry/signing.py). None: artifacts are registered unsigned."""
    signing_cert: Path | None = None
    """MODELMINT_SIGNING_CERT: the signing key's certificate, then its chain up to (not including) the root, in
    one PEM file: signatures carry the chain instead of naming a bare key (docs/registry.md, "signing")."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home = Path(env.get("MODELMINT_HOME") or Path.home() / ".cache" / "modelmint").expanduser()
        work = Path(env.get("MODELMINT_WORK_DIR") or _PROJECT_ROOT / "build").expanduser()
        # DVC_ROOT: set by `dvc repro` for stage commands, so a stage registers into the repository DVC runs.
        repo = Path(env.get("MODELMINT_REPO") or env.get("DVC_ROOT") or _PROJECT_ROOT).expanduser()
        catalog = Path(env.get("MODELMINT_CATALOG") or repo / "registry" / "catalog.yaml")
        return cls(
            home=home,
            work_dir=work,
            catalog_path=catalog,
            hf_endpoint=env.get("HF_ENDPOINT") or None,
            hf_token=env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None,
            threads=_int(env, "MODELMINT_THREADS", 0),
            repo_dir=repo,
            prefect_home=Path(env["MODELMINT_PREFECT_HOME"]).expanduser() if env.get("MODELMINT_PREFECT_HOME") else None,
            prefect_port=_int(env, "MODELMINT_PREFECT_PORT", 4200),
            gpu_slots=_int(env, "MODELMINT_GPU_SLOTS", 1),
            prefect_crash_after_s=_int(env, "MODELMINT_CRASH_AFTER_S", 120),
            webhook_secret=env.get("MODELMINT_WEBHOOK_SECRET") or None,
            package_index=env.get("MODELMINT_PACKAGE_INDEX") or env.get("PIP_INDEX_URL") or DEFAULT_PACKAGE_INDEX,
            ray_address=env.get("MODELMINT_RAY_ADDRESS") or None,
            ray_resources=env.get("MODELMINT_RAY_RESOURCES") or None,
            registry_username=env.get("MODELMINT_REGISTRY_USERNAME") or None,
            registry_password=env.get("MODELMINT_REGISTRY_PASSWORD") or None,
            docker_config=Path(env.get("DOCKER_CONFIG") or Path.home() / ".docker").expanduser() / "config.json",
            registry_ca=Path(env["MODELMINT_REGISTRY_CA"]).expanduser() if env.get("MODELMINT_REGISTRY_CA") else None,
            serve_gpus=_serve_gpus(env.get("MODELMINT_SERVE_GPUS")),
            oci_registry=env.get("MODELMINT_OCI_REGISTRY") or None,
            oci_insecure=_flag(env, "MODELMINT_OCI_INSECURE"),
            signing_key=Path(env["MODELMINT_SIGNING_KEY"]).expanduser() if env.get("MODELMINT_SIGNING_KEY") else None,
            signing_cert=Path(env["MODELMINT_SIGNING_CERT"]).expanduser() if env.get("MODELMINT_SIGNING_CERT") else None,
        )

    SECRETS = ("hf_token", "registry_username", "registry_password", "webhook_secret")
    """Credentials: never stored, never part of a key."""
    SECRET_SOURCES: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "hf_token": ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"),
        "registry_username": ("MODELMINT_REGISTRY_USERNAME",),
        "registry_password": ("MODELMINT_REGISTRY_PASSWORD",),
        "webhook_secret": ("MODELMINT_WEBHOOK_SECRET",),
    }
    """Each credential's environment variables, as from_env reads them (a test holds the two to each other)."""
    SECRET_ENV = tuple(var for names in SECRET_SOURCES.values() for var in names)
    """The environment variables from_env reads credentials from: never passed on to another process's
    environment (pipelines.core.runner strips them from every tool it starts)."""
    ORCHESTRATION = ("prefect_home", "prefect_port", "gpu_slots", "prefect_crash_after_s", "ray_address",
                     "ray_resources", "docker_config", "registry_ca", "oci_registry", "oci_insecure", "signing_key",
                     "signing_cert")
    """Where and how work is run or published: says nothing about what a build plan produces."""

    def without_secrets(self) -> Settings:
        """These settings with every credential removed: what may be stored (a cached task result, a report)."""
        cleared: dict[str, Any] = dict.fromkeys(self.SECRETS)
        return replace(self, **cleared)

    def plan_fields(self) -> dict[str, str]:
        """The settings that decide what a build plan is (where its outputs go, its sources, its threads), as
        strings: no credential, no orchestration setting (cache keys hash these)."""
        skip = {*self.SECRETS, *self.ORCHESTRATION}
        return {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name not in skip}

    @property
    def toolchains_dir(self) -> Path:
        return self.home / "toolchains"

    @property
    def wheels_dir(self) -> Path:
        """Downloaded wheels of wheel sources, one directory per sha256 (the content is the key)."""
        return self.home / "wheels"

    @property
    def models_dir(self) -> Path:
        """Generated models (the bundled tiny ones) and local snapshots of hub sources."""
        return self.home / "models"

    @property
    def manifests_dir(self) -> Path:
        """One JSON manifest per registered artifact: registry/manifests/<name>/<tag>.json (in git)."""
        return self.repo_dir / "registry" / "manifests"

    @property
    def artifacts_dir(self) -> Path:
        """Registered artifact directories, artifacts/<name>/<tag>/ (DVC-tracked, never in git): the one root
        register.artifact_dir places them under; manifests record the same path relative to the repository."""
        return self.repo_dir / "artifacts"

    @property
    def dvc_site_cache_dir(self) -> Path:
        """DVC's per-repo state and index databases (DVC_SITE_CACHE_DIR), kept with modelmint's caches."""
        return self.home / "dvc" / "site-cache"

    @property
    def prefect_dir(self) -> Path:
        return self.prefect_home or self.home / "prefect"

    @property
    def prefect_api_url(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}/api"

    @property
    def effective_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    def disk_location(self, path: Path, *, dvc_cache: Path | None = None) -> DiskLocation | None:
        """Which of modelmint's directories holds `path` (the innermost one), or None.

        `dvc_cache` is the DVC cache directory when it is known (a configured `cache.dir` may be anywhere);
        otherwise the default `.dvc/cache` of the repository counts.
        """
        places: list[tuple[DiskLocation, Path]] = [
            ("work_dir", self.work_dir),
            ("artifacts", self.artifacts_dir),
            ("dvc_cache", dvc_cache or self.repo_dir / ".dvc" / "cache"),
            ("home", self.home),
            ("repo", self.repo_dir),
        ]
        target = Path(path).resolve()
        holding = [(len(d.resolve().parts), name) for name, d in places if target.is_relative_to(d.resolve())]
        return max(holding)[1] if holding else None


def _serve_gpus(value: str | None) -> tuple[str, ...] | None:
    """MODELMINT_SERVE_GPUS as a tuple of inventories, each checked against the GPU profiles.

    Raises:
        ConfigError: an unknown GPU or a malformed inventory, naming the variable.
    """
    if not value or not value.strip():
        return None
    from pipelines.core.errors import ConfigError
    from pipelines.core.gpus import parse_cluster

    inventories = tuple(v.strip() for v in value.split(",") if v.strip())
    for inventory in inventories:
        try:
            parse_cluster(inventory)
        except ConfigError as err:
            raise ConfigError(f"MODELMINT_SERVE_GPUS: {err.message}", hint=err.hint) from None
    return inventories


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    """A whole-number variable (unset or empty: `default`).

    Raises:
        ConfigError: anything else, naming the variable (int()'s ValueError named neither it nor the fix).
    """
    value = (env.get(name) or "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        from pipelines.core.errors import ConfigError

        raise ConfigError(f"{name}={env[name]!r} is not a whole number",
                          hint=f"set {name} to a number (e.g. {name}={default}) or unset it") from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off (or unset).

    Raises:
        ConfigError: anything else (a typo must not silently mean no).
    """
    value = (env.get(name) or "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    from pipelines.core.errors import ConfigError

    raise ConfigError(f"{name}={env[name]!r} is neither yes nor no", hint=f"set {name}=1 or {name}=0")


def project_root() -> Path:
    return _PROJECT_ROOT
