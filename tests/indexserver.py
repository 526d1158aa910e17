"""A small package index for tests: the simple repository API (PEP 691 JSON and PEP 503 HTML) and its files."""

from __future__ import annotations

import hashlib
import html
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

JSON_API = "application/vnd.pypi.simple.v1+json"


@dataclass
class IndexedFile:
    data: bytes
    listed_sha256: str | None = None
    """The hash the project page lists; None lists the file's real sha256. Set it to list other bytes' hash."""
    unlisted_hash: bool = False
    """List the file with no hash at all (indexes may)."""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class IndexServer:
    """Serves projects to modelmint's index client the way PyPI does: `GET /simple/<project>/` answers JSON when
    the Accept header asks for it (else HTML with `#sha256=` fragments), files come from `/files/<name>`."""

    projects: dict[str, dict[str, IndexedFile]] = field(default_factory=dict)
    fail_status: int | None = None
    """When set, every request answers this status, e.g. 503."""
    html_only: bool = False
    """Answer project pages in HTML even when JSON is asked for (an index without PEP 691)."""
    requests: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def add(self, project: str, filename: str, data: bytes, **kw: object) -> IndexedFile:
        f = IndexedFile(data, **kw)  # type: ignore[arg-type]
        self.projects.setdefault(project, {})[filename] = f
        return f

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple"

    def __enter__(self) -> IndexServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-index", daemon=True).start()
        self._server = server
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _handler(index: IndexServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            index.requests.append(path)
            if index.fail_status:
                return self._send(index.fail_status, b"unavailable")
            parts = [p for p in path.split("/") if p]
            if len(parts) == 2 and parts[0] == "simple":
                return self._project(parts[1])
            if len(parts) == 2 and parts[0] == "files":
                for files in index.projects.values():
                    if parts[1] in files:
                        return self._send(200, files[parts[1]].data, "application/octet-stream")
            return self._send(404, b"not found")

        def _project(self, name: str) -> None:
            files = index.projects.get(name)
            if files is None:
                return self._send(404, b"no such project")
            def listed(f: IndexedFile) -> str | None:
                return None if f.unlisted_hash else (f.listed_sha256 or f.sha256)

            if JSON_API in self.headers.get("Accept", "") and not index.html_only:
                body = {"meta": {"api-version": "1.1"}, "name": name, "files": [
                    {"filename": n, "url": f"../../files/{n}", "hashes": {"sha256": h} if (h := listed(f)) else {}}
                    for n, f in files.items()]}
                return self._send(200, json.dumps(body).encode(), JSON_API)
            links = "".join(
                f'<a href="/files/{html.escape(n)}{"#sha256=" + h if (h := listed(f)) else ""}">{html.escape(n)}</a>\n'
                for n, f in files.items())
            return self._send(200, f"<!DOCTYPE html><html><body>{links}</body></html>".encode(), "text/html")

    return Handler
