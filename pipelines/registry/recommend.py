"""Which registered variant to run on the GPUs one has: the planner's fits, ranked by the gate's figures with their noise."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from pipelines.core.errors import ArtifactError, ConfigError, NotRegistered, RegistryError
from pipelines.core.gpus import NodeGroup, cluster_label, cluster_of
from pipelines.core.report import Figures, read_report
from pipelines.core.settings import Settings
from pipelines.core.vocab import COMPRESSED_SCHEMES, GGUF_TYPES
from pipelines.publish import planner
from pipelines.publish.servefiles import slug
from pipelines.registry.manifest import Manifest, list_manifests

GIB = 1 << 30
_NOT_YET_BUILT = ("q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k")
"""The smaller GGUF types offered when no registered variant fits (the ladder Ollama's library and the catalog use)."""
_UNQUANTIZED_BITS = {"f16": 16.0, "bf16": 16.0, "f32": 32.0}


def _bits(tag: str) -> float | None:
    """Bits per weight of a tag (llama.cpp's table for GGUF types; a compressed scheme's bits, plus a quarter bit of
    group scales for 4-bit ones), for estimating a model's parameters from a registered variant's bytes."""
    if tag in GGUF_TYPES:
        return GGUF_TYPES[tag].bpw
    if tag in COMPRESSED_SCHEMES:
        bits = COMPRESSED_SCHEMES[tag].bits
        return bits + 0.25 if bits < 8 else float(bits)
    return _UNQUANTIZED_BITS.get(tag)


def size_text(n: int) -> str:
    """Bytes as people read a model's size: GiB from 1 GiB up, else MiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class Choice:
    """One registered variant as the ranking sees it: its figures, its size, and the planner's answer."""

    ref: str
    tag: str
    format: str
    weights_bytes: int
    figures: Figures | None
    plan: planner.Plan | None = None
    refused: str | None = None
    nearest: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.plan is not None

    @property
    def kl(self) -> float:
        return self.figures.mean_kl if self.figures is not None else math.inf

    @property
    def kl_stderr(self) -> float:
        return (self.figures.mean_kl_stderr or 0.0) if self.figures is not None else 0.0

    def overlaps(self, other: Choice) -> bool:
        """Their mean KL figures lie within each other's standard errors (intervals of ± one standard error meet)."""
        return abs(self.kl - other.kl) <= self.kl_stderr + other.kl_stderr

    def figures_text(self) -> str:
        f = self.figures
        if f is None:
            return "no figures"
        kl = f"mean KL {f.mean_kl:.4g}" + (
            f" ± {f.mean_kl_stderr:.2g}" if f.mean_kl_stderr else " (no standard error)"
        )
        top = f"same top {f.same_top_pct:.1f} %" + (
            f" ± {f.same_top_stderr:.1f}" if f.same_top_stderr else ""
        )
        return f"{kl}, {top}, ΔPPL {f.dppl_pct:+.2f} %"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ref": self.ref,
            "tag": self.tag,
            "format": self.format,
            "weights_bytes": self.weights_bytes,
            "figures": self.figures.model_dump() if self.figures else None,
            "fits": self.fits,
        }
        if self.plan is not None:
            p = self.plan
            out["plan"] = {
                "gpus": p.label,
                "tp": p.tp,
                "pp": p.pp,
                "replicas": p.replicas,
                "max_model_len": p.max_model_len,
                "max_num_seqs": p.max_num_seqs,
            }
        else:
            out["refused"] = self.refused
            out["nearest"] = list(self.nearest)
        return out


@dataclass(frozen=True)
class Failed:
    """A built variant whose gate failed (its report in the work directory): shown, never recommended."""

    tag: str
    failures: tuple[str, ...]
    report: str


@dataclass
class Advice:
    """One model's answer: the winner (None: nothing registered fits, or nothing is measured), the ranking, and why."""

    name: str
    ranked: list[Choice] = field(default_factory=list)
    """The variants that fit, best first (ties within the standard errors broken by size)."""
    unfit: list[Choice] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    would_fit: list[str] = field(default_factory=list)
    """With no winner: what would fit (more GPUs, a shorter context, a smaller variant, a type not built yet)."""
    problem: str | None = None
    """Why the model could not be planned at all (its artifacts are not in this checkout, …)."""

    @property
    def winner(self) -> Choice | None:
        return self.ranked[0] if self.ranked else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "winner": self.winner.ref if self.winner else None,
            "ranked": [c.to_dict() for c in self.ranked],
            "unfit": [c.to_dict() for c in self.unfit],
            "failed": [{"tag": f.tag, "failures": list(f.failures), "report": f.report} for f in self.failed],
            "reasons": self.reasons,
            "commands": self.commands,
            "would_fit": self.would_fit,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Request:
    """What the user asked: the GPUs (as --gpus takes them), tokens per sequence, sequences at once."""

    gpus: str
    context: int | None = None
    concurrency: int = 1

    @property
    def cluster(self) -> list[NodeGroup]:
        return cluster_of(self.gpus)


def rank(choices: list[Choice]) -> list[Choice]:
    """Best first by mean KL divergence, noise-aware: the best unplaced variant and every one whose figure overlaps
    it within their standard errors are a tie, and a tie goes to the smaller (then to the lower figure)."""
    left = sorted(choices, key=lambda c: (c.kl, c.weights_bytes, c.ref))
    out: list[Choice] = []
    while left:
        best = left[0]
        tied = [c for c in left if c is best or c.overlaps(best)]
        out += sorted(tied, key=lambda c: (c.weights_bytes, c.kl, c.ref))
        left = [c for c in left if all(c is not t for t in tied)]
    return out


def _fp8(m: Manifest) -> bool:
    return str((m.recipe.get("recipe") or {}).get("scheme") or "").startswith("FP8")


def _local_shape(
    settings: Settings, manifests: list[Manifest]
) -> tuple[planner.ModelShape | None, str | None]:
    """The model's shape from the first of its variants present in this checkout (headers only; every variant of
    a model has the same shape), or why none could be read."""
    problems = []
    for m in manifests:
        directory = settings.repo_dir / m.dvc.path
        path = directory / m.file if m.format == "gguf" else directory
        if not (path.is_file() if m.format == "gguf" else (directory / "config.json").is_file()):
            continue
        try:
            return planner.served(path).shape, None
        except (ConfigError, ArtifactError) as err:
            problems.append(f"{m.ref}: {err.message}")
    if problems:
        return None, "; ".join(problems)
    refs = ", ".join(m.ref for m in manifests)
    return None, (
        f"none of its variants ({refs}) is in this checkout, and the planner reads the model's shape from "
        f"one: run `modelmint pull {manifests[0].ref}` (any one will do), then ask again"
    )


def failed_builds(settings: Settings, name: str, registered: set[str]) -> list[Failed]:
    """Variants of `name` built in the work directory whose gate failed and that are not registered."""
    out: dict[str, Failed] = {}
    base = settings.work_dir / name
    reports = sorted(base.glob("*/*.report.json")) if base.is_dir() else []
    for path in reports:
        report = read_report(path)  # None: not a report modelmint wrote, nothing to show
        judged = report.validation if report is not None else None
        if report is None or judged is None or judged.passed:
            continue
        tag = (report.variant or path.name.removesuffix(".report.json").removeprefix(f"{name}-")).lower()
        if tag not in registered:
            out[tag] = Failed(tag, tuple(judged.failures), str(path))
    return sorted(out.values(), key=lambda f: f.tag)


def _params(manifests: list[Manifest]) -> float | None:
    """The model's parameter count estimated from a registered variant's bytes and its type's bits per weight."""
    for m in sorted(manifests, key=lambda m: m.weights_bytes):
        bits = _bits(m.tag)
        if bits:
            return m.weights_bytes * 8 / bits
    return None


def _not_yet_built(
    settings: Settings, name: str, manifests: list[Manifest], ask: planner.Ask, cluster: list[NodeGroup]
) -> list[str]:
    """The largest GGUF type not registered yet whose estimated size fits, with the catalog line that builds it."""
    params = _params(manifests)
    if params is None:
        return []
    have = {m.tag for m in manifests}
    for tag in _NOT_YET_BUILT:
        size = int(params * GGUF_TYPES[tag].bpw / 8)
        if tag in have or size >= min(m.weights_bytes for m in manifests):
            continue
        try:
            planner.plan(planner.smaller_ask(ask, planner.Variant(f"{name}:{tag}", size)), cluster)
        except ConfigError:
            continue
        quants = _catalog_quants(settings, name)
        line = f"quants: [{', '.join([*quants, tag])}]" if quants is not None else f"quants: [{tag}]"
        return [
            f"{name}:{tag} (not built yet, about {size_text(size)}): in registry/catalog.yaml set the "
            f"entry {name}'s variants.gguf `{line}`, then `modelmint convert {name} --variants {tag} --register`"
        ]
    return []


def _catalog_quants(settings: Settings, name: str) -> list[str] | None:
    from pipelines.source.catalog import load_catalog

    try:
        entry = load_catalog(settings.catalog_path).get(name)
    except ConfigError:
        return None
    gguf = entry.variants.gguf
    return list(gguf.quants) if gguf is not None else None


def commands(settings: Settings, m: Manifest, request: Request) -> list[str]:
    """What to type to get the winner running: pull it, then serve it (Ollama for a GGUF, vLLM for a checkpoint)."""
    from pipelines.registry.images import publications

    if m.format == "gguf":
        try:
            published = [e["image"] for e in publications(settings, m) if isinstance(e.get("image"), str)]
        except RegistryError:  # a damaged publication record: the DVC remote still has it
            published = []
        if published:
            return [f"ollama pull {published[-1]}", f"ollama run {published[-1]}"]
        return [f"modelmint pull {m.ref}", f"ollama run {m.ref}"]
    out_dir = f"plans/{m.name}-{m.tag}"
    asked = f" --context {request.context}" if request.context else ""
    asked += f" --concurrency {request.concurrency}" if request.concurrency != 1 else ""
    groups = request.cluster
    where = (
        f"{out_dir}/{slug(str(groups[0]))}/vllm.yaml"
        if len(groups) == 1
        else f"{out_dir}/<gpu type>/vllm.yaml"
    )
    return [
        f"modelmint pull {m.ref}",
        f"modelmint plan {m.ref} --gpus {cluster_label(groups)}{asked} --out {out_dir}",
        f"vllm serve {m.dvc.path} --config {where}",
    ]


def advise(settings: Settings, name: str, manifests: list[Manifest], request: Request) -> Advice:
    """One model's advice for `request` (its manifests: every registered variant of it)."""
    advice = Advice(name, failed=failed_builds(settings, name, {m.tag for m in manifests}))
    measured = [m for m in manifests if m.validation.figures is not None]
    if not measured:
        advice.problem = (
            "no registered variant of it has figures to rank"
            if manifests
            else "no variant of it passed its gate: nothing is registered, so nothing is recommended"
        )
        return advice
    shape, why = _local_shape(settings, measured)
    if shape is None:
        advice.problem = why
        return advice
    cluster = request.cluster
    variants = tuple(planner.Variant(m.ref, m.weights_bytes, _fp8(m)) for m in measured)
    choices = []
    for m in measured:
        ask = planner.Ask(
            m.weights_bytes,
            shape,
            context=request.context,
            concurrency=request.concurrency,
            fp8_weights=_fp8(m),
            smaller=tuple(v for v in variants if v.ref != m.ref),
        )
        base = Choice(m.ref, m.tag, m.format, m.weights_bytes, m.validation.figures)
        try:
            plans = planner.plan(ask, cluster)
            choices.append(dataclasses.replace(base, plan=plans[0]))
        except planner.PlanRefused as err:
            choices.append(dataclasses.replace(base, refused=err.message, nearest=tuple(err.nearest)))
        except ConfigError as err:  # a context past the model's maximum: its hint says what fits
            choices.append(
                dataclasses.replace(base, refused=err.message, nearest=(err.hint,) if err.hint else ())
            )
    fitting = rank([c for c in choices if c.fits])
    advice.ranked, advice.unfit = (
        fitting,
        sorted((c for c in choices if not c.fits), key=lambda c: c.weights_bytes),
    )
    if not fitting:
        smallest = advice.unfit[0]
        advice.reasons.append(
            f"no registered variant fits {cluster_label(cluster)}: even the smallest, "
            f"{smallest.ref} ({size_text(smallest.weights_bytes)}), is refused: {smallest.refused}"
        )
        advice.would_fit = list(dict.fromkeys(smallest.nearest))
        smallest_ask = planner.Ask(
            smallest.weights_bytes, shape, context=request.context, concurrency=request.concurrency
        )
        advice.would_fit += _not_yet_built(settings, name, measured, smallest_ask, cluster)
        return advice
    win = fitting[0]
    advice.reasons.append(_why(win, fitting, advice.unfit))
    by_ref = {m.ref: m for m in measured}
    advice.commands = commands(settings, by_ref[win.ref], request)
    return advice


def _why(win: Choice, fitting: list[Choice], unfit: list[Choice]) -> str:
    p = win.plan
    assert p is not None
    lines = [
        f"{win.ref}: {win.figures_text()}, {size_text(win.weights_bytes)}; fits {p.label} as TP {p.tp} x PP "
        f"{p.pp}, {p.replicas} replica(s), max_model_len {p.max_model_len}, max_num_seqs {p.max_num_seqs}"
    ]
    tied = [c for c in fitting[1:] if c.overlaps(win)]
    if tied:
        lines.append(
            "ties within the standard errors with "
            + ", ".join(f"{c.ref} ({c.figures_text()}, {size_text(c.weights_bytes)})" for c in tied)
            + ": the smaller wins"
        )
    better_unfit = [c for c in unfit if c.kl < win.kl and not c.overlaps(win)]
    if better_unfit:
        lines.append("measured better but does not fit: " + ", ".join(c.ref for c in better_unfit))
    rest = [c for c in fitting[1:] if c not in tied]
    if rest:
        lines.append("measurably worse: " + ", ".join(f"{c.ref} (mean KL {c.kl:.4g})" for c in rest))
    return "; ".join(lines)


def recommend(settings: Settings, request: Request, names: list[str] | None = None) -> list[Advice]:
    """Advice for every registered model (or those named), in name order.

    Raises:
        ConfigError: --gpus that is not an inventory, or --context / --concurrency the planner refuses.
        NotRegistered: a name with no registered variant.
    """
    request.cluster  # noqa: B018 - an inventory that does not parse is refused before anything is read
    listing = list_manifests(settings)
    by_name: dict[str, list[Manifest]] = {}
    for m in listing.manifests:
        by_name.setdefault(m.name, []).append(m)
    wanted = list(dict.fromkeys(names)) if names else sorted(by_name)
    out = []
    for name in wanted:
        if name not in by_name:
            if failed_builds(settings, name, set()):
                out.append(
                    Advice(
                        name,
                        failed=failed_builds(settings, name, set()),
                        problem="no variant of it passed its gate: nothing is registered, so nothing is "
                        "recommended",
                    )
                )
                continue
            raise NotRegistered(f"{name}", sorted(by_name))
        out.append(advise(settings, name, by_name[name], request))
    return out
