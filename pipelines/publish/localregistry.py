"""`modelmint registry serve`: a local OCI registry that `ollama pull` can pull from.

Ollama's blob download (server/download.go at the release docs/oci.md cites) sends the blob GET with a redirect
policy that stops at another host and then requires a `Location`: it fetches the bytes in Range chunks from the
redirect's target, without the registry's credentials. A distribution registry on filesystem storage answers the
blob GET `200` with the bytes, and Ollama stops with `http: no Location header in response` (ollama/ollama#7244).

So the registry served here is Debian's docker-registry (distribution 2.8, toolchains/setup-registry.sh) on
127.0.0.1 with filesystem storage *and* distribution's `redirect` storage middleware, whose base URL is a
Range-capable, read-only file server over the same storage directory on another loopback address (127.0.0.2 by
default): the stand-in for object storage with pre-signed URLs, which is what a production registry on S3, MinIO
or GCS does on its own. Blob GETs answer 307 to `http://127.0.0.2:PORT/docker/registry/v2/blobs/sha256/…/data`.
Both listen on loopback only.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pipelines.core.errors import ConfigError
from pipelines.core.runner import tool_env

BLOB_HOST = "127.0.0.2"
"""Another host than the registry's 127.0.0.1: Ollama's client follows a redirect only within one host."""


class BlobServer:
    """A Range-capable, read-only file server over `root` on `host`:`port` (0: a free one), asking for no
    credentials, as a pre-signed object-storage URL does not. Serves in a daemon thread until `stop()`."""

    def __init__(self, root: Path, host: str = BLOB_HOST, port: int = 0) -> None:
        served = root.resolve()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _serve(self, *, body: bool) -> None:
                path = (served / self.path.split("?", 1)[0].lstrip("/")).resolve()
                if not path.is_relative_to(served) or not path.is_file():
                    self.send_error(404)
                    return
                size = path.stat().st_size
                start, end, status = 0, size - 1, 200
                rng = self.headers.get("Range", "")
                if rng.startswith("bytes="):
                    a, _, b = rng.removeprefix("bytes=").partition("-")
                    try:
                        start, end, status = int(a or 0), min(int(b) if b else size - 1, size - 1), 206
                    except ValueError:
                        self.send_error(400, "bad Range header")
                        return
                    if start > end:
                        self.send_error(416)
                        return
                self.send_response(status)
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("Accept-Ranges", "bytes")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                if body:
                    with open(path, "rb") as f:
                        f.seek(start)
                        left = end - start + 1
                        while left > 0:
                            chunk = f.read(min(left, 1 << 20))
                            if not chunk:
                                break
                            self.wfile.write(chunk)
                            left -= len(chunk)

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise ConfigError(f"cannot serve the registry's blobs on {host}:{port}: {e.strerror}",
                              hint="choose another --blob-port (or free that one), then rerun") from e
        self.host = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def registry_config(storage: Path, port: int, *, redirect_to: str | None, extra: str = "") -> str:
    """distribution 2.8's configuration: filesystem storage under `storage`, HTTP on 127.0.0.1:`port`, an access
    log on stdout, and with `redirect_to` (a base URL) the `redirect` storage middleware; `extra`: more top-level
    sections (auth, the http section's tls lines go in `extra` as the caller writes them)."""
    text = f"""version: 0.1
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
  secret: modelmint-local-registry
"""
    text += extra
    if redirect_to is not None:
        # registry/storage/driver/middleware/redirect: URLFor answers the base URL's scheme and host plus the
        # driver's own path, whatever the driver, so the blob server above serves it from the same directory
        text += f"""middleware:
  storage:
    - name: redirect
      options:
        baseurl: {redirect_to}
"""
    return text


def registry_binary() -> str:
    found = shutil.which("docker-registry")
    if found is None:
        raise ConfigError("docker-registry (the distribution registry) is not installed: not on PATH",
                          hint="run `bash toolchains/setup-registry.sh` (Debian's docker-registry), then rerun")
    return found


@dataclass
class LocalRegistry:
    """A running registry and its blob server."""

    port: int
    proc: subprocess.Popen[bytes]
    blobs: BlobServer
    log: Path

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.blobs.stop()
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; waited for either way (no zombie left)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


@contextmanager
def local_registry(root: Path, port: int, *, blob_host: str = BLOB_HOST, blob_port: int = 0) -> Iterator[LocalRegistry]:
    """Start the registry (storage, config and log under `root`) and its blob server; stop both on exit.

    Raises:
        ConfigError: docker-registry is not installed, a port is taken, `root` cannot be written, or the registry exits or
            does not answer within 30 s (its log's tail)."""
    binary = registry_binary()
    with socket.socket() as probe:  # another server on the port would answer the readiness probe below
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            raise ConfigError(f"127.0.0.1:{port} is in use ({e.strerror}): another registry or server listens there",
                              hint="choose another --port, or stop what listens there, then rerun") from e
    storage = root / "storage"
    try:
        storage.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where the folder goes, a read-only or virtual filesystem
        raise ConfigError(f"cannot make the registry's storage {storage}: {e.strerror or e}",
                          hint="give --dir a folder you can write (it is created if missing)") from e
    blobs = BlobServer(storage, blob_host, blob_port)
    config = root / "config.yml"
    config.write_text(registry_config(storage, port, redirect_to=f"http://{blobs.host}"))
    log = root / "registry.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                env=tool_env())
    reg = LocalRegistry(port, proc, blobs, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise ConfigError(f"docker-registry exited {proc.returncode} on 127.0.0.1:{port}: {tail[0]}",
                                  hint=f"see {log}; a port in use: choose another --port, then rerun")
            try:
                with urllib.request.urlopen(f"http://{reg.host}/v2/", timeout=2):
                    break
            except urllib.error.HTTPError:
                break  # it answers (401 with auth): up
            except OSError:
                if time.monotonic() > deadline:
                    raise ConfigError(f"docker-registry did not answer on {reg.host} within 30 s",
                                      hint=f"see {log}, then rerun") from None
                time.sleep(0.2)
        yield reg
    finally:
        reg.stop()
