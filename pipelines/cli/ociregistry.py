"""`registry serve`: a local OCI registry that `ollama pull` and `modelmint publish` can use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli._app import err, load_settings, registry_app
from pipelines.core.errors import ConfigError


@registry_app.command("serve")
def registry_serve(
    port: Annotated[int, typer.Option(help="the registry's port on 127.0.0.1")] = 5000,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="storage, config and log (default: MODELMINT_HOME/registry)")
    ] = None,
    blob_host: Annotated[
        str,
        typer.Option(
            help="loopback address of the blob server the registry redirects "
            "to: another host than 127.0.0.1, as Ollama's pull requires"
        ),
    ] = "127.0.0.2",
    blob_port: Annotated[int, typer.Option(help="the blob server's port (0: a free one)")] = 0,
) -> None:
    """Serve a distribution registry on 127.0.0.1 whose blob GETs redirect to a file server on another loopback
    host, as object storage behind a registry does: `ollama pull --insecure` can pull from it (docs/oci.md).
    Anyone on this machine may pull; pushes, tags and deletes need its push credentials, which `modelmint publish`
    here finds (MODELMINT_REGISTRY_USERNAME/PASSWORD, else the docker config's entry, made if missing)."""
    import signal
    import time

    from pipelines.publish.localregistry import check_ollama_blob_host, local_registry, push_credentials
    from pipelines.publish.oci import Credentials

    check_ollama_blob_host(blob_host)
    settings = load_settings()
    root = directory or settings.home / "registry"
    source = ""

    def credentials(host: str) -> Credentials:
        nonlocal source
        found, source = push_credentials(settings, host)
        return found

    def _stop(*_: object) -> None:
        # a service manager's SIGTERM, a closed terminal's SIGHUP, Ctrl-C: both servers stop, at any point, exit 0
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)
    with local_registry(root, port, blob_host=blob_host, blob_port=blob_port, credentials=credentials) as reg:
        err.print(
            f"registry on http://{reg.host} (blob GETs redirect to http://{reg.blobs.host}; storage {root}; "
            f"Ctrl-C stops)\n  pulls: anyone; pushes, tags and deletes: its push credentials ({source})"
            f"\n  publish: modelmint publish NAME:TAG --registry {reg.host}/modelmint --insecure"
            f"\n  pull:    ollama pull --insecure {reg.host}/modelmint/NAME:TAG",
            highlight=False,
            soft_wrap=True,
        )
        while reg.proc.poll() is None:
            time.sleep(0.5)
        raise ConfigError(f"docker-registry exited {reg.proc.returncode}", hint=f"see {reg.log}, then rerun")
