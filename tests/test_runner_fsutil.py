"""The tool runner and atomic outputs, on real processes and a real size-limited filesystem."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.core.errors import DiskFullError, ToolError, ToolTimeout
from pipelines.core.fsutil import HashCache, WrittenDigest, atomic_output, clean_partials, partial_path
from pipelines.core.runner import run
from pipelines.core.settings import Settings


def test_run_captures_output_and_peak_rss() -> None:
    r = run([sys.executable, "-c", "import sys; b = bytearray(64 << 20); print('out'); print('err', file=sys.stderr)"])
    assert r.stdout.strip() == "out" and r.stderr.strip() == "err"
    assert r.peak_rss_bytes > 64 << 20  # the child's own peak, from wait4


def test_failure_carries_command_and_stderr_tail() -> None:
    with pytest.raises(ToolError) as exc:
        run([sys.executable, "-c", "import sys; [print(f'line {i}', file=sys.stderr) for i in range(100)]; sys.exit(3)"])
    assert exc.value.returncode == 3
    assert "line 99" in exc.value.stderr_tail and "line 10\n" not in exc.value.stderr_tail
    assert exc.value.argv[0] == sys.executable


def test_timeout_kills_the_process_group() -> None:
    with pytest.raises(ToolTimeout):
        run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_a_tool_is_stopped_once_its_output_says_enough() -> None:
    script = "import time; print('one', flush=True); time.sleep(0.3); print('two', flush=True); time.sleep(60)"
    seen: list[str] = []

    def enough(out: str) -> bool:
        seen.append(out)
        return "two" in out

    r = run([sys.executable, "-c", script], stop_when=enough, timeout=30)
    assert r.stopped and r.returncode == -9 and r.stdout == "one\ntwo\n"
    assert seen[0] == "one\n"  # asked as the output grew, not once at the end
    # a watcher that never says enough changes nothing: the tool runs to its end, and its status counts
    r = run(["sh", "-c", "echo a; sleep 0.2; echo b"], stop_when=lambda _out: False)
    assert not r.stopped and r.returncode == 0 and r.stdout == "a\nb\n"
    with pytest.raises(ToolError):
        run(["sh", "-c", "echo a; exit 3"], stop_when=lambda _out: False)


def test_tokens_are_not_passed_to_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    r = run([sys.executable, "-c", "import os; print(os.environ.get('HF_TOKEN', 'absent'))"])
    assert r.stdout.strip() == "absent"


def test_no_credential_reaches_a_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variable Settings reads a credential from is planted; the tool's own environment holds none."""
    planted = {var: f"planted-secret-{i}" for i, var in enumerate(Settings.SECRET_ENV)}
    for var, value in planted.items():
        monkeypatch.setenv(var, value)
    settings = Settings.from_env()
    # The list is the settings' own: each credential field is read from the variables it names.
    assert all(getattr(settings, name) for name in Settings.SECRETS)
    r = run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"])
    child = json.loads(r.stdout)
    assert {"MODELMINT_REGISTRY_USERNAME", "MODELMINT_REGISTRY_PASSWORD", "MODELMINT_WEBHOOK_SECRET"} <= set(planted)
    assert not set(planted) & set(child)
    assert not [v for v in child.values() if any(p in v for p in planted.values())]
    # An explicit env entry is the caller's choice (the hub download is given its token this way).
    r = run([sys.executable, "-c", "import os; print(os.environ['HF_TOKEN'])"], env={"HF_TOKEN": "given"})
    assert r.stdout.strip() == "given"


def _planted(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    planted = {var: f"planted-secret-{i}" for i, var in enumerate(Settings.SECRET_ENV)}
    for var, value in planted.items():
        monkeypatch.setenv(var, value)
    return planted


def _environ(pid: int) -> dict[str, str]:
    """A running process's environment as the kernel holds it."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(e.split("=", 1) for e in raw.decode("utf-8", "replace").split("\0") if "=" in e)


def test_no_credential_reaches_the_local_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The long-lived servers modelmint starts outside the runner get its environment too: Debian's
    docker-registry under `modelmint registry serve`, read from /proc while it serves."""
    from registry_env import free_port

    from pipelines.publish.localregistry import local_registry

    planted = _planted(monkeypatch)
    with local_registry(tmp_path / "reg", free_port()) as reg:
        child = _environ(reg.proc.pid)
    assert "PATH" in child and not set(planted) & set(child)
    assert not [v for v in child.values() if any(p in v for p in planted.values())]


def test_no_credential_reaches_the_prefect_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The embedded stack's Prefect server (flows/stack/) stores what it is sent and needs no credential: it
    inherited every one. (The worker keeps them: its flow runs fetch and publish with them.)"""
    from registry_env import free_port, isolate

    from flows import stack

    isolate(tmp_path / "env", monkeypatch)
    monkeypatch.setenv("MODELMINT_PREFECT_PORT", str(free_port()))
    planted = _planted(monkeypatch)
    settings = Settings.from_env()
    state = stack.StackState(api_url=settings.prefect_api_url)
    try:
        assert stack.start_server(settings, state)
        assert state.server_pid is not None
        child = _environ(state.server_pid)
    finally:
        stack.down(settings, say=lambda _msg: None)
    assert child["PREFECT_HOME"] == str(settings.prefect_dir) and not set(planted) & set(child)
    assert not [v for v in child.values() if any(p in v for p in planted.values())]


def test_every_process_modelmint_starts_gets_the_runners_environment() -> None:
    """Outside the runner, each subprocess call in pipelines/ passes env=tool_env(...): an inherited environment
    carried every credential to llama-server and docker-registry. (pipelines/scripts run inside a tool's venv,
    started by the runner: their environment is already the runner's.)"""
    import ast

    root = Path(__file__).resolve().parents[1] / "pipelines"
    bare = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "runner.py" or "scripts" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"
                    and node.func.attr in ("Popen", "run", "call", "check_call", "check_output")):
                env = next((k.value for k in node.keywords if k.arg == "env"), None)
                if not (isinstance(env, ast.Call) and isinstance(env.func, ast.Name) and env.func.id == "tool_env"):
                    bare.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert bare == []


def test_secret_env_names_every_variable_a_credential_is_read_from() -> None:
    for name in Settings.SECRETS:
        for var in Settings.SECRET_SOURCES[name]:
            alone = Settings.from_env({var: "x"})
            assert getattr(alone, name) == "x", (name, var)
    assert set(Settings.SECRET_SOURCES) == set(Settings.SECRETS)


def test_atomic_output_keeps_old_content_on_failure(tmp_path: Path) -> None:
    final = tmp_path / "model.gguf"
    final.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(final) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert final.read_text() == "old"
    assert list(tmp_path.iterdir()) == [final]
    with atomic_output(final) as tmp:
        tmp.write_text("new")
    assert final.read_text() == "new"


def test_partials_of_a_killed_process_are_cleaned(tmp_path: Path) -> None:
    final = tmp_path / "out.gguf"
    # A real process killed with SIGKILL while writing its partial file.
    code = (
        "import os, sys, time; from pathlib import Path; from pipelines.core.fsutil import atomic_output\n"
        "with atomic_output(Path(sys.argv[1])) as t:\n"
        "    t.write_bytes(b'x' * 1000); print('writing', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(final)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout and proc.stdout.readline().strip() == "writing"
    proc.kill()
    proc.wait()
    leftovers = list(tmp_path.iterdir())
    assert leftovers and not final.exists()
    assert set(clean_partials(tmp_path)) == set(leftovers)
    assert not list(tmp_path.iterdir())


@pytest.fixture
def small_fs(small_disk) -> Path:
    return small_disk("256k")


def test_disk_full_is_a_clear_error_and_leaves_nothing(small_fs: Path) -> None:
    final = small_fs / "big.bin"
    with pytest.raises(DiskFullError) as exc, atomic_output(final) as tmp:
        tmp.write_bytes(b"\0" * (1 << 20))
    # fsutil knows the path, not which of modelmint's directories it is (disk_full_located adds that)
    assert f"no space left on the device holding {small_fs}" in str(exc.value) and exc.value.location is None
    assert not list(small_fs.iterdir())


def test_disk_full_in_a_tool_is_recognised(small_fs: Path) -> None:
    target = small_fs / "x"
    with pytest.raises(DiskFullError):
        run([sys.executable, "-c", f"open({str(target)!r}, 'wb').write(b'0' * (1 << 20))"], cwd=small_fs)


def test_hash_cache_does_not_rehash_unchanged_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipelines.core.fsutil as fsutil

    f = tmp_path / "w.safetensors"
    f.write_bytes(b"a" * 4096)
    calls = []
    real = fsutil.file_digests
    monkeypatch.setattr(fsutil, "file_digests", lambda p: calls.append(p) or real(p))
    cache = HashCache(tmp_path / "db.json")
    first = cache.sha256(f)
    assert HashCache(tmp_path / "db.json").sha256(f) == first and len(calls) == 1
    f.write_bytes(b"b" * 4096)
    assert HashCache(tmp_path / "db.json").sha256(f) != first and len(calls) == 2


def test_partial_names_never_look_like_outputs(tmp_path: Path) -> None:
    p = partial_path(tmp_path / "m-q4_k_m.gguf")
    assert not p.name.endswith(".gguf") and ".partial-" in p.name


def test_stack_run_hands_prefect_no_credential(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`modelmint stack run` (and `python -m flows.stack run`) execs `prefect deployment run`, which only asks the API
    for a run: it inherited every credential. It now gets run_env, and nothing else reaches that exec."""
    import ast

    from registry_env import isolate

    import pipelines.cli.stack
    from flows import stack

    isolate(tmp_path / "env", monkeypatch)
    planted = _planted(monkeypatch)
    settings = Settings.from_env()
    env = stack.run_env(settings)
    assert env["PREFECT_API_URL"] == settings.prefect_api_url and not set(planted) & set(env)
    execs = [n for module in (stack, pipelines.cli.stack)
             for n in ast.walk(ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8")))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "execve"]

    def _called(call: ast.expr) -> str:  # run_env(...) or stack.run_env(...)
        func = call.func if isinstance(call, ast.Call) else None
        return getattr(func, "id", "") or getattr(func, "attr", "")

    assert execs and all(_called(n.args[2]) == "run_env" for n in execs)


def test_one_hash_cache_per_home_however_it_is_spelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two caches on one hashcache.json would each write back only their own entries, losing the other's."""
    from pipelines.core.fsutil import hash_cache

    (tmp_path / "home").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "home")
    monkeypatch.chdir(tmp_path)
    homes = [tmp_path / "home", Path("home"), tmp_path / "link", tmp_path / "x" / ".." / "home"]
    caches = {id(hash_cache(Settings.from_env({"MODELMINT_HOME": str(h)}))) for h in homes}
    assert len(caches) == 1
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    hash_cache(Settings.from_env({"MODELMINT_HOME": "home"})).sha256(a)
    hash_cache(Settings.from_env({"MODELMINT_HOME": str(tmp_path / "link")})).sha256(b)
    remembered = json.loads((tmp_path / "home" / "hashcache.json").read_text())
    assert sorted(k.split("|")[0] for k in remembered) == [str(a), str(b)]  # both, in the one file


# A writer process, front to back in pieces with pauses (the follower catches up and waits), then, after a pause in
# which the follower has read it all, what argv[2] says: "done", "truncate" (cut to a quarter and a little written
# again: shorter than what was read) or "replace" (another file of the same size renamed over the name).
_WRITER = """
import os, sys, time
path, then = sys.argv[1], sys.argv[2]
with open(path, "wb") as fh:
    for i in range(12):
        fh.write(bytes([i]) * (3 << 20) + os.urandom(4096))
        fh.flush()
        time.sleep(0.03)
size = os.path.getsize(path)
if then != "done":
    time.sleep(0.5)
if then == "truncate":
    with open(path, "r+b") as fh:
        fh.truncate(size // 4)
        fh.seek(size // 4)
        fh.write(b"again")
elif then == "replace":
    with open(path + ".new", "wb") as fh:
        fh.write(os.urandom(size))
    os.replace(path + ".new", path)
"""


def _written_by(path: Path, then: str) -> WrittenDigest:
    with WrittenDigest(path) as digest:
        run([sys.executable, "-c", _WRITER, str(path), then])
    return digest


def test_a_file_is_hashed_as_its_writer_writes_it(tmp_path: Path) -> None:
    """What the follower read behind a front-to-back writer is the whole file: its sha256, and the stat that the hash
    cache then answers for without reading the file (the converter's f16 at its receipt)."""
    out = tmp_path / "model-f16.gguf"
    digest = _written_by(out, "done")
    assert digest.sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    assert digest.stat is not None and digest.stat.st_size == out.stat().st_size == 12 * ((3 << 20) + 4096)
    cache = HashCache(tmp_path / "hashcache.json")
    renamed = tmp_path / "renamed.gguf"
    out.rename(renamed)  # what atomic_output does: the same inode, size and mtime under the final name
    cache.learn(renamed, digest.stat, digest.sha256)
    assert json.loads((tmp_path / "hashcache.json").read_text()) == {
        f"{renamed.resolve()}|{digest.stat.st_dev}|{digest.stat.st_ino}|{digest.stat.st_size}|"
        f"{digest.stat.st_mtime_ns}": digest.sha256}
    assert cache.sha256(renamed) == digest.sha256


@pytest.mark.parametrize("then", ["truncate", "replace"])
def test_a_file_that_is_not_what_was_read_gets_no_digest(tmp_path: Path, then: str) -> None:
    """Cut shorter than what was read and written again, or replaced under its name by another file of the same size:
    the follower keeps no digest, and the receipt reads the file itself. (Had the follower not yet read past the cut
    when it came, what it read is the file as it stands and its digest is right: never a digest of other bytes.)"""
    out = tmp_path / "out.gguf"
    digest = _written_by(out, then)
    assert digest.sha256 in (None, hashlib.sha256(out.read_bytes()).hexdigest())
    assert (digest.sha256 is None) == (digest.stat is None)


def test_no_file_no_digest_and_a_changed_file_is_not_learned(tmp_path: Path) -> None:
    with WrittenDigest(tmp_path / "never.gguf") as digest:
        run([sys.executable, "-c", "pass"])
    assert digest.sha256 is None
    out = tmp_path / "out.gguf"
    digest = _written_by(out, "done")
    assert digest.stat is not None and digest.sha256 is not None
    out.write_bytes(b"rewritten after the digest")
    cache = HashCache(tmp_path / "hashcache.json")
    cache.learn(out, digest.stat, digest.sha256)
    assert not (tmp_path / "hashcache.json").exists()
    assert cache.sha256(out) == hashlib.sha256(b"rewritten after the digest").hexdigest()
