"""The layout of a CachedLoader batch: RowSchema, the layout of fixed-shape
rows learned from a first row, which allocates a batch's buffers (from a
BufferPool, which reuses them once no tensor over them is alive), fills the
rows that came another way (misses, supplied rows), and hands out the batch
as default_collate over CachedDataset samples would build it.

The rows a schema's buffers receive are read by DatasetCache.fill_batch
(read_into's one native call; `read_targets` is its `out`, and the read
widens the columns torch has no dtype for); rows read one by one come from
read_columns; decode_sample and project turn rows that do not fit into
what CachedDataset would return.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .. import DatasetCache
from ..rows import (DTYPES, NUMBER_TAG, POS, Column, ColumnSelection, column_names,
                   decode, row_kind, split_name, torch_dtype)

__all__ = ["read_columns", "RowSchema", "BufferPool", "decode_sample", "project"]


def read_columns(cache: DatasetCache, ids: Sequence[int],
                 columns: ColumnSelection = None,
                 copy: bool = True) -> list[list[Column] | None]:
    """Per id, the cached row's [(name, dtype, array)] or None on a miss;
    spilled rows are read in one batch per call (from the spill database,
    in this process) when copy=True and no projection is asked."""
    if columns is None:
        return cache.get_batch_columns(ids, copy=copy)
    return [cache.get_columns(i, columns, copy=copy) for i in ids]


# ---- samples ------------------------------------------------------------

def _single(columns):
    return isinstance(columns, (str, int))


def decode_sample(cols: Sequence[Column], columns: ColumnSelection = None) -> Any:
    """The sample CachedDataset returns for a row's [(name, dtype, array)]
    (already projected to `columns`)."""
    if _single(columns):
        # The one column as a bare value: named POS, its tag kept.
        name = cols[0][0]
        return decode([(POS + name[len(split_name(name)[0]):], cols[0][1], cols[0][2])],
                      torch=True)
    return decode(list(cols), torch=True)


def project(cols: list[Column], columns: ColumnSelection) -> list[Column]:
    """The columns of a computed row that a `columns=` selection keeps, in
    its order (KeyError for a column the row does not have, as
    CachedDataset raises)."""
    names = column_names(columns)
    if names is None:
        return cols
    by_name = {split_name(c[0])[0]: c for c in cols}   # by key: tags ignored
    return [by_name[n] for n in names]


class _Column:
    """One fixed-shape column: stored name, tag (its dtype name), stored
    dtype, per-row shape, and the batch buffer of it: the tensor
    CachedDataset's samples stack into. `key` is its name in a sample (the
    stored name without a NUMBER_TAG); `number`: a Python number's column,
    which a sample holds as that number."""

    def __init__(self, name, tag, dtype, shape):
        self.name, self.tag, self.dtype, self.shape = name, tag, dtype, shape
        self.key_name, mark = split_name(name)
        self.number = mark == NUMBER_TAG
        # The row model's tensor dtype (rows.DTYPES): a column stored in a
        # dtype torch lacks (uint16/32/64) is widened into it by the read.
        self.torch = getattr(torch, torch_dtype(tag) or "")
        self.widen = tag != "bfloat16" and DTYPES[tag][2] != DTYPES[tag][1]
        self.out = np.dtype(DTYPES[tag][2]) if self.widen else dtype

    def key(self):
        return (self.name, self.tag, self.dtype, self.shape)

    def alloc(self, n, pin, pool):
        """(read target, array, tensor) of a batch of n rows: the tensor is
        the batch's; the array is over the same memory (what rows that come
        another way are written into: uint16 bits for bfloat16); the target
        is what read_into reads into: the tensor where the read widens the
        stored dtype, else the array."""
        shape = (n,) + self.shape
        bf16 = self.tag == "bfloat16"
        if pin:   # CUDA's host allocator recycles pinned memory
            t = torch.empty(shape, dtype=self.torch, pin_memory=True)
            a = t.view(torch.int16).numpy().view(np.uint16) if bf16 else t.numpy()
        elif bf16:
            a = pool.empty(shape, np.dtype(np.int16)).view(np.uint16)
            t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        else:
            a = pool.empty(shape, self.out)
            t = torch.from_numpy(a)
        return (t if self.widen else a), a, t

    def fill(self, buf, i, a):
        """Row i of the batch from a row's array (widened as the read does)."""
        np.copyto(buf[1][i, ...], a, casting="unsafe" if self.widen else "no")


class RowSchema:
    """The layout of a fixed-shape row (every column an array of one shape
    and dtype, no bytes): RowSchema.of(cols) or None."""

    def __init__(self, columns, kind):
        self.columns = columns       # [_Column]
        self.kind = kind             # "leaf", "tuple" or "dict"
        self._keys = [c.key() for c in columns]

    @classmethod
    def of(cls, cols: Sequence[Column],
           columns: ColumnSelection = None) -> RowSchema | None:
        """The schema of a row's [(name, dtype, array)], or None when a column
        cannot go into a batch buffer (bytes, a dtype torch lacks, a PIL
        image: a sample holds it as an image, not as a tensor). A Python
        number's column goes in as its 0-d array: default_collate batches
        numbers into the same tensor."""
        out = []
        for name, tag, a in cols:
            if tag not in DTYPES or torch_dtype(tag) is None or a.dtype.hasobject \
                    or split_name(name)[1] not in ("", NUMBER_TAG):
                return None
            out.append(_Column(name, tag, a.dtype, tuple(a.shape)))
        kind = "leaf" if _single(columns) else row_kind([n for n, _, _ in cols])
        return cls(out, "leaf" if kind == "value" else kind)

    def fits(self, cols: Sequence[Column] | None) -> bool:
        return cols is not None and len(cols) == len(self._keys) and all(
            (n, t, a.dtype, a.shape) == k for (n, t, a), k in zip(cols, self._keys))

    def alloc(self, n, pin, pool):
        """The buffers of a batch of n rows (from `pool` unless pinned)."""
        return [c.alloc(n, pin, pool) for c in self.columns]

    def read_targets(self, bufs):
        """`out` for read_into: by name for dict rows, else by position."""
        if self.kind == "dict":
            return {c.key_name: b[0] for c, b in zip(self.columns, bufs)}
        return tuple(b[0] for b in bufs)

    def fill(self, bufs, i, cols):
        for c, buf, (_, _, a) in zip(self.columns, bufs, cols):
            c.fill(buf, i, a)

    def tensors(self, bufs):
        return [b[2] for b in bufs]

    def batch(self, tensors):
        """What default_collate makes of the samples: a tensor, a list of
        tensors (tuple samples) or a dict."""
        if self.kind == "leaf":
            return tensors[0]
        if self.kind == "tuple":
            return list(tensors)
        return {c.key_name: t for c, t in zip(self.columns, tensors)}

    def sample(self, tensors, i):
        """Sample i of a batch, as CachedDataset returns it (views; a Python
        number's column as the number)."""
        values = [t[i].item() if c.number else t[i]
                  for c, t in zip(self.columns, tensors)]
        if self.kind == "leaf":
            return values[0]
        if self.kind == "tuple":
            return tuple(values)
        return {c.key_name: v for c, v in zip(self.columns, values)}

    def row_bytes(self):
        """Bytes of one row of each column, as the batch's tensors hold it."""
        return [int(np.prod(c.shape, dtype=np.int64)) * c.out.itemsize for c in self.columns]

    def nbytes(self, n):
        return n * sum(int(np.prod(c.shape, dtype=np.int64)) * c.dtype.itemsize
                       for c in self.columns)


class BufferPool:
    """Batch buffers reused once nothing uses them any more.

    A buffer is a numpy array that the batch's tensors hold (torch.from_numpy
    keeps a reference to it in their storage, one for all views), so its
    reference count tells whether any tensor or view over it is alive.
    Reusing it saves a page fault per 4 KB of fresh memory, which costs more
    than copying the rows. At most `limit()` buffers of each shape are
    kept."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._kept: dict[tuple[Any, str], list[npt.NDArray[Any]]] = {}  # by (shape, dtype)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        with self._lock:
            kept = self._kept.setdefault((shape, dtype.str), [])
            for a in kept:
                # References: the list, `a`, getrefcount's argument.
                if sys.getrefcount(a) == 3:
                    return a
            a = np.empty(shape, dtype=dtype)
            if len(kept) < self._limit():
                kept.append(a)
            return a

    def in_use(self) -> int:
        """How many of the kept buffers a batch (or a tensor over one) still
        holds."""
        with self._lock:
            return sum(sys.getrefcount(a) > 3 for kept in self._kept.values()
                       for a in kept)
