"""stack: the embedded Prefect stack (flows/stack/) started, stopped, checked and repaired from the command line.

`python -m flows.stack CMD` is the same command group under its old name (flows.stack.main).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from pipelines.cli._app import app, load_settings
from pipelines.core.errors import OrchestratorError

stack_app = typer.Typer(
    help="The embedded Prefect stack: a local server (SQLite, 127.0.0.1), the modelmint-local work pool and its "
    "limits, the deployments of prefect.yaml, a process worker (`python -m flows.stack` is the same).",
    no_args_is_help=True,
)
app.add_typer(stack_app, name="stack")
UP = "`modelmint stack up` starts what is not running (bash scripts/up.sh runs it)"


@stack_app.command("up")
def up() -> None:
    """Start what is not running (server, work pool, limits, crash automation, deployments, worker); print the UI."""
    from flows import stack

    stack.up(load_settings())


@stack_app.command("down")
def down() -> None:
    """Stop the worker and every process of its runs (marked Crashed, their slots freed; a run already registering
    is let finish), then the server."""
    from flows import stack

    stack.down(load_settings())


@stack_app.command("status")
def status() -> None:
    """What is running: the server (healthy or not) and the worker. Exits 1 when either is not."""
    from flows import stack

    settings = load_settings()
    missing = stack.status(settings)
    if missing:
        raise OrchestratorError(
            f"the local stack at {settings.prefect_api_url} is not up: {'; '.join(missing)}", hint=UP
        )


@stack_app.command("doctor")
def doctor(
    fix: Annotated[
        bool, typer.Option("--fix", help="mark dead runs Crashed and free what they hold")
    ] = False,
) -> None:
    """Held slots (who, since when), runs whose process died, counts no lease accounts for, and the fix. Exits 1
    when something was not healthy (before any --fix)."""
    from flows import stack

    if not stack.doctor(load_settings(), fix=fix):
        raise typer.Exit(1)


@stack_app.command("run")
def run(
    deployment: Annotated[str, typer.Argument(help="e.g. convert/tiny-qwen2")],
    param: Annotated[list[str] | None, typer.Option(help="key=value (JSON values), repeatable")] = None,
) -> None:
    """Check the stack (server, work pool, the deployment, a worker), say when the model's slot is held, then
    `prefect deployment run DEPLOYMENT --watch`."""
    from flows import stack

    settings = load_settings()
    stack.check_deployment(settings, deployment)
    stack.say_waits(settings, deployment)
    argv = [sys.executable, "-m", "prefect", "deployment", "run", deployment, "--watch"]
    for p in param or []:
        argv += ["--param", p]
    os.execve(sys.executable, argv, stack.run_env(settings))


@stack_app.command("api-url")
def api_url() -> None:
    """Print the API URL to export as PREFECT_API_URL."""
    print(load_settings().prefect_api_url)
