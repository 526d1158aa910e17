"""`modelmint registry serve`: the local registry the docs recommend for `ollama pull` (docs/oci.md).

The command runs for real (Debian's docker-registry, the blob server on 127.0.0.2); what Ollama needs of it is
read from Ollama's source (server/download.go: the blob GET must answer a redirect with a `Location` on another
host; the chunk GETs are Range requests to that `Location`, without credentials), and checked here with plain
HTTP requests that do exactly that, and with modelmint's own publish client. Who may write (pushes need its
credentials, pulls do not), byte ranges as RFC 9110 defines them, bursts of parallel Range GETs, and a
docker-registry that never outlives the command are checked the same way.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from registry_env import free_port

from pipelines.publish.oci import Blob, Credentials, OciClient, OciUnavailable, RegistryRef

MODELMINT = [sys.executable, "-m", "pipelines.cli"]
PUSHER = Credentials("ci", "a-push-secret")


def _env(tmp: Path, *, credentials: bool = True) -> dict[str, str]:
    env = {**os.environ, "MODELMINT_HOME": str(tmp / "home"), "DOCKER_CONFIG": str(tmp / "docker")}
    for key in ("MODELMINT_REGISTRY_USERNAME", "MODELMINT_REGISTRY_PASSWORD"):
        env.pop(key, None)
    if credentials:
        env |= {"MODELMINT_REGISTRY_USERNAME": PUSHER.username, "MODELMINT_REGISTRY_PASSWORD": PUSHER.password}
    return env


def _serve(tmp: Path, port: int, *extra: str, credentials: bool = True) -> subprocess.Popen[str]:
    return subprocess.Popen([*MODELMINT, "registry", "serve", "--port", str(port), "--dir", str(tmp / "reg"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp, credentials=credentials))


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


def _said(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    """What `proc` wrote on stderr until `text` (its banner comes just after the registry answers: a SIGTERM sent at
    the first answer may come before it)."""
    got, deadline, fd = "", time.monotonic() + timeout, proc.stderr.fileno() if proc.stderr else -1
    while text not in got and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            chunk = os.read(fd, 65536).decode(errors="replace")
            if not chunk:
                break
            got += chunk
    return got


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
    with OciClient(RegistryRef.parse(f"127.0.0.1:{port}/modelmint", insecure=True), credentials=PUSHER) as client:
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


# ---------------------------------------------------------------- helpers for what follows

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop `registry serve` and whatever it started, however it behaves."""
    kids = _children(proc.pid)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=20)
    for kid in kids:
        if _alive(kid):
            os.kill(kid, signal.SIGKILL)


def _tcp_listeners(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its sockets in /proc/net/tcp{,6} in state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with_target = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
        if with_target:
            inodes.add(with_target[1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _blob_on(port: int, data: bytes, repository: str = "modelmint/tiny") -> tuple[Blob, httpx.URL]:
    """`data` pushed with the push credentials; the blob server URL its GET redirects to."""
    blob = Blob.of_bytes("application/vnd.ollama.image.model", data)
    with OciClient(RegistryRef.parse(f"127.0.0.1:{port}/modelmint", insecure=True), credentials=PUSHER) as client:
        client.push_blob(repository, blob)
    r = httpx.get(f"http://127.0.0.1:{port}/v2/{repository}/blobs/{blob.digest}", follow_redirects=False)
    assert r.status_code == 307, r.status_code
    return blob, httpx.URL(r.headers["location"])


# ---------------------------------------------------------------- byte ranges (RFC 9110 §14)


def test_byte_ranges_are_answered_as_rfc_9110_defines_them(served) -> None:
    port, _ = served
    data = os.urandom(1000)
    _, location = _blob_on(port, data)
    satisfiable = {  # §14.1.2: suffix, open-ended, a last-pos past the end (clamped)
        "bytes=-10": (990, 999), "bytes=-1000": (0, 999), "bytes=-5000": (0, 999), "bytes=990-": (990, 999),
        "bytes=995-5000": (995, 999), "bytes=0-0": (0, 0), "bytes=0-999": (0, 999), "BYTES=5-9": (5, 9),
    }
    for rng, (first, last) in satisfiable.items():
        r = httpx.get(location, headers={"Range": rng})
        assert (r.status_code, r.headers.get("content-range")) == (206, f"bytes {first}-{last}/1000"), rng
        assert r.content == data[first:last + 1], rng
    for rng in ("bytes=-0", "bytes=1000-", "bytes=1000-1001", "bytes=5000-6000"):  # §14.1.1, §15.5.17
        r = httpx.get(location, headers={"Range": rng})
        assert (r.status_code, r.headers.get("content-range"), r.content) == (416, "bytes */1000", b""), rng
    # §14.2: another unit, a ranges-specifier that does not parse, several ranges: the whole representation
    for rng in ("bytes=0-5,10-20", "bytes=10-5", "items=0-5", "bytes=abc", "bytes=+1-5", "bytes=-"):
        r = httpx.get(location, headers={"Range": rng})
        assert (r.status_code, r.headers.get("content-range"), r.content) == (200, None, data), rng
    head = httpx.head(location, headers={"Range": "bytes=0-5"})  # Range is defined for GET only
    assert (head.status_code, head.headers["content-length"]) == (200, "1000")


def test_a_burst_of_200_parallel_range_gets_is_answered_in_full(served) -> None:
    """Ollama fetches a blob in parallel parts, several blobs at once: every connection of a burst is served."""
    port, _ = served
    part, n = 4096, 200
    data = os.urandom(part * n)
    _, location = _blob_on(port, data)
    start = threading.Barrier(n)
    answers: dict[int, tuple[object, ...]] = {}

    def fetch(i: int) -> None:
        conn = http.client.HTTPConnection(location.host, location.port, timeout=60)
        try:
            start.wait(timeout=60)
            conn.request("GET", location.raw_path.decode(), headers={"Range": f"bytes={i * part}-{(i + 1) * part - 1}"})
            r = conn.getresponse()
            answers[i] = (r.status, r.getheader("Content-Range"), r.read())
        except Exception as e:  # every failure is reported below, by part
            answers[i] = (type(e).__name__, str(e), b"")
        finally:
            conn.close()

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    wrong = {i: a[:2] for i, a in answers.items()
             if a != (206, f"bytes {i * part}-{(i + 1) * part - 1}/{len(data)}", data[i * part:(i + 1) * part])}
    assert len(answers) == n and not wrong, (len(answers), wrong)


# ---------------------------------------------------------------- who may write


def test_anyone_pulls_but_only_the_push_credentials_push_tag_or_delete(served) -> None:
    port, proc = served
    data = os.urandom(5000)
    blob, location = _blob_on(port, data)
    config = Blob.of_bytes("application/vnd.docker.container.image.v1+json", b"{}")
    with OciClient(RegistryRef.parse(f"127.0.0.1:{port}/modelmint", insecure=True), credentials=PUSHER) as client:
        client.push_blob("modelmint/tiny", config)

    def manifest(*layers: Blob) -> bytes:
        return json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                           "config": {"mediaType": config.media_type, "size": config.size, "digest": config.digest},
                           "layers": [{"mediaType": b.media_type, "size": b.size, "digest": b.digest}
                                      for b in layers]}).encode()

    base = f"http://127.0.0.1:{port}/v2/modelmint/tiny"
    pushed = manifest(blob)
    put = httpx.put(f"{base}/manifests/v1", content=pushed, headers={"Content-Type": MANIFEST},
                    auth=httpx.BasicAuth(PUSHER.username, PUSHER.password))
    assert put.status_code == 201, put.text
    for auth in (None, httpx.BasicAuth(PUSHER.username, "wrong"), httpx.BasicAuth("nobody", PUSHER.password)):
        refused = [
            httpx.put(f"{base}/manifests/v1", content=manifest(), headers={"Content-Type": MANIFEST}, auth=auth),
            httpx.delete(f"{base}/blobs/{blob.digest}", auth=auth),
            httpx.post(f"{base}/blobs/uploads/", auth=auth),
        ]
        for r in refused:
            assert r.status_code == 401, (r.request.method, r.status_code, r.text)
            assert r.headers["www-authenticate"].startswith("Basic "), r.headers
            assert "credentials" in r.json()["errors"][0]["message"]
    # the image is as pushed and pulls, anonymously
    got = httpx.get(f"{base}/manifests/v1", headers={"Accept": MANIFEST})
    assert (got.status_code, got.content) == (200, pushed)
    assert httpx.get(location).content == data
    # docker-registry itself listens on no TCP port: nothing reaches it around the credentials
    kids = _children(proc.pid)
    assert kids and all(_tcp_listeners(kid) == set() for kid in kids)


def test_without_credentials_set_serve_records_its_own_where_publish_finds_them(tmp_path: Path) -> None:
    from pipelines.publish.oci import credentials_for

    port = free_port()
    host = f"127.0.0.1:{port}"
    config = tmp_path / "docker" / "config.json"
    proc = _serve(tmp_path, port, credentials=False)
    try:
        _up(port, proc)
        said = _said(proc, "recorded for")
        assert config.stat().st_mode & 0o777 == 0o600
        found = credentials_for(host, username=None, password=None, docker_config=config)
        assert found is not None
        blob = Blob.of_bytes("application/vnd.ollama.image.model", os.urandom(1000))
        # publish's own lookup: the docker config's entry for the host, asked on the registry's challenge
        with OciClient(RegistryRef.parse(f"{host}/modelmint", insecure=True),
                       credentials=lambda: credentials_for(host, username=None, password=None,
                                                           docker_config=config)) as client:
            assert client.push_blob("modelmint/tiny", blob) == "uploaded"
        assert httpx.post(f"http://{host}/v2/modelmint/tiny/blobs/uploads/").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        _stop(proc)
    stderr = said + stderr
    assert found.password not in stderr and f"recorded for {host} in {config}" in stderr, stderr
    again = _serve(tmp_path, port, credentials=False)  # a restart keeps them
    try:
        _up(port, again)
        assert credentials_for(host, username=None, password=None, docker_config=config) == found
    finally:
        _stop(again)


@pytest.mark.parametrize(("host", "reason"), [
    ("0.0.0.0", "means every interface"),
    ("::", "means every interface"),
    ("192.0.2.7", "is not an IPv4 loopback address"),
    ("127.0.0.1", "is the registry's own host: Ollama follows a redirect to the registry's host name"),
])
def test_a_blob_host_that_exposes_the_blobs_or_breaks_ollama_pulls_is_refused(
        tmp_path: Path, host: str, reason: str) -> None:
    port = free_port()
    proc = _serve(tmp_path, port, "--blob-host", host)
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        _stop(proc)
    assert proc.returncode == 1 and reason in stderr, stderr
    assert "--blob-host 127.0.0.2" in stderr and "Traceback" not in stderr and "registry on" not in stderr, stderr
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2)


# ---------------------------------------------------------------- docker-registry dies with its parent


def test_a_killed_serve_takes_its_docker_registry_along_and_restarts_on_the_same_port(tmp_path: Path) -> None:
    port = free_port()
    proc = _serve(tmp_path, port)
    try:
        _up(port, proc)
        kids = _children(proc.pid)
        assert kids
        proc.kill()  # SIGKILL: no handler runs
        proc.wait(timeout=20)
        for _ in range(100):
            if not any(_alive(kid) for kid in kids):
                break
            time.sleep(0.2)
        assert not [kid for kid in kids if _alive(kid)], "docker-registry outlived `registry serve`"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2)
    finally:
        _stop(proc)
    again = _serve(tmp_path, port)
    try:
        _up(port, again)
    finally:
        _stop(again)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_sighup_and_sigint_stop_serve_and_its_docker_registry(served, sig: signal.Signals) -> None:
    _, proc = served
    kids = _children(proc.pid)
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == 0
    for _ in range(100):
        if not any(_alive(kid) for kid in kids):
            break
        time.sleep(0.2)
    assert kids and not [kid for kid in kids if _alive(kid)]


# ---------------------------------------------------------------- whom a failed pull names


def test_a_pull_whose_blob_server_is_down_names_the_blob_server_not_the_registry(tmp_path: Path) -> None:
    from ociregistry import start_registry

    reg = start_registry(tmp_path / "registry", redirect=True)
    try:
        assert reg.static is not None
        blob = Blob.of_bytes("application/vnd.ollama.image.model", os.urandom(3000))
        with OciClient(RegistryRef.parse(f"{reg.host}/modelmint", insecure=True)) as client:
            client.push_blob("modelmint/tiny", blob)
            blob_host = reg.static.host
            reg.static.stop()
            reg.static = None
            with pytest.raises(OciUnavailable) as down:
                client.read_blob("modelmint/tiny", blob.digest)
    finally:
        reg.stop()
    assert f"redirected GET /v2/modelmint/tiny/blobs/{blob.digest} to {blob_host}" in down.value.message, down.value
    assert f"{reg.host} cannot be reached" not in down.value.message
    assert blob_host in (down.value.hint or "")
