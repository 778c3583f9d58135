"""One CachedLoader batch, assembled (BatchAssembler.assemble): the rule of
loader.py's contract, applied to a batch's indices.

1. Rows of the learned layout (a RowSchema) are read into the batch's
   buffers, all at once, by one native call (DatasetCache.fill_batch, with
   copy_threads threads), which says of each row whether it was read, is
   not cached, or is cached in another layout.
2. Rows of another layout are read from the cache row by row
   (read_columns: another layout, a projection); rows not cached are not
   looked up again. Then rows are taken from the batch's supplied rows (a
   BatchSource's), then computed (_misses.py: the miss workers, or this
   thread with num_workers=0). A computed row goes into the cache (the
   workers put it, or CachedDataset's writer queues it) when the batch
   keeps it; else it goes back in the BatchReport.
3. Rows that fit the layout are written into the buffers, which become the
   batch as default_collate would make it; otherwise the samples are
   collated (collate_fn, transform=), as DataLoader would.
4. batch_transform, pinning and the copy to the device (CudaStage) follow.

Several loader threads assemble batches at once; the layout learned from
the first row is shared by the loader's passes (LoaderState).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from torch.utils.data import default_collate

from .._read_into import ROW_MISSING, ROW_READ
from ..rows import encode
from ._autotune import usable_cpus
from ._device import CudaStage, tree_map
from ._misses import Closed, Columns, Computed, MissWorkers, Sample, Stored, compute_rows
from ._row_schema import RowSchema, decode_sample, project, read_columns
from .batch_source import BatchReport, SourcedBatch

__all__ = ["BatchAssembler"]


class BatchAssembler:
    """Assembles the batches of one pass (see the module). `loader`: the
    CachedLoader (its options); `state`: its LoaderState; the miss workers
    (num_workers > 0) start here, seeded from `base_seed`. close() stops
    computing: a compute in progress or asked for later raises Closed."""

    def __init__(self, loader: Any, state: Any, base_seed: int) -> None:
        self.loader = loader
        self.state = state
        self.cds = loader.dataset
        self.pin = loader.pin_memory or loader.device is not None
        self.stage = CudaStage(loader.device) if loader.device is not None else None
        self.pool = None
        if loader.num_workers > 0:
            self.pool = MissWorkers(self.cds, loader.num_workers,
                                    loader.multiprocessing_context, base_seed,
                                    loader.worker_init_fn, loader.timeout)
        self.tuner = state.tuner
        self.cpus = usable_cpus()
        self._inline = threading.Lock()   # num_workers=0: one compute at a time
        self.closed = False

    def close(self) -> None:
        """Stops computing; returns at once (the workers end after the chunk
        they compute)."""
        self.closed = True
        if self.pool is not None:
            self.pool.close()

    def assemble(self, indices: list[int], source: SourcedBatch,
                 report: BatchReport) -> tuple[Any, int]:
        """(batch, bytes) of the batch of `indices` (see the module);
        `report` is filled with what became of its rows."""
        n, columns = len(indices), self.cds.columns
        state = self.state
        schema = state.schema
        bufs, filled = None, np.zeros(n, dtype=bool)
        absent = filled    # rows the read found not cached
        if schema:
            bufs = schema.alloc(n, self.pin, state.buffers)
            out = schema.read_targets(bufs)
            # A dict out names its columns by its keys: the projection is in it.
            codes = self.cds.cache.fill_batch(
                indices, out, None if isinstance(out, dict) else columns,
                self.copy_threads(), codes=True)
            filled = codes == ROW_READ
            absent = codes == ROW_MISSING
        rest = np.flatnonzero(~filled).tolist()
        report.cache_hits += n - len(rest)
        rows = dict(zip(rest, self._rows([indices[p] for p in rest], source, report,
                                         absent[rest].tolist()))) if rest else {}
        state.count(samples=n, hits=n - len(rest))
        if schema is None and rows:
            schema = False if isinstance(rows[0], Sample) else self._learn(rows[0])
            bufs = schema.alloc(n, self.pin, state.buffers) if schema else None
        loader = self.loader
        direct = False   # the batch is the buffers (pinned when asked)
        if schema and all(not isinstance(r, Sample) and schema.fits(r)
                          for r in rows.values()):
            for p, r in rows.items():
                schema.fill(bufs, p, r)
            tensors = schema.tensors(bufs)
            direct = loader.transform is None and loader.collate_fn is None
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
            batch = loader.batch_transform(batch)
        nbytes = schema.nbytes(n) if schema else 0
        if self.pin and not (direct and loader.batch_transform is None):
            batch = tree_map(lambda t: t.pin_memory(), batch)
        if self.stage is not None:
            batch = self.stage.stage(batch)
        return batch, nbytes

    def copy_threads(self) -> int:
        """Threads to copy one batch's rows with: the cache's read_threads,
        fewer while the loader's threads already copy batches side by side,
        so that all of them together stay within the CPUs (more would only
        take turns: oversubscribed copies wait on the slowest share)."""
        return max(1, min(self.cds.cache.read_threads, self.cpus // max(1, self.tuner.threads)))

    def _learn(self, cols: Any) -> Any:
        schema = RowSchema.of(cols, self.cds.columns) or False
        if self.state.schema is None:
            self.state.schema = schema
        return schema

    def _rows(self, ids: list[int], source: SourcedBatch, report: BatchReport,
              absent: list[bool]) -> list[Any]:
        """Per id the row's [(name, dtype, array)] from the cache (copies;
        not looked up again where `absent` says the batch's read found no
        row: each read is counted once), else the source's supplied row,
        else computed (and queued for the cache, or left in the report when
        the source does not keep it), or a Sample the cache cannot hold."""
        cds = self.cds
        look = [k for k, gone in enumerate(absent) if not gone]
        rows: list[Any] = [None] * len(ids)
        if look:
            found = read_columns(cds.cache, [ids[k] for k in look], cds.columns, copy=True)
            for k, r in zip(look, found):
                rows[k] = r
        missing = [k for k, r in enumerate(rows) if r is None]
        report.cache_hits += len(ids) - len(missing)
        supplied = 0
        for k in missing:
            r = source.supplied(ids[k])
            if r is not None:
                rows[k] = project(encode(r), cds.columns)
                supplied += 1
        if supplied:
            missing = [k for k in missing if rows[k] is None]
        report.supplied += supplied
        report.computed += len(missing)
        self.state.count(hits=len(ids) - len(missing), misses=len(missing))
        if not missing:
            return rows
        kept = [source.keeps(ids[k]) for k in missing]
        owned = None if all(kept) else kept   # the rows the workers put
        stored = []     # rows a worker put into the cache
        computed = self._compute([ids[k] for k in missing], owned=owned)
        for j, (k, row) in enumerate(zip(missing, computed)):
            if isinstance(row, Stored):
                stored.append(k)
            elif isinstance(row, Columns):
                if kept[j]:
                    cds.store_row(ids[k], row.cols)
                else:
                    report.not_kept.append((ids[k], row.cols))
                rows[k] = project(row.cols, cds.columns)
            else:
                cds.warn_uncacheable(ids[k], row.why)
                rows[k] = Sample(cds.project(row.sample), row.why)
        if stored:
            again = read_columns(cds.cache, [ids[k] for k in stored], cds.columns,
                                 copy=True)
            gone = [k for k, cols in zip(stored, again) if cols is None]
            for k, cols in zip(stored, again):
                rows[k] = cols
            if gone:
                # Rows gone since (their session dropped): computed again.
                for k, row in zip(gone, self._compute([ids[k] for k in gone],
                                                      inline=True)):
                    if isinstance(row, Columns):
                        rows[k] = project(row.cols, cds.columns)
                    else:
                        assert isinstance(row, Sample)   # this thread puts nothing
                        rows[k] = Sample(cds.project(row.sample), row.why)
        return rows

    def _compute(self, ids: list[int], inline: bool = False,
                 owned: list[bool] | None = None) -> list[Computed]:
        """The rows of `ids` computed by the workers (or, with num_workers=0,
        here; `owned`: which rows the workers put); Closed once closed:
        nothing is computed in this process after close()."""
        if self.pool is not None and not inline:
            return self.pool.compute(ids, owned)
        if self.closed:
            raise Closed("the CachedLoader iterator was closed")
        with self._inline:
            return compute_rows(self.cds, ids, lambda: self.closed)

    def _collate(self, samples: list[Any]) -> Any:
        if self.loader.transform is not None:
            samples = [self.loader.transform(s) for s in samples]
        return (self.loader.collate_fn or default_collate)(samples)
