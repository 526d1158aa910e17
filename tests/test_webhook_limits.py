"""The webhook receiver's limits: deeply nested JSON is a 400 naming it, and a large body is refused as it streams."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient
from test_watch import CATALOG, _event

from flows.webhook import MAX_BODY, create_app
from pipelines.core.settings import Settings

OK = {"X-Webhook-Secret": "s3cret"}
PIN = "ab" * 20


def _refuse(name: str, commit: str) -> None:
    raise AssertionError(f"nothing the receiver refuses may start a conversion ({name}@{commit})")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    catalog = tmp_path / "registry" / "catalog.yaml"
    catalog.parent.mkdir(parents=True)
    catalog.write_text(CATALOG.format(pin=PIN, fixed="cd" * 20))
    return Settings(home=tmp_path / "home", work_dir=tmp_path / "work", catalog_path=catalog, repo_dir=tmp_path)


def test_deeply_nested_json_is_a_400_naming_it(settings: Settings) -> None:
    client = TestClient(create_app(settings, "s3cret", dispatch=_refuse), raise_server_exceptions=False)
    for body in (b"[" * 200_000, b'{"repo": ' * 100_000, b'{"repo": {"name": "acme/tiny", "x": ' + b"[" * 100_000):
        answer = client.post("/", content=body, headers=OK)
        assert answer.status_code == 400, answer.text
        assert "nested too deeply" in answer.json()["error"]


def test_a_body_over_the_limit_is_refused_chunked_or_declared(settings: Settings) -> None:
    client = TestClient(create_app(settings, "s3cret", dispatch=_refuse), raise_server_exceptions=False)
    big = _event("acme/tiny", "a" * 40) + b" " * MAX_BODY
    assert client.post("/", content=big, headers=OK).status_code == 413
    assert client.post("/", content=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]),
                       headers=OK).status_code == 413
    assert client.post("/", content=_event("acme/tiny", PIN), headers=OK).status_code == 202  # the limit's other side


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def receiver(settings: Settings) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    from registry_env import free_port

    port = free_port()
    env = {**os.environ, "MODELMINT_HOME": str(settings.home), "MODELMINT_REPO": str(settings.repo_dir),
           "MODELMINT_CATALOG": str(settings.catalog_path), "MODELMINT_WEBHOOK_SECRET": "s3cret"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "modelmint"), "webhook", "serve", "--port", str(port)],
                            env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the receiver did not start"
                time.sleep(0.3)
        yield url, proc
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_400_mib_body_does_not_grow_the_receiver(receiver: tuple[str, subprocess.Popen[str]]) -> None:
    url, proc = receiver
    before = _rss_kib(proc.pid)
    chunk = b" " * (1 << 20)

    def body() -> Iterator[bytes]:
        for _ in range(400):
            yield chunk

    try:  # the receiver answers 413 and may close the connection before the client has sent it all
        answer = httpx.post(url, content=body(), headers=OK, timeout=60)
        assert answer.status_code == 413
    except httpx.TransportError:
        pass
    after = _rss_kib(proc.pid)
    print(f"receiver RSS before {before} KiB, after a 400 MiB body {after} KiB")
    assert after - before < 32 * 1024, (before, after)


def test_a_hung_prefect_api_is_a_503_within_the_timeout(settings: Settings) -> None:
    import socket
    import threading

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import webhook

    hung = socket.socket()  # accepts every connection and never answers: a hung Prefect API
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        hung.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(hung.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{hung.getsockname()[1]}/api"}):
            client = TestClient(create_app(settings, "s3cret"), raise_server_exceptions=False)
            start = time.monotonic()
            answer = client.post("/", content=_event("acme/tiny", "3" * 40, old=PIN),
                                 headers=OK)
            took = time.monotonic() - start
        print(f"hung Prefect API: {answer.status_code} after {took:.1f} s")
        assert answer.status_code == 503 and "did not answer" in answer.json()["error"], answer.text
        assert took < webhook.DISPATCH_TIMEOUT_S + 5
        assert held, "the receiver never reached the hung API"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        hung.close()
