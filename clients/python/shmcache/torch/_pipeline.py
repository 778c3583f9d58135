"""The threads of a CachedLoader pass: LoaderIter (the iterator a pass
returns) and Pipeline (its threads), with LoaderState, what the loader keeps
across passes.

Each of the pass's threads takes the next batch number and its batch from
the pass's BatchSource (at most `prefetch` batches ahead of the consumer),
assembles it (BatchAssembler), settles it with the source, and files the
result under its number; the consumer takes the results in number order
and raises a failed batch's exception in its place. The tuner
(_autotune.py) may add threads between batches.

Ending: an exhausted source, a failed batch, a timeout, close() or the
iterator's garbage collection (an early break) stop the threads and the
miss workers without waiting for a row in flight: a thread between batches
ends at once; one computing a row ends after it (nothing new starts).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from ._assemble import BatchAssembler
from ._autotune import AutoTune
from ._row_schema import BufferPool
from .batch_source import BatchReport, BatchSource, batch_ids

__all__ = ["LoaderState", "LoaderIter"]

_JOIN_S = 0.5      # close() waits this long for idle threads, never for busy ones


class LoaderState:
    """What a CachedLoader keeps across its passes: the tuner, the row
    layout learned from the first row (a RowSchema; None: not seen yet;
    False: rows go through collate), the batch buffers reused by later
    batches and passes, and the counters (guarded by a lock)."""

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
        # As DataLoader: the workers' seed from torch's generator at iter(),
        # the sampler's own draws at the first next() (in this thread).
        self._loader = loader
        self._state = state
        self._base_seed = int(torch.empty((), dtype=torch.int64).random_(
            generator=loader.generator).item())
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
                                  self._base_seed)
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
                 first: Any, base_seed: int) -> None:
        self.loader = loader
        self.state = state
        self.tuner = state.tuner
        self.assembler = BatchAssembler(loader, state, base_seed)
        self._draw = threading.Lock()
        self.cond = threading.Condition()
        self._source, self._first = source, first
        self.end = 0 if first is None else None   # batches in the pass, once known
        self.next_no = self.consumed = 0
        self.ready: dict[int, tuple[bool, Any, int]] = {}   # number -> (ok, batch or exception, bytes)
        self.live = 0
        self.threads: list[threading.Thread] = []
        self.stopped = False
        self._last: float | None = None       # when the previous batch was returned
        with self.cond:
            self._spawn_locked()

    # ---- threads --------------------------------------------------------

    def _spawn_locked(self) -> None:
        while self.live < self.tuner.threads and not self.stopped and \
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
            if self.stopped or self.live > self.tuner.threads:
                return False
            if self.end is not None and self.next_no >= self.end:
                return False
            if self.next_no < self.consumed + self.tuner.prefetch:
                return True
            self.cond.wait()

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
                    return None
                return self.next_no - 1, item

    def _run(self) -> None:
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
                batch, nbytes = self.assembler.assemble(batch_ids(item.indices), item,
                                                        report)
                result = (True, batch, nbytes)
            except BaseException as e:   # noqa: BLE001 -- raised to the consumer
                result = (False, e, 0)
            finally:
                item.settle(report)
            self.state.count(busy_s=time.monotonic() - t0)
            with self.cond:
                if not self.stopped:
                    self.ready[number] = result
                self.cond.notify_all()

    # ---- consumer -------------------------------------------------------

    def next(self) -> Any:
        t0 = time.monotonic()
        try:
            item = self._wait_batch()
        except RuntimeError:     # timed out: the pass ends here, promptly
            self.close()
            raise
        if item is None:
            self.close()   # the pass ended: workers and threads go now
            raise StopIteration
        ok, batch, nbytes = item
        now = time.monotonic()
        waited, step = now - t0, now - (self._last or t0)
        self._last = now
        if not ok:
            self.close()
            raise batch
        self.state.count(batches=1, bytes=nbytes, wait_s=waited, step_s=step)
        if self.tuner.observe(waited, step, nbytes, self.state.counts["busy_s"],
                              self.live):
            with self.cond:
                self._spawn_locked()
                self.cond.notify_all()
        stage = self.assembler.stage
        return stage.finish(batch) if stage is not None else batch

    def _wait_batch(self) -> tuple[bool, Any, int] | None:
        """The next batch's (ok, batch or exception, bytes); None at the end."""
        timeout = self.loader.timeout or None
        with self.cond:
            while self.consumed not in self.ready:
                if self.stopped or (self.end is not None and self.consumed >= self.end):
                    return None
                if not self.cond.wait(timeout) and timeout:
                    raise RuntimeError(f"CachedLoader timed out after {timeout} "
                                       "seconds waiting for a batch")
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
