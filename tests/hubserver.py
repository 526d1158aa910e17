"""A small Hugging Face Hub-compatible HTTP server (API, resolve, and a separate LFS "CDN") for tests."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

# What the Hub's default .gitattributes sends to LFS (the subset that matters for model repos).
LFS_SUFFIXES = frozenset(
    {
        ".safetensors",
        ".bin",
        ".pt",
        ".pth",
        ".ckpt",
        ".gguf",
        ".h5",
        ".msgpack",
        ".onnx",
        ".model",
        ".tiktoken",
    }
)
_LFS_THRESHOLD = 10 * 1024 * 1024


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass
class FakeRepo:
    """One commit of a model repo: its files, and (on the newest commit object) the repo's branches and history.

    `HubServer.add_repo` makes a repo of one commit, reachable by that commit or the branch `main`;
    `HubServer.push` adds a commit on a branch (older commits stay reachable by their sha, as on the hub).
    """

    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    lie_about: frozenset[str] = frozenset()
    """LFS paths whose advertised sha256 (model_info, tree, X-Linked-Etag) is not the served bytes' sha256."""
    commit: str = ""
    parent: str | None = None
    refs: dict[str, str] = field(default_factory=dict)
    """Branch and tag names → commit (default: `main` → this commit)."""
    older: dict[str, FakeRepo] = field(default_factory=dict)
    """Every earlier commit of the repo, by sha."""

    def __post_init__(self) -> None:
        if not self.commit:
            h = hashlib.sha1(self.repo_id.encode() + (self.parent or "").encode())
            for path in sorted(self.files):
                h.update(path.encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
            self.commit = h.hexdigest()
        self.refs = self.refs or {"main": self.commit}

    def resolve(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        return revision if revision == self.commit or revision in self.older else None

    def at(self, commit: str) -> FakeRepo:
        """The repo as it was at `commit` (a commit `resolve` answered)."""
        return self if commit == self.commit else self.older[commit]

    def history(self, commit: str) -> list[str]:
        """The commits reachable from `commit`, newest first (first parents only: the fake hub never merges)."""
        out: list[str] = []
        at: str | None = commit
        while at is not None:
            out.append(at)
            at = self.at(at).parent
        return out

    def is_lfs(self, path: str) -> bool:
        return Path(path).suffix in LFS_SUFFIXES or len(self.files[path]) > _LFS_THRESHOLD

    def advertised_sha256(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256((b"not-these-bytes" if path in self.lie_about else b"") + data).hexdigest()

    def blob_id(self, path: str) -> str:
        data = self.files[path]
        if self.is_lfs(path):
            return git_blob_sha1(_lfs_pointer(self.advertised_sha256(path), len(data)))
        return git_blob_sha1(data)

    def lfs_info(self, path: str, sha_key: str) -> dict[str, object] | None:
        if not self.is_lfs(path):
            return None
        pointer = _lfs_pointer(self.advertised_sha256(path), len(self.files[path]))
        return {
            sha_key: self.advertised_sha256(path),
            "size": len(self.files[path]),
            "pointerSize": len(pointer),
        }

    def config(self) -> dict[str, object]:
        """The slice of config.json the Hub puts in model_info (it includes auto_map)."""
        try:
            cfg = json.loads(self.files.get("config.json", b"{}"))
        except ValueError:
            return {}
        return {k: cfg[k] for k in ("architectures", "model_type", "auto_map") if k in cfg}


@dataclass(frozen=True)
class RecordedRequest:
    server: str
    """'hub' or 'cdn'."""
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-cased names."""


@dataclass
class HubServer:
    """Serves FakeRepos to the real huggingface_hub client, which is pointed at it with `endpoint=`.

    Implements what huggingface_hub 2.4.0 calls for a pinned download:
    `GET /api/models/{repo}/revision/{rev}` (model_info; `?blobs=true` adds sizes and LFS sha256),
    `GET /api/models/{repo}/tree/{rev}` (list_repo_tree, which snapshot_download uses),
    `GET /api/models/{repo}/commits/{rev}` (list_repo_commits: the history, newest first, one page), and
    `HEAD`/`GET /{repo}/resolve/{rev}/{path}`. Small files come from the hub with `ETag` = git blob sha1;
    LFS files answer `302` to a second server on another port (the "CDN": a different origin, so the
    client drops the Authorization header as it does for the real CDN) with `X-Linked-Etag` = sha256 and
    `X-Linked-Size`. Errors carry the `X-Error-Code` the client maps.
    """

    token: str | None = None
    """The one bearer token the hub accepts (any other Authorization is a 401); gated files need it."""
    fail_status: int | None = None
    """When set, every hub (not CDN) request answers this status, e.g. 503."""
    delay_s: float = 0.0
    """Every hub (not CDN) request waits this long before it is answered: a hub that is slow to respond."""
    stall_s: float = 0.0
    """The CDN sends the first half of a file, then waits this long before the rest: a download that stalls."""
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    _servers: list[ThreadingHTTPServer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------ setup

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes] | Path,
        *,
        gated: bool = False,
        lie_about: Iterable[str] = (),
    ) -> FakeRepo:
        """Publish a repo; `files` is {path: bytes} or a directory whose files (recursively) are read."""
        if isinstance(files, Path):
            files = {
                p.relative_to(files).as_posix(): p.read_bytes()
                for p in sorted(files.rglob("*"))
                if p.is_file()
            }
        repo = FakeRepo(repo_id, dict(files), gated=gated, lie_about=frozenset(lie_about))
        self.repos[repo_id] = repo
        return repo

    def push(self, repo_id: str, changes: Mapping[str, bytes | None], *, branch: str = "main") -> FakeRepo:
        """A new commit on `branch` of a published repo: `changes` maps paths to new bytes (None removes one).
        The branch moves to it; every older commit stays reachable by its sha."""
        old = self.repos[repo_id]
        parent = old.at(old.refs[branch])
        files = {**parent.files, **{p: b for p, b in changes.items() if b is not None}}
        files = {p: b for p, b in files.items() if changes.get(p, b"") is not None}
        new = FakeRepo(repo_id, files, gated=old.gated, lie_about=old.lie_about, parent=parent.commit,
                       refs=dict(old.refs), older={**old.older, old.commit: old})
        new.refs[branch] = new.commit
        self.repos[repo_id] = new
        return new

    def branch(self, repo_id: str, name: str, commit: str) -> None:
        """Create or move the branch (or tag) `name` of a published repo to `commit`."""
        self.repos[repo_id].refs[name] = commit

    def start(self) -> HubServer:
        for role in ("hub", "cdn"):
            server = _QuietServer(("127.0.0.1", 0), _handler(self, role))
            server.daemon_threads = True
            threading.Thread(
                target=server.serve_forever, args=(0.05,), name=f"fake-{role}", daemon=True
            ).start()
            self._servers.append(server)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return _url(self._servers[0])

    @property
    def cdn_endpoint(self) -> str:
        return _url(self._servers[1])

    # ------------------------------------------------------------ what happened

    def record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)

    def downloaded(self) -> list[str]:
        """Repo paths whose bytes were served (GET on resolve or on the CDN), in order."""
        return [p for r in self.requests if r.method == "GET" and (p := _repo_path(r)) is not None]

    def touched(self) -> list[str]:
        """Repo paths of every resolve or CDN request (HEAD included)."""
        return [p for r in self.requests if (p := _repo_path(r)) is not None]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]
        # else: the client gave up on a stalled or slow answer, as it should


def _repo_path(r: RecordedRequest) -> str | None:
    """The repo file of a resolve (/{owner}/{name}/resolve/{rev}/…) or CDN (/lfs/…/{commit}/…) request."""
    parts = r.path.split("/")
    if len(parts) > 5 and (parts[3] == "resolve" if r.server == "hub" else parts[1] == "lfs"):
        return "/".join(parts[5:])
    return None


def _url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def _handler(hub: HubServer, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # recorded in hub.requests instead

        def do_HEAD(self) -> None:
            self._dispatch(head=True)

        def do_GET(self) -> None:
            self._dispatch(head=False)

        # -------------------------------------------------------- plumbing

        def _dispatch(self, *, head: bool) -> None:
            split = urlsplit(self.path)
            hub.record(
                RecordedRequest(
                    server=role,
                    method=self.command,
                    path=unquote(split.path),
                    query=parse_qs(split.query),
                    headers={k.lower(): v for k, v in self.headers.items()},
                )
            )
            self._head = head
            parts = [unquote(p) for p in split.path.split("/")[1:]]
            if role == "cdn":
                return self._cdn(parts)
            if hub.delay_s:
                time.sleep(hub.delay_s)
            if hub.fail_status:
                return self._error(hub.fail_status, None, "the fake hub was told to fail")
            auth = self.headers.get("Authorization")
            if auth is not None and (hub.token is None or auth != f"Bearer {hub.token}"):
                # the real hub refuses a bad token on every route, public repos included
                return self._error(401, None, "Invalid credentials in Authorization header")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self._api(parts[2:], parse_qs(split.query))
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(parts)
            return self._error(404, None, "Not Found")

        def _send(
            self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None, *, stall_s: float = 0.0
        ) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self._head or not body:
                return
            if stall_s:
                half = len(body) // 2
                self.wfile.write(body[:half])
                self.wfile.flush()
                time.sleep(stall_s)
                body = body[half:]
            # the client may have given up waiting (a stalled download's timeout)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def _json(self, obj: object, headers: Mapping[str, str] | None = None) -> None:
            self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _error(self, status: int, code: str | None, message: str, **extra: str) -> None:
            headers = {"Content-Type": "application/json", "X-Error-Message": message, **extra}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, json.dumps({"error": message}).encode(), headers)

        def _repo(self, parts: list[str]) -> FakeRepo | None:
            repo = hub.repos.get("/".join(parts[:2]))
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
            return repo

        def _authorized(self, repo: FakeRepo) -> bool:
            # A bad token was already refused in _dispatch; gated files need a good one.
            if repo.gated and self.headers.get("Authorization") is None:
                self._error(
                    401,
                    "GatedRepo",
                    f"Access to model {repo.repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in.",
                )
                return False
            return True

        # -------------------------------------------------------- the API

        def _api(self, parts: list[str], query: dict[str, list[str]]) -> None:
            repo = self._repo(parts)
            if repo is None:
                return
            rest = parts[2:]
            if not rest or rest[0] in ("revision", "tree", "commits"):
                revision = rest[1] if len(rest) > 1 else "main"
                commit = repo.resolve(revision)
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                if rest and rest[0] == "tree":
                    return self._json(self._tree(repo.at(commit), "/".join(rest[2:]),
                                                 recursive=_true(query, "recursive")))
                if rest and rest[0] == "commits":
                    return self._json([{"id": c, "title": f"commit {c[:7]}", "message": "", "authors": [],
                                        "date": "2024-09-18T15:23:00.000Z"} for c in repo.history(commit)])
                return self._json(self._model_info(repo.at(commit), commit, blobs=_true(query, "blobs")))
            return self._error(404, None, "Not Found")

        def _model_info(self, repo: FakeRepo, commit: str, *, blobs: bool) -> dict[str, object]:
            siblings: list[dict[str, object]] = []
            for path in sorted(repo.files):
                sibling: dict[str, object] = {"rfilename": path}
                if blobs:
                    sibling["size"] = len(repo.files[path])
                    sibling["blobId"] = repo.blob_id(path)
                    if lfs := repo.lfs_info(path, "sha256"):
                        sibling["lfs"] = lfs
                siblings.append(sibling)
            return {
                "_id": commit[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": commit,
                "lastModified": "2024-09-18T15:23:00.000Z",
                "createdAt": "2024-09-16T11:55:00.000Z",
                "private": False,
                "disabled": False,
                "gated": "manual" if repo.gated else False,
                "downloads": 0,
                "likes": 0,
                "library_name": "transformers",
                "tags": ["transformers", "safetensors"],
                "config": repo.config(),
                "siblings": siblings,
            }

        def _tree(self, repo: FakeRepo, base: str, *, recursive: bool) -> list[dict[str, object]]:
            prefix = f"{base}/" if base else ""
            entries: dict[str, dict[str, object]] = {}
            for path in sorted(repo.files):
                if not path.startswith(prefix):
                    continue
                rel = path[len(prefix) :].split("/")
                for depth in range(1, len(rel)):  # the folders on the way
                    folder = prefix + "/".join(rel[:depth])
                    if recursive or depth == 1:
                        entries.setdefault(
                            folder,
                            {
                                "type": "directory",
                                "oid": git_blob_sha1(folder.encode()),
                                "size": 0,
                                "path": folder,
                            },
                        )
                if recursive or len(rel) == 1:
                    entry: dict[str, object] = {
                        "type": "file",
                        "oid": repo.blob_id(path),
                        "size": len(repo.files[path]),
                        "path": path,
                    }
                    if lfs := repo.lfs_info(path, "oid"):
                        entry["lfs"] = lfs
                    entries[path] = entry
            return list(entries.values())

        # -------------------------------------------------------- files

        def _resolve(self, parts: list[str]) -> None:
            repo = self._repo(parts)
            if repo is None:
                return
            revision, path = parts[3], "/".join(parts[4:])
            commit = repo.resolve(revision)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            if not self._authorized(repo):
                return
            repo = repo.at(commit)
            if path not in repo.files:
                return self._error(
                    404, "EntryNotFound", f"{path} does not exist at {commit}", **{"X-Repo-Commit": commit}
                )
            data = repo.files[path]
            if repo.is_lfs(path):
                cdn_path = f"/lfs/{quote(repo.repo_id)}/{commit}/{quote(path)}"
                location = f"{hub.cdn_endpoint}{cdn_path}?X-Amz-Signature=fake"
                return self._send(
                    302,
                    b"",
                    {
                        "Location": location,
                        "X-Repo-Commit": commit,
                        "ETag": f'"{repo.blob_id(path)}"',
                        "X-Linked-Etag": f'"{repo.advertised_sha256(path)}"',
                        "X-Linked-Size": str(len(data)),
                    },
                )
            self._file(data, {"X-Repo-Commit": commit, "ETag": f'"{repo.blob_id(path)}"'})

        def _cdn(self, parts: list[str]) -> None:
            # /lfs/{owner}/{name}/{commit}/{path…}; the signed URL is the authorization, as on the real CDN.
            latest = hub.repos.get("/".join(parts[1:3])) if len(parts) > 4 and parts[0] == "lfs" else None
            path = "/".join(parts[4:])
            known = latest is not None and parts[3] in (latest.commit, *latest.older)
            repo = latest.at(parts[3]) if latest is not None and known else None
            if repo is None or path not in repo.files:
                return self._send(
                    403, b"<Error><Code>AccessDenied</Code></Error>", {"Content-Type": "text/xml"}
                )
            self._file(repo.files[path], {"ETag": f'"{hashlib.md5(repo.files[path]).hexdigest()}"'},
                       stall_s=hub.stall_s)

        def _file(self, data: bytes, headers: Mapping[str, str], *, stall_s: float = 0.0) -> None:
            headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", **headers}
            wanted = self.headers.get("Range")
            if wanted and wanted.startswith("bytes="):
                first, _, last = wanted[len("bytes=") :].partition("-")
                start, stop = int(first or 0), int(last) + 1 if last else len(data)
                if start >= len(data):
                    return self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
                chunk = data[start:stop]
                return self._send(
                    206,
                    chunk,
                    {
                        **headers,
                        "Content-Range": f"bytes {start}-{start + len(chunk) - 1}/{len(data)}",
                    },
                )
            self._send(200, data, headers, stall_s=stall_s)

    return Handler


def _true(query: Mapping[str, list[str]], key: str) -> bool:
    return any(v.lower() in ("1", "true") for v in query.get(key, []))
