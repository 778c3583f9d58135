"""CachedLoader: a batch loader that reads hits straight from the cache into
preallocated batch tensors, in threads of the trainer's process.

    from shmcache.torch import CachedDataset, CachedLoader
    loader = CachedLoader(CachedDataset(ds, cache), batch_size=64, shuffle=True,
                          num_workers=2)      # was: DataLoader(CachedDataset(...))

Contract:
- Batches are what DataLoader(CachedDataset(...)) yields with the same
  arguments (default_collate or collate_fn: same types, shapes, dtypes and
  values), in the batch sampler's order; the sampler is iterated as
  DataLoader iterates it (the workers' seed drawn from torch's generator at
  iter(), the sampler started at the first next(), in the consumer's
  thread), so shuffles match under the same torch.manual_seed.
- Rows of one fixed layout (a tuple/dict/array of fixed-shape columns)
  are read by DatasetCache.read_into (native threads, GIL released) into
  the batch's tensors, `prefetch` batches ahead of the consumer, by
  `num_threads` threads. No worker process and no pickling on a hit.
  Rows the cache spilled to disk are hits too: the same read_into reads
  them from the spill database in this process (with the batch's
  in-memory rows), so the next batches' disk reads overlap the trainer's
  work on this one.
- Misses are computed by shmcache.misses: with num_workers > 0 by the
  workers of a DataLoader over the missing indices (DataLoader's seeding
  from the pass's seed, worker_init_fn, multiprocessing_context, timeout=,
  errors), which put them into the cache themselves; the loader then reads
  them like hits, and only rows the cache did not take come back pickled
  (and are queued for the cache once more by the trainer's process, whose
  cache warns once when it stopped taking rows). With num_workers=0 misses
  are computed in the loader's threads, one at a time, and queued like
  CachedDataset's misses. Either way they land in the same batch positions.
  A sample with no column encoding is delivered as the dataset made it
  (one CacheWarning). Rows of another layout (variable shapes, bytes) go
  through collate of the samples, as in DataLoader.
- Indices from the sampler may be ints or tensors (0-d, or a batch as one
  index tensor).
- CachedDataset's transforms (apply_transforms) and transform= run per
  sample in the loader's threads; batch_transform= on each whole batch.
- num_threads / prefetch "auto": tuned while running (shmcache.autotune),
  prefetch bounded by max_prefetch_bytes of batches; stats() reports.
- pin_memory / device: pinned batch buffers and a copy to the device on a
  side stream where CUDA is available; pin_memory=True without CUDA warns
  once (as DataLoader) and goes on unpinned; device="cuda" without CUDA
  raises RuntimeError ("CUDA is not available: ..."); "cpu" is accepted.
- An iterator that is exhausted, closed (close()) or garbage-collected
  (early break) stops its threads and worker processes and drops its
  prefetched batches, without waiting for a row in flight (the thread or
  worker computing it ends after it; nothing new starts). The loader keeps
  the buffers of at most prefetch + num_threads + 2 batches for reuse by
  later batches and passes (freed with the loader); a buffer is reused only once no tensor
  over it is alive. A cache whose daemon dies degrades to misses (one
  CacheWarning from the cache), so the epoch finishes from the source.
"""

from __future__ import annotations

import operator
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler, default_collate

from . import DatasetCache
from .autotune import AutoTune
from .batch_read import (BufferPool, RowSchema, decode_sample, project, read_into,
                         read_rows)
from .datasets import CachedDataset
from .misses import Closed, Columns, MissWorkers, Sample, Stored, compute_rows
from .rows import encode

__all__ = ["CachedLoader"]

DEFAULT_THREADS = 2
DEFAULT_PREFETCH = 4
DEFAULT_PREFETCH_BYTES = 1 << 30
_JOIN_S = 0.5      # close() waits this long for idle threads, never for busy ones

T_co = TypeVar("T_co", covariant=True)


def _setting(name, value, default):
    """(value, auto) of a num_threads / prefetch argument."""
    if value == "auto":
        return default, True
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} is \"auto\" or an int >= 1, got {value!r}")
    return value, False


def _device(device, pin_memory):
    """The torch.device batches go to (None: stay on the CPU); raises when
    the options need CUDA and there is none."""
    if not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory must be True or False, got {pin_memory!r}")
    dev = None if device is None else torch.device(device)
    if dev is not None and dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(dev)!r} is not supported: use 'cpu' or 'cuda'")
    if not torch.cuda.is_available():
        if pin_memory:
            # As DataLoader: a warning, and batches in ordinary memory.
            warnings.warn("'pin_memory' argument is set as true but CUDA is not "
                          "available, so pinned memory won't be used", stacklevel=3)
        if dev is not None and dev.type == "cuda":
            raise RuntimeError(f"CUDA is not available: device={str(dev)!r} cannot "
                               "receive batches; pass device=None or 'cpu'")
    return None if dev is None or dev.type == "cpu" else dev


def _tree_map(fn, batch):
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: _tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_tree_map(fn, v) for v in batch)
    return batch


class CachedLoader(DataLoader[T_co]):
    """A torch DataLoader whose batches come from the cache: DataLoader's
    arguments, in its order and with its defaults (checked as DataLoader
    checks them, with its errors and warnings; fixed after construction as
    DataLoader's are), then the loader's own options by keyword. See the
    module for the contract.

    dataset: a shmcache.torch.CachedDataset, or a map-style dataset to wrap
      in CachedDataset(dataset, cache, name=name, allow_random=...).
    batch_size, shuffle, sampler, batch_sampler, drop_last, generator:
      DataLoader's batches, drawn as DataLoader draws them; batch_size=None
      delivers samples one by one (collate_fn default_convert).
    collate_fn: as DataLoader's (rows of one fixed layout under
      default_collate are read straight into the batch's tensors).
    num_workers: DataLoader worker processes computing misses (0: in the
      loader's threads, in batch order); batch k's misses go to worker
      k mod num_workers. worker_init_fn, multiprocessing_context: as
      DataLoader's, in those workers (get_worker_info().dataset is the
      user's dataset, the one that computes samples).
    prefetch_factor: batches of misses in flight per worker on a cold pass
      (as DataLoader's); persistent_workers: keep the workers from one pass
      to the next (started at the first miss, seeded once).
    timeout: seconds next() waits for a batch before RuntimeError
      ("DataLoader timed out after ... seconds").
    pin_memory: pinned batches with CUDA (without it: one warning, as
      DataLoader); pin_memory_device: accepted (pinned memory is CUDA's).
    num_threads, prefetch: threads assembling batches and batches kept
      ready ahead of the consumer; "auto" (default) tunes them at run time.
    max_prefetch_bytes: the bound on prefetched batches' memory (auto).
    transform, batch_transform: run per sample after the cache, and per
      batch. device: "cuda" copies batches to the GPU on a side stream.
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1,
                 shuffle: bool | None = None, sampler: Sampler[Any] | Iterable[Any] | None = None,
                 batch_sampler: Sampler[Sequence[Any]] | Iterable[Sequence[Any]] | None = None,
                 num_workers: int = 0,
                 collate_fn: Callable[[list[Any]], Any] | None = None,
                 pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None,
                 generator: torch.Generator | None = None, *,
                 prefetch_factor: int = 2, persistent_workers: bool = False,
                 pin_memory_device: str = "",
                 cache: DatasetCache | None = None,
                 prefetch: int | Literal["auto"] = "auto",
                 num_threads: int | Literal["auto"] = "auto",
                 transform: Callable[[Any], Any] | None = None,
                 batch_transform: Callable[[Any], Any] | None = None,
                 device: str | torch.device | None = None,
                 max_prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
                 name: str | None = None, allow_random: bool = False) -> None:
        if not isinstance(dataset, CachedDataset):
            if not isinstance(cache, DatasetCache):
                raise TypeError("CachedLoader needs a CachedDataset, or a dataset and "
                                "cache=shmcache.DatasetCache(...)")
            dataset = CachedDataset(dataset, cache, name=name, allow_random=allow_random)
        elif cache is not None:
            raise ValueError("cache= is for a plain dataset; this CachedDataset "
                             "already has its cache")
        super().__init__(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                         collate_fn, pin_memory, drop_last, timeout, worker_init_fn,
                         multiprocessing_context, generator, prefetch_factor=prefetch_factor,
                         persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device)
        self.batch_transform = batch_transform
        self.transform = self._sample_transform(
            None if _plain(dataset) else dataset.apply_transforms, transform)
        self.device = _device(device, pin_memory)
        self._pin = bool(pin_memory) and torch.cuda.is_available()
        threads, auto_t = _setting("num_threads", num_threads, DEFAULT_THREADS)
        depth, auto_p = _setting("prefetch", prefetch, DEFAULT_PREFETCH)
        self._tuner = AutoTune(threads, depth, auto_t, auto_p,
                               max_threads=max(DEFAULT_THREADS, 2 * _cpus()),
                               max_bytes=max_prefetch_bytes)
        self._schema: Any = None     # RowSchema, None (not seen yet), False (none)
        # Buffers of batches in flight, prefetched, and held by the consumer,
        # reused across passes (fresh memory costs more than the copy).
        self._buffers = BufferPool(lambda: self._tuner.prefetch + self._tuner.threads + 2)
        self._lock = threading.Lock()
        self._counts: dict[str, float] = dict(
            batches=0, samples=0, hits=0, misses=0, bytes=0, wait_s=0.0, step_s=0.0,
            busy_s=0.0)
        # persistent_workers: the pool kept across passes, and the state of
        # the generator its seed was drawn from (drawn at the first iter()
        # only, as DataLoader's persistent iterator draws it).
        self._pool: MissWorkers | None = None
        self._seed_state: torch.Tensor | None = None
        self._iters = 0

    @staticmethod
    def _sample_transform(first, second):
        if first is None or second is None:
            return first or second
        return lambda sample: second(first(sample))

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._get_iterator()

    def _get_iterator(self) -> Any:
        # As DataLoader: the warning about more workers than CPUs at every
        # iter(), once with persistent workers.
        if self.num_workers > 0 and not (self.persistent_workers and self._iters):
            self.check_worker_number_rationality()
        self._iters += 1
        return _LoaderIter(self)

    def _workers_for_pass(self, seed_state: torch.Tensor) -> MissWorkers | None:
        """The pool a pass computes misses with: its own, or with
        persistent_workers the loader's (a failed one is replaced)."""
        if self.num_workers == 0:
            return None
        if not self.persistent_workers:
            return MissWorkers(self.dataset, self.num_workers, self.multiprocessing_context,
                               seed_state, self.worker_init_fn)
        with self._lock:
            if self._pool is None or self._pool.broken:
                self._pool = MissWorkers(self.dataset, self.num_workers,
                                         self.multiprocessing_context, seed_state,
                                         self.worker_init_fn)
                weakref.finalize(self, self._pool.close)
            return self._pool

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until the rows this process queued for the cache are stored
        (CachedDataset.flush)."""
        cds: Any = self.dataset
        return cds.flush(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters since the loader was made (all its iterators) and the
        current settings: batches, samples, hits, misses, hit_rate, bytes
        (of batches delivered), bytes_per_s (over the consumer's steps),
        wait_s and wait_fraction (the consumer waiting for batches), busy_s
        (the loader threads assembling batches),
        num_threads, prefetch, auto_threads, auto_prefetch, tuning_changes."""
        with self._lock:
            c: dict[str, Any] = dict(self._counts)
        t = self._tuner
        seen = c["hits"] + c["misses"]
        c.update(hit_rate=c["hits"] / seen if seen else 0.0,
                 bytes_per_s=c["bytes"] / c["step_s"] if c["step_s"] else 0.0,
                 wait_fraction=c["wait_s"] / c["step_s"] if c["step_s"] else 0.0,
                 num_threads=t.threads, prefetch=t.prefetch,
                 auto_threads=t.auto_threads, auto_prefetch=t.auto_prefetch,
                 tuning_changes=t.changes)
        return c

    def _count(self, **delta):
        with self._lock:
            for k, v in delta.items():
                self._counts[k] += v


def _plain(cds):
    """True when the CachedDataset applies no transform of its own."""
    return all(getattr(cds, a, None) is None
               for a in ("transform", "target_transform", "transforms"))


def batch_ids(indices):
    """A batch sampler's batch (ints, 0-d tensors, an index tensor) as ints."""
    if isinstance(indices, torch.Tensor):
        return [int(i) for i in indices.reshape(-1).tolist()]
    return [int(i) for i in indices]


def _row_id(index):
    """A sampler's element as a row id (batch_size=None: one per batch)."""
    try:
        return operator.index(index)
    except TypeError:
        raise TypeError(f"CachedLoader with batch_size=None reads one row per sampler "
                        f"element, and rows are keyed by integer index: got "
                        f"{type(index).__name__} {index!r}") from None


def _cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


class _LoaderIter:
    """One pass over the batch sampler. Its threads hold the _Pipeline, not
    this object, so dropping the iterator (early break) closes them.

    source: the pass's batches from a feed instead of the batch sampler
    (PartitionedLoader's WindowFeed): items with `indices` and `rows`
    ({index: row} to take where the cache misses), `owned(index)` (whether
    a miss is put into this cache; if not, it goes back through `note`),
    `note(...)` and `settle()`, called once per item taken, done or not."""

    def __init__(self, loader, source=None):
        # As DataLoader: the workers' seed drawn from torch's generator at
        # iter() (once, with persistent workers), the sampler's own draws at
        # the first next() (in this thread). The pool draws the same seed
        # again from the state the draw started from.
        self._loader = loader
        if loader.persistent_workers and loader._seed_state is not None:
            state = loader._seed_state
        else:
            gen = loader.generator
            state = (gen if gen is not None else torch.default_generator).get_state()
            torch.empty((), dtype=torch.int64).random_(generator=gen)
            if loader.persistent_workers:
                loader._seed_state = state
        self._seed_state = state
        self._fed = source is not None
        self._batches = iter(loader._index_sampler) if source is None else source
        self._pipe = None
        self._closed = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._pipe is None:
            if self._closed:
                raise StopIteration
            first = next(self._batches, _END)
            self._pipe = _Pipeline(self._loader, self._batches, first,
                                   self._loader._workers_for_pass(self._seed_state),
                                   self._fed)
        return self._pipe.next()

    def __len__(self):
        return len(self._loader)

    def close(self):
        """Stops the threads and worker processes; later next() ends."""
        self._closed = True
        if self._pipe is not None:
            self._pipe.close()

    def __del__(self):
        pipe = getattr(self, "_pipe", None)
        if pipe is not None:
            pipe.close()


_END = object()   # the sampler's end


class _Pipeline:
    """The threads of one pass: each takes the next batch number and its
    indices from the sampler (at most `prefetch` batches ahead of the
    consumer), assembles the batch, and files it under its number (the
    batch, or the exception that failed it); the consumer takes batches in
    number order. `cond` guards the counters.

    Misses leave in batch order (the miss turn): batch k hands its misses
    to worker k mod num_workers (or computes them, num_workers=0) only
    after every batch before it has, so each worker computes its batches in
    DataLoader's order and the random draws of a dataset follow it. Once
    misses went to workers, at least prefetch_factor * num_workers batches
    are in flight (threads and depth), so that every worker computes at
    once on a cold pass."""

    def __init__(self, loader, batches, first, pool, fed=False):
        self.loader = loader
        self.fed = fed          # batches from a feed: items, drawn without `cond`
        self.auto = loader._auto_collation
        self._draw = threading.Lock()
        self.cds = loader.dataset
        self.tuner = loader._tuner
        self.pin = loader._pin or loader.device is not None
        self.stage = _CudaStage(loader.device) if loader.device is not None else None
        self.pool = pool
        self._own_pool = pool is not None and not loader.persistent_workers
        self._inline = threading.Lock()   # rows gone since a worker stored them
        self.buffers = loader._buffers
        self.cond = threading.Condition()
        self._batches, self._first = batches, first
        self.end = 0 if first is _END else None   # batches in the pass, once known
        self.next_no = self.consumed = 0
        self.ready = {}         # batch number -> (ok, batch or exception, bytes)
        self.live = 0
        self.threads = []
        self.stopped = False
        self.floor = 0          # threads and depth while workers compute misses
        self._tickets: weakref.WeakSet[Any] = weakref.WeakSet()   # sent to a shared pool
        self._turn = 0          # the next batch whose misses may go out
        self._passed = set()    # batches past the turn, ahead of it
        self._last = None       # when the previous batch was returned
        with self.cond:
            self._spawn_locked()

    # ---- threads --------------------------------------------------------

    def _threads(self):
        return max(self.tuner.threads, self.floor)

    def _depth(self):
        return max(self.tuner.prefetch, self.floor)

    def _spawn_locked(self):
        while self.live < self._threads() and not self.stopped and \
                (self.end is None or self.next_no < self.end):
            self.live += 1
            t = threading.Thread(target=self._run, daemon=True,
                                 name=f"shmcache-loader-{len(self.threads)}")
            self.threads.append(t)
            t.start()

    def _slot_locked(self):
        """Waits until this thread may take the next batch; False when it
        should end instead."""
        while True:
            if self.stopped or self.live > self._threads():
                return False
            if self.end is not None and self.next_no >= self.end:
                return False
            if self.next_no < self.consumed + self._depth():
                return True
            self.cond.wait()

    def _take_locked(self):
        """(number, indices) of the next batch to assemble, or None when
        this thread should end. A sampler's exception is the batch's
        result, and the pass's last."""
        if not self._slot_locked():
            return None
        if self._first is not _END and self._first is not None:
            indices, self._first = self._first, None
        else:
            try:
                indices = next(self._batches, _END)
            except BaseException as e:   # noqa: BLE001 -- raised to the consumer
                self._file_error_locked(e)
                return None
            if indices is _END:
                self.end = self.next_no
                self.cond.notify_all()
                return None
        self.next_no += 1
        return self.next_no - 1, indices

    def _file_error_locked(self, e):
        self.next_no += 1
        self.end = self.next_no
        self.ready[self.next_no - 1] = (False, e, 0)
        self._passed.add(self.next_no - 1)
        self._advance_turn_locked()
        self.cond.notify_all()

    def _take_fed(self):
        """As _take_locked, from a feed: the next item may wait for an
        exchange round of all ranks, so it is drawn without holding `cond`
        (the consumer and the other threads go on meanwhile; the other
        ranks' rounds may need this rank's consumer to move), `_draw`
        keeping draws and numbers in order. A feed's exception is the
        batch's result."""
        with self._draw:
            with self.cond:
                if not self._slot_locked():
                    return None
                first, self._first = self._first, None
            try:
                item = first if first is not None and first is not _END \
                    else next(self._batches, None)
            except BaseException as e:   # noqa: BLE001 -- raised to the consumer
                item = e
            with self.cond:
                if item is None:
                    self.end = self.next_no
                    self.cond.notify_all()
                    return None
                if isinstance(item, BaseException):
                    self._file_error_locked(item)
                    return None
                self.next_no += 1
                return self.next_no - 1, item

    def _run(self):
        while True:
            job = self._take_fed() if self.fed else None
            with self.cond:
                if not self.fed:
                    job = self._take_locked()
                if job is None:
                    self.live -= 1
                    self.cond.notify_all()
                    return
            no = job[0]
            t0 = time.monotonic()
            try:
                if self.fed:
                    batch, nbytes = self._assemble(no, batch_ids(job[1].indices), job[1])
                elif self.auto:
                    batch, nbytes = self._assemble(no, batch_ids(job[1]))
                else:
                    batch, nbytes = self._assemble(no, [_row_id(job[1])])
                result = (True, batch, nbytes)
            except BaseException as e:   # noqa: BLE001 -- raised to the consumer
                result = (False, e, 0)
            finally:
                self._pass_turn(no)
                if self.fed:
                    job[1].settle()
            self.loader._count(busy_s=time.monotonic() - t0)
            with self.cond:
                if not self.stopped:
                    self.ready[no] = result
                self.cond.notify_all()

    # ---- the miss turn --------------------------------------------------

    def _advance_turn_locked(self):
        while self._turn in self._passed:
            self._passed.discard(self._turn)
            self._turn += 1
        self.cond.notify_all()

    def _pass_turn(self, no):
        """Batch `no` is past the turn (its misses left, or it had none)."""
        with self.cond:
            if no >= self._turn:
                self._passed.add(no)
                self._advance_turn_locked()

    def _wait_turn(self, no):
        with self.cond:
            while self._turn != no and not self.stopped:
                self.cond.wait()
            if self.stopped:
                raise Closed("the CachedLoader iterator was closed")

    # ---- consumer -------------------------------------------------------

    def next(self):
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
            # As DataLoader: this batch raises, the pass goes on.
            raise batch
        self.loader._count(batches=1, bytes=nbytes, wait_s=waited, step_s=step)
        if self.tuner.observe(waited, step, nbytes, self.loader._counts["busy_s"],
                              self.live):
            with self.cond:
                self._spawn_locked()
                self.cond.notify_all()
        return self.stage.finish(batch) if self.stage is not None else batch

    def _wait_batch(self):
        """The next batch's (ok, batch or exception, bytes); None at the end."""
        timeout = self.loader.timeout or None
        with self.cond:
            while self.consumed not in self.ready:
                if self.stopped or (self.end is not None and self.consumed >= self.end):
                    return None
                if not self.cond.wait(timeout) and timeout:
                    raise RuntimeError(f"DataLoader timed out after {self.loader.timeout} "
                                       f"seconds (CachedLoader, waiting for batch "
                                       f"{self.consumed})")
            item = self.ready.pop(self.consumed)
            self.consumed += 1
            self.cond.notify_all()
            return item

    def close(self):
        with self.cond:
            if self.stopped:
                return
            self.stopped = True
            self.cond.notify_all()
            threads = list(self.threads)
        if self.pool is not None:
            if self._own_pool:
                self.pool.close()    # a thread waiting for its rows gets Closed
            else:
                self.pool.cancel(self._tickets)
        # Threads between rows end at once; one computing a row ends after
        # it (nothing new starts: stopped is set), without holding us here.
        me = threading.current_thread()
        deadline = time.monotonic() + _JOIN_S
        for t in threads:
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))
        with self.cond:
            self.ready.clear()

    # ---- one batch ------------------------------------------------------

    def _assemble(self, no, indices, fed=None):
        """(batch, bytes) of batch number `no`: see the module's contract;
        `fed`: the batch's item from a feed (see _LoaderIter)."""
        n, columns = len(indices), self.cds.columns
        schema = self.loader._schema
        bufs, filled = None, np.zeros(n, dtype=bool)
        if schema:
            bufs = schema.alloc(n, self.pin, self.buffers)
            filled = read_into(self.cds.cache, indices, schema.read_targets(bufs),
                               columns)
        rest = np.flatnonzero(~filled).tolist()
        if not rest:
            self._pass_turn(no)
        if fed is not None:
            fed.note(local_hits=n - len(rest))
        rows = dict(zip(rest, self._rows(no, [indices[p] for p in rest], fed))) \
            if rest else {}
        self.loader._count(samples=n, hits=n - len(rest))
        if schema is None and rows:
            schema = False if isinstance(rows[0], Sample) else self._learn(rows[0])
            bufs = schema.alloc(n, self.pin, self.buffers) if schema else None
        direct = False   # the batch is the buffers (pinned when asked)
        if schema and all(not isinstance(r, Sample) and schema.fits(r)
                          for r in rows.values()):
            for p, r in rows.items():
                schema.fill(bufs, p, r)
            tensors = schema.tensors(bufs)
            direct = self.auto and self.loader.transform is None and \
                self.loader.collate_fn is default_collate
            batch = schema.batch(tensors) if direct else \
                self._collate([schema.sample(tensors, p) for p in range(n)])
        else:
            if schema is not None:
                self.loader._schema = False   # rows of several layouts: collate
            tensors = schema.tensors(bufs) if schema and filled.any() else None
            batch = self._collate([schema.sample(tensors, p) if filled[p]
                                   else rows[p].sample if isinstance(rows[p], Sample)
                                   else decode_sample(rows[p], columns)
                                   for p in range(n)])
        if self.loader.batch_transform is not None:
            batch = self.loader.batch_transform(batch)
        nbytes = schema.nbytes(n) if schema else 0
        if self.pin and not (direct and self.loader.batch_transform is None):
            batch = _tree_map(lambda t: t.pin_memory(), batch)
        if self.stage is not None:
            batch = self.stage.stage(batch)
        return batch, nbytes

    def _learn(self, cols):
        schema = RowSchema.of(cols, self.cds.columns) or False
        if self.loader._schema is None:
            self.loader._schema = schema
        return schema

    def _rows(self, no, ids, fed=None):
        """Per id the row's [(name, dtype, array)] from the cache (copies),
        else from `fed`'s rows, else computed (and queued for the cache, or
        with `fed` handed back when another node owns it), or a Sample the
        cache cannot hold. Batch `no` computes in its miss turn."""
        rows: list[Any] = read_rows(self.cds.cache, ids, self.cds.columns, copy=True)
        missing = [k for k, r in enumerate(rows) if r is None]
        owned = None
        if fed is not None:
            local = len(ids) - len(missing)
            for k in missing:
                r = fed.rows.get(ids[k])
                if r is not None:
                    rows[k] = project(encode(r), self.cds.columns)
            missing = [k for k in missing if rows[k] is None]
            owned = [fed.owned(ids[k]) for k in missing]
            fed.note(local_hits=local, remote_hits=len(ids) - len(missing) - local,
                     misses=len(missing))
        self.loader._count(hits=len(ids) - len(missing), misses=len(missing))
        if not missing:
            self._pass_turn(no)
            return rows
        computed = self._compute(no, [ids[k] for k in missing], owned)
        stored = []     # rows a worker put into the cache
        pushes = []     # rows of another node (fed)
        for j, (k, row) in enumerate(zip(missing, computed)):
            if isinstance(row, Stored):
                stored.append(k)
            elif isinstance(row, Columns):
                if owned is None or owned[j]:
                    self.cds._store(ids[k], row.cols)
                else:
                    pushes.append((ids[k], row.cols))
                rows[k] = project(row.cols, self.cds.columns)
            else:
                self.cds._uncacheable(ids[k], row.why)
                rows[k] = Sample(self.cds._project(row.sample), row.why)
        if pushes:
            fed.note(pushes=pushes)
        if stored:
            again = read_rows(self.cds.cache, [ids[k] for k in stored],
                              self.cds.columns, copy=True)
            gone = [k for k, cols in zip(stored, again) if cols is None]
            for k, cols in zip(stored, again):
                rows[k] = cols
            if gone:
                # Rows gone since (their session dropped): computed again.
                with self._inline:
                    redone = compute_rows(self.cds, [ids[k] for k in gone],
                                          lambda: self.stopped)
                for k, row in zip(gone, redone):
                    rows[k] = project(row.cols, self.cds.columns) \
                        if isinstance(row, Columns) else \
                        Sample(self.cds._project(row.sample), row.why)
        return rows

    def _compute(self, no, ids, owned=None):
        """The rows of `ids`, batch `no`'s misses: sent to worker
        no mod num_workers in the miss turn and waited for, or (no workers)
        computed here in the miss turn. Closed once the pass is closed:
        nothing is computed in this process after close()."""
        self._wait_turn(no)
        try:
            if self.pool is None:
                return compute_rows(self.cds, ids, lambda: self.stopped)
            ticket = self.pool.submit(no, ids, owned)
            if not self._own_pool:
                self._tickets.add(ticket)
        finally:
            self._pass_turn(no)
        if not self.floor:
            with self.cond:
                self.floor = self.loader.prefetch_factor * self.loader.num_workers
                self._spawn_locked()
                self.cond.notify_all()
        return ticket.result()

    def _collate(self, samples):
        if self.loader.transform is not None:
            samples = [self.loader.transform(s) for s in samples]
        if not self.auto:
            return self.loader.collate_fn(samples[0])
        return self.loader.collate_fn(samples)


class _CudaStage:
    """Copies batches to a CUDA device on a side stream in the loader's
    threads; the consumer's stream waits for the copy (data sinking)."""

    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def stage(self, batch):
        with torch.cuda.stream(self.stream):
            gpu = _tree_map(lambda t: t.to(self.device, non_blocking=True), batch)
            event = torch.cuda.Event()
            event.record(self.stream)
        return gpu, event

    def finish(self, staged):
        gpu, event = staged
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)

        def keep(t):
            t.record_stream(current)
            return t
        return _tree_map(keep, gpu)

