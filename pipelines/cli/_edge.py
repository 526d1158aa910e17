"""The one error edge: every command runs inside main(), which alone turns an exception into a message for people.

A ModelmintError says what went wrong and what to run next (its `hint`). Anything else that reaches the edge was not
meant to: an OSError naming a path (a folder where a file was asked for, a path that cannot be written) is said as
that path and its cause, anything else as a bug; both are one `error:` line, and MODELMINT_DEBUG=1 prints the
traceback as well.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable, Sequence

import typer

from pipelines.cli._app import app, err, escape
from pipelines.core.errors import DiskFullError, ModelmintError

DEBUG = "MODELMINT_DEBUG"
"""Set to 1, the edge prints the traceback of what it caught (read here: the settings may be what failed)."""
DEBUG_HINT = f"set {DEBUG}=1 for the traceback"


def _modelmint(e: ModelmintError) -> tuple[str, str | None]:
    return e.message, e.hint


def _os_error(e: OSError) -> tuple[str, str | None]:
    if e.errno == errno.ENOSPC:
        full = DiskFullError(str(e.filename or "the output"))
        return full.message, f"{full.hint}; {DEBUG_HINT}"
    if e.filename is None:
        return _unexpected(e)
    where = str(e.filename) + (f" -> {e.filename2}" if e.filename2 is not None else "")
    return (
        f"{where}: {e.strerror or e}",
        f"check that path (a file or a folder where each is asked for, one you may write); {DEBUG_HINT}",
    )


def _unexpected(e: BaseException) -> tuple[str, str | None]:
    return f"{type(e).__name__}: {e}", f"this is a bug in modelmint: {DEBUG_HINT}"


EDGE: Sequence[tuple[type[BaseException], Callable[..., tuple[str, str | None]]]] = (
    (ModelmintError, _modelmint),
    (OSError, _os_error),
    (Exception, _unexpected),
)
"""Each error type the edge knows, most specific first, and how it says one: (message, hint)."""


def describe(e: BaseException) -> tuple[str, str | None]:
    """The message and the hint the edge prints for `e` (the first EDGE row whose type it is)."""
    for kind, say in EDGE:
        if isinstance(e, kind):
            return say(e)
    return _unexpected(e)


def main(args: list[str] | None = None, *, command: typer.Typer = app, prog_name: str | None = None) -> None:
    """Entry point: run `command` (the modelmint app) on `args` (sys.argv's), and exit with its code.

    A usage error is typer's (usage text, exit 2); any other exception becomes one `error:` line and its hint,
    exit code 1 (with the traceback first where MODELMINT_DEBUG=1)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Standalone mode: typer 0.29 raises its own bundled click's exceptions (typer._click), which `click` does not
    # know, so only typer itself can show them as usage text (and exit 2), Abort as "Aborted!", Exit as its code.
    try:
        command(args=args, prog_name=prog_name)
    except Exception as e:  # the edge: whatever escaped is one line, not a traceback
        if os.environ.get(DEBUG) == "1":
            import traceback

            traceback.print_exc()
        message, hint = describe(e)
        err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False)
        if hint:
            err.print(f"[yellow]→ {escape(hint)}[/yellow]", highlight=False)
        sys.exit(1)
