"""Worker processes that compute the rows a CachedLoader did not find in the
cache (MissPool).

Contract:
- MissPool(fn, obj, ...): a worker computes row i as fn(obj, i); fn is a
  module-level function and obj picklable (spawn) or inherited (fork).
- compute(indices) returns fn(obj, i) per index, in order; the calling thread waits while the workers compute. Indices are
  split into chunks that idle workers take, so one batch's misses are
  computed by all workers at once.
- Workers start at the first compute(), seeded as DataLoader seeds its
  workers (base_seed + worker id for random and torch, numpy from both),
  with get_worker_info() set (its dataset: obj) and worker_init_fn(worker_id)
  called.
- An exception in the dataset is re-raised by compute() with the worker's
  traceback; a worker that dies fails compute() with a RuntimeError naming
  its pid and exit code.
- close() stops the workers (each finishes its chunk), terminates those
  still alive after a bound, and fails pending computes. The pool starts
  one thread of its own (the collector), which close() joins.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from multiprocessing.connection import wait
from multiprocessing.context import BaseContext
from typing import Any

from . import EncodedColumn, StoredColumn, encode_row

__all__ = ["MissPool", "encoded_sample", "for_put"]

_JOIN_S = 5.0        # DataLoader's bound for a worker to exit
_POLL_S = 0.5        # the collector checks for close() this often


def encoded_sample(dataset: Any, index: int) -> list[StoredColumn]:
    """dataset[index] as [(name, tag, array)], as the cache returns rows
    (tag: "bytes", "bfloat16" or the array's dtype name)."""
    return [(n, d or a.dtype.name, a) for n, a, d in encode_row(dataset[index])]


def for_put(cols: Sequence[StoredColumn]) -> list[EncodedColumn]:
    """[(name, tag, array)] as put_columns takes it: [(name, array, dtype)]."""
    return [(n, a, t if t in ("bytes", "bfloat16") else None) for n, t, a in cols]


def _seed(base_seed, wid, num_workers, dataset, init_fn):
    import numpy as np
    import torch
    from torch.utils.data._utils import worker as torch_worker
    seed = base_seed + wid
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(torch_worker._generate_state(base_seed, wid))
    torch.set_num_threads(1)
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=wid, num_workers=num_workers, seed=seed, dataset=dataset)
    if init_fn is not None:
        init_fn(wid)


def _worker_main(fn, obj, wid, num_workers, base_seed, init_fn, tasks, results):
    from torch.utils.data._utils import ExceptionWrapper
    _seed(base_seed, wid, num_workers, obj, init_fn)
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        tid, indices = task
        try:
            rows = [fn(obj, i) for i in indices]
            results.send((tid, rows, None))
        except Exception:   # noqa: BLE001 -- re-raised in the trainer
            results.send((tid, None, ExceptionWrapper(
                where=f"in CachedLoader worker process {wid}")))


class _Worker:
    def __init__(self, ctx, wid, args):
        task_r, self.tasks = ctx.Pipe(duplex=False)
        self.results, result_w = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_worker_main,
                                args=args[:2] + (wid,) + args[2:] + (task_r, result_w),
                                name=f"shmcache-loader-worker-{wid}", daemon=True)
        self.proc.start()
        task_r.close()
        result_w.close()
        self.pending: set[int] = set()   # task ids sent and not answered


class MissPool:
    def __init__(self, fn: Callable[[Any, int], Any], obj: Any, num_workers: int,
                 context: str | BaseContext | None = None, base_seed: int = 0,
                 worker_init_fn: Callable[[int], None] | None = None) -> None:
        self._fn, self._obj = fn, obj
        self._num_workers = num_workers
        self._ctx = mp.get_context(context) if isinstance(context, (str, type(None))) \
            else context
        self._base_seed = base_seed
        self._init_fn = worker_init_fn
        self._lock = threading.Lock()
        self._workers: list[_Worker] | None = None
        self._futures: dict[int, Future[list[Any]]] = {}   # by task id
        self._ids = itertools.count()
        self._closed = False
        self._collector: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._workers is not None

    def compute(self, indices: Iterable[int]) -> list[Any]:
        """The encoded samples of `indices` (see the module)."""
        futures = self._submit(list(indices))
        rows = []
        for f in futures:
            try:
                rows.extend(f.result())
            except _Reraised as e:
                e.wrapper.reraise()
        return rows

    def _submit(self, indices: list[int]) -> list[Future[list[Any]]]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the CachedLoader iterator was closed")
            workers = self._workers if self._workers is not None else self._start_locked()
            n = len(workers)
            size = max(1, -(-len(indices) // (2 * n)))
            futures = []
            for k in range(0, len(indices), size):
                tid, fut = next(self._ids), Future[list[Any]]()
                w = min(workers, key=lambda w: len(w.pending))
                self._futures[tid] = fut
                w.pending.add(tid)
                w.tasks.send((tid, indices[k:k + size]))
                futures.append(fut)
            return futures

    def _start_locked(self) -> list[_Worker]:
        args = (self._fn, self._obj, self._num_workers, self._base_seed, self._init_fn)
        workers = [_Worker(self._ctx, w, args) for w in range(self._num_workers)]
        self._workers = workers
        self._collector = threading.Thread(target=self._collect, args=(workers,),
                                           daemon=True, name="shmcache-loader-misses")
        self._collector.start()
        return workers

    def _collect(self, workers: list[_Worker]) -> None:
        by_conn = {w.results: w for w in workers}
        by_sentinel = {w.proc.sentinel: w for w in workers}
        while not self._closed:
            for ready in wait(list(by_conn) + list(by_sentinel), _POLL_S):
                w = by_conn.get(ready)
                if w is not None:
                    try:
                        tid, rows, err = w.results.recv()
                    except (EOFError, OSError):
                        continue   # its sentinel reports the death
                    self._resolve(w, tid, rows, err)
                elif not self._closed:
                    w = by_sentinel.pop(ready)
                    by_conn.pop(w.results, None)
                    self._fail(w, RuntimeError(
                        f"CachedLoader worker (pid {w.proc.pid}) exited unexpectedly "
                        f"with exit code {w.proc.exitcode}"))

    def _resolve(self, w, tid, rows, err):
        with self._lock:
            w.pending.discard(tid)
            fut = self._futures.pop(tid, None)
        if fut is None:
            return
        if err is not None:
            fut.set_exception(_Reraised(err))
        else:
            fut.set_result(rows)

    def _fail(self, w, exc):
        with self._lock:
            tids, w.pending = w.pending, set()
            futs = [self._futures.pop(t) for t in tids if t in self._futures]
        for f in futs:
            f.set_exception(exc)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = self._workers or []
        for w in workers:
            # A busy worker computes rows nobody will read (and may block
            # sending them): it is terminated; an idle one exits.
            if w.pending:
                w.proc.terminate()
            else:
                try:
                    w.tasks.send(None)
                except OSError:
                    w.proc.terminate()
        if self._collector is not None:
            self._collector.join(_POLL_S * 4)
        for w in workers:
            w.proc.join(_JOIN_S)
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join(_JOIN_S)
            w.tasks.close()
            w.results.close()
            self._fail(w, RuntimeError("the CachedLoader iterator was closed"))


class _Reraised(Exception):
    """Carries a worker's ExceptionWrapper; reraise() raises the original
    exception type with the worker's traceback in its message."""

    def __init__(self, wrapper):
        super().__init__(wrapper.exc_msg)
        self.wrapper = wrapper

