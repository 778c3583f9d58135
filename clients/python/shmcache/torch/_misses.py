"""The rows a CachedLoader did not find in the cache, computed on torch's
own worker machinery (MissWorkers) or in the calling thread (compute_rows).

A computed row is one of:
- Stored(): a worker put it into the cache (the loader reads it from there,
  no pickling);
- Columns(cols): its [(name, dtype, array)], which the cache did not take
  (full, gone) or which was computed in the trainer's process;
- Sample(sample, why): the sample as the dataset made it, which has no
  column encoding (too many columns, a name too long, a value of no column
  type); it is delivered as is, as CachedDataset delivers it.

MissWorkers(cds, num_workers, ...) is a torch DataLoader with persistent
workers over the missing indices, fed through a batch sampler this module
controls: the workers are DataLoader's (its seeding, get_worker_info,
worker_init_fn, timeout=, multiprocessing_context, its errors naming a dead
worker's pid, its watchdog). Each worker also ends within
PARENT_POLL_S of its parent's death (SIGKILL included). compute() runs one
batch's misses at a time (chunks spread over all workers); with owned=, a
mask, the workers put only the rows it marks (the others come back as
Columns: PartitionedLoader's rows of another node, which go to their
owner instead); close() stops
it: a compute in progress raises Closed after the chunk it waits for, and
the workers are shut down by whichever thread drops the DataLoader last,
never by the caller of close() waiting on a busy worker.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch.utils.data import DataLoader, Dataset

from .. import CacheWarning
from ..rows import Column, encode

__all__ = ["Stored", "Columns", "Sample", "Computed", "Closed", "compute_rows",
           "MissWorkers", "PARENT_POLL_S"]

PARENT_POLL_S = 0.2      # a worker checks this often that its trainer lives
_MAX_CHUNK = 1024        # rows per task sent to a worker


@dataclass
class Stored:
    """The row is in the cache now."""


@dataclass
class Columns:
    cols: list[Column]


@dataclass
class Sample:
    sample: Any
    why: str


Computed = Union[Stored, Columns, Sample]


class Closed(RuntimeError):
    """The loader's iterator was closed while misses were being computed."""


def _compute(cds: Any, index: int, put: bool) -> Computed:
    sample = cds.dataset[index]
    try:
        cols = encode(sample)
    except (TypeError, ValueError) as e:
        return Sample(sample, str(e))
    if put:
        with warnings.catch_warnings():
            # The trainer's process warns, once, when it stores the row again.
            warnings.simplefilter("ignore", CacheWarning)
            # Not strict: a row past the cache's limits (columns, name
            # length) comes back as columns, delivered as CachedDataset
            # delivers it.
            if cds.cache.put_encoded([index], [cols], strict=False)[0] or \
                    cds.cache.contains(index):
                return Stored()
    return Columns(cols)


def compute_rows(cds: Any, ids: Sequence[int],
                 stopped: Callable[[], bool]) -> list[Computed]:
    """Rows `ids` of the CachedDataset's dataset computed in this thread,
    not put (the caller queues them); raises Closed, before the next row,
    once stopped() is true."""
    out: list[Computed] = []
    for i in ids:
        if stopped():
            raise Closed("the CachedLoader iterator was closed")
        out.append(_compute(cds, i, put=False))
    return out


class _Rows(Dataset[Computed]):
    """What a worker computes: row i, put into the cache by the worker
    (key i), or put only when `put` says so (key (i, put))."""

    def __init__(self, cds: Any) -> None:
        self.cds = cds

    def __len__(self) -> int:
        return len(self.cds)

    def __getitem__(self, key: int | tuple[int, bool]) -> Computed:
        index, put = key if isinstance(key, tuple) else (key, True)
        return _compute(self.cds, index, put=put)


class _Chunks:
    """The batch sampler of the workers' DataLoader: the chunks of the
    compute in progress."""

    def __init__(self) -> None:
        self.chunks: list[list[Any]] = []

    def __iter__(self) -> Any:
        return iter(self.chunks)

    def __len__(self) -> int:
        return len(self.chunks)


def _as_list(rows: list[Computed]) -> list[Computed]:
    return rows


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


class _WorkerInit:
    """worker_init_fn of the workers: a thread that ends the worker when its
    trainer is gone (DataLoader's own watchdog looks every 5 s, and not
    while the worker computes), then the user's worker_init_fn."""

    def __init__(self, parent: int, user: Callable[[int], None] | None) -> None:
        self.parent, self.user = parent, user

    def __call__(self, worker_id: int) -> None:
        threading.Thread(target=_watch_parent, args=(self.parent,), daemon=True,
                         name="shmcache-parent-watch").start()
        if self.user is not None:
            self.user(worker_id)


class MissWorkers:
    """See the module. base_seed seeds the workers (DataLoader's seeding
    from a generator of that seed, so the trainer's torch RNG is not
    drawn from)."""

    def __init__(self, cds: Any, num_workers: int, context: Any = None,
                 base_seed: int = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 timeout: float = 0) -> None:
        self._num_workers = num_workers
        self._chunks = _Chunks()
        self._lock = threading.Lock()      # one compute at a time
        self._closed = False
        self._loader: DataLoader[Computed] | None = DataLoader(
            _Rows(cds), batch_sampler=self._chunks, num_workers=num_workers,
            collate_fn=_as_list, timeout=timeout,
            worker_init_fn=_WorkerInit(os.getpid(), worker_init_fn),
            multiprocessing_context=context, persistent_workers=True,
            generator=torch.Generator().manual_seed(base_seed))

    def compute(self, ids: Sequence[int],
                owned: Sequence[bool] | None = None) -> list[Computed]:
        """The rows of `ids`, in order; with `owned`, only the rows it marks
        are put by the workers (see the module)."""
        keys: list[Any] = list(ids) if owned is None else \
            [(int(i), bool(o)) for i, o in zip(ids, owned)]
        if not keys:
            return []
        with self._lock:
            if self._closed or self._loader is None:
                # A close() that came while another thread computed left the
                # workers to the next thread here: they end now. No local
                # may hold the DataLoader on this path: the traceback of
                # Closed can keep this frame, and the workers with it, alive
                # until a garbage collection.
                self._loader = None
                raise Closed("the CachedLoader iterator was closed")
            loader = self._loader
            size = min(_MAX_CHUNK, max(1, -(-len(keys) // (2 * self._num_workers))))
            self._chunks.chunks = [keys[k:k + size] for k in range(0, len(keys), size)]
            out: list[Computed] = []
            try:
                for rows in loader:
                    if self._closed:
                        raise Closed("the CachedLoader iterator was closed")
                    out.extend(rows)
            finally:
                del loader
                if self._closed:
                    self._loader = None    # the workers end here, not in close()
            return out

    def close(self) -> None:
        """Stops computing (see the module); returns at once."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._loader = None        # idle workers: they exit now
            finally:
                self._lock.release()
