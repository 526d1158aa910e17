"""A tokenizer whose vocabulary hash llama.cpp does not recognise is refused with a clear error, never converted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelines.core.errors import UnsupportedModel
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.gguf.tools import convert
from pipelines.source.tinymodel import ensure_tiny_model


def test_an_unrecognised_pre_tokenizer_is_refused_naming_its_hash(tmp_path: Path) -> None:
    settings = Settings.from_env()
    model = tmp_path / "model"
    shutil.copytree(ensure_tiny_model("tiny-qwen2", settings), model)
    tok = json.loads((model / "tokenizer.json").read_text())
    # the Qwen2 regex cutting words into pieces of at most two letters: a split llama.cpp has no entry for
    split = tok["pre_tokenizer"]["pretokenizers"][0]
    split["pattern"]["Regex"] = split["pattern"]["Regex"].replace(r"\p{L}+|", r"\p{L}{1,2}|", 1)
    (model / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    out = tmp_path / "m-f16.gguf"
    with pytest.raises(UnsupportedModel) as exc:
        convert(model, out, llama_cpp(settings))
    message = exc.value.message
    assert "does not recognise the vocabulary" in message and "nothing was converted" in message
    assert "pre-tokenizer hash " in message and len(message.split("pre-tokenizer hash ")[1].split()[0]) == 64
    assert "architecture" not in message and "registry/catalog.yaml" in (exc.value.hint or "")
    assert not out.exists()
