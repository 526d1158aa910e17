"""Register a validated variant: its artifact directory recorded by DVC and pushed, then its manifest, last.

GGUF variants and compressed-tensors checkpoints take the same steps; only what `place` publishes beside
the artifact differs (a Modelfile and model card for Ollama; a vLLM serve config and model card for vLLM).

The steps, each safe to repeat after a crash:
  place    hard-link the variant's weights (copy its other files, add its serving files: Modelfile or vllm.yaml,
           card, serving plans per GPU inventory under serve/) into artifacts/<name>/<tag>/, atomically as a directory
  track    make the placed weights the DVC cache's objects (the same inode), then `dvc commit` the dvc.yaml stage
           that owns that directory: dvc.lock + the DVC cache (DVC's state is given the md5s read with the sha256s,
           so a weight file is read once to hash it, and once more by the push)
  publish  `dvc push` it to the default remote, then write registry/manifests/<name>/<tag>.json

Nothing is visible as registered before its manifest exists, and the manifest is written only after
validation passed and the blob reached the remote. Under `dvc repro` the stage command registers with
`track=False`: DVC itself records the output after the command returns, and `dvc push` sends it.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.advice import serving
from pipelines.core.errors import (
    ArtifactError,
    ConfigError,
    DiskFullError,
    ManifestInvalid,
    ModelmintError,
    NotRegistered,
    RecordMoved,
    RegistryError,
)
from pipelines.core.fsutil import (
    atomic_output,
    clean_partials,
    disk_full_located,
    hash_cache,
    is_full,
    link_or_copy,
    write_text_atomic,
)
from pipelines.core.settings import Settings
from pipelines.core.steps import BuildResult
from pipelines.core.weights import is_weight_file, weights_bytes
from pipelines.source.catalog import CatalogEntry
from pipelines.store import dvcrepo
from pipelines.store.candidate import Candidate, ValidatedOutputChanged, verdict
from pipelines.store.formats.base import implementation
from pipelines.store.manifest import (
    ArtifactFile,
    DvcRef,
    Manifest,
    ModelShapeRecord,
    Serving,
    SourceRef,
    Validation,
    load_manifest,
    manifest_path,
    read_serving,
    save_manifest,
)
from pipelines.store.names import format_name
from pipelines.trust import provenance, signing

__all__ = ["Candidate", "Registration", "Tracked", "ValidatedOutputChanged", "drop_scratch", "place", "publish",
           "register", "registered", "track", "verdict"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tracked:
    """A placed artifact directory and what DVC recorded for it (md5 None when DVC was not asked)."""

    files: tuple[ArtifactFile, ...]
    md5: str | None


@dataclass(frozen=True)
class Registration:
    manifest: Manifest
    path: Path
    ran: bool
    """False when the variant was already registered exactly like this (nothing was run)."""
    reuploaded: tuple[str, ...] = ()
    """Objects the remote lacked or held damaged, uploaded again by this registration."""
    candidate: Candidate | None = None
    """What was registered, when the run's registration step made it (an orchestrator's cached registration is
    checked against it: pipelines.compose.registration_steps)."""


class OlderVersionRefused(RegistryError):
    """The candidate's source commit was registered before the tag's current version: registering it would move the
    tag backwards (a stale or reordered webhook delivery, an old `--revision`)."""


def refuse_older(settings: Settings, c: Candidate) -> None:
    """Refuse `c` when its source commit is one the tag had before its current version, unless `c.force`.

    The order is the registry's own first: the current manifest, what it `replaces`, and every earlier version
    git recorded of it (registry.history). A hub commit the tag never had is then looked up in the hub's history
    of the current version's commit (upstream.descends): found there, it is older. When the hub cannot answer,
    it is registered, with a warning.

    Raises:
        OlderVersionRefused: naming the current version's commit and `--force`.
    """
    from pipelines.store.history import history

    revision = c.source.get("revision")
    if c.force or not revision:
        return
    try:
        versions = history(settings, c.ref)
    except (NotRegistered, ManifestInvalid):
        return  # nothing current to move back from (an unreadable manifest is refused by its own step)
    current = next(v.manifest for v in versions if v.current)
    if current.source.revision in (None, revision):
        return
    older = {v.manifest.source.revision for v in versions if not v.current}
    if current.replaces is not None:
        older.add(current.replaces.revision)
    hint = (f"a registered version never moves backwards unless forced: rerun with `--force` "
            f"(`modelmint {format_name(c.tag).command} {c.entry.name} "
            f"{format_name(c.tag).option} {c.tag} --revision {revision} --register --force`) to roll {c.ref} back on purpose")
    when = f"registered {current.created_at:%Y-%m-%d %H:%M} UTC"
    if revision in older:
        raise OlderVersionRefused(
            f"{c.ref} is at source commit {current.source.revision} ({when}), which replaced {revision}: "
            f"registering {revision[:12]} again would move it backwards", hint=hint)
    repo = c.source.get("repo")
    if c.source.get("kind") == "hub" and repo and current.source.repo == repo and _hub_history_holds(
            settings, repo, current.source.revision, revision):
        # A commit the tag never had may still be older: two conversions of successive pins, the older finishing
        # last (a reordered delivery whose run was already under way), would otherwise roll the tag back.
        raise OlderVersionRefused(
            f"{c.ref} is at source commit {current.source.revision} ({when}), a later commit of {repo} than "
            f"{revision} (the hub's history of it holds {revision[:12]}): registering it would move it backwards",
            hint=hint)


def _hub_history_holds(settings: Settings, repo: str, head: str, commit: str) -> bool:
    """Whether the hub's history of `repo` at `head` holds `commit`; False (with a warning) when the hub cannot
    say: registering a newer commit is the usual case, and a hub outage must not stop every registration."""
    from pipelines.source import upstream

    try:
        return upstream.descends(settings, repo, commit, head, timeout=5.0)
    except Exception as err:  # the hub's errors or its transport's (huggingface_hub raises both kinds)
        log.warning("the hub could not say whether %s@%s is older than the registered %s (%s): registering it",
                    repo, commit[:12], head[:12], type(err).__name__)
        return False


def artifact_dir(settings: Settings, name: str, tag: str) -> Path:
    """The registered artifact's directory (under Settings.artifacts_dir, at manifest.artifact_relpath)."""
    return settings.artifacts_dir / name / tag


# ---------------------------------------------------------------- the steps


def place(settings: Settings, c: Candidate) -> tuple[ArtifactFile, ...]:
    """Link the variant's weights (copy its other files) into its artifact directory and add its serving files, as
    one rename.

    Raises:
        DiskFullError: the disk holding artifacts/ (the repository's) filled; nothing was placed.
        OlderVersionRefused: `c` would move its tag back to an older source commit (refuse_older); nothing placed.
    """
    refuse_older(settings, c)
    dest = artifact_dir(settings, c.entry.name, c.tag)
    with disk_full_located(settings):
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(dest)
        with atomic_output(dest) as tmp:
            tmp.mkdir()
            for f in c.files:
                out = tmp / c.placed_as(f)
                out.parent.mkdir(parents=True, exist_ok=True)
                _place_file(f, out, weights=is_weight_file(c.placed_as(f)))
            implementation(c.format).publish(settings, c, tmp)
            serving.write_serving(c, tmp)
            # Last: the provenance and the signature cover every file placed above (pipelines/trust/signing.py).
            signing.seal(settings, c, tmp, _validation(c).model_dump(mode="json"))
    return _describe(settings, dest)


def track(settings: Settings, c: Candidate, files: tuple[ArtifactFile, ...]) -> Tracked:
    """Record the artifact directory in dvc.lock and the DVC cache (`dvc commit` of its stage).

    Raises:
        RegistryError: not a DVC repository, no such stage (run `modelmint dvc-yaml`), or DVC failed.
        DiskFullError: the DVC cache's disk (or the repository's) filled.
    """
    directory = artifact_dir(settings, c.entry.name, c.tag)
    hashes = hash_cache(settings)
    try:
        for f in files:
            if is_weight_file(f.path):
                # the placed inode itself becomes the cache's object: DVC then copies only the small files
                dvcrepo.adopt(settings, directory / f.path, hashes)
        # the md5s were read with the sha256s (place, _describe): DVC takes them instead of reading the files again
        dvcrepo.record_md5(settings, [directory / f.path for f in files], hashes)
        dvcrepo.commit(settings, c.stage)
    except DiskFullError as err:
        # DVC names no path; `dvc commit` writes into the cache, and dvc.lock and DVC's state beside it.
        cache = dvcrepo.cache_dir(settings)
        where = cache if is_full(cache) else Path(err.path)
        raise DiskFullError(str(where), err.detail,
                            location=settings.disk_location(where, dvc_cache=cache)) from err
    locked = dvcrepo.locked_out(settings, c.stage, c.dvc_path)
    if locked is None:
        from pipelines.core.errors import RegistryError

        raise RegistryError(
            f"dvc commit {c.stage} recorded nothing for {c.dvc_path}",
            hint="dvc.yaml is out of date with the catalog: run `modelmint dvc-yaml`",
        )
    _check_cached(settings, c, locked.md5)
    return Tracked(files, locked.md5)


def _check_cached(settings: Settings, c: Candidate, dir_md5: str) -> None:
    """Check that `dvc commit` put every object of the artifact into the cache, not only into dvc.lock.

    DVC exits 0 when the cache's disk fills: dvc.lock records the directory, the cache holds `.tmp` stubs.

    Raises:
        DiskFullError: objects are missing and the cache's disk is full.
        RegistryError: objects are missing otherwise.
    """
    from pipelines.core.errors import RegistryError

    cache = dvcrepo.cache_dir(settings)
    obj = dvcrepo.cache_object(cache, dir_md5)
    listing = dvcrepo.dir_listing(cache, dir_md5) if obj.is_file() else {}
    missing = ([] if obj.is_file() else [dir_md5]) + [
        rel for rel, md5 in listing.items() if not dvcrepo.cache_object(cache, md5).is_file()
    ]
    if not missing:
        return
    detail = f"dvc commit {c.stage} exited 0 but left {', '.join(missing)} out of the cache"
    if is_full(cache):
        raise DiskFullError(str(cache), detail, location=settings.disk_location(cache, dvc_cache=cache))
    raise RegistryError(detail, hint="rerun the same command; `dvc doctor` shows DVC's setup")


def is_tracked(settings: Settings, c: Candidate, tracked: Tracked) -> bool:
    """Whether `tracked` still describes the workspace and dvc.lock (no tool is run)."""
    if not _files_in_place(settings, c, tracked.files, hashed=False):
        return False
    if tracked.md5 is None:
        return True
    locked = dvcrepo.locked_out(settings, c.stage, c.dvc_path)
    return locked is not None and locked.md5 == tracked.md5


def record_shape(directory: Path, fmt: str, file: str, tag: str) -> ModelShapeRecord | None:
    """The shape of the artifact placed in `directory` (its main file `file`), read from its headers as `recommend`
    and `modelmint plan` read it; None when the planner cannot size it (a format or architecture it does not
    plan): a manifest without one is planned from the pulled bytes, as before."""
    from pipelines.publish import planner
    from pipelines.publish.llamacpp_memory import read_layered_weights

    try:
        sized, _ = implementation(fmt).served(directory, file, tag)
        shape = planner.served(sized).shape
    except (ConfigError, ArtifactError):
        return None
    layers = None
    if fmt == "gguf":
        try:
            layers = read_layered_weights(sized)
        except ArtifactError:  # tensors not grouped by layer: recommend spreads the bytes evenly, and says so
            layers = None
    return ModelShapeRecord.of(shape, layers)


def publish(settings: Settings, c: Candidate, tracked: Tracked, *, push: bool = True) -> Registration:
    """Push the tracked directory to the default DVC remote, then write the manifest (last).

    The push is checked object by object in the remote (dvcrepo.ensure_in_remote): what is missing or holds
    other bytes is uploaded again before the manifest says `pushed`.

    Raises:
        RemoteError, RemoteUnavailable: the push failed or the remote's copy is still wrong; no manifest is written.
    """
    reuploaded: tuple[str, ...] = ()
    if push and tracked.md5 is not None:
        lacking = dvcrepo.remote_lacks(settings, tracked.md5)
        dvcrepo.push(settings, c.stage)
        # What the push wrote it read from the cache (the bytes registration hashed): its size is checked, not its
        # bytes read again; what the remote held already, which the push skipped whatever it holds, is hashed.
        reuploaded = _ensure_in_remote(settings, c, tracked.md5, tracked.files, fresh=lacking)
    placed = artifact_dir(settings, c.entry.name, c.tag)
    # a signed artifact's registration time is the one its provenance signed (and its timestamp bounds)
    signed_at = provenance.bound_created_at(provenance.read(placed))
    manifest = _manifest(c, tracked, pushed=push and tracked.md5 is not None, plans=read_serving(placed),
                         created_at=signed_at)
    manifest = manifest.model_copy(update={"shape": record_shape(placed, c.format, c.placed_as(c.files[0]), c.tag)})
    path = manifest_path(settings, c.entry.name, c.tag)
    try:
        before = load_manifest(path, settings.manifests_dir)
    except (FileNotFoundError, ManifestInvalid):
        before = None
    if before is not None and before.key == manifest.key:
        # The same artifact recorded again (`dvc repro` reruns, a new clone, a rebuild elsewhere): keep what the
        # manifest says of it (its date, its report's hash and smoke timings, what it replaced), so that an
        # unchanged registration leaves an unchanged file in git. A signed one placed again was signed again: its
        # date is the new signature's, which its provenance binds.
        if before.files == manifest.files and before.dvc == manifest.dvc:
            return Registration(before, path, ran=True, reuploaded=reuploaded)
        manifest = manifest.model_copy(update={"created_at": signed_at or before.created_at,
                                               "replaces": before.replaces})
    elif before is not None:
        manifest = manifest.model_copy(update={"replaces": before.previous()})
    return Registration(manifest, save_manifest(settings, manifest), ran=True, reuploaded=reuploaded)


def _ensure_in_remote(settings: Settings, c: Candidate, md5: str, files: tuple[ArtifactFile, ...],
                      fresh: frozenset[str] = frozenset()) -> tuple[str, ...]:
    check = dvcrepo.ensure_in_remote(settings, c.stage, c.dvc_path, md5, {f.path: f.sha256 for f in files},
                                     fresh=fresh)
    return tuple(o.describe() for o in check.bad if o.damaged)


def registered(settings: Settings, c: Candidate, *, tracked: bool = True) -> Registration | None:
    """The registration of exactly this candidate, when it is complete and its files are in place.

    With `tracked`, it must also be recorded in dvc.lock and pushed. Runs no tool: a stat and a few
    small reads (file hashes come from the hash cache unless a file changed).
    """
    path = manifest_path(settings, c.entry.name, c.tag)
    try:
        manifest = load_manifest(path, settings.manifests_dir)
    except (FileNotFoundError, ManifestInvalid):
        return None
    if manifest.key != c.key or not _files_in_place(settings, c, tuple(manifest.files), hashed=True):
        return None
    if tracked:
        if manifest.dvc.md5 is None or not manifest.dvc.pushed:
            return None
        locked = dvcrepo.locked_out(settings, c.stage, c.dvc_path)
        if locked is None or locked.md5 != manifest.dvc.md5:
            return None
    return Registration(manifest, path, ran=False)


def register(settings: Settings, c: Candidate, *, track_with_dvc: bool = True, push: bool = True) -> Registration:
    """Place, track, push and describe one validated variant; a no-op when it is registered already.

    Raises:
        RegistryError (RemoteError, RemoteUnavailable): DVC could not record or push it; no manifest.
    """
    done = registered(settings, c, tracked=track_with_dvc)
    if done is not None:
        if track_with_dvc and push and done.manifest.dvc.md5 is not None:
            # Registered before, but the remote's copy may have been damaged or deleted since: registering
            # again is how it is repaired (only a read of the remote when nothing is wrong).
            fixed = _ensure_in_remote(settings, c, done.manifest.dvc.md5, tuple(done.manifest.files))
            done = replace(done, reuploaded=fixed)
        return done
    if track_with_dvc:
        _check_entry_unchanged(settings, c)
    files = place(settings, c)
    if not track_with_dvc:
        return publish(settings, c, Tracked(files, None), push=push)
    lock = dvcrepo.require_repo(settings) / "dvc.lock"
    before = lock.read_bytes() if lock.is_file() else None
    try:
        return publish(settings, c, track(settings, c, files), push=push)
    except RecordMoved:
        raise  # another registration of the stage rewrote dvc.lock since this one's commit: it is theirs now
    except Exception:
        # A failed commit or push must not leave dvc.lock naming a version that is in neither the cache nor the
        # remote (pull and verify would then give wrong advice): it goes back to what it recorded before.
        _restore_lock(settings, lock, before, c.stage)
        raise


def drop_scratch(settings: Settings, scratch: Iterable[Path], result: BuildResult) -> list[Path]:
    """Remove a build's scratch files (`scratch`: the format's, ArtifactFormat.scratch; for a GGUF the f16 and its KL
    reference logits), keeping their receipts, once every variant `result` was asked for has passed its gate
    (BuildResult.all_passed), unless Settings.keep_scratch. That is before registration: placing, committing, pushing, signing and publishing
    read only the variants, so the largest files of a run do not sit on the disk beside the DVC remote's and the
    registry's copies (at 7B, 14.5 GiB of the peak). A run with a variant refused keeps them: its rerun needs them.
    A rerun after a failed registration does not (every variant is finished: gguf.build's settled scratch), and a
    later run that needs them finds no file behind their receipts and rebuilds them. Returns the files removed."""
    if settings.keep_scratch or not result.all_passed:
        return []
    removed = []
    for out in scratch:
        # the receipt stays: it records what the file was (the manifest's parent, the keys of the steps it fed), so
        # a rerun whose variants are all finished needs neither file (gguf.build: settled scratch), and a run that
        # needs the file finds it gone and rebuilds it (steps.load_receipt)
        if out.is_file():
            out.unlink()
            removed.append(out)
    if removed:
        log.info("removed the build's scratch files %s (MODELMINT_KEEP_SCRATCH=1 keeps them)",
                 ", ".join(f.name for f in removed))
    return removed


# ---------------------------------------------------------------- helpers


def _built_from(entry: CatalogEntry, tag: str) -> dict[str, Any]:
    """What of a catalog entry one variant is built from: all but the other variants (the variant's own part of
    the `variants` block is its format's to say: FormatName.built_from)."""
    data = entry.model_dump()
    data["variant"] = format_name(tag).built_from(data.pop("variants") or {}, tag)
    return data


def _check_entry_unchanged(settings: Settings, c: Candidate) -> None:
    """Refuse to record a build whose catalog entry was edited while it ran (by hand, or `watch --apply` moving
    its pin): `dvc commit` hashes the catalog as it is now, so dvc.lock would call the stage up to date with an
    entry the artifact was not built from. Edits to other entries change nothing this artifact depends on.

    Raises:
        RegistryError: the entry in the catalog differs from the one the build used (nothing placed or recorded).
    """
    from pipelines.source.catalog import load_catalog

    try:
        catalog = load_catalog(settings.catalog_path).get(c.entry.name)
        now = [_built_from(e, c.tag) for e in (catalog, catalog.with_serve_gpus(settings.serve_gpus))]
    except ModelmintError:
        return  # removed or unreadable: the commit's own read of dvc.yaml and the catalog reports that
    used = _built_from(c.entry, c.tag)
    if used in now:
        return
    changed = sorted(k for k, v in now[-1].items() if used.get(k) != v)
    raise RegistryError(
        f"{c.ref}: the catalog entry {c.entry.name} changed while it was being built ({', '.join(changed)}): it was "
        f"built from the entry as it was, and dvc.lock would record it as built from the new one; nothing registered",
        hint=f"build it again from the catalog as it is now: `{format_name(c.tag).rebuild_command(c.entry.name, c.tag)}`")



def _restore_lock(settings: Settings, lock: Path, before: bytes | None, stage: str) -> None:
    """Put dvc.lock back as it was before this registration's commit, under DVC's lock; left as it is (with a
    warning) when another stage changed meanwhile, whose record a restore would undo."""
    import yaml

    def stages(data: bytes | None) -> dict[str, Any]:
        loaded = yaml.safe_load(data) if data else None
        return dict(loaded.get("stages") or {}) if isinstance(loaded, dict) else {}

    with dvcrepo.repo_lock(settings):
        now = lock.read_bytes() if lock.is_file() else None
        if now == before:
            return
        old, new = stages(before), stages(now)
        old.pop(stage, None)
        new.pop(stage, None)
        if old != new:
            log.warning("dvc.lock was changed by another registration meanwhile: %s is left as DVC wrote it "
                        "(`git checkout -- dvc.lock` restores the committed one)", stage)
            return
        if before is None:
            lock.unlink()
        else:
            write_text_atomic(lock, before.decode("utf-8"))


def _place_file(src: Path, dst: Path, *, weights: bool) -> None:
    """Place a build output: its weights as a hard link of the checked build output (one copy of their bytes on
    the builder; `track` makes the same inode the DVC cache's object), read-only; a copy across filesystems and
    for every other file (small, and left to DVC's copies: docs/scale.md, "One copy on the builder")."""
    if not weights:
        shutil.copyfile(src, dst)
    elif link_or_copy(src, dst):
        dst.chmod(0o444)


def _remove_stale_partials(dest: Path) -> None:
    """Remove what killed registrations of this tag left (`<tag>.partial-<pid>` of a pid that is gone).

    Only this tag's, and only dead writers': another tag of the model may be registering right now.
    """
    for p in clean_partials(dest.parent, of=dest.name):
        log.info("removed %s left by an interrupted registration", p)


def _describe(settings: Settings, directory: Path) -> tuple[ArtifactFile, ...]:
    hashes = hash_cache(settings)
    return tuple(
        ArtifactFile(path=p.relative_to(directory).as_posix(), sha256=hashes.sha256(p), size=p.stat().st_size)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    )


def _files_in_place(settings: Settings, c: Candidate, files: tuple[ArtifactFile, ...], *, hashed: bool) -> bool:
    directory = artifact_dir(settings, c.entry.name, c.tag)
    hashes = hash_cache(settings) if hashed else None
    for f in files:
        p = directory / f.path
        try:
            if p.stat().st_size != f.size:
                return False
        except FileNotFoundError:
            return False
        if hashes is not None and hashes.sha256(p) != f.sha256:
            return False
    on_disk = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
    return on_disk == {f.path for f in files}


def _validation(c: Candidate) -> Validation:
    return Validation(**verdict(c.report), smoke=c.report.smoke, report_sha256=c.report_sha256)


def _manifest(c: Candidate, tracked: Tracked, *, pushed: bool, plans: Serving | None = None,
              created_at: datetime | None = None) -> Manifest:
    """The manifest of `c` as tracked; `created_at`: the time its provenance signed (None: unsigned, now)."""
    return Manifest(
        name=c.entry.name,
        tag=c.tag,
        format=c.format,
        file=c.placed_as(c.files[0]),
        sha256=c.sha256,
        size_bytes=c.size_bytes,
        weights_bytes=weights_bytes((f.path, f.size) for f in tracked.files),
        files=list(tracked.files),
        source=SourceRef(**{k: c.source.get(k) for k in ("kind", "repo", "revision", "content_sha256")},
                         **({"origin": c.source["origin"]} if c.source.get("origin") else {})),
        parent=c.parent,
        toolchain=c.toolchain,
        recipe=c.recipe,
        recipe_sha256=c.recipe_sha256,
        validation=_validation(c),
        dvc=DvcRef(path=c.dvc_path, stage=c.stage, md5=tracked.md5, pushed=pushed),
        key=c.key,
        created_at=created_at or datetime.now(UTC).replace(microsecond=0),
        serving=plans,
    )
