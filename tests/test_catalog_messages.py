"""Catalog and --variants mistakes are reported as people read them: the entry by name, the line, the nearest
known name, one problem per mistake, never pydantic's raw text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.core.errors import ConfigError
from pipelines.core.settings import project_root
from pipelines.source.catalog import check_quant_types, did_you_mean, load_catalog, parse_quants

COMMIT = "7ae557604adf67be50417f59c2c2f167def9a775"
MODELMINT = str(Path(sys.executable).parent / "modelmint")
PYDANTIC_NOISE = ("For further information", "pydantic", "Value error", "HubSource", "LocalSource",
                  "GeneratedSource", "models.0", "models.2")


def _load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_catalog(path)
    message = exc.value.message
    for noise in PYDANTIC_NOISE:
        assert noise not in message, message
    assert exc.value.hint is not None and "modelmint catalog list" in exc.value.hint
    return message


def test_an_unknown_key_names_the_entry_the_line_and_the_nearest_key(tmp_path: Path) -> None:
    message = _load_error(tmp_path, f"""models:
  - name: a
    source: {{generated: tiny-qwen2}}
    license: mit
  - name: b
    source: {{repo: a/b, revision: {COMMIT}}}
    license: mit
  - name: c
    source: {{generated: tiny-qwen2}}
    license: mit
    chat_famly: chatml
""")
    assert message.endswith("is invalid: line 11, entry 'c': unknown key 'chat_famly' (did you mean 'chat_family'?)")


def test_a_bad_revision_is_reported_alone(tmp_path: Path) -> None:
    message = _load_error(tmp_path, """models:
  - name: m
    source: {repo: a/b, revision: main}
    license: mit
""")
    assert "line 3, entry 'm', source.revision: revision 'main' is not a 40-hex commit" in message
    assert "problems" not in message and "Field required" not in message and "missing key" not in message


def test_a_source_of_no_known_kind(tmp_path: Path) -> None:
    message = _load_error(tmp_path, """models:
  - name: m
    source: {hub: a/b}
    license: mit
  - name: n
    source: {repo: a/b, path: /models/n}
    license: mit
""")
    assert "2 problems" in message
    assert "line 3, entry 'm', source: a source is exactly one of: `repo` with `revision`" in message
    assert "line 6, entry 'n', source: a source is exactly one of" in message


def test_a_misspelt_key_inside_a_source_and_a_missing_one(tmp_path: Path) -> None:
    message = _load_error(tmp_path, f"""models:
  - name: m
    source:
      repo: a/b
      revison: {COMMIT}
    license: mit
""")
    assert "line 5, entry 'm', source: unknown key 'revison' (did you mean 'revision'?)" in message
    assert "line 3, entry 'm', source: missing key 'revision'" in message


def test_an_unknown_quant_type_in_the_catalog(tmp_path: Path) -> None:
    message = _load_error(tmp_path, f"""models:
  - name: m
    source: {{repo: a/b, revision: {COMMIT}}}
    license: mit
    variants:
      gguf:
        quants: [q8_0, q4_k_z]
""")
    assert ("line 7, entry 'm', variants.gguf.quants: 'q4_k_z' is not a llama.cpp quant type "
            "(did you mean 'q4_k_m'?)") in message


def test_an_entry_without_a_name_and_a_misspelt_top_level_key(tmp_path: Path) -> None:
    message = _load_error(tmp_path, """models:
  - source: {generated: tiny-qwen2}
    license: mit
    gate_profile: small
""")
    assert "line 2, entry #1: missing key 'name'" in message
    assert "line 4, entry #1, gate_profile: Input should be 'reference' or 'tiny'" in message
    message = _load_error(tmp_path, "model: []\n")
    assert "line 1: unknown key 'model' (did you mean 'models'?)" in message


def test_did_you_mean() -> None:
    assert did_you_mean("q4_k_z", ["q4_k_s", "q4_k_m", "q8_0"], preferred=["q4_k_m"]) == "q4_k_m"
    assert did_you_mean("q4_k_z", ["q4_k_s", "q4_k_m", "q8_0"]) in ("q4_k_s", "q4_k_m")
    assert did_you_mean("awk", ["gguf", "fp8", "awq"]) == "awq"
    assert did_you_mean("q9_z", ["q4_k_m", "q8_0", "q6_k"]) is None


@pytest.mark.parametrize(("text", "message", "hint"), [
    ("q8_0,q8_0", "--variants q8_0,q8_0: duplicate quant type 'q8_0'", "name each type once, e.g. --variants q8_0"),
    ("q9_z", "--variants q9_z: 'q9_z' is not a llama.cpp quant type", "llama.cpp's quant types: iq1_m"),
    ("Q4_K_Z,q8_0", "'q4_k_z' is not a llama.cpp quant type (did you mean 'q4_k_m'?)", "q4_k_m"),
    (" , ", "--variants is empty", "--variants q4_k_m,q8_0"),
])
def test_parse_quants_refuses(text: str, message: str, hint: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_quants(text)
    assert message in exc.value.message and "\n" not in exc.value.message
    assert exc.value.hint is not None and hint in exc.value.hint


def test_parse_quants_accepts() -> None:
    assert parse_quants(" Q4_K_M, q8_0") == ["q4_k_m", "q8_0"]
    assert check_quant_types(["Q6_K"]) == ["q6_k"]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MODELMINT_WORK_DIR": str(tmp_path / "work"), "COLUMNS": "400",
           "MODELMINT_CATALOG": str(project_root() / "registry" / "catalog.yaml")}
    return subprocess.run([MODELMINT, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("variants", "says"), [
    ("q8_0,q8_0", "error: --variants q8_0,q8_0: duplicate quant type 'q8_0'"),
    ("q9_z", "error: --variants q9_z: 'q9_z' is not a llama.cpp quant type"),
    ("q4_k_z", "error: --variants q4_k_z: 'q4_k_z' is not a llama.cpp quant type (did you mean 'q4_k_m'?)"),
])
@pytest.mark.parametrize("register", [False, True], ids=["build", "register"])
def test_cli_variants_errors_are_one_line(tmp_path: Path, variants: str, says: str, register: bool) -> None:
    proc = _cli(tmp_path, "convert", "tiny-qwen2", "--variants", variants, *(["--register"] if register else []))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[0] == says and lines[1].startswith("→ "), proc.stderr
    for noise in (*PYDANTIC_NOISE, "Traceback", "catalog.yaml", "dvc.yaml"):
        assert noise not in proc.stderr, proc.stderr
    assert not (tmp_path / "work").exists()  # refused before anything was fetched or built


def test_a_catalog_path_naming_a_directory_or_a_binary_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory, not a YAML file") as exc:
        load_catalog(tmp_path)
    assert exc.value.hint is not None and "MODELMINT_CATALOG=" in exc.value.hint
    binary = tmp_path / "catalog.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match="is not a text catalog"):
        load_catalog(binary)
