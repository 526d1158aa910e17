"""The one module that drives DVC (its CLI, through pipelines.runner): commit, push, fetch, dvc.lock, cache."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from pipelines.errors import RegistryError, RemoteError, RemoteUnavailable, ToolError
from pipelines.manifest import stage_name
from pipelines.runner import ToolRun, run
from pipelines.settings import Settings

if TYPE_CHECKING:
    from dvc.config import Config

# What DVC prints when the remote itself is missing or misconfigured (no retry helps) ...
_MISCONFIGURED = (
    "no remote specified",
    "config file error",
    "requires these missing dependencies",
    "is not a valid remote",
    "doesn't exist in the config",
    "Unable to locate credentials",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "NoSuchBucket",
    "AccessDenied",
    "Permission denied",
)
# ... and when it could not be reached (a retry may succeed).
_UNREACHABLE = (
    "Could not connect",
    "Connection refused",
    "ConnectionError",
    "ConnectTimeout",
    "timed out",
    "Name or service not known",
    "Temporary failure in name resolution",
    "No such file or directory",
    "503",
    "502",
    "500 Internal",
    "SlowDown",
)


def dvc_env(settings: Settings) -> dict[str, str]:
    """What every DVC process modelmint starts gets: no analytics, the site cache kept with our caches."""
    return {"DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(settings.dvc_site_cache_dir)}


def require_repo(settings: Settings) -> Path:
    """The DVC repository root.

    Raises:
        RegistryError: `settings.repo_dir` is not a git + DVC repository.
    """
    root = settings.repo_dir
    if not (root / ".dvc").is_dir():
        raise RegistryError(
            f"{root} is not a DVC repository (no .dvc/)",
            hint="run from a modelmint checkout (it ships .dvc/config), or point MODELMINT_REPO at one",
        )
    return root


def dvc(settings: Settings, *args: str, what: str, remote: bool = False) -> ToolRun:
    """Run `dvc ARGS` in the repository, waiting for DVC's own lock if another run holds it.

    Raises:
        RemoteError: (`remote` commands) the remote is missing or misconfigured.
        RemoteUnavailable: (`remote` commands) the remote could not be reached (transient).
        RegistryError: DVC failed otherwise (the message holds its stderr).
    """
    root = require_repo(settings)
    argv = [sys.executable, "-m", "dvc", "--wait-for-lock", *args]
    try:
        return run(argv, cwd=root, env=dvc_env(settings))
    except ToolError as err:
        raise _classify(err, what, remote) from err


def _classify(err: ToolError, what: str, remote: bool) -> RegistryError:
    tail = err.stderr_tail.strip()
    if not remote:
        return RegistryError(f"{what} failed:\n{tail}", hint="see the DVC message above; `dvc doctor` shows its setup")
    if any(s in tail for s in _MISCONFIGURED):
        return RemoteError(f"{what}: the DVC remote is not usable:\n{tail}")
    if any(s in tail for s in _UNREACHABLE):
        return RemoteUnavailable(
            f"{what}: the DVC remote could not be reached:\n{tail}",
            hint="check the network or the mount the remote lives on, then rerun the same command; "
            "`dvc remote list` shows where it points",
        )
    return RegistryError(f"{what} failed:\n{tail}", hint="see the DVC message above; `dvc doctor` shows its setup")


def commit(settings: Settings, stage: str) -> None:
    """Record a stage's outputs in dvc.lock and the DVC cache, as `dvc repro` would after running it."""
    dvc(settings, "commit", "--force", stage, what=f"dvc commit {stage}")


def push(settings: Settings, stage: str) -> None:
    """Push a stage's outputs to the default remote."""
    dvc(settings, "push", stage, what=f"dvc push {stage}", remote=True)


def fetch(settings: Settings, stage: str) -> None:
    """Download a stage's outputs from the default remote into the DVC cache (the workspace is untouched)."""
    dvc(settings, "fetch", stage, what=f"dvc fetch {stage}", remote=True)


def cache_dir(settings: Settings) -> Path:
    """The DVC cache directory (`cache.dir`, default .dvc/cache), from DVC's own config loader: no process.

    Raises:
        RegistryError: DVC's configuration does not load.
    """
    root = require_repo(settings)
    configured = _config(root)["cache"].get("dir")
    return Path(configured) if configured else root / ".dvc" / "cache"


def _config(root: Path) -> Config:
    """DVC's merged configuration of the repository at `root`, from DVC's own loader (no process).

    Raises:
        RegistryError: it does not load.
    """
    from dvc.config import Config, ConfigError

    try:
        return Config(dvc_dir=str(root / ".dvc"))
    except ConfigError as err:
        raise RegistryError(f"DVC's configuration does not load: {err}", hint="check .dvc/config") from err


def require_stages(settings: Settings, name: str, tags: list[str]) -> None:
    """Check, before any work is done for them, that dvc.yaml has the stages registering these variants.

    Raises:
        RegistryError: not a DVC repository, or a stage dvc.yaml does not have (a variant outside the catalog).
    """
    stages = [stage_name(name, t) for t in tags]
    path = require_repo(settings) / "dvc.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (FileNotFoundError, yaml.YAMLError) as err:
        raise RegistryError(f"{path} is missing or not YAML ({err})", hint="run `modelmint dvc-yaml`") from err
    defined = data.get("stages") or {}
    missing = []
    for stage in stages:
        group, _, item = stage.partition("@")
        spec = defined.get(group) or {}
        if not (item in (spec.get("foreach") or {}) if item else group in defined):
            missing.append(stage)
    if missing:
        raise RegistryError(
            f"dvc.yaml has no stage {', '.join(missing)}: only catalog variants are registered",
            hint="add the variant to registry/catalog.yaml and run `modelmint dvc-yaml` (or build it without "
            "registering: `modelmint convert NAME --variants TAG`, `modelmint compress NAME --schemes TAG`)",
        )


@dataclass(frozen=True)
class LockedOut:
    path: str
    md5: str
    size: int
    nfiles: int | None


@contextmanager
def repo_lock(settings: Settings) -> Iterator[None]:
    """Hold DVC's own repository lock (.dvc/tmp/lock), waiting for it as `dvc --wait-for-lock` does.

    DVC rewrites dvc.lock in place (truncate, then write) while it holds this lock, so a read outside it
    can see an empty or half-written file when another registration or a `dvc repro` is committing.
    """
    from dvc.lock import make_lock

    root = require_repo(settings)
    hardlink = bool(_config(root)["core"].get("hardlink_lock", False))
    tmp = root / ".dvc" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    with make_lock(str(tmp / "lock"), tmp_dir=str(tmp), hardlink_lock=hardlink, wait=True):
        yield


def locked_out(settings: Settings, stage: str, path: str) -> LockedOut | None:
    """What dvc.lock records for output `path` of `stage`, or None when it records nothing.

    Read under DVC's repository lock, so a commit running in another process is seen whole or not at all.

    Raises:
        RegistryError: dvc.lock is not readable YAML.
    """
    lock = require_repo(settings) / "dvc.lock"
    try:
        with repo_lock(settings):
            text = lock.read_text(encoding="utf-8")
        data = yaml.safe_load(text) or {}
    except FileNotFoundError:
        return None
    except yaml.YAMLError as err:
        raise RegistryError(f"{lock} is not valid YAML: {err}", hint="restore it with `git checkout -- dvc.lock`") from err
    for out in ((data.get("stages") or {}).get(stage) or {}).get("outs") or []:
        if out.get("path") == path and out.get("md5"):
            return LockedOut(path, out["md5"], int(out.get("size") or 0), out.get("nfiles"))
    return None


_MD5 = re.compile(r"^[0-9a-f]{32}(\.dir)?$")


def cache_object(cache: Path, md5: str) -> Path:
    """Where DVC 3 keeps the object with this md5 (files/md5/ab/cdef…)."""
    if not _MD5.fullmatch(md5):
        raise RegistryError(f"{md5!r} is not a DVC md5")
    return cache / "files" / "md5" / md5[:2] / md5[2:]


def dir_listing(cache: Path, dir_md5: str) -> dict[str, str]:
    """relpath → md5 of every file in a directory output, from its `.dir` object in the cache.

    Raises:
        RemoteError: the `.dir` object is not in the cache (the remote does not hold it).
    """
    obj = cache_object(cache, dir_md5)
    try:
        entries = json.loads(obj.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RemoteError(
            f"the DVC remote does not hold {dir_md5} (it was never pushed there)",
            hint="push it from the machine that registered it (`dvc push`), or check which remote "
            "`dvc remote list` points at",
        ) from None
    except ValueError as err:
        obj.unlink(missing_ok=True)
        raise RegistryError(f"{obj} is corrupt ({err}); it was removed", hint="rerun the same command") from err
    return {e["relpath"]: e["md5"] for e in entries}
