"""The one module that drives DVC (its CLI, through pipelines.core.runner): commit, push, fetch, dvc.lock, cache."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pipelines.core.errors import (
    RecordMoved,
    RegistryError,
    RemoteError,
    RemoteObjectMissing,
    RemoteUnavailable,
    ToolError,
)
from pipelines.core.fsutil import HashCache, cannot_link
from pipelines.core.runner import ToolRun, run
from pipelines.core.settings import Settings
from pipelines.store.names import stage_name

if TYPE_CHECKING:
    from dvc.config import Config

log = logging.getLogger(__name__)

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
    missing = _ENOENT.search(tail)
    if missing:
        # A local remote: an object DVC expected there is gone (not a network problem, no retry helps), or
        # the remote's directory itself does not exist (its url is wrong or its mount is absent).
        path = missing.group(1)
        if "/files/md5/" in path or re.search(r"/[0-9a-f]{2}/[0-9a-f]{30}(\.dir)?$", path):
            return RemoteObjectMissing(f"{what}: the DVC remote lacks an object ({path}):\n{tail}", objects=[path])
        return RemoteError(
            f"{what}: a directory the DVC remote needs does not exist ({path}):\n{tail}",
            hint="check where the remote points (`dvc remote list`): mount it, create it, or point the remote at "
            "the right directory (`dvc remote modify local url /path/to/dir`), then rerun the same command",
        )
    if any(s in tail for s in _UNREACHABLE):
        return RemoteUnavailable(
            f"{what}: the DVC remote could not be reached:\n{tail}",
            hint="check the network or the mount the remote lives on, then rerun the same command; "
            "`dvc remote list` shows where it points",
        )
    return RegistryError(f"{what} failed:\n{tail}", hint="see the DVC message above; `dvc doctor` shows its setup")


_ENOENT = re.compile(r"No such file or directory: '([^']+)'")


def commit(settings: Settings, stage: str) -> None:
    """Record a stage's outputs in dvc.lock and the DVC cache, as `dvc repro` would after running it.

    `--no-relink`: the workspace is left as it is. With `cache.type = reflink,copy` DVC would otherwise replace
    every workspace file by a fresh copy of its cache object, undoing the hard links `adopt` made (measured with
    DVC 3.67), while the files it does not hold yet (the small serving files) are copied into the cache either way.
    """
    dvc(settings, "commit", "--force", "--no-relink", stage, what=f"dvc commit {stage}")


def adopt(settings: Settings, path: Path, hashes: HashCache) -> bool:
    """Make the file at `path` DVC's cache object for its bytes without a second copy: a hard link at
    files/md5/ab/cdef… and the shared inode made read-only (0444, what DVC gives its objects), before `commit`.

    `dvc commit` then finds the object in the cache and copies nothing; with `--no-relink` it leaves `path` as it
    is. Only for files no one rewrites in place: every modelmint output is written under a temporary name and
    renamed (fsutil.atomic_output), which gives the name a new inode and leaves the cached one as it was. When
    the cache already holds these bytes intact in another inode, `path` becomes a link to that one instead. Its md5
    comes from `hashes` (read with its sha256, once). Returns False, changing nothing, where there is no file or no
    link can be made (the cache on another filesystem): DVC copies it then.
    """
    try:
        md5 = hashes.md5(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    obj = cache_object(cache_dir(settings), md5)
    try:
        obj.parent.mkdir(parents=True, exist_ok=True)
        if not obj.is_file() or (not obj.samefile(path) and _md5_of(obj) != md5):
            _link_over(path, obj)  # (a damaged object is replaced by the checked bytes)
        elif not obj.samefile(path):
            _link_over(obj, path)
        obj.chmod(0o444)
    except OSError as err:
        if cannot_link(err):
            return False
        raise
    return True


def record_md5(settings: Settings, paths: Iterable[Path], hashes: HashCache) -> None:
    """Give DVC's state database the md5 of files of the workspace, from `hashes`, so that `dvc commit` takes it
    instead of reading every byte again (a registered weight file is read once, for its sha256 and md5 together).

    DVC trusts its state for a path whose inode, mtime and size are the ones recorded with it (dvc_data's
    hashfile/state.py: `dvc commit` and `dvc add` ask it before hashing). Each entry is written from DVC's own stat
    of the file, and only when that stat is the same before and after the md5 is looked up: a file that changes
    meanwhile is left to DVC to hash.
    """
    from dvc.dirs import site_cache_dir
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.state import State

    with _repo(settings, real=True) as repo:
        # The state the DVC processes read is under the site cache dvc_env gives them; in this process a
        # DVC_SITE_CACHE_DIR of the caller's environment would outrank it (dvc.dirs.site_cache_dir).
        opened = Path(repo.site_cache_dir).relative_to(site_cache_dir(repo.config["core"].get("site_cache_dir")))
        state: Any = State(repo.root_dir, str(settings.dvc_site_cache_dir / opened), repo.dvcignore)
        try:
            items = []
            for p in paths:
                where = os.path.join(repo.root_dir, p.relative_to(settings.repo_dir).as_posix())
                before = repo.fs.info(where)
                md5 = hashes.md5(p)
                if _same_stat(before, repo.fs.info(where)):
                    items.append((where, HashInfo("md5", md5), before))
            state.save_many(items, repo.fs)
        except sqlite3.Error as err:
            # only a saving lost: DVC hashes the files itself (and a full disk stops its commit, which says so)
            log.warning("DVC's state database did not take the md5s of the files registered (%s): `dvc commit` "
                        "reads them again", err)
        finally:
            state.close()


def _same_stat(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("ino", "size", "mtime"))


def _link_over(src: Path, dst: Path) -> None:
    """`dst` becomes a hard link of `src`, in one rename (a reader sees the old file or the new, never none)."""
    tmp = dst.with_name(f"{dst.name}.link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.link(src, tmp)
    os.replace(tmp, dst)


def push(settings: Settings, stage: str) -> None:
    """Push a stage's outputs to the default remote."""
    dvc(settings, "push", stage, what=f"dvc push {stage}", remote=True)


def fetch(settings: Settings, stage: str) -> None:
    """Download a stage's outputs from the default remote into the DVC cache (the workspace is untouched)."""
    dvc(settings, "fetch", stage, what=f"dvc fetch {stage}", remote=True)


def get(settings: Settings, path: str, *, rev: str, out: Path) -> None:
    """`dvc get` of `path` as the git commit `rev` of this repository records it, into `out` (from the remote)."""
    root = require_repo(settings)
    dvc(settings, "get", str(root), path, "--rev", rev, "-o", str(out), what=f"dvc get {path} --rev {rev[:12]}",
        remote=True)


def cache_dir(settings: Settings) -> Path:
    """The DVC cache directory (`cache.dir`, default .dvc/cache), from DVC's own config loader: no process.

    Raises:
        RegistryError: DVC's configuration does not load.
    """
    root = require_repo(settings)
    configured = _config(root)["cache"].get("dir")
    return Path(configured) if configured else root / ".dvc" / "cache"


def local_remote_dir(settings: Settings) -> Path | None:
    """The directory of the default DVC remote when it is one on this machine (a plain path or a `file://` URL,
    relative ones from .dvc/ as DVC resolves them); None for a remote elsewhere (s3://, ssh://, …) or none.

    Raises:
        RegistryError: DVC's configuration does not load.
    """
    root = require_repo(settings)
    config = _config(root)
    name = config["core"].get("remote")
    url = str(config["remote"].get(name, {}).get("url") or "") if name else ""
    if url.startswith("file://"):
        url = url.removeprefix("file://")
    elif not url or "://" in url:
        return None
    path = Path(url).expanduser()
    return path if path.is_absolute() else (root / ".dvc" / path).resolve()


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
    with repo_lock(settings):
        return _locked_out(settings, stage, path)


def _locked_out(settings: Settings, stage: str, path: str) -> LockedOut | None:
    """locked_out for a caller that holds DVC's repository lock already."""
    lock = require_repo(settings) / "dvc.lock"
    try:
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


# ---------------------------------------------------------------- the remote's copy of an output

# DVC uploads to a filesystem remote under a temporary name beside the object, `.<22 url-safe chars>.tmp`
# (dvc_objects.fs.utils.tmp_fname, LocalFileSystem.put_file), and renames it into place once the copy is
# complete: a push killed mid-transfer leaves that file behind for good.
_UPLOAD_TMP = re.compile(r"^\.[A-Za-z0-9_-]{22}\.tmp$")
STALE_UPLOAD_S = 3600
"""A temporary upload nobody has written to for this long is a dead writer's (a live copy writes every chunk,
and a writer on another machine sharing the remote is invisible from here: age is the one safe rule)."""
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class RemoteObject:
    """One object of a directory output as the remote holds it: its `.dir` listing or one file's blob."""

    oid: str
    """The DVC md5 (`….dir` for the listing)."""
    path: str | None
    """The file of the artifact directory it holds; None for the `.dir` listing."""
    where: str
    """Its location in the remote."""
    problem: str | None = None
    """None: present (and, when the check hashed it, exactly the bytes its md5 and the manifest name)."""
    damaged: bool = True
    """With a problem: the remote's copy is missing or wrong (an upload fixes it); False: the object is exactly
    what DVC recorded and the manifest is what disagrees (no upload fixes that)."""

    def describe(self) -> str:
        what = f"{self.path} (md5 {self.oid})" if self.path else f"the directory listing {self.oid}"
        return f"{what} at {self.where}: {self.problem or 'ok'}"


@dataclass(frozen=True)
class RemoteCheck:
    url: str
    hashed: bool
    """True: every object's bytes were read from the remote and hashed; False (a remote that is not a local
    filesystem, at registration): existence and size only, as DVC's own existence check sees them."""
    objects: tuple[RemoteObject, ...]

    @property
    def bad(self) -> tuple[RemoteObject, ...]:
        return tuple(o for o in self.objects if o.problem)


@contextmanager
def _repo(settings: Settings, *, real: bool = False) -> Iterator[Any]:
    """The repository opened through DVC's own Python API, in process, with the site cache the DVC processes get
    through dvc_env (its state database lives there). `real`: opened at the repository's real path, as a DVC
    process started in it (cwd) sees it: its state database and the paths in it are named after that path.

    Raises:
        RegistryError: DVC cannot open it.
    """
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    root = require_repo(settings)
    try:
        repo = Repo(str(root.resolve() if real else root),
                    config={"core": {"site_cache_dir": str(settings.dvc_site_cache_dir)}})
    except DvcException as err:
        raise RegistryError(f"DVC cannot open {root}: {err}", hint="`dvc doctor` shows its setup") from err
    try:
        yield repo
    finally:
        repo.close()


@contextmanager
def _remote_odb(settings: Settings) -> Iterator[Any]:
    """The default remote's object store (`files/md5/…`) through DVC's own filesystem layer, in process.

    Raises:
        RemoteError: no default remote, or its configuration does not load.
    """
    from dvc.exceptions import DvcException

    with _repo(settings) as repo:
        try:
            odb = repo.cloud.get_remote_odb(None, "push")
        except DvcException as err:
            raise RemoteError(f"the DVC remote is not usable: {err}") from err
        yield odb


def remote_lacks(settings: Settings, dir_md5: str) -> frozenset[str]:
    """The objects of a directory output (its `.dir` listing and every file's, as the local cache lists them) that
    the default remote does not hold now: existence only, no byte read. Taken before a push, they are the ones the
    push writes (check_remote's `fresh`). Empty for a remote that is not a local filesystem: check_remote does
    not read its objects' bytes at all.

    Raises:
        RemoteError: no usable default remote. RemoteUnavailable: it could not be read.
    """
    cache = cache_dir(settings)
    oids = [dir_md5, *dir_listing(cache, dir_md5).values()] if cache_object(cache, dir_md5).is_file() else [dir_md5]
    with _remote_odb(settings) as odb:
        if not _is_local(odb):
            return frozenset()
        try:
            return frozenset(oid for oid in oids if not odb.fs.exists(odb.oid_to_path(oid)))
        except OSError as err:
            raise RemoteUnavailable(
                f"the DVC remote {odb.fs.unstrip_protocol(odb.path)} could not be read: {err}",
                hint="check the network or the mount the remote lives on, then rerun the same command",
            ) from err


def read_remote_files(settings: Settings, dir_md5: str, paths: Iterable[str]) -> dict[str, bytes]:
    """The bytes of small files of a directory output as the default remote holds them (the signature and the
    provenance a verify run checks); a path the remote's listing lacks, or whose object is missing, is left out.

    Raises:
        RemoteError: no usable default remote. RemoteUnavailable: it could not be read.
    """
    wanted = set(paths)
    with _remote_odb(settings) as odb:
        try:
            try:
                listing = odb.fs.cat_file(odb.oid_to_path(dir_md5))
            except FileNotFoundError:
                local = cache_object(cache_dir(settings), dir_md5)
                listing = local.read_bytes() if local.is_file() else b"[]"
            out: dict[str, bytes] = {}
            for e in json.loads(listing):
                if e.get("relpath") in wanted:
                    try:
                        out[e["relpath"]] = odb.fs.cat_file(odb.oid_to_path(e["md5"]))
                    except FileNotFoundError:
                        continue
            return out
        except OSError as err:
            raise RemoteUnavailable(
                f"the DVC remote {odb.fs.unstrip_protocol(odb.path)} could not be read: {err}",
                hint="check the network or the mount the remote lives on, then rerun the same command",
            ) from err


def _is_local(odb: Any) -> bool:
    return "local" in (odb.fs.protocol if isinstance(odb.fs.protocol, tuple) else (odb.fs.protocol,))


def check_remote(
    settings: Settings, dir_md5: str, expected: Mapping[str, str] | None = None, *, hash_contents: bool | None = None,
    fresh: Collection[str] = (),
) -> RemoteCheck:
    """Check the default remote's copy of a directory output: its `.dir` listing and every file's object.

    `expected` maps each file of the directory to its sha256 (the manifest's): a file the listing lacks, or an
    object whose bytes hash otherwise, is a problem. `hash_contents` None: hash when the remote is a local
    filesystem (a read of every object), else existence and size only; True: always hash (streamed, nothing
    is written here). File objects named in `fresh` (ones the push just made wrote from the checked cache: they were
    absent before it) get existence and size only, as the upload itself was the read of their bytes. Nothing is
    changed.

    Raises:
        RemoteError: no usable default remote. RemoteUnavailable: it could not be read.
    """
    cache = cache_dir(settings)
    with _remote_odb(settings) as odb:
        hashed = _is_local(odb) if hash_contents is None else hash_contents
        try:
            return _check(odb, cache, dir_md5, dict(expected or {}), hashed, frozenset(fresh))
        except OSError as err:
            raise RemoteUnavailable(
                f"the DVC remote {odb.fs.unstrip_protocol(odb.path)} could not be read: {err}",
                hint="check the network or the mount the remote lives on, then rerun the same command",
            ) from err


def _check(odb: Any, cache: Path, dir_md5: str, expected: dict[str, str], hashed: bool,
           fresh: frozenset[str]) -> RemoteCheck:
    url = odb.fs.unstrip_protocol(odb.path)
    objects: list[RemoteObject] = []
    listing: bytes | None = None
    where = odb.oid_to_path(dir_md5)
    try:
        raw = odb.fs.cat_file(where)
    except FileNotFoundError:
        objects.append(RemoteObject(dir_md5, None, where, "missing"))
    else:
        if hashlib.md5(raw).hexdigest() != dir_md5.removesuffix(".dir"):
            objects.append(RemoteObject(dir_md5, None, where, "holds other bytes than its md5 names"))
        else:
            objects.append(RemoteObject(dir_md5, None, where))
            listing = raw
    if listing is None:
        # The listing the local cache holds (the registering machine's) still says where the files are.
        local = cache_object(cache, dir_md5)
        if local.is_file() and hashlib.md5(raw := local.read_bytes()).hexdigest() == dir_md5.removesuffix(".dir"):
            listing = raw
    if listing is None:
        objects += [
            RemoteObject("?", p, "?", "cannot be located: its directory listing is neither in the remote nor here")
            for p in sorted(expected)
        ]
        return RemoteCheck(url, hashed, tuple(objects))
    entries = {e["relpath"]: e for e in json.loads(listing)}
    objects += [
        RemoteObject("?", p, "?", "not in DVC's record of the directory (the manifest and dvc.lock disagree)",
                     damaged=False)
        for p in sorted(set(expected) - set(entries))
    ]
    for rel, e in sorted(entries.items()):
        obj_where = odb.oid_to_path(e["md5"])
        problem, damaged = _check_object(odb.fs, obj_where, e["md5"], e.get("size"), expected.get(rel),
                                         hashed and e["md5"] not in fresh)
        objects.append(RemoteObject(e["md5"], rel, obj_where, problem, damaged))
    return RemoteCheck(url, hashed, tuple(objects))


def _check_object(
    fs: Any, where: str, md5: str, size: int | None, sha256: str | None, hashed: bool
) -> tuple[str | None, bool]:
    try:
        actual_size = fs.size(where)
    except FileNotFoundError:
        return "missing", True
    if size is not None and actual_size != size:
        return f"is {actual_size} bytes, DVC recorded {size}", True
    if not hashed:
        return None, True
    h_md5, h_sha = hashlib.md5(), hashlib.sha256()
    with fs.open(where, "rb") as f:
        while chunk := f.read(_CHUNK):
            h_md5.update(chunk)
            h_sha.update(chunk)
    if h_md5.hexdigest() != md5:
        return f"holds other bytes (md5 {h_md5.hexdigest()}, sha256 {h_sha.hexdigest()})", True
    if sha256 is not None and h_sha.hexdigest() != sha256:
        return (f"has sha256 {h_sha.hexdigest()}, the manifest records {sha256}: the object is what DVC recorded, "
                "the manifest disagrees (`git log -p` on it)"), False
    return None, True


def clean_stale_uploads(settings: Settings, wheres: Iterable[str] | None = None, *, now: float | None = None) -> list[str]:
    """Remove temporary uploads dead writers left in a local-filesystem remote; return what was removed.

    `wheres`: objects whose directories are swept (a registration's); None: the whole remote (a verify run).
    Only `.<token>.tmp` files DVC names so, untouched for STALE_UPLOAD_S; other remote types upload
    atomically and are left alone.
    """
    with _remote_odb(settings) as odb:
        if not _is_local(odb):
            return []
        root = Path(odb.path)
        if wheres is None:
            dirs = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
        else:
            dirs = sorted({Path(w).parent for w in wheres})
    cutoff = (time.time() if now is None else now) - STALE_UPLOAD_S
    removed: list[str] = []
    for d in dirs:
        try:
            names = list(d.iterdir())
        except FileNotFoundError:
            continue
        for p in names:
            try:
                if _UPLOAD_TMP.fullmatch(p.name) and p.stat().st_mtime < cutoff:
                    p.unlink()
                    removed.append(str(p))
            except FileNotFoundError:
                continue
    for gone in removed:
        log.info("removed %s, a DVC upload a killed push left in the remote", gone)
    return removed


def ensure_in_remote(
    settings: Settings, stage: str, path: str, dir_md5: str, expected: Mapping[str, str], *,
    hash_contents: bool | None = None, fresh: Collection[str] = (),
) -> RemoteCheck:
    """After `dvc push STAGE`: check every object of its directory output `path` in the remote, re-upload what is
    missing or wrong (reupload), and check again. Returns the first check (its `bad`, `damaged` objects were
    re-uploaded; ones where only the manifest disagrees are left for the caller to report).

    `dvc push` trusts the remote: it skips an object that exists whatever its bytes, and once a directory's
    `.dir` listing is there it takes every file in it as there too; so the bad objects are uploaded again one
    by one, from copies here checked against their md5. `hash_contents` and `fresh` as for check_remote (the
    check after a re-upload hashes every object).

    Raises:
        RecordMoved: dvc.lock records another version of the output now (a registration of it ran meanwhile).
        RemoteError, RemoteUnavailable: the remote is unusable, no intact copy is here, or it is still wrong
            after the re-upload.
    """
    first = check_remote(settings, dir_md5, expected, hash_contents=hash_contents, fresh=fresh)
    clean_stale_uploads(settings, [o.where for o in first.objects if o.where != "?"])
    damaged = [o for o in first.bad if o.damaged]
    if not damaged:
        return first
    log.warning("the DVC remote's copy of %s is damaged, uploading it again:\n%s", stage,
                "\n".join(o.describe() for o in damaged))
    reupload(settings, stage, path, dir_md5, first)
    again = check_remote(settings, dir_md5, expected, hash_contents=hash_contents)
    if any(o.damaged for o in again.bad):
        raise RemoteError(
            f"the DVC remote {again.url} still lacks or holds other bytes for {stage} after uploading it again:\n"
            + "\n".join(f"  {o.describe()}" for o in again.bad),
            hint="check that the remote's disk is healthy and writable, then rerun the same command",
        )
    return first


def reupload(settings: Settings, stage: str, path: str, dir_md5: str, check: RemoteCheck) -> tuple[str, ...]:
    """Upload again exactly the objects `check` found missing or damaged, each from a copy on this machine whose
    bytes hash to its md5 (the DVC cache's, else the file in the workspace's `path`), the files before the
    `.dir` listing (as `dvc push` orders them). Returns what was uploaded (RemoteObject.describe()).

    It runs under DVC's repository lock, after reading dvc.lock again: only while dvc.lock still records
    `dir_md5` for `stage`'s output `path` (a registration of the same tag, which rewrites dvc.lock and pushes
    under that lock, waits meanwhile). Nothing is removed, and no intact object is touched: a repair racing a
    registration once deleted the older version's intact listing and blobs from the remote, because it removed
    the listing and pushed what dvc.lock recorded by then.

    Raises:
        RecordMoved: dvc.lock records another version (or none) of the output; nothing was uploaded.
        RemoteError: an object has no intact copy here (or cannot be located). RemoteUnavailable: the remote
            could not be written.
    """
    from dvc_objects.fs.local import LocalFileSystem

    damaged = [o for o in check.bad if o.damaged]
    if not damaged:
        return ()
    cache = cache_dir(settings)
    workspace = require_repo(settings) / path
    with repo_lock(settings):
        now = _locked_out(settings, stage, path)
        if now is None or now.md5 != dir_md5:
            raise RecordMoved(stage, dir_md5, now.md5 if now is not None else None)
        sources: list[tuple[RemoteObject, Path]] = []
        lacking: list[str] = []
        for o in sorted(damaged, key=lambda o: o.path is None):  # the listing last
            src = _intact_copy(cache, workspace, o)
            if src is None:
                lacking.append(o.describe())
            else:
                sources.append((o, src))
        if lacking:
            raise RemoteError(
                f"this machine has no intact copy of {len(lacking)} object(s) of {stage} to upload:\n"
                + "\n".join(f"  {d}" for d in lacking),
                hint="upload it from the machine that registered it, or build and register it again (the source "
                "is pinned)",
            )
        with _remote_odb(settings) as odb:
            try:
                for o, src in sources:
                    odb.add(str(src), LocalFileSystem(), o.oid, check_exists=False, verify=False)
            except OSError as err:
                raise RemoteUnavailable(
                    f"the DVC remote {odb.fs.unstrip_protocol(odb.path)} could not be written: {err}",
                    hint="check the network or the mount the remote lives on, then rerun the same command",
                ) from err
    return tuple(o.describe() for o, _ in sources)


def _intact_copy(cache: Path, workspace: Path, o: RemoteObject) -> Path | None:
    """A local file holding exactly the bytes of object `o`: the DVC cache's copy, else (a file of the directory)
    the workspace's; None when neither is intact or `o` could not be located."""
    if o.oid == "?":
        return None
    if _cache_copy_ok(cache, o.oid):
        return cache_object(cache, o.oid)
    if o.path is None:
        return None
    candidate = workspace / o.path
    return candidate if _md5_of(candidate) == o.oid else None


def _cache_copy_ok(cache: Path, oid: str) -> bool:
    """Whether the local DVC cache holds `oid` with the bytes its name says; a corrupt copy is removed."""
    obj = cache_object(cache, oid)
    got = _md5_of(obj)
    if got is None:
        return False
    if got == oid.removesuffix(".dir"):
        return True
    obj.unlink(missing_ok=True)
    return False


def _md5_of(path: Path) -> str | None:
    """The md5 of the file at `path` (DVC's object id), or None where there is no such file."""
    h = hashlib.md5()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return h.hexdigest()
