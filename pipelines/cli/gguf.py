"""A GGUF file on its own: inspect its header, validate it against its reference."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipelines.cli._app import app, load_settings, mib, out
from pipelines.core.errors import ConfigError, GateFailed


@app.command()
def inspect(
    path: Annotated[Path, typer.Argument(help="a .gguf file")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Read a GGUF's header, metadata and tensor types."""
    from pipelines.core.ggufheader import inspect_gguf, refuse_contradicting_architecture

    info = inspect_gguf(path)
    refuse_contradicting_architecture(path)
    if as_json:
        out.print_json(json.dumps(info.to_dict()))
        return
    table = Table(show_header=False, title=str(path))
    rows = {
        "GGUF version": info.version,
        "architecture": info.architecture,
        "file type": info.file_type,
        "size": mib(info.size_bytes),
        "tensors": info.tensor_count,
        "parameters": f"{info.parameter_count:,}",
        "tensor types": ", ".join(f"{k}×{v}" for k, v in info.tensor_types.items()),
        "quantized share of weights": f"{info.quantized_fraction:.1%}",
        "tokenizer": f"{info.tokenizer_model} / {info.tokenizer_pre}",
        "bos / eos / eot": f"{info.bos_token_id} / {info.eos_token_id} / {info.eot_token_id}",
        "context length": info.context_length,
        "chat template": "present" if info.chat_template else "[red]missing[/red]",
        **{k: v for k, v in info.metadata.items()},
    }
    for k, v in rows.items():
        table.add_row(k, str(v))
    out.print(table)


@app.command()
def validate(
    quant: Annotated[Path, typer.Argument(help="the quantized .gguf to check")],
    reference: Annotated[Path, typer.Option(help="the f16/bf16 .gguf it was made from")],
    profile: Annotated[
        str, typer.Option(help="gate thresholds: reference (published figures) or tiny")
    ] = "reference",
    report: Annotated[Path | None, typer.Option(help="where to write the JSON report")] = None,
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="skip the generation smoke test")] = False,
) -> None:
    """Measure a quant against its reference (KL divergence, same top token, ΔPPL) and apply its gate."""
    from pipelines.core.gates import gguf_gate
    from pipelines.core.ggufheader import inspect_gguf
    from pipelines.core.texts import EVAL_TEXT, text_ref
    from pipelines.core.toolchains import llama_cpp
    from pipelines.gguf.build import GGUF_EVAL_CHUNKS, GGUF_EVAL_CTX
    from pipelines.gguf.validate import kld_base_logits, validate_variant

    if profile not in ("reference", "tiny"):
        raise ConfigError(
            f"unknown gate profile {profile!r}", hint="use --profile reference or --profile tiny"
        )
    settings = load_settings()
    llama = llama_cpp(settings)
    info = inspect_gguf(quant)
    ref_info = inspect_gguf(reference)
    qtype = (info.file_type or "").lower()
    gate = gguf_gate(qtype, profile, ref_info.parameter_count)  # type: ignore[arg-type]
    report_path = report or quant.with_suffix(".report.json")
    with tempfile.TemporaryDirectory(dir=settings.work_dir if settings.work_dir.exists() else None) as tmp:
        evaluation = text_ref(EVAL_TEXT)
        logits = kld_base_logits(
            reference,
            evaluation.path,
            Path(tmp) / "base.kld",
            llama,
            threads=settings.effective_threads,
            ctx=GGUF_EVAL_CTX,
            chunks=GGUF_EVAL_CHUNKS,
        )
        rep = validate_variant(
            qtype,
            quant,
            info,
            reference,
            logits,
            gate,
            llama,
            threads=settings.effective_threads,
            ctx=GGUF_EVAL_CTX,
            report_path=report_path,
            smoke=not no_smoke,
            evaluation=evaluation.describe(ctx=GGUF_EVAL_CTX, chunks=GGUF_EVAL_CHUNKS),
        )
    f, val = rep.validation.figures, rep.validation
    assert f is not None, "a GGUF validation always measures"
    out.print(
        f"{quant.name} ({qtype}) vs {reference.name}: mean KL {f.mean_kl:.5f}, "
        f"same top {f.same_top_pct:.2f} %, ΔPPL {f.dppl_pct:+.2f} %  → report {report_path}"
    )
    if not val.passed:
        from pipelines.core.report import advice_for_report

        raise GateFailed(
            qtype, val.failures, str(report_path), advice=advice_for_report(qtype, rep.to_dict())
        )
    out.print("[green]gate passed[/green]")
