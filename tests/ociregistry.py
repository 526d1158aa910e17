"""A real OCI registry for tests: Debian's docker-registry (distribution 2.8) on 127.0.0.1, its own storage and config.

Started by the tests, stopped by its own pid; its access log shows every request it served, so a test can count
uploads independently of what the client says it did.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from registry_env import ROOT, free_port

from pipelines.core.runner import stop_process
from pipelines.publish.localregistry import BlobServer, registry_config


@dataclass
class RunningRegistry:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def storage(self) -> Path:
        return self.root / "storage" / "docker" / "registry" / "v2"

    def blob_data(self, digest: str) -> Path:
        """Where the registry's filesystem driver keeps a blob's bytes."""
        hexd = digest.removeprefix("sha256:")
        return self.storage / "blobs" / "sha256" / hexd[:2] / hexd / "data"

    def requests(self, method: str) -> list[str]:
        """The access-log lines of `method` requests served so far."""
        return [ln for ln in self.log.read_text(errors="replace").splitlines() if f'"{method} /v2/' in ln]

    static: StaticBlobServer | None = None

    def stop(self) -> None:
        if self.static is not None:
            self.static.stop()
        stop_process(self.proc)


# distribution 2.8's configuration and the redirect target are the ones `modelmint registry serve` runs
# (pipelines/publish/localregistry.py): with `redirect`, blob GETs answer 307 to the blob server on 127.0.0.2.
StaticBlobServer = BlobServer


def registry_binary() -> str:
    """docker-registry, installed by toolchains/setup-registry.sh (apt-get) when it is not on PATH yet."""
    found = shutil.which("docker-registry")
    if found is None:
        done = subprocess.run(["bash", str(ROOT / "toolchains" / "setup-registry.sh")], capture_output=True, text=True)
        found = shutil.which("docker-registry")
        assert found, f"docker-registry is not installed and setup-registry.sh failed:\n{done.stdout}{done.stderr}"
    return found


_HTPASSWD = """auth:
  htpasswd:
    realm: modelmint-tests
    path: {path}
"""
_TOKEN = """auth:
  token:
    realm: {realm}
    service: {service}
    issuer: {issuer}
    rootcertbundle: {roots}
"""
_TLS = """  tls:
    certificate: {cert}
    key: {key}
"""


def start_registry(root: Path, *, auth: Path | None = None, token: TokenServer | None = None,
                   tls: TlsFiles | None = None, port: int | None = None, redirect: bool = False) -> RunningRegistry:
    """A registry on a free port of 127.0.0.1 (or `port`: one stopped earlier, started again), storing under `root`:
    plain HTTP, or HTTPS with `tls`; with `auth` (an htpasswd file of bcrypt hashes) it asks for basic credentials,
    with `token` for a bearer token."""
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    config = root / "config.yml"
    extra = ""
    if tls is not None:
        extra += _TLS.format(cert=tls.server_cert, key=tls.server_key)
    if auth is not None:
        extra += _HTPASSWD.format(path=auth)
    if token is not None:
        extra += _TOKEN.format(realm=token.realm, service=token.service, issuer=token.issuer, roots=token.cert)
    static = None
    if redirect:  # blob GETs answer 307 to a static server on 127.0.0.2, as object storage behind a registry does
        (root / "storage").mkdir(exist_ok=True)
        static = StaticBlobServer(root / "storage")
    config.write_text(registry_config(root / "storage", port, redirect_to=f"http://{static.host}" if static else None,
                                      extra=extra))
    log = root / "registry.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([registry_binary(), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
    reg = RunningRegistry(root, port, proc, log, static)
    url = f"{'https' if tls else 'http'}://{reg.host}/v2/"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            reg.stop()
            raise AssertionError(f"docker-registry exited {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=2, verify=ssl.create_default_context(cafile=str(tls.ca)) if tls else True).status_code in (200, 401):
                return reg
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    reg.stop()
    raise AssertionError(f"docker-registry did not answer on {reg.host} within 30 s:\n{log.read_text()[-2000:]}")


# ---------------------------------------------------------------- TLS with a private CA


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert(subject: str, key: Any, issuer: Any = None, issuer_key: Any = None, *, ca: bool) -> Any:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer.subject if issuer else name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
    return b.sign(issuer_key or key, hashes.SHA256())


def make_tls(directory: Path) -> TlsFiles:
    """A private CA and a certificate for 127.0.0.1 signed by it (what a team's internal registry has)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("modelmint tests CA", ca_key, ca=True)
    server = _cert("127.0.0.1", server_key, ca, ca_key, ca=False)
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    files.server_key.write_bytes(_key_pem(server_key))
    return files


# ---------------------------------------------------------------- the distribution registry's token flow


class TokenServer:
    """A token service as the distribution registry's token auth expects one: GET realm?service=&scope= with basic
    credentials → {"token": a JWT (ES256, the signing certificate in `x5c`) granting the scope's actions}."""

    def __init__(self, directory: Path, users: dict[str, str]) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self._certificate = _cert("modelmint tests token signer", self.key, ca=True)
        self.cert = directory / "token-signer.pem"
        self.cert.write_bytes(self._certificate.public_bytes(serialization.Encoding.PEM))
        self.users = users
        self.service, self.issuer = "modelmint-registry", "modelmint-tests"
        self.issued: list[str] = []
        """The scopes tokens were issued for."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.realm = f"http://127.0.0.1:{self._server.server_address[1]}/token"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def token(self, user: str, scopes: list[str]) -> str:
        import base64
        import os

        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        der = self._certificate.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                import base64
                from urllib.parse import parse_qs, urlparse

                query = parse_qs(urlparse(self.path).query)
                auth = self.headers.get("Authorization", "")
                user, _, password = (base64.b64decode(auth[6:]).decode() if auth.startswith("Basic ") else ""
                                     ).partition(":")
                if not user or server.users.get(user) != password:
                    self.send_response(401)
                    self.end_headers()
                    return
                scopes = query.get("scope", [])
                server.issued.extend(scopes)
                body = json.dumps({"token": server.token(user, scopes)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
