"""The registry as it stands: list, show (its history, provenance and serving plans) and reproduce."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Column, Table

from pipelines.cli._app import (
    app,
    err,
    escape,
    load_settings,
    mib,
    out,
)
from pipelines.cli._tables import publication
from pipelines.core.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.store.manifest import Manifest

@app.command("list")
def list_cmd() -> None:
    """List the registered artifacts (registry/manifests)."""
    from pipelines.core.errors import RegistryError
    from pipelines.store.manifest import list_manifests
    from pipelines.store.published import publications

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
    from pipelines.store.manifest import find_manifest

    settings = load_settings()
    if plans:
        _print_serving(find_manifest(settings, ref))
        return
    if provenance:
        _print_provenance(ref)
        return
    if not history:
        from pipelines.store.published import publications

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
    from pipelines.store.history import history as versions_of

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
    """The provenance on stdout (JSON, as signed: its signature and agreement with the manifest checked first);
    each reproduced-by attestation on stderr, for people."""
    from pipelines.registry import reproduce
    from pipelines.store.manifest import find_manifest
    from pipelines.trust.policy import load_policy

    settings = load_settings()
    manifest = find_manifest(settings, ref)
    stmt = reproduce.verified_provenance(settings, manifest)
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
    from pipelines.registry.reproduce import rebuild_and_attest
    from pipelines.trust import signing

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
    if any(inv.gguf for inv in s.inventories):
        _print_gguf_serving(m)
        return
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
    _print_files_and_notes(m)


def _print_gguf_serving(m: Manifest) -> None:
    """A GGUF's serving plans, llama.cpp's as Ollama serves it (vLLM has no GGUF loader): per inventory and GPU
    group, the Modelfile's num_ctx and num_gpu, OLLAMA_NUM_PARALLEL, the servers and one server's GPU memory."""
    from pipelines.publish.llamacpp_memory import size_text

    assert m.serving is not None
    s = m.serving
    table = Table(
        "inventory", "plan", "Ollama", Column("num_ctx", justify="right"),
        Column("OLLAMA_NUM_PARALLEL", justify="right"), "per server: GPU weights / KV cache / offered",
        title=f"{m.ref}: context {s.context or 'Ollama default'}, concurrency {s.concurrency}, llama.cpp's memory "
        "model (vLLM's kv_cache_dtype and gpu_memory_utilization do not apply to a GGUF)",
    )
    for inv in s.inventories:
        if inv.refused is not None:
            table.add_row(inv.gpus, "[red]refused[/red]", escape(inv.refused), "-", "-",
                          "nearest: " + escape("; ".join(inv.nearest)))
        for g in inv.gguf or []:
            servers = f"{g.instances} servers, one per GPU" if g.instances > 1 else "one server"
            mem = ("-" if g.weights_gpu is None or g.kv_gpu is None or g.gpu_budget is None
                   else "CPU only" if not g.gpu_budget
                   else f"{size_text(g.weights_gpu)} / {size_text(g.kv_gpu)} / {size_text(g.gpu_budget)}")
            table.add_row(inv.gpus, g.gpus, f"num_gpu {g.n_gpu_layers} of {g.n_layers} layers, {servers}",
                          str(g.num_ctx), str(g.parallel), mem)
    out.print(table)
    _print_files_and_notes(m)


def _print_files_and_notes(m: Manifest) -> None:
    assert m.serving is not None
    for inv in m.serving.inventories:
        if inv.files:
            out.print(f"{inv.gpus}: {len(inv.files)} file(s) in {m.dvc.path}/{inv.dir}", highlight=False)
        for note in inv.notes:
            err.print(f"[yellow]note:[/yellow] {inv.gpus}: {escape(note)}", highlight=False)
