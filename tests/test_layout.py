"""The package layout is the architecture: sub-packages by concern, and imports point down the layers only.

A newcomer finds any step's single implementation from the folder names; a module that reaches up a layer (a
build importing a publisher, a reader importing a build) is the first step back to the copies this layout ended.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pipelines

LAYERS = {"core": 0, "source": 1, "chat": 1, "gguf": 2, "compressed": 2, "publish": 3, "registry": 4}
"""Lower numbers are imported by higher ones; the same number means neither imports the other."""
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
            if module.split(".")[1] in TOP:
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}, above every layer")
            elif there and there != here and LAYERS[there] >= LAYERS[here]:
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}: {there} is not below {here}")
    return bad


def test_imports_point_down_the_layers() -> None:
    assert _violations(Path(pipelines.__file__).parent) == []


def test_the_layer_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The check itself can fail: a core module importing a publisher, a build importing the CLI, and a module of a
    package nested in a layer (chat/families/) importing a publisher."""
    for pkg, text in {"core": "from pipelines.publish.ollama import x\n", "gguf": "def f():\n    from pipelines.cli import main\n",
                      "chat": "from pipelines.source import catalog\n", "registry": "from pipelines.core.steps import y\n",
                      "chat/families": "from pipelines.publish import ollama\nfrom pipelines.chat import jinja\n"}.items():
        (tmp_path / "pipelines" / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / "pipelines" / pkg / "m.py").write_text(text)
    found = _violations(tmp_path / "pipelines")
    assert found == [
        "pipelines/chat/families/m.py:1 imports pipelines.publish.ollama: publish is not below chat",
        "pipelines/chat/m.py:1 imports pipelines.source.catalog: source is not below chat",
        "pipelines/core/m.py:1 imports pipelines.publish.ollama: publish is not below core",
        "pipelines/gguf/m.py:2 imports pipelines.cli, above every layer",
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
