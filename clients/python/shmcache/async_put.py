"""Background puts for CachedDataset: a miss returns its sample at once and
one writer thread of the process stores the row later.

Contract:
- enqueue() never blocks on the cache: when the queue holds `limit_bytes`
  (rows waiting or being written), the row is dropped (counted; one
  CacheWarning per cause when drops start). A dropped row is a miss again
  next time and is recomputed then. An empty queue always takes one row,
  however large. The warning names the cause: a put in flight for
  _STALLED_S or more (a server stopped or not answering, which a DataLoader
  worker may not live long enough to see time out) rather than a cache
  slower than the dataset. Each cause is said once per `told` flag
  (CachedDataset: one for the dataset, shared with the DataLoader workers
  started from it, forked or spawned, over all their epochs; a new worker
  process per epoch each said it, 1,440 lines for 16 workers and 90
  epochs), or once per process for a putter without one.
- The writer thread stores the queue in batches (one call of its store
  function per batch; the native put releases the GIL while it copies).
  It is woken for every row, or, where batch_wakes() says so when the
  process's thread starts (CachedDataset: in a DataLoader worker), only
  when a batch is ready (_BATCH_ROWS rows or _WAKE_BYTES bytes queued),
  by flush() and close(), and otherwise looks every _HOLD_S: a row then
  waits at most about _HOLD_S before its put starts. Each wake-up of the
  writer takes the GIL from the decoding thread (thread switches, and
  IPIs on a VM): woken per row, that cost a DataLoader worker more CPU
  than the put itself. A worker's queued rows are written at its exit
  (below); the trainer's process keeps the wake per enqueue, so that its
  rows are stored as soon as the cache takes them. enqueue_many() queues
  several rows (CachedDataset: a batch's misses) under one lock with at
  most one wake-up.
- At exit (atexit, and multiprocessing's exit hooks, which also run in
  DataLoader workers before their os._exit), queued rows are written for
  at most EXIT_FLUSH_S seconds, then the rest is dropped and the process
  exits. A process killed (SIGKILL) loses its queue; the cache's publish
  protocol never shows a half-written row.
- The thread ends after _IDLE_EXIT_S seconds without rows, or, once
  retire() was called (CachedDataset: the dataset was freed), as soon as
  the queue is written.
- redirect() (CachedDataset: its cache was replaced, or turned off) moves
  the queue: from then on every row not yet being written, queued before
  or after, goes to the new store, and warnings name the new origin; the
  batch being written at that moment ends in the old store, and
  wait_redirected() waits for it, so that nothing of the putter touches
  the old store afterwards (its owner may close it). One queue, one
  thread and one set of counters for the dataset's life.
- flush_into(target) (DatasetCache.close()) waits, for at most the time
  it is given, for the rows every putter of the process holds for
  `target`, the object its store puts into, then drops those still queued:
  a closed cache takes no row, and a row written into it later would only
  fail.
- Fork: a child starts with an empty queue, fresh locks and no thread; its
  thread starts at its first enqueue.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ._degrade import CacheWarning
from ._user_line import Origin, said_quietly, warn
from ._warned_flag import WarnedFlag

__all__ = ["AsyncPutter", "EXIT_FLUSH_S", "DEFAULT_QUEUE_BYTES", "flush_into", "put_rows"]

DEFAULT_QUEUE_BYTES = 64 << 20
# Below DataLoader's 5 s wait for a worker to exit before it terminates it.
EXIT_FLUSH_S = 2.0
_BATCH_ROWS = 64
# A batch of large rows is ready at this many bytes (150 KB rows: 7).
_WAKE_BYTES = 1 << 20
# The longest a queued row waits for its batch to fill.
_HOLD_S = 0.02
# A put in flight this long when rows are dropped: the server is not
# answering (stopped, hung), not merely slower than the dataset. A healthy
# batch's put takes milliseconds.
_STALLED_S = 1.0
# A writer idle this long ends (the next enqueue starts another), so that a
# CachedDataset that is no longer used does not keep a thread.
_IDLE_EXIT_S = 10.0

_putters: weakref.WeakSet[AsyncPutter] = weakref.WeakSet()  # live putters here
# The causes of drops (_CAUSES) this process warned about, for putters
# without a flag of their own.
_warned_causes: set[int] = set()
# The causes of drops, each warned about once: the queue is slower than
# the dataset; the server has not answered a put for _STALLED_S; a put has
# waited less (either).
_SLOWER, _STALLED, _WAITED = 0, 1, 2
_hooked_pid: int | None = None   # the process whose exit hooks are registered
# (pid, monotonic time) by which the exit flush of that process ends.
_exit_deadline: tuple[int, float] | None = None


def put_rows(cache: Any, ids: Sequence[int], rows: Sequence[Any]) -> int:
    """Stores rows in a DatasetCache with one put_batch; the number of rows
    stored now."""
    return sum(bool(x) for x in cache.put_batch(ids, rows))


class AsyncPutter:
    """The queue and writer thread of one CachedDataset in one process.

    store(ids, rows) stores rows and returns how many it stored; it runs
    on the writer thread only. Its warnings name `origin` where no frame of
    the user's is on the stack (the writer thread's are never). `target`:
    what `store` puts into (CachedDataset: its cache), for flush_into().
    `told`: the flag whose slots say which causes of drops were warned
    about, shared with the processes it travels to (None: this process's)."""

    def __init__(self, store: Callable[[list[int], list[Any]], int],
                 limit_bytes: int = DEFAULT_QUEUE_BYTES,
                 batch_wakes: Callable[[], bool] | None = None,
                 origin: Origin | None = None, target: object = None,
                 told: WarnedFlag | None = None) -> None:
        self._store = store
        self.origin = origin
        self.told = told
        self.target = target
        self.limit_bytes = limit_bytes
        self._batch_wakes = batch_wakes
        self._reset()
        _putters.add(self)

    def _reset(self) -> None:
        """Fresh state: at creation and in a forked child (the parent's
        thread and any lock it held do not exist there)."""
        self._pid = os.getpid()
        # Reentrant so that _held_here() can tell its owner (a plain Lock
        # knows none); no section needs to take it twice.
        self._cond = threading.Condition(threading.RLock())
        self._queue: deque[tuple[int, Any, int]] = deque()  # (row_id, row, nbytes)
        self._bytes = 0            # queued + being written
        self._queued_bytes = 0     # queued only
        self._flushing = 0         # flush() calls waiting
        self._batched = False      # wakes by batch (decided at the thread's start)
        self._busy = 0             # rows being written now
        self._write_since: float | None = None  # when the batch being written began
        # The store of the batch being written (None: none is), for
        # wait_redirected().
        self._writing: Callable[[list[int], list[Any]], int] | None = None
        self._stop = False
        self._retired = False      # retire() was called: end once written
        self._thread: threading.Thread | None = None
        self.queued = self.written = self.dropped = self.not_stored = 0

    def stats(self) -> dict[str, int]:
        """Counters of this process: queued, written, dropped (queue full
        or exit), not_stored (already cached by another process, refused by
        the cache, or the put raised), pending (queued or being written)."""
        with self._cond:
            return dict(queued=self.queued, written=self.written,
                        dropped=self.dropped, not_stored=self.not_stored,
                        pending=len(self._queue) + self._busy)

    def enqueue(self, row_id: int, row: Any, nbytes: int) -> bool:
        """Queues a row for the writer; False when it was dropped."""
        return self.enqueue_many([(row_id, row, nbytes)]) == 1

    def enqueue_many(self, items: Sequence[tuple[int, Any, int]]) -> int:
        """Queues (row_id, row, nbytes) rows in order, each as enqueue()
        would (a row that does not fit is dropped, the rows after it are
        still offered); the number queued. One lock, one fork check and at
        most one wake-up for all of them: CachedDataset queues a batch's
        misses at once."""
        if self._pid != os.getpid():
            self._reset()          # a fork that bypassed os.fork's hooks
        queued = 0
        full = False
        stalled: float | None = None
        with self._cond:
            for row_id, row, nbytes in items:
                if self._stop or (self._bytes and self._bytes + nbytes > self.limit_bytes):
                    self.dropped += 1
                    full = full or not self._stop
                    continue
                self._queue.append((row_id, row, nbytes))
                self._bytes += nbytes
                self._queued_bytes += nbytes
                queued += 1
            if queued:
                self.queued += queued
                self._start_locked()
                if not self._batched or self._ready_locked():
                    self._cond.notify()
            if full and self._write_since is not None:
                stalled = time.monotonic() - self._write_since
        if full:
            _warn_drops(self.limit_bytes, self.origin, stalled, self.told)
        return queued

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every queued row is written; False on timeout. On the
        writer thread itself (a call made inside a put: a warnings hook)
        False at once: the batch it would wait for is that thread's."""
        if self._pid != os.getpid():
            return True
        if threading.current_thread() is self._thread or self._held_here():
            return False
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: not self._queue and not self._busy,
                                           timeout)
            finally:
                self._flushing -= 1

    def redirect(self, store: Callable[[list[int], list[Any]], int],
                 origin: Origin | None, target: object = None) -> None:
        """Every row not yet being written, queued now or later, is stored
        with `store` (which puts into `target`), and the putter's warnings
        name `origin` (CachedDataset: its cache was replaced or turned
        off). Returns at once: the batch being written now ends in the old
        store (wait_redirected()). One lock with enqueue and the writer's
        pick of a batch: no row picked after it goes to the old store."""
        if self._pid != os.getpid():
            self._reset()          # the parent's queue and thread are not here
        with self._cond:
            self._store = store
            self.origin = origin
            self.target = target

    def wait_redirected(self) -> None:
        """Waits until no batch is being written with a store that
        redirect() replaced: then nothing of this putter uses an old store
        again. At most one put of the old store's (bounded by its server's
        request timeout), never the queue. On the writer thread itself (an
        assignment made inside a put: a warnings hook, a finalizer the
        collector ran there) it returns at once: the batch it would wait
        for is the one that thread is writing."""
        if self._pid != os.getpid() or threading.current_thread() is self._thread:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._writing is None
                                or self._writing is self._store)

    def drop_queued(self) -> tuple[int, int]:
        """Drops the rows queued and not yet being written (counted in
        `dropped`); (rows dropped, rows being written now). Inside one of
        this putter's own locked sections (_held_here) nothing is dropped:
        (rows queued, rows being written), which the writer stores later
        into whatever its store is then."""
        if self._pid != os.getpid():
            return 0, 0
        if self._held_here():
            return len(self._queue), self._busy
        with self._cond:
            return self._drop_queued_locked(), self._busy

    def _held_here(self) -> bool:
        """Whether this thread holds the putter's lock: a signal handler
        (Python runs it on the main thread, between two lines of whatever
        ran there: enqueue_many's locked part among them) or a finalizer
        that closes the cache (flush_into) has interrupted this thread's
        own section. Waiting there would wait for itself, forever (a
        trainer's SIGTERM handler that closed its cache hung so); changing
        the queue would change it under the section it interrupted. The
        lock's own record of its owner, as threading.Condition reads it."""
        return bool(self._cond._is_owned())  # type: ignore[attr-defined]

    def _drop_queued_locked(self) -> int:
        """Drops the rows queued and not yet being written, counted in
        `dropped`; how many."""
        n = len(self._queue)
        self.dropped += n
        self._queue.clear()
        self._bytes -= self._queued_bytes
        self._queued_bytes = 0
        return n

    def close(self, timeout: float | None = None) -> None:
        """Flushes for at most `timeout` s (default EXIT_FLUSH_S), drops the
        rest, stops the thread after the batch it is writing: flush and
        stop together take at most `timeout`."""
        if self._pid != os.getpid():
            return
        if timeout is None:
            timeout = EXIT_FLUSH_S
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        with self._cond:
            self._stop = True
            self._drop_queued_locked()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))

    def retire(self) -> None:
        """The owner is gone: the thread writes what is queued and ends
        then, rather than waiting _IDLE_EXIT_S for more. Never blocks: it
        may run in the cyclic collector on any thread, the writer's with
        the lock held included; a busy lock's holder (the writer, between
        two waits) sees the flag before it waits again."""
        self._retired = True
        if self._cond.acquire(blocking=False):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    def _start_locked(self):
        if self._thread is None:
            self._batched = self._batch_wakes is not None and self._batch_wakes()
            _hook_exit()
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="shmcache-put")
            self._thread.start()

    def _ready_locked(self):
        """Whether the writer should store now, not at its next look."""
        return bool(self._queue) and (len(self._queue) >= _BATCH_ROWS or self._flushing > 0
                                      or self._queued_bytes >= _WAKE_BYTES)

    def _run(self):
        idle_since = time.monotonic()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._retired
                                    or self._ready_locked()
                                    or (not self._batched and bool(self._queue)),
                                    _HOLD_S if self._batched else _IDLE_EXIT_S)
                if self._stop:
                    return
                if not self._queue:
                    if self._retired or time.monotonic() - idle_since >= _IDLE_EXIT_S:
                        self._thread = None
                        return
                    continue
                n = min(len(self._queue), _BATCH_ROWS)
                batch = [self._queue.popleft() for _ in range(n)]
                self._queued_bytes -= sum(b[2] for b in batch)
                self._busy = n
                # Picked with the batch, under the lock redirect() takes.
                store, origin = self._store, self.origin
                self._writing = store
                self._write_since = time.monotonic()
            ok = self._write(batch, store, origin)
            idle_since = time.monotonic()
            with self._cond:
                self._busy = 0
                self._writing = None
                self._write_since = None
                self._bytes -= sum(b[2] for b in batch)
                self.written += ok
                self.not_stored += n - ok
                self._cond.notify_all()

    def _write(self, batch, store, origin):
        """Rows stored with `store`; a failing batch is warned about once
        (per process and origin) and counted, never raised: training
        already has its samples."""
        try:
            try:
                return store([b[0] for b in batch], [b[1] for b in batch])
            except Warning:
                raise
            except Exception as e:  # the writer thread must outlive a bad row
                # Shown once per process and origin by the default filter.
                warn(f"shmcache: a background put failed ({type(e).__name__}: "
                     f"{e}); these rows are read from the source", CacheWarning,
                     origin)
        except Warning as w:
            # A warning the filters made an error (python -W error): this
            # thread has nobody to raise it to, and must go on (flush()
            # waits for it); reported as a thread's uncaught error is.
            threading.excepthook(threading.ExceptHookArgs(
                (type(w), w, w.__traceback__, threading.current_thread())))
        return 0


def _warn_drops(limit_bytes, origin, stalled_s, told):
    """The warning of a queue that drops rows, once per cause and `told`
    flag (None: per process); `stalled_s`: how long the put in flight had
    waited (None: none was). Said at the first drop: a queue fills within a
    second, before any put times out. Not counted as said where nothing is
    shown (quietly())."""
    cause = (_SLOWER if stalled_s is None else
             _STALLED if stalled_s >= _STALLED_S else _WAITED)
    if said_quietly():
        return
    if told is not None:
        if not told.claim(cause):
            return
    elif cause in _warned_causes:
        return
    else:
        _warned_causes.add(cause)
    full = (f"shmcache: the background put queue is full ({limit_bytes} bytes of "
            "rows waiting)")
    dropped = "rows are dropped and read from the source again next epoch"
    check = ("`shmcache --server_info` says; one stopped by a signal needs "
             "`kill -CONT PID`")
    slower = ("the cache takes rows slower than the dataset makes them (raise "
              "put_queue= or use async_puts=False to wait for every put)")
    if cause == _SLOWER:
        warn(f"{full}: {dropped}; {slower}", CacheWarning, origin)
    elif cause == _STALLED:
        # Not "raise put_queue": no queue is long enough for a server that
        # does not answer.
        warn(f"{full} because the cache server has not answered a put for "
             f"{stalled_s:.1f} s: {dropped} (is the server stopped or overloaded? "
             f"{check})", CacheWarning, origin)
    else:
        warn(f"{full} behind a put that has waited {stalled_s:.2f} s for the cache "
             f"server: {dropped}. If the server is stopped or hung ({check}), no "
             f"queue helps; else {slower}", CacheWarning, origin)


def flush_into(target: object, timeout: float) -> tuple[int, int]:
    """Waits until the rows this process's putters hold for `target` are
    written, for at most `timeout` s in all, then drops the rows still
    queued for it: (rows dropped, rows still being written). A putter
    whose writer is the calling thread (a close() made inside a put) is
    not waited for: its queue is dropped. Nor one whose lock the calling
    thread holds (a close() in a signal handler that ran while a row was
    being queued): its queued rows are counted as dropped and left to its
    writer, whose put into the closed cache stores nothing."""
    deadline = time.monotonic() + timeout
    mine = [p for p in list(_putters) if p.target is target]
    dropped = busy = 0
    for p in mine:
        p.flush(max(0.0, deadline - time.monotonic()))
        n, b = p.drop_queued()
        dropped += n
        busy += b
    return dropped, busy


def _close_all():
    """The exit flush: every putter of the process shares one EXIT_FLUSH_S
    budget, however many exit hooks call this (atexit and multiprocessing's
    both do) and however long a put in flight waits on the server."""
    global _exit_deadline
    if _exit_deadline is None or _exit_deadline[0] != os.getpid():
        _exit_deadline = (os.getpid(), time.monotonic() + EXIT_FLUSH_S)
    for p in list(_putters):
        p.close(max(0.0, _exit_deadline[1] - time.monotonic()))


def _hook_exit():
    """Registers the exit flush of this process, once, when its first writer
    thread starts. atexit covers a plain process; a multiprocessing child
    (DataLoader worker) ends in os._exit after running multiprocessing's
    exit finalizers, which it cleared when it started: registered here, the
    hook is the child's own."""
    global _hooked_pid
    if _hooked_pid == os.getpid():
        return
    _hooked_pid = os.getpid()
    atexit.register(_close_all)
    multiprocessing.util.Finalize(None, _close_all, exitpriority=100)


def _after_fork_in_child():
    global _warned_causes
    _warned_causes = set()
    for p in list(_putters):
        p._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
