"""The registry as a static site: each page's data collected from the registry, rendered (render.py), written whole.

build_site writes the index, a page per model and charts.html beside the site folder and swaps them in; refresh_site
rebuilds only when what the site is built from changed. server.py serves a built site.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipelines.advice.recommend import failed_builds
from pipelines.core.errors import ConfigError, ManifestInvalid
from pipelines.core.fsutil import clean_partials, partial_path
from pipelines.core.settings import Settings
from pipelines.core.vocab import is_name
from pipelines.site.render import ModelPage, charts_page, index_page, model_page, page_name
from pipelines.store.history import history
from pipelines.store.manifest import Manifest, list_manifests

SITE_DIR = "site"
"""Where the flow writes the site, under the work directory (MODELMINT_WORK_DIR)."""


def default_site_dir(settings: Settings) -> Path:
    return settings.work_dir / SITE_DIR


@dataclass(frozen=True)
class Built:
    out: Path
    pages: list[Path]
    invalid: list[ManifestInvalid]


def collect(settings: Settings) -> list[ModelPage]:
    """Every model the registry holds, with its manifests, the ones that do not validate, its failed builds and
    each variant's versions."""
    listing = list_manifests(settings)
    pages: dict[str, ModelPage] = {}
    for m in listing.manifests:
        pages.setdefault(m.name, ModelPage(m.name)).variants.append(m)
    for bad in listing.invalid:
        name = Path(bad.path).parent.name
        pages.setdefault(name, ModelPage(name)).invalid.append(bad)
    # a model whose every build failed its gate has no manifest: its reports in the work directory still show it
    work = settings.work_dir
    for folder in sorted(p for p in work.iterdir() if p.is_dir()) if work.is_dir() else []:
        if is_name(folder.name) and folder.name not in pages and failed_builds(settings, folder.name, set()):
            pages[folder.name] = ModelPage(folder.name)
    described = _descriptions(settings)
    for page in pages.values():
        page.description = described.get(page.name, "")
        page.failed = failed_builds(settings, page.name, {m.tag for m in page.variants})
        page.published = {m.ref: _published(settings, m) for m in page.variants}
        page.cards = {m.ref: text for m in page.variants if (text := _card_text(settings, m)) is not None}
        for m in page.variants:
            try:
                page.versions[m.tag] = history(settings, m.ref)
            except ManifestInvalid:
                page.versions[m.tag] = []
    return [pages[n] for n in sorted(pages)]


def _descriptions(settings: Settings) -> dict[str, str]:
    """Each catalog entry's description; none where the catalog does not load (the site still builds)."""
    from pipelines.source.catalog import load_catalog

    try:
        return {e.name: e.description or "" for e in load_catalog(settings.catalog_path).models}
    except (ConfigError, OSError):
        return {}


def _published(settings: Settings, m: Manifest) -> list[str]:
    """The OCI images this registration was published as (registry/published/), newest last; none when unreadable."""
    from pipelines.core.errors import RegistryError
    from pipelines.store.published import publications

    try:
        return [str(e["image"]) for e in publications(settings, m) if isinstance(e.get("image"), str)]
    except RegistryError:
        return []



def _card_text(settings: Settings, m: Manifest) -> str | None:
    """The variant's model card as this checkout holds it (artifacts/…/README.md); None: not here."""
    path = settings.repo_dir / m.dvc.path / "README.md"
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


KEY_FILE = ".modelmint-site.json"
"""In the site folder: the content key of what it was built from. Its presence is what makes a folder a modelmint
site that a build may replace (and refresh_site skips a build when the key is unchanged)."""
_SITE_FILES = frozenset({"index.html", "charts.html", "models", KEY_FILE})
"""What a build writes at the top of the site folder."""
_NEW_FOLDER_HINT = "give --out a new or empty folder, e.g. --out site/"


def _is_site(folder: Path) -> bool:
    """Whether `folder` holds a site a build wrote: its marker, or (a site built before the marker existed) only
    the site's own files, every model page an .html file."""
    try:
        marker = json.loads((folder / KEY_FILE).read_text(encoding="utf-8"))
        if isinstance(marker, dict) and isinstance(marker.get("key"), str):
            return True
    except (OSError, ValueError):
        pass
    names = {p.name for p in folder.iterdir()}
    models = folder / "models"
    return (
        names <= _SITE_FILES
        and (folder / "index.html").is_file()
        and (
            not models.exists()
            or (models.is_dir() and all(p.suffix == ".html" and p.is_file() for p in models.iterdir()))
        )
    )


def _check_out(settings: Settings, out: Path) -> Path:
    """`out` resolved, once it is known that replacing it deletes nothing but an earlier site.

    Raises:
        ConfigError: `out` is a file, the root, holds the home folder, the registry repository, modelmint's own
            folders or the working directory, is a git checkout, or is a non-empty folder that is not a site.
    """
    dest = out.expanduser().resolve()
    shown = str(out) if Path(str(out)) == dest else f"{out} ({dest})"
    if dest.exists() and not dest.is_dir():
        raise ConfigError(
            f"{shown} is a file, not a folder for the site", hint="give --out a folder, e.g. --out site/"
        )
    refuse = f"will not build the site in {shown}, a build replaces the whole of --out"
    if dest == dest.parent:
        raise ConfigError(f"{refuse}: it is the root folder", hint=_NEW_FOLDER_HINT)
    try:
        cwd: Path | None = Path.cwd()
    except OSError:
        cwd = None
    kept = [
        ("your home folder", Path.home()),
        ("the registry repository (MODELMINT_REPO)", settings.repo_dir),
        ("modelmint's home (MODELMINT_HOME)", settings.home),
        ("the work directory (MODELMINT_WORK_DIR)", settings.work_dir),
        ("the folder you are in", cwd),
    ]
    for what, folder in kept:
        if folder is None:
            continue
        folder = folder.expanduser().resolve()
        if dest == folder or dest in folder.parents:
            said = f"it is {what}" if dest == folder else f"it holds {what}, {folder}"
            raise ConfigError(f"{refuse}: {said}", hint=_NEW_FOLDER_HINT)
    if not dest.is_dir():
        return dest
    try:
        if (dest / ".git").exists():
            raise ConfigError(
                f"{refuse}: it is a git checkout (its .git would go)",
                hint=f"{_NEW_FOLDER_HINT}, then copy the files into the checkout",
            )
        if any(dest.iterdir()) and not _is_site(dest):
            raise ConfigError(
                f"{refuse}: it holds files and is not a modelmint site (it has no {KEY_FILE})",
                hint=f"{_NEW_FOLDER_HINT}; to replace {out} anyway, remove it first",
            )
    except OSError as err:
        raise ConfigError(
            f"cannot read {shown}: {err.strerror}", hint="give --out a folder you can write"
        ) from err
    return dest


def build_site(settings: Settings, out: Path) -> Built:
    """Write the site for the registry to `out`: index.html, charts.html, models/<name>.html and the marker
    (KEY_FILE) that makes it a site the next build may replace. A manifest that does not validate is shown on its
    model's page; the rest builds.

    `out` must be new, empty or a site a build wrote (see _check_out). The site is written beside it and swapped in
    whole: a build that fails leaves the earlier site as it was.

    Raises:
        ConfigError: `out` may not be replaced (a file, a folder holding other files, a git checkout, the root, the
            home folder, the registry repository), or cannot be written.
    """
    dest = _check_out(settings, out)
    key = inputs_key(
        settings
    )  # before reading: a registration during the build makes the next refresh rebuild
    pages = collect(settings)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # a killed build's leftovers (its process gone) first; a concurrent build's are left alone
        for leftover in (dest.name, f"{dest.name}.old"):
            clean_partials(dest.parent, of=leftover)
        tmp = partial_path(dest)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as err:
        raise ConfigError(
            f"cannot write the site to {out}: {err.strerror}", hint="give --out a folder you can write"
        ) from err
    try:
        (tmp / "models").mkdir()
        written = [tmp / "index.html", tmp / "charts.html"]
        (tmp / "index.html").write_text(index_page(pages, settings.manifests_dir), encoding="utf-8")
        (tmp / "charts.html").write_text(charts_page(), encoding="utf-8")
        for p in pages:
            path = tmp / "models" / page_name(p.name)
            path.write_text(model_page(p), encoding="utf-8")
            written.append(path)
        (tmp / KEY_FILE).write_text(json.dumps({"key": key}) + "\n", encoding="utf-8")
        tmp.chmod(0o755)
        _swap(tmp, dest)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(
            f"cannot write the site to {out}: {err.strerror}", hint="give --out a folder you can write"
        ) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Built(dest, [dest / p.relative_to(tmp) for p in written], [b for p in pages for b in p.invalid])


def _swap(tmp: Path, dest: Path) -> None:
    """Put the folder `tmp` in the place of `dest`; if that fails, `dest` is put back as it was."""
    old = partial_path(dest.with_name(f"{dest.name}.old"))
    moved = dest.exists()
    if moved:
        dest.rename(old)
    try:
        tmp.rename(dest)
    except BaseException:
        if moved:
            old.rename(dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def inputs_key(settings: Settings) -> str:
    """A hash of everything a build reads that can change without a registration: the manifests, the catalog, the
    work directory's reports; and the registry's git HEAD (the versions)."""
    h = hashlib.sha256()
    roots = [(settings.manifests_dir, "*/*.json"), (settings.work_dir, "*/*/*.report.json")]
    for root, pattern in roots:
        for path in sorted(root.glob(pattern)) if root.is_dir() else []:
            h.update(path.as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    for path in (settings.catalog_path, settings.repo_dir / ".git" / "HEAD"):
        h.update(path.read_bytes() if path.is_file() else b"-")
    head = settings.repo_dir / ".git" / "HEAD"
    ref = head.read_text(encoding="utf-8").strip() if head.is_file() else ""
    if ref.startswith(
        "ref: "
    ):  # the branch's commit, read as git keeps it (no git process for an unchanged site)
        branch = settings.repo_dir / ".git" / ref[5:]
        h.update(branch.read_bytes() if branch.is_file() else ref.encode())
    return h.hexdigest()


def refresh_site(settings: Settings, out: Path) -> tuple[Path, bool]:
    """The site in `out` rebuilt (by build_site) when what it is built from changed since its last build; returns
    its index page and whether it was built now.

    Raises:
        ConfigError: as build_site.
    """
    try:
        if (
            json.loads((out / KEY_FILE).read_text(encoding="utf-8")).get("key") == inputs_key(settings)
            and (out / "index.html").is_file()
        ):
            return out / "index.html", False
    except (OSError, ValueError, AttributeError):
        pass  # no site yet, or not one this wrote: build it
    build_site(settings, out)
    return out / "index.html", True
