"""plan for a GGUF: llama.cpp's plan per GPU group as Ollama serves it (the one registration and recommend use),
printed as a table or JSON, and the Ollama files --out writes from it; vLLM's options refused for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Column, Table

from pipelines.cli._app import err, escape, load_settings, out
from pipelines.core.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.advice.serving import PlanTarget
    from pipelines.publish import planner
    from pipelines.publish.llamacpp_memory import GgufPlan, LayeredWeights
    from pipelines.store.manifest import Manifest


def print_written(written: list[Path], out_dir: Path | None) -> None:
    if out_dir is not None:
        out.print(f"wrote {len(written)} files under {out_dir}:", highlight=False)
        for f in written:
            out.print(f"  {f.relative_to(out_dir)}", highlight=False)


def refuse_vllm_options(*, kv_cache_dtype: str, utilization: float, tp: int | None, batched: int | None,
               pp_across_types: bool) -> None:
    """Refuses vLLM's options for a GGUF: Ollama (llama.cpp) serves it, and vLLM cannot load it.

    Raises:
        ConfigError: naming the options given.
    """
    given = [name for name, asked in (
        (f"--kv-cache-dtype {kv_cache_dtype}", kv_cache_dtype != "auto"),
        (f"--gpu-memory-utilization {utilization:g}", utilization != 0.90),
        (f"--tensor-parallel-size {tp}", tp is not None),
        (f"--max-num-batched-tokens {batched}", batched is not None),
        ("--pp-across-types", pp_across_types),
    ) if asked]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: vLLM's options, and a GGUF is planned for Ollama (llama.cpp's memory model): "
            "vLLM has no GGUF loader",
            hint="leave them out to plan the GGUF for Ollama, or plan its compressed-tensors variant "
            "(`modelmint list` names them) for vLLM",
        )


def plan_gguf(
    path: Path, what: planner.Served, gpus: str, context: int | None, concurrency: int,
    registered: PlanTarget | None, named: dict[str, str], as_json: bool, out_dir: Path | None,
) -> None:
    """A GGUF's plan per GPU group as Ollama serves it (servefiles.plan_gguf_groups: llama.cpp's memory model, as
    recommend and registration plan it), printed as a table or JSON; --out writes its Ollama files from it.

    Raises:
        ConfigError: a context past the model's; PlanRefused where no group holds the model.
    """
    from pipelines.publish import planner
    from pipelines.publish.llamacpp_memory import gguf_num_ctx
    from pipelines.publish.servefiles import artifact_of, notes, ollama_files, plan_gguf_groups, write_files

    top = what.shape.max_context
    if context is not None and context < 1:
        raise ConfigError(f"--context {context} is no context: a sequence holds at least one token",
                          hint="omit --context for Ollama's default, or give a positive number of tokens")
    if context is not None and context > top:
        raise ConfigError(
            f"a context of {context} tokens is longer than {what.shape.architecture} supports ({top})",
            hint=f"ask for --context {top} or less",
        )
    weights, said = _gguf_weights(path, registered.manifest if registered else None, what)
    groups = planner.cluster_of(gpus)
    planned, refused = plan_gguf_groups([(str(g), g) for g in groups], weights, gguf_num_ctx(context, top),
                                        concurrency)
    if not planned:
        label, first = refused[0]
        raise planner.PlanRefused(f"{label}: {first.message}", [n for _, e in refused for n in e.nearest])
    said += [f"{label} serves nothing, its GPUs stay idle: {e.message} (nearest: {', '.join(e.nearest)})"
             for label, e in refused]
    written: list[Path] = []
    if out_dir is not None:
        art = artifact_of(path, what.weights_bytes, **named)
        written = write_files(ollama_files(planned, art), out_dir)
        said = [*notes([], art), *said]
    for line in said:
        err.print(f"[yellow]note:[/yellow] {escape(line)}", highlight=False)
    if as_json:
        out.print_json(json.dumps([{"group": label, **g.to_dict()} for label, g in planned]))
        return
    _print_gguf_plans(planned)
    print_written(written, out_dir)


def _gguf_weights(
    path: Path, manifest: Manifest | None, what: planner.Served
) -> tuple[LayeredWeights, list[str]]:
    """A GGUF's layers as llama.cpp places them, as recommend reads them: a registered one's from the file in this
    checkout, else as its manifest recorded them; a file's from its tensors; where they cannot be read by layer, its
    bytes spread evenly over its layers, with a note.

    Raises:
        ArtifactError: a registered GGUF neither pulled nor recorded per layer.
    """
    from pipelines.advice.recommend import file_layers, gguf_layers

    if manifest is not None:
        return gguf_layers(load_settings(), manifest, what.shape)
    return file_layers(path, what.shape, what.weights_bytes)


def _print_gguf_plans(planned: list[tuple[str, GgufPlan]]) -> None:
    """Each group's llama.cpp plan for Ollama: the Modelfile's num_ctx and num_gpu, OLLAMA_NUM_PARALLEL, the servers,
    one server's llama.cpp buffers (weights, KV cache, compute, output) and what of them the GPU holds, and its
    warnings."""
    from pipelines.publish.llamacpp_memory import size_text

    for label, g in planned:
        where = ("CPU only (num_gpu 0)" if g.kind == "cpu"
                 else f"num_gpu {g.n_gpu_layers} of {g.n_layers} layers"
                 + (" (full offload)" if not g.partial else f" (partial offload: {g.cpu_weight_share:.0%} of the "
                    "weights on the CPU)"))
        servers = (f"{g.instances} Ollama servers, one per GPU" if g.instances > 1
                   else f"one Ollama over {g.gpus} GPUs (OLLAMA_SCHED_SPREAD)" if g.spread
                   else "one Ollama server")
        out.print(
            f"[bold]{label}[/bold]: engine {g.engine} (llama.cpp); num_ctx {g.num_ctx}, OLLAMA_NUM_PARALLEL "
            f"{g.parallel}, {where}; {servers}",
            highlight=False,
        )
        table = Table("per server", *(Column(c, justify="right")
                                      for c in ("weights", "KV cache", "compute", "output", "total")))
        m = g.memory
        table.add_row("all", *(size_text(x) for x in (m.weights, m.kv, m.compute, m.output, m.total)))
        if g.kind != "cpu":
            table.add_row("on the GPU", size_text(m.weights_gpu), size_text(m.kv_gpu), "", "", "")
        out.print(table)
        budget = f"; {size_text(g.gpu_budget)} of GPU memory per server" if g.gpu_budget else ""
        out.print(f"  • {g.summary()}{budget}; {size_text(g.host_bytes)} of system memory", highlight=False)
        for w in g.warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)
