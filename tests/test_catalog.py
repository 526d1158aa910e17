"""The catalog refuses what it cannot build, before any tool runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.core.errors import CatalogEntryNotFound, ConfigError
from pipelines.core.settings import project_root
from pipelines.source.catalog import GeneratedSource, HubSource, load_catalog

COMMIT = "7ae557604adf67be50417f59c2c2f167def9a775"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "catalog.yaml"
    p.write_text(text)
    return p


def test_shipped_catalog_has_the_promised_entries() -> None:
    catalog = load_catalog(project_root() / "registry" / "catalog.yaml")
    qwen = catalog.get("qwen2.5")
    assert isinstance(qwen.source, HubSource)
    assert qwen.source.repo == "Qwen/Qwen2.5-0.5B-Instruct" and qwen.source.revision == COMMIT
    assert catalog.get("llama3.2").gated
    tiny = catalog.get("tiny-qwen2")
    assert isinstance(tiny.source, GeneratedSource) and tiny.gate_profile == "tiny"
    assert tiny.variants.gguf is not None and "q4_k_m" in tiny.variants.gguf.quants


def test_unknown_name_lists_known_ones() -> None:
    catalog = load_catalog(project_root() / "registry" / "catalog.yaml")
    with pytest.raises(CatalogEntryNotFound) as exc:
        catalog.get("qwen3")
    assert "qwen2.5" in str(exc.value) and "modelmint catalog list" in str(exc.value)


def test_typo_in_a_key_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, f"""
models:
  - name: m
    source: {{repo: a/b, revision: {COMMIT}}}
    license: mit
    varaints: {{}}
""")
    with pytest.raises(ConfigError, match="varaints"):
        load_catalog(path)


@pytest.mark.parametrize("revision", ["main", "7ae5576", "v1.0", COMMIT.upper()])
def test_revision_must_be_a_40_hex_commit(tmp_path: Path, revision: str) -> None:
    path = _write(tmp_path, f"""
models:
  - name: m
    source: {{repo: a/b, revision: "{revision}"}}
    license: mit
""")
    with pytest.raises(ConfigError, match="40-hex commit"):
        load_catalog(path)


def test_unknown_quant_type_and_duplicates(tmp_path: Path) -> None:
    base = f"""
models:
  - name: m
    source: {{repo: a/b, revision: {COMMIT}}}
    license: mit
    variants: {{gguf: {{quants: QUANTS}}}}
"""
    with pytest.raises(ConfigError, match="q4_k_mm"):
        load_catalog(_write(tmp_path, base.replace("QUANTS", "[q4_k_mm]")))
    with pytest.raises(ConfigError, match="duplicate"):
        load_catalog(_write(tmp_path, base.replace("QUANTS", "[q8_0, Q8_0]")))
    ok = load_catalog(_write(tmp_path, base.replace("QUANTS", "[Q5_K_M]")))
    assert ok.get("m").variants.gguf.quants == ["q5_k_m"]  # type: ignore[union-attr]


def test_duplicate_names_and_bad_yaml(tmp_path: Path) -> None:
    entry = f"  - {{name: m, source: {{repo: a/b, revision: {COMMIT}}}, license: mit}}\n"
    with pytest.raises(ConfigError, match="duplicate catalog names"):
        load_catalog(_write(tmp_path, "models:\n" + entry + entry))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_catalog(_write(tmp_path, "models: [\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_catalog(tmp_path / "missing.yaml")


def test_with_quants_revalidates() -> None:
    entry = load_catalog(project_root() / "registry" / "catalog.yaml").get("qwen2.5")
    assert entry.with_quants(["Q6_K"]).variants.gguf.quants == ["q6_k"]  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"'q9_k' is not a llama\.cpp quant type"):
        entry.with_quants(["q9_k"])
