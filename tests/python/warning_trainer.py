"""A trainer process of the warning-location tests: one pass of LOADER
(CachedLoader or DataLoader) with W workers (start method CTX) over a
CachedDataset whose rows the cache cannot take: PROBLEM "full" (64 rows of
1 MiB, for a server capped below that), "over_cap" (full too, in a cache
whose size_mb is over the cap, which the note at open foretells),
"closed" (the user closed the cache before the loop) or "uncacheable" (a
str label).
The lines marked `made` and `loop` are the user's lines a CacheWarning may
name.

    warning_trainer.py LOADER W CTX PROBLEM
"""

import sys

from torch.utils.data import DataLoader

from helpers import MiBRows, StrLabels
from shmcache import DatasetCache
from shmcache.torch import CachedDataset, CachedLoader


def main(kind, workers, context, problem):
    source = StrLabels(8) if problem == "uncacheable" else MiBRows(64)
    if problem == "over_cap":
        ds = CachedDataset(source, DatasetCache(size_mb=64, name=problem))  # made
    else:
        ds = CachedDataset(source, name=problem)  # made
    if problem == "closed":
        ds.cache.close()
    loader_class = CachedLoader if kind == "CachedLoader" else DataLoader
    extra = dict(multiprocessing_context=context) if workers else {}
    loader = loader_class(ds, batch_size=4, num_workers=workers, **extra)
    n = 0
    for batch in loader:  # loop
        n += len(batch[1])
    assert ds.flush(30)
    print(n)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
