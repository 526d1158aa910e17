"""Registered artifacts and their remotes: pull, publish, verify, and the dvc.yaml that registers them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipelines.cli._app import (
    InsecureOption,
    RegistryOption,
    app,
    err,
    escape,
    load_settings,
    mib,
    out,
)
from pipelines.core.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.trust.signing import Verified

AllowUnsignedOption = Annotated[
    bool,
    typer.Option(
        "--allow-unsigned",
        help="take an artifact without a signature the trust policy refuses (a warning says so)",
    ),
]

RequireSignatureOption = Annotated[
    bool,
    typer.Option(
        "--require-signature",
        help="refuse an unsigned artifact whatever the trust policy or --allow-unsigned say (for CI)",
    ),
]


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
    require_signature: RequireSignatureOption = False,
) -> None:
    """Fetch a registered artifact from the DVC remote (or an OCI registry), check its sha256 and its signature
    (registry/trust.yaml), and hand it to Ollama (GGUF) or print its `vllm serve` command (compressed-tensors)."""
    import shlex

    from pipelines.registry.pull import pull as pull_artifact

    if from_registry is not None:
        from pipelines.oci.images import pull_image
        from pipelines.publish.oci import RegistryRef
        from pipelines.store.manifest import parse_ref

        name, tag = parse_ref(ref)
        image = RegistryRef.parse(from_registry, insecure=insecure).image(name, tag)
        result = pull_image(
            load_settings(), image, insecure=insecure, dest=dest, ollama=ollama, allow_unsigned=allow_unsigned,
            require_signature=require_signature,
        )
        origin = f" from {image}"
    else:
        result = pull_artifact(load_settings(), ref, dest=dest, ollama=ollama, allow_unsigned=allow_unsigned,
                               require_signature=require_signature)
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
    require_signature: RequireSignatureOption = False,
) -> None:
    """Push a registered artifact to an OCI registry: a GGUF as an Ollama image (`ollama pull HOST/NAMESPACE/NAME:TAG`),
    a compressed-tensors checkpoint as a CNCF ModelPack artifact; tagged TAG-<source12> (the upstream commit it was
    built from) and TAG, blobs first."""
    import shlex

    from pipelines.oci.images import publish_image
    from pipelines.publish.oci import RegistryRef
    from pipelines.store.formats import format_of
    from pipelines.store.published import publications_path

    if registry is None:
        raise ConfigError(
            "publish needs a registry", hint=f"modelmint publish {ref} --registry HOST[:PORT]/NAMESPACE"
        )
    where = RegistryRef.parse(registry, insecure=insecure)
    settings = load_settings()
    done = publish_image(settings, ref, where, force=force, require_signature=require_signature)
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
        if v.timestamped_at is not None:
            out.print(f"timestamped by {v.timestamp_authority} at {v.timestamped_at:%Y-%m-%d %H:%M:%S}Z (RFC 3161)",
                      highlight=False)
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
    from pipelines.source.catalog import load_catalog
    from pipelines.store import dvcgen

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
