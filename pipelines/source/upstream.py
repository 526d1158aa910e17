"""What moved upstream: each tracked ref's commit on the hub against the catalog's pin, and which files changed."""

from __future__ import annotations

import fnmatch
import json
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipelines.core.errors import ConfigError, ModelmintError, SourceError
from pipelines.core.settings import Settings
from pipelines.core.sourcefiles import CHAT_TEMPLATE_FILES, GENERATION_CONFIG, TOKENIZER_FILES
from pipelines.core.steps import content_key
from pipelines.source.catalog import Catalog, CatalogEntry, HubSource
from pipelines.source.fetch import ALLOW_PATTERNS, CODE_PATTERNS, hub_errors

FileKind = Literal["weights", "tokenizer", "chat template", "generation config", "config", "other"]

METADATA_KINDS: frozenset[FileKind] = frozenset({"chat template", "generation config"})
"""What a build writes into the GGUF's metadata and copies into a compressed checkpoint without reading the weights:
a commit that changes only these (and files the build does not download) rebuilds no weights."""

# First match wins: chat_template inside tokenizer_config.json is a tokenizer change too (the listing cannot
# tell which key changed), so only the template's own files count as "chat template".
_KINDS: tuple[tuple[FileKind, tuple[str, ...]], ...] = (
    ("weights", ("*.safetensors", "model.safetensors.index.json", "*.bin", "*.pt", "*.pth", "*.gguf")),
    ("chat template", (*CHAT_TEMPLATE_FILES, "additional_chat_templates/*")),
    ("generation config", (GENERATION_CONFIG,)),
    ("tokenizer", (*TOKENIZER_FILES, "*.tiktoken")),
    ("config", ("config.json", "*.py")),
)


_TOKENIZER_CONFIG = "tokenizer_config.json"
_GENERATION_CONFIG = "generation_config.json"


def _fetched(path: str) -> bool:
    """Whether the build downloads this repo file (fetch's allow-list; code files count, trusted or refused)."""
    return "/" not in path and any(fnmatch.fnmatchcase(path, g) for g in (*ALLOW_PATTERNS, *CODE_PATTERNS))


def classify(path: str) -> FileKind:
    """Which part of a model a repo file is (weights, tokenizer, chat template, generation config, config)."""
    return next((kind for kind, globs in _KINDS if any(fnmatch.fnmatchcase(path, g) for g in globs)), "other")


def weights_key(root: Path, files: Mapping[str, str], *, generation_read: Collection[str] = ()) -> str:
    """A content key over `files` (relpath → sha256 under `root`) that ignores what a build only copies into its
    output's metadata: the chat template (its own files and the `chat_template` key of tokenizer_config.json) and
    generation_config.json but for the keys `generation_read` (those a build reads for more than metadata). Two
    commits with one key hold the same weights, tokenizer and config."""
    parts = []
    for name, sha in sorted(files.items()):
        if classify(name) == "chat template" or (name == _GENERATION_CONFIG and not generation_read):
            continue
        if name in (_TOKENIZER_CONFIG, _GENERATION_CONFIG):
            config = json.loads((root / name).read_text(encoding="utf-8"))
            if isinstance(config, dict):
                config = ({k: v for k, v in config.items() if k != "chat_template"} if name == _TOKENIZER_CONFIG
                          else {k: v for k, v in config.items() if k in generation_read})
            sha = content_key(json.dumps(config, sort_keys=True))
        parts.append((name, sha))
    return content_key("weights", parts)


@dataclass(frozen=True)
class FileChange:
    path: str
    kind: FileKind
    change: Literal["added", "removed", "modified"]


@dataclass(frozen=True)
class Movement:
    """One tracked entry: its pin and the tracked ref's current commit, and the files that differ between them."""

    name: str
    repo: str
    ref: str
    pinned: str | None
    head: str
    changes: tuple[FileChange, ...] = ()

    @property
    def moved(self) -> bool:
        return self.head != self.pinned

    @property
    def kinds(self) -> list[FileKind]:
        return sorted({c.kind for c in self.changes})

    @property
    def rebuilds_weights(self) -> bool:
        """Whether the new commit changes a file the build reads other than the chat template and the generation
        config. False: the GGUFs already built get the new metadata written into them and the compressed
        checkpoints get the new files copied in; no converter, quantizer, imatrix or llmcompressor runs
        (pipelines/gguf/retemplate.py)."""
        return self.pinned is None or any(c.kind not in METADATA_KINDS and _fetched(c.path) for c in self.changes)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "repo": self.repo, "ref": self.ref, "pinned": self.pinned, "head": self.head,
                "moved": self.moved, "rebuilds_weights": self.rebuilds_weights, "kinds": self.kinds,
                "changes": [{"path": c.path, "kind": c.kind, "change": c.change} for c in self.changes]}


class RateLimit:
    """At most one hub call per `interval_s` seconds across threads: a watcher of many models stays polite."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self._next > now:
                time.sleep(self._next - now)
            self._next = max(now, self._next) + self.interval_s


def tracked(catalog: Catalog, names: Iterable[str] = ()) -> list[CatalogEntry]:
    """The entries to watch: `names` (each must exist and track a ref), or every entry that tracks one.

    Raises:
        CatalogEntryNotFound: a name the catalog does not hold.
        ConfigError: a named entry that tracks no ref.
    """
    wanted = [catalog.get(n) for n in dict.fromkeys(names)]
    for e in wanted:
        if not (isinstance(e.source, HubSource) and e.source.track):
            raise ConfigError(f"{e.name} tracks no upstream ref",
                              hint=f"add `track: main` (or a tag) under source of {e.name} in registry/catalog.yaml")
    return wanted or [e for e in catalog.models if isinstance(e.source, HubSource) and e.source.track]


def check(entry: CatalogEntry, settings: Settings, *, limit: RateLimit | None = None,
          timeout: float | None = None) -> Movement:
    """Resolve `entry`'s tracked ref on the hub and compare it with the pin (file listings at both commits).

    Raises:
        SourceError: the ref does not exist, access is refused (401/403), the repo is gone, or the pin is a commit
            the ref's history never contained.
        HubUnavailable: 5xx, 429, a timeout or no connection (transient: the next tick tries again).
    """
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RevisionNotFoundError

    source = entry.source
    assert isinstance(source, HubSource) and source.track, f"{entry.name} tracks nothing"
    repo, ref, pinned = source.repo, source.track, source.revision
    api = HfApi(endpoint=settings.hf_endpoint, token=settings.hf_token)
    timeout = timeout or constants.HF_HUB_ETAG_TIMEOUT
    wait = limit.wait if limit else (lambda: None)

    def listing(revision: str) -> tuple[str, dict[str, str]]:
        wait()
        info = api.model_info(repo, revision=revision, files_metadata=True, timeout=timeout)
        return str(info.sha), {s.rfilename: (s.lfs.sha256 if s.lfs else s.blob_id) or "" for s in info.siblings or []}

    with hub_errors(entry, settings, repo_id=repo, revision=ref):
        try:
            head, now = listing(ref)
        except RevisionNotFoundError as err:
            raise SourceError(f"{repo} has no branch or tag {ref!r} (source.track of {entry.name})",
                              repo_id=repo, revision=ref,
                              hint=f"fix source.track of {entry.name} in registry/catalog.yaml; "
                              f"`hf models info {repo} --expand sha` shows the repo") from err
    if head == pinned or pinned is None:
        return Movement(entry.name, repo, ref, pinned, head)
    with hub_errors(entry, settings, repo_id=repo, revision=pinned):
        _, before = listing(pinned)
        wait()
        if pinned not in _history(api.endpoint, api.token, repo, head, timeout):
            raise SourceError(
                f"{entry.name} pins {repo}@{pinned[:12]}, a commit that {ref!r} (now {head[:12]}) never contained",
                repo_id=repo, revision=pinned,
                hint=f"pin a commit of {ref!r} as source.revision of {entry.name}, or track the branch the pin is on")
        changes = _diff(before, now)
        if any(c.path == _TOKENIZER_CONFIG and c.change == "modified" for c in changes):
            # many repos keep the chat template inside tokenizer_config.json: read both to tell which changed
            configs = []
            for commit in (pinned, head):
                wait()
                configs.append(_get(f"{api.endpoint}/{repo}/resolve/{commit}/{_TOKENIZER_CONFIG}", api.token, timeout))
            changes = _template_only(changes, *configs)
    return Movement(entry.name, repo, ref, pinned, head, changes)


def check_all(entries: Iterable[CatalogEntry], settings: Settings, *,
              limit: RateLimit | None = None) -> tuple[list[Movement], list[tuple[str, ModelmintError]]]:
    """`check` each entry, one after another: one that fails (a hub that is down, a ref that is gone) is kept with
    its error, and the others are still checked. Returns the movements found and the (name, error) of each failure."""
    found, failed = [], []
    for entry in entries:
        try:
            found.append(check(entry, settings, limit=limit))
        except ModelmintError as e:
            failed.append((entry.name, e))
    return found, failed


def descends(settings: Settings, repo: str, pinned: str, commit: str, *, timeout: float = 10.0) -> bool:
    """Whether `commit` of `repo` has `pinned` in its history on the hub (a later commit than the pin, or the pin).

    Raises:
        huggingface_hub's HTTP errors and requests' transport errors: the hub could not answer.
    """
    from huggingface_hub import HfApi

    if commit == pinned:
        return True
    # huggingface.co where HF_ENDPOINT is unset (settings keep None for it): huggingface_hub's own default
    api = HfApi(endpoint=settings.hf_endpoint, token=settings.hf_token)
    return pinned in _history(api.endpoint, api.token, repo, commit, timeout)


def _template_only(changes: tuple[FileChange, ...], old: object, new: object) -> tuple[FileChange, ...]:
    """`changes` with tokenizer_config.json counted as a chat template change when its chat_template key is all
    that differs between the two versions."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return changes
    rest = [{k: v for k, v in d.items() if k != "chat_template"} for d in (old, new)]
    if rest[0] != rest[1]:
        return changes
    return tuple(FileChange(c.path, "chat template", c.change) if c.path == _TOKENIZER_CONFIG else c for c in changes)


def _get(url: str, token: str | bool | None, timeout: float) -> object:
    """One JSON answer of the hub, with the client's headers, errors and a time limit (pages: `_history`)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    response = get_session().get(url, headers=build_hf_headers(token=token), timeout=timeout)
    hf_raise_for_status(response)
    return response.json()


def _history(endpoint: str, token: str | bool | None, repo: str, head: str, timeout: float, pages: int = 20) -> set[str]:
    """The commits reachable from `head` (the hub lists them newest first, a page at a time), bounded in time."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url: str | None = f"{endpoint}/api/models/{repo}/commits/{head}"
    seen: set[str] = set()
    for _ in range(pages):
        if url is None:
            break
        response = get_session().get(url, headers=build_hf_headers(token=token), timeout=timeout)
        hf_raise_for_status(response)
        seen.update(str(c["id"]) for c in response.json())
        url = response.links.get("next", {}).get("url")
    return seen


def _diff(before: Mapping[str, str], now: Mapping[str, str]) -> tuple[FileChange, ...]:
    changes = [FileChange(p, classify(p), "removed" if p not in now else "added" if p not in before else "modified")
               for p in sorted(before.keys() | now.keys()) if before.get(p) != now.get(p)]
    return tuple(changes)
