"""The rows a CachedLoader did not find in the cache, computed by a pool of
torch DataLoader workers (MissWorkers) or in the calling thread
(compute_rows).

A computed row is one of:
- Stored(): a worker put it into the cache (the loader reads it from there,
  no pickling);
- Columns(cols): its [(name, dtype, array)], which the cache did not take
  (full, gone) or which was computed in the trainer's process;
- Sample(sample, why): the sample as the dataset made it, which has no
  column encoding (too many columns, a name too long, a value of no column
  type); it is delivered as is, as CachedDataset delivers it.

MissWorkers(cds, num_workers, ...) starts, on the first submit(), the
workers of a torch DataLoader over the user's dataset (cds.dataset): they
are DataLoader's in everything a script sees (worker_init_fn,
get_worker_info() with .dataset the user's dataset, torch/random/numpy
seeds base_seed + id, the seed drawn from the generator state the loader
gives, multiprocessing_context, torch.set_num_threads(1), SIGSEGV/SIGBUS
reports). The DataLoader hands each worker one task, which is this module's
serve loop (the collate_fn of an empty batch): the worker then takes
batches from a queue of its own, in order, until the pool closes. So
submit(worker, ids) sends a batch's misses to the worker the caller names
(CachedLoader: batch k to worker k mod num_workers, as DataLoader deals its
batches), and every worker computes at once. A worker computes the rows of
a batch, puts them into the cache itself (with owned=, only the rows it
marks; the others come back as Columns: PartitionedLoader's rows of
another node; all of them once the trainer's cds.cache is not the one the
workers started with: they keep their copy of the dataset, as a persistent
DataLoader's do, and the trainer reads its new cache) and answers with the
batch's Computed rows (a stored row travels as None: nothing of it is
pickled), or with the exception that failed the batch (re-raised in the
trainer as DataLoader re-raises a worker's, naming the worker). A worker
whose worker_init_fn raised fails every batch it gets with that exception
(its type, message and the worker's traceback), and computes none: its
dataset was never set up. As
in DataLoader, whose batches from such a worker all raise too (torch 1.13
raises the user's exception for the first, then an UnboundLocalError of
its own); the pass goes on to its end and the workers end with it.

Failures: a worker that dies fails every batch waiting for it or sent
after, with DataLoader's words ("DataLoader worker (pid N) is killed by
signal: Killed."), found within POLL_S for workers that are this process's
children, else within DataLoader's own 5 s check; each worker ends within
PARENT_POLL_S of its trainer's death (SIGKILL included; under forkserver,
of its forkserver's). close() returns promptly: batches waiting raise
Closed, a worker stops before its next row, and the DataLoader shuts its
workers down in the pool's own thread (close() waits JOIN_S at most for
it, never for a busy worker). compute(ids) spreads rows over all workers
and waits (PartitionedLoader's windows).

MissTurn orders a pass's misses by batch: batch k sends (or computes) its
misses only after the batches before it, so that each worker sees its
batches in DataLoader's order.

Thread safety: submit(), compute(), Ticket.result(), cancel() and close()
may be called from any thread of the trainer.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch
import torch.multiprocessing
from torch.utils.data import DataLoader, get_worker_info

from .. import CacheWarning
from .._user_line import quietly
from ..rows import Column, encode
from ._exit_threads import end_at_exit, waits_are_slices

__all__ = ["Stored", "STORED", "Columns", "Sample", "Computed", "Closed", "WorkerError",
           "compute_rows", "MissWorkers", "MissTurn", "Ticket", "PARENT_POLL_S", "POLL_S"]

PARENT_POLL_S = 0.2      # a worker checks this often that its trainer lives
POLL_S = 0.1             # the trainer checks this often that its workers live
JOIN_S = 0.5             # close() waits this long for idle workers, never for busy ones
_MAX_CHUNK = 1024        # rows per task of compute()


@dataclass
class Stored:
    """The row is in the cache now."""


STORED = Stored()


@dataclass
class Columns:
    cols: list[Column]


@dataclass
class Sample:
    sample: Any
    why: str


Computed = Union[Stored, Columns, Sample]


class Closed(RuntimeError):
    """The loader's iterator was closed while misses were being computed."""


class WorkerError:
    """An exception of a worker, carried to the trainer and raised there
    as DataLoader raises a worker's: same type, the worker's traceback in
    the message."""

    def __init__(self, where: str) -> None:
        exc_type, exc, _ = sys.exc_info()
        self.exc_type = exc_type or RuntimeError
        self.message = f"Caught {self.exc_type.__name__} {where}.\nOriginal " + \
            "".join(traceback.format_exception(exc_type, exc, exc.__traceback__
                                               if exc is not None else None))

    def exception(self) -> BaseException:
        """The exception to raise, made as torch's ExceptionWrapper.reraise
        makes DataLoader's: a KeyError's message reads as a message (not
        as a quoted key), a type with a `message` field gets it by keyword,
        a type that takes other arguments becomes a RuntimeError."""
        make: Any = self.exc_type
        msg: Any = _KeyErrorMessage(self.message) if make is KeyError else self.message
        by_keyword = make is not KeyError and getattr(make, "message", None)
        try:
            return make(message=msg) if by_keyword else make(msg)
        except Exception:   # noqa: BLE001 -- a type that wants other arguments
            return RuntimeError(self.message)


def _like(error: BaseException) -> BaseException:
    """A fresh exception of `error`'s type and message, for each batch the
    pool's failure fails (one object raised by several next() would chain
    their tracebacks): a worker that could not start (its worker_init_fn
    or dataset not picklable for spawn) fails the batch with the type
    DataLoader's iter() raises. A type not made from a message becomes a
    RuntimeError, as a worker's exception does (WorkerError)."""
    try:
        made = type(error)(str(error))
    except Exception:   # noqa: BLE001 -- a type that wants other arguments
        return RuntimeError(str(error))
    return made if isinstance(made, Exception) else RuntimeError(str(error))


class _KeyErrorMessage(str):
    """KeyError shows its argument's repr(): this str's is itself, so a
    worker's KeyError reads as DataLoader's does."""

    def __repr__(self) -> str:
        return str(self)


def _compute(ds: Any, cds: Any, index: int, put: bool) -> Computed:
    """Row `index` of `ds` (the dataset cds wraps), put when `put`. Put
    row by row, not per batch: a batch's rows alive at once would leave
    the allocator fresh memory to fault in for every batch, which costs
    more than the puts' calls."""
    sample = ds[index]
    try:
        cols = encode(sample)
    except (TypeError, ValueError) as e:
        return Sample(sample, str(e))
    # Quiet: the trainer's process warns, once, when it stores the row
    # again. Not strict: a row past the cache's limits (columns, name
    # length) comes back as columns, delivered as CachedDataset delivers it.
    if put:
        if cds.cache.put_encoded([index], [cols], strict=False, quiet=True)[0]:
            return STORED
        with quietly(CacheWarning):
            if cds.cache.contains(index):   # another process stored it
                return STORED
    return Columns(cols)


def compute_rows(cds: Any, ids: Sequence[int],
                 stopped: Callable[[], bool]) -> list[Computed]:
    """Rows `ids` of the CachedDataset's dataset computed in this thread,
    not put (the caller queues them); raises Closed, before the next row,
    once stopped() is true."""
    out: list[Computed] = []
    for i in ids:
        if stopped():
            raise Closed("the CachedLoader iterator was closed")
        out.append(_compute(cds.dataset, cds, i, put=False))
    return out


class MissTurn:
    """The batch order of a pass's misses: batch k's misses go out (to its
    worker, or computed in the caller's thread) only once every batch
    before it has passed the turn (sent its misses, had none, or failed),
    so that a worker computes its batches, and num_workers=0 computes all
    of them, in DataLoader's order, and the random draws of a dataset
    follow it. Every batch drawn must pass (passed() once it is past;
    again is harmless). close() releases the waiters with Closed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._turn = 0
        self._passed: set[int] = set()
        self._closed = False

    def wait(self, number: int) -> None:
        """Returns when batch `number` has the turn."""
        with self._cond:
            while self._turn != number and not self._closed:
                self._cond.wait()
            if self._closed:
                raise Closed("the CachedLoader iterator was closed")

    def passed(self, number: int) -> None:
        with self._cond:
            if number >= self._turn:
                self._passed.add(number)
                while self._turn in self._passed:
                    self._passed.discard(self._turn)
                    self._turn += 1
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


# ---- the worker side ------------------------------------------------------

# The exception of this worker's worker_init_fn, for each of its batches.
_init_error: WorkerError | None = None


def _watch_parent(parent: int, trainer: int) -> None:
    """Ends the worker once its parent or its trainer is gone. They differ
    under the forkserver start method: the parent is the fork server, which
    outlives a SIGKILLed trainer (so do a plain DataLoader's workers there)."""
    try:
        trainer_fd: int | None = os.pidfd_open(trainer)
    except ProcessLookupError:
        os._exit(1)         # the trainer ended before this worker started
    except OSError:
        trainer_fd = None   # no pidfd here: the parent alone is watched
    while os.getppid() == parent:
        if trainer_fd is None:
            time.sleep(PARENT_POLL_S)
        elif select.select([trainer_fd], [], [], PARENT_POLL_S)[0]:
            break           # readable: the trainer exited
    os._exit(1)


class _WorkerInit:
    """worker_init_fn of the workers: the worker's pid into `pids` (shared
    memory: the trainer sees it even if the worker dies at once), a thread
    that ends the worker when its parent is gone (DataLoader's own watchdog
    looks only between tasks, and a worker's one task lasts the pool's
    life), then the user's worker_init_fn, whose exception fails every
    batch of the worker."""

    def __init__(self, pids: Any, user: Callable[[int], None] | None) -> None:
        self.pids, self.user = pids, user
        self.trainer = os.getpid()    # made in the trainer, pickled to spawned workers

    def __call__(self, worker_id: int) -> None:
        global _init_error
        self.pids[worker_id] = os.getpid()
        threading.Thread(target=_watch_parent, args=(os.getppid(), self.trainer),
                         daemon=True, name="shmcache-parent-watch").start()
        if self.user is not None:
            try:
                self.user(worker_id)
            except Exception:   # noqa: BLE001 -- each batch raises it
                _init_error = WorkerError(f"in CachedLoader worker process {worker_id}")


class _ServeTasks:
    """The batch sampler of the workers' DataLoader: one empty batch per
    worker, which DataLoader deals to workers 0..n-1 in order."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter([[] for _ in range(self.n)])

    def __len__(self) -> int:
        return self.n


class _Serve:
    """The collate_fn of the workers' DataLoader: the empty batch a worker
    gets runs its serve loop (see the module)."""

    def __init__(self, cds: Any, tasks: list[Any], results: Any, stop: Any) -> None:
        self.cds, self.tasks, self.results, self.stop = cds, tasks, results, stop

    def __call__(self, _batch: list[Any]) -> list[Any]:
        info = get_worker_info()
        assert info is not None, "the serve loop runs in a DataLoader worker"
        try:
            self._serve(info.id, info.dataset)
        finally:
            # Wakes the trainer's reader, which close() waits for: without
            # it, a closed pool's end (every pass's) waited out its poll.
            self.results.put(("end", info.id, None))
        return []

    def _serve(self, wid: int, ds: Any) -> None:
        tasks = self.tasks[wid]
        while not self.stop.is_set():
            try:
                task = tasks.get(timeout=PARENT_POLL_S)
            except queue.Empty:
                continue
            if task is None:
                return
            key, ids, owned = task
            if _init_error is not None:   # a worker never set up computes nothing
                self.results.put(("error", key, _init_error))
                continue
            try:
                rows: list[Computed] = []
                for k, i in enumerate(ids):
                    if self.stop.is_set():
                        return
                    rows.append(_compute(ds, self.cds, i, owned is None or owned[k]))
            except Exception:   # noqa: BLE001 -- the batch's result
                self.results.put(("error", key, WorkerError(
                    f"in CachedLoader worker process {wid}")))
                continue
            # A stored row goes back as None: only the rows the cache did
            # not take are pickled.
            self.results.put(("done", key, [None if r is STORED else r for r in rows]))


class _WorkerLoader(DataLoader[Any]):
    """The pool's DataLoader: the CachedLoader already warned, as
    DataLoader does, about more workers than CPUs."""

    def check_worker_number_rationality(self) -> None:
        pass


# ---- the trainer side -----------------------------------------------------

class Ticket:
    """A submitted batch: result() waits for its rows."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._rows: list[Computed] | None = None
        self._error: BaseException | WorkerError | None = None

    def _set(self, rows: list[Computed] | None = None,
             error: BaseException | WorkerError | None = None) -> None:
        if not self._done.is_set():
            self._rows, self._error = rows, error
            self._done.set()

    def result(self, timeout: float | None = None) -> list[Computed]:
        """The batch's rows, in order; raises the batch's exception, the
        pool's failure, or Closed (once: the ticket lets go of it);
        TimeoutError after `timeout` s."""
        if not self._done.wait(timeout):
            raise TimeoutError("the worker has not answered")
        # The exception is handed over, not kept: its traceback holds this
        # frame and the caller's, a cycle through the ticket that would
        # keep a closed pass and its loader until the cyclic collector ran.
        err, self._error = self._error, None
        try:
            if isinstance(err, WorkerError):
                raise err.exception()
            if err is not None:
                raise err
        finally:
            del err
        assert self._rows is not None, "Ticket.result() after it raised"
        return self._rows


def _unlist_from_sigchld_reports(passes: Any) -> None:
    """Takes the workers of the pool's DataLoader iterator `passes` out of
    torch's list of the workers its SIGCHLD handler reports (torch has no
    public switch for it). That handler, once a DataLoader iterated in the
    main thread installed it (a script's validation loader), raises a
    listed dead worker's report in the main thread at the next child's
    exit (its own, mostly), at whatever runs there: raised inside a threading.Condition's
    __enter__, after its lock's acquire (a queue put, an Event.set, a
    pass's own condition), it leaves that lock held, and the next user
    waits for it for good (the hang of DataLoader.__del__ in CI at
    6fb8df5). The pool reports its workers' deaths itself (_check_workers,
    within POLL_S, as the failure of every batch waiting for them); torch
    would raise them in a thread that is not waiting for them. The
    iterator then does not remove them again at its shutdown."""
    if getattr(passes, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling
        signal_handling._remove_worker_pids(id(passes))
        passes._worker_pids_set = False


def _exit_status(pid: int) -> str | None:
    """How worker `pid` ended, in DataLoader's words; None while it runs."""
    try:
        st = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:   # not our child (forkserver), or reaped
        try:
            os.kill(pid, 0)
            return None
        except ProcessLookupError:
            return f"DataLoader worker (pid(s) {pid}) exited unexpectedly"
    if st is None:
        return None
    if st.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return f"DataLoader worker (pid {pid}) is killed by signal: " \
            f"{signal.strsignal(st.si_status)}. "
    return (f"DataLoader worker (pid {pid}) exited unexpectedly with exit code "
            f"{st.si_status}. Details are lost due to multiprocessing. Rerunning "
            "with num_workers=0 may give better error trace.")


class MissWorkers:
    """See the module. seed_state: the torch generator state the workers'
    base seed is drawn from (as DataLoader draws it at iter(): the
    CachedLoader passes the state its own draw started from, so the seeds
    are the ones it drew); None: a fresh generator."""

    def __init__(self, cds: Any, num_workers: int, context: Any = None,
                 seed_state: torch.Tensor | None = None,
                 worker_init_fn: Callable[[int], None] | None = None) -> None:
        self.cds = cds
        self.num_workers = num_workers
        self._context = context
        self._seed_state = seed_state
        self._init_fn = worker_init_fn
        self._lock = threading.Lock()
        self._tickets: dict[int, Ticket] = {}
        self._keys = 0
        self._pids: Any = None       # worker id -> pid (0 until it started)
        self._failed: BaseException | None = None
        self._closed = False
        self._started = False
        self._tasks: list[Any] = []
        self._threads: list[threading.Thread] = []
        self._results: Any = None
        self._stop: Any = None
        # The trainer's cache when the workers were started (their copy's).
        self._cache: Any = None

    @property
    def pids(self) -> list[int]:
        """The pids of the workers that have started."""
        return [] if self._pids is None else [p for p in self._pids[:] if p]

    @property
    def started(self) -> bool:
        return self._started

    def started_threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._threads)

    @property
    def broken(self) -> bool:
        """Closed, or failed: a pool that computes nothing more."""
        return self._closed or self._failed is not None

    def submit(self, worker: int, ids: Sequence[int],
               owned: Sequence[bool] | None = None) -> Ticket:
        """Sends rows `ids` to worker `worker` (mod num_workers), after the
        batches sent to it before; with `owned`, only the rows it marks
        are put (see the module). Returns at once."""
        ticket = Ticket()
        with self._lock:
            if self._failed is not None:
                ticket._set(error=_like(self._failed))
                return ticket
            if self._closed:
                ticket._set(error=Closed("the CachedLoader iterator was closed"))
                return ticket
            if not self._started:
                self._start_locked()
            if self._cache is not self.cds.cache:
                # `cds.cache = other` (or None) since the workers started
                # (persistent ones): their copy still has the old cache,
                # which the trainer no longer reads; they put nothing, and
                # the trainer stores what they return in its own cache.
                owned = [False] * len(ids)
            self._keys += 1
            key = self._keys
            self._tickets[key] = ticket
            self._tasks[worker % self.num_workers].put(
                (key, [int(i) for i in ids], None if owned is None else
                 [bool(o) for o in owned]))
        return ticket

    def compute(self, ids: Sequence[int],
                owned: Sequence[bool] | None = None) -> list[Computed]:
        """The rows of `ids`, in order, spread over all workers (chunks of
        at most _MAX_CHUNK rows, two per worker)."""
        if not ids:
            return []
        size = min(_MAX_CHUNK, max(1, -(-len(ids) // (2 * self.num_workers))))
        tickets = [self.submit(k // size, ids[k:k + size],
                               None if owned is None else owned[k:k + size])
                   for k in range(0, len(ids), size)]
        return [row for t in tickets for row in t.result()]

    def cancel(self, tickets: Any) -> None:
        """Gives up waiting for `tickets` (a closed pass of a pool that
        lives on): they raise Closed; their workers still compute them."""
        with self._lock:
            for key, t in list(self._tickets.items()):
                if t in tickets:
                    del self._tickets[key]
        for t in list(tickets):
            t._set(error=Closed("the CachedLoader iterator was closed"))

    def close(self) -> None:
        """Stops computing (see the module). Idle workers and the pool's
        threads have ended when it returns; a busy worker ends after its
        row, without holding the caller (it waits JOIN_S at most)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tickets, self._tickets = self._tickets, {}
            started = self._started
        for ticket in tickets.values():
            ticket._set(error=Closed("the CachedLoader iterator was closed"))
        if not started:
            return
        self._stop.set()
        for q in self._tasks:
            q.put(None)
        me = threading.current_thread()
        deadline = time.monotonic() + JOIN_S
        for t in self._threads:
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))

    stop = close   # the exit hook's (_exit_threads): bounded, JOIN_S

    # ---- inside ---------------------------------------------------------

    def _start_locked(self) -> None:
        self._cache = self.cds.cache
        ctx = self._context if self._context is not None else torch.multiprocessing
        self._tasks = [ctx.Queue() for _ in range(self.num_workers)]
        self._results = ctx.Queue()
        self._stop = ctx.Event()
        self._pids = ctx.Array("q", self.num_workers, lock=False)
        gen = torch.Generator()
        if self._seed_state is not None:
            gen.set_state(self._seed_state)
        else:
            gen.seed()
        loader = _WorkerLoader(
            self.cds.dataset, batch_sampler=_ServeTasks(self.num_workers),
            num_workers=self.num_workers,
            collate_fn=_Serve(self.cds, self._tasks, self._results, self._stop),
            worker_init_fn=_WorkerInit(self._pids, self._init_fn),
            multiprocessing_context=self._context,
            generator=gen, prefetch_factor=1)
        self._started = True
        self._threads = [
            threading.Thread(target=self._run_loader, args=(loader,), daemon=True,
                             name="shmcache-miss-workers"),
            threading.Thread(target=self._read_results, daemon=True,
                             name="shmcache-miss-results")]
        end_at_exit(self)
        for t in self._threads:
            t.start()

    def _run_loader(self, loader: DataLoader[Any]) -> None:
        """Starts the workers and waits for their serve loops to end; a
        failure DataLoader finds (a worker gone, found by its own check)
        fails the pool. The DataLoader shuts its workers down here. It is
        a torch section whose slices are its waits (_exit_threads): each
        next() calls torch (record_function), and at the trainer's exit
        this thread may still be shutting the workers down; it then stops
        as a wait returns instead of returning from torch as the
        interpreter finalizes."""
        with waits_are_slices():
            try:
                passes = iter(loader)
                _unlist_from_sigchld_reports(passes)
                for _ in passes:
                    pass
            except BaseException as e:   # noqa: BLE001 -- fails the pool
                self._fail(e)

    def _read_results(self) -> None:
        # A torch section, its waits the slices, as the loader thread's: a
        # sample's tensors are unpickled (and freed) here.
        with waits_are_slices():
            self._read_results_until_closed()

    def _read_results_until_closed(self) -> None:
        results = self._results
        while True:
            with self._lock:
                if self._closed:
                    return
            try:
                msg = results.get(timeout=POLL_S)
            except queue.Empty:
                self._check_workers()
                continue
            except (EOFError, OSError) as e:
                self._fail(RuntimeError(f"the CachedLoader's workers are gone: {e}"))
                return
            if msg[0] == "end":   # a worker's serve loop ended: closed, or failing
                continue
            with self._lock:
                ticket = self._tickets.pop(msg[1], None)
            if ticket is not None:
                if msg[0] == "done":
                    ticket._set(rows=[STORED if r is None else r for r in msg[2]])
                else:
                    ticket._set(error=msg[2])

    def _check_workers(self) -> None:
        for pid in self.pids:
            why = _exit_status(pid)
            if why is not None:
                self._fail(RuntimeError(why))
                return

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self._closed or self._failed is not None:
                return
            self._failed = error
            tickets, self._tickets = self._tickets, {}
        for t in tickets.values():
            t._set(error=_like(error))
        self.close()
