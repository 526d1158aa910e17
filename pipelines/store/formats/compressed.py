"""compressed-tensors (llmcompressor; for vLLM): built by pipelines/compressed/build.py, registered with a vLLM serve
config and a model card, published as a CNCF ModelPack artifact. Registers itself on import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.compressed.build import (
    CompressPlan,
    compressed_steps,
    finish_compressed,
    plan_compressed,
    served_name,
)
from pipelines.compressed.llmc import COMPRESSED_EVAL_CHUNKS, COMPRESSED_EVAL_CTX
from pipelines.core.errors import GateFailed
from pipelines.core.fsutil import hash_cache
from pipelines.core.report import CompressedReport, advice_for_report
from pipelines.core.resources import Places, ResourceCheck, compressed_run, source_shape
from pipelines.core.settings import Settings
from pipelines.core.steps import BuildResult, VariantOutcome, load_dir_receipt, load_report
from pipelines.core.toolchains import llmcompressor
from pipelines.publish.modelpack import modelpack_image
from pipelines.publish.oci import Blob, Image
from pipelines.publish.vllm import publish_vllm, serve_command
from pipelines.source.catalog import CatalogEntry
from pipelines.store.candidate import Candidate, ValidatedOutputChanged, report_sha256
from pipelines.store.formats.base import ArtifactFormat, implement
from pipelines.store.manifest import Manifest
from pipelines.store.names import NAMES


def _compressed_resources(plan: CompressPlan, places: Places) -> ResourceCheck:
    """A compressed-tensors run's peak disk and memory from the source's headers (pipelines/core/resources.py)."""
    shape = source_shape(plan.snapshot.path, hash_cache(plan.settings))
    return compressed_run(shape, list(plan.recipes), places, eval_ctx=COMPRESSED_EVAL_CTX,
                          eval_chunks=COMPRESSED_EVAL_CHUNKS, paths={v: plan.variant_dir(v) for v in plan.recipes})


def candidate_from_compressed(plan: CompressPlan, outcome: VariantOutcome) -> Candidate:
    """The registration candidate for one validated compressed-tensors variant of `plan`.

    Its parent is the source itself (recorded in `source`); the files are the whole checkpoint, weights first.

    Raises:
        GateFailed: the variant did not pass validation (it must not be registered).
        ValidatedOutputChanged: the checkpoint or its report changed or is gone since validation (rerun the build).
    """
    v = outcome.variant
    if not outcome.passed:
        raise GateFailed(
            v,
            outcome.failures,
            str(plan.report_path(v)),
            advice=advice_for_report(v, outcome.report, params=plan.params),
        )
    receipt = load_dir_receipt(outcome.path, plan.quant_key(v))
    report_path = plan.report_path(v)
    # The report as its file has it (what the manifest's report_sha256 names), not the verdict a serve check
    # changed in this run.
    report = load_report(report_path, outcome.report.key)
    judged = report.validation if report is not None else None
    if report is None or receipt is None or judged is None or receipt["tree_sha256"] != outcome.digest or not judged.passed:
        raise ValidatedOutputChanged(
            f"{outcome.path} or its report changed since it was validated", rerun="modelmint compress"
        )
    names = sorted(receipt["files"])
    weights = [n for n in names if n == "model.safetensors.index.json"] or [
        n for n in names if n.endswith(".safetensors")
    ]
    if not weights:
        raise ValidatedOutputChanged(
            f"{outcome.path} holds no safetensors weights", rerun="modelmint compress"
        )
    ordered = [weights[0], *(n for n in names if n != weights[0])]
    main = receipt["files"][weights[0]]
    return Candidate(
        entry=plan.entry.with_serve_gpus(plan.settings.serve_gpus),
        tag=v,
        files=tuple(outcome.path / n for n in ordered),
        sha256=main["sha256"],
        size_bytes=main["size"],
        source={k: val for k, val in plan.source.items() if k != "path"},
        parent=None,
        toolchain=plan.toolchain_versions(),
        recipe=plan.manifest_recipe(v),
        report=report,
        report_sha256=report_sha256(
            hash_cache(plan.settings), report_path, "modelmint compress"
        ),
        source_dir=plan.snapshot.path,
        root=outcome.path,
    )


def _compressed_publish(settings: Settings, c: Candidate, directory: Path) -> list[Path]:
    assert c.root is not None, "a compressed-tensors candidate names its checkpoint directory"
    return publish_vllm(c.root, directory, CompressedReport.read_as(c.report), c.entry, served_name(c.entry.name, c.tag))


def _compressed_offer(target: Path, manifest: Manifest, ollama: bool) -> dict[str, Any]:
    return {"commands": [serve_command(target)]}


def _compressed_image(directory: Path, manifest: Manifest, extra: tuple[Blob, ...]) -> Image:
    src = manifest.source
    descriptor = {
        "createdAt": manifest.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "name": manifest.name,
        "version": manifest.tag,
        "revision": src.revision,
        "sourceURL": f"https://huggingface.co/{src.repo}" if src.repo else None,
        "description": f"{manifest.ref}: {manifest.recipe.get('recipe', {}).get('scheme', manifest.tag)} "
        f"compressed-tensors checkpoint of {src.ref}, validated by modelmint",
    }
    return modelpack_image(directory, manifest.files, descriptor, quantization=manifest.tag, extra=extra)


def _modelmint_pull(image: str, insecure: bool) -> list[str]:
    where, _, tag = image.rpartition(":")
    registry, _, name = where.rpartition("/")
    return [
        "modelmint",
        "pull",
        f"{name}:{tag}",
        "--from-registry",
        registry,
        *(["--insecure"] if insecure else []),
    ]


def _compressed_served(directory: Path, _main: str, tag: str) -> tuple[Path, Path]:
    return directory, Path(tag)


def _compressed_plan(
    entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None, revision: str | None = None
) -> CompressPlan:
    return plan_compressed(entry, settings, revision=revision, schemes=variants)


def _compressed_header(result: BuildResult) -> list[str]:
    tc = result.plan.tc if isinstance(result.plan, CompressPlan) else None
    return [f"compressed-tensors with llmcompressor {tc.version} from the same source"] if tc else []


COMPRESSED = implement(
    ArtifactFormat(
        names=NAMES["compressed-tensors"],
        candidate=candidate_from_compressed,
        publish=_compressed_publish,
        served=_compressed_served,
        offer=_compressed_offer,
        image=_compressed_image,
        image_config="application/vnd.cncf.model.config.v1+json",
        pull_command=_modelmint_pull,
        plan=_compressed_plan,
        steps=compressed_steps,
        finish=finish_compressed,
        header=_compressed_header,
        toolchain=lambda settings: llmcompressor(settings).prefix,
        resources=_compressed_resources,
    )
)
