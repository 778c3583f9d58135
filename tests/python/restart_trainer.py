"""A trainer for test_daemon_restart.py: CachedLoader epochs over Images
with two DataLoader workers, each checked against plain DataLoader's
batches of the same samples: the first three over the first half of the
samples, the last two over all. It says `epoch K` after each and waits
for a line on stdin before the next; at the end it prints one JSON line:
the CacheWarnings it saw and, per epoch, the cache's hits and misses so
far (None once the cache is bypassed)."""

import json
import sys
import warnings

import torch
from torch.utils.data import DataLoader

from helpers import Images
from shmcache import CacheWarning, DatasetCache
from shmcache.torch import CachedDataset, CachedLoader

N, BATCH, SIDE, EPOCHS = 64, 8, 32, 5


def main():
    session = int(sys.argv[1])
    ds = Images(N, SIDE)
    cds = CachedDataset(ds, DatasetCache(session, size_mb=16))
    counts = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for e in range(EPOCHS):
            torch.manual_seed(e)
            order = torch.randperm(N if e >= 3 else N // 2).tolist()
            loader = CachedLoader(cds, batch_size=BATCH, sampler=order, num_workers=2)
            got = list(loader)
            loader.flush(60)
            want = list(DataLoader(ds, batch_size=BATCH, sampler=order))
            assert len(got) == len(want), f"epoch {e}: {len(got)} batches"
            for k, ((gi, gl), (wi, wl)) in enumerate(zip(got, want)):
                assert torch.equal(gi, wi), f"epoch {e} batch {k}: images differ"
                assert torch.equal(gl, wl), f"epoch {e} batch {k}: labels differ"
            st = cds.stats()
            counts.append(None if st is None else [st["hits"], st["misses"]])
            print(f"epoch {e}", flush=True)
            if e + 1 < EPOCHS:
                sys.stdin.readline()
    said = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    print(json.dumps({"warnings": said, "counts": counts}), flush=True)


if __name__ == "__main__":
    main()
