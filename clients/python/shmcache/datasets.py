"""Datasets that cache a map-style or a streaming dataset in shmcache
(imported through shmcache.torch).

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

Puts of misses are asynchronous by default (async_puts=True): the miss
returns its sample at once and a background thread of the process stores
the row (see shmcache.async_put for the queue bound, drops and exit).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from . import (Array, CacheStats, ColumnSelection, DatasetCache, EncodedColumn,
               _column_names, decode_row, encode_row)
from .async_put import DEFAULT_QUEUE_BYTES, AsyncPutter, put_rows

__all__ = ["CachedDataset", "CachedIterableDataset", "dataset_fingerprint",
           "cache_for_dataset"]

_RANDOM_TRANSFORM = re.compile(
    r"\b(Random\w*|ColorJitter|\w*Augment\w*|AugMix|GaussianBlur|"
    r"ElasticTransform)\s*\(")


def _leaf_to_tensor(dtype: str, array: Array) -> Any:
    if dtype == "bytes":
        return array.tobytes()
    if dtype == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if array.dtype.kind == "u" and array.dtype.itemsize > 1:
        # torch has no uint16/32/64: widen (uint64 wraps above 2**63).
        wide = np.int32 if array.dtype.itemsize == 2 else np.int64
        return torch.from_numpy(array.astype(wide))
    return torch.from_numpy(array)


def _leaf_for_put(dtype: str, array: Array) -> Any:
    """A leaf that encode_row turns back into exactly (array, dtype)."""
    if dtype == "bytes":
        return array.tobytes()
    if dtype == "bfloat16":
        return _leaf_to_tensor(dtype, array)
    return array


def _to_tensors(columns: Sequence[EncodedColumn]) -> Any:
    """Tensors of encoded (name, array, dtype) columns, as a hit returns."""
    return decode_row([(n, d or "", a) for n, a, d in columns], _leaf_to_tensor)


def dataset_fingerprint(dataset: Any) -> str:
    """A stable description of a dataset: its class, length, root/path and
    the repr of its transforms. Two datasets that differ in any of these get
    different caches. A root/path that names an existing file or directory
    counts as its resolved path (absolute, normalized, symlinks followed),
    so `images/`, `./images` and `/data/images` give one cache."""
    parts = [f"{type(dataset).__module__}.{type(dataset).__qualname__}"]
    try:
        parts.append(f"len={len(dataset)}")
    except TypeError:
        pass
    for attr in ("root", "path", "root_dir", "data_dir", "dataset_path", "files"):
        if hasattr(dataset, attr):
            parts.append(f"{attr}={_resolved(getattr(dataset, attr))!r}")
    for attr in ("transform", "target_transform", "transforms"):
        if getattr(dataset, attr, None) is not None:
            parts.append(f"{attr}={_stable_repr(getattr(dataset, attr))}")
    inner = getattr(dataset, "dataset", None)   # Subset and friends
    if isinstance(inner, Dataset) and inner is not dataset:
        parts.append("of=" + dataset_fingerprint(inner))
        if hasattr(dataset, "indices"):
            parts.append("indices=" + hashlib.sha1(
                np.asarray(dataset.indices, dtype=np.int64).tobytes()).hexdigest())
    return "|".join(parts)


def _resolved(value: Any) -> Any:
    """`value` with the paths in it that exist resolved: a str or PathLike
    naming an existing file or directory becomes its realpath; in a
    list/tuple of paths (thousands of files) each entry's directory is
    resolved, once per directory. Anything else is unchanged: a root that is
    only a label ("synthetic") must not depend on the working directory."""
    if type(value) in (list, tuple):
        dirs: dict[str, str | None] = {}
        return type(value)(_resolved_entry(v, dirs) for v in value)
    path = _as_str_path(value)
    if path is not None and os.path.exists(path):
        return os.path.realpath(path)
    return value


def _resolved_entry(value: Any, dirs: dict[str, str | None]) -> Any:
    """One path of a list, its directory resolved through `dirs` (a memo);
    a bare name (no directory) is left as it is."""
    path = _as_str_path(value)
    if path is None:
        return value
    head, tail = os.path.split(path)
    if head not in dirs:
        dirs[head] = os.path.realpath(head) if head and os.path.isdir(head) else None
    real = dirs[head]
    return value if real is None else os.path.join(real, tail)


def _as_str_path(value: Any) -> str | None:
    """The str path of a str or PathLike without NULs, else None."""
    if not isinstance(value, (str, os.PathLike)):
        return None
    path = os.fspath(value)
    return path if isinstance(path, str) and "\0" not in path else None


def _stable_repr(obj: object) -> str:
    """repr without the addresses of default reprs ("<function f at 0x..>"),
    which differ between processes: a trainer and a prefill process must
    compute the same fingerprint."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def cache_for_dataset(dataset: Any, cache: DatasetCache, name: str | None = None,
                      allow_random: bool = False) -> DatasetCache:
    """The DatasetCache (not opened) that CachedDataset(dataset, cache, name)
    uses: cache's session and size, name default the fingerprint."""
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


_cache_for = cache_for_dataset


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
      sample; elsewhere hits are copied. Zero-copy tensors (valid as long
      as they live: see the shmcache module docstring) alias memory
      that every process of the session reads: never modify them in place
      (torch has no read-only tensors); a collate_fn or transform that
      works in place needs copy=True.
    async_puts: a miss returns its sample at once and one background thread
      of the process stores the row (default True). put_queue: the most
      bytes of rows waiting for that thread (default 64 MiB per process);
      when it is full, rows are dropped, not waited for (counted in
      stats()["async_puts"], one CacheWarning) and are misses again next
      epoch. At exit, queued rows are written for at most 2 s
      (shmcache.async_put.EXIT_FLUSH_S), then dropped; that includes a
      DataLoader worker's exit at the end of an epoch. flush() waits for
      the queue. async_puts=False stores every miss before returning it.
    Works under DataLoader(num_workers>0) with fork or spawn, and with
    DistributedSampler. Under a DataLoader with batching, a batch of hits is
    read with one call (__getitems__); rows the cache spilled to disk then
    come from the daemon in one round trip per batch.
    """

    def __init__(self, dataset: Any, cache: DatasetCache, name: str | None = None,
                 transform: Callable[[Any], Any] | None = None,
                 columns: ColumnSelection = None, allow_random: bool = False,
                 copy: bool | None = None, async_puts: bool = True,
                 put_queue: int = DEFAULT_QUEUE_BYTES) -> None:
        if copy is not None and not isinstance(copy, bool):
            raise TypeError(f"copy must be None, True or False, got {copy!r}")
        if not isinstance(async_puts, bool):
            raise TypeError(f"async_puts must be True or False, got {async_puts!r}")
        if isinstance(put_queue, bool) or not isinstance(put_queue, int) \
                or put_queue < 1:
            raise ValueError(f"put_queue is a size in bytes (>= 1), got {put_queue!r}")
        _column_names(columns)   # a bad selection fails here, not per sample
        self.dataset = dataset
        self.cache = _cache_for(dataset, cache, name, allow_random)
        self.transform = transform
        self.columns = columns
        self.copy = copy
        self.async_puts = async_puts
        self.put_queue = put_queue
        self._putter = self._new_putter()
        self.cache.open()   # a wrong pipeline under this name fails here

    def _new_putter(self) -> AsyncPutter | None:
        return AsyncPutter(self._put_rows, self.put_queue) if self.async_puts else None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_putter"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._putter = self._new_putter()

    def __len__(self) -> int:
        return len(self.dataset)

    def _zero_copy(self):
        if self.copy is not None:
            return not self.copy
        return self.transform is None and get_worker_info() is not None

    def _miss(self, index):
        encoded = encode_row(self.dataset[index])
        self._store(index, encoded)
        sample = _to_tensors(encoded)
        if self.columns is not None:
            sample = self._project(sample)
        return sample

    def _store(self, index, encoded):
        """Caches a computed row [(name, array, dtype)]: queued for the
        writer thread, or stored now without async puts."""
        putter = self._putter
        if putter is None:
            self.cache.put_columns(index, encoded)
        elif self.cache.accepting:
            self._queue_put(putter, index, encoded)

    def _queue_put(self, putter: AsyncPutter, index: int,
                   encoded: list[EncodedColumn]) -> None:
        # The sample returned shares these arrays (and they may be the
        # wrapped dataset's own): the queue keeps a copy that nothing can
        # modify before the writer stores it.
        copies = [(n, np.array(a, copy=True), d or "") for n, a, d in encoded]
        row = decode_row([(n, d, a) for n, a, d in copies], _leaf_for_put)
        putter.enqueue(index, row, sum(a.nbytes for _, a, _ in copies))

    def _put_rows(self, ids: list[int], rows: list[Any]) -> int:
        """The writer thread's put (self.cache is looked up each time)."""
        return put_rows(self.cache, ids, rows)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until this process's queued puts are stored; False when
        `timeout` seconds passed first. True at once without async puts."""
        return True if self._putter is None else self._putter.flush(timeout)

    def _out(self, sample):
        if self.transform is not None:
            sample = self.transform(sample)
        return sample

    def __getitem__(self, index: int | torch.Tensor) -> Any:
        if isinstance(index, torch.Tensor):
            index = int(index)
        sample = self.cache._read(index, self.columns, not self._zero_copy(), True)
        if sample is None:
            sample = self._miss(index)
        return self._out(sample)

    def __getitems__(self, indices: Iterable[int]) -> list[Any]:
        """The samples of a batch (DataLoader's fetcher calls this). Hits of
        all columns are read with one batched call (rows spilled to disk
        come from the daemon in one round trip); projections go row by
        row."""
        indices = [int(i) for i in indices]
        if self.columns is not None:
            return [self[i] for i in indices]
        rows = self.cache._read_batch(indices, not self._zero_copy(), True)
        return [self._out(row if row is not None else self._miss(i))
                for i, row in zip(indices, rows)]

    def _project(self, sample: Any) -> Any:
        cols = self.columns
        if cols is None:
            return sample
        if isinstance(cols, (str, int)):
            return sample[cols]
        if isinstance(sample, dict):
            return {c: sample[c] for c in cols}
        return tuple(sample[c] for c in cols)

    def stats(self) -> CacheStats | None:
        """The cache's counters (all processes), plus `async_puts`: this
        process's queued / written / dropped / not_stored / pending rows
        (with async puts)."""
        st = self.cache.stats()
        if st is not None and self._putter is not None:
            st = st.with_async_puts(self._putter.stats())
        return st


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

    def __init__(self, source: Iterable[Any], cache: DatasetCache,
                 name: str | None = None,
                 transform: Callable[[Any], Any] | None = None,
                 allow_random: bool = False) -> None:
        self.source = source
        self.cache = _cache_for(source, cache, name, allow_random)
        self.transform = transform
        self.built = False   # this object's iterator was the builder
        self.cache.open()

    def sealed_count(self) -> int | None:
        """Rows in the sealed cache, or None while it is not sealed."""
        return self.cache._sealed_rows()

    def __iter__(self) -> Iterator[Any]:
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
        builder = self.cache._claim_build()
        if builder:
            self.built = True
        yield from self._stream(wid, nw, builder)

    def _stream(self, wid: int, nw: int, builder: bool, start: int = 0) -> Iterator[Any]:
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
            self.cache._seal(count)

    def _out(self, sample: Any) -> Any:
        return self.transform(sample) if self.transform is not None else sample

