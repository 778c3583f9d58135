"""The buffer rows travel in between ranks (exchange.py): rows in the
cache's own encoding, the columns [(name, dtype name, array)] that
DatasetCache.get_columns returns and put_columns takes (shmcache.rows), so
that a row from another node decodes (shmcache.rows.decode) exactly as a
local hit does.

A buffer: the length of a pickled description (8 bytes, little-endian),
the description, then the arrays' bytes, each at a multiple of 8 bytes.
The description is (ids, layouts, per row the index of its layout or -1
for a miss); a layout is a row's columns' (name, dtype name, numpy dtype,
shape), stored once however many rows share it (a dataset's rows mostly
do), so describing and reading back a buffer costs little per row.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Packed", "pack_rows", "unpack_rows"]

_LEN = 8             # bytes of the description's length
_ALIGN = 8           # every array starts at a multiple of this in a buffer

# A layout: ((name, dtype name, numpy dtype str, shape), ...) per column.
_Layout = tuple[tuple[str, str, str, tuple[int, ...]], ...]


def _contiguous(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    # Not np.ascontiguousarray: it makes a 0-d array 1-d.
    return a if a.flags.c_contiguous else np.array(a, order="C")


def aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class Packed:
    """Rows (columns, or None for a miss) described and sized, to be
    written into a buffer of `nbytes` (write)."""

    def __init__(self, ids: Sequence[int], rows: Sequence[Any]) -> None:
        self.leaves: list[npt.NDArray[Any]] = []
        layouts: dict[_Layout, int] = {}
        index: list[int] = []
        size = 0
        for cols in rows:
            if cols is None:
                index.append(-1)
                continue
            spec = []
            for name, dtype, a in cols:
                a = _contiguous(np.asarray(a))
                self.leaves.append(a)
                size += aligned(a.nbytes)
                spec.append((name, dtype, a.dtype.str, a.shape))
            index.append(layouts.setdefault(tuple(spec), len(layouts)))
        self.meta = pickle.dumps((list(ids), list(layouts), index),
                                 protocol=pickle.HIGHEST_PROTOCOL)
        self.nbytes = aligned(_LEN + len(self.meta)) + size

    def write(self, out: npt.NDArray[np.uint8]) -> None:
        """Writes the rows into out[:self.nbytes] (one copy of each array)."""
        out[:_LEN] = np.array([len(self.meta)], dtype="<u8").view(np.uint8)
        o = _LEN
        out[o:o + len(self.meta)] = np.frombuffer(self.meta, dtype=np.uint8)
        o = aligned(o + len(self.meta))
        for x in self.leaves:
            n = x.nbytes
            if n:
                out[o:o + n] = x.reshape(-1).view(np.uint8)
            o += aligned(n)


def pack_rows(ids: Sequence[int], rows: Sequence[Any]) -> npt.NDArray[np.uint8]:
    """One buffer holding rows (columns [(name, dtype name, array)], as
    DatasetCache.get_columns returns them; None: a miss) under their ids."""
    p = Packed(ids, rows)
    out = np.empty(p.nbytes, dtype=np.uint8)
    p.write(out)
    return out


def unpack_rows(buf: npt.NDArray[np.uint8]) -> tuple[list[int], list[Any]]:
    """(ids, rows) of a pack_rows buffer: each row its columns, as packed
    (None for a miss); the arrays are views into buf."""
    if len(buf) == 0:
        return [], []
    mlen = int(buf[:_LEN].view("<u8")[0])
    ids, layouts, index = pickle.loads(buf[_LEN:_LEN + mlen].tobytes())
    # Per layout, per column: (name, dtype name, numpy dtype, shape, bytes).
    resolved = []
    for spec in layouts:
        cols = []
        for name, dtype, np_dtype, shape in spec:
            dt = np.dtype(np_dtype)
            cols.append((name, dtype, dt, shape, dt.itemsize * math.prod(shape)))
        resolved.append(cols)
    o = aligned(_LEN + mlen)
    out: list[Any] = []
    for k in index:
        if k < 0:
            out.append(None)
            continue
        row: list[Any] = []
        for name, dtype, dt, shape, n in resolved[k]:
            row.append((name, dtype, np.ndarray(shape, dt, buf, o)))
            o += aligned(n)
        out.append(row)
    return ids, out

