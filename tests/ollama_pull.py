"""An `ollama pull` stand-in for the tests: a Python client written from Ollama's Go source, rule by rule.

Pinned in tests/data/ollama_pin.json: ollama/ollama v0.33.0-rc2, commit fb30760996871fa9460115c753afd2c60d4ab0f7
(read with `git show <commit>:<file>`; no Go code is copied). Each rule below cites file:line at that commit; the
code repeats the citation where the rule is applied.

Names (`check_name`):
- types/model/name.go:146-176 ParseNameBare: the tag after the last ':' if it follows the last '/', then model,
  namespace, host (with an optional `scheme://`) cut at the last '/'; name.go:390-396 cutPromised: an empty part
  promised by a separator is "!MISSING!" (invalid); name.go:38-43,201-207 defaults registry.ollama.ai / library /
  latest / https.
- name.go:268-281 IsFullyQualified, :333-342 isValidLen (host 1-350, the others 1-80 bytes), :344-376 isValidPart
  (first character a letter, digit or '_'; then also '-', '_'; '.' everywhere but the namespace; ':' only in the
  host).
- internal/modelref/modelref.go:28-48,69-118: a `:local` or `:cloud` suffix (and a tag ending `-cloud`) is the
  model's source, not its tag; server/model_resolver.go:57-80 then ParseName and IsValid; server/routes.go:66-75,
  1119-1123 and types/errtypes/errtypes.go:11: a refused name is answered "invalid model name".
Manifest (`OllamaPull.pull`):
- server/images.go:1017-1019: an http:// name without --insecure is "insecure protocol http"; images.go:1371-1373:
  --insecure speaks http to the host.
- images.go:1272-1294 pullModelManifest: GET /v2/NAMESPACE/MODEL/manifests/TAG with exactly
  `Accept: application/vnd.docker.distribution.manifest.v2+json` (:1276), decoded into manifest.Manifest
  (manifest/manifest.go:16-20, manifest/layer.go:12-19); an error is "pull model manifest: ..." (images.go:1025).
- images.go:1309-1353 makeRequestWithRetry: 401 answers the bearer challenge (server/auth.go:53-62: only with a
  realm on the request's own host, signed with Ollama's key: not done here), 404 is "file does not exist"
  (os.ErrNotExist), >= 400 is "CODE: BODY"; images.go:1384-1390 the registry's token goes on registry requests only.
- images.go:1027-1032,1127-1135: a manifest with `application/vnd.ollama.image.tensor` layers takes the MLX path
  (not followed here: refused with Ollama's message).
- images.go:1034-1038: the layers, then the config blob, are downloaded in that order (:1049-1071).
Blobs (`_download_blob`):
- server/download.go:476-500: an empty digest is refused; a blob already in MODELS/blobs (manifest/paths.go:40-61:
  `sha256-<hex>`, the digest must match ^sha256[:-][0-9a-fA-F]{64}$) is a cache hit and not verified again.
- download.go:130-185 Prepare: part files `<blob>-partial-N` (JSON N/Offset/Size/Completed, :69-74,410-434) resume
  a download; without them a HEAD of the registry's blob URL (Go's default redirect policy: followed anywhere, up to
  10) gives the size (Content-Length), cut into parts of size/16 clamped to 100 MB..1000 MB (:99-103,158-177).
- download.go:231-275 the direct URL: a GET of the blob URL whose CheckRedirect (:242-256) follows a redirect to the
  same hostname and stops at the first one to another host; errors are retried with a backoff (:192-216) for 30 s;
  a status other than 307 or 200 is "unexpected status code N" (:267-268); the URL is resp.Location() (:270), which
  without a Location header is Go's "http: no Location header in response".
- download.go:277-309,333-398: each part is a GET of the direct URL with `Range: bytes=START-END` through
  http.DefaultClient (:345: no registry credentials), copied into `<blob>-partial` at its offset; a failed try
  sleeps 2^try s (:298) and is retried up to maxRetries = 6 (:31), then "max retries exceeded: ERR" (:307); a body
  cut short keeps its bytes (io.ErrUnexpectedEOF, :351-364); a stalled part (30 s without bytes, :105,382) is
  retried without counting. The response's status is not checked. Done parts: the part files are removed and
  `<blob>-partial` renamed to the blob (:315-328).
- server/images.go:1073-1090,1447-1466 verifyBlob: every downloaded blob's sha256 is its digest, else the file is
  removed and the pull fails "digest mismatch, file must be downloaded again: want D, got D'".
- images.go:1099-1111: the manifest's bytes are written to MODELS/manifests/HOST/NAMESPACE/MODEL/TAG
  (manifest/paths.go:27-38).
Go's net/http under it (the standard library, not Ollama's code): a client follows 301/302/303/307/308 with a
Location (at most 10) unless CheckRedirect says otherwise; Authorization goes only to the first request's host or
its subdomains; gzip is asked for except on HEAD and Range requests; Response.Location() without the header is
ErrNoLocation.
Model (`read_model`, as GetModel reads a pulled model, images.go:677-802):
- images.go:691-706: the config blob decodes into types/model/config.go:4-35 ConfigV2 (encoding/json: keys matched
  exactly, else case-insensitively; unknown keys ignored: reported here; a mistyped value fails the decode).
- images.go:716-787: the layer media types Ollama reads (model, draft, embed, adapter, projector, prompt, template,
  system, params, messages, license; manifest/layer.go:22-23 tensor and draft, manifest/manifest.go:46 json); the
  switch has no default, so other media types are downloaded and ignored (reported; an unknown
  `application/vnd.ollama.image.*` is reported as a problem).
- images.go:760-770: params decode into a map[string]any, which server/routes.go:139-144 applies with
  api/types.go:991-1092 Options.FromMap onto api/types.go:568-596 Options: an unknown key is only a warning
  ("invalid option provided", reported here), a value of the wrong JSON type fails ("option \"K\" must be of type
  integer|boolean|float32|string|array", "... of an array of strings"); JSON numbers are float64 in Go, so an int
  option takes any number (truncated).
- images.go:771-780: messages decode into []api.Message (api/types.go:197-219, roles lower-cased).
"""

from __future__ import annotations

import errno
import hashlib
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

PIN = json.loads((Path(__file__).parent / "data" / "ollama_pin.json").read_text())

MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"  # server/images.go:1276

# server/images.go:716-787 (GetModel's switch), manifest/layer.go:22-23, manifest/manifest.go:46
KNOWN_LAYERS = (
    "application/vnd.ollama.image.model", "application/vnd.ollama.image.draft", "application/vnd.ollama.image.embed",
    "application/vnd.ollama.image.adapter", "application/vnd.ollama.image.projector",
    "application/vnd.ollama.image.prompt", "application/vnd.ollama.image.template",
    "application/vnd.ollama.image.system", "application/vnd.ollama.image.params",
    "application/vnd.ollama.image.messages", "application/vnd.ollama.image.license",
    "application/vnd.ollama.image.tensor", "application/vnd.ollama.image.json",
)
TENSOR_LAYER = "application/vnd.ollama.image.tensor"  # manifest/layer.go:22

# server/download.go:31, 99-103, 105
MAX_RETRIES = 6
NUM_DOWNLOAD_PARTS = 16
MIN_DOWNLOAD_PART_SIZE = 100 * 1000 * 1000  # format.MegaByte is 1000 * 1000
MAX_DOWNLOAD_PART_SIZE = 1000 * 1000 * 1000
STALL_TIMEOUT = 30.0
DIRECT_URL_TIMEOUT = 30.0  # download.go:232


class OllamaPullError(Exception):
    """A pull that `ollama pull` fails too: `ollama` is Ollama's own error text, `detail` what this client adds."""

    def __init__(self, ollama: str, *, detail: str | None = None) -> None:
        super().__init__(ollama + (f" ({detail})" if detail else ""))
        self.ollama = ollama
        self.detail = detail


class InvalidName(OllamaPullError):
    """A name Ollama's pull handler answers "invalid model name"; `problems` says which part and why."""

    def __init__(self, name: str, problems: list[str]) -> None:
        super().__init__("invalid model name", detail=f"{name!r}: {'; '.join(problems)}")
        self.name = name
        self.problems = problems


# ---------------------------------------------------------------- names: types/model/name.go


MISSING = "!MISSING!"  # name.go:36


@dataclass(frozen=True)
class Name:
    host: str
    namespace: str
    model: str
    tag: str
    scheme: str = "https"

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"


def _cut_promised(s: str, sep: str) -> tuple[str, str, bool]:
    # name.go:378-396 cutLast + cutPromised: an empty side of a separator that is there is MissingPart
    i = s.rfind(sep)
    if i < 0:
        return s, "", False
    return s[:i] or MISSING, s[i + len(sep):] or MISSING, True


def parse_name(s: str) -> Name:
    """ParseName: ParseNameBare merged with the defaults (name.go:140-176, 199-207)."""
    host = namespace = tag = scheme = ""
    if s.rfind(":") > s.rfind("/"):  # name.go:151-153: '/' is not a tag character
        s, tag, _ = _cut_promised(s, ":")
    s, model, promised = _cut_promised(s, "/")  # name.go:155-159
    if not promised:
        model = s
    else:
        s, namespace, promised = _cut_promised(s, "/")  # name.go:161-165
        if not promised:
            namespace = s
        else:
            scheme, sep, host = s.partition("://")  # name.go:167-173
            if not sep:
                scheme, host = "", s
    # name.go:38-43, 201-207: cmp.Or with registry.ollama.ai / library / latest / https
    return Name(host or "registry.ollama.ai", namespace or "library", model, tag or "latest", scheme or "https")


_KINDS = ("host", "namespace", "model", "tag")


def part_problem(kind: str, s: str) -> str | None:
    """Why isValidPart refuses `s` as a `kind` part, or None (name.go:333-376)."""
    most = 350 if kind == "host" else 80  # name.go:333-342 isValidLen, in bytes (Go's len)
    size = len(s.encode())
    if not 1 <= size <= most:
        return f"the {kind} has {size} characters (1 to {most})"
    if s == MISSING:
        return f"the {kind} is missing"
    for i, ch in enumerate(s):  # name.go:348-370 (bytes: a non-ASCII byte is never alphanumeric)
        word = ch.isascii() and (ch.isalnum() or ch == "_")  # name.go:374-376
        if i == 0:
            if not word:
                return f"the {kind} starts with {ch!r} (a letter, digit or '_' must come first)"
        elif ch == "." and kind == "namespace":
            return "the namespace has a '.' (allowed in the host, model and tag, not the namespace)"
        elif ch == ":" and kind != "host":
            return f"the {kind} has a ':' (only the host may)"
        elif not word and ch not in "-_.:":
            return f"the {kind} has {ch!r}"
    return None


def name_problems(name: Name) -> list[str]:
    """IsFullyQualified (name.go:268-281): every part checked, each refusal said."""
    return [p for kind in _KINDS if (p := part_problem(kind, getattr(name, kind))) is not None]


def _source_suffix(raw: str) -> tuple[str, str | None]:
    # internal/modelref/modelref.go:99-118: ':cloud' / ':local', or a last part ending '-cloud'
    i = raw.rfind(":")
    if i >= 0:
        suffix_raw = raw[i + 1:].strip()
        suffix = suffix_raw.lower()
        if suffix in ("cloud", "local"):
            return raw[:i], suffix
        if "/" not in suffix_raw and suffix.endswith("-cloud"):
            return raw[:i + 1] + suffix_raw[:-len("-cloud")], "cloud"
    return raw, None


def check_name(raw: str) -> Name:
    """The name `ollama pull RAW` pulls, as the pull handler resolves it (server/routes.go:1119-1123,
    server/model_resolver.go:57-80).

    Raises:
        OllamaPullError: "model is required", or both :local and :cloud (modelref.go:17-20, 28-48).
        InvalidName: a part Ollama refuses ("invalid model name", routes.go:66-75).
    """
    raw = raw.strip()  # modelref.go:31-34
    if not raw:
        raise OllamaPullError("model is required")
    base, source = _source_suffix(raw)
    if source is not None and _source_suffix(base)[1] is not None:  # modelref.go:37-41
        raise OllamaPullError(f"use either :local or :cloud, not both: {raw!r}")
    if source == "cloud":  # modelref.go:69-88: the legacy cloud names
        base = base + ("-cloud" if base.rfind(":") > base.rfind("/") else ":cloud")
    name = parse_name(base)
    problems = name_problems(name)
    if problems:
        raise InvalidName(raw, problems)
    return name


# ---------------------------------------------------------------- Go's encoding/json into Ollama's structs

_STRUCTS: dict[str, dict[str, str]] = {
    # manifest/manifest.go:16-20, manifest/layer.go:12-19 (Status is `json:"-"`)
    "Manifest": {"schemaVersion": "int", "mediaType": "string", "config": "Layer", "layers": "[]Layer"},
    "Layer": {"mediaType": "string", "digest": "string", "size": "int64", "from": "string", "name": "string"},
    # types/model/config.go:4-35
    "ConfigV2": {"model_format": "string", "model_family": "string", "model_families": "[]string",
                 "model_type": "string", "file_type": "string", "renderer": "string", "parser": "string",
                 "requires": "string", "remote_host": "string", "remote_model": "string",
                 "capabilities": "[]string", "context_length": "int", "embedding_length": "int",
                 "base_name": "string", "draft": "*Draft", "architecture": "string", "os": "string"},
    "Draft": {"model_format": "string", "architecture": "string", "tensor_prefix": "string", "config": "string"},
    # api/types.go:197-207 (images: []ImageData, tool_calls: []ToolCall, checked as arrays only)
    "Message": {"role": "string", "content": "string", "thinking": "string", "images": "[]any",
                "tool_calls": "[]any", "tool_name": "string", "tool_call_id": "string"},
}


def _json_kind(v: Any, gotype: str = "") -> str:
    # encoding/json's UnmarshalTypeError.Value: a number names its literal only where a number was wanted
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return f"number {json.dumps(v)}" if gotype in ("int", "int64") else "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


# the Go packages of those structs, as reflect's Type.String() names them in encoding/json's errors
_PACKAGES = {"Manifest": "manifest", "Layer": "manifest", "ConfigV2": "model", "Draft": "model", "Message": "api"}


def _go_type(gotype: str) -> str:
    elem = gotype.lstrip("[]*")
    return gotype[:len(gotype) - len(elem)] + (f"{_PACKAGES[elem]}.{elem}" if elem in _PACKAGES else elem)


def go_decode(value: Any, gotype: str, *, path: tuple[str, ...] = (), struct: str = "", root: str = "",
              unknown: list[str] | None = None) -> Any:
    """`value` (parsed JSON) as encoding/json decodes it into `gotype`; keys no field takes go to `unknown`
    (ROOT.path.key).

    Raises:
        OllamaPullError: a value of the wrong JSON type (Go's "json: cannot unmarshal ..." message).
    """
    unknown = unknown if unknown is not None else []
    root = root or gotype.lstrip("[]*")
    again = {"struct": struct, "root": root, "unknown": unknown}

    def refuse() -> OllamaPullError:
        where = (f"Go struct field {struct}.{'.'.join(path)}" if path else "Go value")
        return OllamaPullError(f"json: cannot unmarshal {_json_kind(value, gotype)} into {where} of type "
                               f"{_go_type(gotype)}")

    if value is None:  # null leaves a Go value as it is (its zero value here)
        return None
    if gotype == "any" or (gotype == "[]any" and isinstance(value, list)):
        return value
    if gotype == "string":
        if not isinstance(value, str):
            raise refuse()
        return value
    if gotype in ("int", "int64"):  # a number with a fraction or an exponent does not fit an int
        if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
            raise refuse()
        return value
    if gotype.startswith("[]"):
        if not isinstance(value, list):
            raise refuse()
        return [go_decode(v, gotype[2:], path=path, **again) for v in value]
    if gotype.startswith("*"):  # a pointer's errors name the type it points at
        return go_decode(value, gotype[1:], path=path, **again)
    fields = _STRUCTS[gotype]
    if not isinstance(value, dict):
        raise refuse()
    out: dict[str, Any] = {}
    for key, v in value.items():
        # encoding/json: the field whose name is the key, else one whose name equals it case-insensitively
        name = key if key in fields else next((f for f in fields if f.lower() == key.lower()), None)
        if name is None:
            unknown.append(".".join((root, *path, key)))
            continue
        out[name] = go_decode(v, fields[name], path=(*path, name), struct=gotype, root=root, unknown=unknown)
    return out


# api/types.go:568-596 Options (with Runner embedded): the JSON names and their Go kinds
OPTIONS: dict[str, str] = {
    "num_ctx": "int", "num_batch": "int", "num_gpu": "int", "main_gpu": "*int", "use_mmap": "*bool",
    "num_thread": "int", "draft_num_predict": "int",
    "num_keep": "int", "seed": "int", "num_predict": "int", "top_k": "int", "top_p": "float32", "min_p": "float32",
    "typical_p": "float32", "repeat_last_n": "int", "temperature": "float32", "repeat_penalty": "float32",
    "presence_penalty": "float32", "frequency_penalty": "float32", "stop": "[]string",
}


def apply_options(params: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """api.Options.FromMap (api/types.go:991-1092) of a params map: the typed options, unknown keys warned about.

    Raises:
        OllamaPullError: a value of the wrong type, with FromMap's message.
    """
    out: dict[str, Any] = {}
    for key, val in params.items():
        kind = OPTIONS.get(key)
        if kind is None:  # api/types.go:1005-1009
            warnings.append(f"invalid option provided: {key}")
            continue
        if val is None:  # api/types.go:1013-1015
            continue
        number = isinstance(val, int | float) and not isinstance(val, bool)  # JSON numbers are float64 in Go
        if kind in ("int", "*int"):  # api/types.go:1018-1027, 1071-1081
            if not number:
                raise OllamaPullError(f'option "{key}" must be of type integer')
            out[key] = int(val)  # int64(float64): truncated
        elif kind in ("*bool",):  # api/types.go:1065-1070
            if not isinstance(val, bool):
                raise OllamaPullError(f'option "{key}" must be of type boolean')
            out[key] = val
        elif kind == "float32":  # api/types.go:1034-1040
            if not number:
                raise OllamaPullError(f'option "{key}" must be of type float32')
            out[key] = float(val)
        else:  # "[]string", api/types.go:1047-1062
            if not isinstance(val, list):
                raise OllamaPullError(f'option "{key}" must be of type array')
            if not all(isinstance(s, str) for s in val):
                raise OllamaPullError(f'option "{key}" must be of an array of strings')
            out[key] = list(val)
    return out


# ---------------------------------------------------------------- HTTP as Go's net/http client does it


@dataclass(frozen=True)
class Hop:
    """One HTTP request the client made, as the server saw it."""

    method: str
    url: str
    status: int | None
    """None: no response (the connection failed)."""
    authorization: bool
    accept: str | None = None
    range: str | None = None
    location: str | None = None
    error: str | None = None

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc


def _go_error(method: str, url: str, err: Exception) -> str:
    """A transport error as Go's *url.Error prints it: `Get "URL": dial tcp HOST:PORT: connect: connection refused`."""
    parts = urlsplit(url)
    text = str(err)
    if isinstance(err, httpx.ConnectError) and ("refused" in text.lower() or f"[Errno {errno.ECONNREFUSED}]" in text):
        text = f"dial tcp {parts.netloc}: connect: connection refused"
    return f'{method[:1]}{method[1:].lower()} "{url}": {text}'


_USE_LAST = object()


class _Transport:
    """Go's http.Client.Do over httpx: redirects followed by Go's rules, every hop logged."""

    def __init__(self, log: list[Hop], timeout: float) -> None:
        self.log = log
        self.http = httpx.Client(follow_redirects=False, timeout=timeout)
        del self.http.headers["Accept"]  # Go sends no Accept unless asked (images.go:1380-1382 sets the caller's)
        del self.http.headers["Accept-Encoding"]  # set per request below, as Go's Transport does

    def close(self) -> None:
        self.http.close()

    def do(self, method: str, url: str, headers: dict[str, str],
           check_redirect: Callable[[str, list[str]], object | None] | None) -> tuple[httpx.Response, str]:
        """The response (streamed, for the caller to close) and the URL that answered it.

        Raises:
            OllamaPullError: the connection failed, or check_redirect refused a redirect.
        """
        via: list[str] = []
        first_host = urlsplit(url).hostname
        while True:
            sent = dict(headers)
            if "Range" not in sent and method != "HEAD":  # net/http transport.go: gzip asked for, then decoded
                sent["Accept-Encoding"] = "gzip"
            # net/http client.go shouldCopyHeaderOnRedirect: Authorization only to the same host or a subdomain
            dest = urlsplit(url).hostname or ""
            if via and not (dest == first_host or dest.endswith("." + (first_host or ""))):
                sent.pop("Authorization", None)
            try:
                resp = self.http.send(self.http.build_request(method, url, headers=sent), stream=True)
            except httpx.HTTPError as err:
                self.log.append(Hop(method, url, None, "Authorization" in sent, sent.get("Accept"),
                                    sent.get("Range"), error=str(err)))
                raise OllamaPullError(_go_error(method, url, err)) from err
            location = resp.headers.get("location")
            self.log.append(Hop(method, url, resp.status_code, "Authorization" in sent, sent.get("Accept"),
                                sent.get("Range"), location))
            # net/http client.go redirectBehavior: 301/302/303/307/308 with a Location (GET and HEAD keep their method)
            if resp.status_code not in (301, 302, 303, 307, 308) or not location:
                return resp, url
            nxt = urljoin(url, location)
            via.append(url)
            if check_redirect is None:  # net/http defaultCheckRedirect
                verdict = "stopped after 10 redirects" if len(via) >= 10 else None
            else:
                verdict = check_redirect(nxt, via)
            if verdict is _USE_LAST:  # http.ErrUseLastResponse: the redirect itself is the answer
                return resp, url
            resp.close()
            if verdict is not None:
                raise OllamaPullError(_go_error(method, nxt, Exception(str(verdict))))
            url = nxt  # each hop starts again from the first request's headers (net/http makeHeadersCopier)


# ---------------------------------------------------------------- the pull


@dataclass(frozen=True)
class Progress:
    """api.ProgressResponse as PullModel reports it (status, digest, total, completed)."""

    status: str
    digest: str = ""
    total: int = 0
    completed: int = 0


@dataclass
class OllamaModel:
    """A pulled model as GetModel reads it (images.go:677-802)."""

    config: dict[str, Any]
    template: str | None = None
    system: str | None = None
    params: dict[str, Any] | None = None
    """The params blob as the map Ollama decodes it into."""
    options: dict[str, Any] = field(default_factory=dict)
    """The params after Options.FromMap: what a request to this model runs with."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    licenses: list[str] = field(default_factory=list)
    model_path: Path | None = None
    ignored: list[str] = field(default_factory=list)
    """Media types Ollama downloads and does not read (GetModel's switch has no default)."""
    problems: list[str] = field(default_factory=list)
    """What Ollama would accept silently but is not what `ollama create` writes: unknown config fields, unknown
    options, unknown `application/vnd.ollama.image.*` layers, text layers that are not UTF-8."""


@dataclass
class Pulled:
    name: Name
    manifest: dict[str, Any]
    manifest_data: bytes
    blobs: dict[str, Path]
    cache_hits: set[str]
    model: OllamaModel


@dataclass
class _Part:
    n: int
    offset: int
    size: int
    completed: int = 0

    def to_json(self) -> str:  # jsonBlobDownloadPart has no tags: Go's field names (download.go:69-83)
        return json.dumps({"N": self.n, "Offset": self.offset, "Size": self.size, "Completed": self.completed}) + "\n"


class OllamaPull:
    """`ollama pull` into `models` (OLLAMA_MODELS: blobs/ and manifests/), by Ollama's rules.

    `token` is a registry bearer token (regOpts.Token). `sleep` and `direct_url_timeout` replace time.sleep and
    the 30 s limit of the direct-URL step, and `min_part_size` Ollama's 100 MB, so a test can run the retry and
    part logic in milliseconds on small blobs; the defaults are Ollama's. Ollama downloads a blob's parts
    concurrently; they go one after the other here, each with the same requests."""

    def __init__(self, models: Path, *, insecure: bool = False, token: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, direct_url_timeout: float = DIRECT_URL_TIMEOUT,
                 min_part_size: int = MIN_DOWNLOAD_PART_SIZE, progress: Callable[[Progress], None] | None = None,
                 check: Callable[[dict[str, Any], dict[str, Path]], object] | None = None) -> None:
        self.models = models
        self.check = check
        """Called with the image manifest (as sent: its JSON, annotations kept) and the verified blobs before the manifest is written (before the model is handed
        to Ollama): modelmint's signature check (signing.verify_image); what it raises fails the pull, and Ollama
        then has no model of that name. Not Ollama's: its pull verifies digests only."""
        self.insecure = insecure
        self.token = token
        self.sleep = sleep
        self.direct_url_timeout = direct_url_timeout
        self.min_part_size = min_part_size
        self.progress = progress or (lambda p: None)
        self.log: list[Hop] = []
        """Every request of every pull, in order."""

    # -- paths: manifest/paths.go

    def blob_path(self, digest: str) -> Path:
        """manifest/paths.go:40-61 BlobsPath.

        Raises:
            OllamaPullError: "invalid digest format".
        """
        if not re.fullmatch(r"sha256[:-][0-9a-fA-F]{64}", digest):
            raise OllamaPullError("invalid digest format", detail=digest)
        path = self.models / "blobs" / digest.replace(":", "-")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def manifest_path(self, n: Name) -> Path:
        return self.models / "manifests" / n.host / n.namespace / n.model / n.tag  # manifest/paths.go:27-38

    # -- requests: server/images.go

    def _base(self, n: Name) -> str:
        scheme = "http" if self.insecure else n.scheme  # images.go:1371-1373
        return f"{scheme}://{n.host}"

    def _registry(self, transport: _Transport, method: str, url: str, headers: dict[str, str] | None = None,
                  check_redirect: Callable[[str, list[str]], object | None] | None = None) -> httpx.Response:
        """makeRequestWithRetry (images.go:1309-1353) over makeRequest (images.go:1370-1412).

        Raises:
            OllamaPullError: the request failed, 404 ("file does not exist"), another status >= 400, or a 401.
        """
        sent = dict(headers or {})
        if self.token:  # images.go:1384-1390
            sent["Authorization"] = f"Bearer {self.token}"
        # images.go:1392; go.mod at the pin asks for go 1.26.0
        sent["User-Agent"] = f"ollama/{PIN['version'].lstrip('v')} (amd64 linux) Go/go1.26.0"
        resp, _ = transport.do(method, url, sent, check_redirect)
        if resp.status_code == 401:
            resp.close()
            challenge = resp.headers.get("www-authenticate", "")
            realm = re.search(r'realm="([^"]*)"', challenge)
            realm_host = urlsplit(realm.group(1)).netloc if realm else ""
            if realm_host != urlsplit(url).netloc:  # server/auth.go:59-62
                raise OllamaPullError(f'realm host "{realm_host}" does not match original host '
                                      f'"{urlsplit(url).netloc}"')
            raise OllamaPullError("unauthorized: access denied",
                                  detail="Ollama signs its token request with its own key (server/auth.go); this "
                                  "client does not")
        if resp.status_code == 404:
            resp.close()
            raise OllamaPullError("file does not exist")
        if resp.status_code >= 400:
            body = resp.read().decode(errors="replace")
            resp.close()
            raise OllamaPullError(f"{resp.status_code}: {body}")
        return resp

    def pull(self, raw: str) -> Pulled:
        """PullModel (images.go:998-1125): the manifest, every blob, verification, the manifest written; then the
        model read as GetModel reads it for `ollama show` / `ollama run` (whose refusals are Ollama's at load time).

        Raises:
            InvalidName, OllamaPullError: as Ollama fails, with its message.
        """
        n = check_name(raw)
        if n.scheme == "http" and not self.insecure:  # images.go:1017-1019
            raise OllamaPullError("insecure protocol http")
        registry = _Transport(self.log, timeout=STALL_TIMEOUT)
        target = _Transport(self.log, timeout=STALL_TIMEOUT)  # http.DefaultClient: no credentials (download.go:345)
        try:
            self.progress(Progress("pulling manifest"))
            url = f"{self._base(n)}/v2/{n.namespace}/{n.model}/manifests/{n.tag}"  # images.go:1273
            try:
                resp = self._registry(registry, "GET", url, {"Accept": MANIFEST_ACCEPT})  # images.go:1275-1277
                data = resp.read()
                resp.close()
                try:
                    parsed = json.loads(data)
                except json.JSONDecodeError as err:  # encoding/json's SyntaxError says less: its opening words
                    cut = err.pos >= len(err.doc.rstrip())
                    raise OllamaPullError("unexpected end of JSON input" if cut else "invalid character",
                                          detail=str(err)) from err
                mf = go_decode(parsed, "Manifest")
            except OllamaPullError as err:  # images.go:1024-1026
                raise OllamaPullError(f"pull model manifest: {err.ollama}", detail=err.detail) from err
            layers = [*(mf.get("layers") or [])]
            if any(x.get("mediaType") == TENSOR_LAYER for x in layers):  # images.go:1027-1032
                raise OllamaPullError("this model requires MLX support, but the MLX runtime is not available",
                                      detail="the MLX path (x/transfer) is not followed by this client")
            if (mf.get("config") or {}).get("digest"):  # images.go:1034-1038
                layers.append(mf["config"])
            hits: dict[str, bool] = {}
            blobs: dict[str, Path] = {}
            for layer in layers:  # images.go:1049-1071
                digest = layer.get("digest") or ""
                hit = self._download_blob(registry, target, n, digest)
                hits[digest] = hits.get(digest, True) and hit
                blobs[digest] = self.blob_path(digest)
            self.progress(Progress("verifying sha256 digest"))
            for digest, hit in hits.items():  # images.go:1073-1090
                if not hit:
                    self._verify(digest)
            if self.check is not None:
                self.check(parsed, blobs)
            self.progress(Progress("writing manifest"))
            path = self.manifest_path(n)  # images.go:1099-1111
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            self.progress(Progress("success"))
        finally:
            registry.close()
            target.close()
        return Pulled(n, parsed, data, blobs, {d for d, h in hits.items() if h}, read_model(mf, blobs))

    def _verify(self, digest: str) -> None:
        """verifyBlob (images.go:1447-1466); a mismatch removes the file (images.go:1079-1088).

        Raises:
            OllamaPullError: "digest mismatch, file must be downloaded again: want D, got D'".
        """
        path = self.blob_path(digest)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        got = "sha256:" + h.hexdigest()
        if got != digest:
            path.unlink(missing_ok=True)
            raise OllamaPullError(f"digest mismatch, file must be downloaded again: want {digest}, got {got}")

    # -- one blob: server/download.go

    def _download_blob(self, registry: _Transport, target: _Transport, n: Name, digest: str) -> bool:
        """downloadBlob (download.go:476-517): whether the blob was there already (a cache hit).

        Raises:
            OllamaPullError: as Ollama's download fails.
        """
        if not digest:  # download.go:477-479
            raise OllamaPullError(f"{n.namespace}/{n.model}: digest is empty")
        path = self.blob_path(digest)
        if path.exists():  # download.go:486-500
            size = path.stat().st_size
            self.progress(Progress(f"pulling {digest[7:19]}", digest, size, size))
            return True
        url = f"{self._base(n)}/v2/{n.namespace}/{n.model}/blobs/{digest}"  # download.go:505-506
        parts = self._prepare(registry, url, path)
        total = sum(p.size for p in parts)
        self.progress(Progress(f"pulling {digest[7:19]}", digest, total, sum(p.completed for p in parts)))
        self._run(registry, target, url, path, parts, digest)
        return False

    def _prepare(self, registry: _Transport, url: str, path: Path) -> list[_Part]:
        """Prepare (download.go:130-185): the parts, from the part files or a HEAD."""
        parts = []
        for p in sorted(path.parent.glob(path.name + "-partial-*")):  # download.go:131-147
            j = json.loads(p.read_text())
            parts.append(_Part(j["N"], j["Offset"], j["Size"], j["Completed"]))
        if parts:
            return sorted(parts, key=lambda p: p.n)
        resp = self._registry(registry, "HEAD", url)  # download.go:150-156: regOpts without CheckRedirect
        resp.close()
        try:
            total = int(resp.headers.get("content-length", ""))
        except ValueError:
            total = 0  # strconv.ParseInt's error is ignored
        size = min(max(total // NUM_DOWNLOAD_PARTS, self.min_part_size), MAX_DOWNLOAD_PART_SIZE)  # :158-164
        offset = 0
        while offset < total:  # download.go:166-177
            size = min(size, total - offset)
            part = _Part(len(parts), offset, size)
            Path(f"{path}-partial-{part.n}").write_text(part.to_json())  # download.go:400-408
            parts.append(part)
            offset += size
        return parts

    def _direct_url(self, registry: _Transport, url: str) -> str:
        """download.go:231-275: the redirect the registry answers the blob GET with.

        Raises:
            OllamaPullError: "unexpected status code N", "http: no Location header in response", or "context
                deadline exceeded" when the registry failed for 30 s.
        """
        same = urlsplit(url).hostname

        def check_redirect(nxt: str, via: list[str]) -> object | None:  # download.go:242-256
            if len(via) > 10:
                return "maximum redirects exceeded (10) for directURL"
            if urlsplit(nxt).hostname == same:  # req.URL.Hostname(): the port does not count
                return None
            return _USE_LAST

        deadline = time.monotonic() + self.direct_url_timeout
        tries = 0
        while True:
            try:
                resp = self._registry(registry, "GET", url, check_redirect=check_redirect)
            except OllamaPullError as err:  # download.go:259-264, backoff :192-216
                tries += 1
                delay = min(tries * tries * 0.01, 10.0) * (random.random() + 0.5)
                if time.monotonic() + delay >= deadline:
                    raise OllamaPullError("context deadline exceeded",
                                          detail=f"failed to get direct URL: {err}") from err
                self.sleep(delay)
                continue
            resp.close()
            if resp.status_code not in (307, 200):  # download.go:267-268
                raise OllamaPullError(f"unexpected status code {resp.status_code}")
            location = resp.headers.get("location")
            if not location:  # download.go:270: resp.Location() is http.ErrNoLocation
                raise OllamaPullError("http: no Location header in response",
                                      detail=f"GET {url} answered {resp.status_code} without a redirect")
            return urljoin(str(resp.request.url), location)

    def _run(self, registry: _Transport, target: _Transport, url: str, path: Path, parts: list[_Part],
             digest: str) -> None:
        """run (download.go:218-331): the direct URL, then each unfinished part, then the blob renamed in place."""
        partial = Path(f"{path}-partial")
        with open(partial, "a+b") as f:  # download.go:222-229: O_CREATE|O_RDWR, truncated to the total
            f.truncate(sum(p.size for p in parts))
        direct = self._direct_url(registry, url)
        total = sum(p.size for p in parts)
        for part in parts:  # download.go:279-309
            if part.completed == part.size:
                continue
            try_ = 0
            err: OllamaPullError | None = None
            while try_ < MAX_RETRIES:
                err = self._chunk(target, direct, partial, path, part)
                if err is None:
                    break
                if err.ollama == "part stalled":  # download.go:294-296
                    continue
                self.sleep(float(2 ** try_))  # download.go:297-301
                try_ += 1
            else:
                raise OllamaPullError(f"max retries exceeded: {err.ollama if err else ''}")  # download.go:307
            self.progress(Progress(f"pulling {digest[7:19]}", digest, total, sum(p.completed for p in parts)))
        for part in parts:  # download.go:315-328
            Path(f"{path}-partial-{part.n}").unlink()
        partial.rename(path)

    def _chunk(self, target: _Transport, direct: str, partial: Path, path: Path, part: _Part) -> OllamaPullError | None:
        """downloadChunk (download.go:333-398): one Range GET of the part's missing bytes; None when it is done."""
        start, stop = part.offset + part.completed, part.offset + part.size
        want = stop - start
        try:
            resp, _ = target.do("GET", direct, {"Range": f"bytes={start}-{stop - 1}"}, None)  # download.go:344-345
        except OllamaPullError as err:
            return err
        got = bytearray()
        cut: Exception | None = None
        try:
            for chunk in resp.iter_raw():  # io.CopyN(w, body, want): the status is not looked at
                got += chunk
                if len(got) >= want:
                    break
        except httpx.ReadTimeout:
            resp.close()
            return OllamaPullError("part stalled")  # download.go:382-389
        except httpx.HTTPError as err:  # a body cut short: io.ErrUnexpectedEOF, resumable
            cut = err
        finally:
            resp.close()
        got = got[:want]
        with open(partial, "r+b") as f:  # io.NewOffsetWriter(file, part.StartsAt())
            f.seek(start)
            f.write(got)
        if cut is None and len(got) < want:  # io.EOF: the progress is rolled back (download.go:351-356)
            return OllamaPullError("EOF")
        part.completed += len(got)  # download.go:358-361
        Path(f"{path}-partial-{part.n}").write_text(part.to_json())
        return OllamaPullError("unexpected EOF", detail=str(cut)) if cut is not None else None


# ---------------------------------------------------------------- reading the pulled model: GetModel


def _text(data: bytes, what: str, problems: list[str]) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        problems.append(f"the {what} layer is not UTF-8")
        return data.decode(errors="replace")


def read_model(manifest: dict[str, Any], blobs: dict[str, Path]) -> OllamaModel:
    """The pulled model as GetModel reads it (images.go:677-802): config, template, system, params, messages,
    licenses; what Ollama ignores or accepts silently is reported, what it refuses raises.

    Raises:
        OllamaPullError: a config, params or messages blob that Ollama fails to decode, or params whose types
            Options.FromMap refuses.
    """
    problems: list[str] = []
    unknown: list[str] = []
    config: dict[str, Any] = {}
    digest = (manifest.get("config") or {}).get("digest")
    if digest:  # images.go:691-706
        config = go_decode(_first_json(blobs[digest].read_bytes()), "ConfigV2", unknown=unknown)
    model = OllamaModel(config)
    for layer in manifest.get("layers") or []:  # images.go:710-788
        kind, data = layer.get("mediaType") or "", blobs[layer["digest"]].read_bytes()
        if kind == "application/vnd.ollama.image.model":
            model.model_path = blobs[layer["digest"]]
        elif kind in ("application/vnd.ollama.image.prompt", "application/vnd.ollama.image.template"):
            model.template = _text(data, "template", problems)
        elif kind == "application/vnd.ollama.image.system":
            model.system = _text(data, "system", problems)
        elif kind == "application/vnd.ollama.image.params":  # images.go:760-770
            params = _first_json(data)
            if params is not None and not isinstance(params, dict):
                raise OllamaPullError(f"json: cannot unmarshal {_json_kind(params)} into Go value of type "
                                      "map[string]interface {}")
            model.params = params or {}
            model.options = apply_options(model.params, problems)  # server/routes.go:139-144
        elif kind == "application/vnd.ollama.image.messages":  # images.go:771-780
            msgs = go_decode(_first_json(data), "[]Message", unknown=unknown) or []
            model.messages = [{**m, "role": (m.get("role") or "").lower()} for m in msgs]  # api/types.go:209-219
        elif kind == "application/vnd.ollama.image.license":
            model.licenses.append(_text(data, "license", problems))
        elif kind not in KNOWN_LAYERS:
            model.ignored.append(kind)
            if kind.startswith("application/vnd.ollama.image."):
                problems.append(f"layer {layer['digest']} has {kind}, a media type Ollama does not know")
    problems += [f"unknown field {u} (Ollama ignores it)" for u in unknown]
    model.problems = problems
    return model


def _first_json(data: bytes) -> Any:
    """json.NewDecoder(r).Decode: the first JSON value of the stream (what follows it is not read).

    Raises:
        OllamaPullError: the stream does not start with a JSON value.
    """
    text = data.decode(errors="replace")  # encoding/json replaces invalid UTF-8 with U+FFFD
    try:
        value, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError as err:
        raise OllamaPullError(f"invalid JSON: {err}") from err
    return value

