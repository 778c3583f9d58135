"""Argument checks of DatasetCache: what a wrong argument raises (TypeError
for a wrong type, ValueError for a value out of range, in MindSpore's
words), and where a cache finds its session when none is given.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sized
from typing import Any

import numpy as np
import numpy.typing as npt

from .rows import DEFAULT_PORT, MAX_NAME_BYTES, MAX_ROW_ID

__all__ = ["MAX_INT32", "MAX_UINT32", "MAX_SIZE_MB", "SESSION_ENV", "check_int", "check_id",
           "check_iterable", "check_names", "check_type", "ids_array", "port_arg",
           "session_from_env"]

MAX_INT32 = 2**31 - 1
MAX_UINT32 = 2**32 - 1
# The largest size_mb a server takes (its bytes fit an int64: CacheOptions in
# shmcache/options.h); a larger one is a ValueError here, not a cache bypassed.
MAX_SIZE_MB = (2**63 - 1) >> 20
# Where DatasetCache() finds its session: the first of these that is set
# (SESSION_ID is what scripts/cache.sh exported first).
SESSION_ENV = ("SHMCACHE_SESSION_ID", "SESSION_ID")


def port_arg(port: int | None) -> str:
    """" -p N" for a `shmcache` command a message suggests, so that it asks
    the server on `port`; "" for the default port and for None or 0 (the
    port of $SHMCACHE_PORT, which the command reads too), as the admin CLI's
    PortArg (format/instance.h)."""
    return "" if not port or port == DEFAULT_PORT else f" -p {port}"


def _not_of_type(name: str, value: Any, kind: str) -> TypeError:
    return TypeError(f"Argument {name} with value {value!r} is not of type "
                     f"{kind}, but got {type(value).__name__}.")


def check_type(name: str, value: Any, kind: type) -> None:
    """TypeError naming `name` unless `value` is a `kind`."""
    if not isinstance(value, kind):
        raise _not_of_type(name, value, kind.__name__)


# What to pass instead of an int out of its interval, by argument name
# (others: a whole number in the interval).
_INT_FIXES = {
    "session_id": "pass the id `shmcache -g` printed, or leave it out for "
                  "$SHMCACHE_SESSION_ID",
    "size_mb": "pass the cache's memory budget in MB, or 0 for as much as the server "
               "allows",
    "size": "pass size_mb=, the cache's memory budget in MB, or 0 for as much as the "
            "server allows",
    "port": f"pass the port the server was started with (`shmcache --start -p N`), or "
            f"leave it out for $SHMCACHE_PORT or the default {DEFAULT_PORT}",
    "timeout_ms": "pass a timeout in milliseconds, 1 or more",
    "num_connections": "pass a positive number, or leave it out (a hit needs no "
                       "connection here)",
    "prefetch_size": "pass a positive number, or leave it out (a hit needs no "
                     "prefetch here)",
    "read_threads": "pass a number of threads (0 or 1: the calling thread alone), or "
                    "leave it out for min(4, CPUs)",
}


def check_int(name: str, value: Any, lo: int, hi: int, allow_none: bool = False,
              fix: str | None = None) -> None:
    """TypeError unless `value` is an int (None too, with `allow_none`);
    ValueError outside [lo, hi], in MindSpore's words, then the value and
    what to pass instead (`fix`, else the argument's usual fix)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise _not_of_type(name, value, "int")
    if not lo <= value <= hi:
        fix = fix or _INT_FIXES.get(name, "pass a whole number in it")
        raise ValueError(f"Input {name} is not within the required interval "
                         f"of [{lo}, {hi}]: got {value}; {fix}.")


def check_names(name: Any, fingerprint: Any) -> None:
    """A cache's name (1 to MAX_NAME_BYTES bytes of UTF-8) and fingerprint
    (None, or at most MAX_NAME_BYTES bytes)."""
    for arg, value in (("name", name), ("fingerprint", fingerprint)):
        if value is None and arg == "fingerprint":
            continue
        if not isinstance(value, str):
            raise TypeError(f"Argument {arg} must be str, got {type(value).__name__}.")
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise ValueError(f"Argument {arg} must be UTF-8 text, got {value!r}.") from None
        if size > MAX_NAME_BYTES or (arg == "name" and size == 0):
            bound = "1 to" if arg == "name" else "at most"
            raise ValueError(f"Argument {arg} must have {bound} {MAX_NAME_BYTES} bytes.")


def check_iterable(name: str, value: Any, sized: bool = False) -> None:
    """TypeError naming `name` unless `value` can be iterated (and, with
    `sized`, has a length: a list or tuple rather than a generator)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or (
            sized and not isinstance(value, Sized)):
        what = "a list" if sized else "an iterable (a list)"
        raise TypeError(f"{name} is {what} with one element per row, got "
                        f"{type(value).__name__}")


def check_id(row_id: Any) -> int:
    """`row_id` as an int, checked as a row id."""
    if isinstance(row_id, bool) or not isinstance(row_id, (int, np.integer)):
        raise TypeError(f"a row id is an int, got {type(row_id).__name__}")
    if not 0 <= row_id <= MAX_ROW_ID:
        raise ValueError(f"row id {row_id} outside [0, {MAX_ROW_ID}]")
    return int(row_id)


def ids_array(ids: Any) -> npt.NDArray[np.uint64]:
    """ids as a C-contiguous uint64 array, each checked as a row id."""
    a = np.asarray(ids)
    if a.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if a.ndim != 1:
        raise ValueError(f"ids must be one-dimensional, got shape {a.shape}")
    if a.dtype == object:
        return np.array([check_id(v) for v in a], dtype=np.uint64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"row ids are ints, got an array of {a.dtype}")
    if a.dtype.kind == "i" and a.min() < 0:
        raise ValueError(f"row id {int(a.min())} outside [0, {MAX_ROW_ID}]")
    if a.max() > MAX_ROW_ID:
        raise ValueError(f"row id {int(a.max())} outside [0, {MAX_ROW_ID}]")
    return np.ascontiguousarray(a, dtype=np.uint64)


def typed_number_flaw(text: str) -> str:
    """What makes `text` no number as a person types one, though int()
    would take it: "" when nothing does; else "it is empty", "white space
    before it", "white space after it" or "a '+' sign", as the C++ side's
    TypedNumberFlaw (format/parse_number.h) words it."""
    if not text:
        return "it is empty"
    if text[0].isspace():
        return "white space before it"
    if text[-1].isspace():
        return "white space after it"
    return "a '+' sign" if text[0] == "+" else ""


def session_from_env() -> int:
    """The session id of $SHMCACHE_SESSION_ID (or $SESSION_ID, which
    scripts/cache.sh exported first); ValueError naming both when neither
    is set, saying so when one is set but empty (a failed `shmcache -g`),
    or when the value is not a number in 0..MAX_UINT32 (one out of range
    was told as an argument: "pass the id, or leave it out for
    $SHMCACHE_SESSION_ID", which it came from)."""
    for var in SESSION_ENV:
        value = os.environ.get(var)
        if value:
            # Digits alone, as the admin takes `-d ID`: int() also took
            # " 12", "+12" and "1_2" (a quoting slip hidden).
            flaw = typed_number_flaw(value)
            session = int(value) if value.isascii() and value.isdigit() else -1
            if flaw or not 0 <= session <= MAX_UINT32:
                raise ValueError(f"${var}={value!r} is not a session id (a number in "
                                 f"0..{MAX_UINT32} from `shmcache -g`)"
                                 + (f" ({flaw}): set it to the number alone" if flaw
                                    else ""))
            return session
    empty = [f"${var}" for var in SESSION_ENV if os.environ.get(var) == ""]
    if empty:
        # `export SHMCACHE_SESSION_ID=$(shmcache -g | awk ...)` after a -g
        # that failed: the cause is in that command's own message.
        raise ValueError(f"no session: {' and '.join(empty)} set but empty, as a "
                         "`shmcache -g` that failed leaves it (it printed why: is the "
                         "server started? `shmcache --start`); set it to the id "
                         "`shmcache -g` prints, or pass session_id=")
    raise ValueError("no session: pass session_id=, or set $SHMCACHE_SESSION_ID "
                     "(scripts/cache.sh and the Slurm prolog export it; "
                     "`shmcache -g` prints one)")
