"""What the CLI says where there is nothing to show or the input is not what it expects: `list` in a fresh
repository, `inspect` on a directory or a damaged file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.core.errors import ArtifactError
from pipelines.core.ggufheader import architecture_problem, inspect_gguf

MODELMINT = str(Path(sys.executable).parent / "modelmint")


def _run(tmp_path: Path, *args: str, repo: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MODELMINT_REPO": str(repo or tmp_path / "repo"), "COLUMNS": "200"}
    return subprocess.run([MODELMINT, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def _no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr


@pytest.mark.parametrize("layout", ["no registry directory", "empty manifests directory"])
def test_list_in_a_fresh_repository(tmp_path: Path, layout: str) -> None:
    repo = tmp_path / "repo"
    if layout == "empty manifests directory":
        (repo / "registry" / "manifests").mkdir(parents=True)
    proc = _run(tmp_path, "list", repo=repo)
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert "nothing registered yet" in proc.stderr
    assert "modelmint convert NAME --register" in proc.stderr and "modelmint catalog list" in proc.stderr


def test_list_with_only_invalid_manifests_names_each(tmp_path: Path) -> None:
    manifests = tmp_path / "repo" / "registry" / "manifests" / "tiny-qwen2"
    manifests.mkdir(parents=True)
    (manifests / "q4_k_m.json").write_text("{not json")
    (manifests / "q8_0.json").write_text(json.dumps({"name": "tiny-qwen2"}))
    proc = _run(tmp_path, "list")
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert any("q4_k_m.json is invalid: not JSON" in line for line in lines), proc.stderr
    assert any("q8_0.json is invalid:" in line and "Field required" in line for line in lines), proc.stderr
    assert "2 manifest(s)" in proc.stderr and "none valid" in proc.stderr
    assert "git checkout --" in proc.stderr  # the next step


def _gguf(path: Path, n: int = 4096) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_eos_token_id(0)
    w.add_tensor("token_embd.weight", np.arange(n, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_inspect_a_directory(tmp_path: Path) -> None:
    proc = _run(tmp_path, "inspect", str(tmp_path))
    _no_traceback(proc)
    assert proc.returncode == 1
    assert f"{tmp_path} is a directory, not a GGUF file" in proc.stderr and f"ls {tmp_path}" in proc.stderr


def test_inspect_a_missing_file_and_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    proc = _run(tmp_path, "inspect", str(tmp_path / "nope.gguf"))
    _no_traceback(proc)
    assert proc.returncode == 1 and "nope.gguf does not exist" in proc.stderr
    text = tmp_path / "notes.gguf"
    text.write_text("# not a model\n" * 4)
    proc = _run(tmp_path, "inspect", str(text))
    _no_traceback(proc)
    assert proc.returncode == 1 and "is not a GGUF file" in proc.stderr


def test_inspect_a_truncated_gguf_says_what_to_do(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf")
    assert inspect_gguf(path).tensor_count == 1
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size - 1000)  # the header is whole; the tensor data is cut short
    with pytest.raises(ArtifactError, match="ends at byte") as exc:
        inspect_gguf(path)
    assert exc.value.hint is not None and "rerun the step that wrote it" in exc.value.hint
    proc = _run(tmp_path, "inspect", str(path))
    _no_traceback(proc)
    assert proc.returncode == 1 and "is truncated" in proc.stderr
    assert "modelmint convert NAME" in proc.stderr and "modelmint pull NAME:TAG" in proc.stderr


@pytest.mark.parametrize("var", ["MODELMINT_THREADS", "MODELMINT_PREFECT_PORT"])
def test_a_non_integer_number_variable_is_one_error_line(tmp_path: Path, var: str) -> None:
    env = {**os.environ, "MODELMINT_REPO": str(tmp_path / "repo"), "COLUMNS": "200", var: "four"}
    proc = subprocess.run([MODELMINT, "list"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    _no_traceback(proc)
    assert proc.returncode in (1, 2), proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and var in errors[0] and "'four'" in errors[0], proc.stderr
    assert f"set {var}" in proc.stderr


# A command planted on the real app that raises what no library code names: the edge itself is under test, so
# the trigger does not vanish when a library bug is fixed (the catalog-directory case is a ConfigError now).
_PLANTED = """
import sys
from pipelines import cli

@cli.app.command("planted-fault")
def planted_fault() -> None:
    raise KeyError("general.architecture")

sys.argv = ["modelmint", "planted-fault"]
cli.main()
"""


def test_an_unexpected_exception_is_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    args = [sys.executable, "-c", _PLANTED]
    env = {**os.environ, "MODELMINT_REPO": str(tmp_path / "repo"), "COLUMNS": "200"}
    env.pop("MODELMINT_DEBUG", None)
    proc = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: KeyError: 'general.architecture'"], proc.stderr
    assert "MODELMINT_DEBUG=1" in proc.stderr
    debug = subprocess.run(args, env={**env, "MODELMINT_DEBUG": "1"}, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
    assert "Traceback" in debug.stderr and "planted_fault" in debug.stderr


def test_a_catalog_path_naming_a_directory_is_a_config_error(tmp_path: Path) -> None:
    env = {**os.environ, "MODELMINT_REPO": str(tmp_path / "repo"), "COLUMNS": "200", "MODELMINT_CATALOG": str(tmp_path)}
    proc = subprocess.run([MODELMINT, "catalog", "list"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is a directory" in errors[0], proc.stderr
    assert f"set MODELMINT_CATALOG={tmp_path / 'catalog.yaml'}" in proc.stderr
    assert "IsADirectoryError" not in proc.stderr and "MODELMINT_DEBUG" not in proc.stderr


@pytest.mark.parametrize("option", ["--template", "--source"])
def test_modelfile_with_a_missing_template_or_source_names_it(tmp_path: Path, option: str) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    proc = _run(tmp_path, "modelfile", str(gguf), option, str(tmp_path / "missing"))
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and option in errors[0] and "missing" in errors[0], proc.stderr
    assert "modelmint modelfile" in proc.stderr and "MODELMINT_DEBUG" not in proc.stderr


def _nested(depth: int) -> list[object]:
    value: list[object] = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def _gguf_with(path: Path, key: str, value: object) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_eos_token_id(0)
    if isinstance(value, list):
        w.add_array(key, value)
    else:
        w.add_string(key, str(value))
    w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # gguf-py's writer packs a nested array by recursion too
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
    finally:
        sys.setrecursionlimit(limit)
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(("key", "value", "says"), [
    ("split.no", "two", "metadata split.no is a string ('two'), not an integer"),
    ("general.file_type", [15, 7], "metadata general.file_type is an array ([15, 7]), not an integer"),
    ("tokenizer.ggml.model", [1, 2], "metadata tokenizer.ggml.model is an array ([1, 2]), not a string"),
    ("general.tags", _nested(3000), "metadata arrays nested more than 16 deep"),
])
def test_inspect_malformed_metadata_is_one_error_line(tmp_path: Path, key: str, value: object, says: str) -> None:
    path = _gguf_with(tmp_path / "m.gguf", key, value)
    with pytest.raises(ArtifactError, match=re.escape(says)):
        inspect_gguf(path)
    proc = _run(tmp_path, "inspect", str(path))
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], proc.stderr
    assert "MODELMINT_DEBUG" not in proc.stderr and "rerun the step that wrote it" in proc.stderr


def test_metadata_nested_a_few_levels_still_reads(tmp_path: Path) -> None:
    path = _gguf_with(tmp_path / "m.gguf", "general.tags", _nested(4))
    assert inspect_gguf(path).architecture == "qwen2"


def test_inspect_refuses_an_architecture_its_tensors_contradict(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "bert")  # a qwen2 decoder's tensors under an encoder's name
    w.add_tokenizer_model("gpt2")
    w.add_eos_token_id(0)
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "output.weight"):
        w.add_tensor(name, np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    problem = architecture_problem(path)
    assert problem is not None and "2 of its 4 tensors" in problem
    assert "blk.0.ffn_gate.weight, output.weight" in problem
    proc = _run(tmp_path, "inspect", str(path))
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "declares architecture 'bert'" in errors[0], proc.stderr
    assert "modelmint convert NAME" in proc.stderr


def _moe_as_dense(path: Path, *, experts: bool = True) -> Path:
    """A Qwen2-MoE layer's tensors (a router and stacked experts) under the dense `arch`, with the shape keys the
    planner sizes a model by: a plan would size the experts' memory as if it were one dense MLP."""
    import gguf

    arch = "qwen2"
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (("block_count", 1), ("attention.head_count", 4), ("attention.head_count_kv", 2),
                       ("embedding_length", 64), ("context_length", 512)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_eos_token_id(0)
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight"]
    for name in names if experts else names[:2]:
        w.add_tensor(name, np.zeros((64, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_plan_refuses_an_architecture_its_tensors_contradict(tmp_path: Path) -> None:
    path = _moe_as_dense(tmp_path / "m.gguf")
    proc = _run(tmp_path, "plan", str(path), "--gpus", "1xL4-24G")
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "declares architecture 'qwen2' but 2 of its 4 tensors" in errors[0], proc.stderr
    assert "blk.0.ffn_gate_inp.weight" in errors[0] and "modelmint convert NAME" in proc.stderr
    # the same file with only the tensors qwen2 has is planned
    ok = _run(tmp_path, "plan", str(_moe_as_dense(tmp_path / "dense.gguf", experts=False)), "--gpus", "1xL4-24G")
    assert ok.returncode == 0 and "1x1xL4-24G: engine ollama" in ok.stdout, ok.stderr


def test_a_consistent_architecture_passes(tmp_path: Path) -> None:
    assert architecture_problem(_gguf(tmp_path / "m.gguf")) is None


@pytest.mark.parametrize(("jinja", "line", "says"), [
    ("{% for m in messages %}\n{{ m.content }}\n{% if loop.index0 - 1 %}x{% endfor %}\n", 3, "unknown tag 'endfor'"),
    ("{{ bos_token }}\n{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}", 2,
     "No filter named 'nosuchfilter'"),
    ("<|im_start|>{{ messages[0]['content'] + 1 }\n", 1, "unexpected '}'"),
])
def test_invalid_jinja_is_reported_as_invalid_jinja_with_its_line(tmp_path: Path, jinja: str, line: int,
                                                                    says: str) -> None:
    from pipelines.chat.families import detect_family
    from pipelines.chat.jinja import InvalidJinja

    with pytest.raises(InvalidJinja, match=f"not valid Jinja: line {line} .*{re.escape(says)}"):
        detect_family(jinja)
    path = tmp_path / "t.jinja"
    path.write_text(jinja)
    proc = _run(tmp_path, "template", str(path))
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"not valid Jinja: line {line}" in errors[0], proc.stderr
    assert "arithmetic" not in proc.stderr and "nearest family" not in proc.stderr


def test_modelfile_names_invalid_jinja_in_the_gguf(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<|im_end|>", "a"])
    w.add_eos_token_id(0)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }<|im_end|>{% endfor %}")
    w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    proc = _run(tmp_path, "modelfile", str(path), "--no-verify")
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "not valid Jinja: line 1" in errors[0] and "unexpected '}'" in errors[0], proc.stderr
    assert "arithmetic" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("ref", ["a:b:c", "tiny-qwen2:smile:", "x:100:y"])
def test_a_ref_is_shown_as_typed_not_as_an_emoji(tmp_path: Path, ref: str) -> None:
    """rich turned ':b:' in 'a:b:c' into an emoji: the error line must show what the user typed."""
    proc = _run(tmp_path, "show", ref)
    _no_traceback(proc)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {ref!r} is not an artifact reference"], proc.stderr


@pytest.mark.parametrize("gpus", ["99999999999999999999xL4-24G", "100001x8xH100-80G", "1x2000xH100-80G",
                                  "inventory"])
def test_plan_on_more_gpus_than_any_cluster_has_is_one_error_line(tmp_path: Path, gpus: str) -> None:
    """A count of 10**20 GPUs per node kept the planner searching its divisors for hours."""
    if gpus == "inventory":
        (tmp_path / "inv.yaml").write_text("- {nodes: 3, gpus: 99999999999999999999, type: H100-80G}\n")
        gpus = str(tmp_path / "inv.yaml")
    path = _moe_as_dense(tmp_path / "m.gguf", experts=False)
    proc = _run(tmp_path, "plan", str(path), "--gpus", gpus)
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "more than any cluster has" in errors[0], proc.stderr
