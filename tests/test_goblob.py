"""Ollama's blob download run by Go's own net/http (tests/goblob/) against real registries.

tests/ollama_pull.py emulates server/download.go in Python; what it cannot prove is what only Go's net/http
decides: which redirects a client with that CheckRedirect follows, which headers cross them, and what
Response.Location() answers. tests/goblob/main.go does the same sequence with net/http itself (standard library
only, built once per source hash into MODELMINT_HOME), and here it pulls every layer of an image that
`modelmint publish` pushed to `modelmint registry serve`, fails on plain filesystem storage with Go's own
ErrNoLocation, and refuses a blob changed in the registry's storage.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from ociregistry import RunningRegistry, start_registry
from registry_env import ROOT, Repo, candidate, free_port, isolate, make_repo

from pipelines.core.gobuild import GoProgram
from pipelines.core.runner import stop_process
from pipelines.core.settings import Settings
from pipelines.publish.localregistry import local_registry
from pipelines.publish.oci import Blob, Credentials, OciClient, RegistryRef
from pipelines.registry.register import register
from pipelines.store.manifest import Manifest

GOBLOB = GoProgram("goblob", ROOT / "tests" / "goblob", "the tests' Ollama blob client")
MODELMINT = [sys.executable, "-m", "pipelines.cli"]
MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"
PART = 64 * 1024
"""Ollama's parts are 100 MB at least (download.go:101); small ones here, so the GGUF takes several Range GETs."""
TOKEN = "registry-token"


@dataclass
class Served:
    repo: Repo
    settings: Settings
    gguf: Manifest
    port: int
    storage: Path
    plain: RunningRegistry
    goblob: Path

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MODELMINT, *args], env=self.repo.env(), capture_output=True, text=True,
                              cwd=self.repo.root, timeout=300)

    def blob_data(self, digest: str) -> Path:
        hexd = digest.removeprefix("sha256:")
        return self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


def _serve(repo: Repo, port: int, directory: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*MODELMINT, "registry", "serve", "--port", str(port), "--dir", str(directory)],
                            env=repo.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"`modelmint registry serve` exited {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    stop_process(proc)
    raise AssertionError("`modelmint registry serve` did not answer within 60 s")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """tiny-qwen2:q4_k_m registered, `modelmint registry serve` running, and the image published to it with
    `modelmint publish`; the same image on a distribution registry with plain filesystem storage."""
    base = tmp_path_factory.mktemp("goblob")
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        repo = make_repo(base, models={"tiny-qwen2": ["q4_k_m"]})
        settings = repo.settings()
        gguf = register(settings, candidate(settings, base / "build")).manifest
        repo.commit_all("register tiny-qwen2:q4_k_m")
        goblob = GOBLOB.binary(settings)  # built once per source hash (toolchains/ is shared with the real home)
        port = free_port()
        proc = _serve(repo, port, base / "serve")
        plain = start_registry(base / "plain")
        try:
            s = Served(repo, settings, gguf, port, base / "serve" / "storage", plain, goblob)
            for host in (s.host, plain.host):
                done = s.cli("publish", gguf.ref, "--registry", f"{host}/modelmint", "--insecure")
                assert done.returncode == 0, done.stderr
                # publish itself warns where Ollama cannot pull, and only there
                assert ("ollama/ollama#7244" in done.stderr) is (host == plain.host), done.stderr
            yield s
        finally:
            plain.stop()
            stop_process(proc)


def goblob(binary: Path, host: str, repository: str, digest: str, *args: str) -> tuple[int, dict[str, Any], str]:
    """One blob through the Go client: (exit status, its JSON line, stderr)."""
    done = subprocess.run([str(binary), "-insecure", *args, host, repository, digest], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr.strip()


def _image(host: str, repository: str, tag: str) -> dict[str, Any]:
    r = httpx.get(f"http://{host}/v2/{repository}/manifests/{tag}", headers={"Accept": MANIFEST_ACCEPT})
    r.raise_for_status()
    return dict(r.json())


def test_every_layer_of_the_published_image_downloads_and_verifies_through_go(served: Served, tmp_path: Path) -> None:
    image = _image(served.host, "modelmint/tiny-qwen2", "q4_k_m")
    blobs = [*image["layers"], image["config"]]
    assert f"sha256:{served.gguf.sha256}" in {b["digest"] for b in blobs}
    for blob in blobs:
        digest, size = blob["digest"], blob["size"]
        models = tmp_path / digest[7:19]
        rc, got, err = goblob(served.goblob, served.host, "modelmint/tiny-qwen2", digest, "-token", TOKEN,
                              "-min-part-size", str(PART), "-models", str(models))
        assert rc == 0, (blob["mediaType"], err)
        assert got["ok"] and got["sha256_verified"] and got["size"] == size and got["status"] == 307, got
        blob_host = got["location_host"]
        assert blob_host.startswith("127.0.0.2:") and got["location"].endswith(f"/{digest[7:]}/data"), got
        assert [(p["offset"], p["size"]) for p in got["parts"]] == [
            (o, min(PART, size - o)) for o in range(0, size, PART)]
        # net/http's own hops: HEAD follows the 307 anywhere (no CheckRedirect), the GET keeps the 307 to the
        # other host, the Range GETs go to its Location; Go dropped the token crossing to the other host
        hops = [(h["method"], h["host"], h["status"]) for h in got["requests"]]
        assert hops[:3] == [("HEAD", served.host, 307), ("HEAD", blob_host, 200), ("GET", served.host, 307)], hops
        chunks = got["requests"][3:]
        assert sorted(h["range"] for h in chunks) == sorted(
            f"bytes={o}-{min(o + PART, size) - 1}" for o in range(0, size, PART))
        assert all((h["method"], h["host"], h["status"]) == ("GET", blob_host, 206) for h in chunks), chunks
        assert [h["authorization"] for h in got["requests"]] == [h["host"] == served.host for h in got["requests"]]
        pulled = models / "blobs" / digest.replace(":", "-")
        assert "sha256:" + hashlib.sha256(pulled.read_bytes()).hexdigest() == digest
    gguf = served.settings.repo_dir / served.gguf.dvc.path / served.gguf.file
    pulled_gguf = tmp_path / served.gguf.sha256[:12] / "blobs" / f"sha256-{served.gguf.sha256}"
    assert pulled_gguf.read_bytes() == gguf.read_bytes()


def test_plain_filesystem_storage_fails_with_gos_own_no_location_error(served: Served) -> None:
    """distribution on filesystem storage answers the blob GET 200 with the bytes: the status passes
    (download.go:267), and net/http's Response.Location() is http.ErrNoLocation (ollama/ollama#7244)."""
    digest = f"sha256:{served.gguf.sha256}"
    rc, got, err = goblob(served.goblob, served.plain.host, "modelmint/tiny-qwen2", digest)
    assert rc == 1 and err == "http: no Location header in response", err
    assert (got["stage"], got["error"], got["status"], got["sha256_verified"]) == (
        "direct", "http: no Location header in response", 200, False)
    assert [(h["method"], h["host"], h["status"], h.get("location"))
            for h in got["requests"]] == [("HEAD", served.plain.host, 200, None), ("GET", served.plain.host, 200, None)]


def test_a_blob_server_on_the_registrys_own_host_name_is_followed_and_fails_the_same(
        served: Served, tmp_path: Path) -> None:
    """CheckRedirect (download.go:247-250) compares host names, not ports: a file server on 127.0.0.1 gets the
    GET itself and answers the bytes, so net/http again finds no Location."""
    data = os.urandom(3000)
    blob = Blob.of_bytes("application/vnd.ollama.image.model", data)
    pusher = Credentials("ci", "a-push-secret")
    with local_registry(tmp_path / "samehost", free_port(), blob_host="127.0.0.1", credentials=pusher) as reg:
        with OciClient(RegistryRef.parse(f"{reg.host}/modelmint", insecure=True), credentials=pusher) as client:
            client.push_blob("modelmint/m", blob)
        rc, got, err = goblob(served.goblob, reg.host, "modelmint/m", blob.digest)
    assert rc == 1 and err == "http: no Location header in response", err
    hops = [(h["method"], h["host"], h["status"]) for h in got["requests"]]
    assert hops[-2:] == [("GET", reg.host, 307), ("GET", reg.blobs.host, 200)], hops


def test_a_blob_changed_in_the_registrys_storage_fails_sha256_verification(served: Served, tmp_path: Path) -> None:
    digest = f"sha256:{served.gguf.sha256}"
    data = served.blob_data(digest)
    original = data.read_bytes()
    changed = bytearray(original)
    changed[len(changed) // 2] ^= 0xFF  # same size: the HEAD, the redirect and every Range GET still succeed
    data.write_bytes(bytes(changed))
    try:
        rc, got, err = goblob(served.goblob, served.host, "modelmint/tiny-qwen2", digest,
                              "-min-part-size", str(PART), "-models", str(tmp_path))
    finally:
        data.write_bytes(original)
    bad = "sha256:" + hashlib.sha256(changed).hexdigest()
    assert rc == 1 and got["stage"] == "verify" and not got["sha256_verified"], got
    assert err == f"digest mismatch, file must be downloaded again: want {digest}, got {bad}"
    assert not (tmp_path / "blobs" / digest.replace(":", "-")).exists()  # removed, as images.go:1060-1071 does
