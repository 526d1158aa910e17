"""OCI images and the registry's distribution HTTP API, as modelmint pushes and pulls them (httpx, no other client).

An `Image` is a config blob, layer blobs and the manifest that lists them. `OciClient` speaks the distribution API:
HEAD before every upload (a blob the repository holds is never sent again), monolithic uploads (POST, then PUT with
the digest, which the registry checks), manifests by tag or digest, and blob reads that hash every byte. Basic and
bearer-token auth (the distribution registry's htpasswd + token flow) answer the registry's 401 challenge;
credentials are never logged, printed or written anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.core.errors import ConfigError, OciAuthRefused, OciBlobMismatch, OciError, OciUnavailable
from pipelines.core.vocab import is_name

if TYPE_CHECKING:  # httpx costs ~0.15 s to import: loaded by the client that talks, not by every CLI start
    import httpx

log = logging.getLogger(__name__)

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPES = (DOCKER_MANIFEST, OCI_MANIFEST)
_CHUNK = 4 * 1024 * 1024
_HOST = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$")
_PART = re.compile(r"^[a-z0-9_][a-z0-9_-]*$")
"""A namespace as Ollama names one (types/model/name.go: letters, digits, '_' and '-', no '.')."""


# ---------------------------------------------------------------- what is pushed


@dataclass(frozen=True)
class Blob:
    """One blob of an image: its bytes in memory (`data`) or in a file (`path`), with its digest and size."""

    media_type: str
    digest: str
    size: int
    path: Path | None = None
    data: bytes | None = field(default=None, repr=False)
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_bytes(cls, media_type: str, data: bytes, annotations: dict[str, str] | None = None) -> Blob:
        return cls(media_type, "sha256:" + hashlib.sha256(data).hexdigest(), len(data), data=data,
                   annotations=annotations or {})

    @classmethod
    def of_file(cls, media_type: str, path: Path, sha256: str, size: int,
                annotations: dict[str, str] | None = None) -> Blob:
        """A file whose sha256 is already known (the manifest's); the registry checks it again on upload."""
        return cls(media_type, "sha256:" + sha256, size, path=path, annotations=annotations or {})

    def descriptor(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        return d | ({"annotations": dict(self.annotations)} if self.annotations else {})


@dataclass(frozen=True)
class Image:
    """A manifest (Docker v2 schema 2 or OCI image manifest) with its config and layers."""

    media_type: str
    config: Blob
    layers: tuple[Blob, ...]
    artifact_type: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    subject: dict[str, Any] | None = None
    """The descriptor of the manifest this one refers to (OCI 1.1: a signature or attestation of an image)."""

    def manifest_bytes(self) -> bytes:
        """The manifest as pushed: compact JSON, in the field order the specifications list."""
        m: dict[str, Any] = {"schemaVersion": 2, "mediaType": self.media_type}
        if self.artifact_type:
            m["artifactType"] = self.artifact_type
        m["config"] = self.config.descriptor()
        m["layers"] = [b.descriptor() for b in self.layers]
        if self.subject is not None:
            m["subject"] = dict(self.subject)
        if self.annotations:
            m["annotations"] = dict(self.annotations)
        return json.dumps(m, separators=(",", ":"), ensure_ascii=False).encode()

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest_bytes()).hexdigest()

    @property
    def blobs(self) -> tuple[Blob, ...]:
        """Every blob, layers first and the config last (each digest once)."""
        seen: dict[str, Blob] = {}
        for b in (*self.layers, self.config):
            seen.setdefault(b.digest, b)
        return tuple(seen.values())


# ---------------------------------------------------------------- where


@dataclass(frozen=True)
class RegistryRef:
    """HOST[:PORT]/NAMESPACE: where images go; `insecure` speaks plain HTTP (a registry on a trusted network)."""

    host: str
    namespace: str
    insecure: bool = False

    @classmethod
    def parse(cls, text: str, *, insecure: bool = False) -> RegistryRef:
        """`registry.internal/modelmint` → RegistryRef.

        Raises:
            ConfigError: not HOST/NAMESPACE with one namespace segment, as `ollama pull` needs.
        """
        text = text.strip().removeprefix("https://").removeprefix("http://").rstrip("/")
        host, _, namespace = text.partition("/")
        if not _HOST.fullmatch(host) or not _PART.fullmatch(namespace):
            raise ConfigError(f"{text!r} is not a registry and namespace",
                              hint="write it as HOST[:PORT]/NAMESPACE, e.g. registry.internal/modelmint (one "
                              "namespace segment of lower-case letters, digits, '_' or '-': Ollama's names have one)")
        return cls(host, namespace, insecure)

    @property
    def url(self) -> str:
        return f"{'http' if self.insecure else 'https'}://{self.host}"

    def repository(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    def image(self, name: str, tag: str) -> str:
        return f"{self.host}/{self.namespace}/{name}:{tag}"


def check_ollama_name(registry: RegistryRef, name: str, tag: str) -> None:
    """Refuse, before anything is pushed, an image name `ollama pull` would refuse: Ollama's types/model/name.go
    (isValidLen) allows a host of up to 350 characters and a namespace, model or tag of up to 80.

    Raises:
        ConfigError: a part is too long.
    """
    for part, value, most in (("host", registry.host, 350), ("namespace", registry.namespace, 80),
                              ("model name", name, 80), ("tag", tag, 80)):
        if len(value) > most:
            raise ConfigError(f"the {part} of {registry.image(name, tag)} has {len(value)} characters; "
                              f"`ollama pull` refuses one over {most}",
                              hint=f"shorten the {part} (catalog name, tag, or --registry HOST/NAMESPACE) to "
                              f"{most} characters or fewer")


def parse_image(text: str, *, insecure: bool = False) -> tuple[RegistryRef, str, str]:
    """`HOST/NAMESPACE/NAME:TAG` → (registry, name, tag).

    Raises:
        ConfigError: not of that form.
    """
    where, sep, tag = text.rpartition(":")
    registry, slash, name = where.rpartition("/")
    if not sep or not slash or "/" in tag or not is_name(name) or not tag:
        raise ConfigError(f"{text!r} is not an image reference",
                          hint="write it as HOST/NAMESPACE/NAME:TAG, e.g. registry.internal/modelmint/qwen2.5:q4_k_m")
    return RegistryRef.parse(registry, insecure=insecure), name, tag


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)


def credentials_for(host: str, *, username: str | None, password: str | None,
                    docker_config: Path | None) -> Credentials | None:
    """The credentials for `host`: the given ones (the environment's), else the docker config file's `auths` entry
    (`docker login` writes it), else None.

    Raises:
        ConfigError: the docker config is not JSON, its `auth` for `host` is not base64 of USER:PASSWORD,
            or only one of username and password is set.
    """
    if username or password:
        if not (username and password):
            raise ConfigError("only one of MODELMINT_REGISTRY_USERNAME and MODELMINT_REGISTRY_PASSWORD is set",
                              hint="set both, or neither (then `docker login HOST` credentials are used)")
        return Credentials(username, password)
    if docker_config is None or not docker_config.is_file():
        return None
    try:
        auths = json.loads(docker_config.read_text(encoding="utf-8")).get("auths") or {}
    except (ValueError, AttributeError) as err:
        raise ConfigError(f"{docker_config} is not a docker config file ({type(err).__name__})",
                          hint="fix it, or set MODELMINT_REGISTRY_USERNAME and MODELMINT_REGISTRY_PASSWORD") from None
    for key in (host, f"https://{host}", f"http://{host}"):
        entry = auths.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user, colon, secret = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except ValueError:  # binascii.Error and UnicodeDecodeError are both ValueErrors
                colon = ""
            if not colon:
                # The value itself is a secret: name where it is, never what it is.
                raise ConfigError(f"{docker_config}: auths.{key}.auth is not base64 of USER:PASSWORD",
                                  hint=f"run `docker login {host}` again, or set MODELMINT_REGISTRY_USERNAME and "
                                       "MODELMINT_REGISTRY_PASSWORD")
            return Credentials(user, secret)
    return None


# ---------------------------------------------------------------- the client


class OciClient:
    """One registry's distribution API (https, or http when the RegistryRef is insecure)."""

    def __init__(self, registry: RegistryRef, *, credentials: Credentials | Callable[[], Credentials | None] | None = None,
                 ca: Path | None = None, timeout: float = 60.0) -> None:
        """`credentials` (or a function that finds them, called on the registry's first challenge only)."""
        self.registry = registry
        self._find_credentials = credentials if callable(credentials) else (lambda: credentials)
        self._authorization: str | None = None
        self._verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca)) if ca else True
        import httpx
        self._http = httpx.Client(base_url=registry.url, verify=self._verify, timeout=timeout,
                                  follow_redirects=True)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OciClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ requests

    def _send(self, method: str, url: str, *, stream: bool = False, redirects: bool = True,
              **kw: Any) -> httpx.Response:
        """One request, answering a 401 challenge once with the credentials.

        Raises:
            OciUnavailable: the registry cannot be reached, or answered 5xx.
            OciAuthRefused: it asks for credentials there are none of, or refuses them.
        """
        import httpx
        headers = dict(kw.pop("headers", {}))
        for attempt in range(2):
            if self._authorization:
                headers["Authorization"] = self._authorization
            try:
                request = self._http.build_request(method, url, headers=headers, **kw)
                r = self._http.send(request, stream=stream, follow_redirects=redirects)
            except httpx.TransportError as err:
                if "CERTIFICATE_VERIFY_FAILED" in str(err):
                    raise OciError(f"the certificate of {self.registry.host} is not signed by a CA this machine "
                                   f"trusts ({err})", registry=self.registry.host,
                                   hint="set MODELMINT_REGISTRY_CA to the PEM bundle of the CA that signs it (a "
                                   "team's private CA); --insecure only for a registry that serves plain HTTP") from err
                refused = _request_host(err)
                if refused is not None and refused != self.registry.host:
                    # the registry answered; the host it redirected to (its blob storage) did not
                    raise OciUnavailable(
                        f"the registry {self.registry.host} redirected {method} {httpx.URL(url).path} to {refused}, "
                        f"which cannot be reached ({type(err).__name__}: {err})",
                        registry=self.registry.host,
                        hint=f"the registry's blob storage at {refused} is down or not reachable from here (for "
                        "`modelmint registry serve`: its blob server; restart the serve), then rerun",
                    ) from err
                raise OciUnavailable(
                    f"the registry {self.registry.host} cannot be reached ({type(err).__name__}: {err})",
                    registry=self.registry.host,
                    hint=f"is it running and is {self.registry.url} right? (`curl {self.registry.url}/v2/`); "
                    "a registry served over plain HTTP needs --insecure",
                ) from err
            if r.status_code == 401 and attempt == 0:
                r.close()
                self._authenticate(r.headers.get("www-authenticate", ""))
                continue
            if r.status_code >= 500:
                r.read()
                raise OciUnavailable(_problem(r, f"{method} {r.url.path}"), registry=self.registry.host,
                                     hint="the registry failed (full disk? storage down?): see its log, then rerun "
                                     "the same command (blobs it holds are not sent again)")
            return r
        raise OciAuthRefused(f"{self.registry.host} refused the credentials for {method} {url}",
                             registry=self.registry.host, hint=_LOGIN_HINT)

    def _authenticate(self, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        creds = self._find_credentials()
        if (creds is None and scheme.lower() == "basic") or scheme.lower() not in ("basic", "bearer"):
            raise OciAuthRefused(f"{self.registry.host} asks for credentials ({scheme or 'no challenge'}) and none "
                                 "are set", registry=self.registry.host, hint=_LOGIN_HINT)
        basic = None
        if creds is not None:
            pair = f"{creds.username}:{creds.password}".encode()
            basic = "Basic " + base64.b64encode(pair).decode()
        if scheme.lower() == "basic":
            self._authorization = basic
            return
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        # a mount asks for two repositories' scopes: one `scope` each, however the challenge lists them
        scopes = [x for found in re.findall(r'scope="([^"]*)"', params) for x in found.split()]
        query = [("service", fields["service"])] if "service" in fields else []
        query += [("scope", x) for x in scopes]
        import httpx
        try:
            r = httpx.get(fields.get("realm", ""), params=query, headers={"Authorization": basic} if basic else {},
                          verify=self._verify, timeout=30)
        except httpx.HTTPError as err:
            raise OciUnavailable(f"the token service of {self.registry.host} cannot be reached ({err})",
                                 registry=self.registry.host, hint="check the registry's auth.token.realm") from err
        if r.status_code != 200:
            raise OciAuthRefused(f"the token service of {self.registry.host} answered {r.status_code}",
                                 registry=self.registry.host, hint=_LOGIN_HINT)
        body = r.json()
        self._authorization = "Bearer " + str(body.get("token") or body.get("access_token") or "")

    # ------------------------------------------------------------ blobs

    def has_blob(self, repository: str, digest: str) -> bool:
        r = self._send("HEAD", f"/v2/{repository}/blobs/{digest}")
        if r.status_code == 404:
            return False
        _ok(r, f"HEAD blob {digest}", self.registry.host)
        return True

    def push_blob(self, repository: str, blob: Blob, *, mount_from: tuple[str, ...] = ()) -> str:
        """Put `blob` into `repository`: "present" when it holds it already (HEAD first), "mounted" when the registry
        linked it from one of the `mount_from` repositories (no bytes sent), else "uploaded".

        Raises:
            OciError: the registry refused the upload (a digest that does not match the bytes, no space, denied).
        """
        if self.has_blob(repository, blob.digest):
            return "present"
        r = None
        for source in mount_from:
            r = self._send("POST", f"/v2/{repository}/blobs/uploads/", params={"mount": blob.digest, "from": source})
            if r.status_code == 201:
                return "mounted"
            _ok(r, f"mount {blob.digest} from {source}", self.registry.host, expect=(202,))
            break  # the registry could not mount it and opened an upload instead: use that
        if r is None:
            r = self._send("POST", f"/v2/{repository}/blobs/uploads/")
            _ok(r, f"start an upload of {blob.digest}", self.registry.host, expect=(202,))
        self._upload(r, blob)
        return "uploaded"

    def _upload(self, started: httpx.Response, blob: Blob) -> None:
        """The monolithic PUT of `blob` into the upload `started` opened (its Location)."""
        import httpx
        if "location" not in started.headers:
            raise OciError(f"{self.registry.host} started an upload of {blob.digest} but named no Location for it",
                           registry=self.registry.host, hint="this is not a distribution API registry, or a proxy "
                           "in front of it drops headers")
        location = httpx.URL(str(self._http.base_url)).join(started.headers["location"])
        url = location.copy_merge_params({"digest": blob.digest})
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(blob.size)}
        if blob.data is not None:
            r = self._send("PUT", str(url), headers=headers, content=blob.data)
        else:
            assert blob.path is not None, "a blob has bytes or a file"
            with open(blob.path, "rb") as f:
                r = self._send("PUT", str(url), headers=headers, content=_chunks(f))
        _ok(r, f"upload {blob.digest} ({blob.path.name if blob.path else blob.media_type})", self.registry.host,
            expect=(201,))

    def blob_redirects(self, repository: str, digest: str) -> bool:
        """Whether a blob GET answers as Ollama's download needs (ollama v0.33.0-rc2, server/download.go:242-270):
        redirects to the registry's own hostname (any port) are followed, and the answer that ends them must be a
        307 (or a 200) naming a Location on another host (object storage, a CDN, a file server): not the bytes,
        not another redirect status. See docs/oci.md."""
        r = self._send("GET", f"/v2/{repository}/blobs/{digest}", stream=True, redirects=False)
        import httpx
        try:
            for _ in range(10):
                location = r.headers.get("location")
                if r.status_code not in (301, 302, 303, 307, 308) or not location:
                    break
                url = r.request.url.join(location)
                if url.host != httpx.URL(self.registry.url).host:
                    break  # Ollama stops here and takes this answer's Location
                r.close()
                headers = {"Authorization": self._authorization} if self._authorization else {}
                r = self._http.send(self._http.build_request("GET", url, headers=headers), stream=True,
                                    follow_redirects=False)
            return r.status_code in (200, 307) and bool(r.headers.get("location"))
        finally:
            r.close()

    @contextmanager
    def _blob_stream(self, repository: str, digest: str) -> Iterator[httpx.Response]:
        r = self._send("GET", f"/v2/{repository}/blobs/{digest}", stream=True)
        try:
            if r.status_code != 200:
                r.read()
            _ok(r, f"GET blob {digest}", self.registry.host)
            yield r
        finally:
            r.close()

    def read_blob(self, repository: str, digest: str, *, limit: int = 16 << 20) -> bytes:
        """A small blob (a config, a manifest layer), its digest checked.

        Raises:
            OciBlobMismatch: its bytes do not hash to `digest`.
        """
        data = bytearray()
        with self._blob_stream(repository, digest) as r:
            for chunk in r.iter_bytes():
                data += chunk
                if len(data) > limit:
                    raise OciError(f"blob {digest} is over {limit} bytes", registry=self.registry.host)
        actual = hashlib.sha256(data).hexdigest()
        if "sha256:" + actual != digest:
            raise OciBlobMismatch(repository, digest, actual, registry=self.registry.host, hint=_TAMPERED)
        return bytes(data)

    def fetch_blob(self, repository: str, digest: str, dest: Path) -> None:
        """Write blob `digest` to `dest`, hashing every byte; a mismatch deletes what was written.

        Raises:
            OciBlobMismatch: the bytes do not hash to `digest`.
        """
        h = hashlib.sha256()
        with self._blob_stream(repository, digest) as r, open(dest, "wb") as out:
            for chunk in r.iter_bytes(_CHUNK):
                h.update(chunk)
                out.write(chunk)
        if "sha256:" + h.hexdigest() != digest:
            dest.unlink(missing_ok=True)
            raise OciBlobMismatch(repository, digest, h.hexdigest(), registry=self.registry.host, hint=_TAMPERED)

    # ------------------------------------------------------------ manifests

    def get_manifest(self, repository: str, reference: str, *,
                     accept: tuple[str, ...] = MANIFEST_TYPES) -> tuple[bytes, str, str] | None:
        """(bytes, media type, digest) of the manifest `reference` (a tag or a digest) names, or None."""
        r = self._send("GET", f"/v2/{repository}/manifests/{reference}", headers={"Accept": ", ".join(accept)})
        if r.status_code == 404:
            return None
        _ok(r, f"GET manifest {repository}:{reference}", self.registry.host)
        digest = "sha256:" + hashlib.sha256(r.content).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise OciBlobMismatch(repository, reference, digest.removeprefix("sha256:"),
                                  registry=self.registry.host, hint=_TAMPERED)
        return r.content, r.headers.get("content-type", "").split(";")[0], digest

    def put_manifest(self, repository: str, tag: str, image: Image) -> str:
        """Tag `image` (its blobs pushed first); returns the digest the registry reports."""
        r = self._send("PUT", f"/v2/{repository}/manifests/{tag}", headers={"Content-Type": image.media_type},
                       content=image.manifest_bytes())
        _ok(r, f"PUT manifest {repository}:{tag}", self.registry.host, expect=(201,))
        return r.headers.get("docker-content-digest", image.digest)

    def put_manifest_bytes(self, repository: str, tag: str, media_type: str, data: bytes) -> None:
        """Tag a manifest given as its bytes (an image index, whose manifests the repository holds already)."""
        r = self._send("PUT", f"/v2/{repository}/manifests/{tag}", headers={"Content-Type": media_type}, content=data)
        _ok(r, f"PUT manifest {repository}:{tag}", self.registry.host, expect=(201,))


_LOGIN_HINT = ("set MODELMINT_REGISTRY_USERNAME and MODELMINT_REGISTRY_PASSWORD, or `docker login HOST` (its "
               "~/.docker/config.json entry is used); check that the account may push to this namespace")
_TAMPERED = ("the registry's storage holds other bytes than were pushed under that digest: delete the blob there "
             "(`DELETE /v2/NAMESPACE/NAME/blobs/DIGEST`, or its directory in the registry's storage), then publish "
             "again from the registering machine (`modelmint publish NAME:TAG --registry HOST/NAMESPACE`)")


def _chunks(f: Any) -> Iterator[bytes]:
    while chunk := f.read(_CHUNK):
        yield chunk


def _request_host(err: httpx.TransportError) -> str | None:
    """HOST[:PORT] of the request that failed (after redirects, the last one), as RegistryRef.host writes it."""
    try:
        url = err.request.url
    except RuntimeError:  # an error raised outside a request
        return None
    return url.host if url.port is None else f"{url.host}:{url.port}"


def _problem(r: httpx.Response, what: str) -> str:
    """`what` failed: the status and the registry's own error codes and messages."""
    try:
        errors = r.json().get("errors") or []
        detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
    except (ValueError, AttributeError):
        detail = r.text[:200]
    return f"{what} answered {r.status_code}" + (f" ({detail})" if detail else "")


def _ok(r: httpx.Response, what: str, host: str, *, expect: tuple[int, ...] = (200,)) -> None:
    if r.status_code in expect:
        return
    if r.status_code in (401, 403):
        raise OciAuthRefused(_problem(r, what), registry=host, hint=_LOGIN_HINT)
    raise OciError(_problem(r, what), registry=host,
                   hint="see the registry's log; `modelmint publish` pushes blobs before tags, so nothing was tagged")


MODELMINT_MANIFEST = "application/vnd.modelmint.manifest.v2+json"
"""The layer holding the artifact's modelmint manifest (registry/manifests/NAME/TAG.json, byte for byte): what a pull
without DVC checks every file against."""
CARRIED = "org.modelmint.manifest"
"""The annotation that marks a layer carrying the modelmint manifest under another media type (a ModelPack
artifact's layers must all be ModelPack's own: modelpack.py); its value is MODELMINT_MANIFEST."""


def is_carried_manifest(layer: dict[str, Any]) -> bool:
    """Whether an image manifest's layer descriptor is the modelmint manifest (either way it is carried)."""
    return layer.get("mediaType") == MODELMINT_MANIFEST or (layer.get("annotations") or {}).get(CARRIED) == MODELMINT_MANIFEST


MODELMINT_FILE = "application/vnd.modelmint.file.v1"
"""A file of the artifact directory that the image's own layout has no place for (an Ollama image's Modelfile and
model card), named by `org.opencontainers.image.title`."""
TITLE = "org.opencontainers.image.title"
