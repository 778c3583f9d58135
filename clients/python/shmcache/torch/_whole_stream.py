"""whole_stream: a streaming source iterated whole inside a DataLoader
worker, as in the trainer's process.

CachedIterableDataset shards a stream over DataLoader's workers itself
(worker w keeps samples w, w+W, ...) and builds its cache from one
worker's pass over the whole stream. A source that also shards itself by
get_worker_info(), as torch's IterableDataset documentation shows, would
give each worker only its part: the two shardings compound (samples lost)
and the builder would seal a part as the whole. So the source's own code
(its __iter__ and each step) runs with get_worker_info() None, as it runs
in the trainer's process; the wrapper's code between steps sees the
worker. torch has no public way to do this: the module global that
get_worker_info() returns is set aside around each call into the source,
and left alone where it is missing (another torch layout).

Thread safety: the worker's info is set aside for the whole process while
the source runs; DataLoader runs a worker's dataset code on its one
thread, and shmcache's own threads there ask get_worker_info() once,
before (datasets._ask_in_worker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from torch.utils.data._utils import worker as _worker

T = TypeVar("T")


def _as_main(call: Callable[[], T]) -> T:
    info = getattr(_worker, "_worker_info", None)
    if info is None:
        return call()
    _worker._worker_info = None
    try:
        return call()
    finally:
        _worker._worker_info = info


def whole_stream(source: Iterable[Any]) -> Iterator[Any]:
    """Yields every sample of `source`, its code run as in the main process."""
    it = _as_main(lambda: iter(source))
    while True:
        try:
            sample = _as_main(lambda: next(it))
        except StopIteration:
            return
        yield sample
