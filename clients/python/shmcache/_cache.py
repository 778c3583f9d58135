"""DatasetCache: a cache inside a session of a running shmcache server, the
class every other part of the package builds on (the user's API is in
the shmcache package's docstring and the class's).

Its methods under "package-internal" at the end of the class are the
contract the rest of the package uses (shmcache.torch reads finished
samples with read_row / read_rows and stores encoded rows with
put_encoded); the degradation rules (never break training) live here and in
_degrade.py, the argument checks in _checks.py, which stored column each of
read_into's targets receives in _read_into.py.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _shmcache
from ._checks import (MAX_INT32, MAX_SIZE_MB, MAX_UINT32, check_id, check_int, check_iterable,
                      check_names, ids_array, port_arg, session_from_env)
from ._degrade import (CacheFigures, CacheWarning, ServerInfo, State, cap_bound,
                       describe)
from ._read_into import batch_targets
from ._shmcache import (Error, FingerprintMismatchError, FullError,
                        InvalidArgumentError, NotFoundError, NotSupportedError,
                        TooLargeError, UnavailableError)
from ._user_line import Origin, quietly, said_quietly, user_line, warn
from ._warned_flag import WarnedFlag
from .async_put import EXIT_FLUSH_S, flush_into
from .rows import (LOCAL_HOSTS, MAX_PORT, MAX_ROW_ID, MIN_PORT,
                   Column, ColumnSelection, column_names, encode)
from .stats import CacheStats

__all__ = ["DatasetCache"]


# close() waits this long for the rows queued for the cache, as an exit does.
CLOSE_FLUSH_S = EXIT_FLUSH_S

# WarnedFlag's slot for the note that size_mb is more than the server's cap,
# the one set by close(), which workers already running (persistent
# DataLoader workers) read, the note on spilled rows dropped, and the
# warning on a row the cache cannot take (each DataLoader worker process
# of each epoch said it: 2 workers and 3 epochs gave 6 lines).
_CAP_NOTE = 1
_CLOSED = 2
_DROPPED = 3
_ROW = 4


class DatasetCache:
    """A cache inside a session of a running shmcache server.

    Mirrors MindSpore's DatasetCache(session_id, size=0, spilling=False,
    hostname=None, port=None, num_connections=None, prefetch_size=None),
    with the size's unit in its name: `size_mb`, the cache's memory budget
    in MB (0: as much as the server allows; one CacheWarning at open when
    it is more than the server's memory cap). Opening a cache that exists
    (same session and name) with a larger size_mb raises its budget, and
    with spilling=True turns its spilling on: a full one takes rows again;
    a smaller size_mb or 0 keeps the budget it has (nothing is evicted).
    MindSpore's keyword `size=`
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
    native: _shmcache.Cache | None   # the open native cache (package-internal)
    _state: State
    _warned: bool
    _told: WarnedFlag
    _warned_row: bool
    cause: str | None   # package-internal: see _init_runtime
    _bytes_read: int
    _dropped: int
    _closed: bool

    def __init__(self, session_id: int | None = None, size_mb: int = 0,
                 spilling: bool = False, hostname: str | None = None,
                 port: int | None = None, num_connections: int | None = None,
                 prefetch_size: int | None = None, name: str = "default",
                 fingerprint: str | None = None,
                 read_threads: int | None = None, *,
                 size: int | None = None) -> None:
        if session_id is None:
            session_id = session_from_env()
        check_int("session_id", session_id, 0, MAX_UINT32)
        if size is not None:
            if size_mb != 0:
                raise TypeError("pass size_mb= (the cache size in MB) alone; size= "
                                "is its deprecated name")
            check_int("size", size, 0, 2**63 - 1)
            warnings.warn("DatasetCache(size=...) is deprecated: the size is in MB, "
                          "pass it as size_mb=", DeprecationWarning, stacklevel=2)
            size_mb = size
        check_int("size_mb", size_mb, 0, MAX_SIZE_MB)
        if not isinstance(spilling, bool):
            raise TypeError(f"Argument spilling with value {spilling!r} is not "
                            f"of type bool, but got {type(spilling).__name__}.")
        if hostname is not None and not isinstance(hostname, str):
            raise TypeError(f"Argument hostname with value {hostname!r} is not "
                            f"of type str, but got {type(hostname).__name__}.")
        if hostname is not None and hostname not in LOCAL_HOSTS:
            raise RuntimeError(f"Only the local host is supported, got hostname "
                               f"{hostname!r}; use one of {', '.join(LOCAL_HOSTS)}.")
        check_int("port", port, MIN_PORT, MAX_PORT, allow_none=True)
        check_int("num_connections", num_connections, 1, MAX_INT32, allow_none=True)
        check_int("prefetch_size", prefetch_size, 1, MAX_INT32, allow_none=True)
        check_names(name, fingerprint)
        self.session_id: int = int(session_id)
        self.size_mb: int = int(size_mb)
        self.spilling: bool = spilling
        self.hostname: str | None = hostname
        self.port: int | None = None if port is None else int(port)
        self.num_connections: int | None = num_connections
        self.prefetch_size: int | None = prefetch_size
        self.name: str = name
        self.fingerprint: str = fingerprint if fingerprint is not None else name
        if name != "default":
            self.given_name = name
        # The line its warnings name where no frame of the user's is on the
        # stack (shmcache._user_line).
        self.origin = user_line()
        check_int("read_threads", read_threads, 0, 256, allow_none=True)
        self.read_threads: int = (min(4, os.cpu_count() or 1) if read_threads is None
                                  else int(read_threads))
        self._init_runtime()
        self._check_session()

    # ---- state that does not travel through pickle --------------------

    # Not pickled. `_told` and `_closed` are: a spawned DataLoader worker
    # shares the flag with its trainer (WarnedFlag), and never opens a cache
    # its trainer closed, as a forked one does.
    _RUNTIME = ("_lock", "_lock_pid", "_client", "native", "_state", "_warned",
                "_warned_row", "_bytes_read", "_dropped", "cause")

    # Set by bypass(): travels with the object (pickled to DataLoader
    # workers), so that no process of it uses the cache.
    bypass_reason: str | None = None
    # Where it was made (set by __init__ and named(); travels with it).
    origin: Origin | None = None
    # The name the user gave the constructor (not the default): the name
    # CachedDataset gives the cache it makes of this one, as its name=.
    # None on a copy named() made: that name is the package's choice.
    given_name: str | None = None

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()
        self._client = None
        self.native = None
        # A bypassed cache was warned about once, where bypass() was called.
        self._state = State.SERVING if self.bypass_reason is None else State.BYPASSED
        self._warned = self.bypass_reason is not None
        # Set once this object, or its copy in a process started from here
        # (a DataLoader worker), warned: the others then need not. Kept
        # when the object was unpickled with its trainer's (spawn).
        if not isinstance(getattr(self, "_told", None), WarnedFlag):
            self._told = WarnedFlag()
        self._warned_row = False  # a row the cache cannot take was dropped
        # What stopped the cache: the cause its one warning names, shown or
        # not (inside quietly(), or said by another process). Its callers
        # read it instead of catching the warning (prefill).
        self.cause = self.bypass_reason
        self._bytes_read = 0      # bytes of columns returned by get_columns
        self._dropped = 0         # native.rows_dropped when note_dropped last looked
        # close() closed `native` (here, or where this was unpickled from).
        self._closed = bool(getattr(self, "_closed", False))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in self._RUNTIME:
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # One attribute at a time, not __dict__.update: reading __dict__
        # makes CPython 3.11 keep the attributes in a dict, and then no load
        # of them is specialized (CachedDataset's per-sample path reads
        # `native` of a cache made here, by named()).
        for k, v in state.items():
            object.__setattr__(self, k, v)
        self._init_runtime()

    def named(self, name: str, fingerprint: str | None = None) -> DatasetCache:
        """A DatasetCache for another cache name in the same session (name
        and fingerprint checked as the constructor checks them)."""
        check_names(name, fingerprint)
        other = DatasetCache.__new__(DatasetCache)
        state = self.__getstate__()
        state.pop("_told", None)   # another cache: warned about on its own,
        state.pop("_closed", None)  # and not closed
        state.pop("given_name", None)
        other.__setstate__(state)
        other.name = name
        other.fingerprint = fingerprint if fingerprint is not None else name
        other.origin = user_line()
        if self._client is not None:
            other._client = self._client
        if self._state is State.BYPASSED:
            other._state = State.BYPASSED
            other.cause = self.cause
        return other

    def bypass(self, why: str) -> None:
        """Package-internal: this cache is never opened, here or in any
        process this object is pickled to (DataLoader workers); every read
        is a miss, every put dropped. Warns once, here: `why` (what is
        wrong and what to do)."""
        self.bypass_reason = why
        self._state = State.BYPASSED
        self._warn_once(why)

    def turned_off(self) -> DatasetCache:
        """Package-internal: a copy of this cache (session, name, settings)
        that the user turned off (CachedDataset's `ds.cache = None`):
        bypassed as bypass() makes it, here and wherever it is pickled to,
        but without a warning: nothing failed."""
        off = self.named(self.name, self.fingerprint)
        off.bypass_reason = "caching was turned off"
        off._state = State.BYPASSED
        off._warned = True
        return off

    def _degrade(self, state: State, err: Error, what: str | None = None) -> None:
        """Moves to `state` (never back) and warns once per object: `what`
        (default: describe(err)), err's message, and what happens now."""
        if self._closed:   # the error is the close's, whatever the call
            self._used_after_close()
            return
        self._state = max(self._state, state)
        if state is State.FULL and self._told.said(_CAP_NOTE):
            return   # the note on the size over the cap said it would fill
        if not self._warning_said():   # (a full cap's figures cost a round trip)
            self._warn_once(f"{what} ({err})" if what
                            else describe(err, self.size_mb, self._server_info,
                                          self._figures))

    def _warn_once(self, what: str, fix: str | None = None) -> None:
        """The object's one CacheWarning: `what` stopped the cache, what
        happens now (by the state it is in), and `fix`; nothing after the
        first, here or in a process forked from here."""
        if self.cause is None:
            self.cause = what
        if not self._claim_warning():
            return
        if self._state is State.BYPASSED:
            now = "the cache is bypassed and rows are read from the source"
        else:
            now = "new rows are not cached, cached rows are still served"
        warn(f"shmcache: {what}; {now}" + (f". Fix: {fix}" if fix else ""), CacheWarning,
             self.origin)

    def _warning_said(self) -> bool:
        """Whether the one warning was said, by this object or its copy in
        a process forked from here (its trainer, or a sibling worker)."""
        return self._warned or bool(self._told)

    def _claim_warning(self) -> bool:
        """True the first time only, for this object and its copies in
        the processes started from here: the one warning is to be shown.
        Inside quietly() nothing is shown, and nothing claimed."""
        if self._warned:
            return False
        self._warned = True
        return not said_quietly() and self._told.claim()

    def _used_after_close(self) -> None:
        """A call of this object after close(), here or by the process this
        object was handed to a worker from (a persistent worker sees its
        trainer's close: the flag's _CLOSED): bypassed from now on (no call
        reaches the native cache again; closed here too, so that its unused
        space goes back), with the warning that says so. Zero-copy arrays
        keep the native cache they view."""
        c = self.native
        if c is not None:
            self._bytes_read += c.bytes_read
            self.native = None
            if not self._closed:
                try:
                    c.close()
                except Error:
                    pass
        self._closed = True
        self._state = State.BYPASSED
        self._warn_once(f"cache {self.name!r} of session {self.session_id} was closed "
                        "(close(), or the end of its `with` block) and then used",
                        "open a new DatasetCache to use the cache again (its rows "
                        "stay cached), or close this one only once done with it")

    def _connect(self) -> _shmcache.Client:
        if self._client is None:
            self._client = _shmcache.Client(port=self.port or 0,
                                            hostname=self.hostname or "")
        return self._client

    def _no_session(self) -> NotFoundError:
        """The error for a session the server does not hold, naming the
        server (a host may run one per port) and the commands for it."""
        try:
            port = int(self._connect().server_info()["port"])
        except (Error, KeyError, TypeError, ValueError):
            return NotFoundError(
                f"Session {self.session_id} does not exist on the cache server; "
                "list those it holds with `shmcache --list_sessions`, or create "
                "one with `shmcache -g`.")
        return NotFoundError(
            f"Session {self.session_id} does not exist on the cache server on port "
            f"{port}; list those it holds with `shmcache --list_sessions -p {port}`, "
            f"or create one with `shmcache -g -p {port}`.")

    def _check_session(self) -> None:
        if self.session_id == 0:
            # Sessions are non-zero: 0 is what a launcher that could not make
            # one exports (the Slurm prolog), and a job must train on from
            # its source, even when some server of this user answers here.
            self.bypass("session 0 is no session (sessions are non-zero; a launcher "
                        "that could not create one, such as the Slurm prolog, "
                        f"exports 0): create one with `shmcache -g{port_arg(self.port)}`")
            return
        try:
            self._connect().check_session(self.session_id)
        except NotFoundError:
            raise self._no_session() from None
        except InvalidArgumentError:
            raise
        except Error as e:
            # (An unreachable server's message is the library's: it names a
            # server of this user running elsewhere on the port, or stopped.)
            self._degrade(State.BYPASSED, e)

    def _open(self) -> _shmcache.Cache | None:
        """The native cache, or None when the cache is bypassed."""
        c = self.native
        if self._closed or self._told.said(_CLOSED):
            if self._state is not State.BYPASSED:
                self._used_after_close()
            return None
        if c is not None or self._state is State.BYPASSED:
            return c
        if self._lock_pid != os.getpid():
            # Forked while another thread held the lock: that thread is not
            # in this process to release it.
            self._lock = threading.Lock()
            self._lock_pid = os.getpid()
        with self._lock:
            if self.native is not None or self.bypassed:
                return self.native
            try:
                self.native = self._connect().open_cache(
                    self.session_id, self.name, self.fingerprint, self.size_mb,
                    self.spilling)
                self._warn_size_over_cap()
            except FingerprintMismatchError as e:
                # The server's sentence names the cache, both fingerprints
                # and the fix; said once, without the status code's words.
                said = str(e).removeprefix("Fingerprint mismatch: ")
                raise FingerprintMismatchError(said[:1].upper() + said[1:]) from None
            except NotFoundError:
                raise self._no_session() from None
            except InvalidArgumentError as e:
                if self.spilling:
                    raise
                self._degrade(State.BYPASSED, e, "the cache could not be opened")
            except Error as e:
                self._degrade(State.BYPASSED, e)
            return self.native

    def _warn_size_over_cap(self) -> None:
        """One CacheWarning at open when `size_mb` is more than the server's
        memory cap can give (the server gives the cache the cap): names the
        bound that set the cap and the fix."""
        if self.size_mb <= 0 or self._client is None:
            return
        info = self._server_info()
        if info is None:
            return  # the cache is open; its first put will tell what is wrong
        cap = int(info["memory_cap_bytes"])
        mb = 1 << 20
        if self.size_mb * mb <= cap:
            return
        bound, where, fix = cap_bound(info)
        # A note of its own: the one warning of a degrade (the server gone,
        # failing) is still said after it.
        if said_quietly() or not self._told.claim(_CAP_NOTE):
            return
        warn(
            f"shmcache: cache size {self.size_mb} MB is more than the {cap // mb} MB "
            f"the server can have ({bound}: {where}); the cache holds {cap // mb} MB "
            f"and rows beyond it are read from the source. Fix: {fix}, or open a "
            f"smaller cache",
            CacheWarning, self.origin)

    def _server_info(self) -> ServerInfo | None:
        """The server's info (its memory cap and what holds it), or None when
        it cannot be had."""
        try:
            return self._connect().server_info()
        except Error:
            return None

    def _figures(self) -> CacheFigures | None:
        """The cache's stats (the rows it holds, its budget) for the words of
        its one warning, or None when they cannot be had."""
        c = self.native
        try:
            return None if c is None else c.stats()
        except Error:
            return None

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
        return c if self._state <= State.FULL else None

    # ---- rows ----------------------------------------------------------

    def put_columns(self, row_id: int, columns: Sequence[Column]) -> bool:
        """Stores a row given as columns [(name, dtype name, array)]
        (shmcache.rows.encode's; dtype None: the array's own)."""
        row_id = check_id(row_id)
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
        if self._closed:   # the cache refused the row for the close
            self._used_after_close()
            return False
        if isinstance(err, (TooLargeError, NotSupportedError)) or \
                (isinstance(err, InvalidArgumentError) and not strict):
            # This row only: the cache stays in use for the others. Said once
            # for the trainer and its workers (the flag's _ROW); inside
            # quietly() nothing is shown and nothing claimed for the others.
            if not self._warned_row:
                self._warned_row = True
                if said_quietly() or not self._told.claim(_ROW):
                    return False
                warn(f"shmcache: row {row_id} cannot be cached ({err}); "
                     "rows like it are read from the source", CacheWarning, self.origin)
        elif isinstance(err, FullError):
            # Later puts still go to the cache, which refuses them without a
            # round trip and counts them (stats()["puts_full"], the metrics).
            self._degrade(State.FULL, err)
        elif isinstance(err, UnavailableError):
            self._degrade(State.READ_ONLY, err)
        elif isinstance(err, InvalidArgumentError):
            raise ValueError(f"row {row_id} cannot be cached: {err}") from None
        else:
            self._degrade(State.BYPASSED, err)
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
        large is refused alone; a row the cache refuses by its limits (too
        many columns, a name too long) raises ValueError after the others
        were stored. A value with no column type raises TypeError, as put
        does, before any row of the batch is stored."""
        check_iterable("row_ids", row_ids)
        check_iterable("rows", rows, sized=True)
        ids = [i if type(i) is int and 0 <= i <= MAX_ROW_ID else check_id(i)
               for i in row_ids]
        if len(ids) != len(rows):
            raise ValueError(f"put_batch: {len(ids)} ids but {len(rows)} rows")
        return self.put_encoded(ids, _shmcache.encode_all(rows), strict=True)

    def get_columns(self, row_id: int, columns: ColumnSelection = None,
                    copy: bool = True) -> list[Column] | None:
        """[(name, dtype, array)] of a hit, or None on a miss.

        With copy=False the arrays are zero-copy views (see the module
        docstring for how long they stay valid)."""
        row_id = check_id(row_id)
        names = column_names(columns)
        c = self._open()
        if c is None:
            return None
        try:
            cols = c.get(row_id, names, bool(copy))
        except KeyError:
            raise
        except Error as e:
            self._degrade(State.BYPASSED, e)
            return None
        if cols is None:
            self.note_dropped()
        else:
            self._bytes_read += sum(a.nbytes for _, _, a in cols)
        return cols

    def get_batch_columns(self, row_ids: Iterable[int], copy: bool = True,
                          count: bool = True) -> list[list[Column] | None]:
        """get_columns of many rows: a list with, per id, [(name, dtype,
        array)] or None on a miss. With copy=True, rows the cache spilled to
        disk are read in one batch per call, by this process from the spill
        database. count=False (package-internal, with copy=True): the reads
        count neither as hits nor as misses (the caller counted them
        already: Cache::GetBatchUncounted)."""
        check_iterable("row_ids", row_ids)
        ids = [check_id(i) for i in row_ids]
        c = self._open()
        if c is None:
            return [None] * len(ids)
        try:
            rows = c.get_batch(ids, bool(copy), True, count)
        except Error as e:
            self._degrade(State.BYPASSED, e)
            return [None] * len(ids)
        self.note_dropped()
        self._bytes_read += sum(a.nbytes for cols in rows if cols is not None
                               for _, _, a in cols)
        return rows

    @property
    def bytes_read(self) -> int:
        """Bytes of the columns this object's reads returned (get, view,
        get_batch, get_columns, CachedDataset hits)."""
        c = self.native
        return self._bytes_read + (c.bytes_read if c is not None else 0)

    def get_batch(self, row_ids: Iterable[int], copy: bool = True) -> list[Any]:
        """get() of many rows: a list with the row or None per id."""
        check_iterable("row_ids", row_ids)
        return self.read_rows(row_ids, bool(copy), False)

    def get(self, row_id: int, columns: ColumnSelection = None, copy: bool = True) -> Any:
        """The cached row, or None on a miss.

        `columns` selects some columns (names for dict rows, positions for
        tuple rows); only those bytes are read. With copy=False the arrays
        are zero-copy, read-only views into shared memory (see the module
        docstring for how long they stay valid)."""
        c = self.native
        if c is None or columns is not None or type(row_id) is not int:
            return self.read_row(row_id, columns, copy, False)
        try:     # _read's per-sample path, inlined: a frame less per row
            row = c.read(row_id, copy, False)
        except Error as e:
            self._degrade(State.BYPASSED, e)
            return None
        if row is None:
            self.note_dropped()
        return row

    def view(self, row_id: int, columns: ColumnSelection = None) -> Any:
        """get(row_id, columns, copy=False)."""
        c = self.native
        if c is None or columns is not None or type(row_id) is not int:
            return self.read_row(row_id, columns, False, False)
        try:     # as get's
            row = c.read(row_id, False, False)
        except Error as e:
            self._degrade(State.BYPASSED, e)
            return None
        if row is None:
            self.note_dropped()
        return row

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
        per call) and every column has exactly the target's shape and its
        dtype (or one it takes: the same bytes into numpy, bfloat16 as
        uint16 and bytes as uint8; widened into a tensor, as above; the rule
        is BatchReader's, batch_reader.h); otherwise its rows in `out` are
        left untouched. Each row is decided on its own, and counted once
        (a hit or a miss). One native call per batch: rows are copied by
        `read_threads` threads with the GIL released. A bypassed cache (daemon gone, error) returns all False
        after one CacheWarning; it never raises for a missing server."""
        return self.fill_batch(ids, out, columns, self.read_threads, codes=False)

    def contains(self, row_id: int) -> bool:
        row_id = check_id(row_id)
        c = self._open()
        return bool(c is not None and c.contains(row_id))

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
        return self._state is State.BYPASSED

    @property
    def accepting(self) -> bool:
        """False once puts are dropped (full, daemon gone)."""
        return self._state is State.SERVING

    @property
    def unanswered(self) -> bool:
        """True once a call found the server not answering (stopped, or
        gone): puts are dropped, hits still served. Package-internal
        (CachedDataset's waited puts)."""
        return self._state is State.READ_ONLY

    def close(self) -> None:
        """Returns unused space to the daemon; zero-copy arrays stay valid
        (module docstring). Rows that CachedDatasets of this process queued
        for this cache (their background puts) are stored first, waiting
        for them CLOSE_FLUSH_S at most; those still waiting then are not
        stored (read from the source when next needed), with one
        CacheWarning that says how many and that ds.flush() before close()
        stores them all. A later call of this object is a bypassed
        cache's (a miss, a put not stored) after one CacheWarning that says
        so: open a new DatasetCache to use the cache again. Its copies in
        DataLoader workers already running (persistent ones) are closed at
        their next batched read or put."""
        unstored = (0, 0) if self._closed else flush_into(self, CLOSE_FLUSH_S)
        # Closed even where no call opened it yet: nothing opens it later,
        # here or in a worker already running (_open reads the flag).
        self._closed = True
        self._told.set(_CLOSED)
        if self.native is not None:
            try:
                self.native.close()
            except Error:
                pass
        if any(unstored):
            self._warn_unstored(*unstored)

    def _warn_unstored(self, dropped: int, writing: int) -> None:
        """close()'s one CacheWarning for the rows it could not wait for.
        Said as the object's one warning: the put of a batch being written
        when the cache closed fails, and says nothing more."""
        if not self._claim_warning():
            return
        rows = f"{dropped} rows" + (f" (and {writing} being written)" if writing else "")
        warn(f"shmcache: cache {self.name!r} of session {self.session_id} was closed "
             f"while {rows} that a CachedDataset computed were waiting for its "
             f"background puts: close() waited {CLOSE_FLUSH_S:g} s for them, and "
             f"they are not cached (read from the source when next needed). Fix: "
             f"call ds.flush() (CachedLoader: loader.flush()) before closing the cache",
             CacheWarning, self.origin)

    def __enter__(self) -> DatasetCache:
        return self

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ---- package-internal ----------------------------------------------
    # What shmcache.torch (and prefill) build on: named without an
    # underscore because other modules of the package call them, but not
    # part of the user's API (no compatibility promise). `native` (above)
    # belongs here too.

    def put_encoded(self, ids: list[int], rows: list[list[Column]],
                    strict: bool, quiet: bool = False) -> list[bool]:
        """put_batch of checked ids and encoded rows; `strict` as
        _put_failed's (CachedDataset's writer is not strict: a sample the
        cache cannot hold is still delivered). quiet: the CacheWarnings of
        an open or a failure are not shown (a loader's worker, whose
        trainer warns once for the row)."""
        # A put of a worker still running after its trainer's close() (a
        # persistent one) reaches _open, which sees the close.
        c = self.native if self._state <= State.FULL and not self._told.said(_CLOSED) \
            else None
        if c is None:
            if quiet:
                with quietly(CacheWarning):
                    c = self._writable()
            else:
                c = self._writable()
            if c is None:
                return [False] * len(ids)
        out, errors = c.put_batch(ids, rows)
        if errors and quiet:
            with quietly(CacheWarning):
                self._put_errors(ids, errors, strict)
        elif errors:
            self._put_errors(ids, errors, strict)
        return out

    def _put_errors(self, ids: list[int], errors: list[tuple[int, Error]],
                    strict: bool) -> None:
        bad = None
        for i, err in errors:
            if isinstance(err, InvalidArgumentError) and strict:
                bad = bad or (ids[i], err)
            else:
                self._put_failed(ids[i], err, strict)
        if bad is not None:
            self._put_failed(*bad, strict=True)  # raises ValueError

    def fill_batch(self, ids: Any, out: Any, columns: ColumnSelection, threads: int,
                   codes: bool, count: bool = True) -> npt.NDArray[Any]:
        """read_into with `threads` copying; with codes, per row what became
        of it (uint8: 1 read, 0 not cached, 2 cached in another layout:
        batch_reader.h's kRowRead / kRowMissing / kRowOtherLayout) instead
        of the hit mask. One native call: the ids and targets are checked
        there (a list of ints or an integer array is handed over as it is).
        count=False: the reads count neither as hits nor misses (a loader
        reading back the rows its workers stored after its read missed)."""
        if type(ids) is not list and not (type(ids) is np.ndarray
                                          and ids.dtype.kind in "iu"):
            ids = ids_array(ids)
        names, bufs = batch_targets(out, columns)
        c = self._open()
        if c is None:
            return np.zeros(len(ids), dtype=np.uint8 if codes else np.bool_)
        try:
            got = c.read_into(ids, names, bufs, threads, codes, count)
        except Error as e:
            self._degrade(State.BYPASSED, e)
            return np.zeros(len(ids), dtype=np.uint8 if codes else np.bool_)
        self.note_dropped()
        return got

    def read_row(self, row_id: Any, columns: ColumnSelection, copy: bool,
                 torch: bool) -> Any:
        """The finished row (numpy arrays, or tensors when torch) or None;
        what get, view and CachedDataset hand out. The per-sample path
        (an int id, all columns, an open cache) is inlined by its callers:
        the native read checks the id's range."""
        c = self.native
        if type(row_id) is not int:
            row_id = check_id(row_id)
        if c is None:
            row_id = check_id(row_id)   # bypassed or not yet open
            c = self._open()
            if c is None:
                return None
        try:
            if columns is None:
                row = c.read(row_id, copy, torch)
            else:
                row = c.read_columns(check_id(row_id), column_names(columns) or [],
                                     bool(copy), torch, isinstance(columns, (str, int)))
        except Error as e:
            self._degrade(State.BYPASSED, e)
            return None
        if row is None:
            self.note_dropped()
        return row

    def read_rows(self, row_ids: Iterable[int], copy: bool, torch: bool) -> list[Any]:
        """read_row of many rows: a list with the row or None per id. Memory
        rows are found with one batched lookup; rows the cache spilled to
        disk are read from the spill database by this process, in one
        batch."""
        ids = [check_id(i) for i in row_ids]
        c = self._open()
        if c is None:
            return [None] * len(ids)
        try:
            rows = c.read_batch(ids, copy, torch)
        except Error as e:
            self._degrade(State.BYPASSED, e)
            return [None] * len(ids)
        self.note_dropped()
        return rows

    def note_dropped(self) -> None:
        """Package-internal, after a read that missed: when reads of this
        process met spilled rows that failed their check on the server's
        disk (which the server then dropped from the cache: each read as a
        miss, so the caller reads the row from its source and puts it
        again), one CacheWarning for the cache, over the trainer and its
        workers, saying how many so far. The cache goes on serving."""
        c = self.native
        if c is None:
            return
        n = c.rows_dropped
        if n == self._dropped:
            return
        self._dropped = n
        if said_quietly() or not self._told.claim(_DROPPED):
            return
        rows = "1 spilled row" if n == 1 else f"{n} spilled rows"
        warn(f"shmcache: {rows} of cache {self.name!r} (session {self.session_id}) "
             f"failed {'its' if n == 1 else 'their'} check when read back from the "
             f"cache server's spill database (bytes damaged on its disk); the server "
             f"dropped {'it' if n == 1 else 'them'} from the cache, so "
             f"{'it was' if n == 1 else 'each was'} read from the source and is cached "
             f"again when put, and every other row is still served from the cache. "
             f"Fix: check the disk of the server's spill directory (`shmcache "
             f"--server_info` shows it; the server's log names each row)",
             CacheWarning, self.origin)

    # Streaming caches (shmcache.torch.CachedIterableDataset).

    def claim_build(self) -> bool:
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

    def seal(self, num_rows: int) -> None:
        """Seals the cache as holding rows 0..num_rows-1 (first seal wins)."""
        c = self._writable()
        if c is None:
            return
        try:
            c.seal(num_rows)
        except Error as e:
            self._put_failed(MAX_ROW_ID, e, strict=True)

    def sealed_rows(self) -> int | None:
        """The sealed row count, or None while unsealed or bypassed (its
        session destroyed: after one CacheWarning, as every call)."""
        c = self._open()
        if c is None:
            return None
        try:
            return c.sealed_rows()
        except Error as e:
            self._degrade(State.BYPASSED, e)
            return None

    def __repr__(self) -> str:
        return (f"DatasetCache(session_id={self.session_id}, size_mb={self.size_mb}, "
                f"spilling={self.spilling}, name={self.name!r})")
