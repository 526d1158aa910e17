"""One model's run, once, for every front-end: `run_model` is what `modelmint convert` / `compress` and the convert
flow run: the registration pre-flight, each format's plan, resource check, build steps and finish, the scratch
dropped, then its registration steps (register-<v>, publish-image-<v>), all by one executor.

The CLI runs it with the local executor; the Prefect flow (flows/convert.py) with its own, one task per step so the
UI shows them, adding only what Prefect adds: cache keys that skip a finished task without calling it, retries of
transient failures, concurrency slots, and the run's artifacts. The receipts (pipelines/core/steps.py) are the truth
about what is finished: a step whose receipt matches is skipped whether the CLI or the flow asks, and Prefect's
cache is only a faster way to the same answer (a cached task whose output is gone is run again).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipelines.core.errors import ModelmintError
from pipelines.core.report import CompressedReport, Figures, GateRecord
from pipelines.core.resources import Places
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    BuildResult,
    Executed,
    Inputs,
    Runner,
    Step,
    StepList,
    VariantError,
    VariantOutcome,
    content_key,
    execute,
    local_runner,
)
from pipelines.source.catalog import CatalogEntry
from pipelines.store.candidate import Candidate
from pipelines.store.formats import ArtifactFormat, format_of

if TYPE_CHECKING:
    from pipelines.oci.images import Published
    from pipelines.publish.oci import RegistryRef
    from pipelines.registry.register import Registration


@dataclass
class Run:
    """One format's build of one catalog entry, the lines a run report puts above its table, and what became of its
    registration (None when registration was not asked for)."""

    result: BuildResult
    registration: Registered | None = None
    header: list[str] = field(default_factory=list)

    @property
    def registered(self) -> dict[str, str] | None:
        """Variant → registry ref; None when registration was not asked for."""
        return None if self.registration is None else self.registration.refs

    @property
    def register_errors(self) -> dict[str, VariantError]:
        return {} if self.registration is None else self.registration.errors

    def rows(self) -> list[dict[str, str]]:
        return self.result.rows(self.registered, self.register_errors)

    def failure(self) -> ModelmintError | None:
        return self.result.failure(self.register_errors)

    def report(self, name: str) -> RunReport:
        """This run as the one run report the CLI prints."""
        return report_of(name, [self])


def registered_in(runs: list[Run]) -> Registered:
    """Every format's registrations, images and registration failures of one model's run."""
    out = Registered()
    for r in runs:
        out.update(r.registration or Registered())
    return out


def report_of(name: str, runs: list[Run]) -> RunReport:
    """The one run report of a model's run (every format): what the CLI prints and the flow's artifact tables."""
    got = registered_in(runs)
    asked = any(r.registration is not None for r in runs)
    return run_report(
        name, [r.result for r in runs], got.refs if asked else None, got.errors,
        header=[line for r in runs for line in r.header],
        dvc_paths={v: r.manifest.dvc.path for v, r in got.registrations.items()},
        published={v: (p.images, p.digest) for v, p in got.published.items()},
    )


# ---------------------------------------------------------------- the run report: what became of every variant


@dataclass(frozen=True)
class Cell:
    """One cell of the run report's table: its text, whether it is good or bad news, and whether it is a name to
    copy (a registry ref). A renderer decides how each looks (rich markup on the CLI, Markdown in the flow)."""

    text: str
    tone: Literal["ok", "bad"] | None = None
    code: bool = False


@dataclass(frozen=True)
class VariantLine:
    """What became of one variant asked for in a run: built, measured and judged (its outcome), registered,
    published, and the cause of its failure."""

    variant: str
    built: str
    """yes, refused (pre-flight), failed, or - (never reached)."""
    validated: str
    """pass, FAIL (measured and failed its gate), error (its validation failed), or -."""
    registration: str
    """Its registry ref, failed, - (not registered), or not asked."""
    cause: str
    outcome: VariantOutcome | None = None
    ref: str = ""
    """The registry ref it was registered as ("" when it was not)."""
    dvc_path: str = ""
    published: tuple[str, ...] = ()
    image_digest: str = ""

    @property
    def format(self) -> str:
        return format_of(self.variant).name

    @property
    def figures(self) -> Figures | None:
        judged = self.outcome.report.validation if self.outcome else None
        return judged.figures if judged else None

    @property
    def gate(self) -> GateRecord:
        judged = self.outcome.report.validation if self.outcome else None
        return judged.gate if judged else GateRecord()

    @property
    def verdict(self) -> str:
        o = self.outcome
        return ("pass" if o.passed else "FAIL: " + "; ".join(o.failures)) if o else "-"

    @property
    def scheme(self) -> str | None:
        """A compressed-tensors variant's scheme and the group size it was built with (None for other formats)."""
        report = self.outcome.report if self.outcome else None
        if not isinstance(report, CompressedReport):
            return None
        gs = (report.preflight or {}).get("group_size")
        return (report.scheme or "?") + (f" g{gs}" if gs else "")

    @property
    def serve(self) -> str | None:
        """How its smoke serve went (None: none ran)."""
        s = self.outcome.serving if self.outcome else None
        if s is None:
            return None
        return "skipped" if s.get("skipped") else ("ok" if s.get("ok") else "FAIL")

    def data(self) -> dict[str, Any]:
        """The line as data: the flow's table artifact row (tests/golden/gguf/flow-table.json)."""
        o, f, gate = self.outcome, self.figures, self.gate
        return {
            "variant": self.variant,
            "format": self.format,
            "built": self.built,
            "validated": self.validated,
            "size_mib": round(o.size_bytes / (1 << 20), 2) if o else None,
            "mean_kl": f.mean_kl if f else None, "max_mean_kl": gate.max_mean_kl,
            "same_top_pct": f.same_top_pct if f else None, "min_same_top_pct": gate.min_same_top_pct,
            "dppl_pct": f.dppl_pct if f else None, "max_dppl_pct": gate.max_dppl_pct,
            "gate": self.verdict,
            "registered": self.ref,
            "cause": self.cause,
            "sha256": o.digest if o else "",
            "dvc_path": self.dvc_path,
            "published": list(self.published),
            "image_digest": self.image_digest,
        }


def _num(v: float | None, digits: int, sign: str = "") -> str:
    return f"{v:{sign}.{digits}f}" if v is not None else "-"


def _limit(v: Any) -> str:
    return f" ({v:g})" if isinstance(v, int | float) else ""


@dataclass(frozen=True)
class RunReport:
    """One run of one catalog model, every format: the lines above the table (the source, the toolchains), and one
    line per variant asked for. `table` is the one table the CLI and the flow's artifact show."""

    name: str
    lines: tuple[VariantLine, ...]
    header: tuple[str, ...] = ()

    def table(self) -> tuple[list[str], list[list[Cell]]]:
        """The columns and rows every renderer shows: a scheme column and a serve column only where a variant has
        one; each figure with its gate's limit beside it."""
        schemes = any(line.scheme for line in self.lines)
        served = any(line.serve for line in self.lines)
        columns = ["variant", *(["scheme"] if schemes else []), "built", "size", "mean KL (max)",
                   "same top % (min)", "ΔPPL % (max)", *(["serve"] if served else []), "gate", "registered",
                   "cause of failure"]
        rows = []
        for line in self.lines:
            o, f, gate = line.outcome, line.figures, line.gate
            serve = line.serve
            rows.append([
                Cell(line.variant),
                *([Cell(line.scheme or "-")] if schemes else []),
                Cell(line.built, "bad" if line.built in ("refused", "failed") else None),
                Cell(f"{o.size_bytes / (1 << 20):,.1f} MiB" if o else "-"),
                Cell(_num(f.mean_kl if f else None, 5) + _limit(gate.max_mean_kl)),
                Cell(_num(f.same_top_pct if f else None, 2) + _limit(gate.min_same_top_pct)),
                Cell(_num(f.dppl_pct if f else None, 2, "+") + _limit(gate.max_dppl_pct)),
                *([Cell(serve or "-", "bad" if serve == "FAIL" else None)] if served else []),
                Cell(line.verdict, None if o is None else "ok" if o.passed else "bad"),
                Cell(line.registration, "bad" if line.registration == "failed" else None, code=bool(line.ref)),
                Cell(line.cause, "bad" if line.cause else "ok"),
            ])
        return columns, rows

    @property
    def failed(self) -> list[str]:
        return [line.variant for line in self.lines if line.cause]


def run_report(
    name: str, results: list[BuildResult], registered: dict[str, str] | None,
    register_errors: dict[str, VariantError] | None = None, *, header: list[str] | None = None,
    dvc_paths: Mapping[str, str] | None = None, published: Mapping[str, tuple[list[str], str]] | None = None,
) -> RunReport:
    """The run report of `results` (one per format built): `registered` maps variants to their refs (None:
    registration was not asked for), `dvc_paths` to their DVC paths, `published` to their images and digest."""
    dvc_paths, published = dvc_paths or {}, published or {}
    lines = []
    for result in results:
        for row in result.rows(registered, register_errors):
            v = row["variant"]
            images, digest = published.get(v, ([], ""))
            lines.append(VariantLine(
                v, row["built"], row["validated"], row["registered"], row["cause"], result.variants.get(v),
                ref=(registered or {}).get(v, ""), dvc_path=dvc_paths.get(v, ""), published=tuple(images),
                image_digest=digest,
            ))
    return RunReport(name, tuple(lines), tuple(header or ()))


RETRY_DELAYS = (10, 60, 300)
"""Seconds before each retry of a registration or an image push whose error is transient (a remote or registry
that may answer again); the orchestrator's retries only: the local executor does not retry."""


def preflight_registration(settings: Settings, entry: CatalogEntry, variants: list[str]) -> None:
    """What must hold before any build work when the run registers: every variant has its dvc.yaml stage, and a
    configured signing key can sign. The CLI and the flow both ask this, before their first step.

    Raises:
        RegistryError: a variant has no dvc.yaml stage (`modelmint dvc-yaml` writes them).
        SigningKeyError: MODELMINT_SIGNING_KEY names a key that cannot sign (pipelines/trust/signing.py).
    """
    from pipelines.store.dvcrepo import require_stages
    from pipelines.trust.signing import preflight

    require_stages(settings, entry.name, variants)
    preflight(settings)


def registry_places(settings: Settings, *, track: bool = True, oci: RegistryRef | None = None) -> Places:
    """Where a run that registers writes: its build directory, the repository's artifacts/ and, when DVC tracks
    the registration, the DVC cache and the default remote if it is a directory here; with `oci` (the run
    publishes), the registry's blob storage when it is served from this machine (each counted on its own
    filesystem by the resource check)."""
    from pipelines.publish.localregistry import registry_storage
    from pipelines.store.dvcrepo import cache_dir, local_remote_dir

    return Places(settings.work_dir, settings.artifacts_dir, cache_dir(settings) if track else None,
                  dvc_remote=local_remote_dir(settings) if track else None,
                  oci_registry=registry_storage(oci.host) if oci is not None else None, publishes=oci is not None)


def register_step(v: str) -> str:
    """The name of variant `v`'s registration step (its Prefect task run's name too)."""
    return f"register-{v}"


def image_step(v: str) -> str:
    """The name of variant `v`'s image push step."""
    return f"publish-image-{v}"


def registration_steps(
    settings: Settings, candidates: Mapping[str, Callable[[Inputs], Candidate]], *, needs: tuple[str, ...] = (),
    when: Callable[[str, Inputs], bool] = lambda _v, _got: True, track: bool = True, force: bool = False,
    say: Callable[[str], None] = lambda _msg: None, oci: RegistryRef | None = None,
) -> list[Step]:
    """The steps that register each validated variant (`candidates`: variant → a function making its candidate
    from the results of `needs`, the build's finish) and, when `oci` names a registry, publish its image there:
    steps like the build's, which the CLI's local executor and the flow's Prefect executor run alike
    (pipelines/core/steps.py), so a registration is the same transaction whichever runs it. `when(v, inputs)`:
    whether variant v is registered at all (it passed its gate).

    `register-<v>` is register.register: it refuses an older source commit (unless `force`) and a catalog entry
    that changed under the build, places, `dvc commit`s, pushes and writes the manifest last, and puts dvc.lock
    back when the commit or the push fails. It is one step, not one per phase: the restore spans the commit and
    the push, and a retry (a transient push failure) runs the whole transaction again, a no-op for what is done.
    `publish-image-<v>` pushes the registered variant's image; a registry that refuses one leaves it registered.
    """
    from pipelines.registry.register import register, registered
    from pipelines.store.dvcrepo import check_remote

    out: list[Step] = []
    for v, make in candidates.items():

        def made(got: Inputs, make: Callable[[Inputs], Candidate] = make) -> Candidate:
            return dataclasses.replace(make(got), force=force)

        def run(got: Inputs, made: Callable[[Inputs], Candidate] = made) -> Registration:
            c = made(got)
            done = register(settings, c, track_with_dvc=track, push=track)
            state = "already registered" if not done.ran else "registered" + (" and pushed" if track else "")
            if done.reuploaded:
                state += f" (re-uploaded {len(done.reuploaded)} missing or damaged object(s) to the DVC remote)"
            say(f"{done.manifest.ref} {state} → {done.path}")
            return dataclasses.replace(done, candidate=c)

        def key(got: Inputs, made: Callable[[Inputs], Candidate] = made) -> str:
            # the blob's sha256 + recipe + validation report + toolchain; the entry decides the serving files
            c = made(got)
            return content_key("register", c.key, c.entry.model_dump(mode="json"), track)

        def current(r: Registration) -> bool:
            # An orchestrator's cached registration stands while it is registered here and the remote's copy is
            # whole: the local executor's rerun re-uploads a damaged or missing object (register.register), so a
            # cache hit must not skip that (a read of the remote, as there; no tool runs).
            done = registered(settings, r.candidate, tracked=track) if r.candidate is not None else None
            if done is None or not track:
                return done is not None
            m = done.manifest
            if m.dvc.md5 is None:
                return True
            return not any(o.damaged for o in check_remote(settings, m.dvc.md5, {f.path: f.sha256 for f in m.files}).bad)

        out.append(Step(
            name=register_step(v), task="register", run=run, key=key, current=current, needs=needs, variants=(v,),
            when=functools.partial(when, v), stage="register", output=settings.artifacts_dir,
            retries=3 if track else 0, retry_delays=RETRY_DELAYS,
        ))
        if oci is not None:
            out.append(Step(
                name=image_step(v), task="publish-image", needs=(register_step(v),), variants=(v,),
                stage="publish", run=functools.partial(_publish_image, settings, oci, v, say),
                retries=3, retry_delays=RETRY_DELAYS,
            ))
    return out


def _publish_image(settings: Settings, registry: RegistryRef, v: str, say: Callable[[str], None],
                   got: Inputs) -> Published:
    """Push the registered variant to the OCI registry (pipelines.oci.images.publish_image): every run asks
    the registry (a HEAD per blob, a GET per tag) and uploads or tags only what it lacks, so it is never cached."""
    from pipelines.oci.images import publish_image

    ref = got[register_step(v)].manifest.ref
    p = publish_image(settings, ref, registry)
    say(f"{p.manifest.ref} published as {', '.join(p.images)} ({p.digest}): {len(p.uploaded)} blob(s) uploaded, "
        f"{len(p.present)} already there, {len(p.tagged)} tag(s) written")
    return p


@dataclass
class Registered:
    """What the registration steps left: each variant's registration and published image, and each failure."""

    registrations: dict[str, Registration] = field(default_factory=dict)
    published: dict[str, Published] = field(default_factory=dict)
    errors: dict[str, VariantError] = field(default_factory=dict)

    @property
    def refs(self) -> dict[str, str]:
        return {v: r.manifest.ref for v, r in self.registrations.items()}

    def update(self, other: Registered) -> None:
        """Add another format's registrations (variant names never repeat across formats)."""
        self.registrations.update(other.registrations)
        self.published.update(other.published)
        self.errors.update(other.errors)


def registered_by(done: Executed, variants: list[str]) -> Registered:
    """What the registration steps of `variants` left in a run: each registration, image and registration failure."""
    return Registered(
        registrations={v: r for v in variants if (r := done.results.get(register_step(v))) is not None},
        published={v: p for v in variants if (p := done.results.get(image_step(v))) is not None},
        errors={v: e for v in variants if (e := done.errors.get(v)) is not None and e.stage in ("register", "publish")},
    )


def register_passed(
    settings: Settings, candidates: dict[str, Callable[[], Candidate]], *, track: bool = True,
    say: Callable[[str], None] = lambda _msg: None, force: bool = False,
) -> tuple[dict[str, str], dict[str, VariantError]]:
    """Register each passing variant (`candidates`: variant → a function making its candidate) with the local
    executor: the registration steps alone. Returns the refs made and the errors met. `force` registers a source
    commit older than a tag's current version (register.refuse_older)."""
    makers = {v: (lambda _got, make=make: make()) for v, make in candidates.items()}
    done = execute(registration_steps(settings, makers, track=track, force=force, say=say), local_runner, progress=say)
    got = registered_by(done, list(candidates))
    return got.refs, got.errors


def run_model(
    entry: CatalogEntry, settings: Settings, asked: list[tuple[ArtifactFormat, list[str] | None]], *,
    runner: Runner | None = None, revision: str | None = None, register: bool = False, track: bool = True,
    force: bool = False, oci: RegistryRef | None = None, keep_going: bool = False,
    progress: Callable[[str], None] = lambda _msg: None, warn: Callable[[str], None] | None = None,
    said_in_steps: Callable[[str], None] | None = None,
    arrange: Callable[[list[Step]], list[Step]] = lambda steps: steps, **options: Any,
) -> ModelRun:
    """One catalog model's run, the one sequence `modelmint convert` / `compress` and the convert flow run: the
    run's one step list, run by one `execute` (`runner`: the flow's Prefect runner; None: here, the CLI's local one).

    Before any work, when registering: every asked variant's dvc.yaml stage and the signing key (all formats at
    once). Then the list, per format (`asked`: each with its variants; None: the catalog's): `fetch-<format>`,
    whose plan lays out the rest (ArtifactFormat.fetch_step): the disk and memory check of everything the run
    writes (build directory, artifacts/, DVC cache and local remote, the OCI registry's storage), its build steps,
    `finish-<format>`; when registering, `scratch-<format>` (the f16 and the reference logits dropped once every
    variant passed, before registration), `register-<v>` for what passed its gate (place, dvc commit, push,
    manifest, signature; dvc.lock restored when the commit or push fails) and, with `oci`, `publish-image-<v>`.
    Last, once anything was registered, the `site` step rebuilds the registry site (MODELMINT_WORK_DIR/site) if
    the registry changed.

    `keep_going` (the flow): a format whose build fails as a whole with a variant's kind of error fails its
    variants and the next format still runs; without it (the CLI) that error is raised. `said_in_steps`: where the
    registration steps say what they did (default `progress`).

    Raises:
        RegistryError, SigningKeyError: registering and a stage is missing or the key cannot sign (before any work).
        ConfigError, SourceError, ToolchainMissing, DiskFullError, RunTooLarge: what stops every variant alike.
    """
    todo = [(fmt, v, v if v is not None else fmt.catalog_variants(entry)) for fmt, v in asked if v is None or v]
    if register:
        preflight_registration(settings, entry, [x for _fmt, _v, names in todo for x in names])
    places = registry_places(settings, track=track, oci=oci) if register else None
    said = said_in_steps or progress
    steps = [
        fmt.fetch_step(entry, settings, variants=v, revision=revision, progress=progress, warn=warn, places=places,
                       arrange=arrange, **options,
                       after=functools.partial(_registration_after, fmt, settings, names, track=track, force=force,
                                               oci=oci, say=said) if register else _nothing_after)
        for fmt, v, names in todo
    ]
    if register:
        steps.append(site_step(settings, said, needs=tuple(register_step(x) for _f, _v, names in todo for x in names)))
    done = execute(steps, runner or local_runner, progress=progress, keep_going=keep_going)
    runs = []
    for fmt, _v, names in todo:
        result = done.results.get(fmt.finish_step) or failed_build(entry.name, names, done.errors)
        runs.append(Run(result, registered_by(done, names) if register else None, fmt.header(result)))
    return ModelRun(runs, done.results.get(SITE_STEP))


def _nothing_after(_plan: Any, _listed: StepList, _finish: str) -> list[Step]:
    return []


def _registration_after(
    fmt: ArtifactFormat, settings: Settings, variants: list[str], plan: Any, listed: StepList, finish: str, *,
    track: bool, force: bool, oci: RegistryRef | None, say: Callable[[str], None],
) -> list[Step]:
    """After a format's finish: its scratch dropped once every variant passed (the f16 and its reference logits go
    before registration: what follows reads only the variants; MODELMINT_KEEP_SCRATCH keeps them), then
    `register-<v>` (and `publish-image-<v>`) for each variant that passed its gate."""
    from pipelines.registry.register import drop_scratch

    scratch = f"scratch-{fmt.name}"

    def drop(got: Inputs) -> list[Path]:
        return drop_scratch(settings, fmt.scratch(plan), got[finish])

    def candidate(v: str, got: Inputs) -> Candidate:
        result: BuildResult = got[finish]
        return fmt.candidate(result.plan, result.variants[v])

    def passed(v: str, got: Inputs) -> bool:
        return v in got[finish].passed

    names = list(dict.fromkeys([*listed.asked, *variants]))
    return [
        Step(scratch, "scratch", run=drop, needs=(finish,), inline=True),
        *registration_steps(settings, {v: functools.partial(candidate, v) for v in names}, needs=(finish, scratch),
                            when=passed, track=track, force=force, say=say, oci=oci),
    ]


@dataclass
class ModelRun:
    """One catalog model's run: each format's (Run), and the registry site's refresh after its registrations (None:
    nothing was registered)."""

    runs: list[Run]
    site: SiteRefresh | None = None


@dataclass(frozen=True)
class SiteRefresh:
    """What the `site` step did: the index page and whether it was rebuilt now, or why it was not."""

    index: Path | None
    built: bool = False
    error: str | None = None


SITE_STEP = "site"


def site_step(settings: Settings, say: Callable[[str], None], *, needs: tuple[str, ...] = ()) -> Step:
    """The run's last step: the registry site rebuilt when what it shows changed (pipelines.site.build.refresh_site),
    once any of the registrations it `needs` is done (none: not run). A site that cannot be written is said, never a
    failed run: the variants are registered by then."""

    def run(_got: Inputs) -> SiteRefresh:
        from pipelines.site.build import default_site_dir, refresh_site

        try:
            index, built = refresh_site(settings, default_site_dir(settings))
        except (ModelmintError, OSError) as err:
            say(f"the registry site was not rebuilt: {err}")
            return SiteRefresh(None, error=str(err))
        except Exception as err:  # a bug in the site's rendering must not fail a run whose variants are registered
            logging.getLogger(__name__).exception("the registry site was not rebuilt (a modelmint bug: please "
                                                  "report it)")
            return SiteRefresh(None, error=f"{type(err).__name__}: {err}")
        if built:
            say(f"registry site rebuilt: {index}")
        return SiteRefresh(index, built)

    def key(_got: Inputs) -> str:
        from pipelines.site.build import inputs_key

        return content_key("site", inputs_key(settings))  # what the site is built from: a rerun with it unchanged

    def current(done: SiteRefresh) -> bool:
        return done.index is not None and done.index.is_file()

    from pipelines.site.build import default_site_dir

    return Step(name=SITE_STEP, task="site", run=run, key=key, current=current, output=default_site_dir(settings),
                needs=needs, needs_any=True, stage="site", phase="site", retries=0)


def failed_build(name: str, variants: list[str], errors: Mapping[str, VariantError]) -> BuildResult:
    """A build that failed as a whole (its fetch, a step every variant needs) in a run that kept going: every variant
    asked, with the failure the run recorded for it."""
    return BuildResult(name, Path(), {}, {}, {}, [], errors={v: e for v in variants if (e := errors.get(v))},
                       asked=list(variants))


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
