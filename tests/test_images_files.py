"""The image build's files, checked without building: scripts/images.sh's refusals, the pins check of a build,
the llama.cpp image's compile script against the toolchain's, the Kubernetes files against the tags built.
(Building and running the images: tests/test_images.py, the `images` tier.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
IMAGES_SH = ROOT / "scripts" / "images.sh"


def _listed() -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(IMAGES_SH), "--list"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split() for line in out.splitlines())


def test_images_sh_lists_every_dockerfile_with_the_project_version() -> None:
    from pipelines import __version__

    listed = _listed()
    assert sorted(listed) == sorted(p.parent.name for p in (ROOT / "containers").glob("*/Dockerfile"))
    assert all(tag.startswith("modelmint/") and tag.endswith(f":{__version__}") for tag in listed.values())
    # each Dockerfile documents the tag the script gives it
    for d, tag in listed.items():
        assert f"-t {tag} ." in (ROOT / "containers" / d / "Dockerfile").read_text(), (d, tag)


def test_without_podman_and_apt_get_the_script_names_the_packages(tmp_path: Path) -> None:
    # a PATH with the shell and coreutils, but neither podman nor apt-get
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (
        "bash",
        "sed",
        "head",
        "tail",
        "mkdir",
        "dirname",
        "cat",
        "awk",
        "grep",
        "sha256sum",
        "cut",
        "env",
    ):
        found = subprocess.run(
            ["bash", "-c", f"command -v {tool}"], capture_output=True, text=True
        ).stdout.strip()
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "MODELMINT_HOME": str(tmp_path / "home")}
    done = subprocess.run([str(bin_dir / "bash"), str(IMAGES_SH)], capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert "error: building the images needs podman buildah skopeo runc debootstrap" in done.stderr
    assert "apt-get is not available" in done.stderr
    assert "install podman buildah skopeo runc debootstrap with your package manager" in done.stderr
    assert "Traceback" not in done.stderr and "line " not in done.stderr


def test_a_build_arg_that_disagrees_with_the_pins_stops_the_build_naming_both(tmp_path: Path) -> None:
    env_file = ROOT / "toolchains" / "llmcompressor.env"
    pins = dict(re.findall(r"^(\w+)=(.*)$", env_file.read_text(), re.MULTILINE))
    check = ["sh", str(ROOT / "containers" / "check-pins.sh"), str(env_file), "LLMC_VERSION", "LLMC_TORCH"]
    agree = subprocess.run(
        check,
        capture_output=True,
        text=True,
        env={**os.environ, **{k: pins[k] for k in ("LLMC_VERSION", "LLMC_TORCH")}},
    )
    assert agree.returncode == 0, agree.stderr
    wrong = subprocess.run(
        check,
        capture_output=True,
        text=True,
        env={**os.environ, "LLMC_VERSION": "0.13.0", "LLMC_TORCH": pins["LLMC_TORCH"]},
    )
    assert wrong.returncode == 1
    assert (
        f"error: build arg LLMC_VERSION=0.13.0 disagrees with toolchains/llmcompressor.env "
        f"(LLMC_VERSION={pins['LLMC_VERSION']})"
    ) in wrong.stderr
    # every Dockerfile checks the pins it declares, against the .env file that holds them
    for dockerfile in sorted((ROOT / "containers").glob("*/Dockerfile")):
        text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
        checked = {
            n
            for m in re.finditer(r"check-pins\.sh \S+?(\w[\w-]*)\.env ([A-Z0-9_ ]+)", text)
            for n in m[2].split()
        }
        declared = set(re.findall(r"^ARG ([A-Z0-9_]+)=", text, re.MULTILINE))
        all_pins = {
            k
            for env in (ROOT / "toolchains").glob("*.env")
            for k in re.findall(r"^(\w+)=", env.read_text(), re.MULTILINE)
        }
        assert declared & all_pins <= checked, (dockerfile, (declared & all_pins) - checked)


def _cmake_flags(script: Path) -> list[str]:
    text = re.sub(r"\\\n\s*", " ", script.read_text())
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("cmake -S"))
    return sorted(f for f in shlex.split(line, posix=False) if f.startswith("-D"))


def test_the_images_compile_script_configures_llama_cpp_as_the_toolchain_does() -> None:
    """containers/llama-cpp/build.sh (the CUDA build, runnable without podman) and toolchains/setup-llama-cpp.sh
    give cmake the same flags; CUDA adds its own only when asked."""
    image = _cmake_flags(ROOT / "containers" / "llama-cpp" / "build.sh")
    host = _cmake_flags(ROOT / "toolchains" / "setup-llama-cpp.sh")
    assert image == host and "-DGGML_NATIVE=OFF" in host
    text = (ROOT / "containers" / "llama-cpp" / "build.sh").read_text()
    assert 'cuda=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=' in text
    # and it refuses a tree that is not llama.cpp's, by name
    done = subprocess.run(
        ["bash", str(ROOT / "containers" / "llama-cpp" / "build.sh"), str(ROOT / "docs"), "/tmp/x"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "is not llama.cpp's source tree" in done.stderr


def test_the_kubernetes_files_name_the_images_the_script_builds() -> None:
    worker = _listed()["prefect-worker"]
    template = (ROOT / "containers" / "k8s" / "base-job-template.json").read_text()
    assert f'"default": "{worker}"' in template
    docs = list(yaml.safe_load_all((ROOT / "containers" / "k8s" / "raycluster.yaml").read_text()))
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    pods = [
        cluster["spec"]["headGroupSpec"]["template"],
        *(g["template"] for g in cluster["spec"]["workerGroupSpecs"]),
    ]
    assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {worker}
