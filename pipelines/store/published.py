"""Where a registered artifact is published: its publication record, registry/published/NAME/TAG.json in git beside
its manifest (written by `modelmint publish`, read by the listing, the site and the serving advice)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.core.errors import RegistryError
from pipelines.core.settings import Settings
from pipelines.store.manifest import Manifest


def publications_path(settings: Settings, name: str, tag: str) -> Path:
    """registry/published/NAME/TAG.json: where the artifact was published (in git, beside its manifest)."""
    return settings.repo_dir / "registry" / "published" / name / f"{tag}.json"


def publications(settings: Settings, manifest: Manifest) -> list[dict[str, Any]]:
    """Where this registration is published (entries of earlier registrations of the same tag left out)."""
    path = publications_path(settings, manifest.name, manifest.tag)
    return [e for e in read_publications(path) if "image" in e and
            (e.get("key") == manifest.key if "key" in e else e.get("sha256") == manifest.sha256)]


def read_publications(path: Path) -> list[dict[str, Any]]:
    """The record's entries; a missing file has none, a corrupt one is refused (read as empty, the next
    publication would overwrite every earlier record)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (ValueError, UnicodeDecodeError) as e:
        raise RegistryError(f"{path} is not a publication record ({e})",
                            hint=f"restore it from git (`git checkout -- {path}`) before publishing again") from e
    restore = f"restore it from git (`git checkout -- {path}`) before publishing again"
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise RegistryError(f"{path} is not a publication record (not a list of entries)", hint=restore)
    for i, entry in enumerate(data, 1):
        problem = _entry_problem(entry)
        if problem:
            raise RegistryError(f"{path} is not a publication record: entry {i} {problem}", hint=restore)
    return data


_ENTRY_TEXT = ("image", "published_at", "registry", "repository", "pinned", "digest", "key", "sha256")
"""The text fields record_publication writes in an entry (the first two in every entry, key or sha256 naming the
registration: records written before keys name it by sha256 alone)."""


def _entry_problem(entry: dict[str, Any]) -> str | None:
    """What makes one entry of a publication record unreadable (a field every reader needs missing, or a field of
    the wrong type), or None."""
    missing = [f for f in ("image", "published_at") if f not in entry]
    if "key" not in entry and "sha256" not in entry:
        missing.append("key (or sha256)")
    if missing:
        return f"has no {', '.join(missing)}"
    for f in _ENTRY_TEXT:
        if f in entry and not isinstance(entry[f], str):
            return f"field {f} is {json.dumps(entry[f])[:40]}, not a string"
    tags = entry.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        return f"field tags is {json.dumps(tags)[:40]}, not a list of strings"
    return None
