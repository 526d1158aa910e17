"""Atomic outputs and content hashes: nothing half-written is ever visible, nothing unchanged is re-hashed."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from pipelines.errors import DiskFullError

_PARTIAL = ".partial-"
_CHUNK = 8 * 1024 * 1024


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


def clean_partials(directory: Path) -> list[Path]:
    """Remove leftovers of killed runs (`*.partial-<pid>` whose process is gone) in `directory`.

    A partial file of a process that is still running belongs to a concurrent run and is left alone.
    """
    removed = []
    if directory.is_dir():
        for p in directory.iterdir():
            if _PARTIAL in p.name and not _writer_alive(p):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_output(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it onto `final` only if the block succeeds.

    Works for a file or a directory. On any exception the temporary path is removed and `final`
    keeps whatever it held before.

    Raises:
        DiskFullError: the block failed with ENOSPC.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(final)
    _remove(tmp)
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"{tmp} was not written")
        if tmp.is_file():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        if final.is_dir() and tmp.is_dir():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as err:
        _remove(tmp)
        if err.errno == errno.ENOSPC:
            raise DiskFullError(str(final.parent)) from err
        raise
    except BaseException:
        _remove(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


class HashCache:
    """sha256 of files, remembered by (device, inode, size, mtime_ns) so unchanged large files are not re-read.

    The cache is a small JSON file; a file whose stat changed is hashed again.
    """

    def __init__(self, db: Path) -> None:
        self._db = db
        self._lock = threading.Lock()
        try:
            self._entries: dict[str, str] = json.loads(db.read_text())
        except (FileNotFoundError, ValueError):
            self._entries = {}

    @staticmethod
    def _key(path: Path) -> str:
        st = path.stat()
        return f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"

    def sha256(self, path: Path) -> str:
        key = self._key(path)
        with self._lock:
            hit = self._entries.get(key)
        if hit:
            return hit
        digest = sha256_file(path)
        with self._lock:
            self._entries = {k: v for k, v in self._entries.items() if not k.startswith(f"{path.resolve()}|")}
            self._entries[key] = digest
            self._db.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self._db, json.dumps(self._entries, indent=0, sort_keys=True))
        return digest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
