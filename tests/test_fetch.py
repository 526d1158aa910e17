"""The fetch step with the real huggingface_hub client against a local Hub-compatible server."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hubserver import HubServer
from pydantic import ValidationError

import pipelines.core.fsutil
from pipelines.core.errors import ArtifactError, ConfigError, HubUnavailable, IntegrityError, SourceError
from pipelines.core.safetensorsheader import read_safetensors_header
from pipelines.core.settings import Settings, project_root
from pipelines.source.catalog import CatalogEntry, HubSource, load_catalog
from pipelines.source.fetch import fetch

TOKEN = "hf_modelmintTESTtoken0123456789abcdef"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_FILES = {
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "README.md",
    "LICENSE",
}


# ---------------------------------------------------------------- a tiny model, written by hand


def safetensors_bytes(
    tensors: dict[str, tuple[str, np.ndarray]], metadata: dict[str, str] | None = None
) -> bytes:
    """Safetensors by hand: u64 LE header length, JSON header, then the tensors' bytes back to back."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header with spaces to an 8-byte boundary
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def _bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype("<f4").view("<u4") >> 16).astype("<u2")


def tiny_weights(seed: int = 0, prefix: str = "") -> bytes:
    rng = np.random.default_rng(seed)
    return safetensors_bytes(
        {
            f"{prefix}model.embed_tokens.weight": ("F32", rng.standard_normal((16, 8)).astype("<f4")),
            f"{prefix}model.norm.weight": ("F16", np.ones(8, dtype="<f2")),
            f"{prefix}lm_head.weight": ("BF16", _bf16(rng.standard_normal((16, 8)))),
        },
        metadata={"format": "pt"},
    )


def tiny_model_files(**config_extra: Any) -> dict[str, bytes]:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 0,
        "vocab_size": 16,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        **config_extra,
    }
    return {
        "model.safetensors": tiny_weights(),
        "config.json": json.dumps(config, indent=2).encode(),
        "generation_config.json": json.dumps(
            {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}
        ).encode(),
        "tokenizer.json": json.dumps(
            {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}
        ).encode(),
        "tokenizer_config.json": json.dumps(
            {"bos_token": "<s>", "eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE}
        ).encode(),
        "special_tokens_map.json": json.dumps({"eos_token": "<|im_end|>"}).encode(),
        "chat_template.jinja": CHAT_TEMPLATE.encode(),
        "README.md": b"# tiny\n",
        "LICENSE": b"Apache-2.0\n",
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    }


def write_dir(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def make_entry(source: dict[str, Any], **extra: Any) -> CatalogEntry:
    return CatalogEntry.model_validate({"name": "tiny", "source": source, "license": "apache-2.0", **extra})


# ---------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every huggingface_hub cache, token and endpoint setting points into this test's tmp dir."""
    import huggingface_hub.constants as hf_constants

    hf_home = tmp_path / "hf_home"
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(hf_constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(hf_home / "token"))
    monkeypatch.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(hf_home / "stored_tokens"))


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def settings(tmp_path: Path, hub: HubServer) -> Settings:
    return Settings(
        home=tmp_path / "home",
        work_dir=tmp_path / "work",
        catalog_path=tmp_path / "registry" / "catalog.yaml",
        hf_endpoint=hub.endpoint,
        hf_token=None,
    )


@pytest.fixture
def sha256_calls(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every full read-and-hash HashCache does (fsutil.file_digests), recorded."""
    calls: list[Path] = []
    real = pipelines.core.fsutil.file_digests

    def counting(path: Path) -> tuple[str, str]:
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(pipelines.core.fsutil, "file_digests", counting)
    return calls


def _hub_entry(repo_id: str, revision: str | None, **extra: Any) -> CatalogEntry:
    return make_entry({"repo": repo_id, "revision": revision}, **extra)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- the hub, happy paths


def test_fetch_at_pinned_commit(hub: HubServer, settings: Settings) -> None:
    files = tiny_model_files() | {"pytorch_model.bin": b"\x80\x02 a pickle modelmint must never fetch"}
    repo = hub.add_repo("acme/tiny", files)

    snap = fetch(_hub_entry("acme/tiny", repo.commit), settings)

    assert (snap.kind, snap.repo_id, snap.revision) == ("hub", "acme/tiny", repo.commit)
    assert set(snap.files) == MODEL_FILES  # no .bin, no .gitattributes
    for name, digest in snap.files.items():
        assert digest == _sha(files[name]), name
        assert (snap.path / name).read_bytes() == files[name]
    assert snap.path.is_relative_to(settings.home / "hub")
    assert not any(p.endswith(".bin") for p in hub.touched())
    info_calls = [r for r in hub.requests if r.path.startswith("/api/models/acme/tiny/revision/")]
    assert info_calls and info_calls[0].query.get("blobs") == ["true"]
    # the weights came through the LFS redirect, like the real hub's CDN
    assert any(r.server == "cdn" and r.path.endswith("/model.safetensors") for r in hub.requests)


def test_sharded_repo_takes_only_the_indexed_shards(hub: HubServer, settings: Settings) -> None:
    shards = {
        "model-00001-of-00002.safetensors": tiny_weights(1, "a."),
        "model-00002-of-00002.safetensors": tiny_weights(2, "b."),
    }
    weight_map = {name: shard for shard, data in shards.items() for name in read_header_names(data)}
    files = (
        tiny_model_files()
        | shards
        | {
            "model.safetensors.index.json": json.dumps({"metadata": {}, "weight_map": weight_map}).encode(),
            "consolidated.safetensors": tiny_weights(3),  # Mistral-style duplicate: not named by the index
            "original/params.json": b"{}",
        }
    )
    del files["model.safetensors"]
    repo = hub.add_repo("acme/sharded", files)

    snap = fetch(_hub_entry("acme/sharded", repo.commit), settings)

    assert set(shards) | {"model.safetensors.index.json"} <= set(snap.files)
    assert "consolidated.safetensors" not in snap.files
    assert "consolidated.safetensors" not in hub.touched() and "original/params.json" not in hub.touched()


def read_header_names(data: bytes) -> list[str]:
    (n,) = struct.unpack("<Q", data[:8])
    return [k for k in json.loads(data[8 : 8 + n]) if k != "__metadata__"]


def test_refetch_of_unchanged_snapshot_neither_downloads_nor_rehashes(
    hub: HubServer, settings: Settings, sha256_calls: list[Path]
) -> None:
    repo = hub.add_repo("acme/tiny", tiny_model_files())
    entry = _hub_entry("acme/tiny", repo.commit)

    first = fetch(entry, settings)
    hashed_first = len(sha256_calls)
    downloads_first = len(hub.downloaded())
    second = fetch(entry, settings)

    assert hashed_first == len(MODEL_FILES)
    assert len(sha256_calls) == hashed_first, "unchanged files were hashed again"
    assert len(hub.downloaded()) == downloads_first
    assert second == first
    assert (settings.home / "hashcache.json").is_file()


# ---------------------------------------------------------------- integrity


def test_sha256_mismatch_raises_and_leaves_nothing_trusted(hub: HubServer, settings: Settings) -> None:
    files = tiny_model_files()
    repo = hub.add_repo("acme/liar", files, lie_about={"model.safetensors"})
    entry = _hub_entry("acme/liar", repo.commit)

    with pytest.raises(IntegrityError) as exc:
        fetch(entry, settings)

    err = exc.value
    assert err.path == "model.safetensors" and err.actual == _sha(files["model.safetensors"])
    assert err.expected == repo.advertised_sha256("model.safetensors") != err.actual
    assert (err.repo_id, err.revision) == ("acme/liar", repo.commit)
    assert "rerun" in (err.hint or "")
    cached = [p for p in (settings.home / "hub").rglob("*") if p.is_file() or p.is_symlink()]
    assert not [p for p in cached if p.name in ("model.safetensors", err.expected)], cached

    # still lying: a rerun downloads again and fails again, never returning a snapshot
    with pytest.raises(IntegrityError):
        fetch(entry, settings)
    assert hub.downloaded().count("model.safetensors") == 2

    # the upstream fixed: the same command now succeeds with a fresh download
    repo.lie_about = frozenset()
    snap = fetch(entry, settings)
    assert snap.files["model.safetensors"] == _sha(files["model.safetensors"])
    assert hub.downloaded().count("model.safetensors") == 3


def test_corrupt_upstream_weights_are_a_source_error(hub: HubServer, settings: Settings) -> None:
    files = tiny_model_files()
    files["model.safetensors"] = files["model.safetensors"][:-5]  # published truncated: sha256 matches
    repo = hub.add_repo("acme/broken", files)

    with pytest.raises(SourceError) as exc:
        fetch(_hub_entry("acme/broken", repo.commit), settings)

    assert not isinstance(exc.value, IntegrityError)
    assert "model.safetensors" in str(exc.value) and "truncated" in str(exc.value)
    assert "pin another revision" in (exc.value.hint or "")


# ---------------------------------------------------------------- refusals and hub errors


def test_unknown_repo(hub: HubServer, settings: Settings) -> None:
    with pytest.raises(SourceError) as exc:
        fetch(_hub_entry("acme/nope", "a" * 40), settings)
    assert not isinstance(exc.value, HubUnavailable)
    assert "acme/nope not found" in str(exc.value) and "HF_TOKEN" in str(exc.value)
    assert exc.value.repo_id == "acme/nope"


def test_unknown_revision(hub: HubServer, settings: Settings) -> None:
    hub.add_repo("acme/tiny", tiny_model_files())
    with pytest.raises(SourceError) as exc:
        fetch(_hub_entry("acme/tiny", "b" * 40), settings)
    assert f"no commit {'b' * 40}" in str(exc.value)
    assert not hub.downloaded()


def test_revision_must_be_a_40_hex_commit(hub: HubServer, settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="40-hex"):
        _hub_entry("acme/tiny", "main")
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "models:\n  - name: tiny\n    license: mit\n    source: {repo: acme/tiny, revision: v1.0}\n"
    )
    with pytest.raises(ConfigError, match="40-hex"):
        load_catalog(catalog)

    repo = hub.add_repo("acme/tiny", tiny_model_files())
    with pytest.raises(SourceError, match="not a 40-hex commit"):
        fetch(_hub_entry("acme/tiny", repo.commit), settings, revision="main")
    # a source that slipped past validation is refused at fetch too
    unchecked = _hub_entry("acme/tiny", None).model_copy(
        update={"source": HubSource.model_construct(repo="acme/tiny", revision=repo.commit[:12])}
    )
    with pytest.raises(SourceError, match="not a 40-hex commit"):
        fetch(unchecked, settings)
    assert hub.requests == []


def test_unpinned_revision_says_how_to_pin(hub: HubServer, settings: Settings) -> None:
    with pytest.raises(SourceError) as exc:
        fetch(_hub_entry("acme/tiny", None), settings)
    assert "not pinned" in str(exc.value)
    assert "hf models info acme/tiny" in (exc.value.hint or "") and "source.revision" in (
        exc.value.hint or ""
    )
    assert hub.requests == []


def test_gated_without_token_is_refused_clearly(hub: HubServer, settings: Settings) -> None:
    repo = hub.add_repo("meta/gated", tiny_model_files(), gated=True)
    with pytest.raises(SourceError) as exc:
        fetch(_hub_entry("meta/gated", repo.commit), settings)
    assert "gated" in str(exc.value) and "no HF_TOKEN" in str(exc.value)
    assert "accept the licence" in (exc.value.hint or "") and f"{hub.endpoint}/meta/gated" in (
        exc.value.hint or ""
    )
    assert not hub.downloaded()


def test_gated_with_token_succeeds_and_the_token_never_leaks(
    hub: HubServer, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="huggingface_hub")
    repo = hub.add_repo("meta/gated", tiny_model_files(), gated=True)
    entry = _hub_entry("meta/gated", repo.commit, gated=True)

    # a wrong token: refused, and neither the message, the chained causes nor the logs show it
    wrong = "hf_wrongTOKENwrongTOKENwrong0000"
    with pytest.raises(SourceError) as exc:
        fetch(entry, _with_token(settings, wrong))
    shown = "".join(traceback.format_exception(exc.value)) + str(exc.value.hint)
    assert "token rejected" in str(exc.value) and not hub.downloaded()
    assert wrong not in shown and wrong not in caplog.text and wrong not in repr(_with_token(settings, wrong))

    snap = fetch(entry, _with_token(settings, TOKEN))

    assert set(snap.files) == MODEL_FILES
    resolves = [r for r in hub.requests if r.server == "hub" and "/resolve/" in r.path]
    assert resolves and resolves[-1].headers.get("authorization") == f"Bearer {TOKEN}"
    assert all("authorization" not in r.headers for r in hub.requests if r.server == "cdn")
    assert TOKEN not in caplog.text


def _with_token(settings: Settings, token: str) -> Settings:
    return Settings(
        home=settings.home,
        work_dir=settings.work_dir,
        catalog_path=settings.catalog_path,
        hf_endpoint=settings.hf_endpoint,
        hf_token=token,
    )


def test_pickle_only_repo_is_refused_before_any_download(hub: HubServer, settings: Settings) -> None:
    files = tiny_model_files()
    del files["model.safetensors"]
    files["pytorch_model.bin"] = b"\x80\x02}q\x00."
    repo = hub.add_repo("acme/pickles", files)

    with pytest.raises(SourceError) as exc:
        fetch(_hub_entry("acme/pickles", repo.commit), settings)

    assert "pickle" in str(exc.value) and "pytorch_model.bin" in str(exc.value)
    assert hub.touched() == []


@pytest.mark.parametrize("how", ["auto_map", "py_file"])
def test_remote_code_needs_trust(hub: HubServer, settings: Settings, how: str) -> None:
    if how == "auto_map":
        files = tiny_model_files(auto_map={"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"})
    else:
        files = tiny_model_files()
    files["modeling_tiny.py"] = b"raise SystemExit('remote code ran')\n"
    repo = hub.add_repo("acme/custom", files)

    with pytest.raises(SourceError) as exc:
        fetch(_hub_entry("acme/custom", repo.commit), settings)
    assert "custom model code" in str(exc.value) and "trust_remote_code: true" in (exc.value.hint or "")
    assert hub.touched() == []

    snap = fetch(_hub_entry("acme/custom", repo.commit, trust_remote_code=True), settings)
    assert "modeling_tiny.py" in snap.files


def test_repo_without_config_is_refused_before_download(hub: HubServer, settings: Settings) -> None:
    files = tiny_model_files()
    del files["config.json"]
    repo = hub.add_repo("acme/noconfig", files)
    with pytest.raises(SourceError, match=r"has no config\.json"):
        fetch(_hub_entry("acme/noconfig", repo.commit), settings)
    assert hub.touched() == []


def test_hub_5xx_is_transient(hub: HubServer, settings: Settings) -> None:
    repo = hub.add_repo("acme/tiny", tiny_model_files())
    hub.fail_status = 503
    with pytest.raises(HubUnavailable) as exc:
        fetch(_hub_entry("acme/tiny", repo.commit), settings)
    assert exc.value.transient


def test_unreachable_hub_is_transient(settings: Settings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    offline = Settings(
        home=settings.home, work_dir=settings.work_dir, catalog_path=settings.catalog_path, hf_endpoint=closed
    )
    with pytest.raises(HubUnavailable) as exc:
        fetch(_hub_entry("acme/tiny", "c" * 40), offline)
    assert exc.value.transient and "could not be reached" in str(exc.value)


# ---------------------------------------------------------------- local and generated sources


def test_local_source(tmp_path: Path, settings: Settings, hub: HubServer) -> None:
    files = tiny_model_files() | {"pytorch_model.bin": b"\x80\x02."}
    model = write_dir(settings.catalog_path.parent / "models" / "tiny", files)

    snap = fetch(make_entry({"path": "models/tiny"}), settings)  # relative to the catalog's folder

    assert (snap.kind, snap.path, snap.repo_id, snap.revision) == ("local", model, None, None)
    assert set(snap.files) == MODEL_FILES
    assert all(snap.files[n] == _sha(files[n]) for n in snap.files)
    assert hub.requests == []


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: (d / "config.json").unlink(), "has no config.json"),
        (lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), "only pickle weights"),
        (lambda d: (d / "model.safetensors").unlink(), "no .safetensors weights"),
        (lambda d: (d / "config.json").write_text("{not json"), "not readable JSON"),
        (lambda d: (d / "tokenization_tiny.py").write_text("import os\n"), "custom model code"),
        (
            lambda d: (d / "config.json").write_text('{"auto_map": {"AutoConfig": "c.C"}}'),
            "custom model code",
        ),
    ],
    ids=["no-config", "pickle-only", "no-weights", "bad-config", "py-file", "auto-map"],
)
def test_local_source_refusals(tmp_path: Path, settings: Settings, mutate: Any, message: str) -> None:
    model = write_dir(tmp_path / "m", tiny_model_files())
    mutate(model)
    with pytest.raises(SourceError, match=message):
        fetch(make_entry({"path": str(model)}), settings)


def test_local_source_missing_directory(tmp_path: Path, settings: Settings) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        fetch(make_entry({"path": str(tmp_path / "absent")}), settings)


def test_truncated_safetensors(tmp_path: Path, settings: Settings) -> None:
    model = write_dir(tmp_path / "m", tiny_model_files())
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(SourceError) as exc:
        fetch(make_entry({"path": str(model)}), settings)
    assert str(weights) in str(exc.value) and "truncated" in str(exc.value)
    assert "copy it" in (exc.value.hint or "") and "`modelmint fetch tiny`" in (exc.value.hint or "")
    assert isinstance(exc.value.__cause__, ArtifactError)


def test_corrupt_safetensors_header(tmp_path: Path, settings: Settings) -> None:
    model = write_dir(tmp_path / "m", tiny_model_files())
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:24] = b"\x00garbage\xff\xfe!!!!!!!"
    weights.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"model\.safetensors has a corrupt header"):
        fetch(make_entry({"path": str(model)}), settings)


def test_index_naming_a_missing_shard(tmp_path: Path, settings: Settings) -> None:
    files = tiny_model_files() | {
        "model.safetensors.index.json": json.dumps(
            {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}
        ).encode()
    }
    model = write_dir(tmp_path / "m", files)
    with pytest.raises(SourceError, match=r"model-00002-of-00002\.safetensors"):
        fetch(make_entry({"path": str(model)}), settings)


def test_generated_source_is_checked_like_a_local_one(
    tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pipelines.source.tinymodel builds real tiny models (its own tests cover that); here only the dispatch matters.
    made = write_dir(tmp_path / "generated" / "tiny-qwen2", tiny_model_files())
    calls: list[tuple[str, Settings]] = []

    def ensure_tiny_model(name: str, s: Settings) -> Path:
        calls.append((name, s))
        return made

    monkeypatch.setitem(
        sys.modules, "pipelines.source.tinymodel", types.SimpleNamespace(ensure_tiny_model=ensure_tiny_model)
    )
    snap = fetch(make_entry({"generated": "tiny-qwen2"}), settings)
    assert calls == [("tiny-qwen2", settings)]
    assert (snap.kind, snap.path, set(snap.files)) == ("generated", made, MODEL_FILES)
    with pytest.raises(SourceError, match="not a hub source"):
        fetch(make_entry({"generated": "tiny-qwen2"}), settings, revision="a" * 40)


# ---------------------------------------------------------------- the header reader itself


def test_read_safetensors_header_returns_the_header(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(tiny_weights())
    header = read_safetensors_header(path)
    assert header["__metadata__"] == {"format": "pt"}
    assert header["lm_head.weight"]["dtype"] == "BF16" and header["lm_head.weight"]["shape"] == [16, 8]


@pytest.mark.parametrize(
    ("tensors", "tail", "message"),
    [
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
            b"\0" * 12,
            "bytes after the last tensor",
        ),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "truncated"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, "contiguous"),
        ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "unknown dtype"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "does not match its dtype and shape"),
        ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, r'expected usize.*"shape": \[-2'),
        ({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "missing field `data_offsets`"),
        ({"__metadata__": {"n": 1}}, b"", r"expected a string.*__metadata__"),
        # four F4 values would be two bytes; three end mid-byte, which the format does not allow
        ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0" * 2, "byte boundary"),
    ],
)
def test_read_safetensors_header_rejects(
    tmp_path: Path, tensors: dict[str, Any], tail: bytes, message: str
) -> None:
    text = json.dumps(tensors).encode()
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + tail)
    with pytest.raises(ArtifactError, match=message):
        read_safetensors_header(path)


def test_a_header_that_passed_is_not_checked_again_until_the_file_changes(tmp_path: Path) -> None:
    from pipelines.core.fsutil import HashCache

    hashes = HashCache(tmp_path / "hashcache.json")
    path = tmp_path / "w.safetensors"
    path.write_bytes(tiny_weights())
    assert not hashes.checked(path, "safetensors-header")
    header = read_safetensors_header(path, hashes)
    assert hashes.checked(path, "safetensors-header")
    assert read_safetensors_header(path, HashCache(tmp_path / "hashcache.json")) == header  # remembered on disk
    # the same file with bytes after its last tensor: another size, so the library checks it again and refuses it
    path.write_bytes(tiny_weights() + b"\0" * 8)
    with pytest.raises(ArtifactError, match="bytes after the last tensor"):
        read_safetensors_header(path, hashes)
    assert not hashes.checked(path, "safetensors-header")


def test_read_safetensors_header_knows_every_dtype_of_the_format(tmp_path: Path) -> None:
    # the safetensors library's dtypes, including the ROCm FP8 variants a hand-written table lacked
    tensors = {"a": {"dtype": "F8_E4M3FNUZ", "shape": [2], "data_offsets": [0, 2]},
               "b": {"dtype": "F8_E5M2FNUZ", "shape": [1], "data_offsets": [2, 3]},
               "c": {"dtype": "F6_E3M2", "shape": [4], "data_offsets": [3, 6]}}
    text = json.dumps(tensors).encode()
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 6)
    assert {k: v["dtype"] for k, v in read_safetensors_header(path).items()} == {
        "a": "F8_E4M3FNUZ", "b": "F8_E5M2FNUZ", "c": "F6_E3M2"}


def test_read_safetensors_header_rejects_short_and_absurd_files(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ArtifactError, match="truncated"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ArtifactError, match="implausible"):
        read_safetensors_header(path)


# ---------------------------------------------------------------- the command: `modelmint fetch`

MODELMINT = str(Path(sys.executable).parent / "modelmint")


def _modelmint_fetch(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it (COLUMNS wide enough that no row is cut)."""
    full = {**os.environ, "MODELMINT_WORK_DIR": str(tmp_path / "work"), "COLUMNS": "200", **env}
    return subprocess.run([MODELMINT, "fetch", *args], env=full, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def test_fetch_command_downloads_and_verifies_a_hub_source(hub: HubServer, tmp_path: Path) -> None:
    files = tiny_model_files()
    repo = hub.add_repo("acme/tiny", files)
    catalog = tmp_path / "registry" / "catalog.yaml"
    catalog.parent.mkdir()
    catalog.write_text(f"models:\n  - name: tiny\n    source: {{repo: acme/tiny, revision: {repo.commit}}}\n"
                       "    license: apache-2.0\n")
    env = {"HF_ENDPOINT": hub.endpoint, "MODELMINT_HOME": str(tmp_path / "home"),
           "MODELMINT_CATALOG": str(catalog), "MODELMINT_REPO": str(tmp_path)}

    proc = _modelmint_fetch(tmp_path, env, "tiny")
    assert proc.returncode == 0, proc.stderr
    assert f"acme/tiny@{repo.commit}" in proc.stdout and str(tmp_path / "home" / "hub") in proc.stdout
    for name in MODEL_FILES:
        assert name in proc.stdout
    assert any(r.server == "cdn" and r.path.endswith("/model.safetensors") for r in hub.requests)

    proc = _modelmint_fetch(tmp_path, env, "tiny", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert (got["kind"], got["repo"], got["revision"]) == ("hub", "acme/tiny", repo.commit)
    assert {f["name"]: (f["size_bytes"], f["sha256"]) for f in got["files"]} == {
        n: (len(files[n]), _sha(files[n])) for n in MODEL_FILES}
    assert Path(got["path"]).is_relative_to(tmp_path / "home" / "hub")

    # a revision the hub does not have: modelmint's message and hint, exit 1, nothing else
    proc = _modelmint_fetch(tmp_path, env, "tiny", "--revision", "b" * 40)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"acme/tiny has no commit {'b' * 40}" in proc.stderr and "→" in proc.stderr


def test_fetch_command_on_the_bundled_generated_model(tmp_path: Path) -> None:
    # the real catalog and modelmint's home: tiny-qwen2 is generated there on first use, then only checked
    env = {"MODELMINT_CATALOG": str(project_root() / "registry" / "catalog.yaml")}
    proc = _modelmint_fetch(tmp_path, env, "tiny-qwen2", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert (got["kind"], got["repo"], got["revision"]) == ("generated", None, None)
    names = {f["name"] for f in got["files"]}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    for f in got["files"]:
        assert (Path(got["path"]) / f["name"]).stat().st_size == f["size_bytes"]
    # a generated source has no revision to pin: refused before anything runs, naming the fix
    proc = _modelmint_fetch(tmp_path, env, "tiny-qwen2", "--revision", "a" * 40)
    assert proc.returncode == 1 and "not a hub source" in proc.stderr
    assert "without --revision" in proc.stderr
