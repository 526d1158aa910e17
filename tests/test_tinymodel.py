"""Tiny models: generated for real, converted by the pinned llama.cpp converter, read back with GGUFReader."""

from __future__ import annotations

import json
import shutil
import typing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from gguf import GGUFReader, TokenType
from pydantic import ValidationError

from pipelines.core.errors import ArtifactError, ConfigError
from pipelines.core.fsutil import sha256_file
from pipelines.core.runner import run
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.source.catalog import GeneratedSource
from pipelines.source.tinymodel import (
    EVAL_TEXT,
    SCRIPT,
    TINY_RECIPES,
    TRAIN_TEXT,
    TinyRecipe,
    check_tiny_model,
    ensure_tiny_model,
    recipe_hash,
    tiny_model_dir,
    tiny_recipe,
)


@dataclass(frozen=True)
class Expected:
    """What the instruct model each tiny model imitates has, as llama.cpp should see it."""

    arch: str
    pre: str
    vocab_gguf: str
    template: str
    n_vocab: int
    bos: int
    eos: int
    pad: int | None
    add_bos: bool
    context: int
    rope_theta: float
    tied: bool
    specials: dict[str, int]
    """Text that must encode to exactly this one token."""


EXPECTED = {
    "tiny-qwen2": Expected(
        arch="qwen2", pre="qwen2", vocab_gguf="ggml-vocab-qwen2.gguf",
        template="Qwen-Qwen2.5-7B-Instruct.jinja",
        n_vocab=151936, bos=151643, eos=151645, pad=151643, add_bos=False, context=32768, rope_theta=1e6,
        tied=True, specials={"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                             "<tool_call>": 151657, "<|file_sep|>": 151664},
    ),
    "tiny-llama": Expected(
        arch="llama", pre="llama-bpe", vocab_gguf="ggml-vocab-llama-bpe.gguf",
        template="meta-llama-Llama-3.2-3B-Instruct.jinja", n_vocab=128256, bos=128000, eos=128009, pad=None,
        add_bos=True, context=131072, rope_theta=5e5, tied=False,
        specials={"<|begin_of_text|>": 128000, "<|start_header_id|>": 128006, "<|eom_id|>": 128008,
                  "<|eot_id|>": 128009, "<|python_tag|>": 128010, "<|reserved_special_token_247|>": 128255},
    ),
}  # fmt: skip


# ---------------------------------------------------------------- fast: recipes and bundled text


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        tiny_recipe("tiny-gpt")
    assert "tiny-llama" in str(err.value) and "tiny-qwen2" in str(err.value)
    assert err.value.hint and "TINY_RECIPES" in err.value.hint


def test_recipes_are_exactly_the_catalog_generated_names() -> None:
    allowed = typing.get_args(GeneratedSource.model_fields["generated"].annotation)
    assert set(allowed) == set(TINY_RECIPES) == set(EXPECTED)


def test_recipe_rejects_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        TinyRecipe(family="qwen2", steps=3)  # type: ignore[call-arg]


def test_recipe_hash_is_stable_and_names_the_directory(settings: Settings) -> None:
    digest = recipe_hash("tiny-qwen2")
    assert digest == recipe_hash("tiny-qwen2") != recipe_hash("tiny-llama")
    assert tiny_model_dir("tiny-qwen2", settings) == settings.models_dir / f"tiny-qwen2-{digest[:12]}"


def test_bundled_texts_are_sized_and_disjoint() -> None:
    train = TRAIN_TEXT.read_text(encoding="utf-8")
    evaluation = EVAL_TEXT.read_text(encoding="utf-8")
    assert 25_000 <= len(train.encode()) <= 40_000
    assert 12_000 <= len(evaluation.encode()) <= 20_000
    # llama-perplexity / llama-imatrix at -c 512 need 2 x 512 tokens; English runs ~1.3 tokens a word
    assert len(evaluation.split()) > 1_500
    paragraphs = {p.strip() for p in train.split("\n\n")}
    assert not paragraphs & {p.strip() for p in evaluation.split("\n\n")}


# ---------------------------------------------------------------- slow: the real generator and converter


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def tiny(request: pytest.FixtureRequest) -> tuple[str, Path]:
    name: str = request.param
    return name, request.getfixturevalue(name.replace("-", "_"))


@pytest.fixture(scope="module")
def converted(tiny: tuple[str, Path], settings: Settings, tmp_path_factory: pytest.TempPathFactory):
    """The tiny model converted to f16 by the pinned convert_hf_to_gguf.py, opened with GGUFReader."""
    name, model_dir = tiny
    llama = llama_cpp(settings)
    out = tmp_path_factory.mktemp("gguf") / f"{name}-f16.gguf"
    run([llama.python, llama.converter, model_dir, "--outtype", "f16", "--outfile", out], timeout=600)
    return name, model_dir, GGUFReader(out)


def _field(reader: GGUFReader, key: str) -> typing.Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


@pytest.mark.slow
def test_generated_model_records_its_recipe_and_training(tiny: tuple[str, Path]) -> None:
    name, model_dir = tiny
    assert model_dir.name == f"{name}-{recipe_hash(name)[:12]}"
    record = check_tiny_model(model_dir, tiny_recipe(name), recipe_hash(name))
    assert record["tokenizer"]["test_vectors"] == "46/46"
    training = record["training"]
    assert training["heldout_loss_final"] < training["heldout_loss_init"] - 3.0, training
    config = json.loads((model_dir / "config.json").read_text())
    assert config["transformers_version"] == "4.57.6"
    assert config["rope_theta"] == EXPECTED[name].rope_theta
    assert "rope_parameters" not in config  # the transformers-5 spelling the pinned converter ignores
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"


@pytest.mark.slow
def test_converter_sees_the_upstream_tokenizer_template_and_shape(converted, settings: Settings) -> None:
    name, model_dir, reader = converted
    want = EXPECTED[name]
    src = llama_cpp(settings).source
    config = json.loads((model_dir / "config.json").read_text())

    assert _field(reader, "general.architecture") == want.arch
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == want.pre  # the converter recognised the pre-tokenizer hash
    assert _field(reader, "tokenizer.chat_template") == (src / "models/templates" / want.template).read_text()
    assert _field(reader, "tokenizer.ggml.bos_token_id") == want.bos
    assert _field(reader, "tokenizer.ggml.eos_token_id") == want.eos
    assert _field(reader, "tokenizer.ggml.padding_token_id") == want.pad
    assert _field(reader, "tokenizer.ggml.add_bos_token") == want.add_bos

    # the transformers-5 pitfall: rope_theta silently read as 10000
    assert _field(reader, f"{want.arch}.rope.freq_base") == config["rope_theta"] == want.rope_theta
    assert _field(reader, f"{want.arch}.context_length") == want.context
    assert _field(reader, f"{want.arch}.embedding_length") == 256
    assert _field(reader, f"{want.arch}.feed_forward_length") == 768
    assert _field(reader, f"{want.arch}.block_count") == 4
    assert _field(reader, f"{want.arch}.attention.head_count") == 4
    assert _field(reader, f"{want.arch}.attention.head_count_kv") == 2

    # the vocabulary and merges are llama.cpp's own reference vocab, token for token
    vocab = GGUFReader(src / "models" / want.vocab_gguf)
    tokens, ref_tokens = _field(reader, "tokenizer.ggml.tokens"), _field(vocab, "tokenizer.ggml.tokens")
    types, ref_types = _field(reader, "tokenizer.ggml.token_type"), _field(vocab, "tokenizer.ggml.token_type")
    assert len(tokens) == want.n_vocab == len(ref_tokens)
    normal = [i for i, t in enumerate(ref_types) if t == TokenType.NORMAL]
    assert [tokens[i] for i in normal] == [ref_tokens[i] for i in normal]
    assert all(types[i] == TokenType.NORMAL for i in normal)
    assert _field(reader, "tokenizer.ggml.merges") == _field(vocab, "tokenizer.ggml.merges")
    for text, token_id in want.specials.items():
        assert tokens[token_id] == text
        # control tokens as llama.cpp sees them; Qwen2.5's <tool_call> is added but not special
        assert types[token_id] == (TokenType.USER_DEFINED if text == "<tool_call>" else TokenType.CONTROL)

    tensors = {t.name: t for t in reader.tensors}
    assert ("output.weight" in tensors) is not want.tied
    assert ("rope_freqs.weight" in tensors) is (name == "tiny-llama")  # Llama 3 rope scaling made it through
    assert list(tensors["token_embd.weight"].shape) == [256, want.n_vocab]
    matrices = [t for t in reader.tensors if len(t.shape) == 2]
    assert len(matrices) == 7 * 4 + 1 + (not want.tied)
    # every matrix row a multiple of 256, so k-quants (256-value super-blocks) apply to all of them
    assert all(int(t.shape[0]) % 256 == 0 for t in matrices), [(t.name, list(t.shape)) for t in matrices]


# Independent of make_tiny_model.py's own check: the raw `tokenizers` library, as vLLM and others load it.
_VECTOR_CHECK = r"""
import json, sys
from tokenizers import Tokenizer

tok = Tokenizer.from_file(sys.argv[1])
texts = open(sys.argv[2] + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")[:-1]
lines = open(sys.argv[2] + ".out", encoding="utf-8").read().split("\n")
ids = lambda text: tok.encode(text, add_special_tokens=False).ids
failed = [t for t, line in zip(texts, lines) if ids(t) != [int(x) for x in line.split()]]
specials = {s: ids(s) for s in sys.argv[3:]}
default = tok.encode("Hi").ids  # with the post-processor's special tokens
print(json.dumps({"total": len(texts), "failed": failed, "specials": specials, "default": default}))
"""


@pytest.mark.slow
def test_tokenizer_reproduces_llama_cpp_test_vectors(tiny: tuple[str, Path], settings: Settings) -> None:
    name, model_dir = tiny
    want = EXPECTED[name]
    llama = llama_cpp(settings)
    vocab = llama.source / "models" / want.vocab_gguf
    done = run([llama.python, "-c", _VECTOR_CHECK, model_dir / "tokenizer.json", vocab, *want.specials])
    result = json.loads(done.stdout)
    assert result["total"] == 46 and result["failed"] == [], result["failed"]
    assert result["specials"] == {text: [token_id] for text, token_id in want.specials.items()}
    assert result["default"][: int(want.add_bos)] == ([want.bos] if want.add_bos else [])


@pytest.mark.slow
def test_second_call_reuses_the_generated_model(tiny: tuple[str, Path], settings: Settings) -> None:
    name, model_dir = tiny
    before = (model_dir / "model.safetensors").stat()
    assert ensure_tiny_model(name, settings) == model_dir
    after = (model_dir / "model.safetensors").stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


@pytest.mark.slow
def test_incomplete_or_foreign_model_is_not_trusted(tiny_qwen2: Path, tmp_path: Path) -> None:
    recipe, digest = tiny_recipe("tiny-qwen2"), recipe_hash("tiny-qwen2")
    partial = tmp_path / "partial"
    shutil.copytree(tiny_qwen2, partial, ignore=shutil.ignore_patterns("model.safetensors"))
    with pytest.raises(ArtifactError, match=r"missing model\.safetensors"):
        check_tiny_model(partial, recipe, digest)
    with pytest.raises(ArtifactError, match="another recipe"):
        check_tiny_model(tiny_qwen2, recipe, "0" * 64)
    with pytest.raises(ArtifactError, match="not a llama model"):
        check_tiny_model(tiny_qwen2, tiny_recipe("tiny-llama"), digest)


@pytest.mark.slow
def test_generation_is_deterministic(settings: Settings, tmp_path: Path) -> None:
    # Two short runs of the same recipe on this machine give the same bytes in every file. (Across machines
    # they need not: float reductions differ between CPU instruction sets. The cache is per machine.)
    llama = llama_cpp(settings)
    recipe = TinyRecipe(family="qwen2", train_steps=10)
    outs = [tmp_path / "a", tmp_path / "b"]

    def generate(out: Path) -> None:
        run([llama.python, SCRIPT, "generate", *recipe.argv(), "--out", out, "--llama-cpp-src", llama.source,
             "--train-text", TRAIN_TEXT, "--eval-text", EVAL_TEXT], timeout=900)  # fmt: skip

    # both at once (each is mostly imports and tokenizer loading): the same bytes even while they share the CPU
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(generate, outs))
    files = sorted(p.name for p in outs[0].iterdir())
    assert files == sorted(p.name for p in outs[1].iterdir())
    assert "model.safetensors" in files
    assert {f: sha256_file(outs[0] / f) for f in files} == {f: sha256_file(outs[1] / f) for f in files}


@pytest.mark.slow
def test_modelmints_header_reader_agrees_with_gguf_py(converted) -> None:
    """read_gguf_header (what every step's read-back uses) decodes the same values and tensor table as
    gguf-py's GGUFReader, including the 150k-token vocabulary when asked for it."""
    from gguf import GGMLQuantizationType

    from pipelines.core.ggufheader import inspect_gguf, read_gguf_header

    _, _, reader = converted
    path = Path(reader.data.filename)
    header = read_gguf_header(path, lambda key, _found: True)
    assert set(header.metadata) == set(reader.fields) - {f for f in reader.fields if f.startswith("GGUF.")}
    for key in ("general.architecture", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                "tokenizer.chat_template", "tokenizer.ggml.eos_token_id"):
        assert header.metadata[key] == _field(reader, key), key
    assert [(t.name, t.shape, t.ggml_type, t.offset) for t in header.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset)) for t in reader.tensors
    ]
    info = inspect_gguf(path)
    assert info.tensor_count == len(reader.tensors)
    assert info.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert sum(info.tensor_types.values()) == len(reader.tensors)
    assert set(info.tensor_types) == {GGMLQuantizationType(t.tensor_type).name for t in reader.tensors}
    assert info.eos_token_id == _field(reader, "tokenizer.ggml.eos_token_id")
    # only what was asked for is decoded
    assert set(read_gguf_header(path, lambda key, _found: key == "general.name").metadata) == {"general.name"}
