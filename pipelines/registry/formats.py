"""The artifact formats modelmint builds, each declared once: how to build and validate it, how a validated variant
becomes a registration candidate, which serving files are published beside it, and what a pull of it offers.

The CLI, the flow, registration, pull and dvc.yaml dispatch through `FORMATS` / `format_of`; no other module
asks "which format is this?". A new format (an OCI model package, another quantizer) is one more entry here and
the modules it names, not a branch in each of those places. Each hook imports its format's modules when called,
so reading a manifest or a dvc.yaml never imports a toolchain wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.core.vocab import Format as Format
from pipelines.source.catalog import COMPRESSED_VARIANTS, CatalogEntry

if TYPE_CHECKING:
    from pipelines.core.settings import Settings
    from pipelines.core.steps import BuildResult, VariantOutcome
    from pipelines.publish.oci import Blob, Image
    from pipelines.registry.manifest import Manifest
    from pipelines.registry.register import Candidate


@dataclass(frozen=True)
class ArtifactFormat:
    name: Format
    stage: str
    """The dvc.yaml stage that builds it (its `foreach` items are name-tag): gguf@qwen2.5-q4_k_m."""
    command: str
    """The CLI command that builds, validates and (with --register) registers it."""
    option: str
    """That command's option naming variants."""
    owns: Callable[[str], bool]
    """Whether a variant tag is of this format."""
    catalog_variants: Callable[[CatalogEntry], list[str]]
    """The variants of this format a catalog entry asks for."""
    build: Callable[..., BuildResult]
    """(entry, settings, *, variants, revision, progress, **options) → BuildResult: build and validate."""
    candidate: Callable[[Any, VariantOutcome], Candidate]
    """(plan, validated outcome) → what registration takes (refuses a variant that did not pass)."""
    publish: Callable[[Settings, Candidate, Path], list[Path]]
    """Write the serving files into the artifact directory being placed (Modelfile and card; vllm.yaml and card)."""
    offer: Callable[[Path, Manifest, bool], dict[str, Any]]
    """After a pull into a directory: the commands that serve it, and what was run (PullResult fields)."""
    image: Callable[[Path, Manifest, tuple[Blob, ...]], Image]
    """(registered artifact directory, its manifest, extra layers) → the OCI image `modelmint publish` pushes."""
    image_config: str
    """The media type of that image's config blob: how a pull recognises the layout."""
    pull_command: Callable[[str, bool], list[str]]
    """(HOST/NAMESPACE/NAME:TAG, insecure) → the command that fetches the published image where it is used."""

    def rebuild_command(self, name: str, tag: str) -> str:
        """The command that builds, validates and registers (uploads) this variant again on a machine."""
        return f"modelmint {self.command} {name} {self.option} {tag} --register"


# ---------------------------------------------------------------- GGUF (llama.cpp; for Ollama and llama.cpp)


def _gguf_build(entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None, **kw: Any) -> BuildResult:
    from pipelines.gguf.build import build_gguf

    kw.pop("serve", None)  # GGUF variants are checked by generation in their validation, not by a server
    return build_gguf(entry, settings, quants=variants, **kw)


def _gguf_candidate(plan: Any, outcome: VariantOutcome) -> Candidate:
    from pipelines.registry.register import candidate_from_gguf

    return candidate_from_gguf(plan, outcome)


def _gguf_publish(settings: Settings, c: Candidate, directory: Path) -> list[Path]:
    import json

    from pipelines.publish.ollama import publish_ollama

    # The report as its JSON file has it (sorted keys): the same variant must give the same bytes whether
    # its report was just measured or read back, or the directory's DVC hash would change on every rerun.
    report = json.loads(json.dumps(c.report, sort_keys=True))
    gguf = directory / c.files[0].name
    return publish_ollama(gguf, c.source_dir, report, c.entry, directory, settings=settings).paths


def _gguf_offer(target: Path, manifest: Manifest, ollama: bool) -> dict[str, Any]:
    import shutil

    from pipelines.publish.ollama import install_into_ollama, ollama_commands

    modelfile = target / "Modelfile"
    if not modelfile.is_file():
        return {}
    if ollama and shutil.which("ollama"):
        installed = install_into_ollama(modelfile, manifest.ref)
        return {"commands": installed.commands, "ran_ollama": installed.ran, "ollama_reply": installed.reply}
    return {"commands": ollama_commands(modelfile, manifest.ref)}


def _gguf_image(directory: Path, manifest: Manifest, extra: tuple[Blob, ...]) -> Image:
    from pipelines.core.errors import ArtifactError
    from pipelines.publish.oci import MODELMINT_FILE, TITLE, Blob
    from pipelines.publish.ollama_image import ollama_image

    ggufs = [f.path for f in manifest.files if f.path.endswith(".gguf")]
    if len(ggufs) != 1:
        raise ArtifactError(f"{manifest.ref} is split into {len(ggufs)} GGUF files; an Ollama image holds one",
                            hint="register it without split_max_size in the catalog to publish it for `ollama pull`")
    files = tuple(Blob.of_file(MODELMINT_FILE, directory / f.path, f.sha256, f.size, {TITLE: f.path})
                  for f in manifest.files if f.path != manifest.file)
    return ollama_image(directory / manifest.file, manifest.sha256, directory / "Modelfile", extra=(*files, *extra))


def _gguf_variants(entry: CatalogEntry) -> list[str]:
    spec = entry.variants.gguf
    return [q.lower() for q in spec.quants] if spec else []


# ---------------------------------------------------------------- compressed-tensors (llmcompressor; for vLLM)


def _compressed_build(entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None,
                      serve: bool = False, **kw: Any) -> BuildResult:
    from pipelines.compressed.build import build_compressed

    return build_compressed(entry, settings, schemes=variants, serve_smoke=serve, **kw)


def _compressed_candidate(plan: Any, outcome: VariantOutcome) -> Candidate:
    from pipelines.registry.register import candidate_from_compressed

    return candidate_from_compressed(plan, outcome)


def _compressed_publish(settings: Settings, c: Candidate, directory: Path) -> list[Path]:
    from pipelines.compressed.build import served_name
    from pipelines.publish.vllm import publish_vllm

    assert c.root is not None, "a compressed-tensors candidate names its checkpoint directory"
    return publish_vllm(c.root, directory, c.report, c.entry, served_name(c.entry.name, c.tag))


def _compressed_offer(target: Path, manifest: Manifest, ollama: bool) -> dict[str, Any]:
    from pipelines.publish.vllm import serve_command

    return {"commands": [serve_command(target)]}


def _compressed_image(directory: Path, manifest: Manifest, extra: tuple[Blob, ...]) -> Image:
    from pipelines.publish.modelpack import modelpack_image

    src = manifest.source
    descriptor = {
        "createdAt": manifest.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"), "name": manifest.name,
        "version": manifest.tag, "revision": src.revision,
        "sourceURL": f"https://huggingface.co/{src.repo}" if src.repo else None,
        "description": f"{manifest.ref}: {manifest.recipe.get('recipe', {}).get('scheme', manifest.tag)} "
        f"compressed-tensors checkpoint of {src.ref}, validated by modelmint",
    }
    return modelpack_image(directory, manifest.files, descriptor, quantization=manifest.tag, extra=extra)


def _modelmint_pull(image: str, insecure: bool) -> list[str]:
    where, _, tag = image.rpartition(":")
    registry, _, name = where.rpartition("/")
    return ["modelmint", "pull", f"{name}:{tag}", "--from-registry", registry, *(["--insecure"] if insecure else [])]


FORMATS: dict[Format, ArtifactFormat] = {
    f.name: f
    for f in (
        ArtifactFormat(
            name="gguf", stage="gguf", command="convert", option="--variants",
            owns=lambda tag: tag not in COMPRESSED_VARIANTS, catalog_variants=_gguf_variants, build=_gguf_build,
            candidate=_gguf_candidate, publish=_gguf_publish, offer=_gguf_offer, image=_gguf_image,
            image_config="application/vnd.docker.container.image.v1+json",
            pull_command=lambda image, insecure: ["ollama", "pull", *(["--insecure"] if insecure else []), image],
        ),
        ArtifactFormat(
            name="compressed-tensors", stage="compress", command="compress", option="--schemes",
            owns=lambda tag: tag in COMPRESSED_VARIANTS,
            catalog_variants=lambda entry: list(entry.variants.compressed()), build=_compressed_build,
            candidate=_compressed_candidate, publish=_compressed_publish, offer=_compressed_offer,
            image=_compressed_image, image_config="application/vnd.cncf.model.config.v1+json",
            pull_command=_modelmint_pull,
        ),
    )
}


def format_of(tag: str) -> ArtifactFormat:
    """The format a variant tag builds: compressed-tensors for llmcompressor schemes (fp8, awq, …), else GGUF."""
    return next(f for f in FORMATS.values() if f.owns(tag))


def split_by_format(tags: list[str]) -> dict[Format, list[str]]:
    """`tags` grouped by format, in FORMATS order, each in the order given."""
    return {name: [t for t in tags if f.owns(t)] for name, f in FORMATS.items()}
