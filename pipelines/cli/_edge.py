"""The one error edge: every command runs inside main(), which alone turns an exception into a message for people."""

from __future__ import annotations

import logging
import os
import sys

from pipelines.cli._app import app, err, escape
from pipelines.core.errors import ModelmintError


def main() -> None:
    """Entry point: a usage error is typer's (usage text, exit 2); a ModelmintError becomes its message, its hint,
    and exit code 1."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Standalone mode: typer 0.29 raises its own bundled click's exceptions (typer._click), which `click` does not
    # know, so only typer itself can show them as usage text (and exit 2), Abort as "Aborted!", Exit as its code.
    try:
        app()
    except ModelmintError as e:
        err.print(f"[bold red]error:[/bold red] {escape(e.message)}", highlight=False)
        if e.hint:
            err.print(f"[yellow]→ {escape(e.hint)}[/yellow]", highlight=False)
        sys.exit(1)
    except Exception as e:  # the edge: whatever escaped the library is one line, not a traceback
        if os.environ.get("MODELMINT_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        err.print(f"[bold red]error:[/bold red] {escape(f'{type(e).__name__}: {e}')}", highlight=False)
        err.print(
            "[yellow]→ this is a bug in modelmint: set MODELMINT_DEBUG=1 for the traceback[/yellow]",
            highlight=False,
        )
        sys.exit(1)
