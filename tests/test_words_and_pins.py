"""Words that do not lie and pins that agree: commands named in hints and docs exist, the imatrix rule is llama.cpp's,
deployment descriptions match the catalog, and container images take their versions from toolchains/*.env."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from pipelines import __version__
from pipelines.cli import app
from pipelines.core.errors import ConfigError
from pipelines.core.settings import Settings, project_root
from pipelines.core.toolchains import read_pins
from pipelines.source.catalog import GGUF_QUANT_TYPES, IMATRIX_REQUIRED, load_catalog

ROOT = project_root()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]
DOCKERFILES = sorted((ROOT / "containers").glob("*/Dockerfile"))
PINS = {key: value for env in sorted((ROOT / "toolchains").glob("*.env")) for key, value in read_pins(env.stem).items()}


# ---------------------------------------------------------------- every command a hint or a doc names exists


def _command_paths(command: Any, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found = {path}
    for name, sub in getattr(command, "commands", {}).items():
        found |= _command_paths(sub, (*path, name))
    return found


COMMAND_PATHS = _command_paths(typer.main.get_command(app))
# `modelmint WORD` in backquotes (hints, docs, comments), or at the start of a line of a shell example
_NAMED = re.compile(r"`modelmint ((?:[a-z][\w-]*)(?: [a-z][\w-]*)?)|^\s*(?:\.venv/bin/)?modelmint ([a-z][\w-]*(?: [a-z][\w-]*)?)",
                    re.MULTILINE)


def _texts() -> list[Path]:
    places = ["README.md", "prefect.yaml", "dvc.yaml", "docs", "pipelines", "flows", "toolchains", "containers", "scripts"]
    files: list[Path] = []
    for place in places:
        p = ROOT / place
        files += [p] if p.is_file() else [f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix not in {".pyc", ".txt"}]
    return files


def _named_commands() -> list[tuple[str, str]]:
    named = []
    for f in _texts():
        for m in _NAMED.finditer(f.read_text(encoding="utf-8", errors="replace")):
            named.append((str(f.relative_to(ROOT)), m[1] or m[2]))
    return named


def test_every_command_a_hint_or_doc_names_exists() -> None:
    named = _named_commands()
    assert len(named) > 20 and any(words.startswith("fetch") for _, words in named)  # the scan finds them
    missing = []
    for where, words in named:
        first, *rest = words.split()
        if (first,) not in COMMAND_PATHS:
            missing.append(f"{where}: modelmint {first}")
        elif rest and (first, rest[0]) not in COMMAND_PATHS and _is_group(first):
            missing.append(f"{where}: modelmint {first} {rest[0]}")
    assert not missing, "named commands that do not exist:\n" + "\n".join(missing)


def _is_group(name: str) -> bool:
    return any(len(p) == 2 and p[0] == name for p in COMMAND_PATHS)


# ---------------------------------------------------------------- quant types that need an importance matrix


def _catalog(tmp_path: Path, gguf: str) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text("models:\n  - name: tiny\n    source: {generated: tiny-qwen2}\n    license: apache-2.0\n"
                    f"    variants:\n      gguf: {gguf}\n", encoding="utf-8")
    return path


def test_a_type_that_needs_an_imatrix_is_refused_at_load_without_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_catalog(_catalog(tmp_path, "{quants: [q4_k_m, iq2_xs]}"))
    assert "entry 'tiny'" in exc.value.message and "iq2_xs needs an importance matrix" in exc.value.message
    assert "`imatrix: true`" in exc.value.message
    entry = load_catalog(_catalog(tmp_path, "{quants: [q4_k_m, iq2_xs], imatrix: true}")).get("tiny")
    assert entry.variants.gguf is not None and entry.variants.gguf.quants == ["q4_k_m", "iq2_xs"]


def test_asking_for_such_a_type_on_the_command_line_is_refused_before_any_build(tmp_path: Path) -> None:
    entry = load_catalog(_catalog(tmp_path, "{quants: [q4_k_m]}")).get("tiny")
    with pytest.raises(ConfigError) as exc:
        entry.with_quants(["q8_0", "iq3_xs", "q2_k_s"])  # what `--variants` and the flow's variants go through
    assert "iq3_xs, q2_k_s need an importance matrix" in exc.value.message
    assert "imatrix: true" in (exc.value.hint or "")
    assert entry.with_quants(["q8_0", "iq4_xs", "iq3_s"]).variants.gguf.quants == ["q8_0", "iq4_xs", "iq3_s"]


def test_the_quant_types_are_llama_cpp_file_types() -> None:
    """Every catalog type is a gguf-py file type (check_gguf compares general.file_type by that name)."""
    from gguf import LlamaFileType

    names = {m.name.removeprefix("MOSTLY_").lower() for m in LlamaFileType}
    assert names >= GGUF_QUANT_TYPES, GGUF_QUANT_TYPES - names
    assert IMATRIX_REQUIRED <= GGUF_QUANT_TYPES


@pytest.mark.slow
def test_the_imatrix_list_is_what_llama_quantize_refuses(tiny_qwen2: Path, settings: Settings, tmp_path: Path) -> None:
    """Ask llama-quantize about every type for the tiny model's f16 without an imatrix: exactly IMATRIX_REQUIRED
    needs one (its --dry-run applies the same per-tensor rule and says so; one real run shows it refuses)."""
    from pipelines.core.runner import run
    from pipelines.core.toolchains import llama_cpp
    from pipelines.gguf.tools import convert

    llama = llama_cpp(settings)
    f16, _ = convert(tiny_qwen2, tmp_path / "f16.gguf", llama)
    quantize = llama.bin("llama-quantize")
    needs = set()
    for qtype in sorted(GGUF_QUANT_TYPES):
        tool = run([quantize, "--dry-run", f16.path, qtype.upper(), "1"])
        if "will require an imatrix" in tool.stdout + tool.stderr:
            needs.add(qtype)
    assert needs == IMATRIX_REQUIRED
    refused = run([quantize, f16.path, tmp_path / "q.gguf", "IQ2_XS", "1"], check=False)
    assert refused.returncode != 0 and "requires an imatrix" in refused.stdout + refused.stderr


# ---------------------------------------------------------------- deployments say what they build


def test_deployment_descriptions_name_what_the_catalog_builds() -> None:
    catalog = load_catalog(ROOT / "registry" / "catalog.yaml")
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]
    converts = [d for d in deployments if d["entrypoint"] == "flows/convert.py:convert"]  # not all, watch-upstream
    assert converts
    for d in converts:
        entry = catalog.get(d["parameters"]["model"])
        text = d["description"]
        gguf = entry.variants.gguf
        assert ("GGUF" in text) == (gguf is not None), d["name"]
        for q in gguf.quants if gguf else []:
            assert q in text, (d["name"], q)
        compressed = entry.variants.compressed()
        assert ("compressed-tensors" in text) == bool(compressed), d["name"]
        for scheme in compressed:
            assert scheme.upper() in text, (d["name"], scheme)


# ---------------------------------------------------------------- container images


def _dockerfile(path: Path) -> tuple[dict[str, str], list[tuple[str, dict[str, str]]], list[str]]:
    """ARGs before the first FROM, each stage's FROM reference with its own ARG defaults, and every line."""
    text = path.read_text(encoding="utf-8")
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()  # continuation lines joined
    global_args: dict[str, str] = {}
    stages: list[tuple[str, dict[str, str]]] = []
    for line in lines:
        if m := re.match(r"ARG (\w+)(?:=(\S+))?\s*$", line):
            scope = stages[-1][1] if stages else global_args
            scope[m[1]] = m[2] if m[2] is not None else global_args.get(m[1], "")
        elif m := re.match(r"FROM (\S+)", line):
            stages.append((m[1], {}))
    return global_args, stages, lines


def _expand(ref: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], ref)


def test_the_project_version_is_one() -> None:
    assert __version__ == VERSION


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_dockerfile_versions_come_from_the_pins(path: Path) -> None:
    global_args, stages, lines = _dockerfile(path)
    assert stages, "no FROM"
    every_arg = {**global_args, **{k: v for _, a in stages for k, v in a.items()}}
    # every ARG that names a pin has the pin's value as its default; the project version is pyproject's
    for name, default in every_arg.items():
        if name in PINS:
            assert default == PINS[name], f"{path}: ARG {name}={default}, toolchains says {PINS[name]}"
    assert every_arg.get("MODELMINT_VERSION", VERSION) == VERSION
    # no version is written anywhere but in an ARG default: paths, labels and comments use the ARGs
    pinned = {v for k, v in PINS.items() if re.fullmatch(r"[\d.]+|[0-9a-f]{7,40}", v) and k != "VLLM_KVCACHE_GIB"}
    for line in lines:
        if not line.startswith("ARG "):
            hard = [v for v in pinned if re.search(rf"(?<![\w.]){re.escape(v)}(?![\w]|\.\d)", line)]
            assert not hard, f"{path}: {line!r} hard-codes {hard}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_dockerfile_bases_are_exact_and_images_carry_the_version(path: Path) -> None:
    global_args, stages, lines = _dockerfile(path)
    stage_names = {m[1] for line in lines if (m := re.match(r"FROM \S+ AS (\S+)", line))}
    requires = PYPROJECT["project"]["requires-python"]
    for ref, _ in stages:
        image = _expand(ref, global_args)
        if image.startswith("modelmint/"):
            assert image == f"modelmint/{image.split('/')[1].split(':')[0]}:{VERSION}", image  # a tagged sibling
        elif image not in stage_names:
            # an exact patch release of the Python the project requires, never a moving tag
            m = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-bookworm(@sha256:[0-9a-f]{64})?", image)
            assert m, f"{path}: base image {image!r} is not an exact python:X.Y.Z-slim-bookworm"
            assert requires == f">={m[1]}.{m[2]}", (image, requires)
    # the final image is labelled with modelmint's version
    final_args = {**global_args, **stages[-1][1]}
    labels = " ".join(line for line in lines[max(i for i, ln in enumerate(lines) if ln.startswith("FROM ")):]
                      if line.startswith("LABEL "))
    version = re.search(r'org\.opencontainers\.image\.version="([^"]+)"', labels)
    assert version and _expand(version[1], final_args) == VERSION, f"{path}: no image version label"
    # the documented build command tags it with the same version
    builds = re.findall(r"docker build -f (\S+) -t (\S+) \.", path.read_text(encoding="utf-8"))
    assert any(f == str(path.relative_to(ROOT)) for f, _ in builds), f"{path}: no documented `docker build`"
    for _, tag in builds:
        assert tag.startswith("modelmint/") and tag.endswith(f":{VERSION}"), tag


def test_the_same_python_base_everywhere() -> None:
    bases = {_dockerfile(p)[0].get("PYTHON_IMAGE") for p in DOCKERFILES}
    assert len(bases) == 1 and None not in bases, bases


def test_every_image_reference_is_tagged_with_the_version() -> None:
    """Docs, deployments, the Kubernetes job template and the Dockerfiles name modelmint's images by version."""
    places = [*DOCKERFILES, ROOT / "prefect.yaml", ROOT / "README.md", *sorted((ROOT / "containers" / "k8s").iterdir()),
              *sorted((ROOT / "docs").glob("*.md"))]
    refs = []
    for f in places:
        for m in re.finditer(r"\bmodelmint/(llama-cpp|llmcompressor|prefect-worker|vllm-cpu)\b(:[\w.${}]+)?", f.read_text()):
            refs.append((f.name, m[0]))
    assert refs
    bad = [(f, r) for f, r in refs if not r.endswith(f":{VERSION}") and not r.endswith(":${MODELMINT_VERSION}")]
    assert not bad, bad
    template = json.loads((ROOT / "containers" / "k8s" / "base-job-template.json").read_text())
    assert template["variables"]["properties"]["image"]["default"] == f"modelmint/prefect-worker:{VERSION}"


def test_the_worker_installs_prefect_kubernetes_and_ray_from_the_project_pins() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert any(r.startswith("prefect-kubernetes==") for r in extras["k8s"])
    assert any(r.startswith("prefect-ray==") for r in extras["ray"]) and any(r.startswith("ray[default]==") for r in extras["ray"])
    text = (ROOT / "containers" / "prefect-worker" / "Dockerfile").read_text()
    assert '".[k8s,ray]"' in text and "prefect-kubernetes==" not in text and "prefect-ray==" not in text


# ---------------------------------------------------------------- hand-written tables that gguf-py also holds


def test_the_gguf_header_walker_speaks_gguf_py_constants() -> None:
    """read_gguf_header keeps its own walk (GGUFReader maps every vocabulary item: seconds on a 150k vocab) and
    its own type codes (no gguf import on the fast path); they must be gguf-py's."""
    import struct

    from gguf import constants

    from pipelines.core import ggufheader as walker

    assert struct.pack("<I", constants.GGUF_MAGIC) == walker.GGUF_MAGIC
    assert constants.GGUF_VERSION in walker.SUPPORTED_GGUF_VERSIONS
    assert (walker._STRING, walker._ARRAY) == (constants.GGUFValueType.STRING, constants.GGUFValueType.ARRAY)
    v = constants.GGUFValueType
    expected = {v.UINT8: "B", v.INT8: "b", v.UINT16: "H", v.INT16: "h", v.UINT32: "I", v.INT32: "i",
                v.FLOAT32: "f", v.BOOL: "?", v.UINT64: "Q", v.INT64: "q", v.FLOAT64: "d"}
    assert {int(t): fmt for t, fmt in expected.items()} == walker.SCALAR_FORMATS
