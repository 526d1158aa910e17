"""Check the DVC remote's copy of registered artifacts against their manifests, without pulling them into place."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.core.errors import (
    ManifestInvalid,
    RecordMoved,
    RegistryError,
    RemoteIntegrityError,
    SignatureRefused,
)
from pipelines.core.settings import Settings
from pipelines.registry.pull import settled
from pipelines.store import dvcrepo
from pipelines.store.manifest import Manifest, find_manifest, list_manifests
from pipelines.store.names import format_name
from pipelines.trust.policy import TrustPolicy, load_policy


@dataclass(frozen=True)
class ArtifactCheck:
    manifest: Manifest
    check: dvcrepo.RemoteCheck | None
    """What the remote holds (None: DVC recorded nothing to look for)."""
    problems: tuple[str, ...]
    repaired: tuple[str, ...] = ()
    """Objects found damaged or missing and uploaded again (with `repair`); `problems` is what is still wrong."""
    md5: str | None = None
    """The DVC hash of the directory that was checked (the manifest's, else dvc.lock's)."""
    unchecked: str | None = None
    """Why the remote's copy was not checked (a registration of the tag still under way after the wait): no
    problem of the remote's."""
    refused: tuple[str, ...] = ()
    """The signature check's refusals (also in `problems`): the remote holds the registered bytes, but the signature,
    the provenance or the manifest do not agree; no damage of the remote, and `--repair` does not mend them."""

    @property
    def ref(self) -> str:
        return self.manifest.ref

    @property
    def ok(self) -> bool:
        return not self.problems and self.unchecked is None


class SignatureCheckRefused(RegistryError):
    """What the DVC remote holds is intact (every object hashes to what the manifest records) but its signature check
    refuses it: the manifest, the provenance or the signer is not what the trust policy accepts."""

    def __init__(self, refused: list[tuple[str, str]], invalid: list[str]) -> None:
        refs = sorted({ref for ref, _ in refused})
        super().__init__(
            f"the signature check refuses {', '.join(refs)} (the DVC remote's objects are intact; the signature, "
            "the signed provenance or the manifest is what differs):\n"
            + "\n".join(f"  {ref}: {p}" for ref, p in refused)
            + "".join(f"\n  {i}" for i in invalid),
            hint="`--repair` cannot mend a refused signature: restore an edited manifest (`git log -p -- "
            f"registry/manifests/{refs[0].replace(':', '/')}.json`), add the signer to the trust policy if it is "
            "trusted, or register it again from a trusted build with MODELMINT_SIGNING_KEY set",
        )
        self.refused = refused


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
        bad = [a for a in self.artifacts if any(p not in a.refused for p in a.problems)]
        refused = [a for a in self.artifacts if a.refused]
        invalid = [i.message for i in self.invalid]
        if bad:
            problems = [f"{a.ref}: {p}" for a in bad for p in a.problems if p not in a.refused] + [
                f"{a.ref}: signature check refused (not damage): {p}" for a in refused for p in a.refused] + invalid
            return RemoteIntegrityError(problems, [a.ref for a in bad],
                                        [format_name(a.manifest.tag).rebuild_command(a.manifest.name, a.manifest.tag) for a in bad])
        if refused:
            return SignatureCheckRefused([(a.ref, p) for a in refused for p in a.refused], invalid)
        if invalid:
            return RegistryError(f"{len(invalid)} manifest(s) could not be checked:\n" + "\n".join(invalid),
                                 hint=self.invalid[0].hint)
        unchecked = [a for a in self.artifacts if a.unchecked is not None]
        if unchecked:
            return RegistryError("\n".join(f"{a.ref}: not checked: {a.unchecked}" for a in unchecked),
                                 hint=f"rerun `modelmint verify {' '.join(a.ref for a in unchecked)}` once the "
                                 "registration has finished")
        return None


def verify_remote(settings: Settings, refs: list[str] | None = None, *, repair: bool = False,
                  allow_unsigned: bool = False) -> VerifyResult:
    """Hash every object of the named artifacts (all registered ones when `refs` is None) as the default DVC
    remote holds it, against DVC's md5 and the manifest's sha256; nothing is pulled into the workspace.

    The whole remote is also swept for temporary uploads killed pushes left (dvcrepo.clean_stale_uploads).
    With `repair`, what is missing or damaged is then uploaded again (repair_remote). Where the repository has a trust
    policy (registry/trust.yaml), each artifact's signature and provenance, as the remote holds them, are checked
    against it and its manifest too (signing.verify_directory; unsigned ones are a problem unless allowed).

    Raises:
        TrustPolicyInvalid: registry/trust.yaml does not validate.
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
    policy = load_policy(settings)
    removed = dvcrepo.clean_stale_uploads(settings)
    checks = (_signatures(settings, _verify_one(settings, m), policy, allow_unsigned) for m in manifests)
    result = VerifyResult(tuple(checks), tuple(invalid), tuple(removed))
    return repair_remote(settings, result) if repair else result


def repair_remote(settings: Settings, result: VerifyResult) -> VerifyResult:
    """Upload again, from this machine's DVC cache (or its workspace copy), exactly the objects `result` found
    missing or damaged, then check those artifacts again.

    Each artifact is repaired only while dvc.lock, read again under DVC's lock, still records the version that
    was checked (dvcrepo.reupload): a registration of the same tag since then is not undone, the older version's
    intact objects stay, and the artifact is reported as not repaired, with the command to rerun.

    Raises:
        RemoteError, RemoteUnavailable: no usable default remote.
    """
    return dataclasses.replace(result, artifacts=tuple(_repair_one(settings, a) for a in result.artifacts))


def _verify_one(settings: Settings, m: Manifest) -> ArtifactCheck:
    locked = dvcrepo.locked_out(settings, m.dvc.stage, m.dvc.path)
    if m.dvc.md5 is not None and locked is not None and locked.md5 != m.dvc.md5:
        # dvc.lock ahead of the manifest: a registration of the tag may be pushing; pull's wait tells it from an edit
        try:
            m = settled(settings, m.ref, command="verify")
        except RegistryError as err:
            return ArtifactCheck(m, None, (), unchecked=err.message)
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
    return _checked(settings, m, md5)


def _checked(settings: Settings, m: Manifest, md5: str, repaired: tuple[str, ...] = ()) -> ArtifactCheck:
    check = dvcrepo.check_remote(settings, md5, {f.path: f.sha256 for f in m.files}, hash_contents=True)
    problems = [o.describe() for o in check.bad]
    if problems and not m.dvc.pushed:
        problems.append(f"it was registered without a push (`dvc repro`): push it with `dvc push {m.dvc.stage}`")
    return ArtifactCheck(m, check, tuple(problems), repaired, md5)


def _signatures(settings: Settings, a: ArtifactCheck, policy: TrustPolicy | None, allow_unsigned: bool) -> ArtifactCheck:
    """`a` with what the signature check of the remote's copy finds (nothing to add without a trust policy, or
    when the remote's objects are already reported missing or damaged)."""
    import tempfile

    from pipelines.trust import provenance, signing

    if policy is None or a.problems or a.md5 is None:
        return a
    m = a.manifest
    held = dvcrepo.read_remote_files(settings, a.md5, [signing.SIGNATURE, provenance.PROVENANCE])
    with tempfile.TemporaryDirectory(prefix="modelmint-verify-") as scratch:
        for rel, data in held.items():
            (Path(scratch) / rel).write_bytes(data)
        try:
            signing.verify_directory(Path(scratch), m, policy, shown=f"registry/manifests/{m.name}/{m.tag}.json",
                                     allow_unsigned=allow_unsigned, files_here=False)
        except SignatureRefused as err:
            return dataclasses.replace(a, problems=(*a.problems, err.problem), refused=(*a.refused, err.problem))
    return a


def _repair_one(settings: Settings, a: ArtifactCheck) -> ArtifactCheck:
    m, check = a.manifest, a.check
    if check is None or a.md5 is None or not any(o.damaged for o in check.bad):
        return a
    try:
        repaired = dvcrepo.reupload(settings, m.dvc.stage, m.dvc.path, a.md5, check)
    except RecordMoved as err:
        return dataclasses.replace(a, problems=(*a.problems, f"not repaired: {err.message}; rerun "
                                                f"`modelmint verify {m.ref} --repair` to check the version "
                                                "registered now"))
    except RegistryError as err:
        return dataclasses.replace(a, problems=(*a.problems, f"repair failed: {err.message}"))
    return _checked(settings, m, a.md5, repaired)
