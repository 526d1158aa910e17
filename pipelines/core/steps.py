"""The format-neutral step core: the step type and its executors, content keys, receipts, step results, variant
outcomes and failures, timing.

Every format's build (pipelines/gguf/build.py for GGUF, pipelines/compressed/build.py for compressed-tensors) is a set of
resumable steps made of these parts, and registration, the CLI and the Prefect flow read them without knowing
the format:

- a step's output is keyed by content (`content_key`: source hashes, recipe, tool versions, never paths or
  timestamps) and is finished when its receipt says so: `write_receipt` for one file, `write_dir_receipt` for a
  directory, written only after the output was checked, so a killed step never leaves one;
- `load_receipt` / `load_dir_receipt` give the receipt back only while the output is unchanged (size and mtime
  of every file), so a rerun skips finished steps without re-reading large files, and a replaced or deleted
  output is rebuilt; a damaged receipt (`Receipt`: a key no step writes, a field of the wrong type) is a miss too,
  said in a warning;
- a variant ends as a `VariantOutcome` (measured, with its validation report) or a `VariantError` (no verdict:
  refused before the work, or a tool failed); `keep_failure` records the second so the run goes on;
- `BuildResult` is what one build of one format returns, and `summary` what it writes beside its outputs.

The step list and how it runs (the sections at the end):

A format turns its plan into `Step`s (pipelines/gguf/build.py `gguf_steps`, pipelines/compressed/build.py
`compressed_steps`): each names what it makes (its content key and output), how to make it (`run`, which skips by
its receipt on its own), whether a result handed back by a cache still stands (`current`), what it needs, and the
variants it serves. `execute` walks the list in order with keep-going: a step that fails costs only its variants
(kept as VariantError, the steps that need it are not run) unless it serves them all (fetch, convert: the build
fails). How a batch of steps runs is the runner's business: `local_runner` here (a thread pool, for the CLI), or
the Prefect runner in flows/steps.py (one task per step, with its cache key, retries, tags and Ray placement).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeGuard, TypeVar

from pydantic import ConfigDict, StrictInt, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # pydantic reads a TypedDict from typing_extensions on Python < 3.12

from pipelines.core.errors import DiskFullError, ModelmintError, ToolchainMissing, ToolError
from pipelines.core.fsutil import HashCache, sha256_file, write_text_atomic
from pipelines.core.report import (
    CalibrationRecord,
    Figure,
    GGUFRecord,
    ObservedFallback,
    QuantizeRecord,
    Validation,
    VariantReport,
    read_report,
)

log = logging.getLogger(__name__)


def content_key(*parts: Any) -> str:
    """A cache key from content (hashes, recipes, tool versions), never from paths or timestamps."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------- receipts: "this output is finished"


def receipt_path(out: Path) -> Path:
    """Where the receipt of output `out` (a file or a directory) lives: beside it."""
    return out.with_name(out.name + ".receipt.json")


_Forbid = with_config(ConfigDict(extra="forbid"))


@_Forbid
class FileReceipt(TypedDict, total=False):
    """One file of a finished directory, as its receipt records it."""

    mtime_ns: StrictInt
    sha256: str
    size: StrictInt


@_Forbid
class ImatrixReceipt(TypedDict, total=False):
    """What llama-imatrix recorded in an importance matrix (core/ggufheader.read_imatrix), and its format."""

    chunk_size: StrictInt
    chunks: StrictInt
    datasets: list[str]
    format: str


@_Forbid
class MetadataFromReceipt(TypedDict, total=False):
    """The finished checkpoint a compressed-tensors output was copied from with new metadata only."""

    files: list[str]
    path: str
    source_key: str | None
    tree_sha256: str


@_Forbid
class Receipt(TypedDict, total=False):
    """What a receipt holds: the key of the inputs, the output's size, mtime and hash (a directory's per file), and
    what its step keeps (write_receipt's and write_dir_receipt's `extra`: pipelines/gguf/build.py,
    pipelines/compressed/build.py)."""

    calibration: CalibrationRecord
    copied_from: str
    fallback: ObservedFallback | None
    files: dict[str, FileReceipt]
    gguf: GGUFRecord
    imatrix: ImatrixReceipt
    key: str
    metadata_from: MetadataFromReceipt
    mtime_ns: StrictInt
    peak_rss: StrictInt | None
    quantize: QuantizeRecord
    retemplated_from: str
    sha256: str
    size: StrictInt
    source_key: str | None
    tree_sha256: str
    wall_s: Figure
    weights_key: str | None


@functools.cache
def _receipt_adapter() -> TypeAdapter[Receipt]:
    return TypeAdapter(Receipt)


def _damaged(receipt: dict[str, Any]) -> str | None:
    """What is wrong with a receipt read back (the first field that is not as a step writes it), or None."""
    try:
        _receipt_adapter().validate_python(receipt)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}" + (f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else "")
    return None


def _write(out: Path, receipt: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(receipt, indent=2, sort_keys=True, default=str) + "\n"
    if (problem := _damaged(json.loads(text))) is not None:
        # a step keeping something Receipt does not declare: read back, it would count as damaged on every run
        raise ValueError(f"the receipt of {out} would not read back ({problem}): declare it in steps.Receipt")
    write_text_atomic(receipt_path(out), text)
    return receipt


def _read(out: Path, key: str) -> dict[str, Any] | None:
    """The receipt of `out` if it was written for `key`. A damaged one (not JSON, a field of the wrong type, a key
    no step writes) is a miss, as DVC takes a damaged lock entry for a changed stage: the step is said to run
    again, and does, writing a sound receipt over it."""
    path = receipt_path(out)
    try:
        receipt = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as err:
        log.warning("receipt %s is damaged (not JSON: %s): its step runs again", path, err)
        return None
    if not isinstance(receipt, dict):
        log.warning("receipt %s is damaged (not a JSON object): its step runs again", path)
        return None
    if receipt.get("key") != key:
        return None  # another build's, or inputs that changed since
    if (problem := _damaged(receipt)) is not None:
        log.warning("receipt %s is damaged (%s): its step runs again", path, problem)
        return None
    return receipt


def load_receipt(out: Path, key: str) -> dict[str, Any] | None:
    """The receipt of a finished step whose inputs hash to `key` and whose output is still the same file.

    A missing or replaced output file (size or mtime changed) is a miss, not a hit.
    """
    receipt = _read(out, key)
    try:
        st = out.stat()
    except FileNotFoundError:
        return None
    if receipt is None or receipt.get("size") != st.st_size or receipt.get("mtime_ns") != st.st_mtime_ns:
        return None
    return receipt


def recorded_receipt(out: Path, key: str) -> dict[str, Any] | None:
    """The receipt recorded for `out` under `key`, whether or not the output is still there: what a scratch output
    (removed after registration: Settings.keep_scratch) was, for lineage and for the steps it fed."""
    return _read(out, key)


def kept_or_dropped_receipt(out: Path, key: str) -> dict[str, Any] | None:
    """The receipt of `out` while the output is there unchanged, or its recorded one once the output was removed
    (scratch); None when the output is there but replaced, or was never finished under `key`."""
    receipt = load_receipt(out, key)
    if receipt is None and not out.exists():
        return recorded_receipt(out, key)
    return receipt


def _sha256_of(path: Path, hashes: HashCache | None) -> str:
    """The file's sha256, through `hashes` where given: the one read of a variant's bytes that gives its sha256 and
    its md5 together, remembered for its inode, so that registration (the manifest's sha256, DVC's md5) and
    publishing find both without reading the file again."""
    return hashes.sha256(path) if hashes is not None else sha256_file(path)


def write_receipt(out: Path, key: str, *, hashes: HashCache | None = None, digest: bool = True,
                  **extra: Any) -> dict[str, Any]:
    """Record that file `out` is finished: its size, mtime and sha256, and what the step wants to keep.

    `hashes`: the settings' hash cache (fsutil.hash_cache), for an output that is registered later: its sha256
    and md5 then come from this one read; or for one hashed as it was written (the converter's f16,
    fsutil.WrittenDigest), which is then not read at all. `digest=False`: no sha256 in the receipt, for an
    output whose next step hashes it while it reads it anyway (a GGUF variant, in its validate step:
    made_of)."""
    st = out.stat()
    made = {"sha256": _sha256_of(out, hashes)} if digest else {}
    return _write(out, {"key": key, "size": st.st_size, "mtime_ns": st.st_mtime_ns, **made, **extra})


def made_of(receipt: dict[str, Any]) -> str:
    """What a receipt says its output is, for the keys of the steps it feeds: its sha256, or for a receipt
    written without one (write_receipt's digest=False) the content key it was made under; a step keyed so
    checks that what it finds made for that key names the file's sha256 (gguf.build._names)."""
    if "sha256" in receipt:
        return str(receipt["sha256"])
    return content_key("made", receipt["key"])


def tree_files(d: Path) -> list[Path]:
    """Every file under directory `d`, in a stable order."""
    return sorted(p for p in d.rglob("*") if p.is_file())


def write_dir_receipt(d: Path, key: str, *, hashes: HashCache | None = None, **extra: Any) -> dict[str, Any]:
    """Record that directory `d` is finished: every file's size, mtime and sha256, and their combined hash
    (`hashes`: as for write_receipt)."""
    files = {}
    for p in tree_files(d):
        st = p.stat()
        files[p.relative_to(d).as_posix()] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                              "sha256": _sha256_of(p, hashes)}
    tree = content_key(sorted((k, v["sha256"]) for k, v in files.items()))
    return _write(d, {"key": key, "tree_sha256": tree, "size": sum(v["size"] for v in files.values()),
                      "files": files, **extra})


def load_dir_receipt(d: Path, key: str) -> dict[str, Any] | None:
    """The receipt of a finished directory made from inputs hashing to `key`, if no file in it changed since."""
    receipt = _read(d, key)
    if receipt is None or not d.is_dir():
        return None
    files = receipt.get("files", {})
    present = {p.relative_to(d).as_posix(): p for p in tree_files(d)}
    if set(present) != set(files):
        return None
    for rel, p in present.items():
        st = p.stat()
        if files[rel]["size"] != st.st_size or files[rel]["mtime_ns"] != st.st_mtime_ns:
            return None
    return receipt


def load_report(path: Path, key: str | None) -> VariantReport | None:
    """The validation report at `path` (any version, read in today's shape) if it was made for `key` (any
    finished report when `key` is None)."""
    report = read_report(path)
    return report if report is not None and (key is None or report.key == key) else None


@dataclass(frozen=True)
class StepResult:
    path: Path
    receipt: dict[str, Any]
    ran: bool
    """False when the step was skipped because its receipt matched."""


# ---------------------------------------------------------------- how a variant ends


@dataclass(frozen=True)
class VariantError:
    """A variant that got no verdict: refused before any tool started, or a tool failed building or measuring it.

    Kept as data (the error's class, message, hint) so a run can finish the other variants and report this one.
    """

    variant: str
    stage: str
    """preflight, build, validate or register."""
    error: str
    message: str
    hint: str | None = None
    transient: bool = False

    summary: str = ""
    """The one line that says what went wrong (for a tool: its own error line, not the command)."""

    @classmethod
    def of(cls, variant: str, stage: str, err: ModelmintError) -> VariantError:
        if isinstance(err, ToolError):
            lines = [ln.strip() for ln in err.stderr_tail.splitlines() if ln.strip()]
            said = [ln for ln in lines if re.search(r"\b(ERROR|[A-Za-z]*Error)\b", ln)]
            line = (said or lines or [""])[-1]
            summary = f"{Path(err.argv[0]).name if err.argv else 'the tool'} exited with code {err.returncode}: {line}"
        else:
            summary = err.message.strip().splitlines()[0] if err.message.strip() else ""
        return cls(variant, stage, type(err).__name__, err.message, err.hint, err.transient, summary)

    @property
    def cause(self) -> str:
        """One line: the stage, the error and what went wrong."""
        return f"{self.stage}: {self.error}: {self.summary}"

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "error": self.error, "message": self.message, "hint": self.hint,
                "transient": self.transient, "cause": self.cause}


def variant_scoped(err: BaseException) -> TypeGuard[ModelmintError]:
    """Whether an error belongs to one variant (the run goes on with the others) rather than to the machine.

    A full disk or a missing toolchain stops every variant alike: those end the run at once.
    """
    return isinstance(err, ModelmintError) and not isinstance(err, DiskFullError | ToolchainMissing)


def keep_failure(errors: dict[str, VariantError], variant: str, stage: str, err: Exception) -> VariantError:
    """Record `err` as `variant`'s failure at `stage`, so the run goes on with the other variants; an error that
    is not the variant's own (see variant_scoped) is raised again instead."""
    if not variant_scoped(err):
        raise err
    errors[variant] = VariantError.of(variant, stage, err)
    return errors[variant]


@dataclass
class VariantOutcome:
    """A measured variant: where it is, its digest, and its validation report (with the verdict).

    `report` is the report as its file has it, but for a verdict a later check changed in this run (a failed
    serve); `serving` and `serve_config` are this run's, never written into the report file."""

    variant: str
    path: Path
    digest: str
    """The file's sha256 (GGUF), or the hash over every file's sha256 (a checkpoint directory)."""
    size_bytes: int
    report: VariantReport
    cached: bool
    shards: list[Path] = field(default_factory=list)
    serving: dict[str, Any] | None = None
    """The smoke serve's record (compressed-tensors with --serve), None when none ran."""
    serve_config: Path | None = None
    """The serve config written beside the variant (compressed-tensors)."""

    @property
    def validation(self) -> Validation:
        """The verdict and the figures it judged (the report's `validation` block)."""
        return self.report.judged

    @property
    def passed(self) -> bool:
        return self.validation.passed

    @property
    def failures(self) -> list[str]:
        return list(self.validation.failures)


# ---------------------------------------------------------------- what one build returns


class BuildPlan(Protocol):
    """What a format's plan tells the format-neutral parts about itself."""

    summary_name: str
    """The file the build's summary is written to, in the build's output directory."""

    def advice_context(self) -> tuple[int | None, bool | None]:
        """The source's parameter count and whether an importance matrix was used (None: not known / not asked)."""
        ...


@dataclass
class BuildResult:
    name: str
    out_dir: Path
    source: dict[str, Any]
    base: dict[str, Any]
    """The receipt of the base the variants were made from (GGUF: the f16 conversion; empty when none)."""
    variants: dict[str, VariantOutcome]
    tools_run: list[str]
    """Every step that ran a tool in this build (empty when everything was cached)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Wall seconds per phase, cached phases included."""
    plan: BuildPlan | None = None
    """The plan the build ran (a format's: GGUFPlan, CompressPlan; registration reads its keys, recipe and paths)."""
    errors: dict[str, VariantError] = field(default_factory=dict)
    """Variants that got no verdict: refused at pre-flight, or a tool failed while building or measuring them."""
    preflight: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per variant, what the shape check before the work found (block fallback share, chosen group size)."""
    asked: list[str] = field(default_factory=list)
    """Every variant the run was asked for, in order."""

    @property
    def summary_path(self) -> Path:
        """The build's summary file (the plan's summary_name in the output directory; build.json without a plan)."""
        return self.out_dir / (self.plan.summary_name if self.plan is not None else "build.json")

    @property
    def passed(self) -> list[str]:
        return [q for q, v in self.variants.items() if v.passed]

    @property
    def all_passed(self) -> bool:
        """Every variant the run was asked for was built, validated and passed its gate (none failed, none errored)."""
        return set(self.asked) | set(self.variants) | set(self.errors) <= set(self.passed)

    @property
    def failed(self) -> list[str]:
        """Variants that were measured and failed their gate."""
        return [q for q, v in self.variants.items() if not v.passed]

    def cause(self, v: str) -> str | None:
        """Why variant `v` failed, in one line (the stage first), or None when it passed."""
        if v in self.errors:
            return self.errors[v].cause
        o = self.variants.get(v)
        if o is not None and not o.passed:
            return "gate: " + "; ".join(o.failures)
        return None

    def advice(self, v: str) -> str:
        """What to try for failed variant `v`: gate advice from its own figures, or the hint of the error it met."""
        from pipelines.core.report import advice_for_report

        if v in self.errors:
            return self.errors[v].hint or f"its whole message is under errors.{v} in {self.summary_path}"
        params, imatrix = self.plan.advice_context() if self.plan is not None else (None, None)
        return advice_for_report(v, self.variants[v].report, params=params, imatrix=imatrix)

    def rows(
        self, registered: dict[str, str] | None = None, register_errors: dict[str, VariantError] | None = None
    ) -> list[dict[str, str]]:
        """One row per variant asked for: built, validated, registered, and the cause of a failure.

        `registered` maps variants to their registry refs (None: registration was not asked for).
        """
        register_errors = register_errors or {}
        out = []
        for v in [*self.asked, *(n for n in self.variants if n not in self.asked)]:
            err, o = self.errors.get(v), self.variants.get(v)
            stage = err.stage if err else None
            built = {"preflight": "refused", "build": "failed"}.get(stage or "", "yes" if o or stage else "-")
            validated = "pass" if o and o.passed else "FAIL" if o else "error" if stage == "validate" else "-"
            if registered is None:
                reg = "not asked"
            elif v in registered:
                reg = registered[v]
            else:
                reg = "failed" if v in register_errors else "-"
            cause = self.cause(v) or (register_errors[v].cause if v in register_errors else "")
            out.append({"variant": v, "built": built, "validated": validated, "registered": reg, "cause": cause})
        return out

    def failure(self, register_errors: dict[str, VariantError] | None = None) -> ModelmintError | None:
        """The error a run ends with when any variant failed (after every other one was finished), else None."""
        from pipelines.core.errors import VariantsFailed

        register_errors = register_errors or {}
        asked = [r["variant"] for r in self.rows()]
        causes = {v: c for v in asked if (c := self.cause(v) or (register_errors[v].cause if v in register_errors else None))}
        if not causes:
            return None
        advice = {v: (register_errors[v].hint or "") if v in register_errors and self.cause(v) is None else self.advice(v)
                  for v in causes}
        return VariantsFailed(asked, causes, advice)


def summary(
    result: BuildResult, per_variant: Callable[[VariantOutcome], dict[str, Any]], **top: Any
) -> dict[str, Any]:
    """What a build writes beside its outputs (build.json, compress.json): every variant's place, digest, verdict
    and figures (`per_variant` adds the format's own keys), every failure, the pre-flight findings and timings."""
    return {
        "name": result.name,
        "source": result.source,
        **top,
        "timings": result.timings,
        "variants": {
            n: {"path": str(v.path), "size_bytes": v.size_bytes, "passed": v.passed, "failures": v.failures,
                "validation": v.validation.model_dump(mode="json"), "preflight": result.preflight.get(n), **per_variant(v)}
            for n, v in result.variants.items()
        },
        "errors": {n: e.to_dict() for n, e in result.errors.items()},
        "preflight": result.preflight,
    }


def write_summary(result: BuildResult, per_variant: Callable[[VariantOutcome], dict[str, Any]], **top: Any) -> Path:
    """Write `summary(...)` to the plan's summary file in the build's output directory, atomically."""
    path = result.summary_path
    write_text_atomic(path, json.dumps(summary(result, per_variant, **top), indent=2, sort_keys=True) + "\n")
    return path


# ---------------------------------------------------------------- the step list and its executors

P = TypeVar("P")
R = TypeVar("R")

Inputs = dict[str, Any]
"""The results of the steps a step needs, by step name."""

RECORD = "record"
"""A `record` step's input holding what the steps it needs left (an Executed): a build's finish reads it."""


def _none(_inputs: Inputs) -> None:
    return None


def _always(_result: Any) -> bool:
    return True


def _no_tools(_result: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class Step:
    """One resumable step of a run: what it makes, from what, and how."""

    name: str
    """Unique in its list: fetch-gguf, convert, quantize-q4_k_m, validate-q8_0, compress-fp8, register-q8_0, site."""
    task: str
    """The kind of step (convert, quantize, validate, compress, …): the orchestrator's task name and tag."""
    run: Callable[[Inputs], Any]
    """Make the output (or find it finished by its receipt) and return the step's result."""
    key: Callable[[Inputs], str | None] = _none
    """The content key of what it makes, given its inputs (None: not cacheable by an orchestrator)."""
    output: Path | None = None
    """Where its output lives (part of an orchestrator's cache key: two checkouts never share a result)."""
    current: Callable[[Any], bool] = _always
    """Whether a result an orchestrator's cache hands back still stands (its output is there and unchanged)."""
    needs: tuple[str, ...] = ()
    """Steps whose results it takes; it is not run when any failed (or, with `needs_any`, when all failed)."""
    needs_any: bool = False
    variants: tuple[str, ...] = ()
    """The variants it serves: its failure is theirs. Empty: it serves every variant of its build (`scope`), and
    its failure ends the run, or with keep-going (the flow) fails every one of them."""
    scope: tuple[str, ...] = ()
    """For a step serving every variant of its build: those variants (a step a `then` plans inherits its parent's)."""
    stage: str = "build"
    """The stage its failures are recorded under (build, validate)."""
    phase: str = ""
    """The timings bucket its wall time adds to (default: its task)."""
    say: Callable[[Inputs], str | None] = _none
    """What to tell the user before it runs (None: nothing, e.g. its output is finished already)."""
    tools: Callable[[Any], list[str]] = _no_tools
    """The tools its run started, from its result (the build's tools_run)."""
    when: Callable[[Inputs], bool] = _always
    """Whether it has anything to do, given its inputs (a registration: its variant passed its gate). False: it
    is passed over, neither finished nor failed, and what needs it is not run."""
    then: Callable[[Any], StepList] | None = None
    """The steps its result plans (a fetch's plan → the build's step list, finish and registration): run right
    after it; the variants they refuse before any work are failed at once."""
    record: bool = False
    """It takes what the steps it needs left (their results, the failures of the variants they and it serve, the
    tools they ran and their timings: an Executed under RECORD), not their results alone: a build's finish."""
    inline: bool = False
    """Bookkeeping an orchestrator runs in place, with no task of its own: it makes nothing worth caching or
    retrying (a build's finish, dropping its scratch)."""
    group: str | None = None
    """Consecutive steps of one group run together, `width` at a time."""
    width: int = 1
    threads: int | None = None
    """The threads its tool is given (the orchestrator's resources follow it)."""
    place: str | None = None
    """The Ray resources it asks for (flows.raycluster step names: quantize, validate, compress)."""
    retries: int = 1
    """How often an orchestrator retries it after a transient failure."""
    retry_delays: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class PerVariant:
    """What a step serving several variants returns when some of them failed inside it (the others' results)."""

    outcomes: dict[str, Any]
    errors: dict[str, VariantError] = field(default_factory=dict)


@dataclass
class StepList:
    """A format's plan as steps: what to run, and what was decided before any of it (refusals, pre-flight)."""

    steps: list[Step]
    errors: dict[str, VariantError] = field(default_factory=dict)
    """Variants refused before the work (they have no steps)."""
    preflight: dict[str, Any] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    """Every variant the run was asked for, in order."""


@dataclass
class Executed:
    """What running a step list left: every finished step's result, every variant's failure, the tools run, timings."""

    results: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, VariantError] = field(default_factory=dict)
    tools_run: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    ran: list[tuple[str, tuple[str, ...], float, list[str]]] = field(default_factory=list)
    """Each batch run: its timings bucket, its steps, its wall seconds, and the tools its steps started."""

    def of(self, names: tuple[str, ...], variants: set[str]) -> Executed:
        """What the steps `names` left: their results, the tools they ran, the wall time of the batches they ran in
        (by bucket), and the failures of `variants` (the ones they serve)."""
        mine = set(names)
        timings: dict[str, float] = {}
        tools: list[str] = []
        for phase, batch, seconds, started in self.ran:
            if mine & set(batch):
                timings[phase] = round(timings.get(phase, 0.0) + seconds, 3)
                tools += started
        return Executed({n: self.results[n] for n in names if n in self.results},
                        {v: e for v, e in self.errors.items() if v in variants}, tools, timings)


Batch = list[tuple[Step, Inputs]]
Runner = Callable[[Batch], list[Any]]
"""Runs a batch of ready steps; returns, in order, each one's result or the exception it raised."""


def _next_batch(pending: list[Step]) -> list[Step]:
    batch = [pending.pop(0)]
    while pending and batch[0].group is not None and pending[0].group == batch[0].group:
        batch.append(pending.pop(0))
    return batch


def _unique(steps: list[Step], seen: dict[str, Step]) -> None:
    for s in steps:
        if s.name in seen:
            raise ValueError(f"two steps are named {s.name!r} in one run (a modelmint bug: please report it)")
        seen[s.name] = s


def _ready(s: Step, done: Executed, listed: dict[str, Step]) -> Inputs | None:
    """The inputs of `s` when it is to run now; None when it is passed over."""
    got: Inputs = {n: done.results[n] for n in s.needs if n in done.results}
    if (len(got) < len(s.needs) and not s.needs_any) or (s.needs and not got):
        return None  # what it needs failed: its variants already carry that failure
    if s.variants and all(v in done.errors for v in s.variants):
        return None
    if s.record:
        served = {*s.scope, *(v for n in s.needs if n in listed for v in (*listed[n].variants, *listed[n].scope))}
        got[RECORD] = done.of(s.needs, served)
    return got if s.when(got) else None


def _failed(s: Step, err: BaseException, done: Executed, keep_going: bool, progress: Callable[[str], None]) -> None:
    """Record `err` as the failure of the variants `s` serves, or raise it: a step serving every variant of its build
    ends the run unless it keeps going (then its build's variants fail); what is not a variant's (a full disk) ends
    it always (variant_scoped)."""
    serves = s.variants or (s.scope if keep_going and variant_scoped(err) else ())
    if not serves or not isinstance(err, Exception):
        raise err
    for v in serves:
        progress(f"{v} failed: {keep_failure(done.errors, v, s.stage, err).cause}")


def execute(
    steps: list[Step],
    runner: Runner,
    *,
    progress: Callable[[str], None] = lambda _msg: None,
    keep_going: bool = False,
) -> Executed:
    """Run `steps` in order through `runner`, keep going past a variant's failure, and collect what they left. A
    step's `then` puts the steps its result plans right after it (a fetch's build, finish and registrations).

    `keep_going` (the flow): a step serving every variant of its build (no `variants`) that fails with a variant's
    kind of error fails that build's variants (its `scope`) and the other builds still run.

    Raises:
        ModelmintError: a step serving every variant failed (its build cannot go on) and not `keep_going`; any
            error that is not a variant's own (a full disk, a missing toolchain: steps.variant_scoped).
    """
    done = Executed()
    pending = list(steps)
    seen: dict[str, Step] = {}
    _unique(pending, seen)
    while pending:
        ready: Batch = []
        for s in _next_batch(pending):
            if (got := _ready(s, done, seen)) is not None:
                ready.append((s, got))
        if not ready:
            continue
        for s, got in ready:
            if msg := s.say(got):
                progress(msg)
        phase = ready[0][0].phase or ready[0][0].task
        start = time.perf_counter()
        outcomes = runner(ready)
        seconds = time.perf_counter() - start
        done.timings[phase] = round(done.timings.get(phase, 0.0) + seconds, 3)
        started: list[str] = []
        planned: list[Step] = []
        for (s, _got), result in zip(ready, outcomes, strict=True):
            if isinstance(result, BaseException):
                _failed(s, result, done, keep_going, progress)
                continue
            done.results[s.name] = result
            if isinstance(result, PerVariant):
                done.errors.update(result.errors)
            started += s.tools(result)
            if s.then is not None:
                try:
                    listed = s.then(result)
                except Exception as err:
                    _failed(s, err, done, keep_going, progress)
                    continue
                children = [c if c.variants or c.scope else dataclasses.replace(c, scope=s.scope)
                            for c in listed.steps]
                _unique(children, seen)
                done.errors.update(listed.errors)
                planned += children
        done.tools_run += started
        done.ran.append((phase, tuple(s.name for s, _got in ready), seconds, started))
        pending[0:0] = planned
    return done


def _call(s: Step, got: Inputs) -> Any:
    try:
        return s.run(got)
    except Exception as err:
        return err


def local_runner(batch: Batch) -> list[Any]:
    """Run a batch here: one step in this thread, a group in a thread pool `width` wide (the CLI's runner)."""
    if len(batch) == 1:
        return [_call(*batch[0])]
    with ThreadPoolExecutor(max_workers=max(1, batch[0][0].width)) as pool:
        futures = [pool.submit(functools.partial(_call, s, got)) for s, got in batch]
    return [f.result() for f in futures]


Finish = Callable[[P, StepList, Executed, Callable[[str], None]], R]
"""(plan, its step list, what the steps left, where to say what it found wrong) → the build's result."""


def build_steps(
    fetch: Step,
    steps: Callable[[P], StepList],
    finish: Finish[P, R],
    *,
    finish_name: str = "finish",
    warn: Callable[[str], None] = lambda _msg: None,
    arrange: Callable[[list[Step]], list[Step]] = lambda steps: steps,
    after: Callable[[P, StepList, str], list[Step]] = lambda _plan, _listed, _finish: [],
    given: Callable[[P], P] = lambda plan: plan,
) -> Step:
    """A build as one step list: `fetch` (its result is the plan), then what the plan lays out: its step list
    (`steps`; `arrange` regroups it for the runner: on Ray, every validate step at once), the build's finish (a
    `record` step named `finish_name`: the format's finish over what the list left, its summary file written), and
    `after(plan, step list, finish_name)`: the steps that take the finished build (registration). `given(plan)`
    is the plan as those steps take it (the fetched plan given the run's credentials, which no cache stores)."""

    def planned(fetched: P) -> StepList:
        plan = given(fetched)
        listed = steps(plan)
        names = (fetch.name, *(s.name for s in listed.steps))

        def finished(got: Inputs) -> R:
            return finish(plan, listed, got[RECORD], warn)

        done = Step(finish_name, "finish", run=finished, needs=names, needs_any=True, record=True, inline=True,
                    scope=tuple(dict.fromkeys([*listed.asked, *listed.errors])), phase="finish")
        return StepList([*arrange(listed.steps), done, *after(plan, listed, finish_name)], listed.errors,
                        listed.preflight, listed.asked)

    return dataclasses.replace(fetch, then=planned)


def build_with(
    runner: Runner,
    what: str,
    plan: Callable[[], P],
    steps: Callable[[P], StepList],
    finish: Finish[P, R],
    *,
    progress: Callable[[str], None] = lambda _msg: None,
    warn: Callable[[str], None] | None = None,
    arrange: Callable[[list[Step]], list[Step]] = lambda steps: steps,
) -> R:
    """A build alone, as a run's step list has it (build_steps): the plan (fetch, timed), its step list run by
    `runner` (the CLI's `local_runner`, the flow's Prefect runner), then the format's finish (its summary file).

    `warn` is told what the finish and the list found wrong before any work (a refused variant); default
    `progress`.
    """
    fetch = Step("fetch", "fetch", run=lambda _got: plan(), say=lambda _got: f"fetch {what}", phase="fetch",
                 inline=True)
    done = execute([build_steps(fetch, steps, finish, warn=warn or progress, arrange=arrange)], runner,
                   progress=progress)
    result: R = done.results["finish"]
    return result
