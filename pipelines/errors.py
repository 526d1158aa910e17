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

    def __init__(self, argv: list[str], returncode: int, stderr_tail: str, *, hint: str | None = None) -> None:
        shown = " ".join(argv[:6]) + (" …" if len(argv) > 6 else "")
        super().__init__(
            f"`{shown}` failed with exit code {returncode}:\n{stderr_tail}",
            hint=hint,
        )
        self.argv = argv
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class ToolTimeout(ToolError):
    transient = True


DiskLocation = Literal["work_dir", "artifacts", "dvc_cache", "home", "repo"]
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


GGUF_ADVICE = "Try a higher-bit type (q5_k_m, q8_0) or an imatrix"
COMPRESSED_ADVICE = "Try fp8 (near lossless) instead of a 4-bit scheme, or more calibration samples"


class GateFailed(ModelmintError):
    """A variant measured worse than its gate allows."""

    def __init__(
        self, variant: str, failures: list[str], report_path: str | None = None, *, advice: str = GGUF_ADVICE
    ) -> None:
        super().__init__(
            f"{variant} failed its quality gate: " + "; ".join(failures),
            hint=(f"see {report_path}; " if report_path else "") + f"the variant was not registered. {advice}",
        )
        self.variant = variant
        self.failures = failures
        self.report_path = report_path


class RegistryError(ModelmintError):
    """The registry (manifests in git, blobs in DVC) cannot do what was asked."""


class ManifestInvalid(RegistryError):
    """A manifest that does not read back as one modelmint wrote (edited by hand, truncated, misplaced)."""

    def __init__(self, path: str, problems: str) -> None:
        super().__init__(
            f"manifest {path} is invalid: {problems}",
            hint=f"manifests are written by modelmint only: restore it with `git checkout -- {path}`, "
            "or register the variant again with `modelmint convert NAME --variants TAG`",
        )
        self.path = path
        self.problems = problems


class NotRegistered(RegistryError):
    def __init__(self, ref: str, known: list[str]) -> None:
        super().__init__(
            f"{ref} was never registered (registered: {', '.join(sorted(known)) or 'nothing yet'})",
            hint="`modelmint list` shows what is registered; `modelmint convert NAME --variants TAG` builds, "
            "validates and registers one",
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

    def __init__(self, ref: str, path: str, expected: str, actual: str) -> None:
        super().__init__(
            f"{ref}: {path} from the DVC remote has sha256 {actual}, the manifest records {expected}; "
            "nothing was replaced",
            hint="the remote (or the local DVC cache) holds other bytes than were registered: push the right "
            "blob again from the machine that registered it (`dvc push`), or register the variant again",
        )
        self.ref = ref
        self.path = path
        self.expected = expected
        self.actual = actual


class OrchestratorError(ModelmintError):
    """The Prefect server, work pool or deployment a command needs is not there."""
