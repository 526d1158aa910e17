"""RFC 3161 trusted timestamps: a Time-Stamp Authority's signed word that some bytes existed at a time."""

from __future__ import annotations

import hashlib
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from pipelines.core.errors import TimestampInvalid, TimestampUnavailable
from pipelines.core.runner import run

QUERY_TYPE: Final = "application/timestamp-query"
REPLY_TYPE: Final = "application/timestamp-reply"
_MAX_REPLY: Final = 1 << 20
"""A TimeStampResp is a few kilobytes; a larger answer is not one."""


@dataclass(frozen=True)
class Stamp:
    """A timestamp that held: when the authority saw the bytes, and which authority of the policy it chains to."""

    time: datetime
    authority: str


def request(url: str, data: bytes, *, timeout: float = 30) -> bytes:
    """A timestamp over sha256(`data`) from the Time-Stamp Authority at `url` (RFC 3161 over HTTP): the DER
    TimeStampResp, checked to be granted, over these bytes and answering this request (its nonce).

    Raises:
        TimestampUnavailable: the authority cannot be reached, answers with an HTTP error or something that is not a
            timestamp reply, refuses, or answers for other bytes or another request.
    """
    with tempfile.TemporaryDirectory(prefix="modelmint-tsa-") as scratch:
        d, q = Path(scratch) / "data", Path(scratch) / "query.tsq"
        d.write_bytes(data)
        run(["openssl", "ts", "-query", "-data", d, "-sha256", "-cert", "-out", q])
        query = q.read_bytes()
        req = urllib.request.Request(url, data=query, method="POST", headers={"Content-Type": QUERY_TYPE})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                kind = resp.headers.get_content_type()
                reply: bytes = resp.read(_MAX_REPLY + 1)
        except urllib.error.HTTPError as err:
            raise TimestampUnavailable.of(url, f"answered HTTP {err.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise TimestampUnavailable.of(url, f"cannot be reached ({getattr(err, 'reason', None) or err})") from None
        if kind != REPLY_TYPE or len(reply) > _MAX_REPLY:
            raise TimestampUnavailable.of(url, f"answered {kind}, not {REPLY_TYPE}")
        r = Path(scratch) / "reply.tsr"
        r.write_bytes(reply)
        text = _text(r)
        if text is None or not re.search(r"^Status: Granted", text, re.M):
            status = re.search(r"^Status: (.*)$", text or "", re.M)
            raise TimestampUnavailable.of(
                url, f"did not grant a timestamp ({status.group(1).strip() if status else 'not a timestamp reply'})")
        asked = run(["openssl", "ts", "-query", "-in", q, "-text"], check=False).stdout
        if _imprint(text) != hashlib.sha256(data).hexdigest() or _nonce(text) != _nonce(asked):
            raise TimestampUnavailable.of(url, "answered with a timestamp over other bytes or for another request")
    return reply


def check(reply: bytes, data: bytes, roots: Sequence[tuple[str, Path]]) -> Stamp:
    """The timestamp in `reply` (a DER TimeStampResp) is over sha256(`data`) and signed by an authority whose
    certificate chains to one of `roots` (name, PEM root certificates) and was valid at the time it states.

    Raises:
        TimestampInvalid: it is not a granted timestamp reply, it is over other bytes, or no root verifies it
            (each root's reason).
    """
    if not roots:
        raise TimestampInvalid("the trust policy names no timestamp authority (timestamp_authorities)")
    with tempfile.TemporaryDirectory(prefix="modelmint-tsa-") as scratch:
        d, r = Path(scratch) / "data", Path(scratch) / "reply.tsr"
        d.write_bytes(data)
        r.write_bytes(reply)
        text = _text(r)
        if text is None or not re.search(r"^Status: Granted", text, re.M):
            raise TimestampInvalid("it is not a granted RFC 3161 timestamp reply")
        when = _time(text)
        if when is None:
            raise TimestampInvalid("its time cannot be read")
        if _imprint(text) != hashlib.sha256(data).hexdigest():
            raise TimestampInvalid("it is over other bytes than the signature (its message imprint differs)")
        tried = []
        for name, root in roots:
            # the chain is checked at the time the authority states, so an authority's certificate that has
            # expired since still vouches for what it stamped while valid
            done = run(["openssl", "ts", "-verify", "-data", d, "-in", r, "-CAfile", root,
                        "-attime", str(int(when.timestamp()))], check=False)
            if done.returncode == 0:
                return Stamp(when, name)
            tried.append(f"{name}: {_reason(done.stderr)}")
    raise TimestampInvalid(
        f"it is by no timestamp authority the trust policy accepts (timestamp_authorities: {'; '.join(tried)})"
    )


def time_of(reply: bytes) -> datetime | None:
    """The time a timestamp reply states, unverified (for messages about a timestamp that did not hold)."""
    with tempfile.TemporaryDirectory(prefix="modelmint-tsa-") as scratch:
        r = Path(scratch) / "reply.tsr"
        r.write_bytes(reply)
        text = _text(r)
    return _time(text) if text else None


def _text(reply: Path) -> str | None:
    done = run(["openssl", "ts", "-reply", "-in", reply, "-text"], check=False)
    return done.stdout if done.returncode == 0 else None


_MONTHS: Final = {
    m: i + 1 for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))
}


def _time(text: str) -> datetime | None:
    """`Time stamp: Dec  6 19:35:12.5 2026 GMT` (openssl's print of genTime)."""
    m = re.search(r"^Time stamp: (\w{3}) +(\d+) (\d\d):(\d\d):(\d\d)(?:\.\d+)? (\d{4}) GMT", text, re.M)
    if m is None or m.group(1) not in _MONTHS:
        return None
    mon, day, hh, mm, ss, year = _MONTHS[m.group(1)], *map(int, m.groups()[1:])
    return datetime(year, mon, day, hh, mm, ss, tzinfo=UTC)


def _imprint(text: str) -> str | None:
    """The hex of the message imprint (`Message data:` then `0000 - 2c 26 b4-…` lines)."""
    m = re.search(r"^Message data:\n((?:\s+[0-9a-f]{4} - .*\n?)+)", text, re.M)
    if m is None:
        return None
    return "".join(
        re.sub(r"[^0-9a-f]", "", line.split(" - ", 1)[1][:48]) for line in m.group(1).splitlines() if " - " in line
    )


def _nonce(text: str) -> str | None:
    m = re.search(r"^Nonce: (.*)$", text, re.M)
    return m.group(1).strip() if m else None


def _reason(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    found = next((line for line in lines if "error" in line.lower() and ":" in line), lines[-1] if lines else "")
    return found.rsplit(":", 1)[-1].strip()[:160] or "not verified"
