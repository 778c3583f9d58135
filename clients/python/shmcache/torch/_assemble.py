"""One CachedLoader batch, assembled (BatchAssembler.assemble): the rule of
loader.py's contract, applied to a batch's indices.

1. Rows of the learned layout (a RowSchema) are read into the batch's
   buffers, all at once, by one native call (DatasetCache.fill_batch, with
   copy_threads threads), which says of each row whether it was read, is
   not cached, or is cached in another layout. A batch whose source says a
   row cannot be in this cache (in_cache: another node's row) never looks
   that row up here: it would count as one of the cache's misses.
2. Rows of another layout are read from the cache row by row
   (read_columns: another layout, a projection); rows not cached are not
   looked up again (each read is counted once). Then rows are taken from
   the batch's supplied rows (a
   BatchSource's, as columns), then computed in the batch's miss turn
   (_misses.py: sent to worker number mod num_workers, or computed in this
   thread with num_workers=0). A computed row goes into the cache (the
   workers put it, or CachedDataset's writer queues it) when the batch
   keeps it; else it goes back in the BatchReport. A batch none of whose
   rows was read lets its buffers go while its rows are computed, and
   takes buffers again when they are back.
3. The rows a worker stored are read from the cache straight into the
   buffers (uncounted), also in a batch sent before the layout was known:
   its first row, read as columns, teaches it. Rows that fit the layout
   are written into the buffers, which become the
   batch as default_collate would make it; otherwise the samples are
   collated (collate_fn, transform=), as DataLoader would (batch_size=None:
   collate_fn, default_convert, of the one sample).
4. batch_transform, pinning and the copy to the device (CudaStage) follow.

Several loader threads assemble batches at once; the layout learned from
the first row is shared by the loader's passes (LoaderState).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from .._read_into import ROW_MISSING, ROW_READ
from ._autotune import usable_cpus
from ._cache_pages import DeviceGather
from ._device import CudaStage, tree_map
from ._misses import (STORED, Closed, Columns, Computed, MissTurn, MissWorkers, Sample,
                      Stored, compute_rows)
from ._row_schema import RowSchema, decode_sample, project, read_columns
from .batch_source import BatchReport, SourcedBatch

__all__ = ["BatchAssembler"]


def _in_cache(source: SourcedBatch) -> Any:
    """The batch's in_cache(index), or None when it has none (every row
    may be in this cache)."""
    return getattr(source, "in_cache", None)


def _fill_from_views(schema: RowSchema, bufs: Any,
                     views: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The masks (read, not cached) of copying the rows read as views into
    the batch's buffers (those of the layout; the others are read again as
    rows of another layout are)."""
    filled = np.zeros(len(views), dtype=bool)
    absent = np.zeros(len(views), dtype=bool)
    for p, v in enumerate(views):
        if v is None:
            absent[p] = True
        elif schema.fits(v):
            schema.fill(bufs, p, v)
            filled[p] = True
    return filled, absent


class BatchAssembler:
    """Assembles the batches of one pass (see the module). `loader`: the
    CachedLoader (its options); `state`: its LoaderState; `pool`: the miss
    workers (None: num_workers=0), the pass's own or the loader's
    persistent ones; `turn`: the pass's MissTurn; `workers_busy()` is
    called when misses go to the workers. close() stops computing: a
    compute in progress or asked for later raises Closed (a pool of the
    pass's own closes; the persistent one goes on, without this pass's
    batches)."""

    def __init__(self, loader: Any, state: Any, pool: MissWorkers | None,
                 turn: MissTurn, workers_busy: Callable[[], None],
                 batches_at_once: Callable[[], int]) -> None:
        self.loader = loader
        self.state = state
        self.cds = loader.dataset
        self.auto = loader.batch_sampler is not None   # DataLoader's auto-collation
        self.pin = (bool(loader.pin_memory) and torch.cuda.is_available()) \
            or loader.device is not None
        self.stage = CudaStage(loader.device) if loader.device is not None else None
        pages = state.pages   # CachePages when register_cache_pages
        self.gather = DeviceGather(pages) if pages is not None and self.stage else None
        self.pool = pool
        self._own_pool = pool is not None and not loader.persistent_workers
        self._tickets: weakref.WeakSet[Any] = weakref.WeakSet()   # sent to a shared pool
        self.turn = turn
        self._workers_busy = workers_busy
        self._inline = threading.Lock()   # rows gone since a worker stored them
        self.tuner = state.tuner
        self._batches_at_once = batches_at_once
        self.cpus = usable_cpus()
        self.closed = False

    def close(self) -> None:
        """Stops computing; returns at once (the workers end after the row
        they compute)."""
        self.closed = True
        if self.pool is not None:
            if self._own_pool:
                self.pool.close()
            else:
                self.pool.cancel(self._tickets)

    def assemble(self, number: int, indices: list[int], source: SourcedBatch,
                 report: BatchReport) -> tuple[Any, int]:
        """(batch, bytes) of batch `number`, of `indices` (see the module);
        `report` is filled with what became of its rows."""
        n, columns = len(indices), self.cds.columns
        state = self.state
        schema = state.schema
        bufs, out, filled = None, None, np.zeros(n, dtype=bool)
        absent = filled    # rows the read found not cached
        views = None    # the rows as zero-copy views (register_cache_pages)
        if schema and self._gatherable(schema, source):
            views = self.cds.cache.get_batch_columns(indices, copy=False)
            staged = self._from_pages(number, views, schema)
            if staged is not None:
                report.cache_hits += n
                state.count(samples=n, hits=n)
                return staged, schema.nbytes(n)
        if schema:
            bufs = schema.alloc(n, self.pin, state.buffers)
            if views is not None:
                filled, absent = _fill_from_views(schema, bufs, views)
            else:
                out = schema.read_targets(bufs)
                # A dict out names its columns by its keys: the projection is in it.
                filled, absent = self._read_into(indices, out, None if isinstance(out, dict)
                                                 else columns, _in_cache(source))
        rest = np.flatnonzero(~filled).tolist()
        if not rest:
            self.turn.passed(number)
        report.cache_hits += n - len(rest)
        if not filled.any():
            # Nothing read into the buffers: they are not held while the
            # rows are computed (a cold pass has prefetch_factor *
            # num_workers batches waiting for workers, more than the pool
            # keeps: each would be fresh memory to fault in and clear).
            bufs = out = None
        # A row a worker stored stays STORED unless the rows go through
        # collate (schema False), so that it is read straight into the
        # buffers: also while the layout is not known yet, which on a cold
        # pass it is not for every batch sent before the first came back.
        rows = dict(zip(rest, self._rows(number, [indices[p] for p in rest], source,
                                         report, absent[rest].tolist(),
                                         schema is not False))) if rest else {}
        state.count(samples=n, hits=n - len(rest))
        if schema is None and rows:
            if rows[0] is STORED:
                rows[0] = self._stored_rows([indices[0]])[0]
            schema = False if isinstance(rows[0], Sample) else self._learn(rows[0])
        stored = [p for p, r in rows.items() if r is STORED]
        if stored and not schema:
            for p, r in zip(stored, self._stored_rows([indices[p] for p in stored])):
                rows[p] = r
        if schema and bufs is None:
            bufs = schema.alloc(n, self.pin, state.buffers)
        if schema and stored:
            self._read_back(schema, indices, rows, bufs, filled)
        loader = self.loader
        direct = False   # the batch is the buffers (pinned when asked)
        if schema and all(not isinstance(r, Sample) and schema.fits(r)
                          for r in rows.values()):
            for p, r in rows.items():
                schema.fill(bufs, p, r)
            tensors = schema.tensors(bufs)
            direct = self.auto and loader.transform is None and \
                loader.collate_fn is default_collate
            batch = schema.batch(tensors) if direct else \
                self._collate([schema.sample(tensors, p) for p in range(n)])
        else:
            if schema is not None:
                state.schema = False   # rows of several layouts: collate
            tensors = schema.tensors(bufs) if schema and filled.any() else None
            batch = self._collate([schema.sample(tensors, p) if filled[p]
                                   else rows[p].sample if isinstance(rows[p], Sample)
                                   else decode_sample(rows[p], columns)
                                   for p in range(n)])
        if loader.batch_transform is not None:
            self._raise_if_closed()
            batch = loader.batch_transform(batch)
        nbytes = schema.nbytes(n) if schema else 0
        if self.pin and not (direct and loader.batch_transform is None):
            batch = tree_map(lambda t: t.pin_memory(), batch)
        if self.stage is not None:
            batch = self.stage.stage(batch)
        return batch, nbytes

    def _raise_if_closed(self) -> None:
        if self.closed:
            raise Closed("the CachedLoader iterator was closed")

    def _gatherable(self, schema: RowSchema, source: SourcedBatch) -> bool:
        """Whether the batch may be copied to the device straight from the
        cache's pages: registered pages asked for, the batch as the buffers
        would be (default_collate, no transform), no widened column, and
        every row possibly in this cache."""
        loader = self.loader
        return self.gather is not None and self.auto and loader.transform is None \
            and loader.collate_fn is default_collate and loader.batch_transform is None \
            and _in_cache(source) is None and not any(c.widen for c in schema.columns)

    def _from_pages(self, number: int, views: list[Any], schema: RowSchema) -> Any:
        """The staged batch (device tensors, event) copied from the cache's
        registered pages, or None when a row is not cached, not of the
        layout, or not in registered pages (then the views go through the
        staging buffers)."""
        gather, stage = self.gather, self.stage
        assert gather is not None and stage is not None
        if not all(v is not None and schema.fits(v) for v in views):
            return None
        row_bytes = schema.row_bytes()
        addrs = gather.sources(views, row_bytes)
        if addrs is None:
            return None
        self.turn.passed(number)
        n = len(views)
        # The device current in this thread is the stream's (the runtime's
        # copies run on the current device).
        with torch.cuda.device(stage.device), torch.cuda.stream(stage.stream):
            dsts = [torch.empty((n,) + c.shape, dtype=c.torch, device=stage.device)
                    for c in schema.columns]
            event = torch.cuda.Event()
            gather.gather(views, row_bytes, dsts, addrs, stage.stream,
                          stage.stream.cuda_stream, event)
        return schema.batch(dsts), event

    def copy_threads(self) -> int:
        """Threads to copy one batch's rows with: the cache's read_threads,
        fewer while the loader's threads already copy batches side by side,
        so that all of them together stay within the CPUs (more would only
        take turns: oversubscribed copies wait on the slowest share)."""
        return max(1, min(self.cds.cache.read_threads,
                          self.cpus // max(1, self._batches_at_once())))

    def _read_into(self, indices: list[int], out: Any, columns: Any,
                   in_cache: Any) -> tuple[Any, Any]:
        """The masks (read, not cached) of reading the batch's rows into
        `out`: all of them, or only those in_cache says may be here, read
        into the first rows of `out` and moved to their positions."""
        cache = self.cds.cache
        if in_cache is None:
            codes = cache.fill_batch(indices, out, columns, self.copy_threads(), codes=True)
            return codes == ROW_READ, codes == ROW_MISSING
        filled = np.zeros(len(indices), dtype=bool)
        absent = np.zeros(len(indices), dtype=bool)
        mine = np.flatnonzero([in_cache(i) for i in indices])
        if not len(mine):
            return filled, absent
        codes = cache.fill_batch([indices[p] for p in mine], out, columns,
                                 self.copy_threads(), codes=True)
        hit = codes == ROW_READ
        # Row j moves to mine[j] >= j, the last first: no row is overwritten
        # before it moved.
        for t in (out.values() if isinstance(out, dict) else out):
            for j in range(len(mine) - 1, -1, -1):
                if mine[j] != j and hit[j]:
                    t[mine[j]] = t[j]
        filled[mine] = hit
        absent[mine] = codes == ROW_MISSING
        return filled, absent

    def _learn(self, cols: Any) -> Any:
        schema = RowSchema.of(cols, self.cds.columns) or False
        if self.state.schema is None:
            self.state.schema = schema
        return schema

    def _read_back(self, schema: RowSchema, indices: list[int], rows: dict[int, Any],
                   bufs: Any, filled: Any) -> None:
        """The rows a worker stored (STORED in `rows`, by batch position)
        read from the cache straight into the batch's buffers, uncounted
        (the batch's read of them counted their misses), one native read
        per run of consecutive positions: a read row leaves `rows` and is
        marked in `filled`. A row not read so (gone since, or stored in
        another layout) becomes what _stored_rows makes of it."""
        out = schema.read_targets(bufs)
        columns = None if isinstance(out, dict) else self.cds.columns
        cache = self.cds.cache
        left = []
        for a, b in _runs(sorted(p for p, r in rows.items() if r is STORED)):
            part = {k: t[a:b] for k, t in out.items()} if isinstance(out, dict) \
                else [t[a:b] for t in out]
            codes = cache.fill_batch(indices[a:b], part, columns, self.copy_threads(),
                                     codes=True, count=False)
            for p, code in zip(range(a, b), codes.tolist()):
                if code == ROW_READ:
                    filled[p] = True
                    del rows[p]
                else:
                    left.append(p)
        if left:
            for p, r in zip(left, self._stored_rows([indices[p] for p in left])):
                rows[p] = r

    def _stored_rows(self, ids: list[int]) -> list[Any]:
        """The rows `ids`, which workers stored, as columns read from the
        cache (uncounted: their misses were counted); a row gone since
        (its session dropped) is computed again in this thread."""
        cds = self.cds
        again = cds.cache.get_batch_columns(ids, copy=True, count=False)
        rows: list[Any] = [None if cols is None else project(cols, cds.columns)
                           for cols in again]
        gone = [k for k, r in enumerate(rows) if r is None]
        if gone:
            self._raise_if_closed()
            with self._inline:
                redone = compute_rows(cds, [ids[k] for k in gone], lambda: self.closed)
            for k, row in zip(gone, redone):
                if isinstance(row, Columns):
                    rows[k] = project(row.cols, cds.columns)
                else:
                    assert isinstance(row, Sample)   # this thread puts nothing
                    rows[k] = Sample(cds.project(row.sample), row.why)
        return rows

    def _rows(self, number: int, ids: list[int], source: SourcedBatch,
              report: BatchReport, absent: list[bool], direct: bool) -> list[Any]:
        """Per id the row's [(name, dtype, array)] from the cache (copies;
        not looked up where `absent` says the batch's read found no row, or
        where the source says it cannot be here: each read is counted once),
        else the source's supplied row, else computed in batch `number`'s
        miss turn (and queued for the cache, or left in the report when the
        source does not keep it), or a Sample the cache cannot hold. A row
        a worker stored is STORED when `direct` (the caller reads it into
        the batch's buffers, or as columns once it knows the rows go
        through collate), else read back as columns."""
        cds = self.cds
        in_cache = _in_cache(source)
        look = [k for k, i in enumerate(ids)
                if not absent[k] and (in_cache is None or in_cache(i))]
        rows: list[Any] = [None] * len(ids)
        for k, r in zip(look, read_columns(cds.cache, [ids[k] for k in look],
                                           cds.columns, copy=True) if look else []):
            rows[k] = r
        missing = [k for k, r in enumerate(rows) if r is None]
        report.cache_hits += len(ids) - len(missing)
        supplied = 0
        for k in missing:
            r = source.supplied(ids[k])
            if r is not None:
                rows[k] = project(r, cds.columns)
                supplied += 1
        if supplied:
            missing = [k for k in missing if rows[k] is None]
        report.supplied += supplied
        report.computed += len(missing)
        self.state.count(hits=len(ids) - len(missing), misses=len(missing))
        if not missing:
            self.turn.passed(number)
            return rows
        kept = [source.keeps(ids[k]) for k in missing]
        owned = None if all(kept) else kept   # the rows the workers put
        stored = []     # rows a worker put into the cache
        computed = self._compute(number, [ids[k] for k in missing], owned)
        for j, (k, row) in enumerate(zip(missing, computed)):
            if isinstance(row, Stored):
                stored.append(k)
                rows[k] = STORED
            elif isinstance(row, Columns):
                if kept[j]:
                    cds.store_row(ids[k], row.cols)
                else:
                    report.not_kept.append((ids[k], row.cols))
                rows[k] = project(row.cols, cds.columns)
            else:
                cds.warn_uncacheable(ids[k], row.why)
                rows[k] = Sample(cds.project(row.sample), row.why)
        if stored and not direct:
            for k, r in zip(stored, self._stored_rows([ids[k] for k in stored])):
                rows[k] = r
        return rows

    def _compute(self, number: int, ids: list[int],
                 owned: list[bool] | None) -> list[Computed]:
        """The rows of `ids`, batch `number`'s misses: in its miss turn,
        sent to worker number mod num_workers (`owned`: the rows the worker
        puts) and waited for, or (num_workers=0) computed here. Closed once
        closed: nothing is computed in this process after close()."""
        self.turn.wait(number)
        try:
            if self.pool is None:
                return compute_rows(self.cds, ids, lambda: self.closed)
            ticket = self.pool.submit(number, ids, owned)
            if not self._own_pool:
                self._tickets.add(ticket)
        finally:
            self.turn.passed(number)
        self._workers_busy()
        return ticket.result()

    def _collate(self, samples: list[Any]) -> Any:
        """The batch of `samples` through transform= and collate_fn; raises
        Closed before the next sample once closed: a closed pass's thread
        ends after the sample it transforms, not after its batch."""
        transform = self.loader.transform
        if transform is not None:
            out = []
            for s in samples:
                if self.closed:
                    raise Closed("the CachedLoader iterator was closed")
                out.append(transform(s))
            samples = out
        self._raise_if_closed()
        if not self.auto:
            return self.loader.collate_fn(samples[0])
        return self.loader.collate_fn(samples)


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """[a, b) of each run of consecutive numbers in sorted `positions`."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs
