"""Faults injected into the build and fetch steps as a user meets them, through the real CLI and tools.

SIGKILL at each step, a full disk at each step, a hub that answers 500 / 401 / slowly or stalls mid-download.
Each asserts a clear message naming the cause and a next command that exists, nothing half-written (only
`*.partial-*` leftovers; every final output reads back), and a rerun that completes and reuses finished steps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pipelines.core.ggufheader import check_imatrix, inspect_gguf
from pipelines.core.settings import Settings, project_root
from pipelines.gguf.build import GGUF_EVAL_CHUNKS, GGUF_EVAL_CTX
from pipelines.gguf.validate import check_logits_file

pytestmark = pytest.mark.slow

MODELMINT = [sys.executable, "-m", "pipelines.cli"]
NAME = "tiny-qwen2"
QUANT = "q8_0"
_CLI_TIMEOUT_S = 900  # a bound, so that a hang fails the test instead of blocking the suite

FAULTS = {"injected": 0, "survived": 0}


@pytest.fixture(scope="module", autouse=True)
def _fault_count() -> Iterator[None]:
    yield
    print(f"\nfaults injected: {FAULTS['injected']}, survived: {FAULTS['survived']}")


# ---------------------------------------------------------------- the build under test


@dataclass(frozen=True)
class Step:
    name: str
    output: str
    """The step's final output in the build directory."""
    is_tool: Callable[[list[str]], bool]
    """Whether a process's argv is this step's tool."""


def _prog(argv: list[str]) -> str:
    return Path(argv[0]).name if argv else ""


STEPS = [
    Step("convert", f"{NAME}-f16.gguf", lambda a: any(x.endswith("convert_hf_to_gguf.py") for x in a)),
    Step("quantize", f"{NAME}-{QUANT}.gguf", lambda a: _prog(a) == "llama-quantize"),
    Step("kld base", f"{NAME}-f16.kld-base.bin",
         lambda a: _prog(a) == "llama-perplexity" and "--kl-divergence" not in a),
    # validation's first tool: the smoke generation (then llama-perplexity --kl-divergence)
    Step("validate", f"{NAME}-{QUANT}.report.json", lambda a: _prog(a) == "llama-completion"),
]


@pytest.fixture(scope="module")
def catalog(tiny_qwen2: Path) -> Path:
    """The shipped catalog: tiny-qwen2 (generated once, shared) has no importance matrix, so no imatrix step;
    llama-imatrix on a full disk is in tests/test_disk_full.py."""
    return project_root() / "registry" / "catalog.yaml"


def _env(work: Path, catalog: Path, **extra: str) -> dict[str, str]:
    # These faults are a disk that fills anyway, mid-run (another process took the room): the check before any work
    # (pipelines/core/resources.py) would refuse the small disks below up front; its own test turns it back on.
    env = {**os.environ, "MODELMINT_WORK_DIR": str(work), "MODELMINT_CATALOG": str(catalog),
           "MODELMINT_SKIP_RESOURCE_CHECK": "1", **extra}
    env.setdefault("MODELMINT_THREADS", "2")
    return env


def _argv(name: str) -> list[str]:
    return [*MODELMINT, "convert", name, "--variants", QUANT]


def _cli(env: dict[str, str], name: str = NAME) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(name), env=env, capture_output=True, text=True, timeout=_CLI_TIMEOUT_S)


def _start(env: dict[str, str], log: Path, name: str = NAME) -> subprocess.Popen[bytes]:
    """The CLI in a process group of its own (the tools it starts join it), output to `log`."""
    with open(log, "wb") as fh:
        return subprocess.Popen(_argv(name), env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _group_argvs(pgid: int) -> list[list[str]]:
    argvs = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getpgid(int(d.name)) != pgid:
                continue
            argvs.append((d / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1])
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return argvs


def _kill_when(proc: subprocess.Popen[bytes], running: Callable[[], bool], started: Callable[[], bool]) -> bool:
    """SIGKILL the process group once `running()` and then `started()` (its output begun, or 1 s passed)."""
    while proc.poll() is None and not running():
        time.sleep(0.02)
    if proc.poll() is not None:
        return False
    deadline = time.monotonic() + 1.0
    while running() and not started() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return True


def _kill_at(env: dict[str, str], step: Step, log: Path, *, work: Path, wait_for_output: bool) -> None:
    """Run the CLI and SIGKILL its process group when `step`'s tool is running (and, with `wait_for_output`,
    has begun writing its output)."""
    proc = _start(env, log)

    def running() -> bool:
        return any(step.is_tool(a) for a in _group_argvs(proc.pid))

    def started() -> bool:
        return not wait_for_output or any(p.stat().st_size > 0 for p in work.rglob(f"{step.output}.partial-*"))

    assert _kill_when(proc, running, started), f"{step.name} never ran:\n{log.read_text(errors='replace')}"


def _out_dir(work: Path, name: str = NAME) -> Path:
    dirs = [d for d in (work / name).glob("*") if d.is_dir()] if (work / name).is_dir() else []
    assert len(dirs) <= 1, dirs
    return dirs[0] if dirs else work / name / "not-yet"


def _finished(out_dir: Path) -> dict[str, tuple[int, int]]:
    """Every output a receipt or report vouches for: name → (inode, mtime_ns), to prove a rerun reused it."""
    done = {}
    for p in out_dir.glob("*") if out_dir.is_dir() else []:
        if ".partial-" in p.name:
            continue
        if p.with_name(p.name + ".receipt.json").is_file() or p.name.endswith(".report.json"):
            st = p.stat()
            done[p.name] = (st.st_ino, st.st_mtime_ns)
    return done


def _nothing_half_written(out_dir: Path) -> list[str]:
    """Check that every final output in `out_dir` reads back completely; return the partial leftovers."""
    partials = []
    for p in sorted(out_dir.rglob("*")) if out_dir.is_dir() else []:
        if ".partial-" in p.name:
            partials.append(p.name)
        elif p.name.endswith(".imatrix.gguf"):
            check_imatrix(p)
        elif p.name.endswith(".gguf"):
            inspect_gguf(p)
        elif p.name.endswith(".kld-base.bin"):
            check_logits_file(p, ctx=GGUF_EVAL_CTX, max_chunks=GGUF_EVAL_CHUNKS)
        elif p.name.endswith(".receipt.json"):
            receipt = json.loads(p.read_text())
            output = p.with_name(p.name.removesuffix(".receipt.json"))
            assert output.stat().st_size == receipt["size"], p
        elif p.name.endswith(".json"):
            json.loads(p.read_text())
    return partials


def _assert_reused(before: dict[str, tuple[int, int]], out_dir: Path) -> None:
    after = _finished(out_dir)
    redone = [n for n, v in before.items() if after.get(n) != v]
    assert not redone, f"finished outputs were rebuilt instead of reused: {redone}"


# ---------------------------------------------------------------- SIGKILL at each step


def test_sigkill_at_each_step_leaves_only_partials_and_the_rerun_resumes(catalog: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = _env(work, catalog)
    for i, step in enumerate(STEPS):
        out_dir = _out_dir(work)
        before = _finished(out_dir)
        FAULTS["injected"] += 1
        _kill_at(env, step, tmp_path / f"run-{i}.log", work=work, wait_for_output=True)
        out_dir = _out_dir(work)
        partials = _nothing_half_written(out_dir)
        assert all(".partial-" in p for p in partials)
        assert not (out_dir / step.output).exists(), f"killed in {step.name}, yet {step.output} is in place"
        _assert_reused(before, out_dir)
        FAULTS["survived"] += 1

    before = _finished(_out_dir(work))
    done = _cli(env)
    assert done.returncode == 0, done.stderr
    out_dir = _out_dir(work)
    assert _nothing_half_written(out_dir) == []  # the killed runs' partials were cleaned up
    _assert_reused(before, out_dir)
    assert all((out_dir / s.output).is_file() for s in STEPS)
    assert json.loads((out_dir / f"{NAME}-{QUANT}.report.json").read_text())["validation"]["passed"]


# ---------------------------------------------------------------- a full disk at each step


def _used(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _resize(mnt: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)


# Room left for each step, far less than its output (tiny-qwen2, measured: f16 90.0 MB, q8_0 ~48 MB, reference
# logits 306.3 MB (16 x 128 tokens over a 151k vocabulary), report a few kB: validation writes only that).
_ROOM = {"convert": 4 << 20, "quantize": 4 << 20, "kld base": 4 << 20, "validate": 0}


def test_a_run_too_large_for_its_disk_is_refused_before_any_tool_runs(
    catalog: Path, small_disk, tmp_path: Path
) -> None:
    """The source's headers say what the run needs at its peak (f16, the variant, the KL reference logits): on a
    disk with less room the run is refused before its first tool, naming both figures and the ways out."""
    work = small_disk("64m")  # tiny-qwen2's run peaks at ~320 MiB: the logits of 16 x 128 tokens over 151k tokens
    env = _env(work, catalog, COLUMNS="400")
    del env["MODELMINT_SKIP_RESOURCE_CHECK"]
    proc = _cli(env)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"{NAME} ({QUANT}) does not fit on this machine; nothing was started" in proc.stderr, proc.stderr
    assert re.search(r"needs [\d.,]+ MiB at its peak, [\d.,]+ MiB free", proc.stderr), proc.stderr
    assert "MODELMINT_WORK_DIR" in proc.stderr and "--variants" in proc.stderr
    assert not [p for p in work.rglob("*") if p.is_file() and p.suffix in (".gguf", ".bin", ".json")]
    # the same disk with the check skipped: the run starts and the disk fills mid-run, named as before
    env["MODELMINT_SKIP_RESOURCE_CHECK"] = "1"
    proc = _cli(env)
    assert proc.returncode == 1 and "no space left on the device holding" in proc.stderr, proc.stderr


def test_a_full_disk_at_each_step_is_named_and_the_rerun_resumes(
    catalog: Path, small_disk, tmp_path: Path
) -> None:
    work = small_disk("1m")
    env = _env(work, catalog)
    for i, step in enumerate(STEPS):
        if i:
            # Let the steps before this one finish (plenty of room, stopped as this step's tool starts), so
            # that the room left below is what this step, and only it, gets.
            _resize(work, 2 << 30)
            _kill_at(env, step, tmp_path / f"until-{i}.log", work=work, wait_for_output=False)
            for p in work.rglob("*.partial-*"):
                p.unlink()  # what the next run's clean-up does first: the room below must not count them
        out_dir = _out_dir(work)
        before = _finished(out_dir)
        _resize(work, _used(work) + _ROOM[step.name])
        FAULTS["injected"] += 1
        proc = _cli(env)
        out_dir = _out_dir(work)
        assert proc.returncode == 1, f"{step.name}: {proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
        assert f"no space left on the device holding {out_dir}" in proc.stderr, f"{step.name}: {proc.stderr}"
        assert "MODELMINT_WORK_DIR" in proc.stderr and "rerun the same command" in proc.stderr
        assert _nothing_half_written(out_dir) == [], f"{step.name} left partial files behind"
        assert not (out_dir / step.output).exists()
        _assert_reused(before, out_dir)
        FAULTS["survived"] += 1

    before = _finished(_out_dir(work))
    _resize(work, 2 << 30)
    done = _cli(env)
    assert done.returncode == 0, done.stderr
    out_dir = _out_dir(work)
    _assert_reused(before, out_dir)
    sizes = {s.name: (out_dir / s.output).stat().st_size for s in STEPS}
    print(f"\noutput sizes of {NAME}: {sizes}")


# ---------------------------------------------------------------- the hub: 500, 401, slow, stalled, a full home

TOKEN = "hf_modelmintFAULTtoken0123456789abcdef"
HUB_NAME = "hub-tiny"


@pytest.fixture(scope="module")
def hub(tiny_qwen2: Path) -> Iterator[object]:
    from hubserver import HubServer

    with HubServer(token=TOKEN) as server:
        server.add_repo("acme/tiny-qwen2", {p.name: p.read_bytes() for p in tiny_qwen2.iterdir() if p.is_file()})
        yield server


@pytest.fixture(scope="module")
def hub_build(tmp_path_factory: pytest.TempPathFactory, hub) -> tuple[Path, Path]:
    """A catalog naming the fake hub's repo at its commit, and one work dir the hub tests share (after the first
    rerun completes, later reruns reuse its outputs)."""
    base = tmp_path_factory.mktemp("hub")
    entry = {
        "name": HUB_NAME, "source": {"repo": "acme/tiny-qwen2", "revision": hub.repos["acme/tiny-qwen2"].commit},
        "license": "apache-2.0", "chat_family": "chatml", "gate_profile": "tiny",
        "variants": {"gguf": {"outtype": "f16", "quants": ["q8_0"]}},
    }
    catalog = base / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": [entry]}, sort_keys=False))
    return catalog, base / "work"


def _hub_env(hub, hub_build: tuple[Path, Path], home: Path, **extra: str) -> dict[str, str]:
    """A fresh MODELMINT_HOME (its hub cache empty; toolchains and generated models linked), HF_HOME empty."""
    real = Settings.from_env().home
    home.mkdir(parents=True, exist_ok=True)
    for shared in ("toolchains", "models"):
        if not (home / shared).exists():
            (home / shared).symlink_to(real / shared)
    catalog, work = hub_build
    hf = {"MODELMINT_HOME": str(home), "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home / "hf"),
          "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2"}
    env = _env(work, catalog, **{**hf, **extra})
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        if var not in extra:
            env.pop(var, None)
    return env


def _no_partial_source(home: Path) -> None:
    """No snapshot file of the hub cache is shorter than the hub's copy (huggingface_hub's own partials are
    `*.incomplete` blobs, never linked into a snapshot)."""
    for p in (home / "hub").rglob("snapshots/*/*"):
        assert p.stat().st_size > 0, p


def _assert_clean_failure(proc: subprocess.CompletedProcess[str], work: Path, *needles: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    out_dir = _out_dir(work, HUB_NAME)
    assert [p for p in out_dir.rglob("*") if ".partial-" in p.name] == []


def test_hub_500_is_transient_and_the_rerun_completes(hub, hub_build, tmp_path: Path) -> None:
    env = _hub_env(hub, hub_build, tmp_path / "home")
    hub.fail_status = 500
    FAULTS["injected"] += 1
    try:
        failed = _cli(env, HUB_NAME)
    finally:
        hub.fail_status = None
    _assert_clean_failure(failed, hub_build[1], "500", f"`modelmint fetch {HUB_NAME}`", "in a few minutes")
    done = _cli(env, HUB_NAME)
    assert done.returncode == 0, done.stderr
    FAULTS["survived"] += 1


def test_hub_401_names_hf_token_without_printing_it(hub, hub_build, tmp_path: Path) -> None:
    wrong = "hf_modelmintWRONGtoken000000000000000000"
    FAULTS["injected"] += 1
    failed = _cli(_hub_env(hub, hub_build, tmp_path / "home", HF_TOKEN=wrong), HUB_NAME)
    _assert_clean_failure(failed, hub_build[1], "HTTP 401", "HF_TOKEN")
    assert wrong not in failed.stdout + failed.stderr
    done = _cli(_hub_env(hub, hub_build, tmp_path / "home", HF_TOKEN=TOKEN), HUB_NAME)
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    FAULTS["survived"] += 1


def test_a_slow_hub_times_out_instead_of_hanging(hub, hub_build, tmp_path: Path) -> None:
    env = _hub_env(hub, hub_build, tmp_path / "home")
    hub.delay_s = 30.0  # longer than HF_HUB_ETAG_TIMEOUT=2: without a timeout the CLI would wait it out
    FAULTS["injected"] += 1
    try:
        failed = subprocess.run(_argv(HUB_NAME), env=env, capture_output=True, text=True, timeout=25)
    finally:
        hub.delay_s = 0.0
    _assert_clean_failure(failed, hub_build[1], "did not answer in time", f"`modelmint fetch {HUB_NAME}`")
    done = _cli(env, HUB_NAME)
    assert done.returncode == 0, done.stderr
    FAULTS["survived"] += 1


def test_sigkill_during_a_stalled_download_then_the_rerun_completes(hub, hub_build, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = _hub_env(hub, hub_build, home, HF_HUB_DOWNLOAD_TIMEOUT="60")
    hub.stall_s = 60.0
    FAULTS["injected"] += 1
    try:
        proc = _start(env, tmp_path / "fetch.log", HUB_NAME)

        def downloading() -> bool:
            return any(p.stat().st_size > 0 for p in (home / "hub").rglob("*.incomplete"))

        assert _kill_when(proc, downloading, lambda: True), (tmp_path / "fetch.log").read_text()
    finally:
        hub.stall_s = 0.0
    _no_partial_source(home)
    assert not list((home / "hub").rglob("snapshots/*/model.safetensors")), "a cut download was linked in"
    done = _cli(env, HUB_NAME)
    assert done.returncode == 0, done.stderr
    FAULTS["survived"] += 1


def test_a_full_home_during_download_names_modelmint_home(hub, hub_build, small_disk) -> None:
    home = small_disk("2m")
    env = _hub_env(hub, hub_build, home)
    FAULTS["injected"] += 1
    failed = _cli(env, HUB_NAME)
    _assert_clean_failure(failed, hub_build[1], "no space left on the device holding", "MODELMINT_HOME")
    _no_partial_source(home)
    _resize(home, 1 << 30)
    done = _cli(env, HUB_NAME)
    assert done.returncode == 0, done.stderr
    FAULTS["survived"] += 1
