"""What a format implements (`ArtifactFormat`), the table its module registers itself in, and the look-up by tag.

A format's module (pipelines/store/formats/gguf.py, compressed.py, or one a test writes) builds its
`ArtifactFormat` and calls `implement` on import; `implementation` imports the module its declared name points at
(pipelines/store/names.py) the first time one of its hooks is asked for, so reading a manifest or a dvc.yaml
never imports a toolchain wrapper, and no registry module imports a format's module by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from pipelines.core.errors import ConfigError
from pipelines.core.fsutil import hash_cache
from pipelines.core.resources import Places, ResourceCheck, require
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    BuildResult,
    Executed,
    Runner,
    Step,
    StepList,
    VariantOutcome,
    build_steps,
    content_key,
    execute,
    local_runner,
)
from pipelines.publish.oci import Blob, Image
from pipelines.source.catalog import CatalogEntry
from pipelines.store.candidate import Candidate
from pipelines.store.manifest import Manifest
from pipelines.store.names import NAMES, Format, FormatName, declare, format_name


@dataclass(frozen=True)
class ArtifactFormat:
    """One format, declared once: how to build and validate it, how a validated variant becomes a registration
    candidate, which serving files are published beside it, and what a pull of it offers."""

    names: FormatName
    candidate: Callable[[Any, VariantOutcome], Candidate]
    """(plan, validated outcome) → what registration takes (refuses a variant that did not pass)."""
    publish: Callable[[Settings, Candidate, Path], list[Path]]
    """Write the serving files into the artifact directory being placed (Modelfile and card; vllm.yaml and card)."""
    served: Callable[[Path, str, str], tuple[Path, Path]]
    """(the artifact's directory, its main file's path in it, its tag) → what the serving planner sizes (the GGUF or
    the directory), and the artifact as the plan files name it (the GGUF's file name; the checkpoint's tag)."""
    offer: Callable[[Path, Manifest, bool], dict[str, Any]]
    """After a pull into a directory: the commands that serve it, and what was run (PullResult fields)."""
    image: Callable[[Path, Manifest, tuple[Blob, ...]], Image]
    """(registered artifact directory, its manifest, extra layers) → the OCI image `modelmint publish` pushes."""
    image_config: str
    """The media type of that image's config blob: how a pull recognises the layout."""
    pull_command: Callable[[str, bool], list[str]]
    """(HOST/NAMESPACE/NAME:TAG, insecure) → the command that fetches the published image where it is used."""
    plan: Callable[..., Any] | None = None
    """(entry, settings, *, variants, revision) → the plan its steps share (fetches the source): its fetch step."""
    steps: Callable[..., StepList] | None = None
    """(plan, *, progress, asked, **options) → its step list (pipelines/core/steps.py), for either executor."""
    finish: Callable[[Any, StepList, Executed, Callable[[str], None]], BuildResult] | None = None
    """(plan, step list, what its steps left, progress) → the build's result, its summary file written."""
    header: Callable[[BuildResult], list[str]] = lambda _result: []
    """The lines a run report puts above the variants table (the source, the toolchain, the base)."""
    toolchain: Callable[[Settings], Path | None] = lambda _settings: None
    """The toolchain directory its steps run from (every Ray node must have it); None: it needs none."""
    scratch: Callable[[Any], list[Path]] = lambda _plan: []
    """(plan) → the build outputs only the build itself reads (GGUF: the f16 and its KL reference logits), removed
    once every variant asked for is registered unless Settings.keep_scratch (register.drop_scratch)."""
    resources: Callable[[Any, Places], ResourceCheck] | None = None
    """(plan, where the run writes) → the run's peak disk per filesystem and peak memory (pipelines/core/resources.py),
    checked after the plan and before its first step; None: not checked."""

    def build_here(
        self, entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None,
        revision: str | None = None, progress: Callable[[str], None] = lambda _msg: None, **options: Any,
    ) -> BuildResult:
        """Build and validate `entry`'s variants of this format on this machine, registering nothing (`modelmint
        reproduce`): its fetch, its step list and its finish run by the local executor."""
        return self.build_by(local_runner, entry, settings, variants=variants, revision=revision, progress=progress,
                             **options)

    def build_by(
        self, runner: Runner, entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None,
        revision: str | None = None, progress: Callable[[str], None] = lambda _msg: None,
        warn: Callable[[str], None] | None = None, places: Places | None = None, **options: Any,
    ) -> BuildResult:
        """This format's build alone (`fetch_step`'s list) run by `runner`: its result.

        Raises:
            RunTooLarge: the run's peak disk or memory does not fit (before its first step), unless
                MODELMINT_SKIP_RESOURCE_CHECK is set.
        """
        done = execute([self.fetch_step(entry, settings, variants=variants, revision=revision, progress=progress,
                                        warn=warn, places=places, **options)], runner, progress=progress)
        result: BuildResult = done.results[self.finish_step]
        return result

    @property
    def finish_step(self) -> str:
        """The name of its build's finish step in a run's list (its result is the BuildResult)."""
        return f"finish-{self.name}"

    def fetch_step(
        self, entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None,
        revision: str | None = None, progress: Callable[[str], None] = lambda _msg: None,
        warn: Callable[[str], None] | None = None, places: Places | None = None,
        arrange: Callable[[list[Step]], list[Step]] = lambda steps: steps,
        after: Callable[[Any, StepList, str], list[Step]] = lambda _plan, _listed, _finish: [],
        **options: Any,
    ) -> Step:
        """Its build as a run's steps (pipelines.core.steps.build_steps): `fetch-<format>`, whose result is the plan
        (the source fetched and checked; credentials left out, as a cached result must), then what that plan lays
        out: the check that the run fits the disks and the memory (`places`: where it writes; default its build
        directory only; RunTooLarge before its first step unless MODELMINT_SKIP_RESOURCE_CHECK is set), its step
        list (`arrange`d for the runner, its plan given this run's credentials again), its finish
        (`finish-<format>`) and `after` (the registration steps).
        Its failures, and those of the steps serving all its variants, are its asked variants' in a run that keeps
        going (the flow)."""
        hooks = self.stepwise()
        asked = tuple(variants if variants is not None else self.catalog_variants(entry))

        def plan(_got: Any) -> Any:
            planned = hooks.plan(entry, settings, variants=variants, revision=revision)
            return dataclasses.replace(planned, settings=planned.settings.without_secrets())

        def steps(planned: Any) -> StepList:
            if self.resources is not None and not settings.skip_resource_check:
                what = ", ".join(variants) if variants else "the catalog's variants"
                check = require(self.resources(planned, places or Places(settings.work_dir)),
                                what=f"{entry.name} ({what})", variants_option=self.option)
                for note in check.notes:  # a variant over the Hub's per-file limit, or split: said before any work
                    (warn or progress)(note)
            return hooks.steps(planned, progress=warn or progress, asked=variants, **options)

        def key(_got: Any) -> str:
            return content_key("fetch", self.name, entry.model_dump(mode="json"), revision, variants,
                               settings.plan_fields())

        fetch = Step(f"fetch-{self.name}", "fetch", run=plan, key=key, current=source_current, scope=asked,
                     say=lambda _got: f"fetch {entry.name}", phase="fetch", retries=3, retry_delays=(5, 30, 120))
        return build_steps(fetch, steps, hooks.finish, finish_name=self.finish_step, warn=warn or progress,
                           arrange=arrange, after=after,
                           # the plan as fetch returned it (and a cache stores it) has no credentials: its steps and
                           # finish run with this run's
                           given=lambda p: dataclasses.replace(p, settings=p.settings.with_secrets_of(settings)))

    def stepwise(self) -> Stepwise:
        """Its plan, step list and finish hooks, which every run of its variants runs (fetch_step).

        Raises:
            ConfigError: the format declares no plan, steps or finish (it cannot be built); a ModelmintError, so
                the flow fails its variants alone with an `error:` line.
        """
        if self.plan is None or self.steps is None or self.finish is None:
            missing = [n for n in ("plan", "steps", "finish") if getattr(self, n) is None]
            raise ConfigError(f"format {self.name} declares no {', '.join(missing)} hook: its variants cannot be "
                              "built step by step (the flow builds every format that way)",
                              hint=f"build them with `modelmint {self.command}`, or give the format its "
                                   f"{', '.join(missing)} hook (pipelines/store/formats/)")
        return Stepwise(self.plan, self.steps, self.finish)

    @property
    def name(self) -> Format:
        return self.names.name

    @property
    def stage(self) -> str:
        return self.names.stage

    @property
    def command(self) -> str:
        return self.names.command

    @property
    def option(self) -> str:
        return self.names.option

    def owns(self, tag: str) -> bool:
        return self.names.owns(tag)

    def catalog_variants(self, entry: CatalogEntry) -> list[str]:
        return self.names.catalog_variants(entry)

    def rebuild_command(self, name: str, tag: str) -> str:
        return self.names.rebuild_command(name, tag)


@dataclass(frozen=True)
class Stepwise:
    """A format's hooks for a build step by step: its plan, its step list, and its finish (ArtifactFormat)."""

    plan: Callable[..., Any]
    steps: Callable[..., StepList]
    finish: Callable[[Any, StepList, Executed, Callable[[str], None]], BuildResult]


IMPLEMENTED: dict[Format, ArtifactFormat] = {}
"""Every implemented format, in the order their modules registered."""


def implement(fmt: ArtifactFormat) -> ArtifactFormat:
    """Register a format's implementation (a format module calls this on import; its name is declared too)."""
    declare(fmt.names)
    IMPLEMENTED[fmt.name] = fmt
    return fmt


def implementation(name: Format) -> ArtifactFormat:
    """The implementation of format `name`, importing the module its declared name points at when needed.

    Raises:
        KeyError: no format of that name is declared.
    """
    if name not in IMPLEMENTED:
        import_module(NAMES[name].module)
    return IMPLEMENTED[name]


def format_of(tag: str) -> ArtifactFormat:
    """The format a variant tag builds: compressed-tensors for llmcompressor schemes (fp8, awq, …), else GGUF."""
    return implementation(format_name(tag).name)


def source_current(plan: Any) -> bool:
    """A plan handed back by an orchestrator's cache stands while its build directory exists and its source files
    are the ones it was made from (a stat each, the hash cache's sha256 unless a file changed)."""
    hashes = hash_cache(plan.settings)
    try:
        return bool(plan.out_dir.is_dir()) and all(
            hashes.sha256(plan.snapshot.path / rel) == sha for rel, sha in plan.snapshot.files.items()
        )
    except (FileNotFoundError, NotADirectoryError):
        return False
