"""One rank of the simulated multi-node DDP job of test_multinode.py.

Launched as srun launches ranks: torch.distributed's env:// variables
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
plus the node's shmcache instance (SHMCACHE_PORT, SHMCACHE_RUN_DIR) and
session (SESSION_ID). Trains a tiny model with gloo DDP for each sampler
("affine": NodeAffineSampler, "global": DistributedSampler(shuffle=True)),
once through the node's cache and once straight from the source, and writes
per epoch its loss sum and, on local rank 0, the cache's counters after the
epoch (all ranks stopped reading) to OUT_DIR/rank<RANK>.json.

    ddp_rank.py OUT_DIR NUM_SAMPLES EPOCHS
"""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import shmcache
from shmcache.torch import CachedDataset, NodeAffineSampler

from rank_job import IndexDataset, join, leave

FEATURES, CLASSES, BATCH = 32, 10, 10


class Features(IndexDataset):
    """Deterministic synthetic rows: (float32[FEATURES], label)."""

    def __init__(self, n):
        super().__init__(n, "synthetic-features")

    def __getitem__(self, i):
        x = np.random.default_rng(i).standard_normal(FEATURES).astype(np.float32)
        return x, i % CLASSES


def train(kind, cached, n, epochs):
    ds = Features(n)
    if cached:
        cache = shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"]))
        ds = CachedDataset(ds, cache, name=f"features-{kind}")
    if kind == "affine":
        sampler = NodeAffineSampler(ds, seed=0)
    else:
        sampler = DistributedSampler(ds, shuffle=True, seed=0)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler)
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        loss_sum = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            loss_sum += loss.item()
        if cached:
            # Misses are stored by CachedDataset's background writer: the
            # counters below must see every row this rank read.
            assert ds.flush(120), "the queued puts were not written"
        dist.barrier()           # every rank of every node is done reading
        record = {"loss_sum": loss_sum, "indices": list(iter(sampler))}
        if cached and int(os.environ["LOCAL_RANK"]) == 0:
            st = ds.stats()
            record["stats"] = {k: st[k] for k in ("mem_rows", "hits", "misses")}
        dist.barrier()           # counters read before anyone reads again
        out.append(record)
    return out


def main():
    out_dir, n, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    join(120)
    results = {f"{kind}-{'cache' if cached else 'source'}": train(kind, cached, n, epochs)
               for kind in ("affine", "global") for cached in (True, False)}
    leave(out_dir, results, barrier=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
