"""The threads of a CachedLoader pass: LoaderIter (the iterator a pass
returns) and Pipeline (its threads), with LoaderState, what the loader keeps
across passes.

Each of the pass's threads takes the next batch number and its batch from
the pass's BatchSource (at most `prefetch` batches ahead of the consumer,
and at least one per thread), assembles it (BatchAssembler), settles it
with the source, and files the result under its number; the consumer
takes the results in number order and raises a failed batch's exception
in its place, then goes on with the next batch, as DataLoader does. The tuner (_autotune.py) may add threads
between batches; once the pass's misses went to worker processes, at
least prefetch_factor * num_workers threads assemble and as many batches
are in flight (as DataLoader keeps its workers' queues full), so that
every worker computes at once.

Ending: an exhausted source, a source's exception, a timeout, close() or
the iterator's garbage collection (an early break) stop the threads and
the pass's miss workers without waiting for a row in flight: a thread
between batches ends at once; one computing a row, or transforming a
sample, ends after it (nothing new starts). A pass whose source ran out
then waits, PASS_FLUSH_S at most, for the rows this process queued for
the cache (loader.flush()) before its StopIteration. Each thread is a torch
section (_exit_threads.owned_section): a trainer's exit waits for it to
leave torch.
"""

from __future__ import annotations

import operator
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..async_put import EXIT_FLUSH_S
from ._assemble import BatchAssembler
from ._autotune import AutoTune
from ._exit_threads import end_at_exit, owned_section
from ._misses import MissTurn
from ._row_schema import BufferPool
from .batch_source import BatchReport, BatchSource, batch_ids
from .datasets import row_ids_from_end

__all__ = ["LoaderState", "LoaderIter"]

_JOIN_S = 0.5      # close() waits this long for idle threads, never for busy ones
# An ended pass waits this long for the rows it queued, as a worker's exit does.
PASS_FLUSH_S = EXIT_FLUSH_S


class LoaderState:
    """What a CachedLoader keeps across its passes: the tuner, the row
    layout learned from the first row (a RowSchema; None: not seen yet;
    False: rows go through collate), the batch buffers reused by later
    batches and passes, the counters (guarded by a lock), and with
    persistent_workers the miss workers and the generator state their seed
    was drawn from."""

    def __init__(self, tuner: AutoTune) -> None:
        self.tuner = tuner
        self.schema: Any = None
        # Buffers of batches in flight, prefetched, and held by the
        # consumer (fresh memory costs more than the copy).
        self.buffers = BufferPool(lambda: tuner.prefetch + tuner.threads + 2)
        self.lock = threading.Lock()
        self.counts: dict[str, float] = dict(
            batches=0, samples=0, hits=0, misses=0, bytes=0, wait_s=0.0, step_s=0.0,
            busy_s=0.0)
        self.pool: Any = None
        self.seed_state: torch.Tensor | None = None
        # register_cache_pages: the cache's segments registered with CUDA
        # (_cache_pages.CachePages), for all the loader's passes.
        self.pages: Any = None

    def count(self, **delta: float) -> None:
        with self.lock:
            for k, v in delta.items():
                self.counts[k] += v

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return dict(self.counts)


class LoaderIter:
    """One pass of a CachedLoader over `source`. Its threads hold the
    Pipeline, not this object, so dropping the iterator (early break)
    closes them."""

    def __init__(self, loader: Any, state: LoaderState, source: BatchSource) -> None:
        # As DataLoader: the workers' seed drawn from torch's generator at
        # iter() (once, with persistent workers), the sampler's own draws at
        # the first next() (in this thread). The workers draw the same seed
        # again from the state this draw started from.
        self._loader = loader
        self._state = state
        if loader.persistent_workers and state.seed_state is not None:
            seed_state = state.seed_state
        else:
            gen = loader.generator
            if gen is not None and not isinstance(gen, torch.Generator):
                # DataLoader's draw fails on it so (TypeError naming
                # generator=), where get_state() would be an AttributeError.
                torch.empty((), dtype=torch.int64).random_(generator=gen)
            seed_state = (gen if gen is not None else torch.default_generator).get_state()
            torch.empty((), dtype=torch.int64).random_(generator=gen)
            if loader.persistent_workers:
                state.seed_state = seed_state
        self._seed_state = seed_state
        self._source = source
        self._pipe: Pipeline | None = None
        self._closed = False

    def __iter__(self) -> LoaderIter:
        return self

    def __next__(self) -> Any:
        if self._pipe is None:
            if self._closed:
                raise StopIteration
            first = next(self._source, None)
            self._pipe = Pipeline(self._loader, self._state, self._source, first,
                                  self._loader.workers_for_pass(self._seed_state))
        return self._pipe.next()

    def __len__(self) -> int:
        return len(self._loader)

    def close(self) -> None:
        """Stops the threads and worker processes; later next() ends."""
        self._closed = True
        if self._pipe is not None:
            self._pipe.close()

    def __del__(self) -> None:
        pipe = getattr(self, "_pipe", None)
        if pipe is not None:
            pipe.close()


class Pipeline:
    """The threads of one pass (see the module). `cond` guards the
    counters; `_draw` keeps draws from the source and batch numbers in
    order. A draw happens without `cond`: a source may block (an exchange
    round of all ranks, which may need this rank's consumer to move)."""

    def __init__(self, loader: Any, state: LoaderState, source: BatchSource,
                 first: Any, pool: Any) -> None:
        self.loader = loader
        self.state = state
        self.tuner = state.tuner
        self.auto = loader.batch_sampler is not None   # batches, not samples one by one
        self.turn = MissTurn()
        # The assembler calls back weakly: a cycle through it would keep the
        # pass, the loader, its buffers and persistent workers alive after
        # `del loader` until the cyclic collector ran, where DataLoader's
        # end at once.
        self.assembler = BatchAssembler(loader, state, pool, self.turn,
                                        _weakly(self._workers_busy, None),
                                        _weakly(self._threads, 1))
        self._draw = threading.Lock()
        self.cond = threading.Condition()
        self._source, self._first = source, first
        self.end = 0 if first is None else None   # batches in the pass, once known
        self.next_no = self.consumed = 0
        self.ready: dict[int, tuple[bool, Any, int]] = {}   # number -> (ok, batch or exception, bytes)
        self.live = 0
        self.threads: list[threading.Thread] = []
        self.stopped = False
        self.floor = 0     # threads and batches in flight once workers compute
        self._last: float | None = None       # when the previous batch was returned
        end_at_exit(self)
        # The pass's first batches (threads starting, the pipeline filling)
        # are no measure of its thread count.
        self.tuner.start_pass()
        with self.cond:
            self._spawn_locked()

    # ---- threads --------------------------------------------------------

    def _threads(self) -> int:
        return max(self.tuner.threads, self.floor)

    def started_threads(self) -> list[threading.Thread]:
        with self.cond:
            return list(self.threads)

    def _depth(self) -> int:
        # At least a batch per thread: a thread beyond the depth would only
        # wait, and the copy threads each batch gets (copy_threads) are
        # shared out by the threads, so it would leave CPUs unused.
        return max(self.tuner.prefetch, self.floor, self.tuner.threads)

    def _workers_busy(self) -> None:
        """Misses went to worker processes: keep every worker computing."""
        with self.cond:
            if not self.floor:
                self.floor = self.loader.prefetch_factor * self.loader.num_workers
                self._spawn_locked()
                self.cond.notify_all()

    def _spawn_locked(self) -> None:
        while self.live < self._threads() and not self.stopped and \
                (self.end is None or self.next_no < self.end):
            self.live += 1
            t = threading.Thread(target=self._run, daemon=True,
                                 name=f"shmcache-loader-{len(self.threads)}")
            self.threads.append(t)
            t.start()

    def _slot_locked(self) -> bool:
        """Waits until this thread may take the next batch; False when it
        should end instead."""
        while True:
            if self.stopped or self.live > self._threads():
                return False
            if self.end is not None and self.next_no >= self.end:
                return False
            if self.next_no < self.consumed + self._depth():
                return True
            # Held back by the prefetch depth: the tuner deepens it when
            # that kept the threads from a batch the consumer waited for.
            t0 = time.monotonic()
            self.cond.wait()
            self.tuner.held(time.monotonic() - t0)

    def _take(self) -> tuple[int, Any] | None:
        """(number, batch) of the next batch to assemble, or None when this
        thread should end. A source's exception is the batch's result and
        ends the pass."""
        with self._draw:
            with self.cond:
                if not self._slot_locked():
                    return None
                first, self._first = self._first, None
            try:
                item = first if first is not None else next(self._source, None)
            except BaseException as e:   # noqa: BLE001 -- raised to the consumer
                item = e
            with self.cond:
                if item is None:
                    self.end = self.next_no
                    self.cond.notify_all()
                    return None
                self.next_no += 1
                if isinstance(item, BaseException):
                    self.end = self.next_no
                    self.ready[self.next_no - 1] = (False, item, 0)
                    self.cond.notify_all()
                    self.turn.passed(self.next_no - 1)
                    # Its traceback holds this frame: no cycle through `item`.
                    del item
                    return None
                return self.next_no - 1, item

    def _run(self) -> None:
        # A torch section (_exit_threads): at the trainer's exit, once the
        # pass is stopped, the interpreter finalizes only after this
        # thread is out of torch (a thread that takes the GIL back inside a
        # torch call then aborts the process).
        with owned_section():
            self._assemble_batches()

    def _assemble_batches(self) -> None:
        while True:
            job = self._take()
            if job is None:
                with self.cond:
                    self.live -= 1
                    self.cond.notify_all()
                return
            number, item = job
            t0 = time.monotonic()
            report = BatchReport()
            result: tuple[bool, Any, int]
            try:
                ids = batch_ids(item.indices) if self.auto else [_row_id(item.indices)]
                ids = row_ids_from_end(ids, self.assembler.cds.dataset)
                batch, nbytes = self.assembler.assemble(number, ids, item, report)
                result = (True, batch, nbytes)
            except BaseException as e:   # noqa: BLE001 -- raised to the consumer
                result = (False, e, 0)
            finally:
                self.turn.passed(number)
                item.settle(report)
            self.state.count(busy_s=time.monotonic() - t0)
            with self.cond:
                if not self.stopped:
                    self.ready[number] = result
                self.cond.notify_all()
            # A failed batch's traceback holds this frame: a cycle through
            # `result` would keep the pass and the loader until the cyclic
            # collector runs.
            del result

    # ---- consumer -------------------------------------------------------

    def next(self) -> Any:
        t0 = time.monotonic()
        try:
            item = self._wait_batch()
        except RuntimeError:     # timed out: the pass ends here, promptly
            self.close()
            raise
        if item is None:
            ended = not self.stopped   # its source exhausted, not closed
            self.close()   # the pass ended: workers and threads go now
            if ended:
                # The rows it queued for the cache (num_workers=0's misses,
                # rows workers handed back) are stored before the pass
                # ends, as DataLoader's workers store theirs at their exit:
                # stats() and the next pass see them.
                self.loader.flush(PASS_FLUSH_S)
            raise StopIteration
        ok, batch, nbytes = item
        now = time.monotonic()
        waited, step = now - t0, now - (self._last or t0)
        self._last = now
        if not ok:
            # As DataLoader: this batch raises, the pass goes on (without a
            # cycle through this frame, which its traceback holds).
            try:
                raise batch
            finally:
                del batch, item
        self.state.count(batches=1, bytes=nbytes, wait_s=waited, step_s=step)
        if self.tuner.observe(waited, step, nbytes, self.state.counts["busy_s"],
                              self.live):
            with self.cond:
                self._spawn_locked()
                self.cond.notify_all()
        stage = self.assembler.stage
        return stage.finish(batch) if stage is not None else batch

    def _wait_batch(self) -> tuple[bool, Any, int] | None:
        """The next batch's (ok, batch or exception, bytes); None at the end.
        With a timeout, one deadline for the whole wait: the condition
        wakes whenever any batch is filed, and a wait restarted at each
        wake-up could last far beyond it."""
        timeout = self.loader.timeout or None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self.consumed not in self.ready:
                if self.stopped or (self.end is not None and self.consumed >= self.end):
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError(f"DataLoader timed out after {self.loader.timeout} "
                                       f"seconds (CachedLoader, waiting for batch "
                                       f"{self.consumed})")
                self.cond.wait(left)
            item = self.ready.pop(self.consumed)
            self.consumed += 1
            self.cond.notify_all()
            return item

    def close(self) -> None:
        with self.cond:
            if self.stopped:
                return
            self.stopped = True
            self.cond.notify_all()
            threads = list(self.threads)
        # A thread reaching a compute after this gets Closed.
        self.turn.close()
        self.assembler.close()
        # Threads between rows end at once; one computing a row ends after
        # it (nothing new starts: stopped is set), without holding us here.
        me = threading.current_thread()
        deadline = time.monotonic() + _JOIN_S
        for t in threads:
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))
        with self.cond:
            self.ready.clear()

    stop = close   # the exit hook's (_exit_threads): bounded, _JOIN_S


def _weakly(method: Callable[[], Any], gone: Any) -> Callable[[], Any]:
    """`method` of an object not kept alive by the callable (`gone` once
    the object is)."""
    ref = weakref.WeakMethod(method)

    def call() -> Any:
        bound = ref()
        return gone if bound is None else bound()
    return call


def _row_id(index: Any) -> int:
    """A sampler's element as a row id (batch_size=None: one per batch)."""
    try:
        return operator.index(index)
    except TypeError:
        raise TypeError(f"CachedLoader with batch_size=None reads one row per sampler "
                        f"element, and rows are keyed by integer index: got "
                        f"{type(index).__name__} {index!r}") from None
