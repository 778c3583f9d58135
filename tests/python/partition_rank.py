"""One rank of the simulated multi-node job of test_partitioned.py.

Launched as srun launches ranks: torch.distributed's env:// variables
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
plus the node's shmcache instance (SHMCACHE_PORT, SHMCACHE_RUN_DIR) and
session (SESSION_ID). Trains a tiny model with gloo DDP over
DistributedSampler(shuffle=True) batches twice: straight from the source
("source") and through PartitionedLoader over the nodes' caches
("partitioned"), and writes per epoch the batches it saw (indices and a
digest of the values), its loss sum, the loader's counters and its node's
cache's own misses counter at the epoch's end to OUT_DIR/rank<RANK>.json.

    partition_rank.py OUT_DIR NUM_SAMPLES EPOCHS BATCH WORKERS KIND WINDOW [BREAK]

KIND: what PartitionedLoader wraps, "dataloader" (DataLoader(CachedDataset))
or "cachedloader" (CachedLoader); WINDOW: its window= (batches per round).

BREAK "rank:epoch:batches": that rank leaves that epoch of the partitioned
run after that many batches (the other ranks go on to the end).
"""

import hashlib
import os
import sys
import threading
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import shmcache
from shmcache.torch import CachedDataset, CachedLoader, PartitionedLoader

from rank_job import IndexDataset, cache_warnings, join, leave

FEATURES, CLASSES = 16, 5


class Features(IndexDataset):
    """Deterministic synthetic rows: (float32[FEATURES], label, index)."""

    def __init__(self, n):
        super().__init__(n, "synthetic-partitioned")

    def __getitem__(self, i):
        x = np.random.default_rng(i).standard_normal(FEATURES).astype(np.float32)
        return x, i % CLASSES, i


def digest(x):
    return hashlib.sha1(x.contiguous().numpy().tobytes()).hexdigest()[:16]


def train(loader, sampler_or_loader, epochs, brk, cds=None):
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    rank = dist.get_rank()
    out = []
    for epoch in range(epochs):
        sampler_or_loader.set_epoch(epoch)
        before = dict(getattr(loader, "counters", {}))
        loss_sum, batches = 0.0, []
        stop = brk is not None and brk[0] == rank and brk[1] == epoch
        for x, y, idx in loader:
            batches.append({"indices": idx.tolist(), "x": digest(x), "y": y.tolist()})
            if stop and len(batches) == brk[2]:
                break
            if brk is None:   # DDP needs every rank at every step
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                loss_sum += loss.item()
        after = getattr(loader, "counters", {})
        record = {"loss_sum": loss_sum, "batches": batches,
                  "counters": {k: after[k] - before.get(k, 0) for k in after}}
        st = cds.stats() if cds is not None else None
        # The node's cache (both its ranks): lookups that found nothing.
        record["cache_misses"] = None if st is None else st["misses"]
        out.append(record)
    return out


def main():
    out_dir, n, epochs, batch, workers = sys.argv[1], *map(int, sys.argv[2:6])
    kind, window = sys.argv[6], int(sys.argv[7])
    brk = tuple(map(int, sys.argv[8].split(":"))) if len(sys.argv) > 8 else None
    join(60)
    ds = Features(n)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    results = {"source": train(DataLoader(ds, batch_size=batch, sampler=sampler),
                               sampler, epochs, None)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"]))
        cds = CachedDataset(ds, cache, name="partitioned", async_puts=False)
        csampler = DistributedSampler(cds, shuffle=True, seed=0)
        make = {"dataloader": DataLoader, "cachedloader": CachedLoader}[kind]
        loader = PartitionedLoader(make(cds, batch_size=batch, sampler=csampler,
                                        num_workers=workers), window=window)
        results["partitioned"] = train(loader, loader, epochs, brk, cds)
        dist.barrier()           # every rank of every node is done
        st = cds.stats()
        results["mem_rows"] = None if st is None else st["mem_rows"]
        results["len"] = len(loader)
        results["owned"] = loader.exchange.owners.owned(loader.exchange.node)
        loader.close()
        results["threads"] = [t.name for t in threading.enumerate()
                              if t.name.startswith("shmcache-")]
    results["warnings"] = cache_warnings(caught)
    leave(out_dir, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
