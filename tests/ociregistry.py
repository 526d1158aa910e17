"""A real OCI registry for tests: Debian's docker-registry (distribution 2.8) on 127.0.0.1, its own storage and config.

Started by the tests, stopped by its own pid; its access log shows every request it served, so a test can count
uploads independently of what the client says it did.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from registry_env import ROOT, free_port


@dataclass
class RunningRegistry:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def storage(self) -> Path:
        return self.root / "storage" / "docker" / "registry" / "v2"

    def blob_data(self, digest: str) -> Path:
        """Where the registry's filesystem driver keeps a blob's bytes."""
        hexd = digest.removeprefix("sha256:")
        return self.storage / "blobs" / "sha256" / hexd[:2] / hexd / "data"

    def requests(self, method: str) -> list[str]:
        """The access-log lines of `method` requests served so far."""
        return [ln for ln in self.log.read_text(errors="replace").splitlines() if f'"{method} /v2/' in ln]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


_CONFIG = """version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
  secret: modelmint-tests-only
"""


def registry_binary() -> str:
    """docker-registry, installed by toolchains/setup-registry.sh (apt-get) when it is not on PATH yet."""
    found = shutil.which("docker-registry")
    if found is None:
        done = subprocess.run(["bash", str(ROOT / "toolchains" / "setup-registry.sh")], capture_output=True, text=True)
        found = shutil.which("docker-registry")
        assert found, f"docker-registry is not installed and setup-registry.sh failed:\n{done.stdout}{done.stderr}"
    return found


_HTPASSWD = """auth:
  htpasswd:
    realm: modelmint-tests
    path: {path}
"""


def start_registry(root: Path, *, auth: Path | None = None) -> RunningRegistry:
    """A registry serving plain HTTP on a free port of 127.0.0.1, storing under `root`; with `auth` (an htpasswd
    file of bcrypt hashes) it asks for basic credentials."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = root / "config.yml"
    config.write_text(_CONFIG.format(storage=root / "storage", port=port)
                      + (_HTPASSWD.format(path=auth) if auth else ""))
    log = root / "registry.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([registry_binary(), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
    reg = RunningRegistry(root, port, proc, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"docker-registry exited {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://{reg.host}/v2/", timeout=2).status_code in (200, 401):
                return reg
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    reg.stop()
    raise AssertionError(f"docker-registry did not answer on {reg.host} within 30 s:\n{log.read_text()[-2000:]}")
