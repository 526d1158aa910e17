"""Pull a registered artifact: manifest → DVC remote → sha256 check → files in place → Ollama or vLLM.

A GGUF lands beside its Modelfile and is handed to Ollama; a compressed-tensors checkpoint lands with its
vLLM serve config, and the `vllm serve` command is returned."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.core.errors import (
    BlobMismatch,
    ConfigError,
    ManifestDisagrees,
    ManifestInvalid,
    RegistryError,
    RemoteObjectMissing,
)
from pipelines.core.fsutil import HashCache, atomic_output, hash_cache
from pipelines.core.settings import Settings
from pipelines.store import dvcrepo
from pipelines.store.formats.base import format_of
from pipelines.store.manifest import Manifest, find_manifest, manifest_path
from pipelines.trust.policy import load_policy
from pipelines.trust.signing import Verified, verify_directory

log = logging.getLogger(__name__)

_CHUNK = 8 * 1024 * 1024

REGISTRATION_WAIT_S = 120.0
"""How long a pull waits for a registration of the same tag that is under way (dvc.lock already names the new
version, its manifest not yet): a push of a few GiB takes tens of seconds."""


@dataclass
class PullResult:
    manifest: Manifest
    dest: Path
    fetched: bool
    """False when the destination already held exactly these files (nothing was downloaded or copied)."""
    commands: list[list[str]] = field(default_factory=list)
    """The commands that make the model available: Ollama's (run when `ollama` is on PATH), or `vllm serve`."""
    ran_ollama: bool = False
    ollama_reply: str | None = None
    verified: Verified | None = None
    """What the signature check found (who signed, when; or why an unsigned artifact was accepted)."""

    @property
    def modelfile(self) -> Path | None:
        p = self.dest / "Modelfile"
        return p if p.is_file() else None


def pull(settings: Settings, ref: str, *, dest: Path | None = None, ollama: bool = True,
         allow_unsigned: bool = False, require_signature: bool = False) -> PullResult:
    """Place the registered artifact `ref` (name:tag) in `dest` (default: its path in the repository); `name:tag@C`
names an earlier version by its source commit or the git commit that registered it (a unique prefix, e.g. 12 hex).

    Every file is checked against the manifest's sha256 before anything in `dest` is replaced; a
    mismatch raises and leaves `dest` as it was.

    Raises:
        NotRegistered, ManifestInvalid, ConfigError: no usable manifest for `ref` (or no version `@C` of it).
        RemoteError, RemoteUnavailable: the DVC remote is misconfigured, unreachable, or lacks the blob.
        BlobMismatch: what came from the remote is not what was registered.
        TrustPolicyInvalid: registry/trust.yaml does not validate (nothing is fetched).
        SignatureRefused: the signature, provenance or signer is not what the trust policy accepts (signing.
            verify_directory); `dest` is left as it was.
        ToolError: `ollama create` failed.
    """
    if dest is not None and (dest.exists() or dest.is_symlink()) and not dest.is_dir():
        # holds() would meet NotADirectoryError under it; the artifact's files need a directory to go in
        raise ConfigError(f"--dest {dest} is a file, not a directory: the artifact's files go in a directory",
                          hint=f"name a directory (new or existing) with --dest, or move {dest} away")
    policy = load_policy(settings)

    def check(manifest: Manifest, directory: Path) -> Verified:
        return verify_directory(directory, manifest, policy, shown=_shown(settings, manifest),
                                allow_unsigned=allow_unsigned, require_signature=require_signature)

    ref, _, at = ref.partition("@")
    if at:
        return _pull_version(settings, ref, at, dest=dest, ollama=ollama, check=check, allow_unsigned=allow_unsigned,
                             require_signature=require_signature)
    manifest = settled(settings, ref)
    target = dest if dest is not None else settings.repo_dir / manifest.dvc.path
    fetched = False
    if holds(target, manifest, hash_cache(settings)):
        verified = check(manifest, target)
    else:
        verified = _fetch_into(settings, manifest, target, check)
        fetched = True
    return PullResult(manifest, target, fetched, **format_of(manifest.tag).offer(target, manifest, ollama),
                      verified=verified)


def settled(settings: Settings, ref: str, *, command: str = "pull") -> Manifest:
    """The manifest of `ref` once dvc.lock agrees with it, waiting up to REGISTRATION_WAIT_S while they differ
    because a registration of `ref` is under way (`command`: the modelmint command that waits, for the hint).

    Registration rewrites dvc.lock (`dvc commit`), pushes, and writes the manifest last: in between, the two name
    different versions and the workspace's artifact directory already holds the new one. That is a registration under
    way (or one interrupted after its commit), not a damaged manifest: the pull waits for it to finish and then
    serves what it registered.

    Raises:
        NotRegistered, ManifestInvalid: as find_manifest.
        RegistryError: dvc.lock still names another version after the wait.
    """
    import time

    manifest = find_manifest(settings, ref)
    deadline, told = time.monotonic() + REGISTRATION_WAIT_S, False
    while True:
        locked = dvcrepo.locked_out(settings, manifest.dvc.stage, manifest.dvc.path)
        if manifest.dvc.md5 is None or locked is None or locked.md5 == manifest.dvc.md5:
            return manifest  # agree, or nothing to compare: _fetch_into says what is missing
        if not _lock_rewritten(settings, manifest, locked.md5):
            return manifest  # dvc.lock is as git has it: the manifest is what disagrees (_fetch_into refuses it)
        if time.monotonic() >= deadline:
            raise RegistryError(
                f"{manifest.ref}: dvc.lock records {locked.md5} but its manifest {_shown(settings, manifest)} records "
                f"{manifest.dvc.md5}: a registration of {manifest.ref} is under way, or one stopped after "
                f"`dvc commit` (waited {REGISTRATION_WAIT_S:.0f} s)",
                hint=f"rerun `modelmint {command} {manifest.ref}` once the registration has finished; if none is running, "
                f"finish it again (`{format_of(manifest.tag).rebuild_command(manifest.name, manifest.tag)}`) or "
                "put dvc.lock back (`git checkout -- dvc.lock`)",
            )
        if not told:
            log.warning("%s is being registered (dvc.lock names a version its manifest does not yet): waiting up to "
                        "%.0f s for the registration to finish", manifest.ref, REGISTRATION_WAIT_S)
            told = True
        time.sleep(0.5)
        manifest = find_manifest(settings, ref)


def _lock_rewritten(settings: Settings, manifest: Manifest, md5: str) -> bool:
    """Whether dvc.lock's record `md5` of the manifest's stage is not the one git's HEAD holds: what `dvc commit`
    of a registration under way leaves (True too when git cannot tell)."""
    import yaml

    from pipelines.core.errors import ToolError
    from pipelines.core.runner import run

    try:
        committed = yaml.safe_load(run(["git", "show", "HEAD:dvc.lock"], cwd=settings.repo_dir).stdout) or {}
    except (ToolError, yaml.YAMLError):
        return True
    outs = ((committed.get("stages") or {}).get(manifest.dvc.stage) or {}).get("outs") or []
    return all(o.get("md5") != md5 for o in outs if isinstance(o, dict) and o.get("path") == manifest.dvc.path)


def _pull_version(settings: Settings, ref: str, at: str, *, dest: Path | None, ollama: bool,
                  check: Callable[[Manifest, Path], Verified], allow_unsigned: bool,
                  require_signature: bool = False) -> PullResult:
    """An earlier version of `ref` from the DVC remote, through `dvc get --rev` at the git commit that registered it;
    every file checked against that version's manifest. Ollama is not run: the current version keeps the name."""
    from pipelines.store.history import history

    versions = history(settings, ref)
    found = [v for v in versions if (v.manifest.source.revision or "").startswith(at.lower())] or [
        v for v in versions if (v.commit or "").startswith(at.lower())]
    listed = ", ".join(f"{(v.manifest.source.revision or '-')[:12]} (git {(v.commit or 'uncommitted')[:12]})"
                       for v in versions)
    if len(at) < 7 or len(found) != 1:
        raise ConfigError(f"{ref} has {'no' if not found else 'more than one'} version @{at} (versions: {listed})",
                          hint=f"name one by 7 or more hex digits of its source commit; `modelmint show {ref} "
                          "--history` lists them")
    version = found[0]
    if version.current:
        return pull(settings, ref, dest=dest, ollama=ollama, allow_unsigned=allow_unsigned,
                    require_signature=require_signature)
    manifest = version.manifest
    if version.commit is None or manifest.dvc.md5 is None:
        raise RegistryError(f"{ref}@{at} was not recorded in DVC", hint="only versions committed with dvc.lock "
                            "can be pulled")
    target = dest if dest is not None else settings.work_dir / "pulled" / manifest.name / f"{manifest.tag}@{at}"
    hashes = hash_cache(settings)
    if holds(target, manifest, hashes):
        return PullResult(manifest, target, False, **format_of(manifest.tag).offer(target, manifest, False),
                          verified=check(manifest, target))
    with atomic_output(target) as tmp:
        dvcrepo.get(settings, manifest.dvc.path, rev=version.commit, out=tmp)
        for f in manifest.files:
            actual = hashes.sha256(tmp / f.path) if (tmp / f.path).is_file() else "missing"
            if actual != f.sha256:
                raise BlobMismatch(f"{ref}@{at}", f.path, f.sha256, actual)
        verified = check(manifest, tmp)
    return PullResult(manifest, target, True, **format_of(manifest.tag).offer(target, manifest, False),
                      verified=verified)


def holds(target: Path, manifest: Manifest, hashes: HashCache) -> bool:
    """Whether `target` holds exactly the files `manifest` records (sizes, then sha256 through the hash cache)."""
    try:
        return all(
            (target / f.path).stat().st_size == f.size and hashes.sha256(target / f.path) == f.sha256
            for f in manifest.files
        )
    except FileNotFoundError:
        return False


def _fetch_into(settings: Settings, manifest: Manifest, target: Path,
                check: Callable[[Manifest, Path], Verified]) -> Verified:
    stage, path = manifest.dvc.stage, manifest.dvc.path
    locked = dvcrepo.locked_out(settings, stage, path)
    if locked is None:
        raise RegistryError(
            f"dvc.lock records no {path} for {manifest.ref} (stage {stage})",
            hint="the manifest was committed without dvc.lock: pull the commit that added both (`git pull`), "
            "or register it again",
        )
    if manifest.dvc.md5 is not None and manifest.dvc.md5 != locked.md5:
        raise ManifestInvalid(
            str(settings.manifests_dir / manifest.name / f"{manifest.tag}.json"),
            f"it records DVC hash {manifest.dvc.md5}, dvc.lock records {locked.md5}",
        )
    try:
        dvcrepo.fetch(settings, stage)
    except RemoteObjectMissing as err:
        raise RemoteObjectMissing(
            f"{manifest.ref}: {err.message}",
            objects=err.objects,
            hint=f"upload it again from the registering machine (`modelmint verify {manifest.ref} --repair`) or from "
            f"a machine that has the build (`{format_of(manifest.tag).rebuild_command(manifest.name, manifest.tag)}`), then rerun the pull",
        ) from err
    cache = dvcrepo.cache_dir(settings)
    listing = dvcrepo.dir_listing(cache, locked.md5)
    missing = [f.path for f in manifest.files if f.path not in listing]
    if missing:
        raise ManifestInvalid(
            str(settings.manifests_dir / manifest.name / f"{manifest.tag}.json"),
            f"it lists {missing}, which the DVC-tracked directory does not hold",
        )
    with atomic_output(target) as tmp:
        tmp.mkdir()
        for f in manifest.files:
            obj = dvcrepo.cache_object(cache, listing[f.path])
            if not obj.is_file():
                from pipelines.core.errors import RemoteError

                raise RemoteError(
                    f"the DVC remote does not hold {f.path} of {manifest.ref} (md5 {listing[f.path]})",
                    hint="push it from the machine that registered it (`dvc push`), or check `dvc remote list`",
                )
            out = tmp / f.path
            out.parent.mkdir(parents=True, exist_ok=True)
            actual, md5 = _copy_hashing(obj, out)
            if actual != f.sha256:
                if md5 == listing[f.path]:
                    # The object is exactly what DVC recorded (its bytes hash to its own address): the manifest
                    # is what disagrees. Nothing is deleted; the destination keeps whatever it held.
                    raise ManifestDisagrees(_shown(settings, manifest), f.path, f.sha256, actual, md5)
                # The cached object is not even what its DVC name says (a damaged remote or cache): drop it so
                # that the next pull downloads it again instead of trusting it.
                obj.unlink(missing_ok=True)
                raise BlobMismatch(manifest.ref, f.path, f.sha256, actual, rebuild=format_of(manifest.tag).rebuild_command(manifest.name, manifest.tag))
        # Before the rename: a refused signature leaves the destination as it was.
        return check(manifest, tmp)


def _shown(settings: Settings, manifest: Manifest) -> str:
    """The manifest's path as git commands take it from the repository root."""
    path = manifest_path(settings, manifest.name, manifest.tag)
    try:
        return path.relative_to(settings.repo_dir).as_posix()
    except ValueError:
        return str(path)


def _copy_hashing(src: Path, dst: Path) -> tuple[str, str]:
    """Copy `src` to `dst` and return the sha256 and the md5 (DVC's address) of the bytes written, in one read.

    Hashing a chunk (hashlib releases the GIL) overlaps with writing the previous one: about the time of
    the slower of the two instead of their sum.
    """
    h, m = hashlib.sha256(), hashlib.md5()

    def update(chunk: bytes) -> None:
        h.update(chunk)
        m.update(chunk)

    pending: Future[None] | None = None
    with open(src, "rb") as fin, open(dst, "wb") as fout, ThreadPoolExecutor(1) as pool:
        while chunk := fin.read(_CHUNK):
            if pending is not None:
                pending.result()
            pending = pool.submit(update, chunk)
            fout.write(chunk)
        if pending is not None:
            pending.result()
    return h.hexdigest(), m.hexdigest()
