"""PartitionedRows: the rows of a window of batches, wherever they are: this
node's cache, the owner node's cache (over the exchange), or computed from
the source (shmcache.torch._misses); and the rows this rank computed for another
node, waiting for the next round to travel to their owner.

Used by feed.py (the exchange thread of a pass) and, for a
CachedLoader, by the loader's own pipeline, which reports what it computed
through the feed. Rows are in the cache's own encoding, columns [(name,
dtype name, array)] (what DatasetCache.get_columns returns): a row read
here, fetched from its owner or computed decodes the same way.
Thread safety: counters and pending pushes are guarded by a lock; fill()
and compute() run on the exchange thread only.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import DatasetCache
from ..datasets import CachedDataset
from .._misses import Columns, MissWorkers, Sample, compute_rows
from .exchange import RowExchange

__all__ = ["PartitionedRows", "Pushes"]

# {rank: (ids, rows)}: computed rows for the rank that serves their owner.
Pushes = dict[int, tuple[list[int], list[Any]]]


class PartitionedRows:
    """See the module. cds: this rank's CachedDataset (its cache holds the
    rows this node owns); exchange: the rank's RowExchange; num_workers:
    processes computing misses for fill() (MissWorkers; 0: in the calling
    thread)."""

    def __init__(self, cds: CachedDataset, exchange: RowExchange,
                 num_workers: int = 0) -> None:
        self.cds = cds
        self.exchange = exchange
        self.owners = exchange.owners
        self.node = exchange.node
        self._lock = threading.Lock()
        self._pending: Pushes = {}
        self._pool = MissWorkers(cds, num_workers) if num_workers > 0 else None
        # Counters of this rank, cumulative: rows read from this node's
        # cache, rows fetched from another node's cache, rows computed,
        # computed rows sent to their owner; exchange rounds that carried
        # batches (one per window) and rounds after this rank's last window.
        self.counters = {"local_hits": 0, "remote_hits": 0, "misses": 0,
                         "pushed": 0, "rounds": 0, "closing_rounds": 0}

    def count(self, **delta: int) -> None:
        with self._lock:
            for k, v in delta.items():
                self.counters[k] += v

    def counts(self) -> dict[str, int]:
        """A copy of the counters (the feed thread may be adding to them)."""
        with self._lock:
            return dict(self.counters)

    @property
    def cache(self) -> DatasetCache:
        """This node's cache: the dataset's of now (`cds.cache = other`, or
        None, between or during passes is followed: a window's reads from
        the next window on, its puts at once)."""
        return self.cds.cache

    def owned(self, index: int) -> bool:
        """Whether this node owns row `index` (its cache is where it goes)."""
        return self.owners.owner(index) == self.node

    @staticmethod
    def _alive(cache: DatasetCache) -> bool:
        return not cache.bypassed

    # ---- the exchange ----------------------------------------------------

    def requests(self, ids: Sequence[int]) -> dict[int, list[int]]:
        """{rank: ids} to ask of the ranks serving the owners of `ids` that
        are other nodes, alive at the last round (each id once)."""
        ex, seen = self.exchange, set()
        out: dict[int, list[int]] = {}
        for i in ids:
            o = self.owners.owner(i)
            if o != self.node and o not in ex.dead_nodes and i not in seen:
                seen.add(i)
                out.setdefault(ex.server_of(o), []).append(i)
        return out

    @staticmethod
    def answered(requests: dict[int, list[int]],
                 answers: dict[int, list[Any]]) -> dict[int, Any]:
        """{id: row} of the rows a round's answers held (misses left out)."""
        out: dict[int, Any] = {}
        for dst, ids in requests.items():
            for i, r in zip(ids, answers.get(dst, ())):
                if r is not None:
                    out[i] = r
        return out

    def push(self, index: int, row: Any) -> None:
        """Queues a computed row of another node for its owner (sent with the
        next round); dropped when the owner's cache was dead at the last
        round."""
        o = self.owners.owner(index)
        if o == self.node or o in self.exchange.dead_nodes:
            return
        with self._lock:
            ids, rows = self._pending.setdefault(self.exchange.server_of(o), ([], []))
            ids.append(index)
            rows.append(row)
            self.counters["pushed"] += 1

    def take_pending(self) -> Pushes:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    # ---- DataLoader(CachedDataset): the whole window on the feed thread ----

    def compute(self, ids: list[int]) -> list[Any]:
        """The rows (columns) of `ids` computed from the source, not put (the caller
        puts or pushes them): by the worker pool (MissWorkers, with no row
        owned: the workers put nothing) or in this thread. A sample the
        cache cannot hold comes back as a misses.Sample (one CacheWarning),
        delivered as CachedDataset delivers it and neither put nor sent."""
        if not ids:
            return []
        got = self._pool.compute(ids, owned=[False] * len(ids)) \
            if self._pool is not None and len(ids) > 1 \
            else compute_rows(self.cds, ids, lambda: False)
        out: list[Any] = []
        for i, c in zip(ids, got):
            if isinstance(c, Columns):
                out.append(c.cols)
            elif isinstance(c, Sample):
                self.cds.warn_uncacheable(i, c.why)
                out.append(c)
            else:   # Stored: not asked for (no row is owned by the workers)
                raise AssertionError(f"row {i} was put by a miss worker")
        return out

    def fill(self, batches: list[list[int]], remote: dict[int, Any]) -> list[list[Any]]:
        """The rows of each batch of a window: this node's from its cache,
        the others' from `remote` (the window's round), the rest computed
        (this node's put into its cache, the others' pushed)."""
        cache = self.cache      # the window's reads
        idx = [i for b in batches for i in b]
        rows: list[Any] = [None] * len(idx)
        mine = [k for k, i in enumerate(idx) if self.owned(i)]
        if mine and self._alive(cache):
            for k, r in zip(mine, cache.get_batch_columns([idx[k] for k in mine])):
                rows[k] = r
        local = sum(rows[k] is not None for k in mine)
        got_remote = 0
        for k, i in enumerate(idx):
            if rows[k] is None and i in remote:
                rows[k] = remote[i]
                got_remote += 1
        missing = [k for k in range(len(idx)) if rows[k] is None]
        put_ids: list[int] = []
        put_rows: list[Any] = []
        for k, r in zip(missing, self.compute([idx[k] for k in missing])):
            rows[k] = r
            if isinstance(r, Sample):
                continue
            if self.owned(idx[k]):
                put_ids.append(idx[k])
                put_rows.append(r)
            else:
                self.push(idx[k], r)
        # The dataset's cache of now: `cds.cache = other` while the window
        # was computed stores its rows in other (the old cache may have been
        # closed at once, as CachedDataset allows).
        cache = self.cache
        if put_ids and self._alive(cache):
            cache.put_encoded(put_ids, put_rows, strict=False)
        self.count(local_hits=local, remote_hits=got_remote, misses=len(missing))
        ends = np.cumsum([len(b) for b in batches]).tolist()
        return [rows[e - len(b):e] for b, e in zip(batches, ends)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
