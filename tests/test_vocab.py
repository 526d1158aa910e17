"""The vocabulary rows hold what the pinned llama.cpp says, and every module that names a type reads them.

One check of the GGUF rows against the pinned tree's own declarations (gguf-py's enums and block sizes, the default
type and the fallback switches of src/llama-quant.cpp) replaces the tests that held each copied table to another.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import types
from pathlib import Path
from typing import get_args

import pytest

from pipelines.core import vocab
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.core.vocab import COMPRESSED_SCHEMES, GGUF_TYPES, PRESETS, GGUFType


@pytest.fixture(scope="module")
def pinned(settings: Settings) -> tuple[types.ModuleType, str]:
    """The pinned tree's gguf-py constants (loaded from its file: the main venv's gguf package may differ) and the
    text of its src/llama-quant.cpp."""
    source = llama_cpp(settings).source
    spec = importlib.util.spec_from_file_location(
        "pinned_gguf_constants", source / "gguf-py" / "gguf" / "constants.py"
    )
    assert spec and spec.loader
    constants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(constants)
    return constants, (source / "src" / "llama-quant.cpp").read_text(encoding="utf-8")


def _switch(cpp: str, function: str) -> dict[str, str]:
    """`case A: case B: return X;` (or `return_type = X;`) arms of the first switch in `function`: case → result."""
    body = cpp[cpp.index(function) :]
    body = body[: body.index("\n}\n")]
    out, pending = {}, []
    for case, result in re.findall(r"case (\w+):\s*(?:(?:return|return_type =) (\w+);)?", body):
        pending.append(case)
        if result:
            out |= dict.fromkeys(pending, result)
            pending = []
    return out


def _problems(rows: dict[str, GGUFType], constants: types.ModuleType, cpp: str) -> list[str]:
    """Where the rows disagree with the pinned tree."""
    ftypes = {m.name for m in constants.LlamaFileType}
    ggml = constants.GGMLQuantizationType
    defaults = _switch(cpp, "ggml_type llama_ftype_get_default_type(")
    fallbacks = _switch(cpp, "static ggml_type tensor_type_fallback(")
    out = []
    for t in rows.values():
        if f"MOSTLY_{t.name.upper()}" not in ftypes:
            out.append(f"{t.name}: gguf-py's LlamaFileType has no MOSTLY_{t.name.upper()}")
            continue
        if defaults.get(f"LLAMA_FTYPE_MOSTLY_{t.name.upper()}") != f"GGML_TYPE_{t.ggml_type}":
            out.append(
                f"{t.name}: llama_ftype_get_default_type gives "
                f"{defaults.get(f'LLAMA_FTYPE_MOSTLY_{t.name.upper()}')}, the row {t.ggml_type}"
            )
        block = constants.GGML_QUANT_SIZES[ggml[t.ggml_type]][0]
        if block != t.block:
            out.append(
                f"{t.name}: {t.ggml_type}'s block is {block} in GGML_QUANT_SIZES, the row says {t.block}"
            )
        want = (
            "F16"
            if block <= 32
            else fallbacks.get(f"GGML_TYPE_{t.ggml_type}", "none").removeprefix("GGML_TYPE_")
        )
        if t.fallback != want:
            out.append(
                f"{t.name}: tensor_type_fallback stores {t.ggml_type} rows as {want}, the row says {t.fallback}"
            )
    return out


def test_every_gguf_row_is_what_the_pinned_llama_cpp_declares(pinned: tuple[types.ModuleType, str]) -> None:
    assert _problems(GGUF_TYPES, *pinned) == []


def test_the_check_finds_a_wrong_block_a_wrong_fallback_and_a_name_llama_cpp_lacks(
    pinned: tuple[types.ModuleType, str],
) -> None:
    rows = dict(GGUF_TYPES)
    rows["q4_0"] = dataclasses.replace(rows["q4_0"], block=256)
    rows["q6_k"] = dataclasses.replace(rows["q6_k"], fallback="Q5_0")
    rows["q4_k_m"] = dataclasses.replace(rows["q4_k_m"], ggml_type="Q5_K")
    rows["q4_k_x"] = dataclasses.replace(rows["q4_k_s"], name="q4_k_x")
    assert _problems(rows, *pinned) == [
        "q4_0: Q4_0's block is 32 in GGML_QUANT_SIZES, the row says 256",
        "q4_k_m: llama_ftype_get_default_type gives GGML_TYPE_Q4_K, the row Q5_K",
        "q4_k_m: tensor_type_fallback stores Q5_K rows as Q5_1, the row says Q5_0",
        "q6_k: tensor_type_fallback stores Q6_K rows as Q8_0, the row says Q5_0",
        "q4_k_x: gguf-py's LlamaFileType has no MOSTLY_Q4_K_X",
    ]


def test_published_figures_and_the_ladder_are_ordered_by_bits() -> None:
    """More bits never publish a worse KLD among the ladder types, and the same-top curve falls with the KLD."""
    ladder = [GGUF_TYPES[n] for n in vocab.GGUF_LADDER]
    assert [t.bpw for t in ladder] == sorted(t.bpw for t in ladder)
    assert [t.kld for t in ladder] == sorted((t.kld for t in ladder if t.kld is not None), reverse=True)
    tops = [top for _, top in vocab.PUBLISHED_SAME_TOP]
    assert tops == sorted(tops, reverse=True) and len(tops) == 4
    assert vocab.USUAL_QUANTS[0] == "q4_k_m" and len(set(vocab.USUAL_QUANTS)) == len(vocab.USUAL_QUANTS)


def test_each_compressed_scheme_has_its_catalog_model_presets_and_checkpoint_format() -> None:
    """The catalog's `scheme` Literal of each variant offers exactly the row's presets, its default first; every
    preset has the checkpoint layout check_structure compares (pipelines/compressed/checkpoint.py)."""
    from pipelines.compressed.checkpoint import SCHEME_FORMATS
    from pipelines.source.catalog import COMPRESSED_VARIANTS, Variants

    assert list(COMPRESSED_VARIANTS) == list(COMPRESSED_SCHEMES)
    assert set(Variants.model_fields) == {"gguf", *COMPRESSED_SCHEMES}
    for name, model in COMPRESSED_VARIANTS.items():
        field = model.model_fields["scheme"]
        assert set(get_args(field.annotation)) == set(COMPRESSED_SCHEMES[name].presets), name
        assert field.default == COMPRESSED_SCHEMES[name].presets[0], name
        assert GGUF_TYPES[COMPRESSED_SCHEMES[name].anchor].tiny is not None or name
    assert set(SCHEME_FORMATS) == set(PRESETS)
    for preset, fmt in SCHEME_FORMATS.items():
        assert fmt.weights.get("group_size") == PRESETS[preset].group_size, preset


def test_the_registry_formats_agree_with_the_vocabulary_stages() -> None:
    """The built-in formats' stages are the vocabulary's, and every built-in type and scheme is owned by the format
    the names table says, with one spelling of its stage (pipelines/store/names.py)."""
    from pipelines.store.formats import FORMATS
    from pipelines.store.names import format_name, stage_name

    assert {name: f.stage for name, f in FORMATS.items()} == vocab.STAGES
    for tag in GGUF_TYPES:
        assert format_name(tag).name == "gguf" and FORMATS["gguf"].owns(tag), tag
    for tag in COMPRESSED_SCHEMES:
        assert format_name(tag).name == "compressed-tensors" and FORMATS["compressed-tensors"].owns(tag), tag
    assert stage_name("qwen2.5", "q4_k_m") == "gguf@qwen2.5-q4_k_m"
    assert stage_name("qwen2.5", "fp8") == "compress@qwen2.5-fp8"
    assert not hasattr(vocab, "stage_name") and not hasattr(vocab, "format_of_tag"), "a second spelling came back"


def test_a_row_table_and_its_literal_that_disagree_refuse_to_import() -> None:
    with pytest.raises(RuntimeError, match=r"KV dtype rows \['auto'\] != \['auto', 'fp8'\]"):
        vocab._same(["auto"], vocab.Literal["auto", "fp8"], "KV dtype")


def test_no_module_spells_a_vocabulary_again() -> None:
    """The patterns the vocabulary declares once appear nowhere else in pipelines/ and flows/."""
    root = Path(vocab.__file__).parents[2]
    spelled = {
        r"^[0-9a-f]{40}$": "COMMIT",
        r"^[0-9a-f]{64}$": "SHA256",
        r"[a-z0-9][a-z0-9._-]*$": "NAME",
        '"[a-z0-9][a-z0-9._-]*"': "NAME",
        'Literal["gguf", "compressed-tensors"]': "Format",
        '"fp8_e4m3": 1': "KV_DTYPES",
        '"w4a16-awq"': "COMPRESSED_SCHEMES",
        '"iq4_nl"': "GGUF_TYPES",
    }
    found = []
    for path in sorted([*root.glob("pipelines/**/*.py"), *root.glob("flows/**/*.py")]):
        if path.name == "vocab.py" or "scripts" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(root)}: {name}" for pattern, name in spelled.items() if pattern in text]
    assert found == []


# Modules that still read GGUF metadata through quoted keys; this list only shrinks.
_GGUF_KEYS_SPELLED = {"pipelines/publish/planner.py", "pipelines/publish/llamacpp_memory.py"}


def test_no_module_spells_a_gguf_key_again() -> None:
    """GGUF metadata keys are read through vocab.GGUFKey; a quoted "general.architecture", "tokenizer.ggml.*" or
    "<arch>.context_length" anywhere else in pipelines/ (the scripts run in other venvs) is a second spelling."""
    root = Path(vocab.__file__).parents[2]
    keys = {v for k, v in vars(vocab.GGUFKey).items() if k.isupper() and isinstance(v, str)}
    quoted = re.compile("|".join([*(f"[\"']{re.escape(k)}[\"']" for k in keys), r"\.context_length[\"']"]))
    found = []
    for path in sorted(root.glob("pipelines/**/*.py")):
        name = str(path.relative_to(root))
        if path.name == "vocab.py" or "scripts" in path.parts or name in _GGUF_KEYS_SPELLED:
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}" for m in quoted.finditer(text)]
    assert found == []


def test_catalog_and_manifest_hold_names_and_tags_to_one_rule() -> None:
    """The catalog's entry name and the manifest's name and tag are the vocabulary's identifier types: one rule,
    one message."""
    from pydantic import TypeAdapter, ValidationError

    from pipelines.source.catalog import CatalogEntry
    from pipelines.store.manifest import Manifest

    rule = list(get_args(vocab.ModelName)[1:])
    assert CatalogEntry.model_fields["name"].metadata == Manifest.model_fields["name"].metadata == rule
    assert Manifest.model_fields["tag"].metadata == list(get_args(vocab.VariantTag)[1:]) == rule
    for bad in ("Qwen", "a b", "-x", ""):
        with pytest.raises(ValidationError, match=f"{bad!r} must be lower-case letters"):
            TypeAdapter(vocab.ModelName).validate_python(bad)
    assert TypeAdapter(vocab.VariantTag).validate_python("q4_k_m") == "q4_k_m"
