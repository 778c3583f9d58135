"""PartitionedLoader: DistributedSampler's batches, with the dataset's rows
partitioned over the nodes' caches (imported through shmcache.torch).

    ds = CachedDataset(decoded, shmcache.DatasetCache(session_id=S))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = PartitionedLoader(DataLoader(ds, batch_size=B, sampler=sampler,
                                          num_workers=2))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader: ...

Each node's cache holds only the rows its node owns (shmcache.partition:
a fixed seeded split of the indices, the same on every rank); a rank reads
the rows of its batch that its node owns from its node's cache, and gets
the others from their owner node over the job's torch.distributed group,
one exchange round (four all_to_all_single calls) per batch. A row cached
nowhere yet (first epoch) is computed by the rank that needs it and sent
to its owner, which puts it in its cache with the next round.

The batches are DistributedSampler's, unchanged: the same indices in the
same order (set_epoch, drop_last, the last shorter batch), the same values
as DataLoader(CachedDataset) gives (transform and collate_fn run on the
trainer in sample order).

Who does what: the trainer process (the one that iterates the loader, where
the process group lives) carries the exchange, in the iterating thread, on
a gloo group of all ranks the loader makes when it is built (so every rank
must build its loader at the same point, as for any torch.distributed
group). DataLoader workers (num_workers > 0) take part only as a pool that
computes rows from the wrapped dataset: the misses of each batch are split
among them, the rows come back to the trainer, which puts them (its own
node's) or sends them to their owner. Workers never touch the process
group.

Every rank must take part in every round, to the end of the epoch: when a
rank's epoch ends first (it broke out of the loop, or iter() was called
again, or close()), its iterator keeps answering the other ranks' requests,
with nothing of its own, until every rank is done; the break returns then.
With `for batch in loader: ... break` this happens when the loop's
iterator is dropped; with an iterator kept in a variable, at the next
iter(loader), close() or the iterator's close().

A node whose server is gone (the cache bypassed: one CacheWarning from
DatasetCache) serves nothing: every rank computes that node's rows from the
wrapped dataset and nobody waits on it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import (BatchSampler, DataLoader, Dataset, DistributedSampler,
                              Sampler, default_collate)

from . import DatasetCache, rows
from .datasets import CachedDataset
from .partition import RowExchange, RowOwners, numpy_row

__all__ = ["PartitionedLoader", "PartitionedRows"]

Pushes = dict[int, tuple[list[int], list[Any]]]


def _to_sample(row: Any) -> Any:
    """Tensors of a numpy row, as CachedDataset returns a sample (the row
    model's torch decoding)."""
    return rows.decode(rows.encode(row), torch=True)


def _as_list(rows: list[Any]) -> list[Any]:
    return rows


class _SourceRows(Dataset):
    """The wrapped dataset's rows as numpy rows (what a worker computes)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return numpy_row(self.dataset[index])


class _Chunks(Sampler[list[int]]):
    """The batch sampler of the worker pool: the chunks set before each use."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.chunks)

    def __len__(self) -> int:
        return len(self.chunks)


class PartitionedRows:
    """The rows of a batch, wherever they are: this node's cache, the owner
    node's cache (over the exchange), or computed from `source`.

    This is the part a batch loader plugs in (PartitionedLoader does):
    read(indices, epoch) in the trainer process, once per batch, on every
    rank the same number of times, then finish(epoch) once per epoch.
    Returns numpy rows (what DatasetCache.get returns).
    """

    def __init__(self, source: Any, cache: DatasetCache | None, exchange: RowExchange,
                 num_workers: int = 0) -> None:
        self.source = source
        self.cache = cache
        self.exchange = exchange
        self.owners = exchange.owners
        self.node = exchange.node
        self._pending: Pushes = {}
        self.num_workers = num_workers
        self._chunks = _Chunks()
        self._pool: DataLoader | None = None
        if num_workers > 0:
            self._pool = DataLoader(_SourceRows(source), batch_sampler=self._chunks,
                                    num_workers=num_workers, collate_fn=_as_list,
                                    persistent_workers=True)
        # Counters of this rank, cumulative: rows read from this node's
        # cache, rows fetched from another node's cache, rows computed.
        self.counters = {"local_hits": 0, "remote_hits": 0, "misses": 0,
                         "pushed": 0}

    def _alive(self) -> bool:
        return self.cache is not None and not self.cache.bypassed

    def _compute(self, indices: list[int]) -> list[Any]:
        if not indices:
            return []
        if self._pool is None or len(indices) == 1:
            return [numpy_row(self.source[i]) for i in indices]
        k = min(self.num_workers, len(indices))
        self._chunks.chunks = [indices[j::k] for j in range(k)]
        parts = list(self._pool)
        out: list[Any] = [None] * len(indices)
        for j, part in enumerate(parts):
            out[j::k] = part
        return out

    def read(self, indices: Sequence[int], epoch: int) -> list[Any]:
        """The numpy rows of `indices` (one exchange round)."""
        idx = [int(i) for i in indices]
        ex = self.exchange
        owner = self.owners.owners[idx] if idx else np.empty(0, dtype=np.int32)
        rows: list[Any] = [None] * len(idx)
        mine = [k for k in range(len(idx)) if owner[k] == self.node]
        if mine and self._alive():
            assert self.cache is not None
            got = self.cache.get_batch([idx[k] for k in mine])
            for k, r in zip(mine, got):
                rows[k] = r
        self.counters["local_hits"] += sum(rows[k] is not None for k in mine)
        requests: dict[int, list[int]] = {}
        where: dict[int, list[int]] = {}
        for k in range(len(idx)):
            o = int(owner[k])
            if o != self.node and o not in ex.dead_nodes:
                dst = ex.server_of(o)
                requests.setdefault(dst, []).append(idx[k])
                where.setdefault(dst, []).append(k)
        pending, self._pending = self._pending, {}
        answers, _ = ex.round(requests, pending, False, epoch)
        for dst, rs in answers.items():
            for k, r in zip(where[dst], rs):
                if r is not None:
                    rows[k] = r
                    self.counters["remote_hits"] += 1
        missing = [k for k in range(len(idx)) if rows[k] is None]
        computed = self._compute([idx[k] for k in missing])
        self.counters["misses"] += len(missing)
        put_ids: list[int] = []
        put_rows: list[Any] = []
        for k, r in zip(missing, computed):
            rows[k] = r
            o = int(owner[k])
            if o == self.node:
                put_ids.append(idx[k])
                put_rows.append(r)
            elif o not in ex.dead_nodes:
                ids, rs = self._pending.setdefault(ex.server_of(o), ([], []))
                ids.append(idx[k])
                rs.append(r)
                self.counters["pushed"] += 1
        if put_ids and self._alive():
            assert self.cache is not None
            self.cache.put_batch(put_ids, put_rows)
        return rows

    def finish(self, epoch: int) -> None:
        """Ends this rank's epoch: sends what is left to put and answers the
        other ranks until every rank has finished (returns then)."""
        if self.exchange.broken:
            return   # out of step: another round would hang or mismatch
        while True:
            pending, self._pending = self._pending, {}
            _, all_done = self.exchange.round({}, pending, True, epoch)
            if all_done:
                return

    def close(self) -> None:
        self._pool = None   # its persistent workers end with their iterator


class PartitionedLoader:
    """DistributedSampler's batches over a CachedDataset whose rows are
    partitioned over the nodes' caches; see the module doc.

    data: a DataLoader over a CachedDataset (its sampler, batch size,
      drop_last, collate_fn and num_workers are used), or the CachedDataset
      itself (then sampler default DistributedSampler(data, shuffle=True,
      seed=seed), and batch_size, drop_last, collate_fn, num_workers as
      given).
    seed: the seed of the ownership split (the same on every rank), and of
      the default DistributedSampler. Default 0.
    local_world_size: ranks per node, ranks numbered node by node; default
      $LOCAL_WORLD_SIZE (torchrun, srun-style launchers set it).
    group: the gloo group the exchange runs on; default one the constructor
      makes over all ranks (a collective call: every rank builds its loader
      at the same point).
    """

    def __init__(self, data: DataLoader | CachedDataset, batch_size: int = 1,
                 sampler: Sampler[int] | None = None,
                 collate_fn: Callable[[list[Any]], Any] | None = None,
                 num_workers: int = 0, drop_last: bool = False, seed: int = 0,
                 local_world_size: int | None = None, group: Any = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("PartitionedLoader needs torch.distributed: call "
                               "torch.distributed.init_process_group first")
        if isinstance(data, DataLoader):
            ds = data.dataset
            batch_sampler = data.batch_sampler
            if batch_sampler is None:
                raise ValueError("the DataLoader has no batch sampler "
                                 "(batch_size=None): give it a batch_size")
            self.sampler: Any = data.sampler
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
        self.batch_sampler: Any = batch_sampler
        self.collate_fn = collate
        owners = RowOwners(len(ds), dist.get_world_size() // local_world_size
                           if local_world_size > 0 else 0, seed)
        group = group if group is not None else RowExchange.new_group()
        self.exchange = RowExchange(ds.cache, owners, group, local_world_size)
        self.rows = PartitionedRows(ds.dataset, ds.cache, self.exchange, num_workers)
        self._epochs = 0
        self._active: Generator[Any, None, None] | None = None

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    @property
    def counters(self) -> dict[str, int]:
        """This rank's cumulative counts: local_hits, remote_hits, misses
        (rows computed), pushed (computed rows sent to their owner)."""
        return dict(self.rows.counters)

    def __iter__(self) -> Iterator[Any]:
        self._end_active()
        self._epochs += 1
        self._active = self._epoch(self._epochs)
        return self._active

    def _end_active(self) -> None:
        gen, self._active = self._active, None
        if gen is None:
            return
        if inspect.getgeneratorstate(gen) == inspect.GEN_CREATED:
            # Never started: its finally would not run, but the other ranks
            # count on this rank's rounds of that epoch.
            gen.close()
            self.rows.finish(self._epochs)
        else:
            gen.close()

    def _sample(self, row: Any) -> Any:
        s = _to_sample(row)
        return self.dataset.apply_transforms(s)

    def _epoch(self, epoch: int) -> Generator[Any, None, None]:
        try:
            for indices in self.batch_sampler:
                rows = self.rows.read(indices, epoch)
                yield self.collate_fn([self._sample(r) for r in rows])
        finally:
            self.rows.finish(epoch)

    def close(self) -> None:
        """Ends the current epoch (see the module doc) and the worker pool."""
        self._end_active()
        self.rows.close()
