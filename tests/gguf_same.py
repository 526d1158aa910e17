"""Do two GGUF files hold the same tensors? Asked of gguf-py's reader (the independent one) on one of them only.

gguf-py's GGUFReader maps every vocabulary item: 5-15 s a file for a 150k-token vocabulary on 2 cores. A file
whose metadata was rewritten keeps the tensor-info table and the data section byte for byte, so the other file
need not be parsed: its last bytes must be the data section gguf-py found in the first, preceded (after the
alignment padding) by the same tensor-info table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def assert_same_tensors(old: Path, new: Path, new_reader: Any) -> None:
    """Fail unless `old` holds exactly the tensors (names, shapes, types, offsets, bytes) that `new_reader`
    (gguf-py's GGUFReader of `new`) read from `new`."""
    data = new.read_bytes()
    assert new_reader.tensors, f"{new} holds no tensors"
    table = data[new_reader.tensors[0].field.offset:
                 new_reader.tensors[-1].field.offset + sum(p.nbytes for p in new_reader.tensors[-1].field.parts)]
    section = data[new_reader.data_offset:]
    was = old.read_bytes()
    assert was.endswith(section), f"{old}: its tensor data differ from {new}'s"
    start = len(was) - len(section)
    at = was.rfind(table, 0, start)
    assert at >= 0, f"{old}: its tensor-info table differs from {new}'s"
    padding = was[at + len(table):start]
    assert len(padding) < new_reader.alignment and padding.strip(b"\0") == b"", f"{old}: not aligned as {new}"
