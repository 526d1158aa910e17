"""One GGUF measured against its reference outside a build, with the build's text and settings: `modelmint validate`."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.errors import ConfigError, GateFailed
from pipelines.core.report import EvaluationBlock, GGUFReport
from pipelines.core.settings import Settings

PROFILES = ("reference", "tiny")
"""The gate profiles a standalone check may apply (pipelines/core/gates.py)."""


@dataclass(frozen=True)
class Measured:
    """A quant's figures against its reference, its gate's verdict, and where the JSON report went."""

    quant_type: str
    report: GGUFReport
    report_path: Path

    def failure(self) -> GateFailed | None:
        """The gate's refusal with its figures, the report and the advice for the type; None when it passed."""
        from pipelines.core.report import advice_for_report

        val = self.report.judged
        if val.passed:
            return None
        return GateFailed(self.quant_type, val.failures, str(self.report_path),
                          advice=advice_for_report(self.quant_type, self.report))


def measure_file(quant: Path, reference: Path, settings: Settings, *, profile: str = "reference",
                 report_path: Path | None = None, smoke: bool = True) -> Measured:
    """Measure `quant` against `reference` (KL divergence, same top token, ΔPPL on the bundled evaluation text, as a
    build does) and apply the gate of `profile` for its type and the reference's size; the report is written to
    `report_path` (default: beside the quant, .report.json).

    Raises:
        ConfigError: an unknown profile.
        ToolchainMissing: llama.cpp is not built.
        ArtifactError: either file is not a GGUF that reads.
        ToolError: llama-perplexity (or the smoke run) failed.
    """
    from pipelines.core.gates import gguf_gate
    from pipelines.core.ggufheader import inspect_gguf
    from pipelines.core.texts import EVAL_TEXT, text_ref
    from pipelines.core.toolchains import llama_cpp
    from pipelines.gguf.build import GGUF_EVAL_CHUNKS, GGUF_EVAL_CTX
    from pipelines.gguf.validate import kld_base_logits, validate_variant

    if profile not in PROFILES:
        raise ConfigError(f"unknown gate profile {profile!r}", hint="use --profile reference or --profile tiny")
    llama = llama_cpp(settings)
    info = inspect_gguf(quant)
    ref_info = inspect_gguf(reference)
    qtype = (info.file_type or "").lower()
    gate = gguf_gate(qtype, profile, ref_info.parameter_count)  # type: ignore[arg-type]
    report_path = report_path or quant.with_suffix(".report.json")
    with tempfile.TemporaryDirectory(dir=settings.work_dir if settings.work_dir.exists() else None) as tmp:
        evaluation = text_ref(EVAL_TEXT)
        logits = kld_base_logits(reference, evaluation.path, Path(tmp) / "base.kld", llama,
                                 threads=settings.effective_threads, ctx=GGUF_EVAL_CTX, chunks=GGUF_EVAL_CHUNKS)
        rep = validate_variant(qtype, quant, info, reference, logits, gate, llama,
                               threads=settings.effective_threads, ctx=GGUF_EVAL_CTX, report_path=report_path,
                               smoke=smoke, evaluation=EvaluationBlock(text=evaluation.name, sha256=evaluation.sha256,
                                                                      ctx=GGUF_EVAL_CTX, chunks=GGUF_EVAL_CHUNKS))
    return Measured(qtype, rep, report_path)
