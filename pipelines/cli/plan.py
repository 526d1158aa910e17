"""plan: how to serve a model on the GPUs you have, and the files that carry the plan."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Column, Table

from pipelines.cli._app import app, err, escape, load_settings, out
from pipelines.cli._plangguf import plan_gguf, print_written, refuse_vllm_options
from pipelines.core.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.advice.serving import PlanTarget
    from pipelines.publish import planner
    from pipelines.publish.planner import Plan


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    target: Annotated[
        str | None, typer.Argument(help="a registered name:tag (pulled), a .gguf, or a checkpoint directory")
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="the GPUs: 4xRTX4090-24G, 2x8xH100-80G (nodes x GPUs), "
            "1x8xA800-80G+1x8xL20-48G (mixed), or an inventory .yaml"
        ),
    ] = None,
    context: Annotated[
        int | None, typer.Option(help="tokens per sequence (default: the model's maximum)")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="sequences served at once")] = 1,
    kv_cache_dtype: Annotated[str, typer.Option(help="auto (the model's), fp8")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print the plans as JSON")] = False,
    list_gpus: Annotated[bool, typer.Option("--list-gpus", help="list the known GPU profiles")] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="write the files that carry the plan here: vllm.yaml, "
            "Kubernetes, LeaderWorkerSet, RayService, Helm values, docker "
            "run, Ollama",
        ),
    ] = None,
    pp_across_types: Annotated[
        bool,
        typer.Option(
            "--pp-across-types",
            help="a mixed cluster: one pipeline over "
            "every node, stages sized by memory, "
            "instead of instances per type",
        ),
    ] = False,
    gpu_memory_utilization: Annotated[
        float,
        typer.Option(
            "--gpu-memory-utilization",
            help="vLLM's: the share of each GPU's memory (as CUDA reports it) the instance "
            "may use, above 0 and at most 1",
        ),
    ] = 0.90,
    tensor_parallel_size: Annotated[
        int | None,
        typer.Option(
            "--tensor-parallel-size",
            help="vLLM's: GPUs per replica (per pipeline stage); default: the smallest that fits",
        ),
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-num-batched-tokens",
            help="vLLM's: tokens per scheduler step, the batch its profile run sizes the "
            "activations with; default: vLLM's (8192 on 70 GiB GPUs other than "
            "A100s, else 2048)",
        ),
    ] = None,
) -> None:
    """Plan how to serve a model on the GPUs you have: tensor / pipeline parallel, replicas, per-GPU memory,
    max_model_len and max_num_seqs, with one line of reasoning per choice; --out writes the files that carry it."""
    from pipelines.publish import planner

    if list_gpus:
        _print_gpus()
        return
    if target is None and gpus is None:
        out.print(ctx.get_help(), highlight=False)  # nothing asked: how to ask
        return
    if target is None or gpus is None:
        raise ConfigError(
            "plan needs what to serve and the GPUs",
            hint="modelmint plan NAME:TAG --gpus 4xRTX4090-24G (`modelmint plan --list-gpus` lists them)",
        )
    planner.require_kv_dtype(kv_cache_dtype)
    path, named = Path(target), {}
    smaller: tuple[planner.Variant, ...] = ()
    recorded: planner.Served | None = None
    registered: PlanTarget | None = None
    if not path.exists() and ":" in target:  # a registered name:tag
        from pipelines.advice.serving import plan_target

        registered = plan_target(load_settings(), target)
        path, smaller = registered.path, registered.smaller
        named = {"name": registered.name, "ollama_model": registered.ollama_model}
        recorded = registered.recorded  # not pulled: the shape its manifest recorded
    what = recorded if recorded is not None else planner.served_checked(path)
    if path.suffix == ".gguf":  # llama.cpp's plan for Ollama: what recommend, registration and --out say
        refuse_vllm_options(kv_cache_dtype=kv_cache_dtype, utilization=gpu_memory_utilization, tp=tensor_parallel_size,
                   batched=max_num_batched_tokens, pp_across_types=pp_across_types)
        plan_gguf(path, what, gpus, context, concurrency, registered, named, as_json, out_dir)
        return
    plans = planner.plan_served(
        what,
        gpus,
        context=context,
        concurrency=concurrency,
        kv_dtype=kv_cache_dtype,
        smaller=smaller,
        utilization=gpu_memory_utilization,
        tp=tensor_parallel_size,
        max_num_batched_tokens=max_num_batched_tokens,
        pp_across_types=pp_across_types,
    )
    written: list[Path] = []
    if out_dir is not None:
        from pipelines.publish.servefiles import artifact_of, notes, write_plan_files

        art = artifact_of(path, what.weights_bytes, **named)
        written = write_plan_files(plans, art, out_dir)
        for line in notes(plans, art):
            err.print(f"[yellow]note:[/yellow] {escape(line)}", highlight=False)
    if as_json:
        out.print_json(
            json.dumps([{**dataclasses.asdict(p), "group": str(p.group)} for p in plans], default=str)
        )
        return
    _print_plans(plans)
    print_written(written, out_dir)


def _print_gpus() -> None:
    from pipelines.publish import planner

    table = Table(
        "GPU",
        Column("GiB", justify="right"),
        Column("GB/s", justify="right"),
        "compute",
        "FP8",
        "interconnect",
        "node label",
    )
    for g in planner.known_gpus().values():
        table.add_row(
            g.name,
            f"{g.memory_gib:g}",
            f"{g.bandwidth_gbs:g}",
            g.compute_capability,
            "yes" if g.fp8_compute else "no",
            g.interconnect,
            g.node_label,
        )
    out.print(table)


def _print_plans(plans: list[Plan]) -> None:
    """Each plan's layout, its per-GPU memory table (one row per pipeline stage of its own type) and its reasons."""
    gib = 1 << 30
    for p in plans:
        out.print(
            f"[bold]{p.label}[/bold]: TP {p.tp} × PP {p.pp}, {p.replicas} replica(s); max_model_len "
            f"{p.max_model_len}, max_num_seqs {p.max_num_seqs}, KV {p.kv_bytes_per_token:,} B per token per GPU",
            highlight=False,
        )
        table = Table(
            "per GPU",
            *(
                Column(c, justify="right")
                for c in ("total", "usable", "weights", "activations", "KV pool", "headroom")
            ),
        )
        for name, mm in p.per_gpu:
            table.add_row(
                name,
                *(
                    f"{x / gib:.1f} GiB"
                    for x in (mm.total, mm.usable, mm.weights, mm.activations, mm.kv_pool, mm.headroom)
                ),
            )
        out.print(table)
        for r in p.reasons:
            out.print(f"  • {r}", highlight=False)
        for w in p.warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)
