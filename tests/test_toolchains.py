"""The toolchain setup scripts: their own checks against the installed toolchains, and the staged, locked,
resumable build (toolchains/lib.sh) under failures, Ctrl-C, a full disk, no package index and no compiler."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipelines.core.settings import Settings, project_root

ROOT = project_root()
LIB = ROOT / "toolchains" / "lib.sh"
SETUP_SCRIPTS = sorted((ROOT / "toolchains").glob("setup-*.sh"))


@pytest.mark.parametrize("script", SETUP_SCRIPTS, ids=lambda p: p.name)
def test_setup_script_checks_pass_on_the_installed_toolchain(script: Path) -> None:
    """Each setup script's own smoke checks, run against what is installed: a broken check fails the suite,
    not only a new user's first setup."""
    env = {**os.environ, "MODELMINT_HOME": str(Settings.from_env().home)}
    run = subprocess.run(["bash", str(script), "--check"], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checks passed" in run.stdout


def test_no_early_exiting_reader_behind_a_pipe_under_pipefail() -> None:
    """`tool | grep -q X` under pipefail fails at random: grep exits at its first match and the tool's next
    write dies of SIGPIPE. Scripts capture the output first, then match it (tc_output_has)."""
    pattern = re.compile(r"\|\s*(grep\s+-\w*[qm]|grep\s+--(quiet|max-count)|head\b|sed\s+-n\s+['\"]?\d+q)")
    offenders = []
    files = [*ROOT.glob("**/*.sh"), *ROOT.glob("containers/**/Dockerfile"), ROOT / ".ci" / "run"]
    for path in files:
        if ".venv" in path.parts or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        if "pipefail" not in text:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if not line.lstrip().startswith("#") and pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "early-exiting readers under pipefail:\n" + "\n".join(offenders)


def test_the_package_builds_without_setuptools_warnings_and_carries_its_data(tmp_path: Path) -> None:
    """The first command's output stays quiet: the data directories are declared the way setuptools wants."""
    import shutil
    import zipfile

    # built from a copy: setuptools writes build/ and *.egg-info next to the sources it builds
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "artifacts", "__pycache__",
                                                             "*.egg-info", ".pytest_cache", ".ruff_cache"))
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    noise = [line for line in (run.stdout + run.stderr).splitlines()
             if "Warning" in line or "is absent from the `packages`" in line]
    assert not noise, "\n".join(noise)
    (wheel,) = tmp_path.glob("modelmint-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("pipelines/data/train.txt", "pipelines/data/eval.txt", "pipelines/data/gpus.yaml", "pipelines/gorender/main.go",
              "pipelines/gorender/go.mod"):
        assert f in names


# ---------------------------------------------------------------- the staged build, on a toolchain of its own

FAKE = textwrap.dedent(
    """\
    set -euo pipefail
    source "$LIB"
    tc_init "fake toolchain" "$MODELMINT_HOME/toolchains/fake-1" "bash $0"
    fetch() { echo x >> "$COUNT/fetch"; echo fetched; }
    build() {
      echo x >> "$COUNT/build"
      [[ -n ${NO_INDEX:-} ]] && "$PYTHON" -m pip download --no-deps --retries 0 --timeout 3 \\
          --index-url "http://127.0.0.1:$NO_INDEX/simple" -d "$TC_PREFIX/dl" some-package
      [[ -n ${FILL_MB:-} ]] && head -c "${FILL_MB}M" /dev/zero > "$TC_PREFIX/blob"
      sleep "${BUILD_S:-0}"
      echo built > "$TC_PREFIX/out"
    }
    check() {
      local out
      out=$(cat "$TC_PREFIX/out")
      [[ -z ${BREAK_CHECK:-} ]] || { echo "the tool does not report the pinned commit"; exit 1; }
      [[ $out == built ]]
    }
    tc_begin "$@"
    tc_stage fetch "fetch the sources" fetch
    tc_stage build "build the tools" build
    tc_stage check "check the tools" check
    tc_done
    """
)


class Fake:
    """A toolchain setup script built from toolchains/lib.sh, with switches to make its stages fail."""

    def __init__(self, tmp: Path, home: Path | None = None) -> None:
        self.script = tmp / "setup-fake.sh"
        self.script.write_text(FAKE)
        self.home = home or tmp / "home"
        self.count = tmp / "count"
        self.count.mkdir(exist_ok=True)
        self.prefix = self.home / "toolchains" / "fake-1"

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "LIB": str(LIB), "MODELMINT_HOME": str(self.home), "COUNT": str(self.count),
                "PYTHON": sys.executable, **extra}

    def run(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(self.script)], env=self.env(**extra), capture_output=True, text=True,
                              timeout=120)

    def popen(self, **extra: str) -> subprocess.Popen[str]:
        # Ctrl-C as a terminal delivers it: a test run started in the background of a script inherits SIGINT
        # ignored, and bash cannot trap a signal that was ignored when it started
        return subprocess.Popen(["bash", str(self.script)], env=self.env(**extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def runs(self, stage: str) -> int:
        f = self.count / stage
        return len(f.read_text().splitlines()) if f.exists() else 0


def test_a_failed_check_keeps_the_build_and_a_rerun_does_only_what_is_missing(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    failed = fake.run(BREAK_CHECK="1")
    assert failed.returncode != 0
    err = failed.stderr
    assert "failed at stage 'check'" in err
    assert f"{fake.home}/logs/setup/fake-1/check.log" in err
    assert "kept:  stages already done: build fetch" in err
    assert "the tool does not report the pinned commit" in err  # the log's tail
    assert "next:" in err and f"bash {fake.script}" in err
    assert not (fake.prefix / ".complete").exists()

    rerun = fake.run()
    assert rerun.returncode == 0, rerun.stderr
    assert "build the tools (done in an earlier run)" in rerun.stdout
    assert (fake.runs("fetch"), fake.runs("build")) == (1, 1)
    assert (fake.prefix / ".complete").exists()
    again = fake.run()
    assert again.returncode == 0 and "fake toolchain ready" in again.stdout
    assert fake.runs("build") == 1


def test_two_setups_at_once_build_once(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    first = fake.popen(BUILD_S="3")
    deadline = time.monotonic() + 30
    while fake.runs("build") == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    second = fake.popen()
    out2, err2 = second.communicate(timeout=60)
    _out1, err1 = first.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    assert "waiting for another setup of fake toolchain" in out2
    assert fake.runs("build") == 1
    assert (fake.prefix / ".complete").exists()


def test_ctrl_c_during_a_stage_then_a_rerun_finishes(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    proc = fake.popen(BUILD_S="60")
    deadline = time.monotonic() + 30
    while fake.runs("build") == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "interrupted during: build the tools" in out
    assert not (fake.prefix / ".stages" / "build").exists()
    assert not _stage_children(fake), "the interrupted stage's processes outlived the setup"

    rerun = fake.run()
    assert rerun.returncode == 0, rerun.stderr
    assert (fake.runs("fetch"), fake.runs("build")) == (1, 2)
    assert (fake.prefix / ".complete").exists()


def _stage_children(fake: Fake) -> list[int]:
    """Processes of this fake setup's stage still alive (its `sleep`, found by the COUNT it inherited)."""
    import psutil

    time.sleep(0.5)
    alive = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.info["cmdline"][:1] == ["sleep"] and p.environ().get("COUNT") == str(fake.count):
                alive.append(p.pid)
        except (psutil.Error, TypeError):
            continue
    return alive


def test_a_full_disk_names_the_disk_and_a_rerun_finishes(tmp_path: Path, small_disk) -> None:
    fake = Fake(tmp_path, home=small_disk("2m"))
    failed = fake.run(FILL_MB="8")
    assert failed.returncode != 0
    assert "failed at stage 'build'" in failed.stderr
    assert "the disk is full" in failed.stderr
    assert str(fake.prefix) in failed.stderr
    (fake.prefix / "blob").unlink()  # what the user does: free space
    rerun = fake.run()
    assert rerun.returncode == 0, rerun.stderr
    assert fake.runs("fetch") == 1


def test_no_package_index_says_so_and_a_rerun_finishes(tmp_path: Path) -> None:
    from registry_env import free_port

    fake = Fake(tmp_path)
    failed = fake.run(NO_INDEX=str(free_port()), PIP_FIND_LINKS="", PIP_EXTRA_INDEX_URL="", PIP_CONFIG_FILE="/dev/null")
    assert failed.returncode != 0
    assert "pip could not get a package from the index" in failed.stderr
    rerun = fake.run()
    assert rerun.returncode == 0, rerun.stderr


def test_a_machine_without_a_compiler_or_apt_get_is_told_what_to_install(tmp_path: Path) -> None:
    """The real llama.cpp setup script on a PATH without cmake, ninja, g++ and apt-get."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    hidden = {"cmake", "ninja", "g++", "apt-get", "c++"}
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(d).iterdir():
            if tool.name not in hidden and not (bindir / tool.name).exists():
                (bindir / tool.name).symlink_to(tool)
    env = {**os.environ, "PATH": str(bindir), "MODELMINT_HOME": str(tmp_path / "home")}
    run = subprocess.run(["bash", str(ROOT / "toolchains" / "setup-llama-cpp.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 1
    assert "needs cmake ninja g++" in run.stderr
    assert "apt-get is not available" in run.stderr
    assert "cmake ninja-build g++" in run.stderr and "bash toolchains/setup-llama-cpp.sh" in run.stderr


def test_output_check_survives_a_tool_that_writes_twice(tmp_path: Path) -> None:
    """The check that failed at random on a fresh machine: a tool that prints its version in two writes."""
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho 'version: 1 (commit 0c1e570)' >&2\nsleep 0.05\necho 'built with cc' >&2\n")
    tool.chmod(0o755)
    script = f'set -euo pipefail; source "{LIB}"; for i in $(seq 20); do tc_output_has "commit 0c1e570" "{tool}" & done; wait'
    checks = [subprocess.Popen(["bash", "-c", script]) for _ in range(3)]
    assert [c.wait(timeout=60) for c in checks] == [0, 0, 0]
    broken = subprocess.run(["bash", "-c", f'set -euo pipefail; source "{LIB}"; tc_output_has "commit abc" "{tool}"'],
                            capture_output=True, text=True)
    assert broken.returncode == 1 and "does not print 'commit abc'" in broken.stderr
