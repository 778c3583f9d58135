"""PyTorch helpers: cache a map-style or a streaming dataset in shmcache.

    from shmcache import DatasetCache
    from shmcache.torch import CachedDataset
    cache = DatasetCache(session_id=S)
    ds = CachedDataset(decoded_dataset, cache, transform=RandomCrop(32, 4))
    loader = DataLoader(ds, batch_size=64, num_workers=2)

A sample is cached after the wrapped dataset produced it and is returned as
tensors (a tuple stays a tuple, a dict a dict, numbers become 0-d tensors,
bytes stay bytes), whether it was a hit or a miss, so every epoch sees the
same types. torch 1.13 has no uint16/32/64: those become int32/int64.

Random augmentation: caching after a random transform freezes the first
epoch's random choices for every later epoch. Put only the deterministic
part (decode, resize) in the wrapped dataset and pass the random part as
`transform=`, which runs after the cache on every access. CachedDataset
refuses a wrapped dataset whose transform looks random (torchvision's
Random*, ColorJitter, *Augment*...) unless allow_random=True.
"""

import hashlib
import os
import re

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from . import DatasetCache, _column_names, decode_row, encode_row
from .samplers import NodeAffineSampler, node_partition

__all__ = ["CachedDataset", "CachedIterableDataset", "dataset_fingerprint",
           "NodeAffineSampler", "node_partition"]

_RANDOM_TRANSFORM = re.compile(
    r"\b(Random\w*|ColorJitter|\w*Augment\w*|AugMix|GaussianBlur|"
    r"ElasticTransform)\s*\(")

# Bookkeeping rows of a streaming cache (above shmcache.MAX_ROW_ID).
_BUILDER_ID = 2**64 - 1
_SEALED_ID = 2**64 - 2


def _leaf_to_tensor(dtype, array):
    if dtype == "bytes":
        return array.tobytes()
    if dtype == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if array.dtype.kind == "u" and array.dtype.itemsize > 1:
        # torch has no uint16/32/64: widen (uint64 wraps above 2**63).
        wide = np.int32 if array.dtype.itemsize == 2 else np.int64
        return torch.from_numpy(array.astype(wide))
    return torch.from_numpy(array)


def _to_tensors(columns):
    """Tensors of encoded (name, array, dtype) columns, as a hit returns."""
    return decode_row([(n, d or "", a) for n, a, d in columns], _leaf_to_tensor)


def dataset_fingerprint(dataset):
    """A stable description of a dataset: its class, length, root/path and
    the repr of its transforms. Two datasets that differ in any of these get
    different caches."""
    parts = [f"{type(dataset).__module__}.{type(dataset).__qualname__}"]
    try:
        parts.append(f"len={len(dataset)}")
    except TypeError:
        pass
    for attr in ("root", "path", "root_dir", "data_dir", "dataset_path", "files"):
        if hasattr(dataset, attr):
            parts.append(f"{attr}={getattr(dataset, attr)!r}")
    for attr in ("transform", "target_transform", "transforms"):
        if getattr(dataset, attr, None) is not None:
            parts.append(f"{attr}={getattr(dataset, attr)!r}")
    inner = getattr(dataset, "dataset", None)   # Subset and friends
    if isinstance(inner, Dataset) and inner is not dataset:
        parts.append("of=" + dataset_fingerprint(inner))
        if hasattr(dataset, "indices"):
            parts.append("indices=" + hashlib.sha1(
                np.asarray(dataset.indices, dtype=np.int64).tobytes()).hexdigest())
    return "|".join(parts)


def _cache_for(dataset, cache, name, allow_random):
    if not isinstance(cache, DatasetCache):
        raise TypeError(f"cache must be a shmcache.DatasetCache, got "
                        f"{type(cache).__name__}")
    desc = dataset_fingerprint(dataset)
    if not allow_random and _RANDOM_TRANSFORM.search(desc):
        raise ValueError(
            "the dataset applies a random transform; caching it would freeze "
            "the first epoch's random choices. Cache the deterministic part "
            "and pass the random transforms as transform=..., or pass "
            "allow_random=True")
    fp = "fp-" + hashlib.sha256(desc.encode()).hexdigest()[:40]
    if name is not None and not isinstance(name, str):
        raise TypeError("name must be a str")
    return cache.named(name or fp, fp)


class CachedDataset(Dataset):
    """Wraps a map-style dataset: a hit returns the cached sample, a miss
    computes dataset[i], caches it and returns it (both as tensors).

    cache: a shmcache.DatasetCache (its session and size are used; the name
      is this dataset's). name: the cache name, default a fingerprint of the
      dataset (class, length, root/path, transform repr).
    transform: applied after the cache, on every access (the place for
      random augmentation).
    columns: read only these columns of each row (names of a dict sample or
      positions of a tuple sample).
    copy: whether a hit returns tensors over a private copy (True) or over
      the cache's shared memory, without a copy (False). The default (None)
      is zero-copy inside a DataLoader worker when there is no `transform`:
      there the sample only goes to the collate function, whose batching
      (default_collate's stack, written straight into the shared memory
      that carries the batch to the trainer) is then the one copy of the
      sample; elsewhere hits are copied. Zero-copy tensors alias memory
      that every process of the session reads: never modify them in place
      (torch has no read-only tensors); a collate_fn or transform that
      works in place needs copy=True.
    Works under DataLoader(num_workers>0) with fork or spawn, and with
    DistributedSampler. Under a DataLoader with batching, a batch of hits is
    read with one call (__getitems__); rows the cache spilled to disk then
    come from the daemon in one round trip per batch.
    """

    def __init__(self, dataset, cache, name=None, transform=None,
                 columns=None, allow_random=False, copy=None):
        if copy is not None and not isinstance(copy, bool):
            raise TypeError(f"copy must be None, True or False, got {copy!r}")
        _column_names(columns)   # a bad selection fails here, not per sample
        self.dataset = dataset
        self.cache = _cache_for(dataset, cache, name, allow_random)
        self.transform = transform
        self.columns = columns
        self.copy = copy
        self.cache.open()   # a wrong pipeline under this name fails here

    def __len__(self):
        return len(self.dataset)

    def _zero_copy(self):
        if self.copy is not None:
            return not self.copy
        return self.transform is None and get_worker_info() is not None

    def _hit(self, cols):
        if self.columns is not None and isinstance(self.columns, (str, int)):
            return _leaf_to_tensor(cols[0][1], cols[0][2])
        return decode_row(cols, _leaf_to_tensor)

    def _miss(self, index):
        encoded = encode_row(self.dataset[index])
        self.cache.put_columns(index, encoded)
        sample = _to_tensors(encoded)
        if self.columns is not None:
            sample = self._project(sample)
        return sample

    def _out(self, sample):
        if self.transform is not None:
            sample = self.transform(sample)
        return sample

    def __getitem__(self, index):
        if isinstance(index, torch.Tensor):
            index = int(index)
        # Zero-copy arrays come back writable-flagged (never written: they
        # only become tensors), so torch.from_numpy does not warn.
        zero_copy = self._zero_copy()
        cols = self.cache.get_columns(index, self.columns, copy=not zero_copy,
                                      _readonly=not zero_copy)
        sample = self._hit(cols) if cols is not None else self._miss(index)
        return self._out(sample)

    def __getitems__(self, indices):
        """The samples of a batch (DataLoader's fetcher calls this). Copied
        hits of all columns are read with one batched get; zero-copy hits
        and projections go row by row (they cost no round trip)."""
        indices = [int(i) for i in indices]
        if self._zero_copy() or self.columns is not None:
            return [self[i] for i in indices]
        rows = self.cache.get_batch_columns(indices, copy=True)
        return [self._out(self._hit(cols) if cols is not None else self._miss(i))
                for i, cols in zip(indices, rows)]

    def _project(self, sample):
        cols = self.columns
        if isinstance(cols, (str, int)):
            return sample[cols]
        if isinstance(sample, dict):
            return {c: sample[c] for c in cols}
        return tuple(sample[c] for c in cols)

    def stats(self):
        return self.cache.stats()


class CachedIterableDataset(IterableDataset):
    """Caches a streaming (non-mappable) source.

    The first complete pass builds the cache: exactly one iterator (over
    all processes of the session) becomes the builder; it stores every
    sample in order and seals the cache at the end of its pass. Until then,
    other iterators stream from the source. Once sealed, every pass reads
    the cache and never touches the source.

    Under DataLoader(num_workers=W), worker w yields samples w, w+W, ...
    A builder that dies before sealing leaves the cache unsealed: readers
    go on streaming from the source (drop the session to rebuild). If the
    cache fills up during the build it is not sealed either.
    """

    def __init__(self, source, cache, name=None, transform=None,
                 allow_random=False):
        self.source = source
        self.cache = _cache_for(source, cache, name, allow_random)
        self.transform = transform
        self.built = False   # this object's iterator was the builder
        self.cache.open()

    def sealed_count(self):
        """Rows in the sealed cache, or None while it is not sealed."""
        cols = self.cache.get_columns(_SEALED_ID, _reserved=True)
        return None if cols is None else int(cols[0][2])

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        n = self.sealed_count()
        if n is not None:
            for i in range(wid, n, nw):
                cols = self.cache.get_columns(i)
                if cols is None:        # cache gone: the source is the truth
                    yield from self._stream(wid, nw, False, start=i)
                    return
                yield self._out(decode_row(cols, _leaf_to_tensor))
            return
        me = np.array([os.getpid()], dtype=np.int64)
        builder = self.cache.put_columns(_BUILDER_ID, [("builder", me, None)],
                                         _reserved=True)
        if builder:
            self.built = True
        yield from self._stream(wid, nw, builder)

    def _stream(self, wid, nw, builder, start=0):
        count = 0
        for i, sample in enumerate(self.source):
            count = i + 1
            if builder:
                encoded = encode_row(sample)
                self.cache.put_columns(i, encoded)
                if i >= start and i % nw == wid:
                    yield self._out(_to_tensors(encoded))
            elif i >= start and i % nw == wid:
                yield self._out(_to_tensors(encode_row(sample)))
        if builder and self.cache.accepting:
            n = np.array(count, dtype=np.int64)
            self.cache.put_columns(_SEALED_ID, [("count", n, None)], _reserved=True)

    def _out(self, sample):
        return self.transform(sample) if self.transform is not None else sample
