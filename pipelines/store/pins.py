"""Moving a catalog pin to a new upstream commit: the one catalog value, dvc.yaml, and a reviewable git commit."""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipelines.core.errors import ConfigError, RegistryError, ToolError
from pipelines.core.fsutil import file_lock
from pipelines.core.runner import run
from pipelines.core.settings import Settings
from pipelines.source.catalog import load_catalog, set_revision
from pipelines.source.upstream import Movement
from pipelines.store import dvcgen

RecordMode = Literal["in-place", "branch"]
"""in-place: the checkout's catalog and dvc.yaml change and are committed on its current branch; branch: a commit
on `upstream/<name>-<commit12>` made from HEAD, the checkout untouched (a pull request's head)."""


@dataclass(frozen=True)
class Recorded:
    name: str
    old: str | None
    new: str
    where: str
    """The branch the commit is on, or the checkout's path when it is not a git repository."""
    commit: str | None
    """The git commit that records the pin (None: nothing to commit, it was recorded already, or no git)."""


def branch_name(name: str, commit: str) -> str:
    return f"upstream/{name}-{commit[:12]}"


def move_pin(settings: Settings, name: str, commit: str) -> str | None:
    """Move `name`'s pin in the checkout's catalog and regenerate dvc.yaml; returns the previous pin.

    Raises:
        ConfigError: the catalog does not validate or has no hub entry `name`.
    """
    old = set_revision(settings.catalog_path, name, commit)
    dvcgen.write(load_catalog(settings.catalog_path), settings.repo_dir / "dvc.yaml")
    return old


def message(m: Movement) -> str:
    """The commit message of a moved pin: what moved, and which kinds of file changed."""
    what = ", ".join(m.kinds) or "no listed file"
    rebuild = "variants rebuilt" if m.rebuilds_weights else "metadata only, weights unchanged"
    return (f"{m.name}: pin {m.repo}@{m.head[:12]} ({m.ref} moved from {(m.pinned or 'unpinned')[:12]}; "
            f"changed: {what}; {rebuild})\n\n" + "\n".join(f"{c.change} {c.path} ({c.kind})" for c in m.changes))


def record_pin(settings: Settings, m: Movement, mode: RecordMode = "in-place") -> Recorded:
    """Record a moved pin (`mode`), once: a second call for the same commit changes and commits nothing.

    Raises:
        ConfigError: the catalog does not validate, or (branch mode) lies outside the git repository.
        RegistryError: git failed (its message says why).
    """
    root = settings.repo_dir
    is_git = (root / ".git").exists()
    with _pin_lock(settings):
        if mode == "branch":
            if not is_git:
                raise ConfigError(f"{root} is not a git repository, so a pin cannot be recorded on a branch",
                                  hint="record in place (`--record in-place`), or run in a git checkout")
            return _on_branch(settings, m)
        old = move_pin(settings, m.name, m.head)
        if not is_git:
            return Recorded(m.name, old, m.head, str(root), None)
        return _in_place(settings, m, old)


def _on_branch(settings: Settings, m: Movement) -> Recorded:
    """A commit on upstream/<name>-<commit12> that moves the pin from HEAD's catalog, made in a temporary index."""
    root, branch = settings.repo_dir, branch_name(m.name, m.head)
    if _git(root, "branch", "--list", branch).strip():
        return Recorded(m.name, m.pinned, m.head, branch, None)
    head = _git(root, "rev-parse", "HEAD").strip()
    commit = _pin_commit(settings, m, head)[0]
    # the empty old value: create the branch only if no concurrent watcher created it first
    try:
        _git(root, "update-ref", f"refs/heads/{branch}", commit, "")
    except RegistryError:
        if _git(root, "branch", "--list", branch).strip():
            return Recorded(m.name, m.pinned, m.head, branch, None)
        raise
    return Recorded(m.name, m.pinned, m.head, branch, commit)


def _pin_commit(settings: Settings, m: Movement, head: str) -> tuple[str, dict[str, str]]:
    """A commit on `head` that moves the pin in `head`'s catalog and nothing else, made in a temporary index (the
    checkout's index and files untouched); also the blob each of its two paths has in it."""
    root, catalog_rel = settings.repo_dir, _relative(settings, settings.catalog_path)
    with tempfile.TemporaryDirectory(prefix="modelmint-pin-") as tmp:
        catalog, dvc_yaml, index = Path(tmp) / "catalog.yaml", Path(tmp) / "dvc.yaml", Path(tmp) / "index"
        catalog.write_text(_git(root, "show", f"{head}:{catalog_rel}"), encoding="utf-8")
        set_revision(catalog, m.name, m.head)
        dvcgen.write(load_catalog(catalog), dvc_yaml)
        env = {"GIT_INDEX_FILE": str(index)}
        _git(root, "read-tree", head, env=env)
        blobs = {}
        for path, rel in ((catalog, catalog_rel), (dvc_yaml, "dvc.yaml")):
            blobs[rel] = _git(root, "hash-object", "-w", str(path)).strip()
            _git(root, "update-index", "--add", "--cacheinfo", f"100644,{blobs[rel]},{rel}", env=env)
        tree = _git(root, "write-tree", env=env).strip()
    if tree == _git(root, "rev-parse", f"{head}^{{tree}}").strip():
        return "", blobs  # HEAD records this pin already
    return _git(root, "commit-tree", tree, "-p", head, "-m", message(m)).strip(), blobs


def _in_place(settings: Settings, m: Movement, old: str | None) -> Recorded:
    """Commit the pin's move on the checkout's branch, and only it: hand edits of the catalog (or anything else)
    stay uncommitted in the checkout, as they were, instead of riding along in the watcher's commit."""
    root = settings.repo_dir
    branch = _git(root, "branch", "--show-current").strip()
    head = _git(root, "rev-parse", "HEAD").strip()
    commit, blobs = _pin_commit(settings, m, head)
    if not commit:
        return Recorded(m.name, old, m.head, branch, None)
    # the old value: move the branch only from the commit this was built on (a concurrent commit makes git refuse)
    _git(root, "update-ref", "-m", f"modelmint: {m.name} pin", "HEAD", commit, head)
    for rel, blob in blobs.items():
        # the index entry follows the commit only where it was HEAD's: a change staged by hand stays staged
        staged = _git(root, "ls-files", "-s", "--", rel).split()[1:2]
        if staged == _git(root, "ls-tree", head, "--", rel).split()[2:3]:
            _git(root, "update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}")
    return Recorded(m.name, old, m.head, branch, commit)


def _relative(settings: Settings, path: Path) -> str:
    try:
        return path.resolve().relative_to(settings.repo_dir.resolve()).as_posix()
    except ValueError as err:
        raise ConfigError(f"the catalog {path} is outside the repository {settings.repo_dir}",
                          hint="unset MODELMINT_CATALOG so the repository's registry/catalog.yaml is used") from err


def _git(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    try:
        return run(["git", *args], cwd=root, env=env).stdout
    except ToolError as err:
        raise RegistryError(f"git {args[0]} failed in {root}:\n{err.stderr_tail.strip()}",
                            hint="`git status` in the repository shows its state; rerun the watcher after fixing "
                            "it") from err


@contextlib.contextmanager
def _pin_lock(settings: Settings) -> Iterator[None]:
    """One pin move at a time per repository, across processes (two watcher runs, a webhook and a tick)."""
    locks = settings.home / "locks"
    key = hashlib.sha1(str(settings.repo_dir.resolve()).encode()).hexdigest()[:16]
    with file_lock(locks / f"pins-{key}.lock"):
        yield
