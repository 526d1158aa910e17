"""Check the DVC remote's copy of registered artifacts against their manifests, without pulling them into place."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.core.errors import ManifestInvalid, RegistryError, RemoteIntegrityError
from pipelines.core.settings import Settings
from pipelines.registry import dvcrepo
from pipelines.registry.formats import format_of
from pipelines.registry.manifest import Manifest, find_manifest, list_manifests


@dataclass(frozen=True)
class ArtifactCheck:
    manifest: Manifest
    check: dvcrepo.RemoteCheck | None
    """What the remote holds (None: DVC recorded nothing to look for)."""
    problems: tuple[str, ...]
    repaired: tuple[str, ...] = ()
    """Objects found damaged or missing and uploaded again (with `repair`); `problems` is what is still wrong."""

    @property
    def ref(self) -> str:
        return self.manifest.ref

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class VerifyResult:
    artifacts: tuple[ArtifactCheck, ...]
    invalid: tuple[ManifestInvalid, ...] = ()
    removed_uploads: tuple[str, ...] = field(default=())
    """Temporary uploads of killed pushes removed from the remote (dvcrepo.clean_stale_uploads)."""

    @property
    def ok(self) -> bool:
        return not self.invalid and all(a.ok for a in self.artifacts)

    def error(self) -> RegistryError | None:
        """The error naming every bad or missing object and the commands that repair it; None when all is well."""
        bad = [a for a in self.artifacts if not a.ok]
        invalid = [i.message for i in self.invalid]
        if bad:
            problems = [f"{a.ref}: {p}" for a in bad for p in a.problems] + invalid
            return RemoteIntegrityError(problems, [a.ref for a in bad],
                                        [format_of(a.manifest.tag).rebuild_command(a.manifest.name, a.manifest.tag) for a in bad])
        if invalid:
            return RegistryError(f"{len(invalid)} manifest(s) could not be checked:\n" + "\n".join(invalid),
                                 hint=self.invalid[0].hint)
        return None


def verify_remote(settings: Settings, refs: list[str] | None = None, *, repair: bool = False) -> VerifyResult:
    """Hash every object of the named artifacts (all registered ones when `refs` is None) as the default DVC
    remote holds it, against DVC's md5 and the manifest's sha256; nothing is pulled into the workspace.

    The whole remote is also swept for temporary uploads killed pushes left (dvcrepo.clean_stale_uploads).
    With `repair`, what is missing or damaged is uploaded again from this machine's DVC cache (or its
    workspace copy) and checked again.

    Raises:
        ConfigError, NotRegistered, ManifestInvalid: a ref that is not name:tag, not registered, or invalid.
        RemoteError, RemoteUnavailable: no usable default remote.
    """
    if refs:
        manifests, invalid = [find_manifest(settings, r) for r in refs], []
    else:
        listing = list_manifests(settings)
        manifests, invalid = listing.manifests, listing.invalid
        if not manifests and not invalid:  # a fresh registry: nothing to check, no remote needed
            return VerifyResult((), (), ())
    removed = dvcrepo.clean_stale_uploads(settings)
    return VerifyResult(tuple(_verify_one(settings, m, repair) for m in manifests), tuple(invalid), tuple(removed))


def _verify_one(settings: Settings, m: Manifest, repair: bool) -> ArtifactCheck:
    locked = dvcrepo.locked_out(settings, m.dvc.stage, m.dvc.path)
    if m.dvc.md5 is not None and locked is not None and locked.md5 != m.dvc.md5:
        return ArtifactCheck(m, None, (
            f"the manifest records DVC hash {m.dvc.md5}, dvc.lock records {locked.md5}: restore the one that was "
            f"edited (`git log -p -- dvc.lock registry/manifests/{m.name}/{m.tag}.json`)",
        ))
    md5 = m.dvc.md5 or (locked.md5 if locked is not None else None)
    if md5 is None:
        return ArtifactCheck(m, None, (
            f"DVC recorded nothing for {m.dvc.path} (no md5 in the manifest, no stage {m.dvc.stage} in dvc.lock): "
            "commit dvc.lock with the manifest (`git pull` the commit that registered it)",
        ))
    expected = {f.path: f.sha256 for f in m.files}
    check = dvcrepo.check_remote(settings, md5, expected, hash_contents=True)
    repaired: tuple[str, ...] = ()
    if repair and any(o.damaged for o in check.bad):
        try:
            dvcrepo.ensure_in_remote(settings, m.dvc.stage, md5, expected, hash_contents=True)
        except RegistryError as err:
            failed = (*(o.describe() for o in check.bad), f"repair failed: {err.message}")
            return ArtifactCheck(m, check, failed)
        repaired = tuple(o.describe() for o in check.bad if o.damaged)
        check = dvcrepo.check_remote(settings, md5, expected, hash_contents=True)
    problems = [o.describe() for o in check.bad]
    if problems and not m.dvc.pushed:
        problems.append(f"it was registered without a push (`dvc repro`): push it with `dvc push {m.dvc.stage}`")
    return ArtifactCheck(m, check, tuple(problems), repaired)
