"""A damaged step receipt (a key no step writes, a field of the wrong type, not JSON) is a miss, said in a warning
naming the receipt and the field: the step runs again and writes a sound receipt, as DVC reruns a stage whose lock
entry is damaged. Never a traceback, never a finished output taken on a receipt modelmint did not write.

Real receipts written by the real steps' functions on real files; the end-to-end case is real llama.cpp on the
bundled tiny-qwen2 (q8_0 only).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.settings import Settings, project_root
from pipelines.core.steps import (
    execute,
    kept_or_dropped_receipt,
    load_dir_receipt,
    load_receipt,
    local_runner,
    receipt_path,
    recorded_receipt,
    write_dir_receipt,
    write_receipt,
)

KEY = "k" * 64

# what the quantize step keeps in a GGUF's receipt (pipelines/gguf/build.ensure_quant)
GGUF_EXTRA: dict[str, Any] = {
    "gguf": {"architecture": "qwen2", "bos_token_id": 151643, "context_length": 32768, "eos_token_id": 151645,
             "eot_token_id": None, "file_type": "Q8_0", "has_chat_template": True,
             "metadata": {"general.file_type": 7, "modelmint.variant": "q8_0"}, "name": "tiny-qwen2",
             "parameter_count": 4980736, "path": "/work/tiny-qwen2-q8_0.gguf", "quantized_fraction": 1.0,
             "size_bytes": 5898240, "split_count": 1, "tensor_count": 219, "tensor_types": {"F32": 121, "Q8_0": 98},
             "tokenizer_model": "gpt2", "tokenizer_pre": "qwen2", "version": 3},
    "wall_s": 3.412, "peak_rss": 212344832, "weights_key": "w" * 64,
    "fallback": {"fallback_params": 0, "log_fallback_tensors": 0, "params": 4980736, "share": 0.0, "tensors": []},
}
# what the compress step keeps in a checkpoint's receipt (pipelines/compressed/build.ensure_compressed)
DIR_EXTRA: dict[str, Any] = {
    "quantize": {"awq_mappings": None, "calibration": None, "copied_verbatim": ["tokenizer.json"],
                 "cpu_pin_memory_fix": None, "device": "cpu", "ok": True, "peak_rss_bytes": 1834512384,
                 "timings": {"import": 6.3, "load": 0.2, "oneshot": 12, "save": 0.3, "total_in_process": 18.8},
                 "torch_dtype": "torch.bfloat16", "torch_threads": 2,
                 "versions": {"compressed-tensors": "0.19.0", "llmcompressor": "0.14.0.1", "torch": "2.13.0",
                              "transformers": "5.17.0"},
                 "wall_s": 25.1},
    "weights_key": "w" * 64, "source_key": "s" * 64,
    "metadata_from": {"files": ["tokenizer_config.json"], "path": "/work/a/tiny-qwen2-fp8", "source_key": "t" * 64,
                      "tree_sha256": "e" * 64},
}


def _damage(out: Path, keys: tuple[str, ...], value: Any) -> None:
    path = receipt_path(out)
    receipt = json.loads(path.read_text())
    block = receipt
    for k in keys[:-1]:
        block = block[k]
    block[keys[-1]] = value
    path.write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")


def _warned(caplog: pytest.LogCaptureFixture, out: Path) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and str(receipt_path(out)) in r.getMessage()]


FILE_DAMAGE = [
    (("surprise",), 1, "surprise"),  # a key no step writes
    (("size",), "5898240", "size"),
    (("wall_s",), "3.412", "wall_s"),
    (("fallback", "share"), "0.0", "fallback.share"),
    (("fallback", "tensors"), "blk.0.ffn_down.weight", "fallback.tensors"),
    (("gguf", "tensor_count"), "219", "gguf.tensor_count"),
    (("gguf", "tensor_cnt"), 219, "gguf.tensor_cnt"),
]


@pytest.mark.parametrize(("keys", "value", "named"), FILE_DAMAGE, ids=[n for *_, n in FILE_DAMAGE])
def test_a_damaged_file_receipt_is_a_miss_said_in_a_warning(keys: tuple[str, ...], value: Any, named: str,
                                                             tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "tiny-qwen2-q8_0.gguf"
    out.write_bytes(b"GGUF" + bytes(60))
    write_receipt(out, KEY, **copy.deepcopy(GGUF_EXTRA))
    assert load_receipt(out, KEY) is not None and not _warned(caplog, out)
    stat = out.stat()
    _damage(out, keys, value)
    with caplog.at_level(logging.WARNING):
        assert load_receipt(out, "o" * 64) is None and not _warned(caplog, out)  # another build's: not read further
        assert load_receipt(out, KEY) is None  # the step runs again
        assert recorded_receipt(out, KEY) is None and kept_or_dropped_receipt(out, KEY) is None
    warned = _warned(caplog, out)
    assert warned and all(named in w and "runs again" in w for w in warned), caplog.text
    assert out.stat().st_mtime_ns == stat.st_mtime_ns  # the output is left to the step that remakes it
    write_receipt(out, KEY, **copy.deepcopy(GGUF_EXTRA))  # what the rerun writes reads as finished again
    assert load_receipt(out, KEY) is not None


DIR_DAMAGE = [
    (("files", "model.safetensors"), 3, "files.model.safetensors"),
    (("files", "model.safetensors", "size"), "3", "files.model.safetensors.size"),
    (("quantize", "seconds"), 25.1, "quantize.seconds"),
    (("quantize", "wall_s"), "25.1", "quantize.wall_s"),
    (("quantize", "ok"), "true", "quantize.ok"),
    (("metadata_from", "path"), 1, "metadata_from.path"),
    (("tree_sha256",), None, "tree_sha256"),
]


@pytest.mark.parametrize(("keys", "value", "named"), DIR_DAMAGE, ids=[n for *_, n in DIR_DAMAGE])
def test_a_damaged_directory_receipt_is_a_miss_said_in_a_warning(keys: tuple[str, ...], value: Any, named: str,
                                                                  tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "tiny-qwen2-fp8"
    out.mkdir()
    (out / "model.safetensors").write_bytes(bytes(64))
    (out / "config.json").write_text("{}")
    write_dir_receipt(out, KEY, **copy.deepcopy(DIR_EXTRA))
    assert load_dir_receipt(out, KEY) is not None
    _damage(out, keys, value)
    with caplog.at_level(logging.WARNING):
        assert load_dir_receipt(out, KEY) is None
    warned = _warned(caplog, out)
    assert warned and all(named in w and "runs again" in w for w in warned), caplog.text


@pytest.mark.parametrize("text", ['{"key": "' + KEY + '", "size": 6', "[1, 2]"], ids=["cut short", "not an object"])
def test_a_receipt_that_is_no_json_object_is_a_miss_said_in_a_warning(text: str, tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "tiny-qwen2-f16.gguf"
    out.write_bytes(bytes(64))
    receipt_path(out).write_text(text)
    with caplog.at_level(logging.WARNING):
        assert load_receipt(out, KEY) is None
    assert _warned(caplog, out), caplog.text


@pytest.mark.slow
def test_a_quantize_receipt_damaged_before_the_check_remakes_the_quant(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The check reads what llama-quantize stored in other types from the quantize receipt: a damaged one made the
    build end in a raw pydantic ValidationError; now the quantize step runs again and the check measures."""
    from pipelines.gguf.build import gguf_steps, plan_gguf
    from pipelines.source.catalog import load_catalog

    catalog = project_root() / "registry" / "catalog.yaml"
    base = Settings.from_env()
    settings = Settings(home=base.home, work_dir=tmp_path / "work", catalog_path=catalog, threads=base.threads)
    plan = plan_gguf(load_catalog(catalog).get("tiny-qwen2"), settings, quants=["q8_0"])
    steps = [s for s in gguf_steps(plan).steps if s.name in ("convert", "quantize-q8_0")]
    execute(steps, local_runner)
    quant = plan.quant_path("q8_0")
    assert load_receipt(quant, plan.quant_key("q8_0")) is not None
    _damage(quant, ("fallback", "share"), "0.0")
    with caplog.at_level(logging.WARNING):
        done = execute(gguf_steps(plan).steps, local_runner)
    assert any("fallback.share" in w for w in _warned(caplog, quant)), caplog.text
    assert not done.errors and done.results["quantize-q8_0"].ran  # made again, not taken on the damaged receipt
    report = done.results["validate-q8_0"].report
    assert report.preflight is not None and report.preflight["observed"]["share"] == 0.0
    assert load_receipt(quant, plan.quant_key("q8_0")) is not None  # the rerun wrote a sound receipt


def test_a_step_cannot_keep_what_a_receipt_does_not_declare(tmp_path: Path) -> None:
    """A receipt that would read back as damaged is never written: its step would run again on every build."""
    out = tmp_path / "tiny-qwen2-q8_0.gguf"
    out.write_bytes(bytes(64))
    with pytest.raises(ValueError, match="wall_seconds"):
        write_receipt(out, KEY, wall_seconds=3.4)
    with pytest.raises(ValueError, match=r"fallback\.share"):
        write_receipt(out, KEY, fallback={**GGUF_EXTRA["fallback"], "share": "0.0"})
    assert not receipt_path(out).exists()
