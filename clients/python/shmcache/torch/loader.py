"""CachedLoader: a torch DataLoader whose batches come from the cache: hits
are read straight into preallocated batch tensors, in threads of the
trainer's process; misses are computed by DataLoader workers.

    from shmcache.torch import CachedDataset, CachedLoader
    loader = CachedLoader(CachedDataset(ds, cache), batch_size=64, shuffle=True,
                          num_workers=2)      # was: DataLoader(CachedDataset(...))

Contract:
- It is a DataLoader (a subclass): DataLoader's arguments, in its order and
  with its defaults, checked as DataLoader checks them (same errors and
  warnings, the too-many-workers one included) and fixed after
  construction as DataLoader's are; len(); CachedLoader[T] as
  DataLoader[T]. The loader's own options follow by keyword.
- Batches are what DataLoader(CachedDataset(...)) yields with the same
  arguments (default_collate or collate_fn: same types, shapes, dtypes and
  values; batch_size=None: samples one by one through collate_fn,
  default_convert by default), in the sampler's order; the sampler is
  iterated as DataLoader iterates it (the workers' seed drawn from torch's
  generator at iter(), once with persistent_workers; the sampler started at
  the first next(), in the consumer's thread), so shuffles match under the
  same torch.manual_seed.
- A batch that fails (its dataset raised, a worker died) raises its
  exception at its next(), as DataLoader's does (a worker's exception
  re-raised with its type, naming the worker), and the pass goes on with
  the batches after it. A sampler's exception is raised by the next() that
  would have returned its batch, and ends the pass. timeout= (with
  num_workers > 0, as DataLoader's): next() raises RuntimeError
  ("DataLoader timed out after N seconds ...") and the pass ends.
- Rows of one fixed layout (a tuple/dict/array of fixed-shape columns)
  are read by DatasetCache.read_into (native threads, GIL released) into
  the batch's tensors, `prefetch` batches ahead of the consumer (at least
  one per thread), by `num_threads` threads. No worker process and no pickling on a hit.
  Rows the cache spilled to disk are hits too: the same read_into reads
  them from the spill database in this process (with the batch's
  in-memory rows), so the next batches' disk reads overlap the trainer's
  work on this one.
- Misses (_misses.py) leave in batch order: with num_workers > 0, batch k's
  misses go to worker k mod num_workers, as DataLoader deals batches, and
  prefetch_factor * num_workers batches are in flight once misses went
  out, so every worker computes at once on a cold pass. The workers are a
  DataLoader's (started at the pass's first miss; with persistent_workers
  kept for the loader's life): worker_init_fn, get_worker_info() (its
  .dataset the user's dataset, the one computing samples), seeds
  base_seed + worker id for torch, random and numpy as DataLoader seeds
  them, multiprocessing_context. Each worker puts the rows it computes
  into the cache; the loader reads them like hits (straight into the
  batch's buffers, uncounted: the batch's own read counted their misses),
  and only rows the cache did not take come back pickled (and are queued for the cache once more
  by the trainer's process, whose cache warns once when it stopped taking
  rows). With num_workers=0 misses are computed in the loader's threads,
  one batch at a time in batch order, and queued like CachedDataset's
  misses. Either way they land in the same batch positions. A sample with
  no column encoding is delivered as the dataset made it (one
  CacheWarning). Rows of another layout (variable shapes, bytes) go
  through collate of the samples, as in DataLoader.
- Indices from the sampler may be ints or tensors (0-d, or a batch as one
  index tensor).
- CachedDataset's transforms (apply_transforms) and transform= run per
  sample in the loader's threads; batch_transform= on each whole batch.
  A random transform draws from the process's global generators, as the
  threads and the training loop interleave: not DataLoader's seeded
  workers' draws, nor the same ones run to run (docs/python.md).
- num_threads / prefetch "auto": tuned while running (_autotune.py),
  prefetch bounded by max_prefetch_bytes of batches; stats() reports.
- pin_memory / device: pinned batch buffers and a copy to the device on a
  side stream where CUDA is available (register_cache_pages=True: copied
  to the device straight from the cache's pages registered with CUDA,
  _cache_pages.py); pin_memory=True without CUDA goes on unpinned, with
  the warning the installed torch's DataLoader gives (1.13: none), once
  per loader; device="cuda" without CUDA
  raises RuntimeError ("CUDA is not available: ..."); "cpu" is accepted.
  pin_memory_device is accepted (pinned memory is CUDA's); without
  pin_memory=True, DataLoader's warning at every iter().
- An iterator that is exhausted, closed (close()) or garbage-collected
  (early break) stops its threads and worker processes (not persistent
  ones) and drops its prefetched batches, without waiting for a row in
  flight (the thread or worker computing it, or the thread running
  transform= on a sample, ends after it; nothing new starts). An
  exhausted one then waits for the rows this process queued for the cache
  (num_workers=0's misses, rows the workers handed back), for at most
  shmcache.async_put.EXIT_FLUSH_S, as DataLoader's workers write theirs
  at their exit: stats() and the next pass see them. A trainer
  that exits with a pass open waits for its threads to leave torch. The loader keeps the buffers of at most prefetch + num_threads
  + 2 batches for reuse by later batches and passes (freed with the
  loader); a buffer is reused only once no tensor over it is alive, and a
  batch none of whose rows was read holds none while its misses are
  computed. The loader and its passes form no reference cycle (a failed
  batch's exception included), so a loader dropped by the script ends its
  persistent workers and frees its buffers at once, as DataLoader's, not
  when the cyclic collector runs. A
  cache whose daemon dies degrades to misses (one CacheWarning from the
  cache), so the epoch finishes from the source.
- iter_source(source) runs a pass over a BatchSource (batch_source.py)
  instead of the batch sampler: PartitionedLoader's passes.

Where the parts are: _pipeline.py (a pass: its threads, order, prefetch,
close), _assemble.py (one batch), _row_schema.py (the batch's buffers and
layout), _misses.py (the miss workers, the batch order of misses),
_device.py (pinning, the copy to the device), _cache_pages.py (the
cache's pages registered with CUDA), _autotune.py (num_threads /
prefetch "auto").
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, Subset

from .. import DatasetCache
from ._autotune import AutoTune, usable_cpus
from ._cache_pages import CachePages, cuda_calls
from ._device import batch_device
from ._misses import MissWorkers
from ._pipeline import LoaderIter, LoaderState
from .batch_source import BatchSource, SamplerSource
from .datasets import CachedDataset

__all__ = ["CachedLoader"]

DEFAULT_THREADS = 2
DEFAULT_PREFETCH = 4
DEFAULT_PREFETCH_BYTES = 1 << 30

T_co = TypeVar("T_co", covariant=True)


def _setting(name, value, default):
    """(value, auto) of a num_threads / prefetch argument."""
    if value == "auto":
        return default, True
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} is \"auto\" or an int >= 1, got {value!r}")
    return value, False


def _subset_of_cached(dataset: Any) -> bool:
    """Whether `dataset` is a Subset, or a Subset of Subsets, of a CachedDataset."""
    if not isinstance(dataset, Subset):
        return False
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return isinstance(dataset, CachedDataset)


class CachedLoader(DataLoader[T_co]):
    """A torch DataLoader whose batches come from the cache: DataLoader's
    arguments, in its order and with its defaults (checked as DataLoader
    checks them; fixed after construction as DataLoader's are), then the
    loader's own options by keyword. See the module for the contract.

    dataset: a shmcache.torch.CachedDataset, or a map-style dataset to wrap
      in CachedDataset(dataset, cache, name=name, allow_random=...); an
      IterableDataset is refused (TypeError): DataLoader(
      CachedIterableDataset(source, cache)) streams one. A Subset of a
      CachedDataset (random_split) is refused too (TypeError): rows are read
      by the CachedDataset's index, so pass it with
      sampler=SubsetRandomSampler(subset.indices).
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
      ("DataLoader timed out after ... seconds"); with num_workers > 0
      only: as DataLoader's, iter() of a loader without workers raises
      AssertionError (with the fix in its message, where torch has none).
    pin_memory: pinned batches with CUDA (without it: unpinned, with
      DataLoader's warning if this torch's gives one); pin_memory_device:
      accepted (pinned memory is CUDA's).
    num_threads, prefetch: threads assembling batches and batches kept
      ready ahead of the consumer; "auto" (default) tunes them at run time,
      from 2 threads (1 where this process may run on one CPU only).
    max_prefetch_bytes: the bound on prefetched batches' memory (auto).
    transform, batch_transform: run per sample after the cache, and per
      batch. device: "cuda" copies batches to the GPU on a side stream.
    register_cache_pages: with device="cuda", the cache's segments, up to
      their carve marks (the pages that hold rows, not the holes of a
      sparse segment), are registered with CUDA (cudaHostRegister) as rows
      in them are first read, and batches are copied to the device straight from them, with
      no pinned staging copy (unregister_cache_pages(), the loader's
      collection and exit release them); default False: the staging copy,
      until a GPU host measured which is faster (docs/python.md).
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1,
                 shuffle: bool | None = None,
                 sampler: Sampler[Any] | Iterable[Any] | None = None,
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
                 name: str | None = None, allow_random: bool = False,
                 register_cache_pages: bool = False) -> None:
        if isinstance(dataset, IterableDataset):
            # DataLoader takes one; batches read by index cannot.
            raise TypeError(f"CachedLoader reads batches by index from a map-style "
                            f"dataset; {type(dataset).__name__} is an IterableDataset: use "
                            f"DataLoader(CachedIterableDataset(source, cache), ...)")
        if _subset_of_cached(dataset):
            # Rows are keyed by the CachedDataset's index; wrapped again
            # (cache=) they would be cached twice, under the split's positions.
            nested = ("; a split of a split: the CachedDataset's indices are "
                      "[outer.dataset.indices[i] for i in outer.indices]"
                      if isinstance(dataset.dataset, Subset) else "")
            raise TypeError("CachedLoader reads rows by the CachedDataset's own index, "
                            "not through a Subset of a CachedDataset (random_split): "
                            "load the split with CachedLoader(subset.dataset, "
                            "sampler=SubsetRandomSampler(subset.indices)), or "
                            f"sampler=subset.indices for its order{nested}")
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
        for arg, f in (("transform", transform), ("batch_transform", batch_transform)):
            if f is not None and not callable(f):
                raise TypeError(f"{arg} must be callable, or None; got {type(f).__name__}")
        self.batch_transform = batch_transform
        self.transform = self._sample_transform(
            None if _plain(dataset) else dataset.apply_transforms, transform)
        self.device = batch_device(device, pin_memory)
        if isinstance(max_prefetch_bytes, bool) or not isinstance(max_prefetch_bytes, int) \
                or max_prefetch_bytes < 1:
            raise ValueError("max_prefetch_bytes is a size in bytes (>= 1; default 1 GiB), "
                             f"got {max_prefetch_bytes!r}")
        # A second thread on a single CPU only takes turns with the first.
        threads, auto_t = _setting("num_threads", num_threads,
                                   min(DEFAULT_THREADS, usable_cpus()))
        depth, auto_p = _setting("prefetch", prefetch, DEFAULT_PREFETCH)
        self._state = LoaderState(AutoTune(threads, depth, auto_t, auto_p,
                                           max_threads=max(DEFAULT_THREADS, 2 * usable_cpus()),
                                           max_bytes=max_prefetch_bytes))
        self._iters = 0
        if not isinstance(register_cache_pages, bool):
            raise TypeError(f"register_cache_pages must be True or False, got "
                            f"{register_cache_pages!r}")
        if register_cache_pages:
            if self.device is None:
                raise ValueError("register_cache_pages=True copies rows to a CUDA device "
                                 "straight from the cache's pages: pass device='cuda' too")
            pages = CachePages(*cuda_calls())
            self._state.pages = pages
            weakref.finalize(self, pages.close)

    def unregister_cache_pages(self) -> None:
        """Unregisters the cache's pages this loader registered with CUDA
        (register_cache_pages=True); later batches go through the pinned
        staging copy. Done anyway when the loader is collected, and at
        exit."""
        pages = self._state.pages
        if pages is not None:
            pages.close()

    @staticmethod
    def _sample_transform(first, second):
        if first is None or second is None:
            return first or second
        return lambda sample: second(first(sample))

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._get_iterator()

    def _get_iterator(self) -> LoaderIter:  # type: ignore[override]
        # DataLoader's index sampler: batches, or samples one by one.
        return self.iter_source(SamplerSource(
            self.batch_sampler if self.batch_sampler is not None else self.sampler))

    def iter_source(self, source: BatchSource) -> LoaderIter:
        """A pass whose batches come from `source` instead of the batch
        sampler (shmcache.torch.batch_source: its rows supplied where the
        cache misses, the computed rows it keeps, a report per batch);
        otherwise as iter(self). PartitionedLoader runs its passes so."""
        if self.num_workers == 0 and self.timeout:
            # Where and as torch 1.13's DataLoader fails (its single-process
            # iterator asserts timeout == 0, with no words), with the fix.
            raise AssertionError(f"timeout={self.timeout} is only valid with num_workers "
                                 f"> 0, as in DataLoader (its single-process iterator "
                                 f"takes no timeout): pass timeout=0, or num_workers > 0")
        if self.pin_memory_device and not self.pin_memory:
            # DataLoader's warning at every iter() (torch 1.13's words).
            warnings.warn("pin memory device is set and pin_memory flag is not used then "
                          "device pinned memory won't be usedplease set pin_memory to true, "
                          "if you need to use the device pin memory")
        # As DataLoader: the warning about more workers than CPUs at every
        # iter(), once with persistent workers.
        if self.num_workers > 0 and not (self.persistent_workers and self._iters):
            self.check_worker_number_rationality()
        self._iters += 1
        return LoaderIter(self, self._state, source)

    def workers_for_pass(self, seed_state: torch.Tensor) -> MissWorkers | None:
        """The pool a pass computes misses with (None: num_workers=0): its
        own, seeded from `seed_state`, or with persistent_workers the
        loader's, kept in its state (a failed one is replaced)."""
        if self.num_workers == 0:
            return None
        if not self.persistent_workers:
            return MissWorkers(self.dataset, self.num_workers, self.multiprocessing_context,
                               seed_state, self.worker_init_fn)
        state = self._state
        with state.lock:
            if state.pool is None or state.pool.broken:
                state.pool = MissWorkers(self.dataset, self.num_workers,
                                         self.multiprocessing_context, seed_state,
                                         self.worker_init_fn)
                weakref.finalize(self, state.pool.close)
            return state.pool

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until the rows this process queued for the cache are stored
        (CachedDataset.flush); a pass that runs to its end waits so for at
        most 2 s before its StopIteration."""
        cds: Any = self.dataset
        return cds.flush(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters since the loader was made (all its iterators) and the
        current settings: batches, samples, hits, misses, hit_rate, bytes
        (of batches delivered), bytes_per_s (over the consumer's steps),
        wait_s and wait_fraction (the consumer waiting for batches), busy_s
        (the loader threads assembling batches),
        num_threads, prefetch, auto_threads, auto_prefetch, tuning_changes."""
        c = self._state.snapshot()
        t = self._state.tuner
        seen = c["hits"] + c["misses"]
        c.update(hit_rate=c["hits"] / seen if seen else 0.0,
                 bytes_per_s=c["bytes"] / c["step_s"] if c["step_s"] else 0.0,
                 wait_fraction=c["wait_s"] / c["step_s"] if c["step_s"] else 0.0,
                 num_threads=t.threads, prefetch=t.prefetch,
                 auto_threads=t.auto_threads, auto_prefetch=t.auto_prefetch,
                 tuning_changes=t.changes)
        return c


def _plain(cds):
    """True when the CachedDataset applies no transform of its own."""
    return all(getattr(cds, a, None) is None
               for a in ("transform", "target_transform", "transforms"))


