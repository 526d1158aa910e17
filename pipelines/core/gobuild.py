"""Small Go programs that use only the standard library, built once per source hash into MODELMINT_HOME."""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.errors import ToolchainMissing
from pipelines.core.fsutil import atomic_output
from pipelines.core.runner import run
from pipelines.core.settings import Settings

# Debian's golang-go puts `go` on PATH; its versioned directory is the fallback for PATH-less shells.
_GO_FALLBACKS = ("/usr/lib/go/bin/go", "/usr/local/go/bin/go")


class GoMissing(ToolchainMissing):
    def __init__(self, purpose: str = "the template renderer") -> None:
        super().__init__(f"a Go compiler (needed to build {purpose})", os.environ.get("PATH", ""))
        self.hint = "run `bash toolchains/setup-go.sh` (apt-get installs golang-go), or put Go >= 1.19 on PATH"


def find_go(purpose: str = "the template renderer") -> Path:
    """The Go compiler to build with.

    Raises:
        GoMissing: no `go` on PATH or in the usual install directories.
    """
    found = shutil.which("go")
    if found:
        return Path(found)
    for candidate in _GO_FALLBACKS:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    raise GoMissing(purpose)


@dataclass(frozen=True)
class GoProgram:
    """A Go main package in `source` (go.mod and *.go, standard library only), built as `name`."""

    name: str
    source: Path
    purpose: str
    """What it is, for messages: "the template renderer"."""

    def sources(self) -> list[Path]:
        return sorted([self.source / "go.mod", *self.source.glob("*.go")], key=lambda p: p.name)

    def source_hash(self) -> str:
        h = hashlib.sha256()
        for path in self.sources():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()[:16]

    def binary_path(self, settings: Settings) -> Path:
        """Where the build of the current source is (or goes): toolchains/NAME-HASH/NAME."""
        return settings.toolchains_dir / f"{self.name}-{self.source_hash()}" / self.name

    def binary(self, settings: Settings) -> Path:
        """The program built from the current source, compiled once per source hash outside the repo.

        Raises:
            GoMissing: it is not built yet and there is no Go compiler.
            ToolError: `go build` failed.
        """
        binary = self.binary_path(settings)
        if binary.is_file():
            return binary
        go = find_go(self.purpose)
        with atomic_output(binary.parent) as tmp:
            tmp.mkdir(parents=True)
            work = tmp / "work"
            # Build from a private copy so a read-only install (site-packages) is never written to.
            (work / "src").mkdir(parents=True)
            for path in self.sources():
                shutil.copy2(path, work / "src" / path.name)
            run(
                [go, "build", "-trimpath", "-o", tmp / self.name, "."],
                cwd=work / "src",
                env={
                    "GOCACHE": str(work / "cache"),
                    "GOPATH": str(work / "gopath"),
                    "GOFLAGS": "-mod=mod",
                    "GOPROXY": "off",  # the standard library only: no module is ever downloaded
                    "GOTOOLCHAIN": "local",
                    "CGO_ENABLED": "0",
                    "HOME": str(work),
                },
                timeout=600,
                hint=f"{self.purpose} uses only Go's standard library; check `go version` (>= 1.19)",
            )
            _chmod_tree_writable(work)
            shutil.rmtree(work)
            (tmp / "SOURCE_SHA256").write_text(self.source_hash() + "\n", encoding="utf-8")
        return binary


def _chmod_tree_writable(root: Path) -> None:
    # Go's module cache is read-only on purpose; make it removable.
    for dirpath, _dirs, _files in os.walk(root):
        os.chmod(dirpath, 0o755)
