"""One validation report for every format: what was measured against what, the gate, and the verdict.

A GGUF is measured by llama-perplexity against its f16/bf16 GGUF's logits; a compressed-tensors checkpoint
by the torch evaluation against its source; both give the same `Figures` (mean KL divergence, the share of
positions whose top token agrees, both perplexities), are judged by the same kind of `Gate`
(pipelines/core/gates.py) and end as one `Validation`. The report file, the manifest, the CLI, the flow's table
and the model cards all read that block as it is: no reader translates between formats.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipelines.core.answers import Answers
from pipelines.core.gates import Gate, gate_advice

REPORT_VERSION: Final = 2
"""The shape of the `validation` block (1: per-format `kld` / `metrics` dicts, before it existed)."""


def perplexity_positions(ctx: int, chunks: int) -> int:
    """Positions llama-perplexity scores over `chunks` windows of `ctx` tokens: the second half of each window,
    less its last position."""
    return chunks * (ctx - 1 - ctx // 2)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Figures(_Frozen):
    """What one evaluation measured, the same for every format."""

    mean_kl: float = Field(description="mean KL divergence of the variant's next-token distribution from the reference's")
    kl_p99: float | None = Field(default=None, description="99th percentile of the per-token KL divergence")
    same_top_pct: float = Field(description="share of positions whose most likely token is the reference's, in %")
    ppl_reference: float = Field(description="the reference's perplexity on the evaluation text")
    ppl: float = Field(description="the variant's perplexity on the same tokens")
    ppl_ratio: float = Field(description="ppl / ppl_reference")
    dppl_pct: float = Field(description="(ppl_ratio - 1) x 100")
    tokens: int | None = Field(default=None, description="positions evaluated")
    mean_kl_stderr: float | None = Field(default=None, description="standard error of mean_kl (llama-perplexity's ±)")
    same_top_stderr: float | None = Field(default=None, description="standard error of same_top_pct, in points")
    ln_ppl_ratio_stderr: float | None = Field(default=None, description="standard error of ln(ppl_ratio), as llama-perplexity "
                                               "prints it (the ratio's own ± is meaningless when it explodes)")

    @classmethod
    def of(cls, *, mean_kl: float, same_top_pct: float, ppl_reference: float, ppl: float,
           kl_p99: float | None = None, tokens: int | None = None, **stderr: float | None) -> Figures:
        """Figures from what an evaluation measured; `stderr` the standard errors it gave (mean_kl_stderr,
        same_top_stderr, ln_ppl_ratio_stderr)."""
        ratio = ppl / ppl_reference if ppl_reference else math.nan
        return cls(mean_kl=mean_kl, kl_p99=kl_p99, same_top_pct=same_top_pct, ppl_reference=ppl_reference, ppl=ppl,
                   ppl_ratio=round(ratio, 6), dppl_pct=round((ratio - 1.0) * 100.0, 4), tokens=tokens, **stderr)


class Validation(_Frozen):
    """A variant's validation: what it was measured on and against, its figures, the gate, and the verdict.

    `figures` is None when the variant failed a check before it could be measured (its checkpoint structure);
    `failures` then says which.
    """

    version: Literal[2] = REPORT_VERSION
    format: str = Field(description="the artifact format judged (gguf, compressed-tensors: pipelines/registry/names.py)")
    reference: str = Field(description="what the variant was measured against (the f16 GGUF, the bf16 source)")
    evaluation: dict[str, Any] = Field(description="the held-out text (name, sha256) and its windows (ctx, chunks)")
    figures: Figures | None
    gate: dict[str, Any] = Field(description="the gate's thresholds and their basis (pipelines/core/gates.py)")
    passed: bool
    failures: list[str]
    answers: dict[str, Any] | None = Field(
        default=None, description="the bundled questions through the serving engine against the source's answers "
        "(pipelines/core/answers.Answers); None where the entry does not ask for them")

    @classmethod
    def judge(cls, *, format: str, reference: str, evaluation: dict[str, Any],
              figures: Figures | None, gate: Gate, failures: list[str] | None = None,
              answers: Answers | None = None) -> Validation:
        """The verdict of `gate` on `figures` and of the answer check, after any `failures` found before
        measurement."""
        found = [*(failures or []), *(gate.check(figures) if figures is not None else []),
                 *(answers.failures if answers else [])]
        return cls(format=format, reference=reference, evaluation=evaluation, figures=figures, gate=gate.to_dict(),
                   passed=not found, failures=found, answers=answers.model_dump(mode="json") if answers else None)

    def failed_also(self, *failures: str) -> Validation:
        """This validation with more failures found after it (a serve check): no longer passed."""
        return self.model_copy(update={"failures": [*self.failures, *failures], "passed": False})

    @classmethod
    def of_report(cls, report: dict[str, Any]) -> Validation | None:
        """The validation block of a report (None for a report written before it existed)."""
        block = report.get("validation")
        return cls.model_validate(block) if isinstance(block, dict) else None


def advice_for_report(variant: str, report: dict[str, Any], *, params: int | None = None,
                      imatrix: bool | None = None) -> str:
    """gate_advice for a validation report, from its own figures (its `validation` block)."""
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


def card_front(repo: str | None, licence: str | None, library: str) -> dict[str, Any]:
    """The start of a model card's Hugging Face front matter: the upstream model it quantizes, licence, library."""
    front: dict[str, Any] = {"base_model": repo, "base_model_relation": "quantized"} if repo else {}
    return {**front, "license": licence, "library_name": library}


def card_validation(report: dict[str, Any]) -> dict[str, Any]:
    """The validation as a model card's front matter and table show it: the verdict, what it was measured
    against, every figure (6 significant digits), the gate and any failures."""
    judged = Validation.of_report(report)
    if judged is None:
        return {"passed": report.get("passed")}
    out: dict[str, Any] = {"passed": judged.passed, "reference": judged.reference}
    if judged.figures is not None:
        for k, x in judged.figures.model_dump().items():
            if x is not None:
                out[k] = float(f"{x:.6g}") if isinstance(x, float) else x
    out["gate"] = judged.gate
    if judged.answers is not None:
        a = judged.answers
        out["answers"] = {k: a[k] for k in ("engine", "questions", "identical_pct", "similar_pct", "stopped_pct",
                                             "source_stopped_pct")}
        if a.get("skipped"):
            out["answers"]["skipped"] = a["skipped"]
    if judged.failures:
        out["failures"] = list(judged.failures)
    return out


def answer_lines(report: dict[str, Any]) -> str:
    """The answer check as a model card says it (empty where the entry asked for none)."""
    judged = Validation.of_report(report)
    a = judged.answers if judged else None
    if not a:
        return ""
    if a.get("skipped"):
        return (f"\nThe {a['questions']} bundled questions (`{a['question_set']['file']}`) were not asked: "
                f"{a['engine']} could not serve this variant here ({a['skipped']}). The answer check did not run; "
                "it is not a pass.\n")
    if probe := a.get("probe"):
        return (f"\nAsked {a['questions']} of the {probe['of']} bundled questions (`{a['question_set']['file']}`) "
                f"greedily through {a['engine']}, as a probe: the variant prompts and stops exactly as its source, "
                f"which answered all {probe['of']} (and ended {probe['source_stopped_pct']:g} % of them on a stop "
                f"token); the probe holds {probe['rule']}. {a['identical_pct']:g} % of the variant's answers are "
                f"identical to the source's, {a['similar_pct']:g} % alike, and {a['stopped_pct']:g} % ended on a stop "
                f"token within {a['max_tokens']} tokens (the source's: {a['source_stopped_pct']:g} %).\n")
    return (f"\nAsked the {a['questions']} bundled questions (`{a['question_set']['file']}`) greedily through "
            f"{a['engine']}: {a['identical_pct']:g} % of the answers are identical to the source's, "
            f"{a['similar_pct']:g} % alike, and {a['stopped_pct']:g} % ended on a stop token within {a['max_tokens']} "
            f"tokens (the source's: {a['source_stopped_pct']:g} %).\n")
