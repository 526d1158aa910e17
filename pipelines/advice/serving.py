"""Serving plans registered beside an artifact: the planner run on its placed bytes for each GPU inventory its catalog
entry names, the files that carry each plan under serve/<inventory>/, and their record serve/plans.json.

A single-group inventory's folder holds what `modelmint plan NAME:TAG --gpus INVENTORY --out DIR` writes, with that
group's folder merged into it (serve/1xl4-24g/vllm.yaml); a mixed one keeps one folder per GPU type inside it. A plan
that cannot fit, or an artifact the planner cannot size, is recorded with the planner's refusal and the nearest
plans that fit, and no file: serving plans never fail a registration.

A GGUF is planned for Ollama by llama.cpp's memory model alone, never by vLLM's planner (vLLM has no GGUF loader):
each GPU group of the inventory as `modelmint plan NAME:TAG --out` plans it (servefiles.plan_gguf_groups over
llamacpp_memory.plan_gguf: num_ctx, OLLAMA_NUM_PARALLEL, num_gpu, one Ollama per GPU or one over every GPU), its
ollama/Modelfile and ollama/start.sh written by the same function (servefiles.ollama_files), byte for byte; the record
keeps each group's plan in the inventory's `gguf` list and no vLLM sizing. A group llama.cpp's model cannot hold
gets no file and a note; an inventory none of whose groups it holds is recorded as refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.advice.recommend import file_layers
from pipelines.core.errors import ArtifactError, ConfigError
from pipelines.core.fsutil import write_text_atomic
from pipelines.core.gpus import cluster_label, parse_cluster
from pipelines.core.settings import Settings
from pipelines.publish import planner
from pipelines.publish.llamacpp_memory import GgufPlan, LayeredWeights, gguf_num_ctx
from pipelines.publish.servefiles import (
    Artifact,
    artifact_of,
    notes,
    ollama_files,
    plan_files,
    plan_gguf_groups,
    slug,
    write_files,
)
from pipelines.source.catalog import ServeSpec
from pipelines.store.formats.base import implementation
from pipelines.store.manifest import (
    PLANS_FILE,
    SERVE_DIR,
    GgufServePlan,
    GPUTotals,
    InventoryPlans,
    Manifest,
    PlanSummary,
    Serving,
    find_manifest,
    list_manifests,
)

if TYPE_CHECKING:
    from pipelines.store.candidate import Candidate



def write_serving(c: Candidate, directory: Path) -> Serving:
    """Plan `c`, placed in `directory`, for every inventory of its entry's serve spec; write each plan's files
    under directory/serve/ and the record serve/plans.json (the manifest's `serving` block). Refusals are recorded,
    never raised."""
    spec = c.entry.serve
    sized, named = implementation(c.format).served(directory, c.placed_as(c.files[0]), c.tag)
    try:
        what: planner.Served | None = planner.served(sized)
        cannot = None
    except (ConfigError, ArtifactError) as err:
        what, cannot = None, err
    # named as `modelmint plan NAME:TAG` names a registered artifact, so both write the same files
    art = artifact_of(
        named,
        what.weights_bytes if what else 0,
        name=f"{c.entry.name}-{c.tag}",
        ollama_model=c.ref,
    )
    weights: LayeredWeights | None = None
    said: list[str] = []
    if art.gguf and what is not None:  # as `modelmint plan NAME:TAG` reads the registered file (recommend.gguf_layers)
        weights, said = file_layers(sized, what.shape, what.weights_bytes, c.placed_as(c.files[0]))
        said += _vllm_options_unused(spec)
    inventories = []
    for gpus in spec.gpus:
        if what is None:
            assert cannot is not None
            inventories.append(
                InventoryPlans(
                    gpus=gpus,
                    dir=f"{SERVE_DIR}/{slug(gpus)}",
                    refused=cannot.message,
                    nearest=[cannot.hint or "serve a transformer model the planner sizes"],
                )
            )
        elif weights is not None:
            inventories.append(_gguf_inventory(spec, gpus, what, art, directory, weights, said))
        else:
            inventories.append(_inventory(spec, gpus, what, art, directory))
    serving = Serving(
        context=spec.context,
        concurrency=spec.concurrency,
        kv_cache_dtype=spec.kv_cache_dtype,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        inventories=inventories,
    )
    write_text_atomic(directory / PLANS_FILE, serving.model_dump_json(indent=2) + "\n")
    return serving


def _inventory(spec: ServeSpec, gpus: str, what: planner.Served, art: Artifact, directory: Path) -> InventoryPlans:
    """One inventory's vLLM plans and files (written under directory/serve/<inventory>/), or the planner's
    refusal."""
    groups = parse_cluster(gpus)  # checked when the catalog loaded
    rel = f"{SERVE_DIR}/{slug(cluster_label(groups))}"
    ask = planner.Ask(
        what.weights_bytes,
        what.shape,
        context=spec.context,
        concurrency=spec.concurrency,
        kv_dtype=spec.kv_cache_dtype,
        utilization=spec.gpu_memory_utilization,
        fp8_weights=what.fp8_weights,
    )
    try:
        plans = planner.plan(ask, groups, pp_across_types=spec.pp_across_types and len(groups) > 1)
    except planner.PlanRefused as err:
        return InventoryPlans(gpus=gpus, dir=rel, refused=err.message, nearest=err.nearest)
    except ConfigError as err:  # a context past the model's, stages past its layers: the hint says what fits
        return InventoryPlans(
            gpus=gpus, dir=rel, refused=err.message, nearest=[err.hint or "change serve in the catalog"]
        )
    files = plan_files(plans, art)
    if len(plans) == 1:  # one group: its folder is the inventory's
        own = f"{slug(plans[0].label)}/"
        files = {k.removeprefix(own): v for k, v in files.items()}
    written = write_files(files, directory / rel, for_out=False)
    return InventoryPlans(
        gpus=gpus,
        dir=rel,
        plans=[summary(p) for p in plans],
        files=sorted(p.relative_to(directory).as_posix() for p in written),
        notes=notes(plans, art),
    )


def _vllm_options_unused(spec: ServeSpec) -> list[str]:
    """A note naming the catalog's vLLM serve options a GGUF's plan leaves unused (Ollama serves it, by llama.cpp's
    memory model), so a catalog that sets them learns they changed nothing; none where none is set."""
    given = [f"serve.{k} {v}" for k, v, default in (
        ("kv_cache_dtype", spec.kv_cache_dtype, "auto"),
        ("gpu_memory_utilization", f"{spec.gpu_memory_utilization:g}", "0.9"),
        ("pp_across_types", str(spec.pp_across_types).lower(), "false"),
    ) if v != default]
    if not given:
        return []
    return [f"{', '.join(given)}: vLLM's options, not applied to a GGUF: Ollama serves it and llama.cpp's memory "
            "model plans it (its KV cache is f16, in the layers num_gpu offloads)"]


def _gguf_inventory(
    spec: ServeSpec, gpus: str, what: planner.Served, art: Artifact, directory: Path, weights: LayeredWeights,
    said: list[str],
) -> InventoryPlans:
    """A GGUF's plan of one inventory as `modelmint plan NAME:TAG --gpus INVENTORY --out` makes it: each GPU group
    planned by llama.cpp's memory model at the entry's context (else Ollama's default) and concurrency
    (plan_gguf_groups), its Ollama files (ollama_files) written under directory/serve/<inventory>/; a group that
    model cannot hold gets no file and a note, an inventory with no group it holds is recorded as refused. `said`:
    how the weights were read (a GGUF sized from its header says so)."""
    groups = parse_cluster(gpus)  # checked when the catalog loaded
    rel = f"{SERVE_DIR}/{slug(cluster_label(groups))}"
    top = what.shape.max_context
    if spec.context is not None and spec.context > top:  # as `modelmint plan --context` refuses it
        return InventoryPlans(
            gpus=gpus, dir=rel,
            refused=f"a context of {spec.context} tokens is longer than {what.shape.architecture} supports ({top})",
            nearest=[f"serve.context {top} or less in the catalog"],
        )
    planned, refused = plan_gguf_groups([(str(g), g) for g in groups], weights, gguf_num_ctx(spec.context, top),
                                        spec.concurrency)
    if not planned:
        label, first = refused[0]
        return InventoryPlans(gpus=gpus, dir=rel, refused=f"{label}: {first.message}",
                              nearest=[n for _, e in refused for n in e.nearest])
    files = ollama_files(planned, art)
    if len(groups) == 1:  # one group: its folder is the inventory's
        own = f"{slug(planned[0][0])}/"
        files = {k.removeprefix(own): v for k, v in files.items()}
    written = write_files(files, directory / rel, for_out=False)
    return InventoryPlans(
        gpus=gpus,
        dir=rel,
        files=sorted(p.relative_to(directory).as_posix() for p in written),
        notes=[*notes([], art), *said,
               *(f"no Ollama files for {label}: {e.message}; nearest: {', '.join(e.nearest)}" for label, e in refused)],
        gguf=[_record(label, g) for label, g in planned],
    )


def _record(label: str, g: GgufPlan) -> GgufServePlan:
    """What the manifest says of one group's llama.cpp plan."""
    return GgufServePlan(
        engine=g.engine, gpus=label, num_ctx=g.num_ctx, parallel=g.parallel, n_gpu_layers=g.n_gpu_layers,
        n_layers=g.n_layers, instances=g.instances, spread=g.spread, partial=g.partial, warnings=list(g.warnings),
        gpu_budget=g.gpu_budget, weights_gpu=g.memory.weights_gpu, kv_gpu=g.memory.kv_gpu, host_bytes=g.host_bytes,
    )


def summary(p: planner.Plan) -> PlanSummary:
    """What the manifest says of a plan: its layout, what vLLM is told, and every GPU's budget."""
    per_gpu = [GPUTotals(gpu=n, headroom=m.headroom, **dataclasses.asdict(m)) for n, m in p.per_gpu]
    return PlanSummary(
        gpus=p.label,
        layout=f"TP {p.tp} x PP {p.pp}, {p.replicas} replica(s)",
        tp=p.tp,
        pp=p.pp,
        replicas=p.replicas,
        max_model_len=p.max_model_len,
        max_num_seqs=p.max_num_seqs,
        kv_bytes_per_token=p.kv_bytes_per_token,
        layer_partition=list(p.layer_partition),
        per_gpu=per_gpu,
        warnings=list(p.warnings),
    )


@dataclass(frozen=True)
class PlanTarget:
    """A registered artifact as `modelmint plan NAME:TAG` plans it: its placed bytes in this checkout, the names its
    files carry (as the registration's own plans name it), and the model's other registered variants."""

    path: Path
    name: str
    ollama_model: str
    smaller: tuple[planner.Variant, ...]
    recorded: planner.Served | None = None
    """Its bytes are not in this checkout: the model as its manifest recorded it at registration, to plan from."""
    manifest: Manifest | None = None


def plan_target(settings: Settings, ref: str) -> PlanTarget:
    """Resolve a registered name:tag for planning: the main GGUF file or the checkpoint directory, and each other
    variant of the same model with its whole weight bytes (every shard), FP8 by its recipe's scheme.

    Raises:
        RegistryError: `ref` is malformed or names nothing registered (find_manifest).
        ConfigError: it is registered but its bytes are not in this checkout and its manifest, registered before
            the model's shape was recorded, holds no shape (`modelmint pull` places them).
    """
    m = find_manifest(settings, ref)
    path = settings.repo_dir / m.dvc.path
    path, _named = implementation(m.format).served(path, m.file, m.tag)

    def fp8(o: Manifest) -> bool:
        return str((o.recipe.get("recipe") or {}).get("scheme") or "").startswith("FP8")

    recorded = None
    if not path.exists():
        if m.shape is None:
            raise ConfigError(f"{ref} is registered but not in this checkout ({path}), and its manifest was "
                              "registered before modelmint recorded the model's shape in it",
                              hint=f"modelmint pull {ref}")
        recorded = planner.Served(path, m.weights_bytes, m.shape.model_shape(), fp8(m))
    # a refusal suggests a smaller variant the same engine serves: vLLM has no GGUF loader, and a GGUF's plan is
    # llama.cpp's (cli/_plangguf.py)
    smaller = tuple(planner.Variant(o.ref, o.weights_bytes, fp8(o)) for o in list_manifests(settings).manifests
                    if o.name == m.name and o.tag != m.tag and o.format == m.format)
    return PlanTarget(path, f"{m.name}-{m.tag}", m.ref, smaller, recorded, m)
