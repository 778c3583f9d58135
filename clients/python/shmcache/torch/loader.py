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
- Misses are computed by _misses.py: with num_workers > 0 by the
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
- num_threads / prefetch "auto": tuned while running (_autotune.py),
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
  later batches and passes (freed with the loader); a buffer is reused
  only once no tensor over it is alive. A cache whose daemon dies degrades to misses (one
  CacheWarning from the cache), so the epoch finishes from the source.
- A sampler's exception is raised by the next() that would have returned
  its batch, after the batches before it, and ends the pass.
- iter_source(source) runs a pass over a BatchSource (batch_source.py)
  instead of the batch sampler: PartitionedLoader's passes.

Where the parts are: _pipeline.py (a pass: its threads, order, prefetch,
close), _assemble.py (one batch), _row_schema.py (the batch's buffers and
layout), _misses.py (the miss workers), _device.py (pinning, the copy to
the device), _autotune.py (num_threads / prefetch "auto").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from .. import DatasetCache
from ._autotune import AutoTune, usable_cpus
from ._device import batch_device
from ._pipeline import LoaderIter, LoaderState
from .batch_source import BatchSource, SamplerSource
from .datasets import CachedDataset

__all__ = ["CachedLoader"]

DEFAULT_THREADS = 2
DEFAULT_PREFETCH = 4
DEFAULT_PREFETCH_BYTES = 1 << 30


def _setting(name, value, default):
    """(value, auto) of a num_threads / prefetch argument."""
    if value == "auto":
        return default, True
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} is \"auto\" or an int >= 1, got {value!r}")
    return value, False


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
        self.device = batch_device(device, pin_memory)
        self.pin_memory = pin_memory and torch.cuda.is_available()
        threads, auto_t = _setting("num_threads", num_threads, DEFAULT_THREADS)
        depth, auto_p = _setting("prefetch", prefetch, DEFAULT_PREFETCH)
        self._state = LoaderState(AutoTune(threads, depth, auto_t, auto_p,
                                           max_threads=max(DEFAULT_THREADS, 2 * usable_cpus()),
                                           max_bytes=max_prefetch_bytes))

    @staticmethod
    def _sample_transform(first, second):
        if first is None or second is None:
            return first or second
        return lambda sample: second(first(sample))

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> LoaderIter:
        return LoaderIter(self, self._state, SamplerSource(self.batch_sampler))

    def iter_source(self, source: BatchSource) -> LoaderIter:
        """A pass whose batches come from `source` instead of the batch
        sampler (shmcache.torch.batch_source: its rows supplied where the
        cache misses, the computed rows it keeps, a report per batch);
        otherwise as iter(self). PartitionedLoader runs its passes so."""
        return LoaderIter(self, self._state, source)

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

