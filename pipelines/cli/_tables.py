"""Cells more than one command shows the same way: a publication, the run report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from pipelines.compose import Cell, RunReport


def publication(entry: dict[str, Any]) -> str:
    """One place an artifact is published: its image, the pinned tag beside it and the image's digest."""
    tags = [t for t in entry.get("tags") or [] if t != entry["image"].rpartition(":")[2]]
    digest = str(entry.get("digest", "")).removeprefix("sha256:")[:12]
    return entry["image"] + "".join(f" +:{t}" for t in tags) + (f" ({digest})" if digest else "")


def _markup(cell: Cell) -> str:
    text = escape(cell.text)
    if cell.tone == "ok":
        return f"[green]{text or 'ok'}[/green]"
    return f"[red]{text}[/red]" if cell.tone == "bad" else text


def rich_table(report: RunReport) -> Table:
    """The run report's table (RunReport.table, the one the flow's artifact shows too) in rich markup."""
    columns, rows = report.table()
    table = Table(*columns, title=report.name)
    for row in rows:
        table.add_row(*(_markup(c) for c in row))
    return table
