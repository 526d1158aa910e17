"""The Python toolchains' wheels by digest: a setup keeps pip's installation report of each install into its venv
(toolchains/lib.sh tc_pip), modelmint reads each wheel's name, version and sha256 from it, and the signed provenance
of an artifact names every wheel of the venv that built it by its sha256; a toolchain set up without a report, or
with one that does not match the build, says the tools are recorded by version only (real pip into throwaway venvs
from local wheels, no network; real git + DVC repositories, real keys)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from registry_env import Repo, candidate
from test_signing import _key

from pipelines.core.settings import project_root
from pipelines.core.toolchains import LLAMA_CPP_DIR, LLMC_DIR, PIP_REPORTS, Installed, installed, read_pins
from pipelines.registry.register import artifact_dir, register
from pipelines.trust import provenance

LIB = project_root() / "toolchains" / "lib.sh"


def _wheel(folder: Path, name: str, version: str, modules: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of distribution `name` (a one-line package, and empty `modules` below it), as `pip wheel`
    would write it."""
    dist = name.replace("-", "_")
    files = {
        f"{dist}/__init__.py": f"__version__ = {version!r}\n",
        **{f"{dist}/{m.replace('.', '/')}/__init__.py": "" for m in modules},
        f"{dist}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: modelmint-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = f"{dist}-{version}.dist-info/RECORD"
    lines = [
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(t.encode())}"
        for p, t in files.items()
    ]
    files[record] = "\n".join([*lines, f"{record},,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return path


_BACKEND = """
import shutil
from pathlib import Path


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    built = next((Path(__file__).parent / "dist").glob("*.whl"))
    shutil.copy(built, wheel_directory)
    return built.name
"""
"""A PEP 517 build backend in the source folder: the wheel it builds is the one the test wrote beside it."""


def _folder_package(folder: Path) -> Path:
    """A source folder of `gguf` 0.19.0 that pip builds with its own in-tree backend (no build tool to download), as
    the llama.cpp setup installs gguf-py from llama.cpp's tree."""
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "gguf"\nversion = "0.19.0"\n'
    )
    (folder / "backend.py").write_text(_BACKEND)
    _wheel(folder / "dist", "gguf", "0.19.0")
    return folder


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _setup_venv(prefix: Path, wheels: Path, *installs: list[str]) -> None:
    """What a toolchain's venv stage does: a fresh venv at PREFIX/venv, then each install through lib.sh's tc_pip
    (pip from the local wheels only, the machine's pip configuration left out)."""
    subprocess.run([sys.executable, "-m", "venv", str(prefix / "venv")], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    for args in installs:
        script = f'source "{LIB}"; tc_init test "$1" true; shift; tc_pip "$@"'
        subprocess.run(["bash", "-c", script, "tc", str(prefix), str(prefix / "venv"), *args],
                       check=True, capture_output=True, text=True, env=env)


def test_the_setup_keeps_pips_report_and_each_wheel_is_read_with_its_sha256(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    torch = _wheel(wheels, "torch", "2.13.0")
    ct = _wheel(wheels, "compressed-tensors", "0.19.0")
    old = _wheel(wheels, "safetensors", "0.6.0")
    new = _wheel(wheels, "safetensors", "0.7.0")
    prefix = tmp_path / "llmcompressor-x"
    _setup_venv(prefix, wheels, ["torch==2.13.0", "compressed-tensors", "safetensors==0.6.0"],
                ["--upgrade", "safetensors==0.7.0"])

    assert sorted(p.name for p in (prefix / PIP_REPORTS).iterdir()) == ["01.json", "02.json"]
    report = json.loads((prefix / PIP_REPORTS / "01.json").read_text())
    assert report["version"] == "1"  # pip's own report, not a list modelmint wrote
    found = installed(prefix)
    # by name; the later install's safetensors replaces the earlier one, as it did in the venv
    assert found == (
        Installed("compressed-tensors", "0.19.0", ct.resolve().as_uri(), _sha256(ct)),
        Installed("safetensors", "0.7.0", new.resolve().as_uri(), _sha256(new)),
        Installed("torch", "2.13.0", torch.resolve().as_uri(), _sha256(torch)),
    )
    assert _sha256(old) not in {i.sha256 for i in found}


def test_the_llmcompressor_setup_on_a_fresh_machine_keeps_the_report_the_provenance_reads(tmp_path: Path) -> None:
    """toolchains/setup-llmcompressor.sh itself, all its stages, on an empty MODELMINT_HOME, its pinned packages
    served as tiny stand-in wheels from a local folder (no network): the finished toolchain holds pip's report, and
    the provenance of a build with its pins names each wheel by sha256."""
    toolchain = _llmc_toolchain()
    wheels = tmp_path / "wheels"
    made = {name: _wheel(wheels, name, v) for name, v in toolchain.items()
            if name not in ("modelmint", "llmcompressor")}
    made["llmcompressor"] = _wheel(wheels, "llmcompressor", toolchain["llmcompressor"],
                                   ("modifiers", "modifiers.quantization", "modifiers.transform",
                                    "modifiers.transform.awq"))
    made |= {name: _wheel(wheels, name, "1.0.0") for name in ("safetensors", "pyyaml")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(MODELMINT_HOME=str(tmp_path / "home"), PYTHON=sys.executable, PIP_CONFIG_FILE=os.devnull,
               PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1")
    run = subprocess.run(["bash", str(project_root() / "toolchains" / "setup-llmcompressor.sh")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    prefix = tmp_path / "home" / "toolchains" / LLMC_DIR.format(**read_pins("llmcompressor"))
    assert (prefix / ".complete").is_file()
    assert sorted(p.name for p in (prefix / PIP_REPORTS).iterdir()) == ["01.json"]
    report = (prefix / PIP_REPORTS / "01.json").read_bytes()
    again = subprocess.run(["bash", str(project_root() / "toolchains" / "setup-llmcompressor.sh")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "ready" in again.stdout  # cached: nothing reinstalled, the report kept
    assert sorted(p.name for p in (prefix / PIP_REPORTS).iterdir()) == ["01.json"]
    assert (prefix / PIP_REPORTS / "01.json").read_bytes() == report

    deps = {d["name"]: d for d in provenance.toolchain_dependencies(toolchain, tmp_path / "home" / "toolchains")}
    assert {n: deps[f"toolchain:{n}"]["digest"]["sha256"] for n in made} == {n: _sha256(w) for n, w in made.items()}


def test_a_toolchain_set_up_without_a_report_has_none(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    assert installed(tmp_path) is None


def _llmc_toolchain() -> dict[str, str]:
    pins = read_pins("llmcompressor")
    return {"modelmint": "0.1.0", "llmcompressor": pins["LLMC_VERSION"], "torch": pins["LLMC_TORCH"],
            "transformers": pins["LLMC_TRANSFORMERS"], "compressed-tensors": pins["LLMC_COMPRESSED_TENSORS"]}


def _llmc_reported(toolchains: Path, wheels: Path, versions: dict[str, str]) -> dict[str, Path]:
    """An llmcompressor toolchain directory (where this checkout's pins put it) whose venv setup installed one tiny
    wheel of each pinned name at `versions`, and pyyaml; the wheels by name."""
    made = {name: _wheel(wheels, name, v) for name, v in {**versions, "pyyaml": "6.0.3"}.items()}
    prefix = toolchains / LLMC_DIR.format(**read_pins("llmcompressor"))
    _setup_venv(prefix, wheels, [f"{n}=={v}" for n, v in {**versions, "pyyaml": "6.0.3"}.items()])
    return made


def test_a_compressed_builds_provenance_names_every_wheel_of_the_llmcompressor_venv_by_sha256(
    tmp_path: Path,
) -> None:
    toolchain = _llmc_toolchain()
    made = _llmc_reported(tmp_path / "toolchains", tmp_path / "wheels",
                          {k: v for k, v in toolchain.items() if k != "modelmint"})
    deps = {d["name"]: d for d in provenance.toolchain_dependencies(toolchain, tmp_path / "toolchains")}
    assert sorted(deps) == ["toolchain:compressed-tensors", "toolchain:llmcompressor", "toolchain:pyyaml",
                            "toolchain:torch", "toolchain:transformers"]
    for name, wheel in made.items():
        d = deps[f"toolchain:{name}"]
        version = toolchain.get(name, "6.0.3")
        # in-toto ResourceDescriptor: a local file is no URL a verifier can fetch, so its package URL names the file
        assert d["uri"] == f"pkg:pypi/{name}@{version}?file_name={wheel.name}"
        assert d["digest"] == {"sha256": _sha256(wheel)}
        assert d["annotations"]["version"] == version
        assert "source" in d["annotations"] and "version only" not in d["annotations"]["source"]


def test_without_a_report_or_with_another_builds_report_the_tools_are_recorded_by_version_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    toolchain = _llmc_toolchain()
    toolchains = tmp_path / "toolchains"
    prefix = toolchains / LLMC_DIR.format(**read_pins("llmcompressor"))
    (prefix / "venv").mkdir(parents=True)  # set up before setups kept a report

    def said() -> list[str]:
        deps = provenance.toolchain_dependencies(toolchain, toolchains)
        assert [d["uri"] for d in deps] == [f"pkg:pypi/{n}@{toolchain[n]}" for n in sorted(toolchain)
                                            if n != "modelmint"]
        assert all("digest" not in d for d in deps)
        notes = {d["annotations"]["source"] for d in deps}
        assert len(notes) == 1
        return [*notes]

    (note,) = said()
    assert note.startswith("recorded by version only: ") and "set up without pip's installation report" in note
    assert "bash toolchains/setup-llmcompressor.sh" in note and str(tmp_path) not in note  # how to get one

    # a report whose torch is not the version the build recorded describes another venv: no digest taken from it
    _llmc_reported(toolchains, tmp_path / "wheels",
                   {**{k: v for k, v in toolchain.items() if k != "modelmint"}, "torch": "2.12.0"})
    (note,) = said()
    assert f"torch {toolchain['torch']} (the report has 2.12.0)" in note

    # a report that is not one: named with the cause, no digest, nothing raised; the published note names no path of
    # this machine, the log the command to run here
    (prefix / PIP_REPORTS / "01.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="pipelines.trust.provenance"):
        (note,) = said()
    assert "installation report of the llmcompressor" in note and "unreadable (01.json: JSONDecodeError" in note
    assert str(tmp_path) not in note
    assert f"rm -f {prefix}/.complete" in caplog.text and str(prefix / PIP_REPORTS / "01.json") in caplog.text

    # a checkout whose pins are not the build's: its toolchain directory is another venv
    other = {**toolchain, "llmcompressor": "0.0.1"}
    deps = provenance.toolchain_dependencies(other, toolchains)
    assert all("digest" not in d and "pins are not the ones" in d["annotations"]["source"] for d in deps)


def test_a_ggufs_converter_torch_is_named_as_the_torch_package_without_a_report() -> None:
    deps = provenance.toolchain_dependencies(
        {"modelmint": "0.1.0", "llama.cpp": "0c1e570", "converter.torch": "2.13.0", "converter.transformers": "4.57.6"}
    )
    by = {d["name"]: d for d in deps}
    assert by["toolchain:converter.torch"]["uri"] == "pkg:pypi/torch@2.13.0"
    assert by["toolchain:converter.transformers"]["uri"] == "pkg:pypi/transformers@4.57.6"


@pytest.mark.parametrize("with_report", [True, False], ids=["report", "no-report"])
def test_a_signed_gguf_provenance_names_the_converter_venvs_wheels_by_sha256(
    repo: Repo, tmp_path: Path, with_report: bool
) -> None:
    """Registration signs a provenance whose resolvedDependencies carry the converter venv's wheels by sha256
    when its setup kept a report, and say "recorded by version only" when it did not."""
    pins = read_pins("llama-cpp")
    home = tmp_path / "home"
    prefix = home / "toolchains" / LLAMA_CPP_DIR.format(**pins)
    (prefix / "venv").mkdir(parents=True)
    wheels = tmp_path / "wheels"
    made = {
        "torch": _wheel(wheels, "torch", pins["CONVERTER_TORCH"]),
        "transformers": _wheel(wheels, "transformers", pins["CONVERTER_TRANSFORMERS"]),
        "numpy": _wheel(wheels, "numpy", "2.2.6"),
    }
    if with_report:
        _setup_venv(prefix, wheels, [f"torch=={pins['CONVERTER_TORCH']}",
                                     f"transformers=={pins['CONVERTER_TRANSFORMERS']}", "numpy"],
                    [str(_folder_package(tmp_path / "tree" / "gguf-py"))])
    private, _ = _key(tmp_path / "signing.pem")
    settings = repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_HOME=home)
    c = candidate(settings, tmp_path / "build")
    c = dataclasses.replace(c, toolchain={**c.toolchain, "converter.torch": pins["CONVERTER_TORCH"],
                                          "converter.transformers": pins["CONVERTER_TRANSFORMERS"]})
    register(settings, c)

    stmt = json.loads((artifact_dir(settings, "tiny-qwen2", "q4_k_m") / provenance.PROVENANCE).read_text())
    deps = {d["name"]: d for d in stmt["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["toolchain:llama.cpp"]["digest"] == {"sha256": pins["LCPP_SDIST_SHA256"]}
    if with_report:
        for name, wheel in made.items():
            assert deps[f"toolchain:{name}"]["digest"] == {"sha256": _sha256(wheel)}
            assert deps[f"toolchain:{name}"]["uri"].endswith(f"?file_name={wheel.name}")
        assert "toolchain:converter.torch" not in deps  # the report's torch stands for it
        # installed from a folder (llama.cpp's gguf-py): no archive, no digest, and no path of this machine
        gguf = deps["toolchain:gguf"]
        assert "digest" not in gguf and gguf["uri"] == "pkg:pypi/gguf@0.19.0"
        assert "the local folder gguf-py" in gguf["annotations"]["source"]
        assert str(tmp_path) not in json.dumps(stmt)
    else:
        for name in ("converter.torch", "converter.transformers"):
            assert "digest" not in deps[f"toolchain:{name}"]
            assert deps[f"toolchain:{name}"]["annotations"]["source"].startswith("recorded by version only")
