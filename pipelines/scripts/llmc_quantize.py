"""Compress a Safetensors model to a compressed-tensors checkpoint with llmcompressor's oneshot.

Run by the llmcompressor venv's python through pipelines.core.runner.run, never imported by modelmint:
`llmc_quantize.py JOB.json`. The job (written by pipelines/compressed/build.py) names the source directory, the output
directory, the modifiers of the recipe, the calibration text and the files to copy verbatim from the source.
The result (timings, versions, device, warnings) is written as JSON to job["result"]. A failure modelmint
knows how to explain is written there too, as {"ok": false, "error": {"kind", "message"}}, and exits with
code 3; anything else is a crash with a traceback.

The model is loaded on the CPU. llmcompressor picks the device itself (its get_main_device: the first
accelerator, else the CPU) and its sequential / data-free pipelines onload one decoder layer at a time,
so the accelerator needs room for a layer, not the model.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

EXIT_KNOWN_FAILURE = 3

# Where each modifier of a modelmint recipe lives in llmcompressor 0.14 (the non-deprecated paths:
# modifiers.awq.AWQModifier(scheme=...) is a wrapper that will go away).
_MODIFIERS = {
    "AWQModifier": "llmcompressor.modifiers.transform.awq",
    "SmoothQuantModifier": "llmcompressor.modifiers.transform.smoothquant",
    "QuantizationModifier": "llmcompressor.modifiers.quantization",
    "GPTQModifier": "llmcompressor.modifiers.gptq",
}

# llmcompressor versions whose IntermediatesCache.pin_memory() is known to fail without an accelerator.
_PIN_MEMORY_FIX_VERSIONS = frozenset({"0.14.0.1"})


class KnownFailure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _log(msg: str) -> None:
    print(f"[llmc_quantize] {msg}", file=sys.stderr, flush=True)


def cpu_pin_memory_fix() -> str:
    """Make IntermediatesCache.pin_memory a no-op on a torch without an accelerator; say what was done.

    llmcompressor 0.14.0.1's AWQ (_apply_smoothing) calls IntermediatesCache.pin_memory() unconditionally,
    and Tensor.pin_memory() on a CPU-only torch raises "Cannot access accelerator device when none is
    available". Pinning only speeds up host-to-device copies, so without a device there is nothing to lose.
    Guarded by version: for an llmcompressor this was not checked against, nothing is patched and a run that
    hits the bug fails loudly, so the guard is revisited instead of silently carried forward.
    """
    import torch

    if torch.accelerator.is_available():
        return "not needed (accelerator present)"
    version = md.version("llmcompressor")
    if version not in _PIN_MEMORY_FIX_VERSIONS:
        return f"not applied: llmcompressor {version} is not a version the fix was checked against"
    from llmcompressor.pipelines.cache import IntermediatesCache

    def _no_pin(self: Any, batch_index: int, input_names: list[str] | None = None) -> None:
        return None

    IntermediatesCache.pin_memory = _no_pin  # type: ignore[method-assign]
    return f"applied (llmcompressor {version}, CPU-only torch)"


def _matches(pattern: str, names: list[str]) -> bool:
    if pattern.startswith("re:"):
        rx = re.compile(pattern[3:])
        return any(rx.match(n) for n in names)
    return any(n == pattern or n.endswith("." + pattern) for n in names)


def check_awq_mappings(source: str, trust_remote_code: bool) -> dict[str, Any]:
    """Refuse an architecture AWQ cannot smooth, before any weight is loaded (the model is built on `meta`).

    llmcompressor falls back to Llama-style default mappings for architectures it has no entry for; when
    those names do not exist in the model, AWQ would smooth nothing and quietly become round-to-nearest.
    """
    import torch
    from llmcompressor.modifiers.transform.awq.dynamic_mappings import (
        AWQ_DYNAMIC_MAPPING_REGISTRY,
        get_layer_mappings_from_model,
    )
    from llmcompressor.modifiers.transform.awq.mappings import AWQ_MAPPING_REGISTRY
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    arch = type(model).__name__
    registered = arch in AWQ_MAPPING_REGISTRY or arch in AWQ_DYNAMIC_MAPPING_REGISTRY
    mappings = get_layer_mappings_from_model(model)
    names = [n for n, _ in model.named_modules()]
    resolved = [
        m for m in mappings if _matches(m.smooth_layer, names) and all(_matches(b, names) for b in m.balance_layers)
    ]
    if not resolved:
        raise KnownFailure(
            "no_awq_mappings",
            f"llmcompressor has no AWQ mappings for {arch}"
            + ("" if registered else " and its default (Llama-style) mappings match none of its layers"),
        )
    return {"architecture": arch, "registered": registered, "mappings": len(mappings), "resolved": len(resolved)}


def calibration_dataset(source: str, cal: dict[str, Any], hf: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Tokenize the calibration text once and cut it into num_samples windows of max_seq_length tokens."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    if cal.get("hub_dataset"):
        from datasets import load_dataset

        spec = cal["hub_dataset"]
        rows = load_dataset(spec["repo"], revision=spec["revision"], split=spec["split"], **hf)
        text = "\n\n".join(str(t) for t in rows[spec["text_column"]])
        origin = f"{spec['repo']}@{spec['revision'][:12]} [{spec['split']}].{spec['text_column']}"
    else:
        text = Path(cal["text_path"]).read_text(encoding="utf-8")
        origin = cal["text_name"]
    tok = AutoTokenizer.from_pretrained(source)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    n, length = cal["num_samples"], cal["max_seq_length"]
    need = n * length
    if len(ids) < need:
        raise KnownFailure(
            "calibration_too_small",
            f"the calibration text {origin} has {len(ids)} tokens for this tokenizer; "
            f"{n} samples x {length} tokens need {need}",
        )
    windows = [ids[i * length : (i + 1) * length] for i in range(n)]
    ds = Dataset.from_dict({"input_ids": windows, "attention_mask": [[1] * length for _ in windows]})
    return ds, {"origin": origin, "text_tokens": len(ids), "num_samples": n, "max_seq_length": length}


def build_modifiers(specs: list[dict[str, Any]]) -> list[Any]:
    out = []
    for spec in specs:
        params = dict(spec)
        kind = params.pop("type")
        cls = getattr(importlib.import_module(_MODIFIERS[kind]), kind)
        group_size = params.pop("group_size", None)
        if group_size is not None:
            # The preset (W4A16_ASYM, …) with modelmint's chosen group size: passed as the modifier's one config
            # group, which is what `scheme=` expands to inside llmcompressor.
            from compressed_tensors.quantization import preset_name_to_scheme

            scheme = preset_name_to_scheme(params.pop("scheme"), params.pop("targets"))
            scheme.weights = scheme.weights.model_copy(update={"group_size": int(group_size)})
            params["config_groups"] = {"group_0": scheme}
        out.append(cls(**params))
    return out


def _is_oom(err: BaseException) -> bool:
    import torch

    text = str(err)
    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(err, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)
    )


def quantize(job: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        return now

    import torch
    from llmcompressor import oneshot
    from llmcompressor.utils.dev import get_main_device
    from transformers import AutoModelForCausalLM

    t = lap("import", t0)
    fix = cpu_pin_memory_fix()
    source, output = job["source"], Path(job["output"])
    trust = bool(job.get("trust_remote_code"))
    modifiers = job["modifiers"]
    awq = None
    if any(m["type"] == "AWQModifier" for m in modifiers):
        awq = check_awq_mappings(source, trust)
        t = lap("check_mappings", t)
    dataset, cal_info = None, None
    if job.get("calibration"):
        dataset, cal_info = calibration_dataset(source, job["calibration"], job.get("hf") or {})
        t = lap("calibration_data", t)

    model = AutoModelForCausalLM.from_pretrained(source, dtype="auto", trust_remote_code=trust)
    t = lap("load", t)
    device = str(get_main_device())
    kwargs: dict[str, Any] = {}
    if dataset is not None:
        kwargs.update(
            dataset=dataset,
            num_calibration_samples=cal_info["num_samples"],  # type: ignore[index]
            max_seq_length=cal_info["max_seq_length"],  # type: ignore[index]
            shuffle_calibration_samples=False,
        )
    _log(f"oneshot on {device}: {[m['type'] for m in modifiers]}")
    oneshot_start = time.perf_counter()
    oneshot(model=model, recipe=build_modifiers(modifiers), **kwargs)
    t = lap("oneshot", oneshot_start)

    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output, save_compressed=True)
    # transformers 5 rewrites tokenizers (and generation configs) it re-saves: the source's bytes are kept
    copied = []
    for name in job.get("copy_files", []):
        src = Path(source) / name
        if src.is_file():
            shutil.copyfile(src, output / name)
            copied.append(name)
    lap("save", t)
    timings["total_in_process"] = round(time.perf_counter() - t0, 3)
    return {
        "ok": True,
        "device": device,
        "torch_dtype": str(next(model.parameters()).dtype),
        "timings": timings,
        "cpu_pin_memory_fix": fix,
        "awq_mappings": awq,
        "calibration": cal_info,
        "copied_verbatim": copied,
        "versions": {
            name: md.version(name) for name in ("llmcompressor", "torch", "transformers", "compressed-tensors")
        },
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result_path = Path(job["result"])
    try:
        result = quantize(job)
    except KnownFailure as err:
        result_path.write_text(json.dumps({"ok": False, "error": {"kind": err.kind, "message": str(err)}}))
        _log(f"{err.kind}: {err}")
        return EXIT_KNOWN_FAILURE
    except Exception as err:
        if not _is_oom(err):
            raise
        result_path.write_text(json.dumps({"ok": False, "error": {"kind": "oom", "message": str(err)[:2000]}}))
        _log(f"out of memory: {err}")
        return EXIT_KNOWN_FAILURE
    result_path.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
