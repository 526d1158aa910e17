"""The package layout is the architecture: sub-packages by concern, and imports point down the layers only.

A newcomer finds any step's single implementation from the folder names; a module that reaches up a layer (a
build importing a publisher, a reader importing a build) is the first step back to the copies this layout ended.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pipelines

ROOT = Path(pipelines.__file__).parents[1]

LAYERS = {"core": 0, "source": 1, "chat": 1, "gguf": 2, "compressed": 2, "publish": 3, "store": 4, "trust": 5,
          "advice": 5, "registry": 6, "oci": 7, "site": 8}
"""Lower numbers are imported by higher ones; the same number means neither imports the other. The registry's rooms:
the store (what an artifact is and where it is held) under trust (its provenance and signature, which read manifests)
and the serving advice; the registry's operations (register, pull, verify, reproduce) where store and trust meet; OCI
publishing, which pulls and signs; the site, which shows all of it."""
TOP = {"__init__", "cli", "compose"}
"""The command line (a package: pipelines/cli/) and the build-validate-register composition sit above every layer."""


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `pipelines.…` import in a file, including those inside functions."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("pipelines"):
            mod = node.module
            out += [(node.lineno, f"{mod}.{a.name}" if mod in ("pipelines", *(f"pipelines.{p}" for p in LAYERS)) else mod)
                    for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("pipelines")]
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "flows":
            out.append((node.lineno, node.module or "flows"))
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _violations(root: Path) -> list[str]:
    bad = []
    for path in sorted(root.glob("*/**/*.py")):
        here = path.relative_to(root).parts[0]
        if here not in LAYERS:
            continue
        for line, module in _imports(path):
            there = _layer(module)
            if module.split(".")[0] == "flows":
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}: the library never imports flows/")
            elif module.split(".")[1] in TOP:
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}, above every layer")
            elif there and there != here and LAYERS[there] >= LAYERS[here]:
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}: {there} is not below {here}")
    return bad


def test_imports_point_down_the_layers() -> None:
    assert _violations(Path(pipelines.__file__).parent) == []


def test_the_layer_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The check itself can fail: a core module importing a publisher, a build importing the CLI, a module of a
    package nested in a layer (chat/families/) importing a publisher, and the registry's rooms reaching up: the store
    calling the signer (trust reads manifests, so the store never imports trust), trust calling registration, the
    serving advice reading the OCI publisher, the OCI publisher importing the site."""
    for pkg, text in {"core": "from pipelines.publish.ollama import x\n", "gguf": "def f():\n    from pipelines.cli import main\n",
                      "chat": "from pipelines.source import catalog\n", "registry": "from pipelines.core.steps import y\n",
                      "chat/families": "from pipelines.publish import ollama\nfrom pipelines.chat import jinja\n",
                      "publish": "def f():\n    from flows.convert import convert\n",
                      "store": "from pipelines.trust import signing\n",
                      "trust": "def f():\n    from pipelines.registry.register import place\n",
                      "advice": "from pipelines.oci.images import publications\nfrom pipelines.store import manifest\n",
                      "oci": "from pipelines.site.build import build_site\n"}.items():
        (tmp_path / "pipelines" / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / "pipelines" / pkg / "m.py").write_text(text)
    found = _violations(tmp_path / "pipelines")
    assert found == [
        "pipelines/advice/m.py:1 imports pipelines.oci.images: oci is not below advice",
        "pipelines/chat/families/m.py:1 imports pipelines.publish.ollama: publish is not below chat",
        "pipelines/chat/m.py:1 imports pipelines.source.catalog: source is not below chat",
        "pipelines/core/m.py:1 imports pipelines.publish.ollama: publish is not below core",
        "pipelines/gguf/m.py:2 imports pipelines.cli, above every layer",
        "pipelines/oci/m.py:1 imports pipelines.site.build: site is not below oci",
        "pipelines/publish/m.py:2 imports flows.convert: the library never imports flows/",
        "pipelines/store/m.py:1 imports pipelines.trust.signing: trust is not below store",
        "pipelines/trust/m.py:2 imports pipelines.registry.register: registry is not below trust",
    ]


def test_no_module_outside_a_layer_but_the_top() -> None:
    root = Path(pipelines.__file__).parent
    loose = {p.stem for p in root.glob("*.py")} - TOP
    assert loose == set(), f"modules outside every sub-package: {sorted(loose)}"
    assert {p.name for p in root.iterdir() if (p / "__init__.py").is_file()} == {*LAYERS, "scripts", "cli"}


def _cli_violations(cli: Path) -> list[str]:
    """A command module (pipelines/cli/<group>.py) importing another one: commands share only the private modules
    (_app: the app and its consoles; _edge: the error edge; _tables), so each group stays a thin layer over the
    library and moves or goes without touching the others."""
    bad = []
    for path in sorted(cli.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module + "." + a.name if node.module == "pipelines.cli" else node.module
                         for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for module in names:
                parts = module.split(".")
                if parts[:2] == ["pipelines", "cli"] and (len(parts) < 3 or not parts[2].startswith("_")):
                    bad.append(f"{path.name}:{node.lineno} imports {module}, another command module")
    return bad


def test_command_modules_share_only_the_private_ones() -> None:
    cli = Path(pipelines.__file__).parent / "cli"
    assert _cli_violations(cli) == []
    commands = {p.stem for p in cli.glob("*.py") if not p.stem.startswith("_")}
    assert {"build", "registry", "plan", "stack"} <= commands  # the groups the CLI is made of


def test_the_command_module_check_finds_one_importing_another(tmp_path: Path) -> None:
    (tmp_path / "build.py").write_text("from pipelines.cli._app import app\nfrom pipelines.cli.plan import plan_cmd\n")
    (tmp_path / "plan.py").write_text("def f():\n    from pipelines.cli import build\n")
    assert _cli_violations(tmp_path) == ["build.py:2 imports pipelines.cli.plan, another command module",
                                         "plan.py:2 imports pipelines.cli.build, another command module"]


# ---------------------------------------------------------------- no import cycles, pipelines/ and flows/ together

KNOWN_CYCLES: list[set[str]] = []


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name → file of every module under root's pipelines/ and flows/ (a package is its __init__.py)."""
    out = {}
    for base in ("pipelines", "flows"):
        for path in sorted((root / base).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the modules it imports anywhere in its file: at the top, inside functions (lazy), under
    TYPE_CHECKING. `from a.b import c` is an edge to a.b.c where that is a module, else to a.b."""
    mods = _modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            graph[mod] |= {t for n in names if (t := resolve(n)) and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(component)
    return sorted(found, key=sorted)


def test_no_import_cycles_in_pipelines_and_flows() -> None:
    """A cycle closed only by a lazy import turns into an ImportError the day one of its imports moves to the top."""
    found = cycles(import_graph(ROOT))
    assert [sorted(c) for c in found if c not in KNOWN_CYCLES] == []
    assert [sorted(c) for c in KNOWN_CYCLES if c not in found] == [], "a known cycle is gone: remove it from KNOWN_CYCLES"


def test_the_cycle_check_finds_lazy_type_checking_and_relative_cycles(tmp_path: Path) -> None:
    files = {
        "pipelines/__init__.py": "",
        "pipelines/core/__init__.py": "",
        "pipelines/core/a.py": "def f():\n    from pipelines.core.b import g\n",
        "pipelines/core/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipelines.core import a\n",
        "pipelines/core/c.py": "from pipelines.core.errors import E\n",
        "pipelines/chat/__init__.py": "",
        "pipelines/chat/x.py": "from . import y\n",
        "pipelines/chat/y.py": "from .x import z\n",
        "flows/__init__.py": "",
        "flows/one.py": "import flows.two\n",
        "flows/two.py": "from flows import one\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert [sorted(c) for c in cycles(import_graph(tmp_path))] == [
        ["flows.one", "flows.two"], ["pipelines.chat.x", "pipelines.chat.y"], ["pipelines.core.a", "pipelines.core.b"],
    ]
