"""The catalog and its upstreams: `catalog list`, `watch` (tracked refs that moved), `webhook serve`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from pipelines.cli._app import app, catalog_app, err, escape, load_settings, out, webhook_app
from pipelines.core.errors import ConfigError, ModelmintError

if TYPE_CHECKING:
    from pipelines.core.settings import Settings
    from pipelines.source.upstream import Movement


@catalog_app.command("list")
def catalog_list() -> None:
    """List the catalog's entries and their pinned sources."""
    from pipelines.source.catalog import load_catalog

    settings = load_settings()
    catalog = load_catalog(settings.catalog_path)
    table = Table("name", "source", "revision", "gguf variants", "compressed", "license")
    for m in catalog.models:
        src, pin = m.source.origin()
        rev = "[red]not pinned[/red]" if pin is None else escape(pin)
        gguf = m.variants.gguf
        table.add_row(
            m.name,
            escape(src),
            rev,
            ", ".join(gguf.quants) if gguf else "-",
            ", ".join(m.variants.compressed()) or "-",
            m.license,
        )
    out.print(table)


@app.command("watch")
def watch_cmd(
    names: Annotated[
        list[str] | None, typer.Argument(help="catalog entries (default: every one with source.track)")
    ] = None,
    apply: Annotated[
        bool,
        typer.Option("--apply", help="move each moved pin in registry/catalog.yaml and regenerate dvc.yaml"),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print what moved as JSON")] = False,
    convert: Annotated[
        bool,
        typer.Option(
            "--convert",
            help="instead: start (or find) the conversion of each named entry's pinned commit on the Prefect "
            "server (PREFECT_API_URL), with the key the scheduled watcher and the webhook use",
        ),
    ] = False,
) -> None:
    """Compare each tracked upstream ref's current commit on the hub with the catalog's pin: what moved, which
    files changed (weights, tokenizer, chat template, config), and with --apply, move the pin. With --convert, start
    the conversion of each named entry's pinned commit on Prefect instead (what CI runs once a moved pin is in)."""
    from pipelines.source import upstream
    from pipelines.source.catalog import load_catalog

    settings = load_settings()
    if convert:
        _convert_pinned(settings, names or [], apply=apply, as_json=as_json)
        return
    entries = upstream.tracked(load_catalog(settings.catalog_path), names or ())
    if not entries:
        err.print(
            f"no catalog entry tracks an upstream ref: add `track: main` under an entry's source in "
            f"{settings.catalog_path}",
            highlight=False,
        )
        return
    found, failed = upstream.check_all(entries, settings, limit=upstream.RateLimit(0.2))
    moved = [m for m in found if m.moved]
    if apply:
        from pipelines.store.pins import move_pin

        for m in moved:
            move_pin(settings, m.name, m.head)
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "moved": [m.to_dict() for m in moved],
                    "applied": apply and bool(moved),
                    "unchanged": [m.name for m in found if not m.moved],
                    "errors": {n: e.message for n, e in failed},
                }
            )
        )
    else:
        _print_movements(found, applied=apply)
    for name, why in failed:
        err.print(f"[bold red]{name}:[/bold red] {escape(why.message)}", highlight=False)
        if why.hint:
            err.print(f"[yellow]  → {escape(why.hint)}[/yellow]", highlight=False)
    if failed:
        raise ModelmintError(
            f"{len(failed)} of {len(entries)} tracked entries could not be checked: "
            f"{', '.join(n for n, _ in failed)}; nothing was changed for them",
            hint="rerun `modelmint watch` later for a hub that was down (the scheduled flow "
            "retries on its next tick); fix the catalog for the others",
        )


def _convert_pinned(settings: Settings, names: list[str], *, apply: bool, as_json: bool) -> None:
    """`watch --convert NAME…`: each entry's pinned commit handed to Prefect as one `convert/<name>` run."""
    if not names or apply or as_json:
        raise typer.BadParameter("--convert takes one or more catalog entries and neither --apply nor --json",
                                 param_hint="'--convert'")
    # Conversions are Prefect runs, so this lives with the flows (pipelines itself never imports Prefect).
    from flows.watch import pinned_commits, start_conversion

    for name, commit in pinned_commits(settings, names).items():
        run = start_conversion(name, commit)
        state = run.state.type.value if run.state else "unknown"
        out.print(f"{name}@{commit[:12]}: flow run {run.name} ({run.id}), {state}", highlight=False, soft_wrap=True)


def _print_movements(found: list[Movement], *, applied: bool) -> None:
    for m in found:
        if not m.moved:
            out.print(f"{m.name}: {m.repo} {m.ref} is still at the pin {m.head[:12]}", highlight=False)
            continue
        was = (m.pinned or "unpinned")[:12]
        what = "variants rebuild" if m.rebuilds_weights else "metadata only: no weights rebuilt"
        out.print(
            f"[bold]{m.name}[/bold]: {m.repo} {m.ref} moved {was} → {m.head[:12]} "
            f"({', '.join(m.kinds) or 'no listed file changed'}; {what})"
            + (" [green]pin moved[/green]" if applied else ""),
            highlight=False,
            soft_wrap=True,
        )
        for c in m.changes:
            out.print(f"  {c.change:<8} {c.path}  [dim]{c.kind}[/dim]", highlight=False, soft_wrap=True)
    if any(m.moved for m in found) and not applied:
        out.print(
            "[dim]`modelmint watch --apply` moves these pins in the catalog and regenerates dvc.yaml[/dim]"
        )


@webhook_app.command("serve")
def webhook_serve(
    host: Annotated[
        str, typer.Option(help="address to listen on (a reverse proxy in front for the internet)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8765,
    header_timeout: Annotated[
        float, typer.Option(min=0.1, help="seconds a connection has to send a request's headers, else it is closed")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(min=0.1, help="seconds a request's body has to arrive once its headers are in, else 408")
    ] = 30.0,
    max_connections: Annotated[
        int | None,
        typer.Option(min=1, show_default="256, or fewer under a low `ulimit -n`",
                     help="open connections at most; a new one closes the oldest still sending its request"),
    ] = None,
) -> None:
    """Serve the webhook receiver: Hugging Face `repo.content` events for tracked refs start `convert/<name>` runs
    on the Prefect server (PREFECT_API_URL); the secret is MODELMINT_WEBHOOK_SECRET."""
    # The receiver hands work to Prefect, so it lives with the flows (pipelines itself never imports Prefect).
    from flows.webhook import connection_limit, serve

    settings = load_settings()
    if not settings.webhook_secret:
        raise ConfigError(
            "MODELMINT_WEBHOOK_SECRET is not set",
            hint="set it to the secret configured on the hub's webhook, then rerun `modelmint webhook serve`",
        )
    limit = connection_limit(max_connections)  # before the line below: a limit that does not fit is the error
    err.print(f"receiving webhooks on http://{host}:{port}/ (Ctrl-C stops)", highlight=False)
    serve(settings, host=host, port=port, header_timeout=header_timeout, body_timeout=body_timeout,
          max_connections=limit)
