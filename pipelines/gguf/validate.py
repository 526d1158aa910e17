"""Validate a GGUF variant against its f16 base: smoke generation and llama.cpp's KL-divergence statistics."""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pipelines.chat import jinja as chat_template
from pipelines.core.answers import Answers
from pipelines.core.errors import ArtifactError, ToolStoppedShort
from pipelines.core.fsutil import atomic_output
from pipelines.core.gates import EARLY_SIGMAS, Gate, chance_failure
from pipelines.core.ggufheader import GGUFInfo, read_gguf_header
from pipelines.core.report import (
    EvaluationBlock,
    Figures,
    GGUFRecord,
    GGUFReport,
    KLDRecord,
    RunningFigures,
    SmokeRecord,
    ToolchainRecord,
    Validation,
    as_block,
    perplexity_positions,
)
from pipelines.core.resources import logits_file_size
from pipelines.core.runner import run
from pipelines.core.toolchains import LlamaCpp

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
    mean_kld_stderr: float | None = None
    same_top_stderr: float | None = None
    ln_ppl_ratio_stderr: float | None = None
    of_chunks: int | None = None
    """The chunks the reference logits hold; more than `chunks` when the variant passed on its first ones
    (EARLY_PASS), None where llama-perplexity's statistics after the last chunk were read."""
    running: tuple[RunningFigures, ...] = ()
    """The running figures after each of chunks 1..`chunks` (with_running), kept in the figures so that variants
    that stopped after different numbers of chunks are compared on the chunks they share."""

    @property
    def dppl_pct(self) -> float:
        return (self.ppl_q / self.ppl_base - 1.0) * 100.0

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "dppl_pct": round(self.dppl_pct, 4)}
        del out["running"]  # in the figures, not in llama-perplexity's own block
        return out

    def with_running(self, text: str) -> KLDStats:
        """These statistics with the running figures of every chunk up to theirs, from the rows in `text`
        (parse_kld_rows); without them where the rows printed are not chunks 1..`chunks` in order."""
        rows = parse_kld_rows(text, self.ctx)[: self.chunks]
        if [r.chunks for r in rows] != list(range(1, self.chunks + 1)):
            return self
        return replace(self, running=tuple(r.running_figures() for r in rows))

    def running_figures(self) -> RunningFigures:
        """These statistics as the figures after their last chunk."""
        return RunningFigures(chunks=self.chunks, tokens=perplexity_positions(self.ctx, self.chunks),
                              mean_kl=self.mean_kld, mean_kl_stderr=self.mean_kld_stderr,
                              same_top_pct=self.same_top_pct, same_top_stderr=self.same_top_stderr,
                              ppl_reference=self.ppl_base, ppl=self.ppl_q,
                              ln_ppl_ratio_stderr=self.ln_ppl_ratio_stderr)

    def record(self) -> KLDRecord:
        """These statistics as a GGUF report's `kld` block records them."""
        return KLDRecord.model_validate(self.to_dict())

    def figures(self) -> Figures:
        """These statistics as every format's figures."""
        return Figures.of(mean_kl=self.mean_kld, kl_p99=self.kld_p99, same_top_pct=self.same_top_pct,
                          ppl_reference=self.ppl_base, ppl=self.ppl_q, tokens=perplexity_positions(self.ctx, self.chunks),
                          mean_kl_stderr=self.mean_kld_stderr, same_top_stderr=self.same_top_stderr,
                          ln_ppl_ratio_stderr=self.ln_ppl_ratio_stderr, running=self.running or None)


@dataclass(frozen=True)
class SmokeResult:
    prompt: str
    completion: str
    tokens_generated: int
    stopped_on_eos: bool
    seconds: float

    def record(self) -> SmokeRecord:
        """This run as a report's `smoke` block records it."""
        return SmokeRecord(prompt=self.prompt, completion=self.completion, tokens_generated=self.tokens_generated,
                           stopped_on_eos=self.stopped_on_eos, seconds=self.seconds)


def check_threads(threads: int) -> int:
    """Threads the checks run their llama.cpp tools with (llama-perplexity's KL divergence, llama-server's answers),
    of the `threads` the settings give: half, at least one.

    llama.cpp's threads meet at a barrier after every operation of a forward pass; when other processes hold the
    cores, a thread that waits there for one that is not running costs the whole step. Measured on SmolLM2 q4_k_m on
    2 cores at load average 7-10: its KL divergence took 44 s on one thread and 140 s on two, with the same figures
    to the last digit (ggml splits a product by rows, each row one thread's whole dot product); its 20 answers (4
    slots) 23 s on one thread and more than 150 s on two (docs/quality.md). On a quiet machine two threads would be
    at most twice as fast; the build's own steps keep every thread.
    """
    return max(1, threads // 2)


_NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"


def _grab(pattern: str, text: str, what: str) -> float:
    m = re.search(pattern, text)
    if not m:
        raise ArtifactError(f"llama-perplexity printed no {what}:\n{text[-1500:]}")
    return float(m.group(1))


def _stderr(pattern: str, text: str) -> float | None:
    """The ± llama-perplexity prints after a figure (None if it printed none)."""
    m = re.search(pattern + _NUM + r"\s*±\s*" + _NUM, text)
    return float(m.group(2)) if m else None


def _kld_rows(text: str) -> int:
    """How many per-chunk rows `llama-perplexity --kl-divergence` printed (each starts with its chunk number)."""
    return len(re.findall(r"^\s*\d+\s+\d", text, flags=re.M))


def parse_kld_output(text: str, ctx: int) -> KLDStats:
    """Parse the summary `llama-perplexity --kl-divergence` prints, with the standard error of each figure."""
    chunks = _kld_rows(text)
    p99 = re.search(r"99\.0%\s+KLD:\s+" + _NUM, text)
    return KLDStats(
        mean_kld=_grab(r"Mean\s+KLD:\s+" + _NUM, text, "mean KLD"),
        kld_p99=float(p99.group(1)) if p99 else None,
        same_top_pct=_grab(r"Same top p:\s+" + _NUM, text, "same-top-token rate"),
        ppl_q=_grab(r"Mean PPL\(Q\)\s+:\s+" + _NUM, text, "PPL(Q)"),
        ppl_base=_grab(r"Mean PPL\(base\)\s+:\s+" + _NUM, text, "PPL(base)"),
        ctx=ctx,
        chunks=chunks,
        mean_kld_stderr=_stderr(r"Mean\s+KLD:\s+", text),
        same_top_stderr=_stderr(r"Same top p:\s+", text),
        ln_ppl_ratio_stderr=_stderr(r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s+:\s+", text),
    )


_VAL = r"([-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf))"
_PM = _VAL + r"\s*±\s*" + _VAL
_ROW = re.compile(r"^\s*(\d+)\s+" + r"\s+".join([_PM, _PM, _PM, _PM + r"\s*%", _PM + r"\s*%"]), flags=re.M)
"""One chunk's row of `llama-perplexity --kl-divergence`: the chunk number, then the running figures over every
chunk so far, each with its standard error: PPL(Q), ln(PPL(Q)/PPL(base)), KL divergence, RMS of Δp (%), same top p
(%) (tools/perplexity/perplexity.cpp, kl_divergence: the LOG calls after process_logits)."""


def parse_kld_rows(text: str, ctx: int) -> list[KLDStats]:
    """The running figures after each chunk, as llama-perplexity printed them (row i: over chunks 1..i+1).

    PPL(base) is not printed per row; it is PPL(Q) / exp(ln(PPL(Q)/PPL(base))), as the tool computes the ratio.
    """
    rows = []
    for m in _ROW.finditer(text):
        n, ppl, _ppl_se, ln_ratio, ln_se, kld, kld_se, _dp, _dp_se, top, top_se = m.groups()
        ppl_q = float(ppl)
        rows.append(KLDStats(mean_kld=float(kld), kld_p99=None, same_top_pct=float(top), ppl_q=ppl_q,
                             ppl_base=ppl_q / math.exp(float(ln_ratio)), ctx=ctx, chunks=int(n),
                             mean_kld_stderr=float(kld_se), same_top_stderr=float(top_se),
                             ln_ppl_ratio_stderr=float(ln_se)))
    return rows


EARLY_LOOKS = (4, 8, 12)
"""After which chunks (of the reference's 16) a variant's running figures are looked at.

EARLY_PASS: a variant whose running figures after 4, 8 or 12 of the 16 chunks are each EARLY_SIGMAS (3) standard
errors inside its gate passes on them, and its KL divergence stops there; every other variant is measured over
every chunk and judged by the gate as before. A variant truly at or past a limit looks 3 standard errors inside it
at one look with probability Φ(-3) = 0.13 %, at any of the three at most 0.4 %, which is all the refusing power
given up; a broken file (KL above 1, same top below 50 %) is never near. docs/quality.md has the measurements."""


def early_pass(text: str, ctx: int, gate: Gate, total: int) -> KLDStats | None:
    """The running figures at the first look (EARLY_LOOKS, before the last of `total` chunks) where every figure is
    EARLY_SIGMAS standard errors inside `gate`; None while there is none. Decided on the printed rows alone, so a
    run stopped there and one that ran to its end give the same figures."""
    rows = parse_kld_rows(text, ctx)
    for look in EARLY_LOOKS:
        if look >= total or len(rows) < look:
            break
        stats = rows[look - 1]
        if stats.chunks == look and gate.inside_by(stats.figures(), EARLY_SIGMAS):
            return replace(stats, of_chunks=total)
    return None


# What llama-perplexity logs before it gives up and still exits 0 (tools/perplexity/perplexity.cpp).
_PERPLEXITY_FAILURES = re.compile(
    r"^.*(failed reading|failed to open|failed to decode|does not look like a file containing|"
    r"inconsistent vocabulary|has been computed with|you need at least).*$",
    flags=re.M,
)
LOGITS_MAGIC = b"_logits_"
_LOGITS_HEADER = 20  # magic, n_ctx (u32), n_vocab (i32), n_chunk (i32)


def perplexity_failures(text: str) -> list[str]:
    """The error lines llama-perplexity printed; it exits 0 after most of them, so the status says nothing."""
    return [m.group(0).strip() for m in _PERPLEXITY_FAILURES.finditer(text)]


def logits_header(path: Path) -> tuple[int, int, int]:
    """(n_ctx, n_vocab, n_chunk) from a `--kl-divergence-base` file's header.

    Raises:
        ArtifactError: the file is too short for a header, or does not start with the logits magic.
    """
    import struct

    with open(path, "rb") as fh:
        head = fh.read(_LOGITS_HEADER)
    if len(head) < _LOGITS_HEADER or head[:8] != LOGITS_MAGIC:
        raise ArtifactError(f"{path} is not a complete llama.cpp logits file ({path.stat().st_size} bytes, header "
                            f"{head[:8]!r})", hint="rerun the same command to compute the reference logits again")
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<Iii", head, 8)
    return n_ctx, n_vocab, n_chunk


def check_logits_file(path: Path, *, ctx: int, max_chunks: int) -> None:
    """Read a `--kl-divergence-base` file's header and check its length is exactly what the header implies.

    Raises:
        ArtifactError: not a logits file, another context or chunk count, or shorter/longer than complete.
    """
    size = path.stat().st_size
    n_ctx, n_vocab, n_chunk = logits_header(path)
    if n_ctx != ctx or n_vocab <= 0 or not 1 <= n_chunk <= max_chunks:
        raise ArtifactError(f"{path} holds n_ctx={n_ctx}, n_vocab={n_vocab}, n_chunk={n_chunk}; expected "
                            f"n_ctx={ctx} and 1..{max_chunks} chunks",
                            hint="rerun the same command to compute the reference logits again")
    expected = logits_file_size(n_ctx, n_vocab, n_chunk)
    if size != expected:
        raise ArtifactError(f"{path} is {'truncated' if size < expected else 'too long'}: {size} bytes, "
                            f"{n_chunk} chunks of {n_ctx} tokens over {n_vocab} tokens make {expected}",
                            hint="rerun the same command to compute the reference logits again")


def kld_base_logits(
    reference: Path, text: Path, out: Path, llama: LlamaCpp, *, threads: int, ctx: int, chunks: int
) -> Path:
    """Save the reference model's logits over `text` (llama-perplexity --kl-divergence-base), atomically.

    llama-perplexity exits 0 when it cannot write the file or has too little text: its log is read for
    errors and the file's length is checked against its header before it is promoted.

    Raises:
        ToolError, DiskFullError: llama-perplexity failed, or the disk filled while it wrote.
        ArtifactError: it reported an error, or its file is incomplete.
    """
    if out.exists():
        return out
    with atomic_output(out, check=lambda p: check_logits_file(p, ctx=ctx, max_chunks=chunks)) as tmp:
        result = run([
            llama.bin("llama-perplexity"), "-m", reference, "-f", text, "--kl-divergence-base", tmp,
            "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks), "-t", str(check_threads(threads)),
        ], output=tmp)
        if failures := perplexity_failures(result.stderr + result.stdout):
            raise ArtifactError(f"llama-perplexity could not save the reference logits of {reference}: "
                                + "; ".join(failures), hint="see the message above, then rerun the same command")
    return out


_KLD_TRIES = 3
"""How often llama-perplexity's KL divergence is run when its printed output comes back cut short (kld_stopped_short)."""


def kl_divergence(quant: Path, base_logits: Path, llama: LlamaCpp, *, threads: int, ctx: int,
                  gate: Gate | None = None) -> KLDStats:
    """Mean KL divergence, same-top-token rate and perplexities of `quant` against saved base logits.

    With a `gate`, the variant may pass on its first chunks (early_pass): llama-perplexity is stopped at the first
    look where every figure is EARLY_SIGMAS standard errors inside the gate, and those figures are returned.

    llama.cpp logs through a worker thread that is never joined at exit (common/log.cpp, `common_log_main`: the
    logger is leaked on purpose, "logs may be lost if not flushed before the program exits"), so under load the last
    rows and the statistics can be lost from a run that finished: such a run is made again here, up to _KLD_TRIES
    times in all (the figures are the same every run).

    Raises:
        ArtifactError: llama-perplexity reported an error (it exits 0 after "failed reading log-probs"), or
            printed no statistics.
        ToolStoppedShort: every try stopped before its last chunk with no error line (transient: a flow retries).
    """
    short = (0, 0)
    total = 0  # no look before the last chunk: no early pass
    if gate is not None:
        with contextlib.suppress(ArtifactError):  # a damaged file: llama-perplexity says so below, with the remedy
            total = logits_header(base_logits)[2]

    def passed(out: str) -> KLDStats | None:
        return early_pass(out, ctx, gate, total) if gate is not None else None

    for _ in range(_KLD_TRIES):
        result = run([
            llama.bin("llama-perplexity"), "-m", quant, "--kl-divergence-base", base_logits, "--kl-divergence",
            "-c", str(ctx), "-b", str(ctx), "-t", str(check_threads(threads)),
        ], stop_when=(lambda out: passed(out) is not None) if gate is not None else None)
        text = result.stdout + "\n" + result.stderr
        if failures := perplexity_failures(text):
            raise ArtifactError(
                f"llama-perplexity could not measure {quant.name} against {base_logits}: " + "; ".join(failures),
                hint=f"the reference logits are damaged: delete {base_logits} and rerun the same command",
            )
        if early := passed(result.stdout):
            return early.with_running(result.stdout)
        stopped = kld_stopped_short(text)
        if stopped is None:
            return parse_kld_output(text, ctx).with_running(text)
        short = stopped
    raise ToolStoppedShort(
        f"llama-perplexity measured {quant.name} over {short[0]} of its {short[1]} chunks, then exited 0 "
        f"without its statistics or an error line, {_KLD_TRIES} times",
        hint="rerun the same command (a flow run retries it once); if it stops again, run the llama-perplexity "
             "command above by hand and read how it ends",
    )


def kld_stopped_short(text: str) -> tuple[int, int] | None:
    """(chunks printed, chunks announced) when `llama-perplexity --kl-divergence` stopped before its summary.

    It announces "computing over N chunks", prints one row per chunk, then "Mean    KLD" in its statistics
    (tools/perplexity/perplexity.cpp, kl_divergence). Seen once under load: 15 of 16 rows, no statistics, exit 0.
    """
    announced = re.search(r"computing over (\d+) chunks", text)
    if not announced or re.search(r"Mean\s+KLD:", text):
        return None
    rows = _kld_rows(text)
    return (rows, int(announced.group(1))) if rows < int(announced.group(1)) else None


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
    gate: Gate,
    llama: LlamaCpp,
    *,
    threads: int,
    ctx: int,
    report_path: Path,
    evaluation: EvaluationBlock,
    smoke: bool = True,
    extra: dict[str, Any] | None = None,
    answers: Answers | Future[Answers] | None = None,
    late: Callable[[], dict[str, Any]] | None = None,
) -> GGUFReport:
    """Measure `quant` against the reference logits, apply `gate`, and write the JSON report.

    `evaluation` names the held-out text the reference logits were computed on (name, sha256, ctx, chunks);
    `extra` holds the report's other fields (key, sha256, source, calibration, evaluation, preflight), and
    `late` gives those known only once the measurement is done (the variant's sha256, hashed meanwhile).
    `answers` may still be coming (a Future): the KL divergence is measured meanwhile, and its error, if any,
    is raised after the answers are in (the caller's pool waits for them either way).
    """
    smoke_result = smoke_generate(quant, quant_info, llama, threads=threads) if smoke else None
    stats = kl_divergence(quant, base_logits, llama, threads=threads, ctx=ctx, gate=gate)
    if isinstance(answers, Future):
        answers = answers.result()
    extra = (extra or {}) | (late() if late is not None else {})
    broken = chance_failure(stats.figures().ppl_reference, _vocab(reference))
    report = GGUFReport(
        variant=variant,
        path=str(quant),
        reference=str(reference),
        gguf=as_block(GGUFRecord, quant_info.to_dict()),
        smoke=smoke_result.record() if smoke_result else None,
        kld=stats.record(),
        validation=Validation.judge(format="gguf", reference=reference.name, evaluation=evaluation,
                                    figures=stats.figures(), gate=gate, answers=answers,
                                    failures=[broken] if broken else None),
        toolchain=as_block(ToolchainRecord, llama.versions()),
        **extra,
    )
    report.write(report_path)
    return report


def _vocab(model: Path) -> int | None:
    """The vocabulary size of GGUF `model` (its token embedding's rows), or None when it has none."""
    header = read_gguf_header(model, lambda _k, _f: False)
    rows = [t.shape for t in header.tensors if t.name == "token_embd.weight"]
    return int(rows[0][-1]) if rows and rows[0] else None
