"""A trainer process of the warning-location tests: one pass of LOADER
(CachedLoader or DataLoader) with W workers (start method CTX) over a
CachedDataset whose rows the cache cannot take: PROBLEM "full" (64 rows of
1 MiB, for a server capped below that), "over_cap" (full too, in a cache
whose size_mb is over the cap, which the note at open foretells),
"closed" (the user closed the cache before the loop), "queue" (three
epochs, new workers each, of small rows whose background put queue of 1
byte is full from its first row in every worker: the writer of a worker
waits for its exit flush), "closed_later"
(persistent workers: a pass over the first 32 rows, then the user closes
the cache, then a pass over all 64; after each pass it prints the rows
seen and the cache's hits and rows, as another handle reads them),
"too_large" (three epochs, new workers each, of rows of 1 MiB in a cache
of 1 MB: each row is refused alone, the cache takes smaller ones) or
"uncacheable" (a str label).
The lines marked `made` and `loop` are the user's lines a CacheWarning may
name.

    warning_trainer.py LOADER W CTX PROBLEM
"""

import sys

from torch.utils.data import DataLoader, Sampler

import shmcache.async_put
from helpers import Images, MiBRows, StrLabels
from shmcache import DatasetCache
from shmcache.async_put import DEFAULT_QUEUE_BYTES
from shmcache.torch import CachedDataset, CachedLoader


class FirstRows(Sampler):
    """range(n), n set by the trainer between passes."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.n))


# Room for every row in the background put queue: 64 rows of 1 MiB are
# more than its default 64 MiB, and a writer slower than the pass (under
# load) dropped the last ones with the queue's own CacheWarning.
QUEUE = 2 * DEFAULT_QUEUE_BYTES


def writer_waits_for_exit(worker_id):
    """A worker's writer takes no row before the exit flush: its queue of 1
    byte stays full from the first row on, however slow the machine."""
    shmcache.async_put._HOLD_S = 3600.0


def main(kind, workers, context, problem):
    source = StrLabels(8) if problem == "uncacheable" else MiBRows(64)
    extra = dict(multiprocessing_context=context) if workers else {}
    passes = [None]
    if problem == "over_cap":
        ds = CachedDataset(source, DatasetCache(size_mb=64, name=problem), put_queue=QUEUE)  # made
    elif problem == "queue":
        source = Images(64)
        ds = CachedDataset(source, name=problem, put_queue=1, async_puts=True)  # made
        passes = [None] * 3
        extra.update(worker_init_fn=writer_waits_for_exit)
    elif problem == "too_large":
        ds = CachedDataset(source, DatasetCache(size_mb=1, name=problem))  # made
        passes = [None] * 3
    elif problem == "closed_later":
        ds = CachedDataset(source, name=problem, async_puts=False)  # made
        passes = [32, 64]
        extra.update(persistent_workers=True, sampler=FirstRows(32))
    else:
        ds = CachedDataset(source, name=problem, put_queue=QUEUE)  # made
    if problem == "closed":
        ds.cache.close()
    loader_class = CachedLoader if kind == "CachedLoader" else DataLoader
    loader = loader_class(ds, batch_size=4, num_workers=workers, **extra)
    for rows in passes:
        if rows == 64:
            ds.cache.close()
            loader.sampler.n = rows
        n = 0
        for batch in loader:  # loop
            n += len(batch[1])
        assert ds.flush(30)
        if rows is None:
            print(n)
        else:
            st = DatasetCache(name=ds.cache.name, fingerprint=ds.cache.fingerprint).stats()
            print(n, st.hits, st.mem_rows)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
