"""DatasetCache.read_into's `out`: which stored column each of its arrays or
tensors receives (batch_targets).

Everything else is one native call per batch (_shmcache.cc's
Cache.read_into, with batch_targets.cc and batch_reader.cc): it checks the
targets, finds the rows, matches each against the targets (BatchReader's
rule: the shape exactly; the dtype exactly, or the same bytes for a numpy
array, or widened into a torch tensor), copies and widens the rows that
match with the GIL released, and counts each row once. With codes=True it
says per row what became of it: ROW_READ, ROW_MISSING (not cached) or
ROW_OTHER_LAYOUT (cached, but not matching the targets).
"""

from __future__ import annotations

from typing import Any

from ._shmcache import ROW_MISSING, ROW_OTHER_LAYOUT, ROW_READ
from .rows import POS, ColumnSelection, column_names

__all__ = ["batch_targets", "ROW_MISSING", "ROW_READ", "ROW_OTHER_LAYOUT"]


def batch_targets(out: Any, columns: ColumnSelection) -> tuple[list[str], list[Any]]:
    """(stored column names, buffers) of read_into's `out`: a dict names
    its columns by its keys, a tuple/list by position (or `columns`), a
    single buffer is the row's one column (or `columns`' one)."""
    if isinstance(out, dict):
        if columns is not None:
            raise ValueError("columns= names the columns of a tuple/list out; "
                             "a dict out names them by its keys")
        names = list(out)
        for k in names:
            if not isinstance(k, str):
                raise TypeError(f"column names must be str, got {type(k).__name__}")
        return names, list(out.values())
    if isinstance(out, (tuple, list)):
        bufs = list(out)
        names = ([f"{POS}{i}" for i in range(len(bufs))] if columns is None
                 else column_names(columns) or [])
        if len(names) != len(bufs):
            raise ValueError(f"columns names {len(names)} columns for "
                             f"{len(bufs)} arrays in out")
        if not bufs:
            raise ValueError("out holds no array")
        return names, bufs
    return column_names(columns) or [POS], [out]
