"""The webhook receiver's limits: deeply nested JSON is a 400 naming it, a large body is refused as it streams, and
stalled or vanishing clients are closed quietly without holding the receiver's file descriptors."""

from __future__ import annotations

import os
import resource
import selectors
import socket
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


HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 2, 3
OPEN_FILES = 1024  # the common default soft limit
SERVE_OPTIONS = ["--header-timeout", str(HEADER_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S)]


def _common_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.fixture
def limited_receiver(settings: Settings, tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    """The real receiver (`modelmint webhook serve`) under a 1,024 open-file limit with short timeouts; its log is
    a file the test reads after stopping it."""
    from registry_env import free_port

    port, log = free_port(), tmp_path / "receiver.log"
    env = {**os.environ, "MODELMINT_HOME": str(settings.home), "MODELMINT_REPO": str(settings.repo_dir),
           "MODELMINT_CATALOG": str(settings.catalog_path), "MODELMINT_WEBHOOK_SECRET": "s3cret",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "webhook", "serve", "--port", str(port),
                                 *SERVE_OPTIONS], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=_common_file_limit)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
        yield port, proc, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _stalled(port: int, request: bytes) -> socket.socket:
    """A client that sends `request` and then nothing more."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(request)
    conn.setblocking(False)
    return conn


_HEAD = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Webhook-Secret: s3cret\r\nContent-Type: application/json\r\n"
PARTIAL_HEADERS = _HEAD  # the blank line that ends the headers never comes
HEADERS_ONLY = _HEAD + b"Content-Length: 4096\r\n\r\n"
PARTIAL_BODY = HEADERS_ONLY + b'{"event": ' + b" " * 1000


def _closed_by_the_receiver(conns: list[socket.socket], within_s: float) -> tuple[list[bytes], int]:
    """What the receiver sent each connection before closing it, and how many it left open after `within_s`."""
    answers = {c: b"" for c in conns}
    with selectors.DefaultSelector() as sel:
        for c in conns:
            sel.register(c, selectors.EVENT_READ)
        deadline = time.monotonic() + within_s
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(timeout=min(left, 1.0)):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    data = conn.recv(65536)
                except ConnectionResetError:
                    data = b""
                if data:
                    answers[conn] += data
                else:
                    sel.unregister(conn)
        still_open = len(sel.get_map())
    for c in conns:
        c.close()
    return list(answers.values()), still_open


def _log_after_stopping(proc: subprocess.Popen[bytes], log: Path) -> str:
    proc.terminate()
    proc.wait(timeout=30)
    return log.read_text(errors="replace")


def test_stalled_clients_are_closed_and_a_delivery_still_gets_its_answer(
        limited_receiver: tuple[int, subprocess.Popen[bytes], Path]) -> None:
    port, proc, log = limited_receiver
    # more stalled connections than the receiver may open files: headers cut short, headers but no body, half a body
    stalled = [_stalled(port, PARTIAL_HEADERS) for _ in range(550)] + \
              [_stalled(port, HEADERS_ONLY) for _ in range(550)] + [_stalled(port, PARTIAL_BODY) for _ in range(200)]
    try:
        answer = httpx.post(f"http://127.0.0.1:{port}/", content=_event("acme/tiny", PIN), headers=OK,
                            timeout=BODY_TIMEOUT_S + 10)
        assert answer.status_code == 202 and "ignored" in answer.json(), answer.text
        _answers, still_open = _closed_by_the_receiver(stalled, within_s=BODY_TIMEOUT_S + 10)
        assert still_open == 0, f"{still_open} of {len(stalled)} stalled connections still open"
    finally:
        for c in stalled:
            c.close()
    text = _log_after_stopping(proc, log)
    print(f"receiver log: {len(text.splitlines())} lines, {len(text)} bytes\n{text}")
    assert "Traceback" not in text and len(text.splitlines()) < 20 and len(text) < 4096, text[:4096]
    assert "could not accept" not in text, "the connection limit let the receiver run out of descriptors"


def test_stalled_clients_under_the_limit_are_closed_by_the_timeouts(
        limited_receiver: tuple[int, subprocess.Popen[bytes], Path]) -> None:
    port, proc, log = limited_receiver
    heads = [_stalled(port, PARTIAL_HEADERS) for _ in range(100)]
    bodies = [_stalled(port, HEADERS_ONLY) for _ in range(50)] + [_stalled(port, PARTIAL_BODY) for _ in range(50)]
    try:
        _, heads_open = _closed_by_the_receiver(heads, within_s=HEADER_TIMEOUT_S + 10)
        answers, bodies_open = _closed_by_the_receiver(bodies, within_s=BODY_TIMEOUT_S + 10)
    finally:
        for c in heads + bodies:
            c.close()
    assert heads_open == 0 and bodies_open == 0, (heads_open, bodies_open)
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), {a[:40] for a in answers}
    text = _log_after_stopping(proc, log)
    assert "Traceback" not in text and len(text.splitlines()) < 20, text[:4096]


def test_a_client_gone_mid_body_leaves_no_traceback(
        limited_receiver: tuple[int, subprocess.Popen[bytes], Path]) -> None:
    port, proc, log = limited_receiver
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(PARTIAL_BODY)
    answer = httpx.post(f"http://127.0.0.1:{port}/", content=_event("acme/tiny", PIN), headers=OK, timeout=30)
    assert answer.status_code == 202, answer.text
    text = _log_after_stopping(proc, log)
    assert "Traceback" not in text and len(text.splitlines()) <= 2, text[:4096]
