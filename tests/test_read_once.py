"""How many times registering and publishing read a variant's bytes: once to hash it (its sha256 for the manifest and
its md5 for DVC, in one pass) and once to copy it to the DVC remote when registering; once, to upload it, when
publishing (the image takes the sha256 the manifest records, and the registry checks it on upload). A variant built
and registered in one run is hashed once in all: at its receipt, whose read registration takes from the hash cache.

Each step runs in its own process against a real git + DVC project with a local remote and a real docker-registry
on 127.0.0.1; what it read is the `rchar` of /proc/<pid>/io of a shell around it, which holds the process's and
every reaped descendant's reads (the DVC processes). Python's imports read as much in any run, so the times a
step reads the variant are the difference between its bytes read for a large and a small variant, over the
difference of their sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ociregistry import RunningRegistry, start_registry
from registry_env import Repo, candidate, dvc, make_repo

import pipelines.core.fsutil as fsutil
from pipelines.core.fsutil import HashCache
from pipelines.core.steps import receipt_path
from pipelines.store import dvcrepo

_CHECKOUT = Path(__file__).resolve().parents[1]  # the code under test, whichever checkout holds this file
SMALL_MIB, LARGE_MIB = 1, 33
# one pass to hash, one to copy out (to the remote, or to the registry); the margin is for what else the runs read
REGISTER_READS, PUBLISH_READS = 2.2, 1.2

_REGISTER = """
import pickle, sys
from pathlib import Path
from pipelines.core.settings import Settings
from pipelines.registry.register import register
register(Settings.from_env(), pickle.loads(Path(sys.argv[1]).read_bytes()))
"""

# The CLI, with every hash of a file's bytes counted by file (device and inode): the two functions they go through,
# under every name they are imported by before the CLI loads (steps' receipts); the counts land in argv[1] at exit.
_COUNTED = """
import atexit, json, runpy, sys
from pathlib import Path
import pipelines.core.fsutil as fsutil
import pipelines.core.steps as steps
hashed = {}
def counting(real):
    def read(path):
        st = Path(path).stat()
        hashed[f"{st.st_dev}:{st.st_ino}"] = hashed.get(f"{st.st_dev}:{st.st_ino}", 0) + st.st_size
        return real(path)
    return read
fsutil.file_digests = counting(fsutil.file_digests)
fsutil.sha256_file = steps.sha256_file = counting(fsutil.sha256_file)
counts = Path(sys.argv[1])
atexit.register(lambda: counts.write_text(json.dumps(hashed)))
sys.argv = ["modelmint", *sys.argv[2:]]
runpy.run_module("pipelines.cli", run_name="__main__", alter_sys=True)
"""


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RunningRegistry]:
    reg = start_registry(tmp_path / "registry")
    try:
        yield reg
    finally:
        reg.stop()


def _rchar(argv: list[str], repo: Repo, **env: str) -> int:
    """Bytes `argv` read through read(), sendfile() and the like, its reaped descendants' included."""
    wrapped = ["sh", "-c", '"$@" || exit $?; cat /proc/$$/io', "sh", *argv]
    done = subprocess.run(wrapped, env={**repo.env(), "PYTHONPATH": str(_CHECKOUT), **env}, cwd=repo.root,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    io = dict(line.split(": ") for line in done.stdout.splitlines() if ": " in line)
    return int(io["rchar"])


def _register_and_publish(base: Path, registry: RunningRegistry, mib: int) -> tuple[Repo, tuple[int, int, int]]:
    """Register tiny-qwen2:q4_k_m of about `mib` MiB into a new project and publish it: the project, and (its size,
    the bytes the registering process read, the bytes the publishing process read)."""
    repo = make_repo(base)
    c = candidate(repo.settings(), base / "build", mib=mib)
    (base / "candidate.pickle").write_bytes(pickle.dumps(c))
    registered = _rchar([sys.executable, "-c", _REGISTER, str(base / "candidate.pickle")], repo)
    published = _rchar([sys.executable, "-m", "pipelines.cli", "publish", c.ref, "--registry",
                        f"{registry.host}/read-{mib}", "--insecure"], repo)
    return repo, (c.size_bytes, registered, published)


def test_registering_and_publishing_read_the_variant_once_to_hash_and_once_to_copy(
    isolated: Path, tmp_path: Path, registry: RunningRegistry
) -> None:
    _, small = _register_and_publish(tmp_path / "small", registry, SMALL_MIB)
    repo, large = _register_and_publish(tmp_path / "large", registry, LARGE_MIB)
    grown = large[0] - small[0]
    register_reads = (large[1] - small[1]) / grown
    publish_reads = (large[2] - small[2]) / grown
    shown = f"small {small}, large {large} (size, bytes read registering, publishing)"
    assert register_reads <= REGISTER_READS, f"registering read the variant {register_reads:.2f} times: {shown}"
    assert publish_reads <= PUBLISH_READS, f"publishing read the variant {publish_reads:.2f} times: {shown}"
    # The md5 DVC recorded without reading the file is the file's: DVC finds the workspace as it recorded it, and
    # every object in the remote hashes to its name and to the manifest's sha256.
    status = dvc(repo.root, "status", "gguf@tiny-qwen2-q4_k_m")
    assert "changed" not in status.stdout and "modified" not in status.stdout, status.stdout
    settings = repo.settings()
    locked = dvcrepo.locked_out(settings, "gguf@tiny-qwen2-q4_k_m", "artifacts/tiny-qwen2/q4_k_m")
    assert locked is not None
    listing = dvcrepo.dir_listing(dvcrepo.cache_dir(settings), locked.md5)
    placed = repo.root / "artifacts/tiny-qwen2/q4_k_m/tiny-qwen2-q4_k_m.gguf"
    assert listing["tiny-qwen2-q4_k_m.gguf"] == hashlib.md5(placed.read_bytes()).hexdigest()
    checked = subprocess.run([sys.executable, "-m", "pipelines.cli", "verify", "tiny-qwen2:q4_k_m"], env=repo.env(),
                             cwd=repo.root, capture_output=True, text=True)
    assert checked.returncode == 0 and "ok" in checked.stdout, checked.stdout + checked.stderr


def test_one_read_gives_both_hashes_for_every_name_of_the_file_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hash cache reads a file once for its sha256 and md5, answers for a hard link of it (the placed weights, the
    DVC cache's object) without reading it again, and reads it again once its size or mtime changed."""
    reads: list[Path] = []
    real = fsutil.file_digests
    monkeypatch.setattr(fsutil, "file_digests", lambda p: reads.append(p) or real(p))
    built, placed = tmp_path / "build.gguf", tmp_path / "placed.gguf"
    built.write_bytes(b"weights" * 1000)
    db = tmp_path / "hashcache.json"
    cache = HashCache(db)
    assert cache.sha256(built) == hashlib.sha256(built.read_bytes()).hexdigest()
    assert cache.md5(built) == hashlib.md5(built.read_bytes()).hexdigest()
    os.link(built, placed)
    assert HashCache(db).md5(placed) == cache.md5(built) and HashCache(db).sha256(placed) == cache.sha256(built)
    assert len(reads) == 1
    st = placed.stat()
    os.utime(placed, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # the same bytes, but no longer known to be
    assert cache.md5(placed) == hashlib.md5(built.read_bytes()).hexdigest() and len(reads) == 2
    placed.unlink()
    placed.write_bytes(b"other" * 1000)  # a new file under the name
    assert cache.sha256(placed) == hashlib.sha256(b"other" * 1000).hexdigest() and len(reads) == 3


@pytest.mark.slow
def test_a_variant_built_and_registered_in_one_run_is_hashed_once(repo: Repo, tmp_path: Path) -> None:
    """`modelmint convert tiny-qwen2 --variants q4_k_m --register`, one run that builds, validates and registers: the
    validate step reads the variant for its sha256 (and its md5, in the same pass) while llama-perplexity reads it,
    not the quantize step after llama-quantize wrote it; registration (the manifest's sha256, DVC's md5) and
    everything between take them from the hash cache and hash it no more. (The
    placed weights and DVC's cache object are hard links of the build's output: one file, counted by its inode.)
    The f16, hashed as the converter writes it, is not read back for its receipt."""
    counts = tmp_path / "hashed.json"
    done = subprocess.run([sys.executable, "-c", _COUNTED, str(counts), "convert", "tiny-qwen2", "--variants", "q4_k_m",
                           "--register"],
                          env={**repo.env(), "PYTHONPATH": str(_CHECKOUT), "MODELMINT_KEEP_SCRATCH": "1"},
                          cwd=repo.root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    hashed = json.loads(counts.read_text())
    placed = (repo.root / "artifacts/tiny-qwen2/q4_k_m/tiny-qwen2-q4_k_m.gguf").stat()
    times = hashed.get(f"{placed.st_dev}:{placed.st_ino}", 0) / placed.st_size
    assert times == 1, f"the variant ({placed.st_size} bytes) was hashed {times:g} times in the run"
    # ... in its check, which names the sha256 the quantize step's receipt leaves out
    (quant,) = repo.work.rglob("tiny-qwen2-q4_k_m.gguf")
    assert "sha256" not in json.loads(receipt_path(quant).read_text())
    report = json.loads(quant.with_suffix(".report.json").read_text())
    assert report["sha256"] == hashlib.sha256(quant.read_bytes()).hexdigest()
    # the f16 (kept here) was hashed as the converter wrote it: its receipt did not read it back, and holds its sha256
    (f16,) = repo.work.rglob("tiny-qwen2-f16.gguf")
    st = f16.stat()
    assert hashed.get(f"{st.st_dev}:{st.st_ino}", 0) == 0, "the f16 was read back for its receipt"
    assert json.loads(receipt_path(f16).read_text())["sha256"] == hashlib.sha256(f16.read_bytes()).hexdigest()


def test_signing_at_registration_hashes_no_file_again_and_model_signing_verifies_it(
    isolated: Path, tmp_path: Path
) -> None:
    """With MODELMINT_SIGNING_KEY set, registration reads the variant as often as without (to hash it, to copy it to
    the remote): the signature's per-file sha256s come from the hash cache, not from model-signing reading every
    file again. model-signing's own CLI verifies that signature by hashing the files itself."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from pipelines.registry.register import artifact_dir
    from pipelines.trust.signing import SIGNATURE

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "signing.pem", tmp_path / "signing.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    measured = []
    for mib in (SMALL_MIB, LARGE_MIB):
        repo = make_repo(tmp_path / f"signed-{mib}")
        c = candidate(repo.settings(), tmp_path / f"build-{mib}", mib=mib)
        (tmp_path / f"candidate-{mib}.pickle").write_bytes(pickle.dumps(c))
        read = _rchar([sys.executable, "-c", _REGISTER, str(tmp_path / f"candidate-{mib}.pickle")], repo,
                      MODELMINT_SIGNING_KEY=str(private))
        measured.append((c.size_bytes, read))
    reads = (measured[1][1] - measured[0][1]) / (measured[1][0] - measured[0][0])
    assert reads <= REGISTER_READS, f"signed registration read the variant {reads:.2f} times: {measured}"
    directory = artifact_dir(repo.settings(), "tiny-qwen2", "q4_k_m")
    checked = subprocess.run([sys.executable, "-m", "model_signing", "verify", "key", "--signature",
                              str(directory / SIGNATURE), "--public_key", str(public), "--ignore-paths",
                              str(directory / SIGNATURE), str(directory)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # and refuses the same files with one byte changed (the check is real)
    weights = directory / "tiny-qwen2-q4_k_m.gguf"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.unlink()
    weights.write_bytes(bytes(data))
    refused = subprocess.run(checked.args, capture_output=True, text=True)
    assert refused.returncode != 0, refused.stdout + refused.stderr
