"""A GGUF file on its own: inspect its header, validate it against its reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipelines.cli._app import app, load_settings, mib, out


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
    from pipelines.gguf.measure import measure_file

    done = measure_file(
        quant, reference, load_settings(), profile=profile, report_path=report, smoke=not no_smoke
    )
    f = done.report.judged.figures
    assert f is not None, "a GGUF validation always measures"
    out.print(
        f"{quant.name} ({done.quant_type}) vs {reference.name}: mean KL {f.mean_kl:.5f}, "
        f"same top {f.same_top_pct:.2f} %, ΔPPL {f.dppl_pct:+.2f} %  → report {done.report_path}"
    )
    failure = done.failure()
    if failure is not None:
        raise failure
    out.print("[green]gate passed[/green]")
