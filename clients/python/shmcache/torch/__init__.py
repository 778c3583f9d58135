"""PyTorch helpers: cache a map-style or a streaming dataset in shmcache.

    from shmcache import DatasetCache
    from shmcache.torch import CachedDataset
    cache = DatasetCache(session_id=S)
    ds = CachedDataset(decoded_dataset, cache, transform=RandomCrop(32, 4))
    loader = DataLoader(ds, batch_size=64, num_workers=2)

This package gathers the PyTorch side of shmcache; each part lives in a
module of its own:
- datasets.py: CachedDataset, CachedIterableDataset;
- fingerprint.py: the cache a dataset gets, named after a fingerprint of
  it (dataset_fingerprint, cache_for_dataset);
- loader.py: CachedLoader, the batch loader over a CachedDataset;
- batch_source.py: BatchSource, what CachedLoader.iter_source takes
  instead of its batch sampler (batches that bring rows of their own);
- samplers.py: NodeAffineSampler for jobs over several hosts;
- partitioned/: PartitionedLoader, rows partitioned over several nodes'
  caches.
Modules whose names start with "_" are the loaders' machinery, private to
this package.
"""

from __future__ import annotations

from .datasets import CachedDataset, CachedIterableDataset
from .fingerprint import cache_for_dataset, dataset_fingerprint
from .batch_source import BatchReport, BatchSource, SourcedBatch
from .loader import CachedLoader
from .samplers import NodeAffineSampler, node_partition
from .partitioned import PartitionedLoader

__all__ = ["CachedDataset", "CachedIterableDataset", "CachedLoader",
           "dataset_fingerprint", "cache_for_dataset", "NodeAffineSampler",
           "node_partition", "PartitionedLoader", "BatchSource", "SourcedBatch",
           "BatchReport"]
