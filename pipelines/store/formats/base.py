"""What a format implements (`ArtifactFormat`), the table its module registers itself in, and the look-up by tag.

A format's module (pipelines/store/formats/gguf.py, compressed.py, or one a test writes) builds its
`ArtifactFormat` and calls `implement` on import; `implementation` imports the module its declared name points at
(pipelines/store/names.py) the first time one of its hooks is asked for, so reading a manifest or a dvc.yaml
never imports a toolchain wrapper, and no registry module imports a format's module by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from pipelines.core.errors import ConfigError
from pipelines.core.resources import Places, ResourceCheck, require
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    BuildResult,
    Executed,
    Runner,
    Step,
    StepList,
    VariantOutcome,
    build_with,
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
    build: Callable[..., BuildResult] | None = None
    """(entry, settings, *, variants, revision, progress, **options) → BuildResult: build and validate here (the CLI);
    None: its plan, step list and finish run by the local executor (`build_here`)."""
    plan: Callable[..., Any] | None = None
    """(entry, settings, *, variants, revision) → the plan its steps share (fetches the source): the flow's fetch."""
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
        """Build and validate `entry`'s variants of this format on this machine (the CLI's path): its own `build`,
        or its plan, its step list run by the local executor, and its finish."""
        if self.build is not None:
            return self.build(entry, settings, variants=variants, revision=revision, progress=progress, **options)
        return self.build_by(local_runner, entry, settings, variants=variants, revision=revision, progress=progress,
                             **options)

    def build_by(
        self, runner: Runner, entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None,
        revision: str | None = None, progress: Callable[[str], None] = lambda _msg: None,
        warn: Callable[[str], None] | None = None, plan: Callable[[], Any] | None = None,
        arrange: Callable[[list[Step]], list[Step]] = lambda steps: steps, places: Places | None = None,
        **options: Any,
    ) -> BuildResult:
        """Its plan (or `plan()`: the flow's cached fetch), the check that the run fits the disks and the memory
        (`places`: where it writes; default its build directory only), its step list run by `runner`, and its
        finish (pipelines.core.steps.build_with): the one sequence the CLI and the flow run.

        Raises:
            RunTooLarge: the run's peak disk or memory does not fit (before its first step), unless
                MODELMINT_SKIP_RESOURCE_CHECK is set.
        """
        hooks = self.stepwise()

        def steps(planned: Any) -> StepList:
            if self.resources is not None and not settings.skip_resource_check:
                asked = ", ".join(variants) if variants else "the catalog's variants"
                check = require(self.resources(planned, places or Places(settings.work_dir)),
                                what=f"{entry.name} ({asked})", variants_option=self.option)
                for note in check.notes:  # a variant over the Hub's per-file limit, or split: said before any work
                    (warn or progress)(note)
            return hooks.steps(planned, progress=warn or progress, asked=variants, **options)

        return build_with(
            runner, entry.name, plan or (lambda: hooks.plan(entry, settings, variants=variants, revision=revision)),
            steps, hooks.finish, progress=progress, warn=warn, arrange=arrange,
        )

    def stepwise(self) -> Stepwise:
        """Its plan, step list and finish hooks, which the flow (and `build_here` without a `build`) runs.

        Raises:
            ConfigError: the format declares no plan, steps or finish (it can only build through `build`); a
                ModelmintError, so the flow fails its variants alone with an `error:` line.
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
