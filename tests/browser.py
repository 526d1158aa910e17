"""Debian's chromium, headless, driven over the Chrome DevTools protocol on --remote-debugging-pipe.

The pipe needs no port (nothing listens, not even on 127.0.0.1), no driver binary matched to the browser's version
and no Python package: chromium reads commands on fd 3 and writes replies and events on fd 4, one JSON object per
message, each ended by a NUL byte (https://chromedevtools.github.io/devtools-protocol/, and chromium's
content/browser/devtools/devtools_pipe_handler.cc). The page's console, its exceptions and every request it makes
arrive as events, so a test sees all three without a proxy.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"


class BrowserError(RuntimeError):
    pass


@dataclass
class Loaded:
    """One page as the browser saw it."""

    url: str
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dom: Any = None
    screenshot: Path | None = None


class Chromium:
    """One headless chromium with its own profile in `work`; use as a context manager."""

    def __init__(self, work: Path, *, binary: str = CHROMIUM) -> None:
        self.work = work
        self.binary = shutil.which(binary) or binary
        self.pid = 0
        self._next = 0
        self._buf = b""
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        self.work.mkdir(parents=True, exist_ok=True)
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        log = os.open(self.work / "chromium.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        argv = [
            self.binary,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            f"--user-data-dir={self.work / 'profile'}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--mute-audio",
            "--hide-scrollbars",
            # nothing resolves: a page that tried to reach the network would fail, and the test still sees it try
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "about:blank",
        ]
        actions = [
            (os.POSIX_SPAWN_DUP2, to_child_r, 3),
            (os.POSIX_SPAWN_DUP2, from_child_w, 4),
            (os.POSIX_SPAWN_DUP2, log, 1),
            (os.POSIX_SPAWN_DUP2, log, 2),
        ]
        self.pid = os.posix_spawn(self.binary, argv, os.environ, file_actions=actions)
        for fd in (to_child_r, from_child_w, log):
            os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close", timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        for fd in (self._to_child, self._from_child):
            os.close(fd)

    # ------------------------------------------------------------ the protocol

    def _send(self, method: str, params: dict[str, Any] | None, session: str | None) -> int:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        return self._next

    def _read(self, timeout: float) -> dict[str, Any] | None:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._from_child], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium closed the pipe (log: {self.work / 'chromium.log'})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)  # type: ignore[no-any-return]

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = 30,
    ) -> dict[str, Any]:
        sent = self._send(method, params, session)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            msg = self._read(left)
            if msg is None:
                break
            if msg.get("id") == sent:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result") or {}
            if "method" in msg:
                self._events.append(msg)
        raise BrowserError(f"{method}: no answer in {timeout} s")

    def _wait_event(self, method: str, session: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if any(e["method"] == method and e.get("sessionId") == session for e in self._events):
                return
            left = deadline - time.monotonic()
            msg = self._read(max(left, 0)) if left > 0 else None
            if msg is None:
                raise BrowserError(f"no {method} in {timeout} s")
            if "method" in msg:
                self._events.append(msg)

    # ------------------------------------------------------------ a page

    def load(
        self,
        url: str,
        *,
        probe: str,
        screenshot: Path | None = None,
        width: int = 1280,
        height: int | None = None,
    ) -> Loaded:
        """Open `url` in a new tab, wait for its load event, evaluate `probe` (a JS expression whose value comes
        back as JSON), take a screenshot (the whole page, or its top `height` pixels), and report its console
        errors and requests."""
        self._events = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        self.call("Page.navigate", {"url": url}, session=session)
        self._wait_event("Page.loadEventFired", session, 30)
        loaded = Loaded(url)
        result = self.call("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session=session)
        if "exceptionDetails" in result:
            raise BrowserError(f"the probe failed on {url}: {result['exceptionDetails']}")
        loaded.dom = result["result"].get("value")
        if screenshot is not None:
            size = self.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
            tall = min(size["height"], 16000 if height is None else height)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": int(tall), "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            shot = self.call(
                "Page.captureScreenshot",
                {
                    "format": "png",
                    "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": width, "height": int(tall), "scale": 1},
                },
                session=session,
            )
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            loaded.screenshot = screenshot
        for e in self._events:
            if e.get("sessionId") != session:
                continue
            p = e.get("params") or {}
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                loaded.console_errors.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                )
            elif e["method"] == "Runtime.exceptionThrown":
                loaded.console_errors.append(str(p.get("exceptionDetails", {}).get("text")))
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                loaded.console_errors.append(str(p["entry"].get("text")))
            elif e["method"] == "Network.requestWillBeSent":
                loaded.requests.append(str(p["request"]["url"]))
        self.call("Target.closeTarget", {"targetId": target})
        return loaded
