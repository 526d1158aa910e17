"""Generated bad arguments, files and environment values for the CLI: never a traceback, exit 1 or 2, and one
`error:` line naming the cause (exit 2 is typer's usage box, which names the option)."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from pipelines import cli

# In-process (a subprocess per example would spend the budget on interpreter starts); an exception escaping
# main() is what would have been the traceback. The tmp_path is shared by the examples, each rewriting its files.
PROPERTY = settings(max_examples=50, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
UNEXPECTED = "this is a bug in modelmint"


def _main(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Exit code and standard error of `modelmint ARGS` run through the real entry point."""
    stderr, stdout = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELMINT_REPO", str(tmp_path / "repo"))
        mp.setenv("COLUMNS", "400")  # one error line stays one line
        mp.delenv("MODELMINT_DEBUG", raising=False)
        for k, v in (env or {}).items():
            mp.setenv(k, v)
        mp.setattr(sys, "argv", ["modelmint", *args])
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            try:
                cli.main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, stderr.getvalue()


def _one_error_naming(code: int, text: str, *causes: str) -> None:
    assert "Traceback" not in text and UNEXPECTED not in text, text
    assert code in (1, 2), (code, text)
    if code == 1:
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, text
        assert any(c in errors[0] for c in causes), (causes, text)
    else:
        assert "Error" in text and any(c in text for c in causes), (causes, text)


@PROPERTY
@given(body=st.binary(max_size=600))
def test_inspect_a_damaged_gguf(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + body)
    _one_error_naming(*_main(tmp_path, "inspect", str(path)), str(path))


_WRONG = st.one_of(st.text(min_size=1, max_size=20).map(lambda v: ("str", v)),
                   st.integers(0, 2**31).map(lambda v: ("int", v)),
                   st.floats(allow_nan=False, width=32).map(lambda v: ("float", v)),
                   st.booleans().map(lambda v: ("bool", v)),
                   # add_array stores Python ints as INT32
                   st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4).map(lambda v: ("list", v)))
_TYPED = {"general.name": "str", "general.file_type": "int", "split.no": "int", "split.count": "int",
          "tokenizer.chat_template": "str", "tokenizer.ggml.pre": "str", "tokenizer.ggml.bos_token_id": "int",
          "qwen2.context_length": "int"}


@PROPERTY
@given(key=st.sampled_from(sorted(_TYPED)), value=_WRONG)
def test_inspect_metadata_of_the_wrong_type(tmp_path: Path, key: str, value: tuple[str, object]) -> None:
    import gguf

    kind, v = value
    assume(kind != _TYPED[key])  # GGUFWriter.add_string leaves out an empty value: min_size=1 above
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_eos_token_id(0)
    {"str": w.add_string, "int": w.add_uint32, "float": w.add_float32, "bool": w.add_bool,
     "list": w.add_array}[kind](key, v)
    w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _one_error_naming(*_main(tmp_path, "inspect", str(path)), f"metadata {key} is")


_JINJA_BITS = st.sampled_from(["{%", "%}", "{{", "}}", " for m in messages ", " endfor ", " if ", " endif ",
                                "m.content", " - 1", "<|im_start|>", "\n", "|", "nosuch", "'", "(", ")"])


def _compiles(text: str) -> bool:
    from jinja2 import TemplateSyntaxError

    from pipelines.chat.jinja import environment

    try:
        environment().from_string(text)
    except TemplateSyntaxError:
        return False
    return True


@PROPERTY
@given(text=st.one_of(st.text(max_size=300), st.lists(_JINJA_BITS, max_size=30).map("".join)))
def test_template_of_generated_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.jinja"
    path.write_text(text, encoding="utf-8")
    code, out = _main(tmp_path, "template", str(path))
    _one_error_naming(code, out, "chat template")
    if not _compiles(text):  # the cause is the syntax, not a Go construct or a missing marker
        assert "is not valid Jinja: line" in out and "arithmetic" not in out, out


@PROPERTY
@given(text=st.one_of(st.text(max_size=300), st.none()))
def test_catalog_of_generated_text(tmp_path: Path, text: str | None) -> None:
    path = tmp_path / "catalog.yaml"
    if path.is_dir():
        path.rmdir()
    if text is None:  # MODELMINT_CATALOG naming the folder instead of the file
        path.unlink(missing_ok=True)
        path.mkdir()
    else:
        path.write_text(text, encoding="utf-8")
    _one_error_naming(*_main(tmp_path, "catalog", "list", env={"MODELMINT_CATALOG": str(path)}), str(path))


def _not_an_int(v: str) -> bool:
    try:
        int(v.strip())
    except ValueError:
        return bool(v.strip())
    return False


@PROPERTY
@given(var=st.sampled_from(["MODELMINT_THREADS", "MODELMINT_PREFECT_PORT"]),
       value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
       .filter(_not_an_int))
def test_a_number_variable_of_generated_text(tmp_path: Path, var: str, value: str) -> None:
    _one_error_naming(*_main(tmp_path, "list", env={var: value}), var)


@PROPERTY
@given(option=st.sampled_from(["--num-ctx", "--ollama-version", "--bogus"]),
       value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1,
                     max_size=12).filter(_not_an_int))
def test_modelfile_with_generated_option_values(tmp_path: Path, option: str, value: str) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assume(not value.startswith("-"))
    code, text = _main(tmp_path, "modelfile", str(gguf), option, value, "--no-verify")
    # --ollama-version takes any text, so the cause named is then the damaged GGUF (or the version itself)
    _one_error_naming(code, text, option, str(gguf), value)



# The counts shape_of sizes a transformer by (config.json, or its text_config), each a whole number where given.
_CONFIG_COUNTS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
                  "max_position_embeddings", "intermediate_size", "vocab_size", "sliding_window", "kv_lora_rank",
                  "qk_rope_head_dim", "num_experts_per_tok", "moe_intermediate_size")
_JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=3), max_leaves=6)


def _checkpoint(tmp_path: Path, config: object) -> Path:
    import json
    import struct

    ck = tmp_path / "ck"
    ck.mkdir(exist_ok=True)
    # as many parameters as _GOOD_CONFIG's model has (plan refuses weights its config contradicts)
    header = json.dumps({"w": {"dtype": "F16", "shape": [64, 1280], "data_offsets": [0, 163840]}}).encode()
    (ck / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 163840)
    # allow_nan: Python's json writes NaN/Infinity and reads them back, as transformers' configs may hold them
    (ck / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return ck


_GOOD_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 128,
                "vocab_size": 256, "max_position_embeddings": 512}


@PROPERTY
@example(key="text_config", value=3, nested=False)  # AttributeError: 'int' object has no attribute 'get'
@example(key="num_hidden_layers", value=float("inf"), nested=False)  # OverflowError
@example(key="num_attention_heads", value=4.5, nested=False)  # planned, as 4 heads
@example(key="num_attention_heads", value=True, nested=True)  # planned, as 1 head
@given(key=st.sampled_from([*_CONFIG_COUNTS, "text_config", "architectures", "model_type", "layer_types",
                            "use_sliding_window"]),
       value=_JSON_VALUE, nested=st.booleans())
def test_plan_on_a_config_json_with_a_generated_value(tmp_path: Path, key: str, value: object,
                                                       nested: bool) -> None:
    """A plan, or one error line naming config.json; a count given as anything but a whole number is refused."""
    config: dict[str, object] = dict(_GOOD_CONFIG)
    if nested and key != "text_config":  # a multimodal config: the text model's counts under text_config
        config = {"architectures": ["X"], "text_config": {**_GOOD_CONFIG, key: value}}
    else:
        config[key] = value
    code, text = _main(tmp_path, "plan", str(_checkpoint(tmp_path, config)), "--gpus", "1xL4-24G")
    assert "Traceback" not in text and UNEXPECTED not in text, text
    whole = isinstance(value, int) and not isinstance(value, bool)
    if key in _CONFIG_COUNTS and value is not None and not whole:
        assert code == 1, text
    if code != 0:  # the field, or the config.json in the advice (a damaged count), or a plan that cannot fit
        assert code == 1 and len([line for line in text.splitlines() if line.startswith("error:")]) == 1, text
        assert any(c in text for c in ("config.json", key, "does not fit", "the planner cannot size")), text


_REF_BITS = st.sampled_from(["tiny-qwen2", "q4_k_m", ":", "@", "-", ".", "/", "..", " ", "A", "7ae557604adf",
                             "\t", "é", ":b:", "[red]", "%s", "{}", "\\"])


@PROPERTY
@given(command=st.sampled_from(["show", "pull", "verify", "plan"]),
       ref=st.one_of(st.lists(_REF_BITS, min_size=1, max_size=8).map("".join),
                     st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                             min_size=1, max_size=20)))
def test_a_generated_reference(tmp_path: Path, command: str, ref: str) -> None:
    """An artifact reference that is malformed, or names nothing registered, in a fresh checkout."""
    assume(not ref.startswith("-") and ref.strip() and not Path(ref).exists())
    args = [command, ref] + (["--gpus", "1xL4-24G"] if command == "plan" else [])
    code, text = _main(tmp_path, *args)
    assert "Traceback" not in text and UNEXPECTED not in text, text
    assert code in (1, 2), (code, text)
    if code == 1:
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, text
