"""The CLI's one error edge (pipelines/cli/_edge.py): every exception is one `error:` line and a hint, never a
traceback unless MODELMINT_DEBUG=1 asks for it; and the builtins that escaped commands before are modelmint's
errors at their source now."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from pipelines.cli._edge import describe, main
from pipelines.core.errors import ConfigError

MODELMINT = str(Path(sys.executable).parent / "modelmint")

# A command line of its own, run through the real edge: what it raises no library code names, so the edge itself
# is under test and the trigger does not vanish when a library bug is fixed.
planted = typer.Typer(pretty_exceptions_enable=False)


@planted.command("missing-file")
def _missing_file() -> None:
    Path("/nonexistent-modelmint-dir/weights.gguf").read_bytes()


@planted.command("value")
def _value() -> None:
    raise ValueError("an unexpected value")


@planted.command("config")
def _config() -> None:
    raise ConfigError("a bad setting", hint="set it right")


def _edge(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str, debug: bool = False
) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", "400")  # one error line stays one line
    if debug:
        monkeypatch.setenv("MODELMINT_DEBUG", "1")
    else:
        monkeypatch.delenv("MODELMINT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        main(list(args), command=planted, prog_name="modelmint")
    code = done.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_an_os_error_naming_a_path_is_that_path_and_its_cause(capsys, monkeypatch) -> None:
    code, text = _edge(capsys, monkeypatch, "missing-file")
    assert code == 1 and "Traceback" not in text, text
    assert _errors(text) == ["error: /nonexistent-modelmint-dir/weights.gguf: No such file or directory"], (
        text
    )
    assert "MODELMINT_DEBUG=1" in text and "bug" not in text, (
        text
    )  # a path the user gave, not modelmint's fault


def test_anything_else_is_one_line_naming_it_a_bug(capsys, monkeypatch) -> None:
    code, text = _edge(capsys, monkeypatch, "value")
    assert code == 1 and "Traceback" not in text, text
    assert _errors(text) == ["error: ValueError: an unexpected value"], text
    assert "this is a bug in modelmint: set MODELMINT_DEBUG=1 for the traceback" in text


@pytest.mark.parametrize("command", ["missing-file", "value", "config"])
def test_debug_prints_the_traceback_then_the_same_line(capsys, monkeypatch, command: str) -> None:
    plain = _errors(_edge(capsys, monkeypatch, command)[1])
    code, text = _edge(capsys, monkeypatch, command, debug=True)
    assert code == 1 and "Traceback (most recent call last)" in text, text
    assert f"_{command.replace('-', '_')}" in text  # the frame that raised
    assert _errors(text) == plain and len(plain) == 1, text


def test_a_modelmint_error_is_its_message_and_its_hint(capsys, monkeypatch) -> None:
    code, text = _edge(capsys, monkeypatch, "config")
    assert code == 1 and text.splitlines() == ["error: a bad setting", "→ set it right"], text


def test_a_full_disk_is_named_as_one(capsys, monkeypatch) -> None:
    message, hint = describe(OSError(errno.ENOSPC, "No space left on device", "/data/build/x.gguf"))
    assert message.startswith("no space left on the device holding /data/build/x.gguf"), message
    assert hint is not None and "free space" in hint and "MODELMINT_DEBUG=1" in hint


def test_an_os_error_without_a_path_is_a_bug() -> None:
    message, hint = describe(OSError("something low-level"))
    assert message == "OSError: something low-level" and hint is not None and "bug" in hint


def test_a_usage_error_stays_typers(capsys, monkeypatch) -> None:
    code, text = _edge(capsys, monkeypatch, "value", "--bogus")
    assert code == 2 and "No such option: --bogus" in text and not _errors(text), text


# ---------------------------------------------------------------- builtins that escaped commands, now modelmint's


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MODELMINT_REPO": str(tmp_path / "repo"), "COLUMNS": "400"}
    env.pop("MODELMINT_DEBUG", None)
    return subprocess.run(
        [MODELMINT, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def _gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<|im_start|>", "<|im_end|>", "a"])
    w.add_eos_token_id(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("out", ["a-folder", "a-file/Modelfile"])
def test_modelfile_out_that_cannot_be_written_names_the_option(tmp_path: Path, out: str) -> None:
    """Was `IsADirectoryError: … 'Modelfile.partial-123' -> …` / `FileExistsError`, called a bug."""
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("")
    (tmp_path / "t.tmpl").write_text("{{ .Prompt }}")
    model = _gguf(tmp_path / "m.gguf")
    proc = _run(tmp_path, "modelfile", str(model), "--no-verify", "--template", "t.tmpl", "--out", out)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert _errors(proc.stderr) == [
        f"error: --out {out}: cannot write it ({'Is a directory' if out == 'a-folder' else 'File exists'})"
    ], proc.stderr
    assert "bug" not in proc.stderr and "modelmint modelfile" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if ".partial-" in p.name) == []


def test_registry_serve_dir_that_cannot_be_made_names_it(tmp_path: Path) -> None:
    """Was `FileNotFoundError: [Errno 2] … '/proc/…'` / `NotADirectoryError`, called a bug."""
    (tmp_path / "a-file").write_text("")
    proc = _run(tmp_path, "registry", "serve", "--port", "0", "--dir", str(tmp_path / "a-file" / "registry"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert _errors(proc.stderr) == [
        f"error: cannot make the registry's storage {tmp_path}/a-file/registry/storage: Not a directory"
    ], proc.stderr
    assert "give --dir a folder you can write" in proc.stderr and "bug" not in proc.stderr
