"""The typer app every command module adds itself to, its consoles, and the option types and formats they share."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape as _rich_escape

from pipelines.core.settings import Settings

app = typer.Typer(
    help="modelmint: pinned Hugging Face models in; validated GGUF and compressed-tensors artifacts out.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
catalog_app = typer.Typer(help="The models modelmint knows how to build.", no_args_is_help=True)
app.add_typer(catalog_app, name="catalog")
webhook_app = typer.Typer(
    help="Receive the hub's webhooks: a tracked ref's new commit starts its conversion.", no_args_is_help=True
)
app.add_typer(webhook_app, name="webhook")
registry_app = typer.Typer(
    help="A local OCI registry that `ollama pull` and `modelmint publish` can use.", no_args_is_help=True
)
app.add_typer(registry_app, name="registry")


def _console(*, stderr: bool = False) -> Console:
    """A rich console; where output goes to a pipe or a log (no terminal, no COLUMNS), rows are not cut at 80."""
    console = Console(stderr=stderr, emoji=False)  # "a:b:c" is a ref, not the emoji :b:
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=160, emoji=False)
    return console


out = _console()
err = _console(stderr=True)


def load_settings() -> Settings:
    return Settings.from_env()


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def size(n: int) -> str:
    return mib(n) if n >= 1 << 20 else f"{n:,} B"


def escape(text: str) -> str:
    """Text shown as typed: a `[red]` in a name or a message is not rich markup."""
    return _rich_escape(text)


RevisionOption = Annotated[str | None, typer.Option(help="override the pinned 40-hex commit")]
RegisterOption = Annotated[
    bool,
    typer.Option(
        help="register the variants that passed: artifacts/, DVC, manifest (the Prefect flow always does)"
    ),
]
ForceOption = Annotated[
    bool,
    typer.Option(
        "--force", help="with --register: register a source commit older than the tag's current version"
    ),
]
TrackOption = Annotated[
    bool, typer.Option(help="dvc commit + push what is registered (dvc.yaml's stages pass --no-track)")
]
JsonOption = Annotated[bool, typer.Option("--json", help="print the build summary as JSON")]
RegistryOption = Annotated[
    str | None,
    typer.Option(
        "--registry",
        help="the OCI registry and namespace, HOST[:PORT]/NAMESPACE, e.g. registry.internal/modelmint",
    ),
]
InsecureOption = Annotated[bool, typer.Option("--insecure", help="speak plain HTTP to the registry")]
