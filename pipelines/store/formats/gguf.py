"""GGUF (llama.cpp; for Ollama and llama.cpp): built by pipelines/gguf/build.py, registered with a Modelfile and a
model card, published as an Ollama image. Registers itself on import."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pipelines.core.errors import ArtifactError, GateFailed
from pipelines.core.fsutil import hash_cache
from pipelines.core.report import GGUFReport, advice_for_report
from pipelines.core.resources import KLReference, Places, ResourceCheck, gguf_run, source_shape
from pipelines.core.settings import Settings
from pipelines.core.steps import BuildResult, VariantOutcome, kept_or_dropped_receipt
from pipelines.core.toolchains import llama_cpp
from pipelines.gguf.build import GGUF_EVAL_CHUNKS, GGUF_EVAL_CTX, GGUFPlan, finish_gguf, gguf_steps, plan_gguf
from pipelines.publish.oci import MODELMINT_FILE, TITLE, Blob, Image
from pipelines.publish.ollama import install_into_ollama, ollama_commands, publish_ollama
from pipelines.publish.ollama_image import ollama_image
from pipelines.source.catalog import CatalogEntry
from pipelines.store.candidate import Candidate, ValidatedOutputChanged, report_sha256
from pipelines.store.formats.base import ArtifactFormat, implement
from pipelines.store.manifest import Manifest, ParentRef
from pipelines.store.names import NAMES


def candidate_from_gguf(plan: GGUFPlan, outcome: VariantOutcome) -> Candidate:
    """The registration candidate for one validated GGUF variant of `plan`.

    Raises:
        GateFailed: the variant did not pass validation (it must not be registered).
        ValidatedOutputChanged: the f16 base or the report is gone (rerun the build).
    """
    if not outcome.passed:
        raise GateFailed(
            outcome.variant,
            outcome.failures,
            str(plan.report_path(outcome.variant)),
            advice=advice_for_report(outcome.variant, outcome.report, imatrix=plan.spec.imatrix),
        )
    base = kept_or_dropped_receipt(plan.base_path, plan.base_key)  # removed as scratch: its receipt says what it was
    if base is None:
        raise ValidatedOutputChanged(
            f"{plan.base_path} is gone or changed since {outcome.variant} was made from it",
            rerun="modelmint convert",
        )
    files = tuple(outcome.shards) or (outcome.path,)
    hashes = hash_cache(plan.settings)
    main_sha = outcome.digest if files[0] == outcome.path else hashes.sha256(files[0])
    return Candidate(
        entry=plan.entry.with_serve_gpus(plan.settings.serve_gpus),
        tag=outcome.variant,
        files=files,
        sha256=main_sha,
        size_bytes=files[0].stat().st_size,
        source={k: v for k, v in plan.source.items() if k != "path"},
        parent=ParentRef(
            artifact=f"{plan.entry.name}:{plan.spec.outtype}",
            file=plan.base_path.name,
            sha256=base["sha256"],
            size=base["size"],
        ),
        toolchain=plan.toolchain_versions(),
        recipe=plan.manifest_recipe(outcome.variant),
        report=outcome.report,
        report_sha256=report_sha256(hashes, plan.report_path(outcome.variant), "modelmint convert"),
        source_dir=plan.snapshot.path,
    )


def _gguf_publish(settings: Settings, c: Candidate, directory: Path) -> list[Path]:
    gguf = directory / c.files[0].name
    return publish_ollama(gguf, c.source_dir, GGUFReport.read_as(c.report), c.entry, directory, settings=settings).paths


def _gguf_offer(target: Path, manifest: Manifest, ollama: bool) -> dict[str, Any]:
    modelfile = target / "Modelfile"
    if not modelfile.is_file():
        return {}
    if ollama and shutil.which("ollama"):
        installed = install_into_ollama(modelfile, manifest.ref)
        return {"commands": installed.commands, "ran_ollama": installed.ran, "ollama_reply": installed.reply}
    return {"commands": ollama_commands(modelfile, manifest.ref)}


def _gguf_image(directory: Path, manifest: Manifest, extra: tuple[Blob, ...]) -> Image:
    ggufs = [f.path for f in manifest.files if f.path.endswith(".gguf")]
    if len(ggufs) != 1:
        raise ArtifactError(
            f"{manifest.ref} is split into {len(ggufs)} GGUF files; an Ollama image holds one",
            hint="register it without split_max_size in the catalog to publish it for `ollama pull`",
        )
    files = tuple(
        Blob.of_file(MODELMINT_FILE, directory / f.path, f.sha256, f.size, {TITLE: f.path})
        for f in manifest.files
        if f.path != manifest.file
    )
    return ollama_image(
        directory / manifest.file, manifest.sha256, directory / "Modelfile", extra=(*files, *extra)
    )


def _gguf_served(directory: Path, main: str, _tag: str) -> tuple[Path, Path]:
    return directory / main, Path(Path(main).name)


def _gguf_plan(
    entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None, revision: str | None = None
) -> GGUFPlan:
    return plan_gguf(entry, settings, revision=revision, quants=variants)


def _gguf_resources(plan: GGUFPlan, places: Places) -> ResourceCheck:
    """A GGUF run's peak disk and memory from the source's headers (pipelines/core/resources.py); outputs an earlier
    run finished need nothing more."""
    paths = {"f16": plan.base_path, "logits": plan.logits_path, **{q: plan.quant_path(q) for q in plan.spec.quants}}
    if plan.imatrix_path is not None:
        paths["imatrix"] = plan.imatrix_path
    shape = source_shape(plan.snapshot.path, hash_cache(plan.settings))
    # a registering run removes the f16 and the logits once every variant passed, before its first registration
    # (register.drop_scratch), unless MODELMINT_KEEP_SCRATCH; a run that only builds keeps them
    keep = plan.settings.keep_scratch or places.artifacts is None
    return gguf_run(shape, plan.spec.quants, places, imatrix=plan.spec.imatrix,
                    kl=KLReference(GGUF_EVAL_CTX, GGUF_EVAL_CHUNKS), paths=paths, keep_f16=keep,
                    split_max_size=plan.spec.split_max_size)


def _gguf_header(result: BuildResult) -> list[str]:
    plan = result.plan
    if not result.base or not isinstance(plan, GGUFPlan):
        return []
    snap = plan.snapshot
    source = f"{snap.repo_id}@{snap.revision}" if snap.repo_id else f"{snap.kind} source"
    return [
        f"Source **{source}** (content {plan.source_key[:12]}) · llama.cpp {plan.llama.commit} · "
        f"base {plan.base_path.name} {result.base['size'] / (1 << 20):,.1f} MiB, sha256 `{result.base['sha256'][:16]}`",
    ]


GGUF = implement(
    ArtifactFormat(
        names=NAMES["gguf"],
        candidate=candidate_from_gguf,
        publish=_gguf_publish,
        served=_gguf_served,
        offer=_gguf_offer,
        image=_gguf_image,
        image_config="application/vnd.docker.container.image.v1+json",
        pull_command=lambda image, insecure: ["ollama", "pull", *(["--insecure"] if insecure else []), image],
        plan=_gguf_plan,
        steps=gguf_steps,
        finish=finish_gguf,
        header=_gguf_header,
        toolchain=lambda settings: llama_cpp(settings).prefix,
        resources=_gguf_resources,
        scratch=lambda plan: [plan.base_path, plan.logits_path],
    )
)
