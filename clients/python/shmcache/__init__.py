"""shmcache: a shared-memory cache for training data, from Python.

    import shmcache
    cache = shmcache.DatasetCache()     # session: $SHMCACHE_SESSION_ID
    row = cache.get(i)                  # None on a miss
    if row is None:
        row = (image, label)            # numpy arrays, tensors or scalars
        cache.put(i, row)

A row is a tuple (or list) of columns, a dict of named columns, or a single
array. Hits come back in the same shape: a tuple, a dict, or an array.

The cache never breaks training: when the daemon disappears, the cache is
full, or the daemon answers an error, the first such event emits one
`CacheWarning` and later calls quietly return misses (`get` -> None) or
drop the row (`put` -> False). A row too large for what is left of the
cache is dropped alone (`put` -> False, one `CacheWarning` naming its size
and the budget); smaller rows go on being cached. Only wrong arguments
raise: TypeError for a wrong type, ValueError for a value out of range,
RuntimeError for a non-local host, and for a session that does not exist
(NotFoundError) or a cache name reused for a different pipeline
(FingerprintMismatchError): the package's errors are RuntimeError
subclasses, as MindSpore raises RuntimeError there.

`with DatasetCache(...) as cache:` closes the cache at the end of the block.

Zero-copy hits (copy=False, and CachedDataset's default in DataLoader
workers) are arrays over the cache's shared memory, read-only: a row never
changes once stored, and each array keeps the cache mapped, so it stays
valid for as long as it lives, after close() or the session's destruction
too (the C++ statement of a view's lifetime: shmcache/row.h). A row the
cache spilled to disk has no shared memory and always comes back as a
copy.
"""

from __future__ import annotations

import enum
import math
import os
import threading
import warnings
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from . import _shmcache
from ._shmcache import (AlreadyExistsError, Error, FingerprintMismatchError,
                        FullError, InvalidArgumentError, NotFoundError,
                        NotSupportedError, PermissionDeniedError, TooLargeError,
                        UnavailableError)
from .rows import (DTYPES, LOCAL_HOSTS, MAX_NAME_BYTES, MAX_PORT, MAX_ROW_ID,
                   MIN_PORT, POS, Array, Column, ColumnSelection, column_names,
                   decode, encode, torch_dtype)
from .stats import CacheStats

__all__ = [
    "DatasetCache", "CacheWarning", "CacheStats", "Client", "Error", "NotFoundError",
    "UnavailableError", "FullError", "FingerprintMismatchError",
    "InvalidArgumentError", "AlreadyExistsError", "PermissionDeniedError",
    "NotSupportedError", "TooLargeError", "LOCAL_HOSTS", "MAX_ROW_ID",
    "SESSION_ENV",
]

Client = _shmcache.Client

_MAX_INT32 = 2**31 - 1
_MAX_UINT32 = 2**32 - 1
# Where DatasetCache() finds its session: the first of these that is set
# (SESSION_ID is what scripts/cache.sh exported first).
SESSION_ENV = ("SHMCACHE_SESSION_ID", "SESSION_ID")


# What bounds a server's memory cap (the server info's memory_cap_bound):
# what it is, and how to raise it.
_CAP_BOUNDS: dict[str, tuple[str, str]] = {
    "shm_filesystem": (
        "the room in the shm filesystem {shm_dir}",
        "give the container a larger /dev/shm (docker run --shm-size=8g; in "
        "Kubernetes an emptyDir with medium: Memory and a sizeLimit mounted at "
        "/dev/shm), or restart the server with --shm_dir on a larger tmpfs"),
    "cgroup": (
        "-r of the memory limit of the server's cgroup, {cgroup_mb} MB",
        "raise the container's memory limit (docker run --memory, Kubernetes "
        "resources.limits.memory) or restart the server with a larger -r"),
    "physical_memory": (
        "-r of the physical memory",
        "restart the server with a larger -r, or open a smaller cache"),
    "memory_cap_mb": (
        "the server's --memory_cap_mb",
        "restart the server with a larger --memory_cap_mb, or open a smaller cache"),
}


class CacheWarning(UserWarning):
    """The cache stopped helping (daemon gone, full, error); training goes on."""


# FullError.reason (set by the native module) -> the CacheWarning's words.
_FULL_CAUSES = {
    "shm_filesystem": "no room left in the shared-memory filesystem",
    "server_cap": "the cache server's memory cap is used up",
    "budget": "the cache is full",
}


def _cause(err: Error) -> str:
    """What stopped the cache, in a few words, for the CacheWarning; the
    library's message that follows it has the numbers and the fix."""
    if isinstance(err, UnavailableError):
        return "the cache server is unreachable"
    if isinstance(err, FullError):
        return _FULL_CAUSES.get(getattr(err, "reason", ""), "the cache is full")
    if isinstance(err, AlreadyExistsError):
        return "a shared-memory file of the cache already exists"
    if isinstance(err, PermissionDeniedError):
        return "permission denied"
    if isinstance(err, NotFoundError):
        return "the cache or its session no longer exists"
    return "the cache failed"


def _check_int(name: str, value: Any, lo: int, hi: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"Argument {name} with value {value!r} is not of type "
                        f"int, but got {type(value).__name__}.")
    if not lo <= value <= hi:
        raise ValueError(f"Input {name} is not within the required interval "
                         f"of [{lo}, {hi}].")


def _ids_array(ids: Any) -> npt.NDArray[np.uint64]:
    """ids as a C-contiguous uint64 array, each checked as a row id."""
    a = np.asarray(ids)
    if a.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if a.ndim != 1:
        raise ValueError(f"ids must be one-dimensional, got shape {a.shape}")
    if a.dtype == object:
        for v in a:
            DatasetCache._check_id(v)
        return np.array([int(v) for v in a], dtype=np.uint64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"row ids are ints, got an array of {a.dtype}")
    if a.dtype.kind == "i" and a.min() < 0:
        raise ValueError(f"row id {int(a.min())} outside [0, {MAX_ROW_ID}]")
    if a.max() > MAX_ROW_ID:
        raise ValueError(f"row id {int(a.max())} outside [0, {MAX_ROW_ID}]")
    return np.ascontiguousarray(a, dtype=np.uint64)


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


# The dtypes a tensor target may have: those columns read into as tensors.
_TORCH_DTYPE_NAMES = tuple(sorted({t for _, _, t in DTYPES.values() if t}))


def _target_spec(name, buf, n):
    """(name, dtype name, row shape, address, row stride, buf, is_torch) of
    one read_into target, checked."""
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


def _plan_target(spec, stored, n):
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

        def widen(hit, tmp=tmp, buf=buf):
            import torch
            rows = np.flatnonzero(hit)
            if rows.size:
                idx = torch.from_numpy(rows)
                buf[idx] = torch.from_numpy(tmp[rows].astype(dtype))
        return (name, stored, shape, tmp.ctypes.data, item), widen
    if (stored, dtype) in (("bfloat16", "uint16"), ("bytes", "uint8")):
        dtype = stored      # the same bytes: numpy has no such dtype
    return (name, dtype, shape, address, stride), None


class _State(enum.IntEnum):
    """How far a DatasetCache degraded; it only ever gets worse."""
    SERVING = 0     # hits and puts go to the cache
    FULL = 1        # puts are refused (and counted) by the cache; hits served
    READ_ONLY = 2   # the daemon is gone: hits still served, puts dropped
    BYPASSED = 3    # nothing works: every read is a miss, every put dropped


def session_from_env() -> int:
    """The session id of $SHMCACHE_SESSION_ID (or $SESSION_ID, which
    scripts/cache.sh exported first); ValueError naming both when neither
    is set or the value is not a number."""
    for var in SESSION_ENV:
        value = os.environ.get(var)
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"${var}={value!r} is not a session id (a "
                                 "number from `shmcache -g`)") from None
    raise ValueError("no session: pass session_id=, or set $SHMCACHE_SESSION_ID "
                     "(scripts/cache.sh start exports it; or `shmcache -g` "
                     "prints one)")


class DatasetCache:
    """A cache inside a session of a running shmcache server.

    Mirrors MindSpore's DatasetCache(session_id, size=0, spilling=False,
    hostname=None, port=None, num_connections=None, prefetch_size=None),
    with the size's unit in its name: `size_mb`, the cache's memory budget
    in MB (0: as much as the server allows; one CacheWarning at open when
    it is more than the server's memory cap). MindSpore's keyword `size=`
    (also MB) is still accepted, with a DeprecationWarning.
    `session_id` defaults to $SHMCACHE_SESSION_ID (else $SESSION_ID).
    `num_connections` and
    `prefetch_size` are accepted and checked for compatibility; a hit needs
    no connection here. `name` selects the cache inside the session
    (default "default"); `fingerprint` describes what produces the rows and
    defaults to the name. Re-opening a name with another fingerprint raises
    FingerprintMismatchError (a RuntimeError).

    `read_threads`: how many threads read_into copies rows with, the
    calling thread included (default min(4, CPUs); 0 or 1: the calling
    thread alone).

    Which call for what: put / get (a row at a time; `view` for zero-copy),
    put_batch / get_batch (a batch of rows in one call), read_into (a batch
    straight into preallocated arrays or tensors); put_columns /
    get_columns for rows already as columns (shmcache.rows).

    The object pickles (for DataLoader workers started with spawn) and
    survives fork; a worker re-attaches on first use. As a context manager
    it closes the cache when the block ends (close()).
    """

    # State that does not travel through pickle (_init_runtime).
    _lock: threading.Lock
    _lock_pid: int
    _client: _shmcache.Client | None
    _cache: _shmcache.Cache | None
    _state: _State
    _warned: bool
    _warned_row: bool
    _bytes_read: int

    def __init__(self, session_id: int | None = None, size_mb: int = 0,
                 spilling: bool = False, hostname: str | None = None,
                 port: int | None = None, num_connections: int | None = None,
                 prefetch_size: int | None = None, name: str = "default",
                 fingerprint: str | None = None,
                 read_threads: int | None = None, *,
                 size: int | None = None) -> None:
        if session_id is None:
            session_id = session_from_env()
        _check_int("session_id", session_id, 0, _MAX_UINT32)
        if size is not None:
            if size_mb != 0:
                raise TypeError("pass size_mb= (the cache size in MB) alone; size= "
                                "is its deprecated name")
            _check_int("size", size, 0, 2**63 - 1)
            warnings.warn("DatasetCache(size=...) is deprecated: the size is in MB, "
                          "pass it as size_mb=", DeprecationWarning, stacklevel=2)
            size_mb = size
        _check_int("size_mb", size_mb, 0, 2**63 - 1)
        if not isinstance(spilling, bool):
            raise TypeError(f"Argument spilling with value {spilling!r} is not "
                            f"of type bool, but got {type(spilling).__name__}.")
        if hostname is not None and not isinstance(hostname, str):
            raise TypeError(f"Argument hostname with value {hostname!r} is not "
                            f"of type str, but got {type(hostname).__name__}.")
        if hostname is not None and hostname not in LOCAL_HOSTS:
            raise RuntimeError(f"Only the local host is supported, got hostname "
                               f"{hostname!r}; use one of {', '.join(LOCAL_HOSTS)}.")
        _check_int("port", port, MIN_PORT, MAX_PORT, allow_none=True)
        _check_int("num_connections", num_connections, 1, _MAX_INT32, allow_none=True)
        _check_int("prefetch_size", prefetch_size, 1, _MAX_INT32, allow_none=True)
        if not isinstance(name, str):
            raise TypeError(f"Argument name must be str, got {type(name).__name__}.")
        if not name or len(name.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"Argument name must have 1 to {MAX_NAME_BYTES} bytes.")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise TypeError("Argument fingerprint must be str.")
        if fingerprint is not None and len(fingerprint.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"Argument fingerprint must have at most {MAX_NAME_BYTES} bytes.")
        self.session_id: int = int(session_id)
        self.size_mb: int = int(size_mb)
        self.spilling: bool = spilling
        self.hostname: str | None = hostname
        self.port: int | None = None if port is None else int(port)
        self.num_connections: int | None = num_connections
        self.prefetch_size: int | None = prefetch_size
        self.name: str = name
        self.fingerprint: str = fingerprint if fingerprint is not None else name
        _check_int("read_threads", read_threads, 0, 256, allow_none=True)
        self.read_threads: int = (min(4, os.cpu_count() or 1) if read_threads is None
                                  else int(read_threads))
        self._init_runtime()
        self._check_session()

    # ---- state that does not travel through pickle --------------------

    _RUNTIME = ("_lock", "_lock_pid", "_client", "_cache", "_state", "_warned",
                "_warned_row", "_bytes_read")

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()
        self._client = None
        self._cache = None
        self._state = _State.SERVING
        self._warned = False
        self._warned_row = False  # a row the cache cannot take was dropped
        self._bytes_read = 0      # bytes of columns returned by get_columns

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in self._RUNTIME:
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def named(self, name: str, fingerprint: str | None = None) -> DatasetCache:
        """A DatasetCache for another cache name in the same session."""
        other = DatasetCache.__new__(DatasetCache)
        other.__setstate__(self.__getstate__())
        other.name = name
        other.fingerprint = fingerprint if fingerprint is not None else name
        if self._client is not None:
            other._client = self._client
        if self._state is _State.BYPASSED:
            other._state = _State.BYPASSED
        return other

    def _degrade(self, state: _State, err: Error, what: str | None = None) -> None:
        """Moves to `state` (never back) and warns once per object: `what`
        (default: the cause of err), err's message, and what happens now."""
        self._state = max(self._state, state)
        if self._warned:
            return
        self._warned = True
        msg = f"shmcache: {what or _cause(err)} ({err})"
        if self._state is _State.BYPASSED:
            msg += "; the cache is bypassed and rows are read from the source"
        else:
            msg += "; new rows are not cached, cached rows are still served"
        warnings.warn(msg, CacheWarning, stacklevel=3)

    def _connect(self) -> _shmcache.Client:
        if self._client is None:
            self._client = _shmcache.Client(port=self.port or 0,
                                            hostname=self.hostname or "")
        return self._client

    def _check_session(self) -> None:
        try:
            self._connect().check_session(self.session_id)
        except NotFoundError:
            raise NotFoundError(
                f"Session {self.session_id} does not exist on the cache server; "
                "create one with `shmcache -g`.") from None
        except InvalidArgumentError:
            raise
        except Error as e:
            self._degrade(_State.BYPASSED, e)

    def _open(self) -> _shmcache.Cache | None:
        """The native cache, or None when the cache is bypassed."""
        c = self._cache
        if c is not None or self._state is _State.BYPASSED:
            return c
        if self._lock_pid != os.getpid():
            # Forked while another thread held the lock: that thread is not
            # in this process to release it.
            self._lock = threading.Lock()
            self._lock_pid = os.getpid()
        with self._lock:
            if self._cache is not None or self.bypassed:
                return self._cache
            try:
                self._cache = self._connect().open_cache(
                    self.session_id, self.name, self.fingerprint, self.size_mb,
                    self.spilling)
                self._warn_size_over_cap()
            except FingerprintMismatchError as e:
                raise FingerprintMismatchError(
                    f"Cache {self.name!r} of session {self.session_id} holds rows "
                    f"of a different pipeline: {e}") from None
            except NotFoundError as e:
                raise NotFoundError(
                    f"Session {self.session_id} does not exist on the cache "
                    f"server: {e}") from None
            except InvalidArgumentError as e:
                if self.spilling:
                    raise
                self._degrade(_State.BYPASSED, e, "the cache could not be opened")
            except Error as e:
                self._degrade(_State.BYPASSED, e)
            return self._cache

    def _warn_size_over_cap(self) -> None:
        """One CacheWarning at open when `size_mb` is more than the server's
        memory cap can give (the server gives the cache the cap): names the
        bound that set the cap and the fix."""
        if self.size_mb <= 0 or self._client is None:
            return
        try:
            info = self._client.server_info()
        except Error:
            return  # the cache is open; its first put will tell what is wrong
        cap = int(info["memory_cap_bytes"])
        mb = 1 << 20
        if self.size_mb * mb <= cap:
            return
        bound = str(info.get("memory_cap_bound", ""))
        why, fix = _CAP_BOUNDS.get(bound, ("the server's memory cap", "open a smaller cache"))
        where = why.format(shm_dir=info["shm_dir"],
                           cgroup_mb=int(info.get("memory_cgroup_limit_bytes", 0)) // mb)
        self._warned = True
        warnings.warn(
            f"shmcache: cache size {self.size_mb} MB is more than the {cap // mb} MB "
            f"the server can have ({bound}: {where}); the cache holds {cap // mb} MB "
            f"and rows beyond it are read from the source. Fix: {fix}",
            CacheWarning, stacklevel=4)

    @property
    def size(self) -> int:
        """size_mb, by its deprecated name (MindSpore's)."""
        return self.size_mb

    def open(self) -> DatasetCache:
        """Attaches now rather than on first use. Returns self."""
        self._open()
        return self

    def _writable(self) -> _shmcache.Cache | None:
        """The native cache when puts may go to it (the cache itself refuses
        and counts the puts of a full cache)."""
        c = self._open()
        return c if self._state <= _State.FULL else None

    @staticmethod
    def _check_id(row_id: Any) -> int:
        if isinstance(row_id, bool) or not isinstance(row_id, (int, np.integer)):
            raise TypeError(f"a row id is an int, got {type(row_id).__name__}")
        if not 0 <= row_id <= MAX_ROW_ID:
            raise ValueError(f"row id {row_id} outside [0, {MAX_ROW_ID}]")
        return int(row_id)

    # ---- rows ----------------------------------------------------------

    def put_columns(self, row_id: int, columns: Sequence[Column]) -> bool:
        """Stores a row given as columns [(name, dtype name, array)]
        (shmcache.rows.encode's; dtype None: the array's own)."""
        row_id = self._check_id(row_id)
        c = self._writable()
        if c is None:
            return False
        try:
            return c.put(row_id, list(columns))
        except Error as e:
            return self._put_failed(row_id, e, strict=True)

    def _put_failed(self, row_id: int, err: Error, strict: bool) -> bool:
        """What a put that raised `err` returns (False), after the warning
        it deserves. A row the cache refuses by its limits (too many
        columns, a name too long: InvalidArgument) raises ValueError when
        `strict`, else is dropped alone like a row too large."""
        if isinstance(err, (TooLargeError, NotSupportedError)) or \
                (isinstance(err, InvalidArgumentError) and not strict):
            # This row only: the cache stays in use for the others.
            if not self._warned_row:
                self._warned_row = True
                warnings.warn(f"shmcache: row {row_id} cannot be cached ({err}); "
                              "rows like it are read from the source",
                              CacheWarning, stacklevel=4)
        elif isinstance(err, FullError):
            # Later puts still go to the cache, which refuses them without a
            # round trip and counts them (stats()["puts_full"], the metrics).
            self._degrade(_State.FULL, err)
        elif isinstance(err, UnavailableError):
            self._degrade(_State.READ_ONLY, err)
        elif isinstance(err, InvalidArgumentError):
            raise ValueError(f"row {row_id} cannot be cached: {err}") from None
        else:
            self._degrade(_State.BYPASSED, err)
        return False

    def put(self, row_id: int, row: Any) -> bool:
        """Stores `row` under `row_id` (an int in [0, MAX_ROW_ID]).

        Returns True when stored, False when the id was already cached (the
        first writer wins), the cache is bypassed (full, daemon gone), or the
        row cannot be cached: larger than what is left of the cache, or than
        a row spilled to disk may be (one warning; later rows go on).
        TypeError for a value with no column type (a Python int outside
        int64 among them), naming it."""
        return self.put_columns(row_id, encode(row))

    def put_batch(self, row_ids: Iterable[int], rows: Sequence[Any]) -> list[bool]:
        """put() of many rows: a list with, per row, what put would return
        (True = stored now). The rows are copied into shared memory in one
        call with the GIL released, under one lock. Of two rows with one id,
        the first wins. A full cache or a lost server stores the rows before
        it and returns False for the rest (one warning, as put); a row too
        large is refused alone; a malformed row raises ValueError after the
        others were stored."""
        ids = [i if type(i) is int and 0 <= i <= MAX_ROW_ID else self._check_id(i)
               for i in row_ids]
        if len(ids) != len(rows):
            raise ValueError(f"put_batch: {len(ids)} ids but {len(rows)} rows")
        return self._put_encoded(ids, [encode(r) for r in rows], strict=True)

    def _put_encoded(self, ids: list[int], rows: list[list[Column]],
                     strict: bool) -> list[bool]:
        """put_batch of checked ids and encoded rows; `strict` as
        _put_failed's (CachedDataset's writer is not strict: a sample the
        cache cannot hold is still delivered)."""
        c = self._writable()
        if c is None:
            return [False] * len(ids)
        out, errors = c.put_batch(ids, rows)
        bad = None
        for i, err in errors:
            if isinstance(err, InvalidArgumentError) and strict:
                bad = bad or (ids[i], err)
            else:
                self._put_failed(ids[i], err, strict)
        if bad is not None:
            self._put_failed(*bad, strict=True)  # raises ValueError
        return out

    def get_columns(self, row_id: int, columns: ColumnSelection = None,
                    copy: bool = True) -> list[Column] | None:
        """[(name, dtype, array)] of a hit, or None on a miss.

        With copy=False the arrays are zero-copy views (see the module
        docstring for how long they stay valid)."""
        row_id = self._check_id(row_id)
        names = column_names(columns)
        c = self._open()
        if c is None:
            return None
        try:
            cols = c.get(row_id, names, copy)
        except KeyError:
            raise
        except Error as e:
            self._degrade(_State.BYPASSED, e)
            return None
        if cols is not None:
            self._bytes_read += sum(a.nbytes for _, _, a in cols)
        return cols

    def get_batch_columns(self, row_ids: Iterable[int],
                          copy: bool = True) -> list[list[Column] | None]:
        """get_columns of many rows: a list with, per id, [(name, dtype,
        array)] or None on a miss. With copy=True, rows the cache spilled to
        disk are read in one batch per call, by this process from the spill
        database."""
        ids = [self._check_id(i) for i in row_ids]
        c = self._open()
        if c is None:
            return [None] * len(ids)
        try:
            rows = c.get_batch(ids, copy)
        except Error as e:
            self._degrade(_State.BYPASSED, e)
            return [None] * len(ids)
        self._bytes_read += sum(a.nbytes for cols in rows if cols is not None
                               for _, _, a in cols)
        return rows

    def _read(self, row_id: Any, columns: ColumnSelection, copy: bool,
              torch: bool) -> Any:
        """The finished row (numpy arrays, or tensors when torch) or None;
        what get, view and CachedDataset hand out. The per-sample path
        (an int id, all columns, an open cache) is inlined by its callers:
        the native read checks the id's range."""
        c = self._cache
        if type(row_id) is not int:
            row_id = self._check_id(row_id)
        if c is None:
            row_id = self._check_id(row_id)   # bypassed or not yet open
            c = self._open()
            if c is None:
                return None
        try:
            if columns is None:
                return c.read(row_id, copy, torch)
            return c.read_columns(self._check_id(row_id), column_names(columns) or [],
                                  copy, torch, isinstance(columns, (str, int)))
        except Error as e:
            self._degrade(_State.BYPASSED, e)
            return None

    def _read_batch(self, row_ids: Iterable[int], copy: bool, torch: bool) -> list[Any]:
        """_read of many rows: a list with the row or None per id. Memory
        rows are found with one batched lookup; rows the cache spilled to
        disk come from the daemon in one round trip."""
        ids = [self._check_id(i) for i in row_ids]
        c = self._open()
        if c is None:
            return [None] * len(ids)
        try:
            return c.read_batch(ids, copy, torch)
        except Error as e:
            self._degrade(_State.BYPASSED, e)
            return [None] * len(ids)

    @property
    def bytes_read(self) -> int:
        """Bytes of the columns this object's reads returned (get, view,
        get_batch, get_columns, CachedDataset hits)."""
        c = self._cache
        return self._bytes_read + (c.bytes_read if c is not None else 0)

    def get_batch(self, row_ids: Iterable[int], copy: bool = True) -> list[Any]:
        """get() of many rows: a list with the row or None per id."""
        return self._read_batch(row_ids, copy, False)

    def get(self, row_id: int, columns: ColumnSelection = None, copy: bool = True) -> Any:
        """The cached row, or None on a miss.

        `columns` selects some columns (names for dict rows, positions for
        tuple rows); only those bytes are read. With copy=False the arrays
        are zero-copy, read-only views into shared memory (see the module
        docstring for how long they stay valid)."""
        c = self._cache
        if c is None or columns is not None or type(row_id) is not int:
            return self._read(row_id, columns, copy, False)
        try:     # _read's per-sample path, inlined: a frame less per row
            return c.read(row_id, copy, False)
        except Error as e:
            self._degrade(_State.BYPASSED, e)
            return None

    def view(self, row_id: int, columns: ColumnSelection = None) -> Any:
        """get(row_id, columns, copy=False)."""
        c = self._cache
        if c is None or columns is not None or type(row_id) is not int:
            return self._read(row_id, columns, False, False)
        try:     # as get's
            return c.read(row_id, False, False)
        except Error as e:
            self._degrade(_State.BYPASSED, e)
            return None

    def read_into(self, ids: Any, out: Any,
                  columns: ColumnSelection = None) -> npt.NDArray[np.bool_]:
        """Copies cached rows ids[i] into row i of the arrays of `out`;
        returns the hit mask (numpy bool array, len(ids)).

        out: a tuple/list (columns 0..k-1 of tuple rows), a dict (columns
        of dict rows by name) or a single array (rows put as one array), of
        numpy arrays or torch tensors (CPU, C-contiguous, writable), whose
        first dimension is >= len(ids) and whose remaining shape and dtype
        are those of the column as put stored it. `columns` names the
        stored columns of a tuple/list `out` instead (positions or names,
        as get's columns=). Torch tensors follow the dtypes hits have as
        tensors: bfloat16 stays bfloat16, uint16 reads into int32 and
        uint32/uint64 into int64 tensors (widened); a bytes column has no
        torch dtype (TypeError naming it).

        A row is a hit when it is cached (in memory, or spilled: those are
        read from the spill database by this process, one RocksDB MultiGet
        per call) and every column has exactly the
        target's dtype and shape; otherwise its rows in `out` are left
        untouched. Rows are copied by `read_threads` threads with the GIL
        released. A bypassed cache (daemon gone, error) returns all False
        after one CacheWarning; it never raises for a missing server."""
        ids = _ids_array(ids)
        names, bufs = _targets(out, columns)
        n = len(ids)
        specs = [_target_spec(name, b, n) for name, b in zip(names, bufs)]
        hit = np.zeros(n, dtype=np.bool_)
        c = self._open()
        if c is None or n == 0:
            return hit
        plan: list[tuple[Any, Any]] = []

        def targets(stored: list[str | None] | None) -> list[Any]:
            # The stored dtypes of the first cached row (None: no row is
            # cached) decide which targets read a wider dtype via scratch.
            plan[:] = [_plan_target(spec, None if stored is None else st, n)
                       for spec, st in zip(specs, stored or [None] * len(specs))]
            return [p[0] for p in plan]
        try:
            c.read_into(ids, names, targets, self.read_threads, hit.view(np.uint8))
        except Error as e:
            self._degrade(_State.BYPASSED, e)
            hit[:] = False
            return hit
        for _, widen in plan:
            if widen is not None:
                widen(hit)
        return hit

    def contains(self, row_id: int) -> bool:
        c = self._open()
        return bool(c is not None and c.contains(self._check_id(row_id)))

    __contains__ = contains

    def stats(self) -> CacheStats | None:
        """Counters of this cache, summed over all its processes (a
        CacheStats: s.hits, or s["hits"] as from the dict this returned
        before); None when the cache is bypassed."""
        c = self._open()
        if c is None:
            return None
        try:
            return CacheStats.from_dict(c.stats())
        except Error as e:
            self._degrade(self._state, e)
            return None

    @property
    def bypassed(self) -> bool:
        """True once the cache stopped serving (daemon gone at open, error)."""
        return self._state is _State.BYPASSED

    @property
    def accepting(self) -> bool:
        """False once puts are dropped (full, daemon gone)."""
        return self._state is _State.SERVING

    def close(self) -> None:
        """Returns unused space to the daemon; zero-copy arrays stay valid
        (module docstring)."""
        if self._cache is not None:
            try:
                self._cache.close()
            except Error:
                pass

    def __enter__(self) -> DatasetCache:
        return self

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ---- streaming caches (shmcache.datasets.CachedIterableDataset) -------

    def _claim_build(self) -> bool:
        """True for the one caller, over all processes, that builds this
        streaming cache; False for the others and when the cache is
        bypassed (after the warning a put would give)."""
        c = self._writable()
        if c is None:
            return False
        try:
            return c.claim_build()
        except Error as e:
            return self._put_failed(MAX_ROW_ID, e, strict=True)

    def _seal(self, num_rows: int) -> None:
        """Seals the cache as holding rows 0..num_rows-1 (first seal wins)."""
        c = self._writable()
        if c is None:
            return
        try:
            c.seal(num_rows)
        except Error as e:
            self._put_failed(MAX_ROW_ID, e, strict=True)

    def _sealed_rows(self) -> int | None:
        """The sealed row count, or None while unsealed or bypassed."""
        c = self._open()
        if c is None:
            return None
        try:
            return c.sealed_rows()
        except Error as e:
            self._degrade(_State.BYPASSED, e)
            return None

    def __repr__(self) -> str:
        return (f"DatasetCache(session_id={self.session_id}, size_mb={self.size_mb}, "
                f"spilling={self.spilling}, name={self.name!r})")
