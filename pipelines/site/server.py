"""The registry site served over HTTP: a built site folder on this machine's loopback address, for a quick look."""

from __future__ import annotations

from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pipelines.core.errors import ConfigError


def site_server(directory: Path, *, port: int = 8000, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """An HTTP server for a built site on `host` (this machine only, by default); the caller runs serve_forever.

    Raises:
        ConfigError: `directory` holds no built site, or the port cannot be bound.
    """
    import functools
    from http import HTTPStatus
    from http.server import SimpleHTTPRequestHandler

    if not (directory / "index.html").is_file():
        raise ConfigError(
            f"{directory} holds no registry site (no index.html)",
            hint=f"build it first: modelmint site build --out {directory}",
        )

    class _Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request on stderr is noise for a quick look

        def send_head(self) -> Any:
            try:
                return super().send_head()
            except ValueError:  # a path no file can have (a NUL byte): open() raises ValueError, not OSError
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None

    try:
        return ThreadingHTTPServer((host, port), functools.partial(_Quiet, directory=str(directory)))
    except OSError as err:
        free = _free_port(host)
        raise ConfigError(
            f"cannot serve on {host}:{port}: {err.strerror}",
            hint=(
                f"give another --port, e.g. --port {free} (free now), " if free else "give another --port, "
            )
            + "or --port 0 to take any free one (the line it prints names it)",
        ) from err


def _free_port(host: str) -> int | None:
    """A port on `host` nothing listens on at this moment (the system's pick); None when none can be had."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    except OSError:
        return None
