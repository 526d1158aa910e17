"""Quality gates for every variant, in one place, with where each number comes from."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from pydantic import StrictFloat, StrictInt

from pipelines.core.vocab import COMPRESSED_SCHEMES, GGUF_LADDER, GGUF_TYPES, PUBLISHED_SAME_TOP, gguf_type

Profile = Literal["reference", "tiny"]

Number = StrictInt | StrictFloat
"""A figure as a report or manifest file holds it: 5 stays 5 and 5.0 stays 5.0 (a file read and written again keeps
its bytes); a string or a boolean is refused."""


class Measured(Protocol):
    """What a gate reads of a measurement (pipelines/core/report.Figures, which imports this module, has them)."""

    @property
    def mean_kl(self) -> float: ...
    @property
    def same_top_pct(self) -> float: ...
    @property
    def ppl_ratio(self) -> float: ...
    @property
    def dppl_pct(self) -> float: ...
    @property
    def mean_kl_stderr(self) -> float | None: ...
    @property
    def same_top_stderr(self) -> float | None: ...
    @property
    def ln_ppl_ratio_stderr(self) -> float | None: ...


@dataclass(frozen=True)
class Miss:
    """One figure of a gate that a variant missed: which, its value, its limit, and how far past it."""

    figure: str
    value: float
    limit: float
    text: str
    """The failure as the report lists it, e.g. "mean KLD 0.01234 > 0.005"."""
    at_most: bool = True
    """True for figures that must stay under their limit (KL, ΔPPL), False for those that must reach it."""
    origin: float = 0.0
    """The value of a perfect copy (0 for KL and ΔPPL, 1 for a perplexity ratio, 100 % for top-token agreement)."""

    @property
    def factor(self) -> float:
        """How many times the allowed loss the variant lost (inf for NaN): 1.5 means 50 % past the limit."""
        allowed, lost = abs(self.limit - self.origin), abs(self.value - self.origin)
        if math.isnan(self.value):
            return math.inf
        return lost / allowed if allowed > 0 else math.inf

    def how_far(self) -> str:
        if math.isinf(self.factor):
            return f"{self.figure} is {self.value} (not a number)" if math.isnan(self.value) else self.text
        return f"{self.figure} lost {self.factor:.1f}x what the gate allows ({self.text})"


NOISE_SIGMAS = 2.0
"""How many standard errors a figure must be past its limit to fail. llama-perplexity prints one for each figure
(mean KLD, same top p, ln PPL ratio); on SmolLM2's 16 x 128 evaluation tokens same top is +/- 0.7 points and KLD
+/- 3 %, and the bundled held-out text is too short to shrink them much (docs/quality.md): a variant is refused
on evidence that it is past the limit, not on the noise of one short text."""


EARLY_SIGMAS = 3.0
"""How far inside every limit, in standard errors, a variant's figures over the first part of its evaluation must
be for it to pass on them (Gate.inside_by; pipelines/gguf/validate.early_pass)."""


@dataclass(frozen=True)
class Gate:
    """Thresholds for a variant measured against its reference (every format: pipelines/report.Figures)."""

    max_mean_kl: float
    min_same_top_pct: float
    max_ppl_ratio: float
    basis: str
    """Where the numbers come from (a published table, a measurement), as reports, manifests and cards say."""
    noise_sigmas: float = 0.0
    """A figure fails when it is past its limit by more than this many of its standard errors (0: the figure
    itself is compared, as gates recorded before the uncertainty was measured did)."""

    @property
    def max_dppl_pct(self) -> float:
        return round((self.max_ppl_ratio - 1.0) * 100.0, 4)

    def check(self, figures: Measured) -> list[str]:
        """The gate's failures, each with the figure and the threshold; empty when it passes (NaN fails)."""
        return [m.text for m in self.misses(figures)]

    def _slack(self, stderr: float | None) -> tuple[float, str]:
        if not self.noise_sigmas or not stderr:
            return 0.0, ""
        return self.noise_sigmas * stderr, f" by more than {self.noise_sigmas:g} standard errors"

    def misses(self, figures: Measured) -> list[Miss]:
        f, out = figures, []
        slack, why = self._slack(f.mean_kl_stderr)
        if not f.mean_kl - slack <= self.max_mean_kl:
            pm = f" ± {f.mean_kl_stderr:.2g}" if slack else ""
            out.append(Miss("mean KL", f.mean_kl, self.max_mean_kl,
                            f"mean KL {f.mean_kl:.5g}{pm} > {self.max_mean_kl}{why}"))
        slack, why = self._slack(f.same_top_stderr)
        if not f.same_top_pct + slack >= self.min_same_top_pct:
            pm = f" ± {f.same_top_stderr:.2f}" if slack else ""
            out.append(Miss("same top token", f.same_top_pct, self.min_same_top_pct,
                            f"same top token {f.same_top_pct:.2f}{pm} % < {self.min_same_top_pct} %{why}", False, 100.0))
        slack, why = self._slack(f.ln_ppl_ratio_stderr)
        log_ratio = math.log(f.ppl_ratio) if f.ppl_ratio > 0 else math.nan
        if not log_ratio - slack <= math.log(self.max_ppl_ratio):
            out.append(Miss("ΔPPL", f.dppl_pct, self.max_dppl_pct,
                            f"ΔPPL {f.dppl_pct:+.2f} % > {self.max_dppl_pct:g} % (perplexity ratio {f.ppl_ratio:.4g}"
                            + (f", ln ± {f.ln_ppl_ratio_stderr:.4f}" if slack else "") + f"){why}"))
        return out

    def inside_by(self, figures: Measured, sigmas: float) -> bool:
        """Whether every gated figure is inside its limit by at least `sigmas` of its standard errors (never
        where a figure has no standard error, or is not a number): evidence that the variant passes, taken on part
        of the evaluation (pipelines/gguf/validate.EARLY_PASS)."""
        f = figures
        kl_se, top_se, ln_se = f.mean_kl_stderr, f.same_top_stderr, f.ln_ppl_ratio_stderr
        if kl_se is None or top_se is None or ln_se is None or not f.ppl_ratio > 0:
            return False
        if not all(math.isfinite(e) for e in (kl_se, top_se, ln_se)):
            return False
        return (f.mean_kl + sigmas * kl_se <= self.max_mean_kl
                and f.same_top_pct - sigmas * top_se >= self.min_same_top_pct
                and math.log(f.ppl_ratio) + sigmas * ln_se <= math.log(self.max_ppl_ratio))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_dppl_pct": self.max_dppl_pct}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Gate:
        """A gate as a report or manifest records it (also the per-format shape manifests had before version 2,
        and gates recorded before `noise_sigmas` existed, which compared the figures themselves)."""
        basis, sigmas = str(d.get("basis", "")), float(d.get("noise_sigmas", 0.0))
        if "max_mean_kld" in d:  # GGUF, before version 2
            return cls(d["max_mean_kld"], d["min_same_top_pct"], round(1.0 + d["max_dppl_pct"] / 100.0, 6), basis, sigmas)
        if "min_top1_pct" in d:  # compressed-tensors, before version 2
            return cls(d["max_mean_kl"], d["min_top1_pct"], d["max_ppl_ratio"], basis, sigmas)
        ratio = d["max_ppl_ratio"] if "max_ppl_ratio" in d else round(1.0 + d["max_dppl_pct"] / 100.0, 6)
        return cls(d["max_mean_kl"], d["min_same_top_pct"], ratio, basis, sigmas)


# ---------------------------------------------------------------- GGUF variants (llama.cpp)

# Each type's published Llama-3-8B mean KLD and same top (tools/perplexity/README.md of the pinned tree) is its row in
# pipelines/core/vocab.GGUF_TYPES. An imatrix build of a type is held to the figure without a matrix: the matrix may
# help, the gate does not count on it. The same-top figure of a type without its own is read off the published points
# at its KLD (linear in log KLD between them).
_UNLISTED_KLD = 2.5
"""A type missing from the table (tq1_0, tq2_0): the worst published row's order, which still catches a broken file."""


def _published_kld(qtype: str) -> float:
    row = gguf_type(qtype)
    return row.kld if row and row.kld is not None else _UNLISTED_KLD


@dataclass(frozen=True)
class SizeBand:
    """How far a model of some size may be from llama.cpp's Llama-3-8B figures: x `kld` mean KLD, `top_pts` points
    less same top; the perplexity ratio follows the KLD (see gguf_gate)."""

    name: str
    min_params: float
    kld: float
    top_pts: float
    source: str


# Bands, largest first. Sources:
# - large: the published table itself. Its two 7-8B models differ by up to 3.7x in KLD at one type (q8_0:
#   Llama-2-7B 0.000369, Llama-3-8B 0.001355) and 2.8 points of same top (q4_k_m 94.665 vs 91.901 %); the
#   Llama-3-8B row is the worse of the two, and 2x / 4 points cover evaluation texts other than wikitext.
# - medium (1-7B): smaller models lose more at the same type: on phi-2 (2.7B) a q5_k_s diverges about as much as a
#   q3_k_s of Mistral-7B (kalomaze, llama.cpp PR #4739: roughly 10x the KLD of the same type); 4x / 6 points is
#   the midpoint of the large and small bands on a log scale until a published 1-7B table is at hand.
# - small (< 1B): measured here on SmolLM2-135M-Instruct (docs/quality.md): q8_0 3.1x the Llama-3-8B KLD and 3.0
#   points less same top, with nothing broken (its answers match the f16's); 8x / 10 points leave 2.6x headroom
#   over that q8_0 and hold a broken quant (zeroed blocks: KLD > 1, same top < 50 %) off by orders of magnitude.
SIZE_BANDS = (
    SizeBand("large", 7e9, 2.0, 4.0, "llama.cpp's Llama-3-8B table (x2 KLD, -4 points: Llama-2-7B/3-8B spread)"),
    SizeBand("medium", 1e9, 4.0, 6.0, "x4 KLD, -6 points: 1-7B models lose more (phi-2 vs Mistral-7B, llama.cpp PR #4739)"),
    SizeBand("small", 0.0, 8.0, 10.0, "x8 KLD, -10 points: < 1B models lose more (SmolLM2-135M q8_0 measured 3.1x)"),
)


def size_band(params: int | None) -> SizeBand:
    """The band of a model with `params` parameters (unknown: the small band, the loosest)."""
    return next(b for b in SIZE_BANDS if params is not None and params >= b.min_params) if params else SIZE_BANDS[-1]


def _published_top(kld: float) -> float:
    """Llama-3-8B's same-top rate at mean KLD `kld`, linear in log KLD between the published points."""
    pts = PUBLISHED_SAME_TOP
    if kld <= pts[0][0]:
        return pts[0][1]
    for (k0, t0), (k1, t1) in itertools.pairwise(pts):
        if kld <= k1:
            return t0 + (t1 - t0) * math.log(kld / k0) / math.log(k1 / k0)
    (k0, t0), (k1, t1) = pts[-2], pts[-1]
    return max(0.0, t1 + (t1 - t0) * math.log(kld / k1) / math.log(k1 / k0))


# The tiny profile (the bundled generated models): each measured type's `tiny` row in pipelines/core/vocab.GGUF_TYPES,
# with its measurement; types not measured fall back to a loose default that still catches a broken file.
_DEFAULT_TINY = (0.05, 85.0, 10.0)


def gguf_gate(qtype: str, profile: Profile = "reference", params: int | None = None) -> Gate:
    """The gate for a GGUF type of a model with `params` parameters.

    Reference profile: llama.cpp's published Llama-3-8B KLD for the type, times the size band's factor; the
    same-top floor is the published same top at that type's KLD less the band's points; the perplexity may rise
    by as much as the KLD allows: ln(PPL ratio) <= the KLD limit (on every row of the published table
    ln(PPL(Q)/PPL(base)) is at most the mean KLD, within 1 %). All three fall monotonically with the type's
    published KLD, so a type with more bits never faces a looser bar than one with fewer, and never one stricter
    than its measured distance from the fewer-bit type allows (ladder_conflicts checks a build's verdicts).
    """
    qtype = qtype.lower()
    if profile == "tiny":
        row = gguf_type(qtype)
        kld, top, dppl = row.tiny if row and row.tiny else _DEFAULT_TINY
        return Gate(kld, top, _ratio(dppl), basis=f"tiny-model profile for {qtype} (measured on tiny-qwen2, ~4x KLD "
                    "headroom)", noise_sigmas=NOISE_SIGMAS)
    band = size_band(params)
    published = _published_kld(qtype)
    kld = round(published * band.kld, 6)
    top = round(_published_top(published) - band.top_pts, 2)
    return Gate(
        max_mean_kl=kld,
        min_same_top_pct=top,
        max_ppl_ratio=round(math.exp(kld), 6),
        basis=f"llama.cpp Llama-3-8B KLD for {qtype} {published} [{band.name} model band: {band.source}]",
        noise_sigmas=NOISE_SIGMAS,
    )


def ladder_conflicts(verdicts: Mapping[str, tuple[Measured, bool]]) -> list[str]:
    """Contradictions among one model's GGUF verdicts ({type: (figures, passed)}): a type refused although a type
    llama.cpp publishes as worse (a higher KLD) passed with figures no better on any count. The gates are built
    so that none arises; a build reports any it finds as a gate defect, never as the variant's."""
    out = []
    for hi, (fh, ok_hi) in verdicts.items():
        for lo, (fl, ok_lo) in verdicts.items():
            worse_type = _published_kld(lo) > _published_kld(hi)
            no_better = fl.mean_kl >= fh.mean_kl and fl.same_top_pct <= fh.same_top_pct and fl.ppl_ratio >= fh.ppl_ratio
            if worse_type and ok_lo and not ok_hi and no_better:
                out.append(f"{hi} was refused although {lo}, a type with fewer bits, passed with figures no better "
                           f"(mean KL {fl.mean_kl:.5g} vs {fh.mean_kl:.5g}, same top {fl.same_top_pct:.2f} vs "
                           f"{fh.same_top_pct:.2f} %)")
    return out


def _ratio(dppl_pct: float) -> float:
    """A perplexity rise in % as the ratio the gate holds (+2 % → 1.02)."""
    return round(1.0 + dppl_pct / 100.0, 6)


# ---------------------------------------------------------------- compressed-tensors variants (llmcompressor)


# KL and top-1 bounds are the GGUF gate of the type with the nearest bits (each scheme's `anchor`: fp8, w8a8: q8_0;
# awq, gptq: q4_k_m) in the same size band, so one model's variants face one scale whatever their format. The
# perplexity bound comes from published recoveries, and the tiny profile from measurements: each scheme's `recovery`
# and `tiny` in pipelines/core/vocab.COMPRESSED_SCHEMES, with their sources.


def compressed_gate(variant: str, profile: Profile = "reference", params: int | None = None) -> Gate:
    """The gate for a compressed-tensors variant (fp8, awq, w8a8, gptq) of a model with `params` parameters."""
    if profile == "tiny":
        kl, top, ratio = COMPRESSED_SCHEMES[variant].tiny
        return Gate(kl, top, ratio, basis=f"tiny-model profile for {variant} (measured, ~4x KL headroom)",
                    noise_sigmas=NOISE_SIGMAS)
    band = size_band(params)
    scheme = COMPRESSED_SCHEMES[variant]
    anchor = gguf_gate(scheme.anchor, "reference", params)
    ratio, recovery = scheme.recovery[0 if band.name == "large" else 1]
    return Gate(anchor.max_mean_kl, anchor.min_same_top_pct, ratio, noise_sigmas=NOISE_SIGMAS,
                basis=f"{recovery}; KL/top-1 as {scheme.anchor}: {anchor.basis}")


# ---------------------------------------------------------------- advice: what to try after a gate failed

# "A higher-bit type" for the one that failed: the `ladder` types of pipelines/core/vocab.GGUF_TYPES ordered by their
# `bpw`; compressed-tensors schemes by their `bits` (the 8-bit ones are the highest modelmint builds).
_BROKEN_FACTOR = 10.0
"""A figure this many times past its allowance is not "a few bits short": something is broken."""
_SMALL_FOR_REFERENCE = 7e9


def _size(params: int | None) -> str:
    if params is None:
        return "this model"
    return f"this {params / 1e9:.1f} B-parameter model" if params >= 1e9 else f"this {params / 1e6:.0f} M-parameter model"


def gate_advice(
    variant: str,
    misses: list[Miss],
    *,
    basis: str,
    params: int | None = None,
    imatrix: bool | None = None,
    group_size: int | None = None,
    other_failures: list[str] | None = None,
) -> str:
    """What to try after `variant` failed its gate, from what failed: the type, the figure that missed and by
    how much, and the model's size. Where nothing higher-bit exists it says so and points to the gate's basis.

    `misses` are the figures that missed (empty when the variant failed a check before it was measured, listed
    in `other_failures`); `imatrix` whether a GGUF build used an importance matrix; `group_size` the group size
    a 4-bit compressed build used.
    """
    v = variant.lower()
    compressed = v in COMPRESSED_SCHEMES
    broken = [f for f in other_failures or [] if _CHANCE in f]
    if broken:
        return (f"{v}: {broken[0]}; no other type or scheme fixes that. Check the source commit (`modelmint watch` "
                "names the files that changed) and keep the catalog's pin on a good one: nothing of this build was "
                "registered, and the previous version stays current")
    if not misses:
        what = "; ".join(other_failures or []) or "a check before measurement"
        return (f"{v} failed {what} before any quality figure was measured: another type or scheme would not "
                "fix that. Read the report, delete the variant's output and rerun the same command to rebuild it")
    worst = max(misses, key=lambda m: m.factor)
    lead = worst.how_far()
    basis_ref = f"pipelines/core/gates.py: {basis}"
    if worst.factor >= _BROKEN_FACTOR:
        return (f"{lead}: far more than too few bits cost. The quantization or the source is broken (a model with "
                "random or untrained weights measures like this); check the source and the f16/bf16 reference "
                f"(`modelmint inspect`) before trying another type (the gate's basis, {basis_ref}).")
    small = params is not None and params < _SMALL_FOR_REFERENCE and not basis.startswith("tiny")
    size_note = (f" Small models lose more to quantization than the models the published figures come from, and "
                 f"{_size(params)} is small (the gate's basis, {basis_ref}).") if small else ""
    if compressed:
        bits = COMPRESSED_SCHEMES[v].bits
        higher = sorted(n for n, s in COMPRESSED_SCHEMES.items() if s.bits > bits)
        if not higher:
            return (f"{lead}. {v} is already 8-bit: modelmint has no higher-bit compressed-tensors scheme to try. "
                    f"Check whether the gate's basis fits {_size(params)} ({basis_ref}), compare its GGUF q8_0 "
                    "figures, or serve the bf16 source instead.")
        extra = []
        if v == "awq" or v == "gptq":
            extra.append("more calibration samples (calibration.num_samples of the variant in registry/catalog.yaml)")
            if group_size is not None and group_size > 32:
                extra.append(f"a smaller group size than {group_size} (group_sizes, e.g. [{group_size // 2}])")
        return (f"{lead}. Try an 8-bit scheme ({' or '.join(higher)}: fp8 needs Ada/Hopper, w8a8 runs on Ampere)"
                + (", or " + ", or ".join(extra) if extra else "") + "." + size_note)
    row = gguf_type(v)
    bpw = row.bpw if row else None
    higher = [t for t in GGUF_LADDER if bpw is not None and GGUF_TYPES[t].bpw > bpw][:2]
    if not higher:
        return (f"{lead}. {v} is llama.cpp's highest-bit quantized type: there is no higher-bit type to try. "
                f"Check whether the gate's basis fits {_size(params)} ({basis_ref}), or ship the f16 base.")
    imatrix_hint = ""
    if imatrix is False and bpw is not None and bpw < 5:
        imatrix_hint = ", or compute an importance matrix first (imatrix: true in the catalog's gguf variants)"
    return f"{lead}. Try a higher-bit type ({', '.join(higher)}){imatrix_hint}.{size_note}"


CHANCE_SHARE = 0.25
_CHANCE = "no better than chance"
"""A reference whose perplexity on the evaluation text reaches this share of its vocabulary size predicts it about
as well as guessing among that many tokens: its weights are broken (zeroed, noise, a bad upload). The gates compare
a variant with its own reference, so they cannot see this; trained models sit orders of magnitude below (tiny-qwen2
about 1,400 of 151,936, SmolLM2 about 20 of 49,152)."""


def chance_failure(ppl_reference: float, vocab: int | None) -> str | None:
    """The failure of a reference that is no better than chance (CHANCE_SHARE), or None."""
    if not vocab or ppl_reference < CHANCE_SHARE * vocab:
        return None
    return (f"the reference itself predicts the evaluation text {_CHANCE} (perplexity {ppl_reference:.6g} "
            f"of a {vocab}-token vocabulary, limit {CHANCE_SHARE:g} x vocabulary): the source weights are broken")
