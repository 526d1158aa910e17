"""Every version a name:tag has had: its manifest as each git commit of the registry recorded it, newest first."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from pipelines.core.errors import ToolError
from pipelines.core.runner import run
from pipelines.core.settings import Settings
from pipelines.store.manifest import Manifest, find_manifest, manifest_path, parse_ref


@dataclass(frozen=True)
class Version:
    manifest: Manifest
    commit: str | None
    """The newest git commit that holds this version's manifest; None: only the working tree holds it."""
    current: bool


def history(settings: Settings, ref: str) -> list[Version]:
    """The versions of `name:tag`, newest first: the current manifest, then each earlier registration git recorded
    (one per content key; manifests git holds that no longer read as one are left out).

    Raises:
        ConfigError: `ref` is not name:tag.
        NotRegistered, ManifestInvalid: as find_manifest.
    """
    current = find_manifest(settings, ref)
    name, tag = parse_ref(ref)
    rel = manifest_path(settings, name, tag).relative_to(settings.repo_dir).as_posix()
    found: dict[str, Version] = {current.key: Version(current, None, True)}
    for commit in _git(settings, "log", "--format=%H", "--", rel).split():
        try:
            manifest = Manifest.model_validate(json.loads(_git(settings, "show", f"{commit}:{rel}")))
        except (ValueError, ValidationError):
            continue  # deleted at that commit, or not a manifest modelmint wrote
        known = found.get(manifest.key)
        if known is None:
            found[manifest.key] = Version(manifest, commit, False)
        elif known.commit is None:
            found[manifest.key] = Version(known.manifest, commit, known.current)
    return list(found.values())


def _git(settings: Settings, *args: str) -> str:
    if not (settings.repo_dir / ".git").exists():
        return ""
    try:
        return run(["git", *args], cwd=settings.repo_dir).stdout
    except ToolError:
        return ""  # a path git does not hold at that commit
