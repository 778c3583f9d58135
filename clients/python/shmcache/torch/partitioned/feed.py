"""WindowFeed: the exchange thread of one PartitionedLoader pass.

A thread named shmcache-exchange takes the pass's batches from the batch
sampler `window` at a time and runs one exchange round per window
(RowExchange.round: the window's rows owned by other live nodes asked of
their owners, the rows computed for other nodes since the last round pushed
to them), then hands the window's batches, one by one, to the consumer
through a bounded queue (2 windows). What a handed batch is depends on the
loader:

- fill given (DataLoader(CachedDataset)): the batch's rows (columns, the
  cache's own encoding), complete:
  fill (PartitionedRows.fill) reads this node's rows from its cache and
  computes the misses on this thread (the DataLoader's workers as a pool);
- fill None (CachedLoader): the feed is the pass's BatchSource
  (CachedLoader.iter_source) and each batch a FedBatch, the indices and
  the rows fetched from other nodes; the CachedLoader's pipeline reads
  this node's rows, computes the misses with its own miss workers (only
  rows this node owns are put; the others come back in the BatchReport)
  and settles the batch (FedBatch.settle), which queues those rows for the
  next round.

After the last window (the sampler exhausted), or once stop() is called
(close, early break, an exception), the thread stops taking batches, waits
until every handed FedBatch is settled (not after stop()), and takes part
in closing rounds (done, with nothing of its own but its last pushes) until
every rank is done; then it ends. An exception of the sampler or of fill is
handed to the consumer after the batches before it, and the thread still
closes the epoch's rounds; a failed round (the ranks out of step, a rank
gone) ends it at once, no round after it; a failed round that no consumer
takes (a window's, the loop left before it; a closing one, stopped or
after an error handed) is one CacheWarning. close() stops and joins: it
returns once every rank has finished the epoch. At exit the hook of
_exit_threads stops the feed and waits for the thread a bounded time; a
thread still in a round then stops in it (the round is a torch section).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ... import CacheWarning
from ..._user_line import user_line, warn
from .._exit_threads import end_at_exit, exiting
from ..batch_source import BatchReport, batch_ids
from .window_rows import PartitionedRows

__all__ = ["WindowFeed", "FedBatch"]

Fill = Callable[[list[list[int]], dict[int, Any]], list[Any]]


class FedBatch:
    """A batch handed to a CachedLoader pass, a SourcedBatch
    (shmcache.torch.batch_source): `indices`, the rows fetched from other
    nodes (columns, supplied where this node's cache misses), kept rows and
    rows in this node's cache: those this node owns. settle() counts the
    batch and queues the computed rows of other nodes for their owners."""

    def __init__(self, feed: WindowFeed, indices: list[int], rows: dict[int, Any]) -> None:
        self.indices = indices
        self.rows = rows
        self._feed = feed
        self._settled = False

    def supplied(self, index: int) -> Any | None:
        return self.rows.get(index)

    def keeps(self, index: int) -> bool:
        """Whether this node owns row `index` (misses of other nodes' rows
        are not put here: they go to their owner)."""
        return self._feed.rows.owned(index)

    def in_cache(self, index: int) -> bool:
        """Whether row `index` can be in this node's cache: only the rows it
        owns are (the others are not looked up there)."""
        return self._feed.rows.owned(index)

    def settle(self, report: BatchReport) -> None:
        if not self._settled:
            self._settled = True
            self._feed._settle(report)


class WindowFeed:
    """See the module. rows: the rank's PartitionedRows (its exchange);
    epoch: the pass's tag, the same on every rank; fill: see the module.
    start() starts the thread."""

    def __init__(self, rows: PartitionedRows, window: int, epoch: int,
                 fill: Fill | None = None) -> None:
        self.rows = rows
        self.window = window
        self.epoch = epoch
        self._fill = fill
        # The user's line that started the epoch (the loop over the loader):
        # what a warning of the exchange thread names.
        self._origin = user_line()
        self._batches: Iterator[Any] = iter(())
        self._cond = threading.Condition()
        self._items: deque[Any] = deque()
        self._depth = 2 * window
        self._ended = False          # no item will come after those queued
        self._error: BaseException | None = None
        self._round_failed = False   # _error is a failed round's
        self._stopped = False
        self._handed = self._settled = 0   # FedBatches
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="shmcache-exchange")

    def start(self, first: Any, batches: Iterator[Any]) -> None:
        """Starts the thread on the pass's first batch (drawn by the caller,
        in its thread, as DataLoader draws it; None: no batch) and the
        sampler's iterator of the others."""
        self._batches = batches if first is None else itertools.chain([first], batches)
        end_at_exit(self)
        self._thread.start()

    def started_threads(self) -> list[threading.Thread]:
        return [self._thread] if self._thread.ident is not None else []

    # ---- consumer side ---------------------------------------------------

    def __iter__(self) -> WindowFeed:
        return self

    def __next__(self) -> Any:
        """The next batch (see the module); StopIteration at the end of the
        pass or once stopped; raises what the sampler or fill raised."""
        with self._cond:
            while not self._items and not self._ended and not self._stopped:
                self._cond.wait()
            if self._items and not self._stopped:
                item = self._items.popleft()
                self._cond.notify_all()
                return item
            if self._error is not None and not self._stopped:
                e, self._error = self._error, None
                raise e
            raise StopIteration

    def stop(self) -> None:
        """Takes no more batches; the thread goes on to the closing rounds
        (returns at once)."""
        with self._cond:
            self._stopped = True
            self._items.clear()
            self._cond.notify_all()

    def close(self) -> None:
        """stop(), then waits for the thread: every rank has finished the
        epoch when it returns. Not at exit: the exit hook (_exit_threads)
        waited for it a bounded time already, and may have parked it."""
        self.stop()
        if not exiting():
            if self._thread.ident is None:   # never started: the epoch's
                self.start(None, iter(()))   # rounds are owed all the same
            self._thread.join()
        with self._cond:
            e, self._error = self._error, None
        if e is not None and self._round_failed:
            # A window's round failed, and the loop left before taking it.
            self._said_failed(e)

    def _settle(self, report: BatchReport) -> None:
        self.rows.count(local_hits=report.cache_hits, remote_hits=report.supplied,
                        misses=report.computed)
        for i, cols in report.not_kept:
            self.rows.push(i, cols)
        with self._cond:
            self._settled += 1
            self._cond.notify_all()

    # ---- the thread --------------------------------------------------------

    def _run(self) -> None:
        ex = self.rows.exchange
        try:
            self._windows()
        except BaseException as e:   # noqa: BLE001 -- handed to the consumer
            with self._cond:
                self._error = e
                self._round_failed = ex.broken
        with self._cond:
            self._ended = True
            self._cond.notify_all()
            while self._settled < self._handed and not self._stopped:
                self._cond.wait()
        try:
            while not ex.broken:
                self.rows.count(closing_rounds=1)
                if ex.round({}, self.rows.take_pending(), True, self.epoch)[1]:
                    break
        except BaseException as e:   # noqa: BLE001 -- a rank gone: reported
            with self._cond:
                handed = self._error is None and not self._stopped
                if handed:
                    self._error, self._round_failed = e, True
            if not handed:   # nobody will take it: said once, here
                self._said_failed(e)

    def _said_failed(self, e: BaseException) -> None:
        warn(f"shmcache: an exchange round of PartitionedLoader failed after the "
             f"loop over it left ({type(e).__name__}: {e}); a rank is gone or out "
             f"of step, and the next epoch will fail", CacheWarning, self._origin)

    def _windows(self) -> None:
        ex = self.rows.exchange
        while True:
            with self._cond:
                if self._stopped:
                    return
            window = [batch_ids(b) for b in itertools.islice(self._batches, self.window)]
            if not window:
                return
            requests = self.rows.requests([i for b in window for i in b])
            answers, _ = ex.round(requests, self.rows.take_pending(), False, self.epoch)
            self.rows.count(rounds=1)
            remote = self.rows.answered(requests, answers)
            items: list[Any] = self._fill(window, remote) if self._fill is not None \
                else [FedBatch(self, b, {i: remote[i] for i in b if i in remote})
                      for b in window]
            for item in items:
                with self._cond:
                    while len(self._items) >= self._depth and not self._stopped:
                        self._cond.wait()
                    if self._stopped:
                        return
                    self._items.append(item)
                    if self._fill is None:
                        self._handed += 1
                    self._cond.notify_all()
