"""Build → validate → register, once, for every format: what `modelmint convert` and `modelmint compress` run.

The Prefect flow (flows/convert.py) runs the same steps, one task each so the UI shows them, and adds only what
Prefect adds: cache keys that skip a finished task without calling it, retries of transient failures,
concurrency slots, and the run's artifacts. The receipts (pipelines/core/steps.py) are the truth about what is
finished: a step whose receipt matches is skipped whether the CLI or the flow asks, and Prefect's cache is only a
faster way to the same answer (a cached task whose output is gone is run again).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines.core.errors import ModelmintError
from pipelines.core.settings import Settings
from pipelines.core.steps import BuildResult, VariantError
from pipelines.registry.formats import ArtifactFormat
from pipelines.source.catalog import CatalogEntry


@dataclass
class Run:
    """One format's build of one catalog entry, and what became of its registration (when asked for)."""

    result: BuildResult
    registered: dict[str, str] | None = None
    """Variant → registry ref; None when registration was not asked for."""
    register_errors: dict[str, VariantError] = field(default_factory=dict)

    def rows(self) -> list[dict[str, str]]:
        return self.result.rows(self.registered, self.register_errors)

    def failure(self) -> ModelmintError | None:
        return self.result.failure(self.register_errors)


def register_passed(
    settings: Settings, candidates: dict[str, Callable[[], Any]], *, track: bool = True,
    say: Callable[[str], None] = lambda _msg: None, force: bool = False,
) -> tuple[dict[str, str], dict[str, VariantError]]:
    """Register each passing variant (`candidates`: variant → a function making its candidate); one whose
    registration fails is reported and the others still go on. Returns the refs made and the errors met.
    `force` registers a source commit older than a tag's current version (register.refuse_older)."""
    from pipelines.registry.register import register, register_each

    def one(c: Any) -> Any:
        done = register(settings, c, track_with_dvc=track, push=track)
        state = "already registered" if not done.ran else "registered" + (" and pushed" if track else "")
        if done.reuploaded:
            state += f" (re-uploaded {len(done.reuploaded)} missing or damaged object(s) to the DVC remote)"
        say(f"{done.manifest.ref} {state} → {done.path}")
        return done

    done, errors = register_each(candidates, one, force=force, say=say)
    return {v: r.manifest.ref for v, r in done.items()}, errors


def build_and_register(
    fmt: ArtifactFormat, entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None,
    revision: str | None = None, register: bool = False, track: bool = True, force: bool = False,
    progress: Callable[[str], None] = lambda _msg: None, **options: Any,
) -> Run:
    """Build and validate `entry`'s variants of format `fmt` (the catalog's, or `variants`), then register the
    ones that passed when `register` is set (with DVC and a push when `track` is set).

    With `register`, every variant must have its dvc.yaml stage before any work starts. Every variant is finished
    before the run reports the failures of the others (`Run.failure`).

    Raises:
        RegistryError: `register` is set and a variant has no dvc.yaml stage (before any work).
        ConfigError, SourceError, ToolchainMissing, DiskFullError: what stops every variant alike.
    """
    if register:
        from pipelines.registry.dvcrepo import require_stages

        require_stages(settings, entry.name, variants if variants is not None else fmt.catalog_variants(entry))
    result = fmt.build_here(entry, settings, variants=variants, revision=revision, progress=progress, **options)
    if not register or result.plan is None:
        return Run(result)
    plan = result.plan
    refs, errors = register_passed(
        settings, {v: functools.partial(fmt.candidate, plan, result.variants[v]) for v in result.passed}, track=track,
        say=progress, force=force,
    )
    return Run(result, refs, errors)


def build_every(
    fmt: ArtifactFormat, settings: Settings, build_one: Callable[[str], None], *,
    failed: Callable[[str, str], None] = lambda _name, _why: None,
) -> None:
    """`build_one(name)` for every catalog entry with variants of format `fmt`, one after another: one entry's
    ModelmintError does not stop the others (`failed(name, first line of its message)` is told at once).

    Raises:
        ModelmintError: naming every entry that failed, after the last one ran.
    """
    from pipelines.source.catalog import load_catalog

    failures: dict[str, str] = {}
    for entry in load_catalog(settings.catalog_path).models:
        if not fmt.catalog_variants(entry):
            continue
        try:
            build_one(entry.name)
        except ModelmintError as e:
            failures[entry.name] = e.message.splitlines()[0]
            failed(entry.name, failures[entry.name])
    if failures:
        raise ModelmintError(f"{len(failures)} model(s) failed: {', '.join(failures)}",
                             hint="each model's own error is printed above; rerun `modelmint convert NAME` for one")
