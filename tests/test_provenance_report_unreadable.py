"""An unreadable pip installation report of the venv that built an artifact: signed registration goes on, recording
the venv by version only, and says why and the command that sets the venv up again, once and without a traceback;
the reader's error is a modelmint error whose hint is that command (real git + DVC repositories, real keys)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
from registry_env import Repo, candidate
from test_signing import _key

from pipelines.core.errors import ModelmintError
from pipelines.core.toolchains import (
    LLAMA_CPP_DIR,
    PIP_REPORTS,
    ReportUnreadable,
    python_toolchain,
    read_pins,
)
from pipelines.registry.register import artifact_dir, register
from pipelines.trust import provenance


def test_an_unreadable_report_is_named_with_the_command_that_sets_the_venv_up_again(
    repo: Repo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pins = read_pins("llama-cpp")
    home = tmp_path / "home"
    prefix = home / "toolchains" / LLAMA_CPP_DIR.format(**pins)
    (prefix / "venv").mkdir(parents=True)
    (prefix / PIP_REPORTS).mkdir()
    report = prefix / PIP_REPORTS / "01.json"
    report.write_text("{not json")
    command = (f"rm -f {prefix}/.complete {prefix}/.stages/venv {prefix}/.stages/check && "
               "bash toolchains/setup-llama-cpp.sh")

    # registration with a signing key reads it (the provenance builder): it registers, and the log says why the
    # venv is recorded by version only and what to run, once, with no traceback
    private, _ = _key(tmp_path / "signing.pem")
    settings = repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_HOME=home)
    c = candidate(settings, tmp_path / "build")
    c = dataclasses.replace(c, toolchain={**c.toolchain, "converter.torch": pins["CONVERTER_TORCH"],
                                          "converter.transformers": pins["CONVERTER_TRANSFORMERS"]})
    with caplog.at_level(logging.WARNING, logger="pipelines.trust.provenance"):
        register(settings, c)
    (said,) = [r for r in caplog.records if r.name == "pipelines.trust.provenance"]
    text = said.getMessage()
    assert said.exc_info is None and "Traceback" not in caplog.text
    assert f"{report} is not a readable pip installation report (JSONDecodeError" in text
    assert text.count(command) == 1 and "→" not in text
    stmt = json.loads((artifact_dir(settings, "tiny-qwen2", "q4_k_m") / provenance.PROVENANCE).read_text())
    deps = {d["name"]: d for d in stmt["predicate"]["buildDefinition"]["resolvedDependencies"]}
    note = deps["toolchain:converter.torch"]["annotations"]["source"]
    assert "unreadable (01.json: JSONDecodeError" in note and str(tmp_path) not in note

    # the reader's own error: a modelmint error (what the CLI edge formats), with its path, cause and next command
    venv = python_toolchain(home / "toolchains", c.toolchain)
    assert venv is not None
    with pytest.raises(ReportUnreadable) as err:
        venv.installed()
    assert isinstance(err.value, ModelmintError) and not err.value.transient
    assert err.value.path == report and err.value.cause.startswith("01.json: JSONDecodeError")
    assert err.value.hint is not None and command in err.value.hint
    assert str(err.value) == f"{err.value.message}\n  → {err.value.hint}"
