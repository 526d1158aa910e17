"""The bundled texts, named portably: the calibration text (train.txt) and the held-out evaluation text (eval.txt)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipelines import PACKAGE
from pipelines.core.errors import ConfigError
from pipelines.core.fsutil import sha256_file

if TYPE_CHECKING:
    from pipelines.core.report import VariantReport

DATA_DIR = PACKAGE / "data"
CALIBRATION_TEXT = "train.txt"
"""What quantizers calibrate on (llama-imatrix, AWQ, GPTQ, SmoothQuant), unless a pinned hub data set is named."""
EVAL_TEXT: Final = "eval.txt"
"""Held out from calibration (and from the tiny models' training): what every variant is measured on."""
EVAL_RECORD = ("text", "sha256", "ctx", "chunks")
"""The fields that name an evaluation text in reports, manifests and cards (a report adds timings to them)."""
SHARED_RUN_WORDS = 8
"""Two texts that share a run of this many words are not apart (the bundled ones share no run of 6)."""


def bundled_text(name: str) -> Path:
    """The path of a bundled, license-clean text (pipelines/data/)."""
    return DATA_DIR / name


@dataclass(frozen=True)
class TextRef:
    """A text a step reads, named by its file name and sha256; its path is where it lies on this machine only."""

    name: str
    sha256: str
    path: Path

    def describe(self, **extra: Any) -> dict[str, Any]:
        """What reports, manifests, cards and GGUF metadata record: never the path."""
        return {"text": self.name, "sha256": self.sha256, **extra}


def text_ref(name: str) -> TextRef:
    """A bundled text by name, hashed now (the bundled texts are a few dozen KB)."""
    path = bundled_text(name)
    return TextRef(name, sha256_file(path), path)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def shared_passages(a: str, b: str, *, n: int = SHARED_RUN_WORDS) -> list[str]:
    """The runs of `n` consecutive words (case and punctuation ignored) that occur in both texts."""
    wa, wb = _words(a), _words(b)
    runs_a = {tuple(wa[i : i + n]) for i in range(len(wa) - n + 1)}
    return sorted({" ".join(r) for i in range(len(wb) - n + 1) if (r := tuple(wb[i : i + n])) in runs_a})


def check_apart(calibration: TextRef, evaluation: TextRef) -> None:
    """Refuse a calibration text that shares content with the evaluation text (by content, not by name).

    A variant calibrated on the text it is then measured on is judged on the very tokens it was tuned for:
    its figures would be optimistic by an unknown amount, and its gate would mean nothing.

    Raises:
        ConfigError: the same bytes, or a shared run of SHARED_RUN_WORDS words.
    """
    hint = "calibration and evaluation must be different data: see pipelines/data/README.md"
    if calibration.sha256 == evaluation.sha256:
        raise ConfigError(f"the calibration text {calibration.name} is the evaluation text {evaluation.name}", hint=hint)
    shared = shared_passages(calibration.path.read_text(encoding="utf-8"), evaluation.path.read_text(encoding="utf-8"))
    if shared:
        raise ConfigError(
            f"the calibration text {calibration.name} shares {len(shared)} passage(s) of {SHARED_RUN_WORDS} words "
            f"with the evaluation text {evaluation.name}, e.g. {shared[0]!r}",
            hint=hint,
        )


def _early_words(report: VariantReport, ev: Mapping[str, Any]) -> str:
    """", passed on the first N of them …" where the variant's figures come from the first chunks alone (a GGUF
    variant that passed early, pipelines/gguf/validate.early_pass); empty otherwise."""
    from pipelines.core.gates import EARLY_SIGMAS
    from pipelines.core.report import perplexity_positions

    figures = report.validation.figures if report.validation else None
    ctx, chunks = ev.get("ctx"), ev.get("chunks")
    if not figures or not figures.tokens or not isinstance(ctx, int) or not isinstance(chunks, int):
        return ""
    per_chunk = perplexity_positions(ctx, 1)
    measured = figures.tokens // per_chunk if per_chunk else chunks
    if measured >= chunks:
        return ""
    return (f"; it passed on the first {measured}, where every figure was already {EARLY_SIGMAS:g} standard errors "
            f"inside its limit")


def data_lines(report: VariantReport) -> str:
    """What a variant was calibrated and measured on, for a model card (from its validation report)."""
    lines = []
    cal = report.calibration
    if cal:
        if cal.get("text"):
            data = f"`{cal['text']}` (sha256 `{cal.get('sha256')}`)"
        else:
            hub = cal.get("hub_dataset") or {}
            data = f"the hub data set `{hub.get('repo')}` at `{hub.get('revision')}`"
        if cal.get("chunks"):
            size = f"{cal['chunks']} chunks of {cal.get('ctx')} tokens"
        else:
            size = f"{cal.get('samples')} samples of up to {cal.get('max_seq_length')} tokens"
        made = cal.get("imatrix")
        if made:
            lines.append(f"Quantized with an importance matrix (llama.cpp {str(made.get('format')).upper()} imatrix "
                         f"`{made.get('file')}`, sha256 `{made.get('sha256')}`) computed on {data}, {size}.")
        else:
            lines.append(f"Calibrated on {data}, {size}.")
    elif "calibration" in report.model_fields_set:
        lines.append("Quantized without calibration data.")
    ev = report.evaluation
    if ev:
        lines.append(f"Measured on the held-out `{ev.get('text')}` (sha256 `{ev.get('sha256')}`, {ev.get('chunks')} "
                     f"chunks of {ev.get('ctx')} tokens{_early_words(report, ev)}), never used for calibration.")
    return "\n".join(lines)
