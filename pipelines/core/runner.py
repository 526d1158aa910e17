"""The one way modelmint runs external tools: argv lists, captured output, errors with the stderr tail."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.errors import DiskFullError, ToolError, ToolTimeout
from pipelines.core.fsutil import is_full
from pipelines.core.settings import Settings

log = logging.getLogger(__name__)

_TAIL_LINES = 25
# How tools report a full disk: libc's strerror, and numpy's tofile() (used by the GGUF converter).
_DISK_FULL_MARKERS = ("No space left on device", "ENOSPC", "Not enough free space to write")


@dataclass(frozen=True)
class ToolRun:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_bytes: int
    """Peak resident set size of the child process (from wait4), not of modelmint itself."""
    stopped: bool = False
    """The tool was stopped by `run(..., stop_when=...)` because its output already said enough."""


_POLL_S = 0.1
"""How often `run(stop_when=...)` reads a tool's new output (a llama-perplexity chunk takes about half a second)."""


def _wait_watching(pid: int, fd: int, stop_when: Callable[[str], bool]) -> tuple[int, resource.struct_rusage, bool]:
    """Wait for `pid`, asking `stop_when` about the output it wrote to `fd` so far; kill it when that says enough.

    Returns (wait status, resource use, whether it was stopped).
    """
    seen, stopped = b"", False
    while True:
        done, status, rusage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, rusage, stopped
        if not stopped:
            size = os.fstat(fd).st_size
            if size > len(seen):
                seen += os.pread(fd, size - len(seen), len(seen))
                if stop_when(seen.decode("utf-8", errors="replace")):
                    stopped = True
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    continue
        time.sleep(_POLL_S)


def _tail(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _tool_name(args: list[str]) -> str:
    """The program a person would recognise: the script when the argv starts with an interpreter."""
    first = Path(args[0]).name
    return Path(args[1]).name if first.startswith("python") and len(args) > 1 else first


def tool_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process modelmint starts: a copy of its own without any credential variable
    (Settings.SECRET_ENV), plus `env` (which may give one explicitly, as the hub download is given its token).
    Every process modelmint starts gets it, long-lived servers (llama-server, the local registry) too."""
    child_env = {k: v for k, v in os.environ.items() if k not in Settings.SECRET_ENV}
    if env:
        child_env.update(env)
    return child_env


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """Stop a server modelmint started: SIGTERM, then SIGKILL after `timeout` seconds; waited for either way (no
    zombie left)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    check: bool = True,
    hint: str | None = None,
    output: str | os.PathLike[str] | None = None,
    stop_when: Callable[[str], bool] | None = None,
) -> ToolRun:
    """Run `argv` (never through a shell), wait for it, and return its output and resource use.

    `env` entries are added to a copy of the current environment; every credential variable
    (Settings.SECRET_ENV) is removed unless given explicitly.
    `output` is the file or directory the tool writes: when the tool fails and the filesystem there is full,
    that is the cause, whatever the tool printed (llama-quantize says `basic_ios::clear: iostream error`).
    `stop_when` is asked, every `_POLL_S` while the tool runs, whether its standard output so far says enough: when
    it answers True the tool is killed and the run returns with `stopped` set (its exit status is then no error).

    Raises:
        ToolError: the tool exited non-zero (when `check`), with the command and the tail of stderr.
        ToolTimeout: the tool ran past `timeout` seconds and was killed.
        DiskFullError: the tool reported ENOSPC, or failed with `output`'s filesystem full (naming the
            directory `output` is in; without `output`, `cwd`).
    """
    args = [os.fspath(a) for a in argv]
    child_env = tool_env(env)
    log.debug("running %s", args)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            # Same process group as modelmint: a signal to the group (Ctrl-C, a cancelled flow run, a
            # supervisor's kill) reaches the tool too, so no orphan keeps writing after modelmint died.
            args, cwd=cwd, env=child_env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        )
        timed_out = threading.Event()

        def _kill() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, _kill) if timeout else None
        if timer:
            timer.start()
        stopped = False
        try:
            if stop_when is None:
                _, status, rusage = os.wait4(proc.pid, 0)
            else:
                status, rusage, stopped = _wait_watching(proc.pid, out.fileno(), stop_when)
        except BaseException:
            # Interrupted (Ctrl-C, a flow cancelled): never leave the tool running behind us.
            _kill()
            proc.wait()
            raise
        finally:
            if timer:
                timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", errors="replace")
        stderr = err.read().decode("utf-8", errors="replace")
    result = ToolRun(args, proc.returncode, stdout, stderr, wall, rusage.ru_maxrss * 1024, stopped)
    if timed_out.is_set():
        raise ToolTimeout(args, proc.returncode, _tail(stderr), hint=f"it ran longer than {timeout:.0f} s")
    if check and proc.returncode != 0 and not stopped:
        full = any(m in stderr + stdout for m in _DISK_FULL_MARKERS) or (output is not None and is_full(Path(output)))
        if full:
            where = Path(output).parent if output is not None else Path(cwd or Path.cwd())
            raise DiskFullError(str(where), f"{_tool_name(args)} failed:\n{_tail(stderr or stdout, 3)}")
        raise ToolError(args, proc.returncode, _tail(stderr or stdout), hint=hint, stderr=stderr or stdout)
    return result
