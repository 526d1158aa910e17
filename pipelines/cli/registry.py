"""The registry: list, show, pull, publish, verify, dvc-yaml, and `registry serve` (a local OCI registry)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Column, Table

from pipelines.cli._app import (
    InsecureOption,
    RegistryOption,
    app,
    err,
    escape,
    load_settings,
    mib,
    out,
    registry_app,
)
from pipelines.cli._tables import publication
from pipelines.core.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.registry.manifest import Manifest
    from pipelines.registry.signing import Verified

AllowUnsignedOption = Annotated[
    bool,
    typer.Option(
        "--allow-unsigned",
        help="take an artifact without a signature the trust policy refuses (a warning says so)",
    ),
]


@app.command("list")
def list_cmd() -> None:
    """List the registered artifacts (registry/manifests)."""
    from pipelines.core.errors import RegistryError
    from pipelines.registry.images import publications
    from pipelines.registry.manifest import list_manifests

    settings = load_settings()
    listing = list_manifests(settings)
    if not listing.manifests and not listing.invalid:
        err.print(
            f"nothing registered yet in {settings.manifests_dir}: `modelmint convert NAME --register` builds, "
            "validates and registers a catalog model (`modelmint catalog list` shows the names)",
            highlight=False,
        )
        return
    if listing.manifests:
        # The ref is what a reader copies (`modelmint pull REF`): it never shrinks or wraps in a narrow terminal;
        # the other columns give way instead.
        refs = [m.ref for m in listing.manifests]
        artifact = Column("artifact", no_wrap=True, min_width=max(len("artifact"), *map(len, refs)))
        published = {m.ref: [publication(e) for e in publications(settings, m)] for m in listing.manifests}
        shown = any(published.values())
        table = Table(
            artifact,
            "format",
            "size",
            "sha256",
            "source",
            "mean KL",
            "gate",
            "DVC",
            *(["published"] if shown else []),
        )
        for m in listing.manifests:
            dvc = "pushed" if m.dvc.pushed else ("committed" if m.dvc.md5 else "dvc repro")
            kl = m.mean_kl
            table.add_row(
                m.ref,
                m.format,
                mib(m.weights_bytes),
                m.sha256[:12],
                m.source.ref,
                "-" if kl is None else f"{kl:.5f}",
                "[green]pass[/green]",
                dvc,
                *([", ".join(published[m.ref]) or "-"] if shown else []),
            )
        out.print(table)
    for bad in listing.invalid:
        err.print(f"[bold red]invalid:[/bold red] {escape(bad.message)}", highlight=False)
    if listing.invalid:
        valid = f"{len(listing.manifests)} valid" if listing.manifests else "none valid"
        raise RegistryError(
            f"{len(listing.invalid)} manifest(s) in {settings.manifests_dir} are invalid ({valid})",
            hint=listing.invalid[0].hint,
        )


@app.command()
def show(
    ref: Annotated[str, typer.Argument(help="name:tag, e.g. qwen2.5:q4_k_m")],
    history: Annotated[
        bool, typer.Option("--history", help="list every version of the tag git recorded")
    ] = False,
    plans: Annotated[
        bool, typer.Option("--plans", help="its serving plans per GPU inventory, as a table")
    ] = False,
    provenance: Annotated[
        bool,
        typer.Option("--provenance", help="its signed SLSA provenance, and who reproduced it (attestations)"),
    ] = False,
) -> None:
    """Print one artifact's manifest, its serving plans included (--plans: those as a table; --history: its versions,
    newest first; --provenance: its signed provenance, and who reproduced it)."""
    from pipelines.registry.manifest import find_manifest

    settings = load_settings()
    if plans:
        _print_serving(find_manifest(settings, ref))
        return
    if provenance:
        _print_provenance(ref)
        return
    if not history:
        from pipelines.registry.images import publications

        manifest = find_manifest(settings, ref)
        out.print_json(manifest.to_json())
        # the manifest alone on stdout (it is the registered record); where it is published, for people, beside it
        for entry in publications(settings, manifest):
            err.print(
                f"published: {publication(entry)}, {entry.get('published_at', '')}",
                highlight=False,
                soft_wrap=True,
            )
        return
    from pipelines.registry.history import history as versions_of

    table = Table("registered", "source commit", "sha256", "mean KL", "replaces", "git commit", "", title=ref)
    for v in versions_of(settings, ref):
        m = v.manifest
        table.add_row(
            m.created_at.isoformat(),
            (m.source.revision or m.source.ref)[:12],
            m.sha256[:12],
            "-" if m.mean_kl is None else f"{m.mean_kl:.5f}",
            m.replaces.sha256[:12] if m.replaces else "-",
            v.commit[:12] if v.commit else "not committed",
            "[green]current[/green]" if v.current else "",
        )
    out.print(table)


def _print_provenance(ref: str) -> None:
    """The provenance on stdout (JSON, as signed); each reproduced-by attestation on stderr, for people."""
    from pipelines.core.errors import RegistryError
    from pipelines.registry import provenance, reproduce
    from pipelines.registry.formats import format_of
    from pipelines.registry.manifest import find_manifest
    from pipelines.registry.trust import load_policy

    settings = load_settings()
    manifest = find_manifest(settings, ref)
    stmt = provenance.registered(settings, manifest)
    if stmt is None:
        raise RegistryError(
            f"{manifest.ref} has no provenance: it was registered unsigned",
            hint=f"register it again with MODELMINT_SIGNING_KEY set ("
            f"`{format_of(manifest.tag).rebuild_command(manifest.name, manifest.tag)}`)",
        )
    out.print_json(json.dumps(stmt))
    for a in reproduce.attestations(settings, manifest, load_policy(settings)):
        who = a.signer or f"key {a.keyid[:16]} (not in registry/trust.yaml)"
        err.print(
            f"reproduced by {who} on {a.reproduced_on:%Y-%m-%d}"
            + ("" if a.matches else " (of an earlier registration's files)"),
            highlight=False,
            soft_wrap=True,
        )


@app.command()
def reproduce(ref: Annotated[str, typer.Argument(help="name:tag, e.g. qwen2.5:q4_k_m")]) -> None:
    """Rebuild a registered artifact here from its provenance and, when every byte matches, add a reproduced-by
    attestation signed with MODELMINT_SIGNING_KEY (registry/attestations/NAME/TAG/; commit it)."""
    from pipelines.registry import signing
    from pipelines.registry.reproduce import rebuild_and_attest

    settings = load_settings()
    key = signing.preflight(settings)
    if key is None:
        raise ConfigError(
            "MODELMINT_SIGNING_KEY is not set: a reproduced-by attestation is signed with this builder's key",
            hint='set MODELMINT_SIGNING_KEY to your PEM EC private key (docs/registry.md, "Signing"), then rerun',
        )
    path = rebuild_and_attest(
        settings, ref, key, progress=lambda m: err.print(f"[dim]•[/dim] {escape(m)}", highlight=False)
    )
    out.print(
        f"{ref}: the rebuild matches every registered byte; attestation → {path} (commit it)",
        highlight=False,
        soft_wrap=True,
    )


def _print_serving(m: Manifest) -> None:
    """A manifest's serving plans: one row per plan (or refusal) of each inventory, then where its files are."""
    if m.serving is None:
        err.print(
            f"{m.ref} was registered before serving plans were: `modelmint plan {m.ref} --gpus …` makes them",
            highlight=False,
        )
        return
    s = m.serving
    table = Table(
        "inventory",
        "plan",
        "layout",
        Column("max_model_len", justify="right"),
        Column("max_num_seqs", justify="right"),
        "per GPU: weights / KV pool / total",
        title=f"{m.ref}: context {s.context or 'the model maximum'}, concurrency {s.concurrency}, "
        f"KV {s.kv_cache_dtype}, gpu_memory_utilization {s.gpu_memory_utilization}",
    )
    gib = 1 << 30
    for inv in s.inventories:
        if inv.refused is not None:
            table.add_row(
                inv.gpus,
                "[red]refused[/red]",
                escape(inv.refused),
                "-",
                "-",
                "nearest: " + escape("; ".join(inv.nearest)),
            )
        for p in inv.plans:
            mem = ", ".join(
                f"{g.gpu} {g.weights / gib:.2f} / {g.kv_pool / gib:.1f} / {g.total / gib:.0f} GiB"
                for g in p.per_gpu
            )
            table.add_row(inv.gpus, p.gpus, p.layout, str(p.max_model_len), str(p.max_num_seqs), mem)
    out.print(table)
    for inv in s.inventories:
        if inv.files:
            out.print(f"{inv.gpus}: {len(inv.files)} file(s) in {m.dvc.path}/{inv.dir}", highlight=False)
        for note in inv.notes:
            err.print(f"[yellow]note:[/yellow] {inv.gpus}: {escape(note)}", highlight=False)


@app.command()
def pull(
    ref: Annotated[
        str,
        typer.Argument(
            help="name:tag, e.g. qwen2.5:q4_k_m; name:tag@COMMIT12 for an earlier "
            "version (`modelmint show NAME:TAG --history` lists them); "
            "name:tag-<source12> with --from-registry"
        ),
    ],
    dest: Annotated[
        Path | None,
        typer.Option(
            help="where to place it (default: artifacts/NAME/TAG; an earlier "
            "version: MODELMINT_WORK_DIR/pulled/NAME/TAG@COMMIT)"
        ),
    ] = None,
    ollama: Annotated[bool, typer.Option(help="run `ollama create` when ollama is on PATH")] = True,
    from_registry: Annotated[
        str | None,
        typer.Option(
            "--from-registry",
            help="fetch the image `modelmint publish` pushed to HOST[:PORT]/NAMESPACE instead of DVC",
        ),
    ] = None,
    insecure: InsecureOption = False,
    allow_unsigned: AllowUnsignedOption = False,
) -> None:
    """Fetch a registered artifact from the DVC remote (or an OCI registry), check its sha256 and its signature
    (registry/trust.yaml), and hand it to Ollama (GGUF) or print its `vllm serve` command (compressed-tensors)."""
    import shlex

    from pipelines.registry.pull import pull as pull_artifact

    if from_registry is not None:
        from pipelines.publish.oci import RegistryRef
        from pipelines.registry.images import pull_image
        from pipelines.registry.manifest import parse_ref

        name, tag = parse_ref(ref)
        image = RegistryRef.parse(from_registry, insecure=insecure).image(name, tag)
        result = pull_image(
            load_settings(), image, insecure=insecure, dest=dest, ollama=ollama, allow_unsigned=allow_unsigned
        )
        origin = f" from {image}"
    else:
        result = pull_artifact(load_settings(), ref, dest=dest, ollama=ollama, allow_unsigned=allow_unsigned)
        origin = ""
    m = result.manifest
    state = f"fetched{origin} and verified" if result.fetched else "already in place and verified"
    out.print(
        f"{m.ref} ({mib(m.weights_bytes)}, sha256 {m.sha256[:12]}…) {state} → {result.dest}", soft_wrap=True
    )
    _print_verified(result.verified)
    if result.ran_ollama:
        out.print(
            f"[green]ollama create {m.ref} done[/green] (it answers: {escape(result.ollama_reply or '')[:60]!r}); "
            f"`ollama run {m.ref}`"
        )
        return
    if result.modelfile is None and not result.commands:
        err.print("[yellow]no Modelfile was registered with this artifact[/yellow]")
    elif result.modelfile is not None:
        out.print(
            "an earlier version (Ollama keeps the current one under this name); to use it run:"
            if "@" in ref
            else "ollama is not on PATH; to use it with Ollama run:"
        )
    else:
        out.print("serve it with vLLM:")
    for argv in result.commands:
        out.print("  " + shlex.join(argv), highlight=False, soft_wrap=True)
    if m.serving is not None:
        out.print(
            f"serving plans for {', '.join(i.gpus for i in m.serving.inventories)} in {result.dest}/serve "
            f"(`modelmint show {m.ref} --plans`)",
            highlight=False,
            soft_wrap=True,
        )


@app.command()
def publish(
    ref: Annotated[str, typer.Argument(help="a registered name:tag, e.g. qwen2.5:q4_k_m")],
    registry: RegistryOption = None,
    insecure: InsecureOption = False,
    force: Annotated[bool, typer.Option("--force", help="move tags that point at another image")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print what was pushed as JSON")] = False,
) -> None:
    """Push a registered artifact to an OCI registry: a GGUF as an Ollama image (`ollama pull HOST/NAMESPACE/NAME:TAG`),
    a compressed-tensors checkpoint as a CNCF ModelPack artifact; tagged TAG-<source12> (the upstream commit it was
    built from) and TAG, blobs first."""
    import shlex

    from pipelines.publish.oci import RegistryRef
    from pipelines.registry.formats import format_of
    from pipelines.registry.images import publications_path, publish_image

    if registry is None:
        raise ConfigError(
            "publish needs a registry", hint=f"modelmint publish {ref} --registry HOST[:PORT]/NAMESPACE"
        )
    where = RegistryRef.parse(registry, insecure=insecure)
    settings = load_settings()
    done = publish_image(settings, ref, where, force=force)
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "ref": done.manifest.ref,
                    "images": done.images,
                    "digest": done.digest,
                    "uploaded": done.uploaded,
                    "present": done.present,
                    "mounted": done.mounted,
                    "retagged": done.retagged,
                    "tagged": done.tagged,
                }
            )
        )
        return
    m = done.manifest
    for old_tag, old in done.retagged.items():
        err.print(f"[yellow]moved {old_tag} from {old}[/yellow]", highlight=False)
    mounted = f", {len(done.mounted)} mounted from another repository" if done.mounted else ""
    out.print(
        f"{m.ref} → {', '.join(done.images)} ({done.digest}); {len(done.uploaded)} blob(s) uploaded, "
        f"{len(done.present)} already there{mounted}, {len(done.tagged)} tag(s) written",
        highlight=False,
        soft_wrap=True,
    )
    record = publications_path(settings, m.name, m.tag)
    out.print(
        f"recorded in {record} (`modelmint list` shows it; commit it with the registry)",
        highlight=False,
        soft_wrap=True,
    )
    out.print("pull it with:")
    out.print(
        "  " + shlex.join(format_of(m.tag).pull_command(done.images[-1], insecure)),
        highlight=False,
        soft_wrap=True,
    )


def _print_verified(v: Verified | None) -> None:
    """Who signed what was pulled (or why it was taken unsigned), beside the pull's own line."""
    if v is not None and v.signer is not None and v.signed_at is not None:
        out.print(f"signed by {v.signer} on {v.signed_at:%Y-%m-%d} (registry/trust.yaml)", highlight=False)
    for w in v.warnings if v is not None else ():
        err.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)


@app.command("verify")
def verify_cmd(
    refs: Annotated[
        list[str] | None, typer.Argument(help="name:tag … (default: every registered artifact)")
    ] = None,
    repair: Annotated[
        bool,
        typer.Option(
            help="upload what is missing or damaged again from this machine's DVC cache or workspace"
        ),
    ] = False,
    allow_unsigned: AllowUnsignedOption = False,
) -> None:
    """Check the DVC remote's copy of registered artifacts: every file hashed against its manifest, nothing
    pulled. Exits 1 listing each missing or damaged object (for a nightly job)."""
    from pipelines.registry.verify import verify_remote

    result = verify_remote(load_settings(), refs or None, repair=repair, allow_unsigned=allow_unsigned)
    if not (result.artifacts or result.invalid or result.removed_uploads):
        out.print(
            "nothing registered yet, so nothing to verify: `modelmint convert NAME --register` registers one"
        )
        return
    for p in result.removed_uploads:
        err.print(f"[dim]•[/dim] removed {p} (an upload a killed push left)", highlight=False)
    for a in result.artifacts:
        n = len(a.check.objects) if a.check is not None else 0
        for r in a.repaired:
            err.print(f"[dim]•[/dim] {a.ref}: uploaded again: {escape(r)}", highlight=False)
        if a.unchecked is not None:
            out.print(f"{a.ref}: [yellow]not checked[/yellow] (being registered)", highlight=False, soft_wrap=True)
            continue
        verdict = "[green]ok[/green]" if a.ok else f"[red]{len(a.problems)} problem(s)[/red]"
        out.print(
            f"{a.ref}: {verdict} ({n} objects in {a.check.url if a.check else 'the remote'} hashed)",
            highlight=False,
            soft_wrap=True,
        )
    error = result.error()
    if error is not None:
        raise error


@app.command("dvc-yaml")
def dvc_yaml(
    check: Annotated[
        bool, typer.Option("--check", help="only check that dvc.yaml matches the catalog")
    ] = False,
) -> None:
    """Generate dvc.yaml from the catalog (one stage per GGUF variant)."""
    from pipelines.registry import dvcgen
    from pipelines.source.catalog import load_catalog

    settings = load_settings()
    path = settings.repo_dir / "dvc.yaml"
    catalog = load_catalog(settings.catalog_path)
    if check:
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if current != dvcgen.render(catalog):
            raise ConfigError(
                f"{path} does not match {settings.catalog_path}", hint="run `modelmint dvc-yaml`"
            )
        out.print(f"{path} matches the catalog")
        return
    changed = dvcgen.write(catalog, path)
    out.print(f"{'wrote' if changed else 'unchanged:'} {path}")


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
