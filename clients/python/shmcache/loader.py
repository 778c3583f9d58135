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

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import (BatchSampler, RandomSampler, SequentialSampler,
                              default_collate)

from . import DatasetCache
from .autotune import AutoTune
from .batch_read import (BufferPool, RowSchema, decode_sample, project, read_into,
                         read_rows)
from .datasets import CachedDataset
from .misses import Closed, Columns, MissWorkers, Sample, Stored, compute_rows

__all__ = ["CachedLoader"]

DEFAULT_THREADS = 2
DEFAULT_PREFETCH = 4
DEFAULT_PREFETCH_BYTES = 1 << 30
_JOIN_S = 0.5      # close() waits this long for idle threads, never for busy ones


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


class CachedLoader:
    """DataLoader's arguments, in its order (`cache` and the loader's own
    options by keyword); see the module for the contract.

    dataset: a shmcache.torch.CachedDataset, or a map-style dataset to wrap
      in CachedDataset(dataset, cache, name=name, allow_random=...).
    num_workers: processes computing misses (0: in the loader's threads).
    num_threads, prefetch: threads assembling batches and batches kept
      ready ahead of the consumer; "auto" (default) tunes them at run time.
    max_prefetch_bytes: the bound on prefetched batches' memory (auto).
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1,
                 shuffle: bool | None = None, sampler: Iterable[int] | None = None,
                 batch_sampler: Iterable[list[int]] | None = None,
                 num_workers: int = 0,
                 collate_fn: Callable[[list[Any]], Any] | None = None,
                 pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None,
                 generator: torch.Generator | None = None, *,
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
        if batch_size is None:
            raise ValueError("batch_size=None (no batching) is not supported: use "
                             "DataLoader(CachedDataset(...)) for single samples")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) \
                or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        self.dataset = dataset
        self.batch_sampler = _batch_sampler(dataset, batch_size, shuffle, sampler,
                                            batch_sampler, drop_last, generator)
        self.sampler = getattr(self.batch_sampler, "sampler", None)
        self.batch_size = None if batch_sampler is not None else batch_size
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.batch_transform = batch_transform
        self.transform = self._sample_transform(
            None if _plain(dataset) else dataset.apply_transforms, transform)
        self.device = _device(device, pin_memory)
        self.pin_memory = pin_memory and torch.cuda.is_available()
        threads, auto_t = _setting("num_threads", num_threads, DEFAULT_THREADS)
        depth, auto_p = _setting("prefetch", prefetch, DEFAULT_PREFETCH)
        self._tuner = AutoTune(threads, depth, auto_t, auto_p,
                               max_threads=max(DEFAULT_THREADS, 2 * _cpus()),
                               max_bytes=max_prefetch_bytes)
        self._schema = None          # RowSchema, None (not seen yet), False (none)
        # Buffers of batches in flight, prefetched, and held by the consumer,
        # reused across passes (fresh memory costs more than the copy).
        self._buffers = BufferPool(lambda: self._tuner.prefetch + self._tuner.threads + 2)
        self._lock = threading.Lock()
        self._counts: dict[str, float] = dict(
            batches=0, samples=0, hits=0, misses=0, bytes=0, wait_s=0.0, step_s=0.0,
            busy_s=0.0)

    @staticmethod
    def _sample_transform(first, second):
        if first is None or second is None:
            return first or second
        return lambda sample: second(first(sample))

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        return _LoaderIter(self)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until the rows this process queued for the cache are stored
        (CachedDataset.flush)."""
        return self.dataset.flush(timeout)

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


def _batch_sampler(dataset, batch_size, shuffle, sampler, batch_sampler,
                   drop_last, generator):
    """The batch sampler DataLoader builds from the same arguments."""
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with "
                             "batch_size, shuffle, sampler, and drop_last")
        return batch_sampler
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if sampler is None:
        sampler = RandomSampler(dataset, generator=generator) if shuffle \
            else SequentialSampler(dataset)
    return BatchSampler(sampler, batch_size, drop_last)


def _cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


class _LoaderIter:
    """One pass over the batch sampler. Its threads hold the _Pipeline, not
    this object, so dropping the iterator (early break) closes them.

    source: the pass's batches from a feed instead of the batch sampler
    (PartitionedLoader's WindowFeed): items with `indices` and `rows`
    ({index: columns} to take where the cache misses), `owned(index)`
    (whether the row is in this node's cache: only those are looked up
    there, and only those misses are put into it; the others go back
    through `note`),
    `note(...)` and `settle()`, called once per item taken, done or not."""

    def __init__(self, loader, source=None):
        # As DataLoader: the workers' seed from torch's generator at iter(),
        # the sampler's own draws at the first next() (in this thread).
        self._loader = loader
        self._base_seed = torch.empty((), dtype=torch.int64).random_(
            generator=loader.generator).item()
        self._fed = source is not None
        self._batches = iter(loader.batch_sampler) if source is None else source
        self._pipe = None
        self._closed = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._pipe is None:
            if self._closed:
                raise StopIteration
            first = next(self._batches, None)
            self._pipe = _Pipeline(self._loader, self._batches, first, self._base_seed,
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


class _Pipeline:
    """The threads of one pass: each takes the next batch number and its
    indices from the sampler (at most `prefetch` batches ahead of the
    consumer), assembles the batch, and files it under its number; the
    consumer takes batches in number order. `cond` guards the counters."""

    def __init__(self, loader, batches, first, base_seed, fed=False):
        self.loader = loader
        self.fed = fed          # batches from a feed: items, drawn without `cond`
        self._draw = threading.Lock()
        self.cds = loader.dataset
        self.tuner = loader._tuner
        self.pin = loader.pin_memory or loader.device is not None
        self.stage = _CudaStage(loader.device) if loader.device is not None else None
        self.pool = None
        if loader.num_workers > 0:
            self.pool = MissWorkers(self.cds, loader.num_workers,
                                    loader.multiprocessing_context, base_seed,
                                    loader.worker_init_fn, loader.timeout)
        self._inline = threading.Lock()   # num_workers=0: one compute at a time
        self.buffers = loader._buffers
        self.cond = threading.Condition()
        self._batches, self._first = batches, first
        self.end = 0 if first is None else None   # batches in the pass, once known
        self.next_no = self.consumed = 0
        self.ready = {}         # batch number -> (ok, batch or exception, bytes)
        self.live = 0
        self.threads = []
        self.stopped = False
        self._last = None       # when the previous batch was returned
        with self.cond:
            self._spawn_locked()

    # ---- threads --------------------------------------------------------

    def _spawn_locked(self):
        while self.live < self.tuner.threads and not self.stopped and \
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
            if self.stopped or self.live > self.tuner.threads:
                return False
            if self.end is not None and self.next_no >= self.end:
                return False
            if self.next_no < self.consumed + self.tuner.prefetch:
                return True
            self.cond.wait()

    def _take_locked(self):
        """(number, indices) of the next batch to assemble, or None when
        this thread should end."""
        if not self._slot_locked():
            return None
        if self._first is not None:
            indices, self._first = self._first, None
        else:
            indices = next(self._batches, None)
            if indices is None:
                self.end = self.next_no
                self.cond.notify_all()
                return None
        self.next_no += 1
        return self.next_no - 1, indices

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
                item = first if first is not None else next(self._batches, None)
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
            t0 = time.monotonic()
            try:
                if self.fed:
                    batch, nbytes = self._assemble(batch_ids(job[1].indices), job[1])
                else:
                    batch, nbytes = self._assemble(batch_ids(job[1]))
                result = (True, batch, nbytes)
            except BaseException as e:   # noqa: BLE001 -- raised to the consumer
                result = (False, e, 0)
            finally:
                if self.fed:
                    job[1].settle()
            self.loader._count(busy_s=time.monotonic() - t0)
            with self.cond:
                if not self.stopped:
                    self.ready[job[0]] = result
                self.cond.notify_all()

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
            self.close()
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
                    raise RuntimeError(f"CachedLoader timed out after {timeout} "
                                       "seconds waiting for a batch")
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
            pool = self.pool    # kept: a thread reaching _compute() gets Closed
        if pool is not None:
            pool.close()
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

    def _assemble(self, indices, fed=None):
        """(batch, bytes): see the module's contract; `fed`: the batch's
        item from a feed (see _LoaderIter)."""
        n, columns = len(indices), self.cds.columns
        schema = self.loader._schema
        bufs, filled = None, np.zeros(n, dtype=bool)
        if schema:
            bufs = schema.alloc(n, self.pin, self.buffers)
            targets = schema.read_targets(bufs)
            if fed is None:
                filled = read_into(self.cds.cache, indices, targets, columns)
            else:
                filled = self._read_owned(indices, targets, fed)
        rest = np.flatnonzero(~filled).tolist()
        if fed is not None:
            fed.note(local_hits=n - len(rest))
        rows = dict(zip(rest, self._rows([indices[p] for p in rest], fed))) if rest else {}
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
            direct = self.loader.transform is None and self.loader.collate_fn is None
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

    def _read_owned(self, indices, targets, fed):
        """read_into of a fed batch's rows that this node owns, into their
        positions; the hit mask. The others are never looked up in this
        node's cache, which does not hold them: each lookup would count as
        one of its misses."""
        mine = np.flatnonzero([fed.owned(i) for i in indices])
        filled = np.zeros(len(indices), dtype=bool)
        if not len(mine):
            return filled
        # Read into rows 0..m-1, then move row j to mine[j] >= j, last
        # first, so that no row is overwritten before it moved.
        hit = read_into(self.cds.cache, [indices[p] for p in mine], targets,
                        self.cds.columns)
        for t in (targets.values() if isinstance(targets, dict) else targets):
            for j in range(len(mine) - 1, -1, -1):
                if mine[j] != j and hit[j]:
                    t[mine[j]] = t[j]
        filled[mine] = hit
        return filled

    def _learn(self, cols):
        schema = RowSchema.of(cols, self.cds.columns) or False
        if self.loader._schema is None:
            self.loader._schema = schema
        return schema

    def _rows(self, ids, fed=None):
        """Per id the row's [(name, dtype, array)] from the cache (copies),
        else from `fed`'s rows, else computed (and queued for the cache, or
        with `fed` handed back when another node owns it), or a Sample the
        cache cannot hold."""
        if fed is None:
            rows: list[Any] = read_rows(self.cds.cache, ids, self.cds.columns, copy=True)
        else:
            # Only the rows this node owns are in its cache (_read_owned).
            rows = [None] * len(ids)
            mine = [k for k, i in enumerate(ids) if fed.owned(i)]
            if mine:
                got = read_rows(self.cds.cache, [ids[k] for k in mine],
                                self.cds.columns, copy=True)
                for k, r in zip(mine, got):
                    rows[k] = r
        missing = [k for k, r in enumerate(rows) if r is None]
        owned = None
        if fed is not None:
            local = len(ids) - len(missing)
            for k in missing:
                r = fed.rows.get(ids[k])
                if r is not None:
                    rows[k] = project(r, self.cds.columns)
            missing = [k for k in missing if rows[k] is None]
            owned = [fed.owned(ids[k]) for k in missing]
            fed.note(local_hits=local, remote_hits=len(ids) - len(missing) - local,
                     misses=len(missing))
        self.loader._count(hits=len(ids) - len(missing), misses=len(missing))
        if missing:
            stored = []     # rows a worker put into the cache
            pushes = []     # rows of another node (fed)
            computed = self._compute([ids[k] for k in missing], owned=owned)
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
                    for k, row in zip(gone, self._compute([ids[k] for k in gone],
                                                          inline=True)):
                        rows[k] = project(row.cols, self.cds.columns) \
                            if isinstance(row, Columns) else \
                            Sample(self.cds._project(row.sample), row.why)
        return rows

    def _compute(self, ids, inline=False, owned=None):
        """The rows of `ids` computed by the workers (or, with num_workers=0,
        here; `owned`: which rows the workers put); Closed once the pass is
        closed: nothing is computed in this process after close()."""
        stopped = lambda: self.stopped   # noqa: E731
        if self.pool is not None and not inline:
            return self.pool.compute(ids, owned)
        if self.stopped:
            raise Closed("the CachedLoader iterator was closed")
        with self._inline:
            return compute_rows(self.cds, ids, stopped)

    def _collate(self, samples):
        if self.loader.transform is not None:
            samples = [self.loader.transform(s) for s in samples]
        return (self.loader.collate_fn or default_collate)(samples)


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

