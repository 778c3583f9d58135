"""BatchSource: where a CachedLoader pass takes its batches from.

A pass over `for batch in loader` draws its batches from the loader's batch
sampler (SamplerSource). CachedLoader.iter_source(source) runs a pass over
another source instead: one whose batches may carry rows from elsewhere
(read where this process's cache misses), may say which computed rows this
cache keeps, and hear what became of each batch. PartitionedLoader's
WindowFeed (partitioned/feed.py) is such a source: its batches carry the
rows fetched from other nodes, and the rows this node does not own go back
to their owner.

A source is an iterator of batches (SourcedBatch):
- next() is called by the loader's threads, one call at a time, in batch
  order, and never while the loader's own lock is held: it may block (an
  exchange round of all ranks). The first batch is drawn by the consumer's
  first next(), in its thread, as DataLoader starts its sampler.
- StopIteration ends the pass. An exception ends it too and is raised to
  the consumer in the place of the batch it was drawing.

A batch:
- indices: its dataset indices (ints, 0-d tensors, or one index tensor);
- supplied(index): the row to use where this cache misses, in the cache's
  own encoding (its columns [(name, dtype name, array)], as
  DatasetCache.get_columns returns them and shmcache.rows.encode makes
  them: it decodes as a hit of it would), or None;
- keeps(index): whether a row computed for a miss goes into this process's
  cache; the ones it does not keep come back in the report;
- in_cache(index), optional: False for a row that cannot be in this
  process's cache (another node's), which is then not looked up there (a
  lookup would count as one of the cache's misses); without it, every row
  is looked up;
- settle(report): called once for every batch drawn, from the thread that
  assembled it, when it is assembled or failed (a BatchReport).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..rows import Column

__all__ = ["BatchSource", "SourcedBatch", "BatchReport", "SamplerSource",
           "batch_ids"]


@dataclass
class BatchReport:
    """What became of a batch's rows (SourcedBatch.settle)."""
    cache_hits: int = 0       # read from this process's cache
    supplied: int = 0         # taken from the batch's supplied rows
    computed: int = 0         # computed from the dataset
    # Rows computed here that keeps() declined: (index, columns).
    not_kept: list[tuple[int, list[Column]]] = field(default_factory=list)


class SourcedBatch(Protocol):
    """One batch of a BatchSource (see the module)."""

    indices: Any

    def supplied(self, index: int) -> Any | None: ...

    def keeps(self, index: int) -> bool: ...

    def settle(self, report: BatchReport) -> None: ...


class BatchSource(Protocol):
    """An iterator of SourcedBatch (see the module)."""

    def __iter__(self) -> Iterator[SourcedBatch]: ...

    def __next__(self) -> SourcedBatch: ...


class _SamplerBatch:
    """A batch sampler's batch: nothing supplied, every computed row kept."""

    __slots__ = ("indices",)

    def __init__(self, indices: Any) -> None:
        self.indices = indices

    def supplied(self, index: int) -> Any | None:
        return None

    def keeps(self, index: int) -> bool:
        return True

    def settle(self, report: BatchReport) -> None:
        pass


class SamplerSource:
    """The batches of a batch sampler, as a BatchSource (the sampler is
    started at the first next(), as DataLoader starts it)."""

    def __init__(self, batch_sampler: Iterable[Any]) -> None:
        self._batches = iter(batch_sampler)

    def __iter__(self) -> SamplerSource:
        return self

    def __next__(self) -> _SamplerBatch:
        return _SamplerBatch(next(self._batches))


def batch_ids(indices: Any) -> list[int]:
    """A batch sampler's batch (ints, 0-d tensors, an index tensor) as ints."""
    if isinstance(indices, torch.Tensor):
        return [int(i) for i in indices.reshape(-1).tolist()]
    return [int(i) for i in indices]
