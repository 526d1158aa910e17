"""Quality gates for every variant, in one place, with where each number comes from."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pipelines.core.report import Figures

Profile = Literal["reference", "tiny"]


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


@dataclass(frozen=True)
class Gate:
    """Thresholds for a variant measured against its reference (every format: pipelines/report.Figures)."""

    max_mean_kl: float
    min_same_top_pct: float
    max_ppl_ratio: float
    basis: str
    """Where the numbers come from (a published table, a measurement), as reports, manifests and cards say."""

    @property
    def max_dppl_pct(self) -> float:
        return round((self.max_ppl_ratio - 1.0) * 100.0, 4)

    def check(self, figures: Figures) -> list[str]:
        """The gate's failures, each with the figure and the threshold; empty when it passes (NaN fails)."""
        return [m.text for m in self.misses(figures)]

    def misses(self, figures: Figures) -> list[Miss]:
        f, out = figures, []
        if not f.mean_kl <= self.max_mean_kl:
            out.append(Miss("mean KL", f.mean_kl, self.max_mean_kl, f"mean KL {f.mean_kl:.5g} > {self.max_mean_kl}"))
        if not f.same_top_pct >= self.min_same_top_pct:
            out.append(Miss("same top token", f.same_top_pct, self.min_same_top_pct,
                            f"same top token {f.same_top_pct:.2f} % < {self.min_same_top_pct} %", False, 100.0))
        if not f.ppl_ratio <= self.max_ppl_ratio:
            out.append(Miss("ΔPPL", f.dppl_pct, self.max_dppl_pct,
                            f"ΔPPL {f.dppl_pct:+.2f} % > {self.max_dppl_pct:g} % (perplexity ratio {f.ppl_ratio:.4f})"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_dppl_pct": self.max_dppl_pct}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Gate:
        """A gate as a report or manifest records it (also the per-format shape manifests had before version 2)."""
        if "max_mean_kld" in d:  # GGUF, before version 2
            return cls(d["max_mean_kld"], d["min_same_top_pct"], round(1.0 + d["max_dppl_pct"] / 100.0, 6),
                       str(d.get("basis", "")))
        if "min_top1_pct" in d:  # compressed-tensors, before version 2
            return cls(d["max_mean_kl"], d["min_top1_pct"], d["max_ppl_ratio"], str(d.get("basis", "")))
        return cls(d["max_mean_kl"], d["min_same_top_pct"], d["max_ppl_ratio"], str(d.get("basis", "")))


# llama.cpp's published KL-divergence table for Llama-3-8B (tools/perplexity/README.md, f16 base, wikitext):
#   Q4_K_M mean KLD 0.031, same top 91.9 %;  Q8_0 mean KLD 0.0014, same top 97.7 %.
# The reference gate allows twice the published KLD and 4 points of same-top: small models (0.5–3B) lose
# more to quantization than an 8B one and our calibration text is short, so the published figure itself
# would reject healthy quants; a broken quant is off by orders of magnitude, not by 2x.
_PUBLISHED = {
    # type: (mean KLD, same top %, ΔPPL % allowed); interpolated types follow llama.cpp's ppl column order
    "q8_0": (0.0014, 97.7, 1.0),
    "q6_k": (0.0061, 95.4, 2.0),
    "q5_k_m": (0.011, 94.0, 3.0),
    "q5_k_s": (0.013, 93.6, 3.5),
    "q4_k_m": (0.031, 91.9, 6.0),
    "q4_k_s": (0.036, 91.2, 7.0),
    "q4_0": (0.060, 89.0, 10.0),
    "iq4_xs": (0.036, 91.2, 7.0),
    "q3_k_l": (0.070, 87.5, 12.0),
    "q3_k_m": (0.085, 86.5, 14.0),
    "q3_k_s": (0.15, 82.0, 25.0),
    "q2_k": (0.35, 73.0, 60.0),
}

# Tiny generated models (hidden 256, 4 layers, briefly trained; see pipelines/source/tinymodel.py), measured on
# tiny-qwen2 against its f16 GGUF over eval.txt (16 x 128 tokens): Q4_K_M mean KLD 0.0013, same top
# 99.1 %, ΔPPL +0.23 %; Q8_0 0.0001, 99.8 %, +0.03 %. Their next-token distributions are flatter than an
# 8B model's, so the same type loses *less* here than in llama.cpp's table. The thresholds leave ~4x KLD
# headroom over those figures; a quant with zeroed blocks (tests/test_gguf_path.py) misses them by orders
# of magnitude. Types not measured fall back to a loose default that still catches a broken file.
_TINY = {
    "q8_0": (0.0005, 99.0, 0.5),
    "q6_k": (0.0015, 98.5, 1.0),
    "q5_k_m": (0.003, 98.0, 1.5),
    "q4_k_m": (0.005, 97.0, 2.0),
}
_DEFAULT_TINY = (0.05, 85.0, 10.0)


def gguf_gate(qtype: str, profile: Profile = "reference") -> Gate:
    qtype = qtype.lower()
    if profile == "tiny":
        kld, top, dppl = _TINY.get(qtype, _DEFAULT_TINY)
        return Gate(kld, top, _ratio(dppl), basis=f"tiny-model profile for {qtype} (measured on tiny-qwen2, ~4x KLD headroom)")
    kld, top, dppl = _PUBLISHED.get(qtype, (0.5, 65.0, 100.0))
    return Gate(
        max_mean_kl=round(kld * 2, 6),
        min_same_top_pct=round(top - 4.0, 2),
        max_ppl_ratio=_ratio(dppl),
        basis=f"llama.cpp Llama-3-8B figures for {qtype}: KLD {kld}, same top {top} % (x2 KLD, -4 pts)",
    )


def _ratio(dppl_pct: float) -> float:
    """A perplexity rise in % as the ratio the gate holds (+2 % → 1.02)."""
    return round(1.0 + dppl_pct / 100.0, 6)


# ---------------------------------------------------------------- compressed-tensors variants (llmcompressor)


# Published recoveries (task accuracy of the quantized model / the original's):
#   FP8-dynamic: >= 99 % (RedHatAI / neuralmagic FP8-dynamic model cards, Llama 3.x and Qwen2.5, 1B-70B);
#   INT8 W8A8: ~ 99 % (the same cards for quantized.w8a8);
#   INT4 W4A16: 97-99 % on models of 3B and more (RedHatAI quantized.w4a16 cards); Qwen's own AWQ table
#   puts Qwen2.5-0.5B-Instruct-AWQ at about 90 % of the bf16 model.
# Recovery is a task score, not a perplexity; the gate reads it as "perplexity may rise by no more than
# 1 / recovery", plus a margin for our short evaluation text. KL and top-1 bounds come from llama.cpp's
# published table for the nearest bit width (Q8_0: KLD 0.0014, same top 97.7 %; Q4_K_M: KLD 0.031,
# same top 91.9 %), with the same allowance as the GGUF gates (x2 KLD, -4 points), and looser for small models.
_SMALL_MODEL_PARAMS = 3e9
_COMPRESSED_PUBLISHED: dict[str, dict[str, tuple[float, float, float, str]]] = {
    # variant: {"large" (>= 3B) | "small": (max mean KL, min top-1 %, max ppl ratio, basis)}
    "fp8": {
        "large": (0.0028, 93.7, 1.02, "FP8-dynamic >= 99 % recovery (RedHatAI cards); KL/top-1 as Q8_0"),
        "small": (0.006, 92.0, 1.03, "FP8-dynamic >= 99 % recovery (RedHatAI cards, 1B); KL/top-1 as Q8_0, small-model margin"),
    },
    "w8a8": {
        "large": (0.0028, 93.7, 1.02, "INT8 W8A8 ~ 99 % recovery (RedHatAI cards); KL/top-1 as Q8_0"),
        "small": (0.006, 92.0, 1.03, "INT8 W8A8 ~ 99 % recovery (RedHatAI cards); KL/top-1 as Q8_0, small-model margin"),
    },
    "awq": {
        "large": (0.062, 87.9, 1.05, "W4A16 97-99 % recovery on >= 3B (RedHatAI cards); KL/top-1 as Q4_K_M"),
        "small": (0.15, 80.0, 1.15, "W4A16 ~ 90 % recovery at 0.5B (Qwen2.5 AWQ table); KL/top-1 as Q4_K_M, small-model margin"),
    },
    "gptq": {
        "large": (0.062, 87.9, 1.05, "W4A16 97-99 % recovery on >= 3B (RedHatAI cards); KL/top-1 as Q4_K_M"),
        "small": (0.15, 80.0, 1.15, "W4A16 ~ 90 % recovery at 0.5B (Qwen2.5 AWQ/GPTQ tables); KL/top-1 as Q4_K_M, small-model margin"),
    },
}

# Tiny generated models (hidden 256, 4 layers, briefly trained; pipelines/source/tinymodel.py): measured on tiny-qwen2
# against its bf16 source on eval.txt (8 x 256 tokens): FP8_DYNAMIC mean KL 5.9e-4, top-1 99.3 %,
# ppl ratio 1.000; AWQ W4A16_ASYM (16 x 256 calibration tokens of train.txt) 2.5e-3, 99.3 %, 1.031.
# Rows of 256 weights are two 128-groups, so 4-bit loses more here than on a real model. The thresholds
# leave ~4x KL headroom; zeroed scales (KL ~10, top-1 ~7 %, ppl x thousands) fail all three
# (tests/test_compress.py).
_COMPRESSED_TINY: dict[str, tuple[float, float, float]] = {
    "fp8": (2.5e-3, 95.0, 1.02),
    "w8a8": (2.5e-3, 95.0, 1.02),
    "awq": (1e-2, 95.0, 1.10),
    "gptq": (1e-2, 95.0, 1.10),
}


def compressed_gate(variant: str, profile: Profile = "reference", params: int | None = None) -> Gate:
    """The gate for a compressed-tensors variant (fp8, awq, w8a8, gptq) of a model with `params` parameters."""
    if profile == "tiny":
        kl, top, ratio = _COMPRESSED_TINY[variant]
        return Gate(kl, top, ratio, basis=f"tiny-model profile for {variant} (measured, ~4x KL headroom)")
    band = "large" if params is not None and params >= _SMALL_MODEL_PARAMS else "small"
    kl, top, ratio, basis = _COMPRESSED_PUBLISHED[variant][band]
    return Gate(kl, top, ratio, basis=f"{basis} [{band} model band]")


# ---------------------------------------------------------------- advice: what to try after a gate failed

# Bits per weight of llama.cpp's types (tools/quantize/README.md of the pinned tree, Llama-3-8B column),
# used only to order them: what "a higher-bit type" means for the one that failed.
_GGUF_BPW = {
    "iq1_s": 1.56, "iq1_m": 1.75, "tq1_0": 1.69, "tq2_0": 2.06, "iq2_xxs": 2.06, "iq2_xs": 2.31, "iq2_s": 2.5,
    "iq2_m": 2.7, "q2_k_s": 2.79, "q2_k": 2.96, "iq3_xxs": 3.06, "iq3_xs": 3.3, "iq3_s": 3.44, "q3_k_s": 3.5,
    "iq3_m": 3.66, "q3_k_m": 3.91, "q3_k_l": 4.27, "iq4_xs": 4.25, "iq4_nl": 4.5, "q4_0": 4.5, "q4_k_s": 4.58,
    "q4_k_m": 4.89, "q4_1": 5.0, "q5_0": 5.5, "q5_k_s": 5.54, "q5_k_m": 5.7, "q5_1": 6.0, "q6_k": 6.56,
    "q8_0": 8.5,
}
# The types worth suggesting as the next step up (the ones the catalog and Ollama's library use).
_GGUF_LADDER = ("q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "q8_0")
# compressed-tensors schemes by weight bits; the 8-bit ones are the highest modelmint builds.
_COMPRESSED_BITS = {"awq": 4, "gptq": 4, "w8a8": 8, "fp8": 8}
_BROKEN_FACTOR = 10.0
"""A figure this many times past its allowance is not "a few bits short": something is broken."""
_SMALL_FOR_REFERENCE = 1e9


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
    compressed = v in _COMPRESSED_BITS
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
        bits = _COMPRESSED_BITS[v]
        higher = sorted(n for n, b in _COMPRESSED_BITS.items() if b > bits)
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
    bpw = _GGUF_BPW.get(v)
    higher = [t for t in _GGUF_LADDER if bpw is not None and _GGUF_BPW[t] > bpw][:2]
    if not higher:
        return (f"{lead}. {v} is llama.cpp's highest-bit quantized type: there is no higher-bit type to try. "
                f"Check whether the gate's basis fits {_size(params)} ({basis_ref}), or ship the f16 base.")
    extra = ""
    if imatrix is False and bpw is not None and bpw < 5:
        extra = ", or compute an importance matrix first (imatrix: true in the catalog's gguf variants)"
    return f"{lead}. Try a higher-bit type ({', '.join(higher)}){extra}.{size_note}"


def advice_for_report(variant: str, report: dict[str, Any], *, params: int | None = None,
                      imatrix: bool | None = None) -> str:
    """gate_advice for a validation report, from its own figures (its `validation` block)."""
    from pipelines.core.report import Validation

    val = Validation.of_report(report)
    failures = list(val.failures if val else report.get("failures") or [])
    gate = val.gate if val else report.get("gate") or {}
    misses = Gate.from_dict(gate).misses(val.figures) if val and val.figures else []
    measured = {x.text for x in misses}
    group_size = (report.get("preflight") or {}).get("group_size")
    return gate_advice(
        variant, misses, basis=str(gate.get("basis", "unknown")), params=params or report.get("source_parameters"),
        imatrix=imatrix, group_size=group_size, other_failures=[f for f in failures if f not in measured],
    )
