"""`modelmint registry serve`: a local OCI registry that `ollama pull` can pull from.

Ollama's blob download (server/download.go at the release docs/oci.md cites) sends the blob GET with a redirect
policy that stops at another host and then requires a `Location`: it fetches the bytes in Range chunks from the
redirect's target, without the registry's credentials. A distribution registry on filesystem storage answers the
blob GET `200` with the bytes, and Ollama stops with `http: no Location header in response` (ollama/ollama#7244).

So the registry served here is Debian's docker-registry (distribution 2.8, toolchains/setup-registry.sh) with
filesystem storage *and* distribution's `redirect` storage middleware, whose base URL is a Range-capable, read-only
file server over the same storage directory on another loopback address (127.0.0.2 by default): the stand-in for
object storage with pre-signed URLs, which is what a production registry on S3, MinIO or GCS does on its own. Blob
GETs answer 307 to `http://127.0.0.2:PORT/docker/registry/v2/blobs/sha256/…/data`.

docker-registry listens on a unix socket in a private directory; 127.0.0.1:PORT is modelmint's front, which
forwards GET and HEAD from anyone (pulls carry no credentials) and pushes, tags and deletes only with the push
credentials (push_credentials: the ones `modelmint publish` on this machine uses). Both servers listen on loopback
only, and docker-registry dies with the process that started it.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import hmac
import http.client
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pipelines.core.errors import ConfigError
from pipelines.core.runner import stop_process, tool_env
from pipelines.core.settings import Settings
from pipelines.publish.oci import Credentials, credentials_for

REGISTRY_HOST = "127.0.0.1"
"""Where the registry (its front) listens."""
BLOB_HOST = "127.0.0.2"
"""Another host than the registry's 127.0.0.1: Ollama's client follows a redirect only within one host."""


def _ranged(header: str | None, size: int) -> tuple[int, int] | str | None:
    """The one byte range a GET's `Range` header asks of a representation of `size` bytes, by RFC 9110:
    (first, last) inclusive for a 206; "unsatisfiable" for a 416; None to answer the whole 200.

    - §14.1.2: `bytes=FIRST-[LAST]` (a LAST past the end means the end), `bytes=-SUFFIX` (the last SUFFIX bytes,
      the whole when it is shorter); digits only, LAST not below FIRST.
    - §14.1.1: an int-range is satisfiable when FIRST < size, a suffix-range when SUFFIX > 0; otherwise 416
      (§15.5.17).
    - §14.2: a range unit other than bytes, or a ranges-specifier that does not parse, is ignored (200), and a
      server may answer a multi-range request with the whole representation (200) too, as this one does.
    """
    if header is None:
        return None
    unit, eq, spec = header.partition("=")
    if not eq or unit.strip().lower() != "bytes" or "," in spec:
        return None
    m = re.fullmatch(r"([0-9]*)-([0-9]*)", spec.strip())  # DIGIT is ASCII (RFC 5234); int() would take more
    if m is None or not any(m.groups()):
        return None
    first, last = m.groups()
    if first == "":  # suffix-range
        suffix = int(last)
        if suffix == 0:
            return "unsatisfiable"
        if size == 0:
            return None  # satisfiable, yet no byte to send: the whole (empty) representation
        return max(size - suffix, 0), size - 1
    start = int(first)
    if last and int(last) < start:
        return None  # invalid (§14.1.1): ignored
    if start >= size:
        return "unsatisfiable"
    return start, min(int(last), size - 1) if last else size - 1


class _Server(ThreadingHTTPServer):
    """A threading HTTP server that takes bursts: Ollama fetches a blob in parallel Range parts, several blobs
    at once, and http.server's listen backlog of 5 dropped connections of a burst of 100 (their clients waited
    for a SYN that was never answered)."""

    request_queue_size = 1024  # the kernel caps it at net.core.somaxconn
    daemon_threads = True


class BlobServer:
    """A Range-capable, read-only file server over `root` on `host`:`port` (0: a free one), asking for no
    credentials, as a pre-signed object-storage URL does not. Serves in a daemon thread until `stop()`.

    Raises:
        ConfigError: the address cannot be bound (in use, or not an address of this machine)."""

    def __init__(self, root: Path, host: str = BLOB_HOST, port: int = 0) -> None:
        served = root.resolve()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a pull's Range parts reuse their connections
            timeout = 120  # an idle kept-alive connection gives its thread back

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _serve(self, *, body: bool) -> None:
                path = (served / self.path.split("?", 1)[0].lstrip("/")).resolve()
                if not path.is_relative_to(served) or not path.is_file():
                    self.send_error(404)
                    return
                size = path.stat().st_size
                # §14.2: Range is defined for GET only; a HEAD answers as the whole GET would
                wanted = _ranged(self.headers.get("Range"), size) if body else None
                if wanted == "unsatisfiable":
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")  # §14.4, §15.5.17
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start, end = wanted if isinstance(wanted, tuple) else (0, size - 1)
                self.send_response(206 if isinstance(wanted, tuple) else 200)
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("Accept-Ranges", "bytes")
                if isinstance(wanted, tuple):
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")  # §14.4
                self.end_headers()
                if body:
                    try:
                        self._copy(path, start, end - start + 1)
                    except (BrokenPipeError, ConnectionResetError):
                        self.close_connection = True  # the client went away mid-body

            def _copy(self, path: Path, start: int, left: int) -> None:
                with open(path, "rb") as f:
                    f.seek(start)
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        if not chunk:  # the file shrank under us: the promised length cannot be kept
                            self.close_connection = True
                            break
                        self.wfile.write(chunk)
                        left -= len(chunk)

        try:
            self.server = _Server((host, port), Handler)
        except OSError as e:
            raise ConfigError(f"cannot serve the registry's blobs on {host}:{port}: {e.strerror}",
                              hint="choose another --blob-port (or free that one), then rerun") from e
        self.host = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def registry_config(storage: Path, port: int, *, redirect_to: str | None, extra: str = "",
                    unix_socket: Path | None = None) -> str:
    """distribution 2.8's configuration: filesystem storage under `storage`, HTTP on 127.0.0.1:`port` (or, with
    `unix_socket`, on that socket only), an access log on stdout, and with `redirect_to` (a base URL) the `redirect`
    storage middleware; `extra`: more top-level sections (auth, the http section's tls lines go in `extra` as the
    caller writes them)."""
    listen = f"  net: unix\n  addr: {unix_socket}\n" if unix_socket is not None else f"  addr: 127.0.0.1:{port}\n"
    text = f"""version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
{listen}  secret: modelmint-local-registry
"""
    text += extra
    if redirect_to is not None:
        # registry/storage/driver/middleware/redirect: URLFor answers the base URL's scheme and host plus the
        # driver's own path, whatever the driver, so the blob server above serves it from the same directory
        text += f"""middleware:
  storage:
    - name: redirect
      options:
        baseurl: {redirect_to}
"""
    return text


def registry_storage(host: str) -> Path | None:
    """Where the registry at `host` (HOST:PORT) keeps its blobs when it is a docker-registry on this machine with
    filesystem storage, listening on a loopback port itself or behind `modelmint registry serve`'s front: the
    `rootdirectory` of the config file its command line names. None when that cannot be known: a registry on
    another machine, another program, another storage driver, or processes this user may not read."""
    import psutil
    import yaml

    name, _, port = host.rpartition(":")
    try:
        if not port.isdigit() or not (name == "localhost" or ipaddress.ip_address(name.strip("[]")).is_loopback):
            return None
        listening = {c.pid for c in psutil.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == int(port) and c.pid}
        for pid in listening:
            top = psutil.Process(pid)
            for proc in (top, *top.children(recursive=True)):
                argv = proc.cmdline()
                if len(argv) >= 3 and Path(argv[0]).name == "docker-registry" and argv[1] == "serve":
                    config = yaml.safe_load(Path(argv[-1]).read_text(encoding="utf-8"))
                    root = config["storage"]["filesystem"]["rootdirectory"]
                    return Path(root) if isinstance(root, str) and Path(root).is_absolute() else None
    except (ValueError, OSError, psutil.Error, yaml.YAMLError, KeyError, TypeError):
        return None
    return None


def registry_binary() -> str:
    found = shutil.which("docker-registry")
    if found is None:
        raise ConfigError("docker-registry (the distribution registry) is not installed: not on PATH",
                          hint="run `bash toolchains/setup-registry.sh` (Debian's docker-registry), then rerun")
    return found


# ---------------------------------------------------------------- where the blob server may listen

_BLOB_HOST_HINT = f"use another loopback address, e.g. --blob-host {BLOB_HOST} (the default)"


def check_blob_host(host: str) -> None:
    """Refuse an address the credential-free blob server must not listen on.

    Raises:
        ConfigError: `host` is unspecified (0.0.0.0, ::: every interface, and a redirect to http://0.0.0.0:… that
            no client can follow), or not an IPv4 loopback address (the registry is for this machine only)."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"--blob-host {host!r} is not an IP address: the blob server listens on a loopback address",
                          hint=_BLOB_HOST_HINT) from None
    if addr.is_unspecified:
        raise ConfigError(f"--blob-host {host} means every interface: the blob server asks for no credentials, so "
                          "every blob in the registry's storage would be readable from the network, and the "
                          f"registry would redirect pulls to http://{host}:…, an address no client can reach",
                          hint=_BLOB_HOST_HINT)
    if addr.version != 4 or not addr.is_loopback:
        raise ConfigError(f"--blob-host {host} is not an IPv4 loopback address (127.x.x.x): `modelmint registry "
                          "serve` is for one machine, and its blob server asks for no credentials",
                          hint=_BLOB_HOST_HINT)


def check_ollama_blob_host(host: str) -> None:
    """Refuse the registry's own host for the blob server, which `ollama pull` cannot pull through.

    Raises:
        ConfigError: `host` is the registry's 127.0.0.1 (or refused by check_blob_host)."""
    check_blob_host(host)
    if ipaddress.ip_address(host) == ipaddress.ip_address(REGISTRY_HOST):
        raise ConfigError(f"--blob-host {host} is the registry's own host: Ollama follows a redirect to the "
                          "registry's host name, whatever the port, instead of taking its Location, gets the bytes "
                          "and fails with `http: no Location header in response` (docs/oci.md, \"Which registries "
                          "`ollama pull` works with\")", hint=_BLOB_HOST_HINT)


# ---------------------------------------------------------------- who may push


def push_credentials(settings: Settings, host: str) -> tuple[Credentials, str]:
    """The credentials pushes and deletes to the registry on `host` need, and where they come from: the
    settings' (MODELMINT_REGISTRY_USERNAME and _PASSWORD), else the docker config's entry for `host` (`docker
    login HOST`, or an earlier `registry serve` on that port), else new ones, recorded there as `docker login`
    records them, so that `modelmint publish` on this machine finds them and nothing prints them.

    Raises:
        ConfigError: the docker config is unreadable (oci.credentials_for) or cannot be written."""
    found = credentials_for(host, username=settings.registry_username, password=settings.registry_password,
                            docker_config=settings.docker_config)
    if found is not None:
        if settings.registry_username:
            return found, "MODELMINT_REGISTRY_USERNAME and MODELMINT_REGISTRY_PASSWORD"
        return found, f"the entry for {host} in {settings.docker_config}"
    if settings.docker_config is None:  # Settings.from_env always names one
        raise ConfigError("no docker config file to record the registry's push credentials in",
                          hint="set MODELMINT_REGISTRY_USERNAME and MODELMINT_REGISTRY_PASSWORD, then rerun")
    made = Credentials("modelmint", secrets.token_urlsafe(24))
    _record_login(settings.docker_config, host, made)
    return made, f"new ones, recorded for {host} in {settings.docker_config} as `docker login` does"


def _record_login(config: Path, host: str, creds: Credentials) -> None:
    """Add `host`'s `auths` entry to the docker config `config`, keeping the rest; written whole (mode 0600) and
    renamed into place."""
    try:
        data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
        if not isinstance(data, dict):
            data = {}
        auths = data.setdefault("auths", {})
        auths[host] = {"auth": base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()}
        config.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = config.with_name(f".{config.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, config)
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot record the registry's push credentials in {config}: "
                          f"{getattr(e, 'strerror', None) or e}",
                          hint="set MODELMINT_REGISTRY_USERNAME and MODELMINT_REGISTRY_PASSWORD (serve and publish "
                          "both use them), then rerun") from e


# ---------------------------------------------------------------- the front: reads for anyone, writes with credentials

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "expect"})
_READS = ("GET", "HEAD")
_REALM = "modelmint registry serve"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._path))
        self.sock = sock


class RegistryFront:
    """127.0.0.1:`port` in front of docker-registry's unix socket `upstream`: GET and HEAD for anyone (pulls, Ollama's
    included, send no credentials), every other method (a push, a tag, a delete) only with `credentials` (HTTP
    basic; `None`: nobody). docker-registry itself listens on no TCP port, so nothing reaches it around this.

    distribution's htpasswd auth cannot do this: it asks every request, pulls too, for credentials, and Ollama
    answers only a bearer challenge (docs/oci.md).

    Raises:
        ConfigError: 127.0.0.1:`port` is in use."""

    def __init__(self, port: int, upstream: Path, credentials: Credentials | None = None) -> None:
        self.allow(credentials)
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 300  # a stalled client gives its thread back

            def log_message(self, *args: Any) -> None:
                pass  # docker-registry's access log has every request

            def do_GET(self) -> None:
                self._forward()

            do_HEAD = do_GET

            def _write(self) -> None:
                if self._authorized():
                    self._forward()
                else:
                    self._refuse()

            do_PUT = do_POST = do_PATCH = do_DELETE = _write

            def handle_expect_100(self) -> bool:
                if self.command not in _READS and not self._authorized():
                    self._refuse()
                    return False
                return super().handle_expect_100()

            def _authorized(self) -> bool:
                scheme, _, value = self.headers.get("Authorization", "").partition(" ")
                expected = front._expected
                if expected is None or scheme.lower() != "basic":
                    return False
                try:
                    given = base64.b64decode(value.strip(), validate=True)
                except binascii.Error:
                    return False
                return hmac.compare_digest(given, expected)

            def _refuse(self) -> None:
                length = self.headers.get("Content-Length", "")
                waits = self.headers.get("Expect", "").lower() == "100-continue"  # it sends no body unless told
                if length.isdigit() and int(length) <= 1 << 20 and not waits:
                    self.rfile.read(int(length))  # a small body is read, so that the client sees the answer
                self._answer(401, "UNAUTHORIZED", f"{self.command} needs credentials here: `modelmint registry "
                             "serve` lets anyone pull and only its push credentials push, tag or delete",
                             {"WWW-Authenticate": f'Basic realm="{_REALM}"'})

            def _answer(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
                body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
                self.send_response(status)
                for k, v in {**(headers or {}), "Docker-Distribution-API-Version": "registry/2.0",
                             "Content-Type": "application/json", "Content-Length": str(len(body)),
                             "Connection": "close"}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _forward(self) -> None:
                chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
                length = self.headers.get("Content-Length", "")
                if not chunked and length and not length.isdigit():
                    self._answer(400, "BAD_REQUEST", f"Content-Length {length!r} is not a number")
                    return
                conn = _UnixConnection(upstream, timeout=300)
                try:
                    try:
                        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                        for k, v in self.headers.items():
                            # the Host header goes on as the client sent it: distribution builds upload URLs from it
                            if k.lower() not in _HOP_BY_HOP and k.lower() != "authorization" and not (
                                    chunked and k.lower() == "content-length"):
                                conn.putheader(k, v)
                        if chunked:
                            conn.putheader("Transfer-Encoding", "chunked")
                        conn.endheaders()
                        if chunked:
                            self._pipe_chunked(conn)
                        elif length:
                            self._pipe(conn, int(length))
                        resp = conn.getresponse()
                    except OSError as e:
                        self._answer(502, "UNAVAILABLE", f"docker-registry does not answer ({e})")
                        return
                    self._relay(resp)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client went away
                finally:
                    conn.close()

            def _pipe(self, conn: http.client.HTTPConnection, left: int, *, chunk: bool = False) -> None:
                while left > 0:
                    data = self.rfile.read(min(left, 1 << 20))
                    if not data:
                        raise ConnectionResetError("the client closed the request body early")
                    conn.send(b"%x\r\n%s\r\n" % (len(data), data) if chunk else data)
                    left -= len(data)

            def _pipe_chunked(self, conn: http.client.HTTPConnection) -> None:
                while True:
                    size_line = self.rfile.readline(1024)
                    try:
                        size = int(size_line.split(b";")[0].strip(), 16)
                    except ValueError:
                        raise ConnectionResetError("a malformed chunk in the request body") from None
                    if size == 0:
                        while self.rfile.readline(1024).strip():
                            pass  # trailers: dropped
                        conn.send(b"0\r\n\r\n")
                        return
                    self._pipe(conn, size, chunk=True)
                    self.rfile.readline(1024)  # the CRLF after the chunk's data

            def _relay(self, resp: http.client.HTTPResponse) -> None:
                self.send_response_only(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP_BY_HOP:
                        self.send_header(k, v)
                bodyless = self.command == "HEAD" or resp.status in (204, 304) or resp.status < 200
                if not bodyless and resp.getheader("Content-Length") is None:
                    self.send_header("Connection", "close")  # its end is where the body ends
                self.end_headers()
                if not bodyless:
                    while data := resp.read(1 << 20):
                        self.wfile.write(data)

        try:
            self.server = _Server((REGISTRY_HOST, port), Handler)
        except OSError as e:
            raise ConfigError(f"{REGISTRY_HOST}:{port} is in use ({e.strerror}): another registry or server listens "
                              "there", hint="choose another --port, or stop what listens there, then rerun") from e
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def allow(self, credentials: Credentials | None) -> None:
        """Let `credentials` write from now on (None: nobody)."""
        self._expected = f"{credentials.username}:{credentials.password}".encode() if credentials else None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- the process


@dataclass
class LocalRegistry:
    """A running registry: its front on 127.0.0.1, docker-registry behind it, and the blob server."""

    front: RegistryFront
    proc: subprocess.Popen[bytes]
    blobs: BlobServer
    log: Path
    sockets: Path
    """The private directory of docker-registry's unix socket."""

    @property
    def port(self) -> int:
        return self.front.port

    @property
    def host(self) -> str:
        return f"{REGISTRY_HOST}:{self.port}"

    def stop(self) -> None:
        self.front.stop()
        self.blobs.stop()
        stop_process(self.proc)
        shutil.rmtree(self.sockets, ignore_errors=True)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _dies_with_this_process() -> Callable[[], None]:
    """A preexec_fn that has the kernel send the child SIGTERM when its parent dies, even by SIGKILL
    (prctl(2) PR_SET_PDEATHSIG), so that no docker-registry outlives `registry serve` and keeps answering with
    redirects to a dead blob server. libc is looked up before the fork: the child runs only the call. (The signal
    follows the thread that forked: call it from the thread that lives as long as the registry.)"""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: nobody would send the signal
            os._exit(1)

    return preexec


@contextmanager
def local_registry(root: Path, port: int, *, blob_host: str = BLOB_HOST, blob_port: int = 0,
                   credentials: Credentials | Callable[[str], Credentials] | None = None) -> Iterator[LocalRegistry]:
    """Start the registry (storage, config and log under `root`), its front on 127.0.0.1:`port` (0: a free one)
    that lets only `credentials` write (None: nobody; a function: called with the front's HOST:PORT once it is
    bound), and its blob server; stop all on exit. docker-registry dies with this process, however it ends.

    `blob_host` must be a loopback address (check_blob_host); 127.0.0.1 is taken, though `ollama pull` cannot pull
    through it (check_ollama_blob_host refuses it where that matters).

    Raises:
        ConfigError: docker-registry is not installed, a port is taken, `root` cannot be written, `blob_host` is not
            loopback, or the registry exits or does not answer within 30 s (its log's tail)."""
    check_blob_host(blob_host)
    binary = registry_binary()
    storage = root / "storage"
    try:
        storage.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where the folder goes, a read-only or virtual filesystem
        raise ConfigError(f"cannot make the registry's storage {storage}: {e.strerror or e}",
                          hint="give --dir a folder you can write (it is created if missing)") from e
    # a unix socket's path has at most 107 bytes, and --dir may be long: a private directory of its own (0700)
    sockets = Path(tempfile.mkdtemp(prefix="modelmint-registry-"))
    upstream = sockets / "registry.sock"
    try:
        front = RegistryFront(port, upstream)
    except BaseException:
        shutil.rmtree(sockets, ignore_errors=True)
        raise
    try:
        front.allow(credentials(f"{REGISTRY_HOST}:{front.port}") if callable(credentials) else credentials)
        blobs = BlobServer(storage, blob_host, blob_port)
    except BaseException:
        front.stop()
        shutil.rmtree(sockets, ignore_errors=True)
        raise
    config = root / "config.yml"
    log = root / "registry.log"
    try:
        config.write_text(registry_config(storage, front.port, redirect_to=f"http://{blobs.host}",
                                          unix_socket=upstream))
        with open(log, "ab") as out:
            proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                    env=tool_env(), preexec_fn=_dies_with_this_process())
    except BaseException:
        front.stop()
        blobs.stop()
        shutil.rmtree(sockets, ignore_errors=True)
        raise
    reg = LocalRegistry(front, proc, blobs, log, sockets)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise ConfigError(f"docker-registry exited {proc.returncode} behind {reg.host}: {tail[0]}",
                                  hint=f"see {log}, then rerun")
            if upstream.exists():
                try:
                    with urllib.request.urlopen(f"http://{reg.host}/v2/", timeout=2):
                        break
                except urllib.error.HTTPError as e:
                    if e.code != 502:  # the front answers 502 until docker-registry listens
                        break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise ConfigError(f"docker-registry did not answer behind {reg.host} within 30 s",
                                  hint=f"see {log}, then rerun")
            time.sleep(0.2)
        yield reg
    finally:
        reg.stop()
