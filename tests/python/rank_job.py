"""What the ranks of the simulated multi-node jobs share (ddp_rank.py,
partition_rank.py, partition_types_rank.py): joining the job through
torch.distributed's env:// variables, a dataset of samples made from their
index, the CacheWarnings a rank saw, and leaving the job with its results
written to OUT_DIR/rank<RANK>.json (the file the tests read)."""

import datetime
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

import shmcache


def join(timeout_s):
    """One CPU thread (ranks share the host's cores) and a gloo process
    group of every rank, each collective bounded by `timeout_s`."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout_s))


def leave(out_dir, results, barrier=True):
    """Waits for every rank (unless barrier is False), leaves the group and
    writes `results` as JSON."""
    if barrier:
        dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(results, f)


def cache_warnings(caught):
    """The messages of the shmcache.CacheWarnings among warnings recorded
    by warnings.catch_warnings(record=True)."""
    return [str(w.message) for w in caught if issubclass(w.category, shmcache.CacheWarning)]


class IndexDataset(Dataset):
    """n samples, each made from its index alone by __getitem__; `root`
    names the data to CachedDataset (its identity)."""

    def __init__(self, n, root):
        self.n, self.root = n, root

    def __len__(self):
        return self.n
