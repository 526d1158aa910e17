"""Where the pinned toolchains live and how to reach them; the pins themselves are in toolchains/*.env."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import ToolchainMissing
from pipelines.settings import Settings, project_root


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
