"""Every error modelmint raises: structured fields, a next step for people, and whether a retry can help."""

from __future__ import annotations

from typing import Literal


class ModelmintError(Exception):
    """Base class. `hint` says what to run next; `transient` says whether retrying the same call may succeed."""

    transient: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  → {self.hint}"


class ConfigError(ModelmintError):
    """A catalog, recipe or setting that does not validate."""


class CatalogEntryNotFound(ConfigError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"no catalog entry named {name!r} (known: {', '.join(sorted(known)) or 'none'})",
            hint="run `modelmint catalog list` to see the entries, or add one to registry/catalog.yaml",
        )
        self.name = name


class ToolchainMissing(ModelmintError):
    def __init__(self, what: str, path: str) -> None:
        super().__init__(
            f"{what} is not installed (looked in {path})",
            hint="run `bash toolchains/setup-llama-cpp.sh` (or `bash scripts/setup.sh` for everything)",
        )
        self.path = path


class ToolError(ModelmintError):
    """An external tool exited non-zero. Carries the argv and the tail of its stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr_tail: str, *, hint: str | None = None,
                 stderr: str | None = None) -> None:
        shown = " ".join(argv[:6]) + (" …" if len(argv) > 6 else "")
        super().__init__(
            f"`{shown}` failed with exit code {returncode}:\n{stderr_tail}",
            hint=hint,
        )
        self.argv = argv
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.stderr = stderr if stderr is not None else stderr_tail
        """All the tool wrote to stderr (the message shows only the tail), for readers of an earlier line."""


class ToolTimeout(ToolError):
    transient = True


DiskLocation = Literal["work_dir", "artifacts", "dvc_cache", "dvc_remote", "oci_registry", "home", "repo"]
"""Which of modelmint's directories a path is in; each moves differently when its disk is full."""

_DISK_WHAT: dict[str, str] = {
    "work_dir": "the work dir (MODELMINT_WORK_DIR)",
    "artifacts": "the repository's artifacts/ directory",
    "dvc_cache": "the DVC cache",
    "home": "MODELMINT_HOME (toolchains, generated models, hub downloads)",
    "repo": "the repository",
}
_DISK_HINT: dict[str, str] = {
    "work_dir": "free space on that disk or point MODELMINT_WORK_DIR at a larger one, then rerun the same command "
    "(finished steps are kept)",
    "artifacts": "free space on the disk holding the repository (artifacts/ is part of it: MODELMINT_WORK_DIR does "
    "not move it), then rerun the same command",
    "dvc_cache": "free space on that disk, or move the DVC cache to a larger one with `dvc cache dir "
    "/path/on/a/larger/disk` (run in the repository), then rerun the same command",
    "home": "free space there or point MODELMINT_HOME at a larger disk (then set the toolchains up there again "
    "with `bash scripts/setup.sh`), then rerun the same command",
    "repo": "free space on the disk holding the repository, then rerun the same command",
}


class DiskFullError(ModelmintError):
    """A filesystem filled while modelmint or a tool wrote to it. `location` says which of modelmint's
    directories it holds (None: not one of them), and so what moves it to a larger disk."""

    def __init__(self, path: str, detail: str = "", *, location: DiskLocation | None = None) -> None:
        what = f" ({_DISK_WHAT[location]})" if location else ""
        super().__init__(
            f"no space left on the device holding {path}{what}{': ' + detail if detail else ''}",
            hint=_DISK_HINT[location] if location else "free space on that device, then rerun the same command",
        )
        self.path = path
        self.detail = detail
        self.location = location


class RunTooLarge(ModelmintError):
    """A run whose peak disk or memory need exceeds what the machine has, refused before any work.

    `shortfalls` holds (where, bytes needed at the run's peak, bytes there now) for each filesystem or the memory
    that is short; `hint` says which way out gives back how much."""

    def __init__(self, what: str, shortfalls: list[tuple[str, int, int]], *, hint: str) -> None:
        lines = [f"  {where}: needs {_gib(need)} at its peak, {_gib(have)} free" for where, need, have in shortfalls]
        super().__init__(f"{what} does not fit on this machine; nothing was started:\n" + "\n".join(lines), hint=hint)
        self.shortfalls = shortfalls


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):,.1f} MiB"


class SourceError(ModelmintError):
    """The upstream source cannot be used: missing, not pinned, pickle-only, corrupt."""

    def __init__(
        self, message: str, *, repo_id: str | None = None, revision: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.repo_id = repo_id
        self.revision = revision


class HubUnavailable(SourceError):
    """Network failure or 5xx from the hub: worth retrying."""

    transient = True


class PackageIndexUnavailable(SourceError):
    """Network failure or 5xx from the package index a wheel source is downloaded from: worth retrying."""

    transient = True


class IntegrityError(SourceError):
    """A file's sha256 does not match what its publisher recorded."""

    def __init__(self, path: str, expected: str, actual: str, **kw: object) -> None:
        super().__init__(
            f"sha256 mismatch for {path}: expected {expected}, got {actual}",
            hint="the download is corrupt or the upstream file changed; delete nothing by hand, rerun the "
            "same command to download it again",
            **kw,  # type: ignore[arg-type]
        )
        self.path = path
        self.expected = expected
        self.actual = actual


class UnsupportedModel(ModelmintError):
    """An architecture, tokenizer or template the toolchain cannot handle."""


class ArtifactError(ModelmintError):
    """An output file that does not read back as what it claims to be."""


class ToolStoppedShort(ArtifactError):
    """A tool exited 0 but its output stops before the part it always ends with (its summary): not a verdict
    on the artifact, so the same call is retried."""

    transient = True


class GateFailed(ModelmintError):
    """A variant measured worse than its gate allows. `advice` comes from pipelines.core.gates.gate_advice."""

    def __init__(self, variant: str, failures: list[str], report_path: str | None = None, *, advice: str) -> None:
        super().__init__(
            f"{variant} failed its quality gate: " + "; ".join(failures),
            hint=(f"see {report_path}; " if report_path else "") + f"the variant was not registered. {advice}",
        )
        self.variant = variant
        self.failures = failures
        self.report_path = report_path
        self.advice = advice


class ShapeRefused(ModelmintError):
    """A variant whose scheme cannot take the model's shapes, refused before any tool started."""

    def __init__(self, variant: str, message: str, *, layers: list[str], works: list[str], hint: str) -> None:
        super().__init__(f"{variant}: {message}", hint=hint)
        self.variant = variant
        self.layers = layers
        self.works = works


class VariantsFailed(ModelmintError):
    """Some of the variants a run asked for failed (refused, tool error, gate); the others were finished.

    `causes` maps each failed variant to one line saying at which stage and why, `advice` to what to try.
    """

    def __init__(self, asked: list[str], causes: dict[str, str], advice: dict[str, str]) -> None:
        gate = [v for v, c in causes.items() if c.startswith("gate:")]
        lines = [f"  {v}: {c}" for v, c in causes.items()]
        message = (f"{len(causes)} of {len(asked)} variant(s) failed: {', '.join(causes)}"
                   + (f" ({', '.join(gate)} failed its quality gate)" if gate else "") + "\n" + "\n".join(lines))
        done = [v for v in asked if v not in causes]
        hint = "; ".join(f"{v}: {a}" for v, a in advice.items())
        if done:
            hint = hint.rstrip(".") + f". {', '.join(done)} finished as the summary shows"
        super().__init__(message, hint=hint)
        self.asked = asked
        self.causes = causes
        self.advice = advice


class RegistryError(ModelmintError):
    """The registry (manifests in git, blobs in DVC) cannot do what was asked."""


class ManifestInvalid(RegistryError):
    """A manifest that does not read back as one modelmint wrote (edited by hand, truncated, misplaced)."""

    def __init__(self, path: str, problems: str) -> None:
        super().__init__(
            f"manifest {path} is invalid: {problems}",
            hint=f"manifests are written by modelmint only: restore it with `git checkout -- {path}`, "
            "or register the variant again with `modelmint convert NAME --variants TAG --register`",
        )
        self.path = path
        self.problems = problems


class NotRegistered(RegistryError):
    def __init__(self, ref: str, known: list[str]) -> None:
        super().__init__(
            f"{ref} was never registered (registered: {', '.join(sorted(known)) or 'nothing yet'})",
            hint="`modelmint list` shows what is registered; `modelmint convert NAME --variants TAG --register` "
            "builds, validates and registers one",
        )
        self.ref = ref


class RemoteError(RegistryError):
    """The DVC remote is missing or misconfigured: retrying the same call will not help."""

    def __init__(self, message: str, *, remote: str | None = None, hint: str | None = None) -> None:
        super().__init__(
            message,
            hint=hint
            or "check `dvc remote list` and .dvc/config (README: \"DVC remotes\"); a local remote is a directory "
            "set with `dvc remote add -d local /path/to/dir`",
        )
        self.remote = remote


class RemoteUnavailable(RemoteError):
    """The DVC remote could not be reached (network, 5xx, a missing mount): worth retrying."""

    transient = True


class BlobMismatch(RegistryError):
    """A fetched blob whose sha256 differs from its manifest: it replaces nothing."""

    def __init__(self, ref: str, path: str, expected: str, actual: str, *, rebuild: str | None = None) -> None:
        super().__init__(
            f"{ref}: {path} from the DVC remote has sha256 {actual}, the manifest records {expected}; "
            "nothing was replaced",
            hint="the remote (or the local DVC cache) holds other bytes than were registered: upload them again "
            f"from the registering machine (`modelmint verify {ref} --repair`; a plain `dvc push` skips objects the "
            "remote already has) or from a machine that has the build (`"
            + (rebuild or "modelmint convert NAME --variants TAG --register")
            + "`), then rerun the pull",
        )
        self.ref = ref
        self.path = path
        self.expected = expected
        self.actual = actual


class RemoteObjectMissing(RemoteError):
    """The DVC remote is reachable but lacks an object (never pushed, or deleted there): retrying will not help."""

    def __init__(self, message: str, *, objects: list[str], hint: str | None = None) -> None:
        super().__init__(
            message,
            hint=hint
            or "upload it again from a machine that has the build (`modelmint convert NAME --variants TAG "
            "--register`) or from the registering machine (`modelmint verify NAME:TAG --repair`)",
        )
        self.objects = objects


class RemoteIntegrityError(RegistryError):
    """Objects of registered artifacts are missing from the DVC remote or hold other bytes than registered."""

    def __init__(self, problems: list[str], refs: list[str], rebuild: list[str]) -> None:
        super().__init__(
            f"the DVC remote's copy of {', '.join(refs)} is damaged:\n" + "\n".join(f"  {p}" for p in problems),
            hint=f"from the registering machine: `modelmint verify {' '.join(refs)} --repair` (uploads its own "
            "intact copies of the bad objects over them; a plain `dvc push` skips objects the remote already lists); "
            "from a machine that has the build: " + "; ".join(f"`{r}`" for r in rebuild),
        )
        self.problems = problems
        self.refs = refs
        self.rebuild = rebuild


class RecordMoved(RegistryError):
    """dvc.lock no longer records the version of an output that was checked: a registration of the same tag (or
    a `dvc repro`) ran meanwhile. Nothing was changed on its account."""

    def __init__(self, stage: str, checked: str, now: str | None, *, hint: str | None = None) -> None:
        super().__init__(
            f"dvc.lock no longer records {checked} for {stage} (it records {now or 'nothing'} now): it was "
            "registered again while its remote copy was checked; nothing was uploaded or removed",
            hint=hint or "rerun the same command: it checks the version registered now",
        )
        self.stage = stage
        self.checked = checked
        self.now = now


class ManifestDisagrees(ManifestInvalid):
    """A manifest whose hashes differ from the bytes DVC recorded for the same artifact (dvc.lock)."""

    def __init__(self, path: str, file: str, manifest_sha256: str, dvc_sha256: str, md5: str) -> None:
        super().__init__(
            path,
            f"it records sha256 {manifest_sha256} for {file}, but the object DVC's record names (md5 {md5}, "
            f"checked against its own address) has sha256 {dvc_sha256}; nothing was replaced or deleted",
        )
        self.hint = (
            f"the manifest was edited or mixed up with another commit's: restore it with `git checkout -- {path}` "
            f"(`git log -p -- {path}` shows who changed what), then rerun the pull"
        )
        self.file = file
        self.manifest_sha256 = manifest_sha256
        self.dvc_sha256 = dvc_sha256
        self.md5 = md5


class OrchestratorError(ModelmintError):
    """The Prefect server, work pool or deployment a command needs is not there."""


class OciError(RegistryError):
    """An OCI registry (the distribution HTTP API) refused or failed a request; `registry` is its host."""

    def __init__(self, message: str, *, registry: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.registry = registry


class OciUnavailable(OciError):
    """The registry could not be reached or answered 5xx: worth retrying."""

    transient = True


class OciAuthRefused(OciError):
    """The registry asked for credentials that were missing or that it refused."""


class TagConflict(OciError):
    """A tag in the registry already points at other bytes than this artifact's image."""

    def __init__(self, image: str, existing: str, wanted: str, *, registry: str, hint: str) -> None:
        super().__init__(f"{image} already points at {existing}, not at this artifact's image {wanted}; nothing was "
                         "tagged", registry=registry, hint=hint)
        self.image = image
        self.existing = existing
        self.wanted = wanted


class OciBlobMismatch(OciError):
    """A blob read back from the registry whose sha256 is not its digest: it replaces nothing."""

    def __init__(self, image: str, digest: str, actual: str, *, registry: str, hint: str) -> None:
        super().__init__(f"{image}: blob {digest} from the registry has sha256:{actual}; nothing was replaced",
                         registry=registry, hint=hint)
        self.image = image
        self.digest = digest
        self.actual = actual


class SigningKeyError(ConfigError):
    """The signing key (MODELMINT_SIGNING_KEY) or its certificate cannot sign: raised before any build work."""


class TimestampUnavailable(ModelmintError):
    """The Time-Stamp Authority (MODELMINT_TSA_URL) gave no timestamp over a signature: nothing was registered."""

    transient = True
    url: str = ""
    cause: str = ""
    """What the authority did (cannot be reached, answered HTTP 503, …)."""

    @classmethod
    def of(cls, url: str, cause: str, *, left: str = "nothing was registered",
           then: str = "rerun the same command") -> TimestampUnavailable:
        """The authority at `url` gave no timestamp because of `cause`, worded for the command that asked: what it
        `left` and what to do `then`, once the authority answers."""
        err = cls(f"the Time-Stamp Authority {url} {cause}: {left}", hint=(
            f"check that the Time-Stamp Authority MODELMINT_TSA_URL={url} is up and speaks RFC 3161 "
            f"(POST application/timestamp-query), then {then}; unset MODELMINT_TSA_URL to sign without a timestamp"))
        err.url, err.cause = url, cause
        return err

    def left_as(self, left: str, then: str) -> TimestampUnavailable:
        """The same failure worded for a command that `left` something else and is finished by `then`."""
        return self.of(self.url, self.cause, left=left, then=then)


class TimestampInvalid(ModelmintError):
    """An RFC 3161 timestamp that does not hold: over other bytes, by an untrusted authority, or unreadable."""


class TrustPolicyInvalid(ConfigError):
    """registry/trust.yaml does not validate (a typo, an unknown key name, a key file that is not there)."""


class SignatureRefused(RegistryError):
    """An artifact whose signature or provenance the trust policy does not accept: nothing was pulled or replaced."""

    def __init__(self, ref: str, problem: str, *, file: str | None = None, hint: str | None = None) -> None:
        super().__init__(
            f"{ref}: {problem}; nothing was pulled",
            hint=hint or f"`modelmint verify {ref}` says what the remote holds; register it again from a trusted "
            "build (`modelmint convert NAME --variants TAG --register` with MODELMINT_SIGNING_KEY set)",
        )
        self.ref = ref
        self.problem = problem
        self.file = file
