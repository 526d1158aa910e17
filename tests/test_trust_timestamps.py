"""RFC 3161 timestamps over signatures: a real Time-Stamp Authority (`openssl ts -reply` over HTTP on 127.0.0.1),
verified with `openssl ts -verify` against the roots a trust policy names."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tsa_server import serve_tsa

from pipelines.core import timestamps
from pipelines.core.errors import TimestampInvalid, TimestampUnavailable


def test_a_timestamp_over_the_bytes_by_a_trusted_authority_holds(tmp_path: Path) -> None:
    with serve_tsa(tmp_path / "tsa") as tsa:
        before = datetime.now(UTC).replace(microsecond=0)
        reply = timestamps.request(tsa.url, b"signature bytes")
    stamp = timestamps.check(reply, b"signature bytes", [("team-tsa", tsa.root)])
    assert stamp.authority == "team-tsa"
    assert before - timedelta(seconds=2) <= stamp.time <= datetime.now(UTC) + timedelta(seconds=2)
    assert timestamps.time_of(reply) == stamp.time


def test_a_timestamp_over_other_bytes_is_refused(tmp_path: Path) -> None:
    with serve_tsa(tmp_path / "tsa") as tsa:
        reply = timestamps.request(tsa.url, b"signature bytes")
    with pytest.raises(TimestampInvalid, match="over other bytes"):
        timestamps.check(reply, b"other signature bytes", [("team-tsa", tsa.root)])


def test_a_timestamp_by_an_authority_the_policy_does_not_name_is_refused(tmp_path: Path) -> None:
    with serve_tsa(tmp_path / "tsa") as tsa, serve_tsa(tmp_path / "other", "someone's tsa") as other:
        reply = timestamps.request(other.url, b"signature bytes")
    with pytest.raises(TimestampInvalid, match="by no timestamp authority the trust policy accepts") as err:
        timestamps.check(reply, b"signature bytes", [("team-tsa", tsa.root)])
    assert "team-tsa:" in err.value.message
    with pytest.raises(TimestampInvalid, match="names no timestamp authority"):
        timestamps.check(reply, b"signature bytes", [])


def test_bytes_that_are_not_a_timestamp_reply_are_refused() -> None:
    with pytest.raises(TimestampInvalid, match="not a granted"):
        timestamps.check(b"\x30\x03\x02\x01\x00", b"x", [("team-tsa", Path("/nonexistent"))])


def test_an_authority_that_does_not_answer_with_a_timestamp_is_named_with_the_next_step(tmp_path: Path) -> None:
    class NotATsa(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotATsa)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with pytest.raises(TimestampUnavailable, match="answered text/html") as err:
            timestamps.request(url, b"signature bytes")
        assert "MODELMINT_TSA_URL" in (err.value.hint or "") and err.value.transient
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    with pytest.raises(TimestampUnavailable, match="cannot be reached"):
        timestamps.request(url, b"signature bytes", timeout=5)
