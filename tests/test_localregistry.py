"""`modelmint registry serve`: the local registry the docs recommend for `ollama pull` (docs/oci.md).

The command runs for real (Debian's docker-registry, the blob server on 127.0.0.2); what Ollama needs of it is
read from Ollama's source (server/download.go: the blob GET must answer a redirect with a `Location` on another
host; the chunk GETs are Range requests to that `Location`, without credentials), and checked here with plain
HTTP requests that do exactly that, and with modelmint's own publish client.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from registry_env import free_port

from pipelines.publish.oci import Blob, OciClient, RegistryRef

MODELMINT = [sys.executable, "-m", "pipelines.cli"]


def _serve(tmp: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*MODELMINT, "registry", "serve", "--port", str(port), "--dir", str(tmp / "reg"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "MODELMINT_HOME": str(tmp / "home")})


def _up(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("the registry did not answer within 60 s")


def _children(pid: int) -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = free_port()
    proc = _serve(tmp_path, port)
    try:
        _up(port, proc)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)


def test_blob_gets_redirect_to_another_host_serving_ranges_without_credentials(served) -> None:
    port, _ = served
    data = os.urandom(300_000)
    blob = Blob.of_bytes("application/vnd.ollama.image.model", data)
    with OciClient(RegistryRef.parse(f"127.0.0.1:{port}/modelmint", insecure=True)) as client:
        client.push_blob("modelmint/tiny", blob)
        assert client.blob_redirects("modelmint/tiny", blob.digest)
        assert client.read_blob("modelmint/tiny", blob.digest, limit=1 << 20) == data  # publish's own client too
    # what Ollama's download does (server/download.go): the GET, not following another host, must be a 307 with
    # a Location; then Range chunks from that Location, with no Authorization header
    url = f"http://127.0.0.1:{port}/v2/modelmint/tiny/blobs/{blob.digest}"
    r = httpx.get(url, follow_redirects=False)
    assert r.status_code == 307, r.status_code
    location = httpx.URL(r.headers["location"])
    assert location.host == "127.0.0.2" and location.host != "127.0.0.1"
    head = httpx.head(location)
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(data)
    parts = []
    for start in range(0, len(data), 100_000):
        part = httpx.get(location, headers={"Range": f"bytes={start}-{start + 99_999}"})
        assert part.status_code == 206 and part.headers["content-range"] == (
            f"bytes {start}-{min(start + 99_999, len(data) - 1)}/{len(data)}")
        parts.append(part.content)
    assert "sha256:" + hashlib.sha256(b"".join(parts)).hexdigest() == blob.digest
    # the blob server serves the registry's storage and nothing outside it
    assert httpx.get(location.copy_with(path="/../config.yml")).status_code == 404
    assert httpx.get(location.copy_with(path="/config.yml")).status_code == 404


def test_sigterm_stops_the_registry_and_the_blob_server(served) -> None:
    port, proc = served
    kids = _children(proc.pid)
    assert kids, "docker-registry is not a child of `modelmint registry serve`"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    for kid in kids:
        assert not Path(f"/proc/{kid}").exists() or "zombie" in Path(f"/proc/{kid}/status").read_text(), kid
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2)


def test_a_port_in_use_is_one_clear_error(served, tmp_path: Path) -> None:
    port, _ = served
    second = _serve(tmp_path / "second", port)
    _, stderr = second.communicate(timeout=60)
    assert second.returncode != 0
    assert f"127.0.0.1:{port} is in use" in stderr and "choose another --port" in stderr, stderr
    assert "Traceback" not in stderr and "registry on" not in stderr  # no banner for a registry that is not up
