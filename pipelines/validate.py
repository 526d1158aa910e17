"""Validate a GGUF variant against its f16 base: smoke generation and llama.cpp's KL-divergence statistics."""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines import chat_template
from pipelines.errors import ArtifactError
from pipelines.fsutil import atomic_output, write_text_atomic
from pipelines.gates import GGUFGate
from pipelines.gguf import GGUFInfo
from pipelines.runner import run
from pipelines.toolchains import LlamaCpp

SMOKE_MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three things to pack for a rainy weekend."},
]


@dataclass(frozen=True)
class KLDStats:
    mean_kld: float
    kld_p99: float | None
    same_top_pct: float
    ppl_q: float
    ppl_base: float
    ctx: int
    chunks: int

    @property
    def dppl_pct(self) -> float:
        return (self.ppl_q / self.ppl_base - 1.0) * 100.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "dppl_pct": round(self.dppl_pct, 4)}


@dataclass(frozen=True)
class SmokeResult:
    prompt: str
    completion: str
    tokens_generated: int
    stopped_on_eos: bool
    seconds: float


@dataclass
class VariantReport:
    """One JSON report per variant: what was measured, against what, and the verdict."""

    variant: str
    path: str
    reference: str
    gguf: dict[str, Any]
    smoke: dict[str, Any] | None
    kld: dict[str, Any]
    gate: dict[str, Any]
    failures: list[str]
    toolchain: dict[str, str]
    extra: dict[str, Any] = field(default_factory=dict)
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.passed = not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d

    def write(self, path: Path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


_NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"


def _grab(pattern: str, text: str, what: str) -> float:
    m = re.search(pattern, text)
    if not m:
        raise ArtifactError(f"llama-perplexity printed no {what}:\n{text[-1500:]}")
    return float(m.group(1))


def parse_kld_output(text: str, ctx: int) -> KLDStats:
    """Parse the summary `llama-perplexity --kl-divergence` prints."""
    chunks = len(re.findall(r"^\s*\d+\s+\d", text, flags=re.M))
    p99 = re.search(r"99\.0%\s+KLD:\s+" + _NUM, text)
    return KLDStats(
        mean_kld=_grab(r"Mean\s+KLD:\s+" + _NUM, text, "mean KLD"),
        kld_p99=float(p99.group(1)) if p99 else None,
        same_top_pct=_grab(r"Same top p:\s+" + _NUM, text, "same-top-token rate"),
        ppl_q=_grab(r"Mean PPL\(Q\)\s+:\s+" + _NUM, text, "PPL(Q)"),
        ppl_base=_grab(r"Mean PPL\(base\)\s+:\s+" + _NUM, text, "PPL(base)"),
        ctx=ctx,
        chunks=chunks,
    )


def kld_base_logits(
    reference: Path, text: Path, out: Path, llama: LlamaCpp, *, threads: int, ctx: int, chunks: int
) -> Path:
    """Save the reference model's logits over `text` (llama-perplexity --kl-divergence-base), atomically."""
    if out.exists():
        return out
    with atomic_output(out) as tmp:
        run([
            llama.bin("llama-perplexity"), "-m", reference, "-f", text, "--kl-divergence-base", tmp,
            "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks), "-t", str(threads),
        ])
    return out


def kl_divergence(quant: Path, base_logits: Path, llama: LlamaCpp, *, threads: int, ctx: int) -> KLDStats:
    """Mean KL divergence, same-top-token rate and perplexities of `quant` against saved base logits."""
    result = run([
        llama.bin("llama-perplexity"), "-m", quant, "--kl-divergence-base", base_logits, "--kl-divergence",
        "-c", str(ctx), "-b", str(ctx), "-t", str(threads),
    ])
    return parse_kld_output(result.stdout + "\n" + result.stderr, ctx)


def smoke_generate(path: Path, info: GGUFInfo, llama: LlamaCpp, *, threads: int, n_predict: int = 32) -> SmokeResult:
    """Greedy generation from a chat prompt rendered with the GGUF's own chat template.

    Checks that the model loads and generates; the text of a tiny model is noise and is not judged.

    Raises:
        ArtifactError: no chat template, or nothing was generated.
    """
    if not info.chat_template:
        raise ArtifactError(f"{path} has no chat template to build a smoke prompt from")
    prompt = chat_template.render(info.chat_template, SMOKE_MESSAGES, add_generation_prompt=True,
                                  bos_token="", eos_token="")
    start = time.perf_counter()
    result = run([
        llama.bin("llama-completion"), "-m", path, "-p", prompt, "-n", str(n_predict), "--temp", "0",
        "--seed", "1", "-no-cnv", "--no-display-prompt", "--no-warmup", "-c", "1024", "-t", str(threads),
    ])
    seconds = time.perf_counter() - start
    m = re.search(r"eval time\s*=\s*[\d.]+ ms /\s*(\d+) runs", result.stderr)
    generated = int(m.group(1)) if m else 0
    if generated == 0 and not result.stdout.strip():
        raise ArtifactError(f"{path} generated nothing from the smoke prompt:\n{result.stderr[-1500:]}")
    return SmokeResult(
        prompt=prompt,
        completion=result.stdout,
        tokens_generated=generated,
        stopped_on_eos=generated < n_predict,
        seconds=round(seconds, 3),
    )


def validate_variant(
    variant: str,
    quant: Path,
    quant_info: GGUFInfo,
    reference: Path,
    base_logits: Path,
    gate: GGUFGate,
    llama: LlamaCpp,
    *,
    threads: int,
    ctx: int,
    report_path: Path,
    smoke: bool = True,
    extra: dict[str, Any] | None = None,
) -> VariantReport:
    """Measure `quant` against the reference logits, apply `gate`, and write the JSON report."""
    smoke_result = smoke_generate(quant, quant_info, llama, threads=threads) if smoke else None
    stats = kl_divergence(quant, base_logits, llama, threads=threads, ctx=ctx)
    failures = gate.check(stats.mean_kld, stats.same_top_pct, stats.dppl_pct)
    report = VariantReport(
        variant=variant,
        path=str(quant),
        reference=str(reference),
        gguf=quant_info.to_dict(),
        smoke=asdict(smoke_result) if smoke_result else None,
        kld=stats.to_dict(),
        gate=gate.to_dict(),
        failures=failures,
        toolchain=llama.versions(),
        extra=extra or {},
    )
    report.write(report_path)
    return report
