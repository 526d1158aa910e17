"""recommend: which registered variant to run on your GPUs; site: the registry as static HTML, and a look at it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Column, Table

from pipelines.cli._app import app, err, escape, load_settings, out

site_app = typer.Typer(
    help="The registry as a static site: an index of models and a page per model.", no_args_is_help=True
)
app.add_typer(site_app, name="site")


@app.command("recommend")
def recommend_cmd(
    gpus: Annotated[
        str,
        typer.Option(
            help="the machine: 1xRTX4060-8G, 1x16G (a GPU by its size), 2x8xH100-80G, mixed with +, cpu:64G, "
            "apple:M3-Max-64G, or an inventory .yaml (`modelmint plan --list-gpus` lists the GPUs)"
        ),
    ],
    names: Annotated[
        list[str] | None, typer.Argument(help="models to answer for (default: every registered one)")
    ] = None,
    context: Annotated[
        int | None, typer.Option(help="tokens per sequence (default: the model's maximum)")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="sequences served at once")] = 1,
    engine: Annotated[
        str | None,
        typer.Option(help="ollama or llama.cpp (GGUF variants), vllm (compressed-tensors); default: each variant's own"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """For each model, the registered variants that fit this machine on their engine (a GGUF on Ollama or llama.cpp,
    sized by llama.cpp's buffers, partly offloaded when the GPU is short; a checkpoint on vLLM), ranked by their
    measured quality (variants within each other's standard errors tie, and the smaller wins), with why and the
    commands that serve the winner as planned."""
    from pipelines.advice.recommend import Request, recommend, size_text

    answers = recommend(
        load_settings(), Request(gpus, context=context, concurrency=concurrency, engine=engine), names or None
    )
    if as_json:
        out.print_json(json.dumps([a.to_dict() for a in answers]))
        return
    for a in answers:
        table = Table(
            "",
            "variant",
            Column("weights", justify="right"),
            "mean KL ± s.e.",
            "same top",
            "scored on",
            "fits",
            title=f"{a.name} on {gpus}"
            + (f", context {context}" if context else "")
            + (f", {concurrency} sequences" if concurrency != 1 else ""),
        )
        for rank, c in enumerate(a.ranked, 1):
            table.add_row(
                "[green]→[/green]" if rank == 1 else str(rank),
                escape(c.ref),
                size_text(c.weights_bytes),
                escape(c.figures_text().split(", same top")[0].removeprefix("mean KL ")),
                f"{c.figures.same_top_pct:.1f} %" if c.figures else "-",
                escape(c.scored.text()),
                escape(c.fits_text()),
            )
        for c in a.unfit:
            table.add_row(
                "-",
                escape(c.ref),
                size_text(c.weights_bytes),
                escape(c.figures_text().split(", same top")[0].removeprefix("mean KL ")),
                f"{c.figures.same_top_pct:.1f} %" if c.figures else "-",
                escape(c.scored.text()),
                "[red]no[/red]: " + escape(c.refused or ""),
            )
        for f in a.failed:
            table.add_row(
                "-",
                escape(f"{a.name}:{f.tag}"),
                "-",
                "-",
                "-",
                "-",
                "[red]gate failed, not registered[/red]: " + escape("; ".join(f.failures)),
            )
        if table.rows:
            out.print(table)
        if a.problem:
            err.print(f"[yellow]{escape(a.name)}:[/yellow] {escape(a.problem)}", highlight=False)
        for line in a.reasons:
            out.print(f"why: {escape(line)}", highlight=False, soft_wrap=True)
        for w in a.warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False, soft_wrap=True)
        for w in a.would_fit:
            out.print(f"would fit: {escape(w)}", highlight=False, soft_wrap=True)
        for cmd in a.commands:
            out.print(f"  {escape(cmd)}", highlight=False, soft_wrap=True)


@site_app.command("build")
def site_build(
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help="the folder to write the site to: a new or empty one, or a site an earlier build wrote "
            "(replaced as a whole); any other folder is refused",
        ),
    ],
) -> None:
    """Write the registry as self-contained HTML: index.html, a page per model, how to read the charts."""
    from pipelines.site.build import build_site

    built = build_site(load_settings(), out_dir)
    for bad in built.invalid:
        err.print(
            f"[yellow]warning:[/yellow] {escape(bad.message)} (shown on its model's page)", highlight=False
        )
    out.print(
        f"wrote {len(built.pages)} pages to {escape(str(out_dir))}: open {escape((built.out / 'index.html').as_uri())}"
        f" or run `modelmint site serve --dir {escape(str(out_dir))}`",
        highlight=False,
        soft_wrap=True,
    )


@site_app.command("serve")
def site_serve(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="a built site (default: the one the convert flow keeps, MODELMINT_WORK_DIR/site)"
        ),
    ] = None,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="the port on 127.0.0.1 (0: any free one, printed)")
    ] = 8000,
) -> None:
    """Serve a built site on 127.0.0.1 for a quick look (Ctrl-C stops it)."""
    from pipelines.site.build import default_site_dir
    from pipelines.site.server import site_server

    folder = directory or default_site_dir(load_settings())
    server = site_server(folder, port=port)
    out.print(
        f"serving {escape(str(folder))} on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)",
        highlight=False,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
