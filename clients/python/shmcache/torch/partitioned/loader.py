"""PartitionedLoader: DistributedSampler's batches, with the dataset's rows
partitioned over the nodes' caches (imported through shmcache.torch).

    ds = CachedDataset(decoded, shmcache.DatasetCache(session_id=S))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = PartitionedLoader(DataLoader(ds, batch_size=B, sampler=sampler,
                                          num_workers=2))
    # or PartitionedLoader(CachedLoader(ds, batch_size=B, sampler=sampler,
    #                                   num_workers=2), window=4)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader: ...

Each node's cache holds only the rows its node owns (ownership.py:
a fixed seeded split of the indices, the same on every rank); a rank reads
the rows of its batch that its node owns from its node's cache, and gets
the others from their owner node over the job's torch.distributed group,
one exchange round (two all_to_all_single calls once the sizes are known,
exchange.py) per window of `window` batches (default 4; 1: a round per
batch). A row cached nowhere yet (first epoch) is computed by the rank
that needs it and sent to its owner, which puts it in its cache with the
next round.

The batches are DistributedSampler's, unchanged: the same indices in the
same order (set_epoch, drop_last, the last shorter batch), the same values
as the wrapped loader gives without partitioning.

Who carries the exchange: in both loader kinds, one thread of the trainer
process (where the process group lives) per pass, shmcache-exchange
(feed.py's WindowFeed), on a gloo group of all ranks the
loader makes when it is built (so every rank must build its loader at the
same point, as for any torch.distributed group). It draws the batch
sampler a window ahead, runs the window's round, and hands the batches to
the iterating side through a bounded queue (two windows).

Rows travel, and are handed between the exchange thread and the loader,
in the cache's own encoding (columns, shmcache.partition), and only rows
this node owns are looked up in its cache.

How workers take part:
- DataLoader(CachedDataset): the exchange thread also reads this node's
  rows from its cache and computes the window's misses with the
  DataLoader's workers (num_workers > 0) as a pool (shmcache.torch._misses'
  MissWorkers, putting nothing: the exchange thread puts this node's rows
  and pushes the others'); transform and collate_fn run in the iterating
  thread, in sample order, as DataLoader(CachedDataset) gives them.
- CachedLoader: the exchange thread hands each batch with the rows fetched
  from other nodes; the CachedLoader's own threads read this node's rows
  (read_into) and compute the misses with its miss workers, which put only
  the rows this node owns (owned= mask); the computed rows of other nodes
  come back to the trainer and go to their owner with the next round.
In both, workers never touch the process group.

Every rank must take part in every round, to the end of the epoch: when a
rank's epoch ends first (it broke out of the loop, or iter() was called
again, or close(), or the pass raised), its exchange thread stops taking
batches and keeps answering the other ranks' requests, with nothing of its
own, until every rank is done; the break (or close, or the next iter())
returns then. With `for batch in loader: ... break` this happens when the
loop's iterator is dropped; with an iterator kept in a variable, at the
next iter(loader), close() or the iterator's close(). At the trainer's exit
a pass still open (its iterator kept) ends so too, but the exit waits for
the other ranks at most a bound (_exit_threads: then the others' next
round fails, as for a rank gone).

A node whose server is gone (the cache bypassed: one CacheWarning from
DatasetCache) serves nothing: every rank computes that node's rows from the
wrapped dataset and nobody waits on it.

The node's cache is the CachedDataset's of now: `ds.cache = other` (or
None, caching off: the node then serves nothing, as a dead server's) is
followed from the next window on, as DataLoader and CachedLoader follow it;
the rows of the window or exchange round under way are stored in `other`
(the old cache may be closed at once).
"""

from __future__ import annotations

import inspect
import os
import weakref
from datetime import timedelta
from collections.abc import Callable, Generator, Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler,
                              Sampler, default_collate)

from ... import rows as row_model
from ..datasets import CachedDataset
from .._pipeline import LoaderIter
from ..loader import CachedLoader
from .._misses import Sample
from .exchange import RowExchange
from .exchange_timeout import exchange_timeout as _exchange_timeout
from .ownership import RowOwners
from .feed import WindowFeed
from .window_rows import PartitionedRows

__all__ = ["PartitionedLoader", "PartitionedRows"]

DEFAULT_WINDOW = 4


def _to_sample(cols: Any) -> Any:
    """The sample of a row's columns, as a hit of CachedDataset returns it
    (the row model's torch decoding, over the row's arrays)."""
    return row_model.decode(cols, torch=True)


def _raising(e: BaseException) -> Iterator[Any]:
    raise e
    yield   # noqa: unreachable -- a generator


class PartitionedLoader:
    """DistributedSampler's batches over a CachedDataset whose rows are
    partitioned over the nodes' caches; see the module doc.

    data: a DataLoader over a CachedDataset (its sampler, batch size,
      drop_last, collate_fn and num_workers are used), a CachedLoader (all
      of its options are used: it makes the batches), or the CachedDataset
      itself (then sampler default DistributedSampler(data, shuffle=True,
      seed=seed), and batch_size, drop_last, collate_fn, num_workers as
      given, as for a DataLoader).
    window: batches per exchange round (>= 1). Default 4.
    seed: the seed of the ownership split (the same on every rank), and of
      the default DistributedSampler. Default 0.
    local_world_size: ranks per node, ranks numbered node by node; default
      $LOCAL_WORLD_SIZE (torchrun, srun-style launchers set it).
    group: the gloo group the exchange runs on; default one the constructor
      makes over all ranks (a collective call: every rank builds its loader
      at the same point).
    exchange_timeout: how long an exchange round waits for the other ranks
      (seconds, or a timedelta) before it fails, so that a rank gone or
      stuck ends the others' pass with a RuntimeError (not DataLoader's
      timeout=, which bounds one next()). Default: the job's timeout (the
      one init_process_group was given), or torch's 30 minutes, with one
      warning, where this torch does not say it. The timeout of the group
      the constructor makes: not with group= (a group carries its own).
    """

    def __init__(self, data: DataLoader | CachedLoader | CachedDataset,
                 batch_size: int = 1, sampler: Sampler[int] | None = None,
                 collate_fn: Callable[[list[Any]], Any] | None = None,
                 num_workers: int = 0, drop_last: bool = False, seed: int = 0,
                 local_world_size: int | None = None, group: Any = None,
                 window: int = DEFAULT_WINDOW,
                 exchange_timeout: float | timedelta | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("PartitionedLoader needs torch.distributed: call "
                               "torch.distributed.init_process_group first")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.cached_loader: CachedLoader | None = None
        if isinstance(data, CachedLoader):
            self.cached_loader = data
            ds: Any = data.dataset
            batch_sampler: Any = data.batch_sampler
            self.sampler: Any = data.sampler
            collate = default_collate
            num_workers = 0        # the CachedLoader's miss workers compute
        elif isinstance(data, DataLoader):
            ds = data.dataset
            batch_sampler = data.batch_sampler
            if batch_sampler is None:
                raise ValueError("the DataLoader has no batch sampler "
                                 "(batch_size=None): give it a batch_size")
            self.sampler = data.sampler
            collate = data.collate_fn
            num_workers = data.num_workers
        else:
            ds = data
            self.sampler = sampler if sampler is not None else \
                DistributedSampler(ds, shuffle=True, seed=seed)
            batch_sampler = BatchSampler(self.sampler, batch_size, drop_last)
            collate = collate_fn if collate_fn is not None else default_collate
        if not isinstance(ds, CachedDataset):
            raise TypeError(f"PartitionedLoader needs a CachedDataset, got "
                            f"{type(ds).__name__}")
        if ds.columns is not None:
            raise ValueError("PartitionedLoader reads whole rows: use a "
                             "CachedDataset without columns=")
        if local_world_size is None:
            v = os.environ.get("LOCAL_WORLD_SIZE", "")
            if not v.isdigit():
                raise ValueError("ranks per node are not known: pass "
                                 "local_world_size or set $LOCAL_WORLD_SIZE")
            local_world_size = int(v)
        self.dataset = ds
        self.batch_sampler = batch_sampler
        self.collate_fn = collate
        self.window = window
        owners = RowOwners(len(ds), dist.get_world_size() // local_world_size
                           if local_world_size > 0 else 0, seed)
        if group is None:
            group = RowExchange.new_group(_exchange_timeout(exchange_timeout))
        elif exchange_timeout is not None:
            raise ValueError("pass exchange_timeout= or group=, not both: a group "
                             "has the timeout it was made with")
        # The dataset's cache of now, each round: `ds.cache = other` (or
        # None) is followed, as DataLoader(ds) and CachedLoader follow it.
        self.exchange = RowExchange(lambda: ds.cache, owners, group, local_world_size)
        self.rows = PartitionedRows(ds, self.exchange, num_workers)
        self._epochs = 0
        self._active: weakref.ref[Generator[Any, None, None]] | None = None
        self._feed: WindowFeed | None = None

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    @property
    def counters(self) -> dict[str, int]:
        """This rank's cumulative counts: local_hits, remote_hits, misses
        (rows computed), pushed (computed rows sent to their owner), rounds
        (exchange rounds that carried a window of batches: ceil(batches /
        window) per epoch), closing_rounds (rounds after this rank's last
        window, until every rank is done: one per epoch when the others
        finish with it and nothing is left to push)."""
        return self.rows.counts()

    def __iter__(self) -> Iterator[Any]:
        self._end_active()
        self._epochs += 1
        cl = self.cached_loader
        self._feed = feed = WindowFeed(self.rows, self.window, self._epochs,
                                       None if cl is not None else self.rows.fill)
        # As DataLoader: CachedLoader's seed drawn at iter(), the sampler
        # started at the first next() (in this thread; the exchange thread
        # draws the rest).
        it = cl.iter_source(feed) if cl is not None else None
        gen = self._epoch(feed, it)
        # Weak: a loop's iterator dropped (break) closes its pass.
        self._active = weakref.ref(gen)
        return gen

    def _end_active(self) -> None:
        gen = self._active() if self._active is not None else None
        feed, self._feed, self._active = self._feed, None, None
        if gen is not None and inspect.getgeneratorstate(gen) != inspect.GEN_CREATED:
            gen.close()        # its finally closes the feed
        if feed is not None:
            feed.close()       # never started: still, every rank's rounds

    def _sample(self, row: Any) -> Any:
        if isinstance(row, Sample):   # the cache cannot hold it: as made
            return self.dataset.apply_transforms(row.sample)
        return self.dataset.apply_transforms(_to_sample(row))

    def _epoch(self, feed: WindowFeed,
               it: LoaderIter | None) -> Generator[Any, None, None]:
        try:
            batches: Iterator[Any] = iter(self.batch_sampler)
            try:
                first = next(batches, None)
            except Exception as e:   # noqa: BLE001 -- raised by the pass
                first, batches = None, _raising(e)
            feed.start(first, batches)
            if it is None:
                for rows in feed:
                    yield self.collate_fn([self._sample(r) for r in rows])
                return
            try:
                for batch in it:   # not `yield from`: it would close `it` first
                    yield batch
            finally:
                feed.stop()     # threads waiting for a batch go now
                it.close()
        finally:
            feed.close()

    def close(self) -> None:
        """Ends the current epoch (see the module doc) and the worker pool."""
        self._end_active()
        self.rows.close()
