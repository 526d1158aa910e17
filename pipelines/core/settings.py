"""The one place modelmint reads its environment; everything else receives a Settings."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pipelines import PACKAGE

if TYPE_CHECKING:
    from pipelines.core.errors import DiskLocation

_PROJECT_ROOT = PACKAGE.parent
DEFAULT_PACKAGE_INDEX = "https://pypi.org/simple"


Role = Literal["plan", "orchestration", "secret"]
"""What a setting is: `plan` decides what a build produces (cache keys hash these); `orchestration` says where and how
work is run or published, nothing about what it produces; `secret` is a credential, never stored, never part of a key,
and its variables never reach another process."""


def _is(role: Role, *env: str) -> Mapping[str, Any]:
    """A Settings field's metadata: its role and the environment variables from_env reads it from (the first set one
    wins). Every secret field also says repr=False."""
    return MappingProxyType({"role": role, "env": env})


@dataclass(frozen=True)
class Settings:
    home: Path = field(metadata=_is("plan", "MODELMINT_HOME"))
    """Caches that outlive a checkout: toolchains, generated models, the hub download cache."""
    work_dir: Path = field(metadata=_is("plan", "MODELMINT_WORK_DIR"))
    """Where builds are written (f16 and quantized GGUFs, reports)."""
    catalog_path: Path = field(metadata=_is("plan", "MODELMINT_CATALOG"))
    hf_endpoint: str | None = field(default=None, metadata=_is("plan", "HF_ENDPOINT"))
    hf_token: str | None = field(default=None, repr=False,
                                 metadata=_is("secret", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"))
    threads: int = field(default=0, metadata=_is("plan", "MODELMINT_THREADS"))
    """Threads for llama.cpp tools; 0 means all cores."""
    repo_dir: Path = field(default=_PROJECT_ROOT, metadata=_is("plan", "MODELMINT_REPO", "DVC_ROOT"))
    """The git + DVC repository holding the catalog, dvc.yaml, the manifests and the registered artifacts (DVC_ROOT:
    set by `dvc repro` for stage commands, so a stage registers into the repository DVC runs)."""
    prefect_home: Path | None = field(default=None, metadata=_is("orchestration", "MODELMINT_PREFECT_HOME"))
    """PREFECT_HOME of the embedded server and worker (SQLite database, task results); default one per checkout and
    port under home/prefect (prefect_dir)."""
    prefect_port: int = field(default=4200, metadata=_is("orchestration", "MODELMINT_PREFECT_PORT"))
    gpu_slots: int = field(default=1, metadata=_is("orchestration", "MODELMINT_GPU_SLOTS"))
    """Size of the `gpu` global concurrency limit that every GPU step holds a slot of."""
    prefect_crash_after_s: int = field(default=120, metadata=_is("orchestration", "MODELMINT_CRASH_AFTER_S"))
    """A run of the embedded stack silent this long (no heartbeat; runs send one every 30 s) is marked Crashed."""
    webhook_secret: str | None = field(default=None, repr=False, metadata=_is("secret", "MODELMINT_WEBHOOK_SECRET"))
    """The secret a Hugging Face webhook sends in X-Webhook-Secret."""
    package_index: str = field(default=DEFAULT_PACKAGE_INDEX,
                               metadata=_is("plan", "MODELMINT_PACKAGE_INDEX", "PIP_INDEX_URL"))
    """The simple repository API (PEP 503 / 691) wheel sources are downloaded from: MODELMINT_PACKAGE_INDEX, else
    pip's PIP_INDEX_URL, else PyPI."""
    ray_address: str | None = field(default=None, metadata=_is("orchestration", "MODELMINT_RAY_ADDRESS"))
    """A Ray cluster (host:port of its GCS) the convert flow's tasks run on; None runs them in the flow's own
    process (docs/ray.md)."""
    ray_resources: str | None = field(default=None, metadata=_is("orchestration", "MODELMINT_RAY_RESOURCES"))
    """JSON, step name → extra Ray resources its tasks ask for, e.g. {"compress": {"gpu-H100-80G": 1}} to place a
    step on the nodes that offer that custom resource."""
    registry_username: str | None = field(default=None, repr=False,
                                          metadata=_is("secret", "MODELMINT_REGISTRY_USERNAME"))
    """OCI registry credentials (and MODELMINT_REGISTRY_PASSWORD); else the docker config's entry for the host."""
    registry_password: str | None = field(default=None, repr=False,
                                          metadata=_is("secret", "MODELMINT_REGISTRY_PASSWORD"))
    docker_config: Path | None = field(default=None, metadata=_is("orchestration", "DOCKER_CONFIG"))
    """The docker config file whose `auths` hold registry credentials ($DOCKER_CONFIG/config.json, ~/.docker/…)."""
    registry_ca: Path | None = field(default=None, metadata=_is("orchestration", "MODELMINT_REGISTRY_CA"))
    """A CA bundle (PEM) that signs the OCI registry's certificate; None: the system's."""
    serve_gpus: tuple[str, ...] | None = field(default=None, metadata=_is("plan", "MODELMINT_SERVE_GPUS"))
    """Comma-separated GPU inventories (`1xL4-24G,2x8xH100-80G`) every registered variant gets serving plans for,
    instead of its catalog entry's serve.gpus (docs/serving.md)."""
    oci_registry: str | None = field(default=None, metadata=_is("orchestration", "MODELMINT_OCI_REGISTRY"))
    """HOST[:PORT]/NAMESPACE the convert flow publishes every registered variant to (checked by
    pipelines.publish.oci.RegistryRef when a run starts); None publishes nothing."""
    oci_insecure: bool = field(default=False, metadata=_is("orchestration", "MODELMINT_OCI_INSECURE"))
    """1: speak plain HTTP to that registry (a registry on a trusted network)."""
    signing_key: Path | None = field(default=None, metadata=_is("orchestration", "MODELMINT_SIGNING_KEY"))
    """The PEM private key (EC) registration signs every artifact with: a path outside the repository (its bytes are
    read when signing, never logged or copied; pipelines/trust/signing.py); None: artifacts are registered
    unsigned. Not a plan setting: the signature is beside the bytes, not part of them."""
    skip_resource_check: bool = field(default=False, metadata=_is("orchestration", "MODELMINT_SKIP_RESOURCE_CHECK"))
    """1: skip the check of a run's peak disk and memory before any work (pipelines/core/resources.py), for a disk
    whose free space says nothing of what fits (compressed or deduplicating filesystems); a disk that fills anyway is
    still named mid-run, with the finished steps kept."""
    keep_scratch: bool = field(default=False, metadata=_is("orchestration", "MODELMINT_KEEP_SCRATCH"))
    """1: keep a build's scratch files (the f16 GGUF and its KL reference logits) after every variant it was asked for
    registered. Default: removed then, to favour disk (a 7B's f16 is 15 GB); a later run that needs them rebuilds
    them, since their receipts no longer match a file (docs/scale.md, "Scratch files")."""
    signing_cert: Path | None = field(default=None, metadata=_is("orchestration", "MODELMINT_SIGNING_CERT"))
    """The signing key's certificate, then its intermediates, in one PEM file: signatures carry the chain instead of
    naming a bare key (docs/registry.md, "Signing")."""
    trust_policy: Path | None = field(default=None, metadata=_is("orchestration", "MODELMINT_TRUST"))
    """The trust policy read instead of the checkout's registry/trust.yaml: a file the people who can change the
    manifests cannot change (docs/trust.md); None: the checkout's own."""
    tsa_url: str | None = field(default=None, metadata=_is("orchestration", "MODELMINT_TSA_URL"))
    """An RFC 3161 Time-Stamp Authority (http(s) URL) that timestamps every signature registration makes, so that
    verification judges the signing key by the authority's time instead of the signer's own claim (docs/trust.md);
    None: signatures carry no timestamp."""

    SECRETS: ClassVar[tuple[str, ...]]
    """Credentials (role `secret`): never stored, never part of a key."""
    SECRET_SOURCES: ClassVar[Mapping[str, tuple[str, ...]]]
    """Each credential's environment variables, as from_env reads them."""
    SECRET_ENV: ClassVar[tuple[str, ...]]
    """The environment variables from_env reads credentials from: never passed on to another process's
    environment (pipelines.core.runner strips them from every tool it starts)."""
    ORCHESTRATION: ClassVar[tuple[str, ...]]
    """Where and how work is run or published (role `orchestration`): says nothing about what a build plan produces."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        read = {f.name: next((env[v] for v in f.metadata["env"] if env.get(v)), None) for f in fields(cls)}
        var = {f.name: f.metadata["env"][0] for f in fields(cls)}
        home = Path(read["home"] or Path.home() / ".cache" / "modelmint").expanduser()
        work = Path(read["work_dir"] or _PROJECT_ROOT / "build").expanduser()
        repo = Path(read["repo_dir"] or _PROJECT_ROOT).expanduser()
        catalog = Path(read["catalog_path"] or repo / "registry" / "catalog.yaml")
        return cls(
            home=home,
            work_dir=work,
            catalog_path=catalog,
            hf_endpoint=read["hf_endpoint"],
            hf_token=read["hf_token"],
            threads=_int(env, var["threads"], 0),
            repo_dir=repo,
            prefect_home=Path(p).expanduser() if (p := read["prefect_home"]) else None,
            prefect_port=_int(env, var["prefect_port"], 4200),
            gpu_slots=_int(env, var["gpu_slots"], 1),
            prefect_crash_after_s=_int(env, var["prefect_crash_after_s"], 120),
            webhook_secret=read["webhook_secret"],
            package_index=read["package_index"] or DEFAULT_PACKAGE_INDEX,
            ray_address=read["ray_address"],
            ray_resources=read["ray_resources"],
            registry_username=read["registry_username"],
            registry_password=read["registry_password"],
            docker_config=Path(read["docker_config"] or Path.home() / ".docker").expanduser() / "config.json",
            registry_ca=Path(p).expanduser() if (p := read["registry_ca"]) else None,
            serve_gpus=_serve_gpus(read["serve_gpus"]),
            oci_registry=read["oci_registry"],
            oci_insecure=_flag(env, var["oci_insecure"]),
            signing_key=Path(p).expanduser() if (p := read["signing_key"]) else None,
            signing_cert=Path(p).expanduser() if (p := read["signing_cert"]) else None,
            skip_resource_check=_flag(env, var["skip_resource_check"]),
            keep_scratch=_flag(env, var["keep_scratch"]),
            trust_policy=Path(p).expanduser() if (p := read["trust_policy"]) else None,
            tsa_url=read["tsa_url"],
        )

    @classmethod
    def with_role(cls, role: Role) -> tuple[str, ...]:
        """The fields of one role, in declaration order."""
        return tuple(f.name for f in fields(cls) if f.metadata["role"] == role)

    @classmethod
    def env_of(cls, name: str) -> tuple[str, ...]:
        """The environment variables a field is read from, the first set one winning."""
        return next(f.metadata["env"] for f in fields(cls) if f.name == name)

    def without_secrets(self) -> Settings:
        """These settings with every credential removed: what may be stored (a cached task result, a report)."""
        cleared: dict[str, Any] = dict.fromkeys(self.SECRETS)
        return replace(self, **cleared)

    def with_secrets_of(self, other: Settings) -> Settings:
        """These settings with `other`'s credentials: a plan read back from a cache (stored without them) given the
        running process's again, for the steps that need one (a gated calibration dataset's download)."""
        return replace(self, **{n: getattr(other, n) for n in self.SECRETS})

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
        """MODELMINT_PREFECT_HOME, else home/prefect/<checkout>-<hash of its path>-<port>: one Prefect home per stack,
        so two checkouts sharing one MODELMINT_HOME (or one checkout on two ports) never read each other's state."""
        if self.prefect_home:
            return self.prefect_home
        root = _PROJECT_ROOT.resolve()
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:8]
        return self.home / "prefect" / f"{root.name}-{digest}-{self.prefect_port}"

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


Settings.SECRETS = Settings.with_role("secret")
Settings.SECRET_SOURCES = MappingProxyType({name: Settings.env_of(name) for name in Settings.SECRETS})
Settings.SECRET_ENV = tuple(var for names in Settings.SECRET_SOURCES.values() for var in names)
Settings.ORCHESTRATION = Settings.with_role("orchestration")


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
