"""Quality gates for every variant, in one place, with where each number comes from."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Profile = Literal["reference", "tiny"]


@dataclass(frozen=True)
class GGUFGate:
    max_mean_kld: float
    min_same_top_pct: float
    max_dppl_pct: float
    basis: str

    def check(self, mean_kld: float, same_top_pct: float, dppl_pct: float) -> list[str]:
        """The gate's failures, each with the figure and the threshold; empty when it passes."""
        failures = []
        if not mean_kld <= self.max_mean_kld:
            failures.append(f"mean KLD {mean_kld:.5f} > {self.max_mean_kld}")
        if not same_top_pct >= self.min_same_top_pct:
            failures.append(f"same top token {same_top_pct:.2f} % < {self.min_same_top_pct} %")
        if not dppl_pct <= self.max_dppl_pct:
            failures.append(f"ΔPPL {dppl_pct:+.2f} % > {self.max_dppl_pct} %")
        return failures

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

# Tiny generated models (hidden 256, 4 layers, briefly trained; see pipelines/tinymodel.py), measured on
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


def gguf_gate(qtype: str, profile: Profile = "reference") -> GGUFGate:
    qtype = qtype.lower()
    if profile == "tiny":
        kld, top, dppl = _TINY.get(qtype, _DEFAULT_TINY)
        return GGUFGate(kld, top, dppl, basis=f"tiny-model profile for {qtype} (measured on tiny-qwen2, ~4x KLD headroom)")
    kld, top, dppl = _PUBLISHED.get(qtype, (0.5, 65.0, 100.0))
    return GGUFGate(
        max_mean_kld=round(kld * 2, 6),
        min_same_top_pct=round(top - 4.0, 2),
        max_dppl_pct=dppl,
        basis=f"llama.cpp Llama-3-8B figures for {qtype}: KLD {kld}, same top {top} % (x2 KLD, -4 pts)",
    )


# ---------------------------------------------------------------- compressed-tensors variants (llmcompressor)


@dataclass(frozen=True)
class CompressedGate:
    """Thresholds for a compressed-tensors variant measured against its source on the bundled text."""

    max_mean_kl: float
    min_top1_pct: float
    max_ppl_ratio: float
    basis: str

    def check(self, mean_kl: float, top1_pct: float, ppl_ratio: float) -> list[str]:
        """The gate's failures, each with the figure and the threshold; empty when it passes (NaN fails)."""
        failures = []
        if not mean_kl <= self.max_mean_kl:
            failures.append(f"mean KL {mean_kl:.3g} > {self.max_mean_kl}")
        if not top1_pct >= self.min_top1_pct:
            failures.append(f"top-1 agreement {top1_pct:.2f} % < {self.min_top1_pct} %")
        if not ppl_ratio <= self.max_ppl_ratio:
            failures.append(f"perplexity ratio {ppl_ratio:.4f} > {self.max_ppl_ratio}")
        return failures

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

# Tiny generated models (hidden 256, 4 layers, briefly trained; pipelines/tinymodel.py): measured on tiny-qwen2
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


def compressed_gate(variant: str, profile: Profile = "reference", params: int | None = None) -> CompressedGate:
    """The gate for a compressed-tensors variant (fp8, awq, w8a8, gptq) of a model with `params` parameters."""
    if profile == "tiny":
        kl, top, ratio = _COMPRESSED_TINY[variant]
        return CompressedGate(kl, top, ratio, basis=f"tiny-model profile for {variant} (measured, ~4x KL headroom)")
    band = "large" if params is not None and params >= _SMALL_MODEL_PARAMS else "small"
    kl, top, ratio, basis = _COMPRESSED_PUBLISHED[variant][band]
    return CompressedGate(kl, top, ratio, basis=f"{basis} [{band} model band]")
