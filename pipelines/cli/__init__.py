"""The modelmint command line: one module per command group, each command a thin function over a library call;
`main` (the `modelmint` console script) is the one edge that turns errors into messages."""

from __future__ import annotations

# Each module adds its commands to `app` when imported; the order is the order of `modelmint --help`.
from pipelines.cli import build, registry, remotes, ociregistry, plan, site, catalog, gguf, chat, stack  # noqa: F401  # isort: skip
from pipelines.cli._app import app
from pipelines.cli._edge import main

__all__ = ["app", "main"]
