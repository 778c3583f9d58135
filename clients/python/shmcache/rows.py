"""The row model, from the native module (row_model.cc): the one encoding
of a sample into stored columns and the one decoding of columns into a
sample, for hits and misses alike.

A column is (name, dtype name, array). A sample is a bare value (one column
"#"), a tuple (columns "#0", "#1", ...) or a dict (named columns) of numpy
arrays, tensors, numbers, bytes or PIL images (stored as their pixel array
with their mode; decoded as PIL images again). A Python int, float or bool
is a 0-d column tagged NUMBER_TAG ("label\x1fpy": get_columns shows stored
names, split_name splits them) and decode(..., torch=True) gives that
Python number back, as CachedDataset's samples hold it (torch=False: its
0-d array; a numpy scalar or a 0-d tensor: a 0-d array or tensor).

    cols = encode((image, label))     # [("#0", "uint8", a), ("#1\x1fpy", "int64", b)]
    decode(cols, torch=True)          # (tensor, int): what a hit returns
    row_kind(["#0", "#1"])            # "tuple"
    split_name("#0\x1fRGB")           # ("#0", "RGB"): a PIL image column
    torch_dtype("uint16")             # "int32": the tensor a column reads into

ROW_FORMAT is the version of what encode makes of a sample (row_model.h):
a dataset's cache identity includes it (shmcache.torch.fingerprint), so
rows another version of the package stored in another format are never
read as this one's.

The limits and dtypes come from the C++ headers: MAX_ROW_ID, MIN_PORT,
MAX_PORT, MAX_NAME_BYTES, MAX_COLUMNS, LOCAL_HOSTS, NUMBER_TAG and DTYPES ({name:
(itemsize, numpy dtype name, torch dtype name or None)}).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Union

import numpy.typing as npt

from ._shmcache import (DEFAULT_PORT, DTYPES, LOCAL_HOSTS, MAX_COLUMNS, MAX_NAME_BYTES,
                        MAX_PORT, MAX_ROW_ID, MIN_PORT, NUMBER_TAG, ROW_FORMAT, decode,
                        encode, row_kind, split_name)

__all__ = ["Column", "Array", "ColumnSelection", "encode", "decode", "row_kind",
           "split_name",
           "torch_dtype", "column_names", "DEFAULT_PORT", "DTYPES", "LOCAL_HOSTS",
           "MAX_COLUMNS",
           "MAX_NAME_BYTES", "MAX_PORT", "MAX_ROW_ID", "MIN_PORT", "NUMBER_TAG", "POS",
           "ROW_FORMAT"]

Array = npt.NDArray[Any]
# (name, dtype name, array): what encode returns, put stores and reads return.
Column = tuple[str, str, Array]
# columns= of the reads: a name or position, several, or None for all.
ColumnSelection = Union[str, int, Sequence[Union[str, int]], None]

# Column names of positional rows: "#0", "#1", ...; a bare value is "#".
POS = "#"


def torch_dtype(stored: str) -> str | None:
    """The torch dtype name a column stored as `stored` reads into (None for
    bytes, which stay bytes)."""
    return DTYPES[stored][2]


def column_names(columns: ColumnSelection) -> list[str] | None:
    """The stored names a `columns=` selection names (positions become "#k");
    None for None (all columns)."""
    if columns is None:
        return None
    if isinstance(columns, (str, int)):
        columns = [columns]
    elif isinstance(columns, (bytes, bytearray)) or not isinstance(columns, Iterable):
        raise TypeError("columns is a column name (str), a position (int), a list of "
                        f"them, or None for all; got {type(columns).__name__}")
    names = []
    for c in columns:
        if isinstance(c, bool) or not isinstance(c, (str, int)):
            raise TypeError(f"a column is a name (str) or a position (int), got {c!r}")
        names.append(f"{POS}{c}" if isinstance(c, int) else c)
    if not names:
        raise ValueError("columns selects no column: name at least one, or "
                         "pass None for all")
    return names
