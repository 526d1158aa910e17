"""A real RFC 3161 Time-Stamp Authority for tests: `openssl ts -reply` behind HTTP on 127.0.0.1, with its own root."""

from __future__ import annotations

import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_CONFIG = """\
[tsa]
default_tsa = tsa_config1

[tsa_config1]
dir = {dir}
serial = $dir/serial
crypto_device = builtin
signer_digest = sha256
default_policy = 1.3.6.1.4.1.57264.2.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = no
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


@dataclass(frozen=True)
class Tsa:
    url: str
    root: Path
    """The PEM root certificate a trust policy names to accept this authority."""


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A TSA root and a timestamping certificate issued by it (extended key usage timeStamping, critical), valid
    a year either side of now: (root.pem, tsa.pem, tsa.key)."""
    now = datetime.now(UTC)
    root_key, tsa_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    root = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name} root"))
        .issuer_name(_name(f"{name} root"))
        .public_key(root_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=365))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(root_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(root.subject)
        .public_key(tsa_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=365))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, True, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True)
        .sign(root_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "root.pem", directory / "tsa.pem", directory / "tsa.key"
    paths[0].write_bytes(root.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        tsa_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


@contextmanager
def serve_tsa(directory: Path, name: str = "test tsa", *,
              answer: Callable[[bytes], bytes] = lambda reply: reply) -> Iterator[Tsa]:
    """A TSA on 127.0.0.1 answering POST application/timestamp-query with `openssl ts -reply` (passed through
    `answer`: an authority whose clock is off re-dates it)."""
    root, cert, key = make_pki(directory, name)
    (directory / "serial").write_text("01\n")
    config = directory / "tsa.cnf"
    config.write_text(_CONFIG.format(dir=directory))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            query = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get_content_type() != "application/timestamp-query":
                self.send_error(415)
                return
            with lock, tempfile.TemporaryDirectory(dir=directory) as scratch:
                q, r = Path(scratch) / "q.tsq", Path(scratch) / "r.tsr"
                q.write_bytes(query)
                done = subprocess.run(
                    ["openssl", "ts", "-reply", "-config", str(config), "-queryfile", str(q),
                     "-signer", str(cert), "-inkey", str(key), "-out", str(r)],
                    capture_output=True, check=False,
                )
                if done.returncode != 0:
                    self.send_error(400)
                    return
                reply = answer(r.read_bytes())
            self.send_response(200)
            self.send_header("Content-Type", "application/timestamp-reply")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Tsa(f"http://127.0.0.1:{server.server_address[1]}/tsr", root)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
