"""Upstream commits that change only metadata (chat template, generation config) rebuild no weights, for GGUF (plain
and importance-matrix quants) and compressed-tensors; a commit that breaks the model registers nothing."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf_same import assert_same_tensors
from hubserver import HubServer
from registry_env import REAL_HOME, PopenCounter

from pipelines.core.settings import Settings
from pipelines.source import upstream
from pipelines.source.catalog import CatalogEntry

MODELMINT = str(Path(sys.executable).parent / "modelmint")
REPO = "acme/tiny-qwen2"


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        yield server


def _hub_model(tiny_qwen2: Path, hub: HubServer, tmp_path: Path, variants: dict[str, Any]) -> tuple[
        Settings, CatalogEntry, dict[str, bytes]]:
    """tiny-qwen2 served by the hub at its first commit, an entry tracking its main, and settings building it in
    `tmp_path` with the real toolchains."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "toolchains").symlink_to(REAL_HOME / "toolchains")
    files = {p.name: p.read_bytes() for p in tiny_qwen2.iterdir() if p.is_file()}
    first = hub.add_repo(REPO, files)
    settings = Settings(home=home, work_dir=tmp_path / "work", catalog_path=tmp_path / "catalog.yaml",
                        hf_endpoint=hub.endpoint, threads=2)
    entry = CatalogEntry.model_validate({
        "name": "tiny-hub", "license": "apache-2.0", "chat_family": "chatml", "gate_profile": "tiny",
        "source": {"repo": REPO, "revision": first.commit, "track": "main"}, "variants": variants})
    return settings, entry, files


def _moved(entry: CatalogEntry, pinned: str, settings: Settings) -> upstream.Movement:
    """What the watcher says of the hub's main against `entry` pinned at `pinned`."""
    at = entry.model_copy(update={"source": entry.source.model_copy(update={"revision": pinned})})
    return upstream.check(at, settings)


def _reader(path: Path) -> Any:
    """gguf-py's own reader of `path` (the independent one: 5-15 s for a 150k-token vocabulary), read once per
    file as it is now."""
    st = Path(path).stat()
    return _read(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read(path: str, _size: int, _mtime_ns: int) -> Any:
    import gguf

    return gguf.GGUFReader(path)


def _sampling(path: Path) -> dict[str, tuple[int, Any]]:
    """Every general.sampling.* key of a GGUF: its value type and value."""
    reader = _reader(path)
    return {k: (int(f.types[0]), f.contents()) for k, f in reader.fields.items() if k.startswith("general.sampling.")}


def _tools(argv: list[list[str]]) -> list[list[str]]:
    """The processes that are not the one read of the converter's sampling keys (gguf_sampling.py): a conversion,
    an importance matrix, a quantization or an llmcompressor run would be among them."""
    sampling = [a for a in argv if any(x.endswith("gguf_sampling.py") for x in a)]
    assert len(sampling) <= 1, sampling  # once per build, not per file
    return [a for a in argv if a not in sampling]


# ---------------------------------------------------------------- GGUF: f16, importance matrix, plain and imatrix quants

QUANTS = ["q8_0", "q4_k_m"]


@pytest.mark.slow
def test_a_generation_config_change_rewrites_the_sampling_keys_and_runs_no_tool(
        tiny_qwen2: Path, tmp_path: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.core.ggufheader import inspect_gguf
    from pipelines.gguf import tools
    from pipelines.gguf.build import ensure_base, ensure_imatrix, ensure_quant, plan_gguf

    settings, entry, files = _hub_model(tiny_qwen2, hub, tmp_path, {"gguf": {"quants": QUANTS, "imatrix": True}})

    def build(revision: str | None) -> tuple[list[Any], float]:
        start = time.monotonic()
        plan = plan_gguf(entry, settings, revision=revision)
        steps = [ensure_base(plan), ensure_imatrix(plan), *(ensure_quant(plan, q) for q in QUANTS)]
        return [plan, *steps], time.monotonic() - start

    (before, *old), full_s = build(None)
    assert all(s.ran for s in old)  # converter, llama-imatrix, llama-quantize x 2

    gen = json.loads(files["generation_config.json"])
    assert "top_k" in gen  # the new commit drops it: the rewritten files must drop its key too
    new_gen = {k: v for k, v in gen.items() if k != "top_k"} | {"temperature": 0.3, "top_p": 0.95, "min_p": 0.05,
                                                                "repetition_penalty": 1.1}
    commit = hub.push(REPO, {"generation_config.json": json.dumps(new_gen, indent=2).encode()}).commit
    m = _moved(entry, before.snapshot.revision, settings)
    assert m.kinds == ["generation config"] and not m.rebuilds_weights

    runs = PopenCounter(monkeypatch)
    (after, *new), meta_s = build(commit)
    assert _tools(runs.argv) == [], runs.argv  # no converter, no llama-imatrix, no llama-quantize
    assert after.weights_key == before.weights_key and after.base_key != before.base_key
    print(f"\nfull build {full_s:.1f} s (4 tool runs); generation-config update {meta_s:.2f} s (0 tool runs, "
          f"{len(runs.argv)} read of the sampling keys); "
          f"ratio {meta_s / full_s:.3f}")

    # what a full rebuild writes: the pinned converter on the new commit's source
    real, _ = tools.convert(after.snapshot.path, tmp_path / "real-f16.gguf", after.llama, outtype="f16")
    want = _sampling(Path(real.path))
    assert "general.sampling.top_k" not in want and want["general.sampling.temp"][1] == pytest.approx(0.3)
    assert set(want) == {"general.sampling.temp", "general.sampling.top_p", "general.sampling.min_p",
                         "general.sampling.penalty_repeat"}
    assert _sampling(old[0].path)["general.sampling.top_k"][1] == gen["top_k"]
    for was, now in zip(old, new, strict=True):
        assert now.path != was.path and now.receipt["weights_key"] == was.receipt["weights_key"]
        if now.path.name.endswith(".imatrix.gguf"):
            assert now.path.read_bytes() == was.path.read_bytes()  # the f16's activations: unchanged
            continue
        assert _sampling(now.path) == want, now.path.name
        assert_same_tensors(was.path, now.path, _reader(now.path))
    meta = inspect_gguf(after.quant_path("q4_k_m")).metadata
    assert meta["modelmint.source.revision"] == commit and meta["modelmint.imatrix.sha256"] == new[1].receipt["sha256"]

    # the chat template and the generation config together: still no tool
    config = json.loads(files["tokenizer_config.json"])
    template = config["chat_template"] + "{#- corrected -#}"
    both = hub.push(REPO, {"tokenizer_config.json": json.dumps({**config, "chat_template": template}).encode(),
                           "generation_config.json": json.dumps({**new_gen, "temperature": 0.5}).encode()}).commit
    m = _moved(entry, commit, settings)
    assert m.kinds == ["chat template", "generation config"] and not m.rebuilds_weights
    runs = PopenCounter(monkeypatch)
    (_, *again), _ = build(both)
    assert _tools(runs.argv) == []
    for step in again:
        if not step.path.name.endswith(".imatrix.gguf"):
            assert inspect_gguf(step.path).chat_template == template
            assert _sampling(step.path)["general.sampling.temp"][1] == pytest.approx(0.5)

    # a generation_config key the converter reads for more than sampling (HunYuan's eos_token_id) converts again
    other = hub.push(REPO, {"generation_config.json": json.dumps({**new_gen, "eos_token_id": 7}).encode()}).commit
    assert plan_gguf(entry, settings, revision=other).weights_key != before.weights_key


# ---------------------------------------------------------------- compressed-tensors: the checkpoint with new files


@pytest.mark.slow
def test_a_metadata_change_copies_the_compressed_checkpoint_without_llmcompressor(
        tiny_qwen2: Path, tmp_path: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.compressed.build import ensure_compressed, ensure_validated, plan_compressed
    from pipelines.compressed.checkpoint import METADATA_FILES

    settings, entry, files = _hub_model(tiny_qwen2, hub, tmp_path, {"fp8": {}})
    start = time.monotonic()
    before = plan_compressed(entry, settings)
    assert ensure_compressed(before, "fp8").ran
    first = ensure_validated(before)["fp8"]
    full_s = time.monotonic() - start
    assert first.passed, first.failures

    config = json.loads(files["tokenizer_config.json"])
    gen = json.loads(files["generation_config.json"])
    commit = hub.push(REPO, {
        "tokenizer_config.json": json.dumps({**config, "chat_template": config["chat_template"] + "{#- fixed -#}"}).encode(),
        "generation_config.json": json.dumps({**gen, "temperature": 0.2}).encode()}).commit
    assert not _moved(entry, before.snapshot.revision, settings).rebuilds_weights

    runs = PopenCounter(monkeypatch)
    start = time.monotonic()
    after = plan_compressed(entry, settings, revision=commit)
    step = ensure_compressed(after, "fp8")
    outcome = ensure_validated(after)["fp8"]
    meta_s = time.monotonic() - start
    assert runs.argv == [], runs.argv  # no llmcompressor, and no evaluation: the figures carry over
    print(f"\nfp8 full build {full_s:.1f} s (llmcompressor + evaluation); metadata update {meta_s:.2f} s (0 tool "
          f"runs); ratio {meta_s / full_s:.4f}")
    old, new = first.path, step.path
    assert new != old and step.receipt["metadata_from"]["tree_sha256"] == first.digest
    shards = sorted(p.name for p in old.glob("*.safetensors"))
    assert shards and shards == sorted(p.name for p in new.glob("*.safetensors"))
    for name in shards:
        assert (new / name).read_bytes() == (old / name).read_bytes()
    source = after.snapshot.path
    for name in METADATA_FILES:
        assert (new / name).is_file() == (source / name).is_file(), name
        if (source / name).is_file():
            assert (new / name).read_bytes() == (source / name).read_bytes() == hub_file(hub, commit, name), name
    assert json.loads((new / "generation_config.json").read_text())["temperature"] == 0.2
    assert outcome.passed and outcome.report.carried_over["tree_sha256"] == first.digest
    assert outcome.report.metrics == first.report.metrics
    assert outcome.validation.reference.endswith(commit[:12])
    assert outcome.report.structure is not None  # the structure check ran on the new checkpoint


def hub_file(hub: HubServer, commit: str, name: str) -> bytes:
    import httpx

    return httpx.get(f"{hub.endpoint}/{REPO}/resolve/{commit}/{name}", timeout=30, follow_redirects=True).content


# ---------------------------------------------------------------- a commit that breaks the model

CATALOG = """\
models:
  - name: tiny-hub
    source:
      repo: {repo}
      revision: {pin}
      track: main
    license: apache-2.0
    chat_family: chatml
    gate_profile: tiny
    variants:
      gguf: {{quants: [q8_0]}}
"""


def zeroed(safetensors: bytes) -> bytes:
    """The same Safetensors file with every tensor's bytes zero: a model that predicts nothing."""
    n = int.from_bytes(safetensors[:8], "little")
    return safetensors[: 8 + n] + bytes(len(safetensors) - 8 - n)


@pytest.mark.slow
def test_a_commit_that_breaks_the_model_registers_nothing(tiny_qwen2: Path, hub: HubServer, isolated: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness
    from registry_env import artifacts, git, make_repo

    from flows.convert import convert
    from pipelines.core.fsutil import sha256_file
    from pipelines.source.catalog import load_catalog
    from pipelines.store import dvcgen
    from pipelines.store.manifest import find_manifest

    files = {p.name: p.read_bytes() for p in tiny_qwen2.iterdir() if p.is_file()}
    first = hub.add_repo(REPO, files).commit
    repo = make_repo(tmp_path)
    catalog = repo.root / "registry" / "catalog.yaml"
    catalog.write_text(CATALOG.format(repo=REPO, pin=first))
    dvcgen.write(load_catalog(catalog), repo.root / "dvc.yaml")
    repo.commit_all("track acme/tiny-qwen2")
    for key, value in {"MODELMINT_REPO": repo.root, "MODELMINT_WORK_DIR": repo.work, "HF_ENDPOINT": hub.endpoint}.items():
        monkeypatch.setenv(key, str(value))
    weights = [n for n in files if n.endswith(".safetensors")]
    no_weights = hub.push(REPO, dict.fromkeys(weights)).commit
    hub.branch(REPO, "main", first)
    zeros = hub.push(REPO, {n: zeroed(files[n]) for n in weights}).commit

    with prefect_test_harness(server_startup_timeout=180), \
            temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        done = convert(model="tiny-hub", return_state=True)
        assert done.is_completed(), done.message
        repo.commit_all("tiny-hub:q8_0 at the first commit")
        settings = repo.settings()
        current = find_manifest(settings, "tiny-hub:q8_0")
        assert current.source.revision == first

        states = {c: convert(model="tiny-hub", revision=c, return_state=True) for c in (no_weights, zeros)}
        with get_client(sync_client=True) as client:
            rows = {c: json.loads(next(a.data for a in artifacts(client, s.state_details.flow_run_id)
                                       if a.key == "convert-tiny-hub-variants")) for c, s in states.items()}
    assert states[no_weights].is_failed() and "has no .safetensors weights" in states[no_weights].message
    assert states[zeros].is_failed() and "no better than chance" in states[zeros].message
    assert "keep the catalog's pin on a good one" in states[zeros].message  # not "rebuild it": that cannot help
    print("\n" + "\n".join(f"{c[:12]}: {s.message}" for c, s in states.items()))
    for (row,) in rows.values():  # the run's table names the variant, its failure, and no registration
        assert row["variant"] == "q8_0" and row["registered"] == "" and row["cause"], row
    (zero_row,) = rows[zeros]
    assert zero_row["gate"].startswith("FAIL") and "no better than chance" in zero_row["gate"]
    # the relative gate alone passed it: the zeroed quant agrees perfectly with its own zeroed f16
    assert zero_row["mean_kl"] is not None and zero_row["mean_kl"] < zero_row["max_mean_kl"]

    assert git(repo.root, "status", "--porcelain") == ""  # nothing registered for either commit
    assert find_manifest(settings, "tiny-hub:q8_0") == current
    env = {**repo.env(), "HF_ENDPOINT": hub.endpoint, "COLUMNS": "200"}
    shown = subprocess.run([MODELMINT, "show", "tiny-hub:q8_0", "--history"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if current.sha256[:12] in line]
    assert len(lines) == 1 and "current" in lines[0] and first[:12] in lines[0]
    assert no_weights[:12] not in shown.stdout and zeros[:12] not in shown.stdout
    pulled = subprocess.run([MODELMINT, "pull", "tiny-hub:q8_0", "--no-ollama", "--dest", str(tmp_path / "pulled")],
                            env=env, capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    assert sha256_file(tmp_path / "pulled" / current.file) == current.sha256


def test_the_same_tensors_check_fails_on_any_changed_tensor(tmp_path: Path) -> None:
    """assert_same_tensors (the one-read comparison above) passes a metadata rewrite and fails a changed byte,
    type, shape or name."""
    import gguf
    import numpy as np
    from registry_env import write_gguf

    def write(name: str, meta: str, tensors: dict[str, Any]) -> Path:
        return write_gguf(tmp_path / name, tensors=tensors, name=meta)

    base = {"a.weight": np.arange(64, dtype=np.float32).reshape(8, 8), "b.weight": np.ones(32, dtype=np.float16)}
    new = write("new.gguf", "a much longer name than before, so the header moves", base)
    reader = gguf.GGUFReader(new)
    assert_same_tensors(write("old.gguf", "x", base), new, reader)
    changed = {**base, "b.weight": base["b.weight"].copy()}
    changed["b.weight"][3] = 2
    for name, tensors in (("byte", changed), ("type", {**base, "b.weight": np.ones(16, dtype=np.float32)}),
                          ("shape", {**base, "a.weight": base["a.weight"].reshape(4, 16)}),
                          ("name", {"a.weight": base["a.weight"], "c.weight": base["b.weight"]})):
        with pytest.raises(AssertionError, match="differ"):
            assert_same_tensors(write(f"{name}.gguf", "x", tensors), new, reader)


def test_chance_failure_names_the_broken_reference() -> None:
    from pipelines.core.gates import chance_failure, gate_advice

    assert chance_failure(1410.0, 151936) is None and chance_failure(20.0, 49152) is None
    said = chance_failure(151936.0, 151936)
    assert said is not None and "no better than chance" in said and "151936-token" in said
    assert chance_failure(5e6, None) is None  # no vocabulary known: nothing to compare with
    advice = gate_advice("q8_0", [], basis="tiny", other_failures=[said])
    assert "no other type or scheme fixes that" in advice and "rerun" not in advice
