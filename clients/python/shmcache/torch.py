"""PyTorch helpers: cache a map-style or a streaming dataset in shmcache.

    from shmcache import DatasetCache
    from shmcache.torch import CachedDataset
    cache = DatasetCache(session_id=S)
    ds = CachedDataset(decoded_dataset, cache, transform=RandomCrop(32, 4))
    loader = DataLoader(ds, batch_size=64, num_workers=2)

This module gathers the PyTorch side of the package; each part lives in a
module of its own:
- shmcache.datasets: CachedDataset, CachedIterableDataset and the cache
  name a dataset gets (dataset_fingerprint, cache_for_dataset);
- shmcache.loader: CachedLoader, the batch loader over a CachedDataset;
- shmcache.samplers: NodeAffineSampler for jobs over several hosts.
"""

from __future__ import annotations

from .datasets import (CachedDataset, CachedIterableDataset, cache_for_dataset,
                       dataset_fingerprint)
from .loader import CachedLoader
from .samplers import NodeAffineSampler, node_partition
from .partitioned import PartitionedLoader

__all__ = ["CachedDataset", "CachedIterableDataset", "CachedLoader",
           "dataset_fingerprint", "cache_for_dataset", "NodeAffineSampler",
           "node_partition"]
__all__ += ["PartitionedLoader"]   # rows partitioned over the nodes' caches
