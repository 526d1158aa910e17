"""Atomic outputs and content hashes: nothing half-written is ever visible, nothing unchanged is re-hashed."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from pipelines.core.errors import ArtifactError, DiskFullError

if TYPE_CHECKING:
    from pipelines.core.settings import Settings

_PARTIAL = ".partial-"
_CHUNK = 8 * 1024 * 1024
_FULL_MIN = 1 << 20
_FULL_MAX = 64 << 20


def partial_path(final: Path) -> Path:
    """The temporary name an output is written under; anything matching `*.partial-*` is never output."""
    return final.with_name(f"{final.name}{_PARTIAL}{os.getpid()}")


def _writer_alive(p: Path) -> bool:
    pid = p.name.rsplit(_PARTIAL, 1)[-1]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_partials(directory: Path, of: str | None = None) -> list[Path]:
    """Remove leftovers of killed runs (`*.partial-<pid>` whose process is gone) in `directory`; with `of`, only
    those of the output named `of` (`<of>.partial-<pid>`).

    A partial file of a process that is still running belongs to a concurrent run and is left alone.
    """
    removed = []
    if directory.is_dir():
        for p in directory.iterdir():
            if of is not None and not p.name.startswith(of + _PARTIAL):
                continue
            if _PARTIAL in p.name and not _writer_alive(p):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer can still put on the filesystem holding `path` (or its nearest parent)."""
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize


def is_full(path: Path) -> bool:
    """Whether the filesystem holding `path` is (nearly) full: a write that failed there failed for lack of space.

    "Nearly": a tool that fails mid-write leaves up to one write's worth free, so 1 % of the filesystem
    (at least 1 MiB, at most 64 MiB) counts as none.
    """
    st = os.statvfs(_existing(path))
    total = st.f_blocks * st.f_frsize
    return st.f_bavail * st.f_frsize <= max(_FULL_MIN, min(_FULL_MAX, total // 100))


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def promote(tmp: Path, final: Path, check: Callable[[Path], object] | None = None, *, may_be_empty: bool = False) -> None:
    """Check what a step wrote at `tmp`, then rename it onto `final`: the one way an output comes into place.

    A tool's exit status is not trusted: `tmp` must exist and be non-empty (a file with bytes, a directory
    with files) and pass `check` (which reads its format back and raises ArtifactError). When the check
    fails on a filesystem that is full, the output was cut short by the disk, and that is what is raised.

    Raises:
        ArtifactError: `tmp` is missing, empty, or fails `check`.
        DiskFullError: it fails them on a full filesystem, or the rename itself found no space.
    """
    try:
        if not tmp.exists():
            raise ArtifactError(f"{final.name} was not written (nothing at {tmp})",
                                hint="rerun the same command; if it happens again, the tool is broken")
        if not may_be_empty and (tmp.stat().st_size == 0 if tmp.is_file() else not any(tmp.rglob("*"))):
            raise ArtifactError(f"{final.name} was written empty", hint="rerun the same command")
        if check is not None:
            check(tmp)
    except ArtifactError as err:
        if is_full(tmp.parent):
            raise DiskFullError(str(final.parent), f"{final.name} came out incomplete ({err.message})") from err
        raise
    for f in [tmp] if tmp.is_file() else [p for p in tmp.rglob("*") if p.is_file()]:
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.is_dir() and tmp.is_dir():
        shutil.rmtree(final)
    os.replace(tmp, final)


@contextlib.contextmanager
def atomic_output(
    final: Path, *, check: Callable[[Path], object] | None = None, may_be_empty: bool = False
) -> Iterator[Path]:
    """Yield a temporary path beside `final`; `promote` it onto `final` only if the block succeeds.

    Works for a file or a directory. On any exception the temporary path is removed and `final`
    keeps whatever it held before.

    Raises:
        ArtifactError: what the block wrote is missing, empty or fails `check` (see `promote`).
        DiskFullError: the block failed with ENOSPC, or its output came out cut short on a full disk.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(final)
    _remove(tmp)
    try:
        yield tmp
        promote(tmp, final, check, may_be_empty=may_be_empty)
    except OSError as err:
        _remove(tmp)
        if err.errno == errno.ENOSPC:
            raise DiskFullError(str(final.parent)) from err
        raise
    except BaseException:
        _remove(tmp)
        raise


def open_input(path: Path, fail: Callable[[str, str], Exception], *, missing: tuple[str, str],
               directory: tuple[str, str]) -> BinaryIO:
    """Open a file the user named, to read: a missing path, a directory and any other reason it cannot be opened
    each become `fail(message, hint)` (the caller's error type), with `missing` and `directory` as (message, hint).

    Raises:
        the exception `fail` makes, chained to the OSError.
    """
    try:
        return open(path, "rb")
    except FileNotFoundError as err:
        raise fail(*missing) from err
    except IsADirectoryError as err:
        raise fail(*directory) from err
    except OSError as err:
        raise fail(f"{path} cannot be read: {err.strerror or err}", "check the path and its permissions") from err


def cannot_link(err: OSError) -> bool:
    """Whether a hard link failed because this filesystem cannot make it here (another filesystem, not permitted,
    too many links, unsupported): the caller copies instead; any other error is the caller's to raise."""
    return err.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP)


def link_or_copy(src: Path, dst: Path) -> bool:
    """Make `dst` the file `src` without a second copy of its bytes where the filesystem allows: a hard link (the
    same inode) when both are on one filesystem, else a copy. Returns whether it linked.

    Safe only for files no one rewrites in place: every modelmint output is written under a temporary name and
    renamed (`atomic_output`), which gives the name a new inode and leaves the linked one as it was.
    """
    try:
        os.link(src, dst)
        return True
    except OSError as err:
        if not cannot_link(err):
            raise
    shutil.copyfile(src, dst)
    return False


@contextlib.contextmanager
def file_lock(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `lock` (made if missing) for the block: across processes, and across
    threads of one process (flock locks belong to an open file, and each holder opens its own)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` atomically; it comes into place only if it reads back byte for byte."""
    data = text.encode("utf-8")

    def _reads_back(tmp: Path) -> None:
        if tmp.read_bytes() != data:
            raise ArtifactError(f"{path} did not read back as written ({tmp.stat().st_size} of {len(data)} bytes)")

    with atomic_output(path, check=_reads_back, may_be_empty=not data) as tmp:
        tmp.write_bytes(data)


@contextlib.contextmanager
def disk_full_located(settings: Settings, *, dvc_cache: Path | None = None) -> Iterator[None]:
    """Say which of modelmint's directories filled when the block raises a DiskFullError that does not know.

    fsutil and the runner know only the path that filled; the hint (MODELMINT_WORK_DIR, MODELMINT_HOME,
    `dvc cache dir`, …) depends on which directory holds it, which only the settings know.
    """
    try:
        yield
    except DiskFullError as err:
        if err.location is not None:
            raise
        location = settings.disk_location(Path(err.path), dvc_cache=dvc_cache)
        raise DiskFullError(err.path, err.detail, location=location) from err


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


class HashCache:
    """sha256 and md5 of files, remembered by (device, inode, size, mtime_ns) so unchanged large files are not re-read.

    Both digests come from one read (file_digests): registration needs the sha256 for the manifest and the md5 for
    DVC, and a weight file of many GiB is read once for the two. A hard link is the same file: a name not seen
    before whose inode, size and mtime were hashed under another name is not read again. The cache is a small JSON
    file, written back under a lock merged with what other processes wrote meanwhile; a file whose stat changed is
    hashed again (its old entry is forgotten).
    """

    def __init__(self, db: Path) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._entries: dict[str, str | dict[str, str]] = self._load()

    def _load(self) -> dict[str, str | dict[str, str]]:
        try:
            loaded = json.loads(self._db.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    @staticmethod
    def _key(path: Path, st: os.stat_result | None = None) -> str:
        st = st or path.stat()
        return f"{path.resolve()}|{_identity(st)}"

    def sha256(self, path: Path) -> str:
        """The file's sha256: remembered while its stat is unchanged, else read (with its md5) and remembered."""
        st = path.stat()
        key = self._key(path, st)
        with self._lock:
            hit = self._entries.get(key)
        if isinstance(hit, str):  # written by a version that kept the sha256 alone
            return hit
        return self._digests(path, key, st)[0]

    def md5(self, path: Path) -> str:
        """The file's md5 (DVC's object id), from the same read as its sha256."""
        st = path.stat()
        return self._digests(path, self._key(path, st), st)[1]

    def _digests(self, path: Path, key: str, st: os.stat_result) -> tuple[str, str]:
        with self._lock:
            hit = self._entries.get(key)
            if isinstance(hit, dict):
                return hit["sha256"], hit["md5"]
            linked = self._same_file(st)
        if linked is None:
            digests = file_digests(path)
            if _identity(path.stat()) != _identity(st):
                return digests  # it changed while it was read: what was read is not what is there now
        else:
            digests = linked
        self._remember(path, key, {"sha256": digests[0], "md5": digests[1]})
        return digests

    def _same_file(self, st: os.stat_result) -> tuple[str, str] | None:
        """The digests remembered for this very file (the same inode, size and mtime) under another name."""
        suffix = f"|{_identity(st)}"
        for k, v in self._entries.items():
            if k.endswith(suffix) and isinstance(v, dict):
                return v["sha256"], v["md5"]
        return None

    def learn(self, path: Path, st: os.stat_result, sha256: str) -> None:
        """Remember a sha256 computed as the file was written (WrittenDigest), for `path` as `st` saw it: nothing is
        remembered once the file changed since. Its md5, if it is ever asked for, is read then (with the sha256)."""
        if _identity(path.stat()) == _identity(st):
            self._remember(path, self._key(path, st), sha256)

    def _remember(self, path: Path, key: str, value: str | dict[str, str]) -> None:
        """Record `value` under `key`, forgetting what was recorded for `path` as it was before."""
        self._write(key, value, forget=f"{path.resolve()}|")

    def _write(self, key: str, value: str | dict[str, str], *, forget: str | None = None) -> None:
        """Add one entry and write the file back, merged under a lock with what other processes added since it was
        read (each would otherwise write back only what it remembered)."""
        with self._lock:
            self._db.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(self._db.with_name(self._db.name + ".lock")):
                merged = {**self._load(), **self._entries}
                if forget is not None:
                    merged = {k: v for k, v in merged.items() if not k.startswith(forget)}
                merged[key] = value
                self._entries = merged
                write_text_atomic(self._db, json.dumps(merged, indent=0, sort_keys=True))

    def checked(self, path: Path, check: str) -> bool:
        """Whether `path`, as it is now (same device, inode, size and mtime), passed the check named `check`."""
        key = self._key(path)
        with self._lock:
            return self._entries.get(f"{key}|{check}") == "passed"

    def passed(self, path: Path, check: str) -> None:
        """Remember that `path`, as it is now, passed `check` (forgotten with its hash when the file changes)."""
        self._write(f"{self._key(path)}|{check}", "passed")


def _identity(st: os.stat_result) -> str:
    return f"{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"


def hash_cache(settings: Settings) -> HashCache:
    """The one hash cache of `settings`' home: every step that hashes a large file asks it, so a file unchanged since
    it was hashed is not read again; shared by every Settings naming the same home, however it is spelled (a
    relative path, a symlink): two caches on one file would each write back only what they remembered."""
    return _hash_cache(settings.home.resolve() / "hashcache.json")


@functools.cache
def _hash_cache(db: Path) -> HashCache:
    return HashCache(db)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class WrittenDigest:
    """The sha256 of a file another process writes front to back, read right behind the writer while it writes:
    the bytes come from the page cache, and the hashing runs beside the writer instead of after it. A freshly
    written output of many GiB (a 7B model's f16 is 15 GB) is then not read back from the disk for its receipt.

    `with WrittenDigest(path) as digest: <run the writer>`; afterwards `digest.sha256` and `digest.stat`, or None
    where what was read is not the file as it stands once the writer is done: it was never made, replaced under
    its name (another inode) or cut shorter than what was read (truncated and written again). Only for writers
    that never go back over what they wrote, which this cannot see: the GGUF converter (gguf-py's GGUFWriter
    writes the header, the key-values, the tensor infos, then each tensor, in order, to a file it opens once:
    gguf_writer.py:182 and 442-484, conversion/base.py:1233-1239 at the pinned llama.cpp); not llama-quantize,
    which writes its header last, over zeros at the start of the file (src/llama-quant.cpp:1171-1195)."""

    _POLL_S = 0.05

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sha256: str | None = None
        self.stat: os.stat_result | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"digest of {path.name}", daemon=True)

    def __enter__(self) -> WrittenDigest:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()  # the writer has exited (or failed): one last pass reads what it left
        self._thread.join()

    def _follow(self) -> None:
        try:
            fh = self._open()
            if fh is None:
                return
            sha, read = hashlib.sha256(), 0
            with fh:
                while True:
                    last = self._done.is_set()  # set before this pass: the pass reads all the writer wrote
                    while chunk := fh.read(_CHUNK):
                        sha.update(chunk)
                        read += len(chunk)
                    if last:
                        break
                    self._done.wait(self._POLL_S)
                mine = os.fstat(fh.fileno())
            now = self.path.stat()
        except OSError:
            return  # unreadable or gone: the receipt reads the file itself
        if (now.st_dev, now.st_ino, now.st_size) == (mine.st_dev, mine.st_ino, read):
            self.sha256, self.stat = sha.hexdigest(), now

    def _open(self) -> BinaryIO | None:
        while True:
            last = self._done.is_set()
            try:
                return open(self.path, "rb")
            except FileNotFoundError:
                if last:
                    return None
            self._done.wait(self._POLL_S)


def file_digests(path: Path) -> tuple[str, str]:
    """The sha256 and the md5 of the file at `path`, from one read of its bytes."""
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()
