"""Which registered variant to run on the machine one has, by the engine that serves it (a GGUF on Ollama or llama.cpp,
sized by llama.cpp's own allocation; a compressed-tensors checkpoint on vLLM, by the planner), ranked by the gate's
figures with their noise."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.core.errors import ArtifactError, ConfigError, NotRegistered, RegistryError
from pipelines.core.gpus import NodeGroup, cluster_label, cluster_of
from pipelines.core.report import Figures, perplexity_positions, read_report
from pipelines.core.settings import Settings
from pipelines.core.vocab import COMPRESSED_SCHEMES, GGUF_TYPES
from pipelines.publish import planner
from pipelines.publish.llamacpp_memory import GPU_RESERVE as GPU_RESERVE
from pipelines.publish.llamacpp_memory import METAL_RESERVE as METAL_RESERVE
from pipelines.publish.llamacpp_memory import OLLAMA_NUM_CTX as OLLAMA_NUM_CTX
from pipelines.publish.llamacpp_memory import GgufPlan as GgufPlan
from pipelines.publish.llamacpp_memory import (
    LayeredWeights,
    LlamaCppContext,
    gguf_machine,
    gguf_num_ctx,
    llamacpp_memory,
    ollama_planned_name,
    read_layered_weights,
)
from pipelines.publish.llamacpp_memory import plan_gguf as plan_gguf
from pipelines.publish.llamacpp_memory import size_text as size_text
from pipelines.publish.servefiles import ollama_start_script, slug
from pipelines.store.manifest import Manifest, list_manifests

GIB = 1 << 30
_NOT_YET_BUILT = ("q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k")
"""The smaller GGUF types offered when no registered variant fits (the ladder Ollama's library and the catalog use)."""
_UNQUANTIZED_BITS = {"f16": 16.0, "bf16": 16.0, "f32": 32.0}

ENGINES = ("ollama", "llama.cpp", "vllm")
"""What serves a variant: Ollama or llama-server for a GGUF, vLLM for a compressed-tensors checkpoint."""
GGUF_ENGINES = ("ollama", "llama.cpp")
MAX_CONCURRENCY = 65_536
"""More sequences at once than one server takes (vLLM plans at most planner.MAX_NUM_SEQS; llama-server's slots each
hold a context): a bound on --concurrency, past which the searches and slot counts mean nothing."""
HIGH_CONCURRENCY = 8
"""From this many sequences at once a vLLM checkpoint is weighed against a GGUF winner."""


def _bits(tag: str) -> float | None:
    """Bits per weight of a tag (llama.cpp's table for GGUF types; a compressed scheme's bits, plus a quarter bit of
    group scales for 4-bit ones), for estimating a model's parameters from a registered variant's bytes."""
    if tag in GGUF_TYPES:
        return GGUF_TYPES[tag].bpw
    if tag in COMPRESSED_SCHEMES:
        bits = COMPRESSED_SCHEMES[tag].bits
        return bits + 0.25 if bits < 8 else float(bits)
    return _UNQUANTIZED_BITS.get(tag)


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
    gguf: GgufPlan | None = None
    """A GGUF's plan for Ollama or llama.cpp (`plan` is vLLM's, for a checkpoint)."""
    on: Basis | None = None
    """What its figures were scored on (None: the whole evaluation, as far as anything says)."""
    measured: tuple[Figures, Basis] | None = None
    """Its own figures and what they were scored on, where `figures` are its running figures over fewer chunks, the
    ones it shares with the variants it is ranked against (on_first)."""

    @property
    def scored(self) -> Basis:
        return self.on or Basis(None, None, self.figures.tokens if self.figures is not None else None)

    def chunk_counts(self) -> set[int]:
        """The numbers of first chunks of the evaluation this variant has figures over: its own, and each chunk's
        running figures where its manifest keeps them."""
        if self.figures is None:
            return set()
        counts = {r.chunks for r in self.figures.running or ()}
        return counts | ({self.scored.chunks} if self.scored.chunks is not None else set())

    def on_first(self, chunks: int) -> Choice:
        """This variant as ranked on the first `chunks` chunks of the evaluation (one of chunk_counts): its running
        figures there, its own kept in `measured`."""
        b = self.scored
        if chunks == b.chunks or self.figures is None:
            return self
        f = self.figures.on_first(chunks)
        if f is None:
            raise ValueError(f"{self.ref} has no figures over its first {chunks} chunks")
        return dataclasses.replace(self, figures=f, on=Basis(chunks, b.of, f.tokens, b.sha256, b.ctx),
                                   measured=(self.figures, b))

    @property
    def fits(self) -> bool:
        return self.plan is not None or self.gguf is not None

    @property
    def engine(self) -> str:
        return self.gguf.engine if self.gguf is not None else "vllm" if self.plan is not None else ""

    @property
    def offloaded_in_part(self) -> bool:
        """A GGUF whose layers do not all fit the GPU: it runs, at the cost its plan states."""
        return self.gguf is not None and self.gguf.partial

    def fits_text(self) -> str:
        if self.gguf is not None:
            return self.gguf.summary()
        p = self.plan
        return (f"vLLM: TP {p.tp} x PP {p.pp}, {p.replicas} replica(s), max_model_len {p.max_model_len}, "
                f"max_num_seqs {p.max_num_seqs}") if p is not None else "no"

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
        out = f"{kl}, {top}, ΔPPL {f.dppl_pct:+.2f} %"
        if self.scored.tokens is not None:
            out += f" on {self.scored.text()}"
        if self.measured is not None:
            own, on = self.measured
            out += (f" (the first chunks every variant ranked with it was scored on; over its own {on.text()}: "
                    f"mean KL {own.mean_kl:.4g}, same top {own.same_top_pct:.1f} %)")
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ref": self.ref,
            "tag": self.tag,
            "format": self.format,
            "weights_bytes": self.weights_bytes,
            "figures": self.figures.model_dump(exclude={"running"}) if self.figures else None,
            "scored_on": dataclasses.asdict(self.scored),
            "fits": self.fits,
        }
        if self.measured is not None:
            own, on = self.measured
            out["measured"] = {"figures": own.model_dump(exclude={"running"}), "scored_on": dataclasses.asdict(on)}
        if self.gguf is not None:
            out["engine"] = self.gguf.engine
            out["gguf_plan"] = self.gguf.to_dict()
        elif self.plan is not None:
            p = self.plan
            out["engine"] = "vllm"
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
    warnings: list[str] = field(default_factory=list)
    """What the winner's plan caps or assumes (the planner's warnings, a partial offload's cost, ...)."""

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
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class Request:
    """What the user asked: the machine (as --gpus takes it, cpu: and apple: ones too), tokens per sequence,
    sequences at once, and the engine (None: each variant's own, Ollama for a GGUF and vLLM for a checkpoint).

    Raises:
        ConfigError: a context or concurrency below one, a concurrency past MAX_CONCURRENCY, an unknown engine.
    """

    gpus: str
    context: int | None = None
    concurrency: int = 1
    engine: str | None = None

    def __post_init__(self) -> None:
        if self.context is not None and self.context < 1:
            raise ConfigError(
                f"--context {self.context} is no context: a sequence holds at least one token",
                hint="omit --context (the model's maximum; Ollama's 4096 for a GGUF) or give a positive number",
            )
        if self.concurrency < 1:
            raise ConfigError(
                f"--concurrency {self.concurrency}: at least one sequence is served",
                hint="give --concurrency 1 or more",
            )
        if self.concurrency > MAX_CONCURRENCY:
            raise ConfigError(
                f"--concurrency {self.concurrency} is more sequences at once than one server takes (vLLM plans "
                f"at most {planner.MAX_NUM_SEQS}, the rest queue; modelmint sizes at most {MAX_CONCURRENCY})",
                hint=f"give the sequences served at once, e.g. --concurrency {planner.MAX_NUM_SEQS}",
            )
        if self.engine is not None and self.engine not in ENGINES:
            import difflib

            near = difflib.get_close_matches(self.engine.lower(), ENGINES, n=1, cutoff=0.5)
            raise ConfigError(
                f"--engine {self.engine!r} is not one modelmint plans for ({', '.join(ENGINES)})",
                hint=(f"did you mean --engine {near[0]}? " if near else "")
                + "ollama or llama.cpp serve GGUF variants, vllm compressed-tensors ones; omit it for each "
                "variant's own",
            )

    @property
    def cluster(self) -> list[NodeGroup]:
        return cluster_of(self.gpus, hosts=True)


@dataclass(frozen=True)
class Basis:
    """The part of the held-out text a variant's figures were scored on: `chunks` of the evaluation's `of` windows,
    `tokens` positions. A GGUF that passed its gate early (pipelines/gguf/validate.py: early_pass) was scored on its
    first 4, 8 or 12 of 16 chunks only."""

    chunks: int | None
    of: int | None
    tokens: int | None
    sha256: str | None = None
    """The evaluation text's sha256 (None: not recorded)."""
    ctx: int | None = None
    """Its windows' length in tokens (None: not recorded)."""

    def same_tokens(self, other: Basis) -> bool:
        """Scored on the same positions of the same text: the same first chunks of it, as far as both say."""
        known = self.sha256 is not None and other.sha256 is not None
        return (self.chunks, self.of, self.tokens) == (other.chunks, other.of, other.tokens) and (
            not known or (self.sha256, self.ctx) == (other.sha256, other.ctx))

    @property
    def whole(self) -> bool:
        """Scored on every chunk of the evaluation (or nothing says otherwise)."""
        return self.chunks is None or self.of is None or self.chunks >= self.of

    def text(self) -> str:
        """As the pages print it beside a figure: "4/16 chunks, 252 tokens"."""
        parts = []
        if self.chunks is not None and self.of is not None:
            parts.append(f"{self.chunks}/{self.of} chunks")
        parts.append(f"{self.tokens:,} tokens" if self.tokens is not None else "tokens not recorded")
        return ", ".join(parts)


def basis(m: Manifest) -> Basis:
    """What `m`'s figures were scored on, from its manifest: the evaluation's windows and the positions scored."""
    v = m.validation
    tokens = v.figures.tokens if v.figures is not None else None
    of, ctx = v.evaluation.chunks, v.evaluation.ctx
    of = of if isinstance(of, int) and of > 0 else None
    chunks = of
    if m.format == "gguf" and tokens is not None and isinstance(ctx, int) and ctx > 2:
        # llama-perplexity scores the second half of each window: the chunks scored follow from the positions
        chunks = tokens // perplexity_positions(ctx, 1)
    return Basis(chunks, of, tokens, v.evaluation.sha256, ctx if isinstance(ctx, int) else None)



def versus(win: Choice, other: Choice, win_on: Basis, other_on: Basis) -> str:
    """How `other`'s mean KL stands against the winner's, said only as far as the figures allow: "measurably
    worse" needs both figures scored on the same tokens, both with a standard error, and a difference larger than
    the two standard errors together."""
    a, b = win.figures, other.figures
    if a is None or b is None:
        return "has no figures"
    if not win_on.same_tokens(other_on):
        return (
            f"was scored on {other_on.text()} against {win_on.text()}: not comparable"
            f" (mean KL {b.mean_kl:.4g} against {a.mean_kl:.4g})"
        )
    if not (a.mean_kl_stderr and b.mean_kl_stderr):
        return (
            f"has mean KL {b.mean_kl:.4g} against {a.mean_kl:.4g}, without a standard error on both: "
            "not known to differ measurably"
        )
    combined = a.mean_kl_stderr + b.mean_kl_stderr
    shown = (
        f"mean KL {b.mean_kl:.4g} ± {b.mean_kl_stderr:.2g} against {a.mean_kl:.4g} ± {a.mean_kl_stderr:.2g}"
    )
    if abs(b.mean_kl - a.mean_kl) <= combined:
        return f"ties within the standard errors ({shown})"
    if b.mean_kl > a.mean_kl:
        return f"is measurably worse ({shown})"
    return f"is measurably better and larger ({shown})"




def _alike(choices: list[Choice]) -> list[list[Choice]]:
    """`choices` with figures by what measured them: one format's engine over the same evaluation text and windows
    (GGUFs by llama-perplexity, checkpoints by the torch evaluation, which score different positions)."""
    groups: dict[tuple[str, str | None, int | None, int | None], list[Choice]] = {}
    for c in choices:
        if c.figures is not None:
            groups.setdefault((c.format, c.scored.sha256, c.scored.ctx, c.scored.of), []).append(c)
    return list(groups.values())


def _shared(group: list[Choice]) -> int | None:
    """The most first chunks every variant of `group` has figures over (None: no number they all have)."""
    shared = set.intersection(*(c.chunk_counts() for c in group))
    return max(shared) if shared else None


def on_shared_chunks(choices: list[Choice]) -> list[Choice]:
    """`choices` in their order, each put on the first chunks every variant measured alike with it (_alike) was
    scored on: a variant that passed its gate early (pipelines/gguf/validate.py: early_pass) on 4 of 16 chunks puts
    the others on their running figures after 4 (Figures.running); variants with no such chunks (manifests that keep
    no running figures) as they are: comparable_apart's choices, in the order given (refs are one model's, unique)."""
    pool, apart = comparable_apart(choices)
    put = {c.ref: c for c in [*pool, *apart]}
    return [put[c.ref] for c in choices]


def comparable_apart(choices: list[Choice]) -> tuple[list[Choice], list[Choice]]:
    """(the variants ranked together, those ranked after them): each on the first chunks it shares with the
    variants measured alike (on_shared_chunks); where those share none (one passed early and the manifests of the
    others keep no running figures), the ones scored on the whole evaluation text are ranked together and those that
    passed early on its first chunks apart, after them: figures over a shorter, other text are never ranked against
    whole-text ones."""
    pool, apart = [c for c in choices if c.figures is None], []
    for group in _alike(choices):
        if (k := _shared(group)) is not None:
            pool += [c.on_first(k) for c in group]
        else:
            pool += [c for c in group if c.scored.whole]
            apart += [c for c in group if not c.scored.whole]
    return pool, apart


def rank_comparable(choices: list[Choice]) -> list[Choice]:
    """`rank` over the variants comparable on the chunks they share, then over those apart (comparable_apart)."""
    pool, apart = comparable_apart(choices)
    return rank(pool) + rank(apart)


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
    a model has the same shape), else as a manifest recorded it at registration, or why none could be had."""
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
    recorded = next((m.shape for m in manifests if m.shape is not None), None)
    if recorded is not None:  # read from the artifact when it was registered: no pull needed
        return recorded.model_shape(), None
    refs = ", ".join(m.ref for m in manifests)
    return None, (
        f"none of its variants ({refs}) is in this checkout, and their manifests were registered before "
        f"modelmint recorded the model's shape in them: run `modelmint pull {manifests[0].ref}` (any one will do), "
        "then ask again"
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
    settings: Settings, name: str, manifests: list[Manifest], fits: Callable[[int], bool], where: str = ""
) -> list[str]:
    """The largest GGUF type not registered yet whose estimated size `fits`, with the catalog line that builds it."""
    params = _params(manifests)
    if params is None:
        return []
    have = {m.tag for m in manifests}
    for tag in _NOT_YET_BUILT:
        size = int(params * GGUF_TYPES[tag].bpw / 8)
        if tag in have or size >= min(m.weights_bytes for m in manifests) or not fits(size):
            continue
        quants = _catalog_quants(settings, name)
        line = f"quants: [{', '.join([*quants, tag])}]" if quants is not None else f"quants: [{tag}]"
        return [
            f"{name}:{tag} (not built yet, about {size_text(size)}{where}): in registry/catalog.yaml set the "
            f"entry {name}'s variants.gguf `{line}`, then `modelmint convert {name} --variants {tag} --register`"
        ]
    return []


def _vllm_fits(ask: planner.Ask, name: str, cluster: list[NodeGroup]) -> Callable[[int], bool]:
    def fits(size: int) -> bool:
        try:
            planner.plan(planner.smaller_ask(ask, planner.Variant(f"{name}:smaller", size)), cluster)
        except ConfigError:
            return False
        return True

    return fits


def _gguf_fits_wholly(
    settings: Settings, m: Manifest, shape: planner.ModelShape, request: Request, cluster: list[NodeGroup]
) -> Callable[[int], bool] | None:
    """Whether a GGUF of the model of some size would fit wholly (on the GPUs, or in a CPU machine's memory) with
    the KV cache and buffers `m`'s plan needs; None when `m` cannot be sized."""
    try:
        weights, _ = gguf_layers(settings, m, shape)
    except ArtifactError:
        return None
    num_ctx = gguf_num_ctx(request.context, shape.max_context)
    group = gguf_machine(cluster, weights, num_ctx, request.concurrency)
    mem = llamacpp_memory(weights, LlamaCppContext(num_ctx * request.concurrency, request.concurrency), -1)
    g = group.gpu
    reserve = 0 if g.kind == "cpu" else (METAL_RESERVE if g.kind == "metal" else GPU_RESERVE)
    limit = (g.memory_bytes - reserve) * (1 if g.kind == "cpu" else group.gpus_per_node)
    rest = mem.kv + mem.output + mem.compute
    return lambda size: size + rest <= limit


def _catalog_quants(settings: Settings, name: str) -> list[str] | None:
    from pipelines.source.catalog import load_catalog

    try:
        entry = load_catalog(settings.catalog_path).get(name)
    except ConfigError:
        return None
    gguf = entry.variants.gguf
    return list(gguf.quants) if gguf is not None else None


def commands(settings: Settings, m: Manifest, request: Request, gguf: GgufPlan | None = None) -> list[str]:
    """What to type to get the winner running as planned: pull it, then serve it (Ollama with the planned num_ctx,
    num_gpu and OLLAMA_NUM_PARALLEL, or llama-server with -c, -np and -ngl, for a GGUF; vLLM for a checkpoint)."""
    from pipelines.store.published import publications

    if m.format == "gguf":
        try:
            published = [e["image"] for e in publications(settings, m) if isinstance(e.get("image"), str)]
        except RegistryError:  # a damaged publication record: the DVC remote still has it
            published = []
        if gguf is not None and gguf.engine == "llama.cpp":
            argv = ["llama-server", "-m", f"{m.dvc.path}/{m.file}", "--host", "127.0.0.1", "--port", "8080",
                    "-ngl", str(gguf.n_gpu_layers), *gguf.context.argv()]
            return [f"modelmint pull {m.ref}", " ".join(argv)]
        pull, source = (
            (f"ollama pull {published[-1]}", published[-1]) if published else (f"modelmint pull {m.ref}", m.ref)
        )
        if gguf is None:
            return [pull, f"ollama run {source}"]
        modelfile = f"{m.name}-{m.tag}.Modelfile"
        local = ollama_planned_name(m.ref, gguf.num_ctx)  # as the registered ollama/start.sh names it
        lines = [f"FROM {source}", f"PARAMETER num_ctx {gguf.num_ctx}", f"PARAMETER num_gpu {gguf.n_gpu_layers}"]
        write_modelfile = "printf '" + "\\n".join(lines) + "\\n' > " + modelfile
        if gguf.instances > 1 or gguf.spread:  # several GPUs: a start script realises the plan
            script = f"{m.name}-{m.tag}-start.sh"
            text = ollama_start_script(model=source, served=local, modelfile=modelfile, gpus=gguf.gpus,
                                       instances=gguf.instances, parallel=gguf.parallel, spread=gguf.spread)
            return [
                pull,
                write_modelfile,
                f"cat > {script} <<'EOF'\n{text}EOF",
                f"bash {script}",
                f"ollama run {local}",
            ]
        return [
            pull,
            write_modelfile,
            f"ollama create {local} -f {modelfile}",
            f"OLLAMA_NUM_PARALLEL={gguf.parallel} ollama serve",
            f"ollama run {local}",
        ]
    out_dir = f"plans/{m.name}-{m.tag}"
    asked = f" --context {request.context}" if request.context else ""
    asked += f" --concurrency {request.concurrency}" if request.concurrency != 1 else ""
    groups = [g for g in request.cluster if g.gpu.kind == "cuda"]
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


def _engine_of(m: Manifest, asked: str | None) -> str | None:
    """The engine that serves `m` when `asked` (None: its own), or None if that engine does not serve its format."""
    own = "ollama" if m.format == "gguf" else "vllm"
    if asked is None:
        return own
    return asked if (asked in GGUF_ENGINES) == (m.format == "gguf") else None


def gguf_layers(settings: Settings, m: Manifest, shape: planner.ModelShape) -> tuple[LayeredWeights, list[str]]:
    """`m`'s GGUF per layer as llama.cpp places its tensors: read from the file in this checkout, else as its
    manifest recorded them at registration. A GGUF whose tensors are not grouped by layer (its header has the shape,
    its tensors do not follow it) is sized from its shape with the registered bytes spread evenly over its layers,
    and says so.

    Raises:
        ArtifactError: the file is not in this checkout and its manifest records no shape (the message names the
            pull).
    """
    rel = f"{m.dvc.path}/{m.file}"
    path = settings.repo_dir / rel
    if path.is_file():
        return file_layers(path, shape, m.weights_bytes, rel)
    if m.shape is not None and m.shape.llamacpp is not None:
        return m.shape.llamacpp.weights(rel), []
    if m.shape is not None:
        return _spread(rel, shape, m.weights_bytes, f"{m.file} held no per-layer tensors llama.cpp sizes by when "
                       "it was registered")
    raise ArtifactError(f"its GGUF is not in this checkout: run `modelmint pull {m.ref}`",
                        hint=f"modelmint pull {m.ref}")


def file_layers(
    path: Path, shape: planner.ModelShape, weights_bytes: int, name: str | None = None
) -> tuple[LayeredWeights, list[str]]:
    """The GGUF at `path` per layer as llama.cpp places its tensors; one whose tensors or metadata llama.cpp cannot
    size by layer is sized from its `shape` with its `weights_bytes` spread evenly over its layers, with the note
    that says so (`name`: the path the sizing names, default `path`)."""
    try:
        return read_layered_weights(path), []
    except ArtifactError as err:
        return _spread(name or str(path), shape, weights_bytes,
                       f"{path.name} holds no per-layer tensors llama.cpp sizes by ({err.message})")


def _spread(path: str, shape: planner.ModelShape, weights_bytes: int, why: str) -> tuple[LayeredWeights, list[str]]:
    """`weights_bytes` spread evenly over the layers of `shape`, with the note that says so."""
    n = shape.layers
    each = weights_bytes // (n + 2)
    heads_kv = (shape.kv_heads,) * n
    approx = LayeredWeights(
        path, shape.architecture, n, shape.hidden_size or shape.head_dim * shape.attention_heads,
        shape.intermediate_size or 4 * (shape.hidden_size or 1), shape.attention_heads, heads_kv,
        shape.head_dim, shape.head_dim, shape.vocab_size or 32_000, (each,) * n, each, each, False, each,
    )
    return approx, [
        f"{why}: its {size_text(weights_bytes)} are spread evenly over its {n} layers, so the layer count is "
        "approximate"
    ]


def _gguf_choice(
    settings: Settings, m: Manifest, base: Choice, engine: str, shape: planner.ModelShape, request: Request,
    cluster: list[NodeGroup],
) -> Choice:
    try:
        weights, notes = gguf_layers(settings, m, shape)
    except ArtifactError as err:
        return dataclasses.replace(base, refused=err.message)
    num_ctx = gguf_num_ctx(request.context, shape.max_context)
    try:
        g = plan_gguf(weights, gguf_machine(cluster, weights, num_ctx, request.concurrency), engine, num_ctx,
                      request.concurrency)
    except planner.PlanRefused as err:
        return dataclasses.replace(base, refused=err.message, nearest=tuple(err.nearest))
    return dataclasses.replace(base, gguf=dataclasses.replace(g, warnings=(*notes, *g.warnings)))


def _vllm_choice(
    m: Manifest, base: Choice, shape: planner.ModelShape, request: Request, cluster: list[NodeGroup],
    variants: tuple[planner.Variant, ...],
) -> Choice:
    gpus = [g for g in cluster if g.gpu.kind == "cuda"]
    if not gpus:
        return dataclasses.replace(
            base, refused=f"vLLM plans need CUDA GPUs, and {cluster_label(cluster)} has none",
            nearest=("a GGUF variant on Ollama or llama.cpp (--engine ollama)",),
        )
    ask = planner.Ask(
        m.weights_bytes,
        shape,
        context=request.context,
        concurrency=request.concurrency,
        fp8_weights=_fp8(m),
        smaller=tuple(v for v in variants if v.ref != m.ref),
    )
    try:
        plans = planner.plan(ask, gpus)
    except planner.PlanRefused as err:
        return dataclasses.replace(base, refused=err.message, nearest=tuple(err.nearest))
    except ConfigError as err:
        return dataclasses.replace(base, refused=err.message, nearest=(err.hint,) if err.hint else ())
    p = plans[0]
    if request.concurrency > p.max_num_seqs:
        capped = (
            f"--concurrency {request.concurrency} is capped at {p.max_num_seqs} sequences at once (vLLM's "
            f"max_num_seqs in this plan, at most {ask.seqs_cap}): the other {request.concurrency - p.max_num_seqs} "
            "wait in its queue"
        )
        p = dataclasses.replace(p, warnings=[capped, *p.warnings])
    return dataclasses.replace(base, plan=p)


def advise(settings: Settings, name: str, manifests: list[Manifest], request: Request) -> Advice:
    """One model's advice for `request` (its manifests: every registered variant of it).

    Raises:
        ConfigError: a --context longer than the model's.
    """
    advice = Advice(name, failed=failed_builds(settings, name, {m.tag for m in manifests}))
    measured = [m for m in manifests if m.validation.figures is not None]
    if not measured:
        advice.problem = (
            "no registered variant of it has figures to rank"
            if manifests
            else "no variant of it passed its gate: nothing is registered, so nothing is recommended"
        )
        return advice
    served = [m for m in measured if _engine_of(m, request.engine) is not None]
    if not served:
        fmt = "GGUF" if request.engine in GGUF_ENGINES else "compressed-tensors"
        build = (
            f"`modelmint convert {name} --variants q4_k_m --register`"
            if fmt == "GGUF"
            else f"`modelmint compress {name} --schemes fp8`"
        )
        advice.problem = (
            f"--engine {request.engine} serves {fmt} variants and none of {name} is registered "
            f"({', '.join(m.tag for m in measured)}): build one with {build}, or omit --engine"
        )
        return advice
    shape, why = _local_shape(settings, served)
    if shape is None:
        advice.problem = why
        return advice
    if request.context and request.context > shape.max_context:
        raise ConfigError(
            f"--context {request.context} is longer than {name} supports ({shape.max_context} tokens)",
            hint=f"ask for --context {shape.max_context} or less",
        )
    cluster = request.cluster
    variants = tuple(planner.Variant(m.ref, m.weights_bytes, _fp8(m)) for m in served)
    choices = []
    for m in served:
        base = Choice(m.ref, m.tag, m.format, m.weights_bytes, m.validation.figures, on=basis(m))
        engine = _engine_of(m, request.engine)
        if engine in GGUF_ENGINES:
            choices.append(_gguf_choice(settings, m, base, str(engine), shape, request, cluster))
        else:
            choices.append(_vllm_choice(m, base, shape, request, cluster, variants))
    choices = on_shared_chunks(choices)  # the figures of every variant, fitting or not, on the chunks they share
    fitting = [c for c in choices if c.fits]
    # a variant wholly on the GPU before one split with the CPU: the split one runs at the CPU's pace
    ranked = rank_comparable([c for c in fitting if not c.offloaded_in_part]) + rank_comparable(
        [c for c in fitting if c.offloaded_in_part])
    advice.ranked, advice.unfit = (
        ranked,
        sorted((c for c in choices if not c.fits), key=lambda c: c.weights_bytes),
    )
    if not ranked:
        smallest = advice.unfit[0]
        advice.reasons.append(
            f"no registered variant fits {cluster_label(cluster)}: even the smallest, "
            f"{smallest.ref} ({size_text(smallest.weights_bytes)}), is refused: {smallest.refused}"
        )
        advice.would_fit = list(dict.fromkeys(smallest.nearest))
        advice.would_fit += _smaller_gguf(settings, name, served, smallest, shape, request, cluster)
        return advice
    win = ranked[0]
    advice.reasons.append(_why(win, ranked, advice.unfit))
    if win.offloaded_in_part:
        advice.reasons.append(
            f"no registered variant fits wholly on {win.gguf.device if win.gguf else ''}: {win.ref} runs with a "
            "partial offload"
        )
        advice.would_fit += _smaller_gguf(settings, name, served, win, shape, request, cluster)
    advice.reasons += _concurrency_note(name, win, choices, request, measured)
    advice.warnings = list(win.gguf.warnings) if win.gguf is not None else list(win.plan.warnings if win.plan else [])
    by_ref = {m.ref: m for m in measured}
    advice.commands = commands(settings, by_ref[win.ref], request, win.gguf)
    return advice


def _smaller_gguf(
    settings: Settings, name: str, served: list[Manifest], short: Choice, shape: planner.ModelShape,
    request: Request, cluster: list[NodeGroup],
) -> list[str]:
    """A GGUF type not built yet that would fit where `short` (refused, or offloaded in part) does not."""
    by_ref = {m.ref: m for m in served}
    m = by_ref[short.ref]
    if m.format != "gguf":
        gpus = [g for g in cluster if g.gpu.kind == "cuda"]
        if not gpus or request.engine == "vllm":
            return []
        ask = planner.Ask(short.weights_bytes, shape, context=request.context, concurrency=request.concurrency)
        return _not_yet_built(settings, name, served, _vllm_fits(ask, name, gpus))
    fits = _gguf_fits_wholly(settings, m, shape, request, cluster)
    ggufs = [x for x in served if x.format == "gguf"]  # a GGUF's bytes estimate the parameters best
    where = ", wholly on the GPU" if any(g.gpu.kind != "cpu" for g in cluster) else ""
    return _not_yet_built(settings, name, ggufs, fits, where) if fits is not None else []


def _concurrency_note(
    name: str, win: Choice, choices: list[Choice], request: Request, measured: list[Manifest]
) -> list[str]:
    """At HIGH_CONCURRENCY and more, with a GGUF winner: whether a vLLM checkpoint serves better, and why."""
    if win.gguf is None or request.concurrency < HIGH_CONCURRENCY:
        return []
    g = win.gguf
    why = (
        f"llama.cpp gives each of {g.parallel} sequences a fixed slot of {g.num_ctx} tokens (KV for all of them "
        "reserved up front) and decodes them as one batch, where vLLM batches continuously over a paged KV cache "
        "that only holds the tokens sequences really use"
    )
    on_vllm = [c for c in choices if c.plan is not None]
    if on_vllm:
        best = rank(on_vllm)[0]
        assert best.plan is not None
        return [
            f"at {request.concurrency} sequences at once {best.ref} on vLLM serves better ({best.figures_text()}; "
            f"max_num_seqs {best.plan.max_num_seqs} on {best.plan.label}): {why}; "
            f"`modelmint recommend {name} --gpus {request.gpus}"
            + (f" --context {request.context}" if request.context else "")
            + f" --concurrency {request.concurrency} --engine vllm` "
            "gives its commands"
        ]
    if request.cluster and any(gr.gpu.kind == "cuda" for gr in request.cluster) and not any(
        m.format == "compressed-tensors" for m in measured
    ):
        return [
            f"at {request.concurrency} sequences at once a compressed-tensors checkpoint on vLLM would serve better: "
            f"{why}; none of {name} is registered: `modelmint compress {name} --schemes fp8` builds one"
        ]
    return []


def _why(win: Choice, fitting: list[Choice], unfit: list[Choice]) -> str:
    p = win.plan
    if win.gguf is not None:
        lines = [f"{win.ref}: {win.figures_text()}, {size_text(win.weights_bytes)}; fits {win.gguf.device} on "
                 + win.gguf.summary()]
    else:
        assert p is not None
        lines = [
            f"{win.ref}: {win.figures_text()}, {size_text(win.weights_bytes)}; fits {p.label} as TP {p.tp} x PP "
            f"{p.pp}, {p.replicas} replica(s), max_model_len {p.max_model_len}, max_num_seqs {p.max_num_seqs}"
        ]
    tied = [c for c in fitting[1:] if c.overlaps(win) and c.offloaded_in_part == win.offloaded_in_part
            and c.scored.same_tokens(win.scored)]
    if tied:
        lines.append(
            "ties within the standard errors with "
            + ", ".join(f"{c.ref} ({c.figures_text()}, {size_text(c.weights_bytes)})" for c in tied)
            + ": the smaller wins"
        )
    better_unfit = [c for c in unfit if c.kl < win.kl and not c.overlaps(win) and c.scored.same_tokens(win.scored)]
    if better_unfit:
        lines.append("measured better but does not fit: " + ", ".join(c.ref for c in better_unfit))
    rest = [c for c in fitting[1:] if c not in tied]
    lines += [f"{c.ref} {versus(win, c, win.scored, c.scored)}" for c in rest]
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
    if not by_name and not names:
        raise RegistryError(
            f"nothing is registered in {settings.repo_dir} yet, so there is nothing to recommend",
            hint="build, validate and register a variant first: `modelmint convert NAME --variants q4_k_m "
            "--register` (`modelmint catalog list` names the models)",
        )
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
