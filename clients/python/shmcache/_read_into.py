"""DatasetCache.read_into's targets: `out` checked (check_targets) and, once
the native read knows the stored dtypes of the first cached row, planned
(read_targets): a torch tensor of a dtype wider than the stored one
(uint16 -> int32, uint32/uint64 -> int64) reads through a scratch array
and is widened into after the read, for the rows that hit.

The copy itself is native (_shmcache.cc's Cache.read_into, with
batch_reader.cc): it calls back into read_targets' planner once, with the
stored dtypes, and copies every hit row with the GIL released.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _shmcache
from .rows import DTYPES, POS, ColumnSelection, column_names, torch_dtype

__all__ = ["Spec", "check_targets", "read_targets"]

# (name, dtype name, row shape, address, row stride, buf, is_torch) of one
# checked target.
Spec = tuple[str, str, tuple[int, ...], int, int, Any, bool]
Widen = Callable[[npt.NDArray[np.bool_]], None]

# The dtypes a tensor target may have: those columns read into as tensors.
_TORCH_DTYPE_NAMES = tuple(sorted({t for _, _, t in DTYPES.values() if t}))


def check_targets(out: Any, columns: ColumnSelection,
                  n: int) -> tuple[list[str], list[Spec]]:
    """(stored column names, checked targets) of read_into's `out` for n
    ids; TypeError / ValueError naming the column that is wrong."""
    names, bufs = _targets(out, columns)
    return names, [_target_spec(name, b, n) for name, b in zip(names, bufs)]


def read_targets(native: _shmcache.Cache, ids: npt.NDArray[np.uint64],
                 names: list[str], specs: list[Spec], threads: int,
                 hit: npt.NDArray[np.bool_]) -> None:
    """Reads rows `ids` into the targets, hit[i] set for each row read
    (see DatasetCache.read_into); raises the native module's Error."""
    n = len(ids)
    plan: list[tuple[Any, Widen | None]] = []

    def targets(stored: list[str | None] | None) -> list[Any]:
        # The stored dtypes of the first cached row (None: no row is
        # cached) decide which targets read a wider dtype via scratch.
        plan[:] = [_plan_target(spec, None if stored is None else st, n)
                   for spec, st in zip(specs, stored or [None] * len(specs))]
        return [p[0] for p in plan]
    native.read_into(ids, names, targets, threads, hit.view(np.uint8))
    for _, widen in plan:
        if widen is not None:
            widen(hit)


def _targets(out: Any, columns: ColumnSelection) -> tuple[list[str], list[Any]]:
    """(stored column names, buffers) of read_into's `out`."""
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


def _target_spec(name: str, buf: Any, n: int) -> Spec:
    """The Spec of one read_into target, checked."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous or not buf.flags.writeable:
            raise ValueError(f"column {name!r}: the array must be C-contiguous "
                             "and writable")
        if not buf.dtype.isnative:
            raise ValueError(f"column {name!r}: the array is not in native byte order")
        dtype = "bool" if buf.dtype.kind == "b" else buf.dtype.name
        shape, address = buf.shape, buf.ctypes.data
        stride = buf.dtype.itemsize * math.prod(shape[1:])
        is_torch = False
    elif type(buf).__module__.startswith("torch"):
        import torch
        if not isinstance(buf, torch.Tensor):
            raise TypeError(f"column {name!r}: out holds a {type(buf).__name__}")
        if buf.device.type != "cpu" or not buf.is_contiguous():
            raise ValueError(f"column {name!r}: the tensor must be on the CPU "
                             "and contiguous")
        dtype = str(buf.dtype).rpartition(".")[2]
        if dtype not in _TORCH_DTYPE_NAMES:
            raise TypeError(f"column {name!r}: a cache column has no {buf.dtype} "
                            f"(use one of {', '.join(_TORCH_DTYPE_NAMES)})")
        shape, address = tuple(buf.shape), buf.data_ptr()
        stride = buf.element_size() * math.prod(shape[1:])
        is_torch = True
    else:
        raise TypeError(f"column {name!r}: out holds numpy arrays or torch "
                        f"tensors, got {type(buf).__name__}")
    if len(shape) < 1 or shape[0] < n:
        raise ValueError(f"column {name!r}: the first dimension ({shape[0] if shape else 'none'}) "
                         f"must hold the {n} ids")
    if dtype not in DTYPES:
        raise TypeError(f"column {name!r}: unsupported array dtype {dtype}")
    return name, dtype, tuple(int(d) for d in shape[1:]), address, stride, buf, is_torch


def _plan_target(spec: Spec, stored: str | None, n: int) -> tuple[Any, Widen | None]:
    """(native target, widen or None) of one checked target, given the
    column's stored dtype name in a cached row (None: not in that row)."""
    name, dtype, shape, address, stride, buf, is_torch = spec
    if is_torch and stored == "bytes":
        raise TypeError(f"column {name!r} holds bytes, which have no torch "
                        "dtype: read it into a numpy uint8 array")
    if is_torch and stored is not None and stored != dtype \
            and torch_dtype(stored) == dtype:
        # Read the stored type into a scratch array; hits widen into buf.
        tmp = np.empty((n,) + shape, dtype=stored)
        item = tmp.dtype.itemsize * int(np.prod(shape, dtype=np.int64))

        def widen(hit: npt.NDArray[np.bool_], tmp: Any = tmp, buf: Any = buf) -> None:
            import torch
            rows = np.flatnonzero(hit)
            if rows.size:
                idx = torch.from_numpy(rows)
                buf[idx] = torch.from_numpy(tmp[rows].astype(dtype))
        return (name, stored, shape, tmp.ctypes.data, item), widen
    if stored is not None and (stored, dtype) in (("bfloat16", "uint16"),
                                                  ("bytes", "uint8")):
        dtype = stored      # the same bytes: numpy has no such dtype
    return (name, dtype, shape, address, stride), None
