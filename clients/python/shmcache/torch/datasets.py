"""Datasets that cache a map-style or a streaming dataset in shmcache
(imported through shmcache.torch).

    from shmcache.torch import CachedDataset
    ds = CachedDataset(ImageFolder(root), transform=train_transforms)
    loader = DataLoader(ds, batch_size=64, num_workers=2)

The cache is DatasetCache() by default: the session of
$SHMCACHE_SESSION_ID. A sample is cached after the wrapped dataset produced
it and is returned as tensors (a tuple stays a tuple, a dict a dict, a
Python int, float or bool stays that number, numpy scalars become 0-d
tensors, bytes stay bytes, PIL images stay PIL images),
whether it was a hit or a miss: both go through shmcache.rows.decode, so
every epoch sees the same types. torch 1.13 has no uint16/32/64: those
become int32/int64. A sample the cache cannot hold (a value with no column
type, a Python int outside int64, more columns or longer names than a row
may have) is delivered as the dataset made it, after one CacheWarning.

transform= and target_transform= work as torchvision's datasets': for a
tuple sample (input, target, ...), transform applies to the input and
target_transform to the target (for any other sample, transform applies to
the whole of it); transforms= takes the whole sample instead.

Random augmentation: caching after a random transform freezes the first
epoch's random choices for every later epoch. Put only the deterministic
part (decode, resize) in the wrapped dataset and pass the random part as
`transform=`, which runs after the cache on every access. CachedDataset
refuses a wrapped dataset whose transform looks random (torchvision's
Random*, ColorJitter, *Augment*...) unless allow_random=True.

Puts of misses: by default (async_puts=None) a DataLoader worker stores a
batch's misses itself, in puts of up to 32 rows, the last before the batch
is returned, and every other miss (the trainer's process, a sample read
alone) goes to a background thread of the process (see shmcache.async_put
for the queue bound, drops and exit). async_puts=True sends every miss to
that thread; async_puts=False puts every miss before it is returned, a
batch's as in a worker (under a transform, row by row before their
transforms). A miss whose sample already has the form a hit returns (a
contiguous CPU tensor, or a tuple of such tensors and Python numbers) is
returned as the dataset made it; any other is returned decoded.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from .. import CacheStats, CacheWarning, DatasetCache, Error
from .._user_line import warn
from .._warned_flag import WarnedFlag
from ..async_put import DEFAULT_QUEUE_BYTES, AsyncPutter
from ..rows import NUMBER_TAG, Column, ColumnSelection, column_names, decode, encode
from ._whole_stream import whole_stream
from .fingerprint import cache_for_dataset, open_dataset_cache

__all__ = ["CachedDataset", "CachedIterableDataset"]

_log = logging.getLogger("shmcache")

# Whether this process is a DataLoader worker (None: not asked yet). Asked
# once per process: a worker's info is set before it touches a dataset, and
# a worker started by fork asks again (the flag is reset in every child).
_in_worker: bool | None = None


def _ask_in_worker() -> bool:
    global _in_worker
    _in_worker = get_worker_info() is not None
    return _in_worker


def _forget_in_worker() -> None:
    global _in_worker
    _in_worker = None
    for ds in list(_datasets):   # their copy decision was the parent's
        ds._forget_hit_path()
        ds._settle_after_fork()


# Every CachedDataset of this process, for _forget_in_worker.
_datasets: weakref.WeakSet[CachedDataset] = weakref.WeakSet()

# The attributes that decide how CachedDataset.__getitem__ reads a hit.
_READ_SETTINGS = frozenset({"transform", "target_transform", "transforms", "columns",
                            "copy", "cache"})


os.register_at_fork(after_in_child=_forget_in_worker)


def _cache_to_set(ds: CachedDataset | CachedIterableDataset, value: Any) -> DatasetCache:
    """The cache that `ds.cache = value` sets: as the constructor takes its
    cache= (value's session and size, the dataset's name or value's given
    one, checked at open here), or for None (the user turns caching off) the cache's settings
    bypassed, quietly: every later read goes to the source, nothing is
    stored, here and in the DataLoader workers started from now on. The
    constructor's own assignment (no cache yet) is value as it is."""
    current = getattr(ds, "cache", None)
    if current is None:
        return value      # made by cache_for_dataset
    if value is None:
        _log.info("%s: caching turned off (cache = None): samples are read from "
                  "the source and not stored", type(ds).__name__)
        return current.turned_off()
    if not isinstance(value, DatasetCache):
        raise TypeError(f"cache must be a shmcache.DatasetCache, or None to turn "
                        f"caching off; got {type(value).__name__}")
    source = ds.dataset if isinstance(ds, CachedDataset) else ds.source
    # A name given to an earlier cache's constructor counts as name=, for
    # a cache given none.
    name = ds._name if ds._name is not None or value.given_name is not None \
        else ds._given_name
    # The random transform was refused or allowed by the constructor.
    cache = open_dataset_cache(cache_for_dataset(source, value, name, allow_random=True,
                                                 bypass_unknown=True))
    if value.given_name is not None:
        object.__setattr__(ds, "_given_name", value.given_name)
    return cache


def _cacheable(sample: Any) -> tuple[list[Column] | None, Exception | None]:
    """(columns of the sample, None), or (None, why it has none)."""
    try:
        return encode(sample), None
    except (TypeError, ValueError) as e:
        return None, e


def row_id_from_end(index: int, dataset: Any) -> int:
    """Negative `index` as the row id it names in `dataset`: counted from
    its end, as a Python sequence and TensorDataset count (DataLoader hands
    a sampler's -1 to the dataset as is). IndexError when out of range or
    when the dataset has no length to count from."""
    try:
        n = len(dataset)
    except TypeError:
        raise IndexError(
            f"index {index} is negative, and the dataset ({type(dataset).__name__}) has "
            f"no length to count it from the end of; cached rows are keyed by index "
            f"from 0: give indices from 0") from None
    if index < -n:
        raise IndexError(f"index {index} out of range for a dataset of {n} samples")
    return index + n


def row_ids_from_end(ids: list[int], dataset: Any) -> list[int]:
    """`ids` with each negative one counted from `dataset`'s end
    (row_id_from_end); `ids` itself when none is negative."""
    if ids and min(ids) < 0:   # -1: the last row, as the dataset's [-1]
        return [row_id_from_end(i, dataset) if i < 0 else i for i in ids]
    return ids


class CachedDataset(Dataset):
    """Wraps a map-style dataset: a hit returns the cached sample, a miss
    computes dataset[i], caches it and returns it (both as tensors, PIL
    images as PIL images).

    cache: a shmcache.DatasetCache (its session and size are used; the name
      is this dataset's, or the one given to its constructor,
      DatasetCache(name=...), which counts as name=); default
      DatasetCache(), the session of $SHMCACHE_SESSION_ID.
      `ds.cache = other` later is taken the same way (other's session and
      size, this dataset's name or other's given one, checked at the
      assignment); `ds.cache = None` turns caching off: every
      sample is read from the dataset, nothing is stored, no CacheWarning
      (an INFO line on the "shmcache" logger); ds.cache is then this cache
      turned off (a bypassed DatasetCache, which DataLoader workers
      started later get too).
      name: the cache name, default a fingerprint of
      the dataset (class, length, root/path, transform repr) and of its
      contents (shmcache.torch.dataset_identity: its files' sizes and
      mtimes, or a few samples), taken once, here. When the contents
      cannot be told (a sampled row raises, or differs between two reads),
      the cache is bypassed (rows read from the dataset) with one
      CacheWarning: pass name= to cache it.
    transform, target_transform: applied after the cache, on every access
      (the place for random augmentation), torchvision's way: for a tuple
      sample, transform to its first element and target_transform to its
      second; for any other sample, transform to all of it.
    transforms: a callable of the whole sample instead (not with transform
      or target_transform).
    columns: read only these columns of each row (names of a dict sample or
      positions of a tuple sample).
    copy: whether a hit returns tensors over a private copy (True) or over
      the cache's shared memory, without a copy (False). The default (None)
      is zero-copy inside a DataLoader worker when there is no transform:
      there the sample only goes to the collate function, whose batching
      (default_collate's stack, written straight into the shared memory
      that carries the batch to the trainer) is then the one copy of the
      sample; elsewhere hits are copied. Zero-copy tensors (valid as long
      as they live: see the shmcache module docstring) alias memory
      that every process of the session reads: never modify them in place
      (torch has no read-only tensors); a collate_fn or transform that
      works in place needs copy=True.
    async_puts: None (the default): in a DataLoader worker a batch's
      misses (__getitems__) are put by the worker itself, as async_puts=False
      puts them; every other miss (the trainer's process, num_workers=0, a
      sample read alone) as with True. In a worker the decoders fill the
      CPUs, and the queue's copy of each row and a second thread taking
      the GIL from the decode cost more than the put they take off the
      batch's path (docs/performance.md, "A first epoch's worker without
      the writer"); the batch's wait is hidden by the DataLoader's prefetch.
      Once a worker's put found the server not answering (stopped: it
      waited the request timeout, 5 s), the workers of later epochs send
      their misses to the background writer instead, which never holds a
      batch. True: a miss returns its sample at once and one background thread
      of the process stores the row. put_queue: the most
      bytes of rows waiting for that thread (default 64 MiB per process);
      when it is full, rows are dropped, not waited for (counted in
      stats()["async_puts"], one CacheWarning) and are misses again next
      epoch. At exit, queued rows are written for at most 2 s
      (shmcache.async_put.EXIT_FLUSH_S), then dropped; that includes a
      DataLoader worker's exit at the end of an epoch. flush() waits for
      the queue. Assigning `ds.cache = other` moves the queue: every row
      not yet being written (queued before or after) goes to `other`,
      where it is as much this dataset's row; the one batch being written
      ends in the old cache before the assignment returns, and nothing of
      the dataset uses the old cache afterwards (it may be closed at once);
      stats()["async_puts"] goes on counting. Assignments made by several
      threads at once take effect one after another: the last one is
      ds.cache, and the rows go there; a process forked during one (a
      DataLoader worker) has the old cache or the new one, whole. A dataset the script drops
      is freed at once (the thread does not hold it): its thread writes
      the rows queued, then ends.
      async_puts=False stores every miss before returning it,
      in the calling thread, without a copy: a batch's misses
      (DataLoader's __getitems__) with one put per 32 rows as they are
      computed, the last after its last sample, before the batch is
      returned (32 rows' columns alive at once, not a batch's: see
      _PUT_ROWS); under a transform (which may change a
      sample in place) each row as it is computed, before its transform.
      That costs less CPU than the queue (its copy of each row, the writer
      thread), but a worker waits for its puts: a server that stopped
      answering holds it once for the request timeout (5 s) before the
      cache is bypassed.
    Works under DataLoader(num_workers>0) with fork or spawn, and with
    DistributedSampler. Under a DataLoader with batching, a batch of hits is
    read with one call (__getitems__); rows the cache spilled to disk are
    then read from the spill database by this process, in one batch.
    """

    # How __getitem__'s short path reads a hit, decided by _get_general:
    # whether it copies (None: not decided in this process) and whether the
    # sample goes out without a transform.
    _hit_copy: bool | None = None
    _plain: bool = True
    # Whether a batch's samples are read and transformed one at a time
    # (rows of PIL images under a transform; see __getitems__).
    _one_by_one: bool = False
    # Orders the assignments of `cache` (__setattr__); each process's own.
    _switching: threading.RLock

    def __init__(self, dataset: Any, cache: DatasetCache | None = None,
                 name: str | None = None,
                 transform: Callable[[Any], Any] | None = None,
                 columns: ColumnSelection = None, allow_random: bool = False,
                 copy: bool | None = None, async_puts: bool | None = None,
                 put_queue: int = DEFAULT_QUEUE_BYTES, *,
                 target_transform: Callable[[Any], Any] | None = None,
                 transforms: Callable[[Any], Any] | None = None) -> None:
        if copy is not None and not isinstance(copy, bool):
            raise TypeError(f"copy must be None, True or False, got {copy!r}")
        if async_puts is not None and not isinstance(async_puts, bool):
            raise TypeError(f"async_puts must be None, True or False, got {async_puts!r}")
        if isinstance(put_queue, bool) or not isinstance(put_queue, int) \
                or put_queue < 1:
            raise ValueError(f"put_queue is a size in bytes (>= 1), got {put_queue!r}")
        for arg, f in (("transform", transform), ("target_transform", target_transform),
                       ("transforms", transforms)):
            if f is not None and not callable(f):
                raise TypeError(f"{arg} must be callable (a function or a torchvision "
                                f"transform), or None; got {type(f).__name__}")
        if transforms is not None and (transform is not None
                                       or target_transform is not None):
            raise ValueError("pass transforms= (the whole sample) or "
                             "transform= / target_transform=, not both")
        column_names(columns)   # a bad selection fails here, not per sample
        if not hasattr(dataset, "__getitem__") and not hasattr(dataset, "__iter__"):
            # Not a dataset at all (a generator, which has __iter__, gets
            # no cache and one warning instead: see cache_for_dataset).
            raise TypeError(f"CachedDataset wraps a map-style dataset (dataset[i], "
                            f"len(dataset)); got {type(dataset).__name__} "
                            f"{dataset!r:.80}")
        if isinstance(dataset, IterableDataset):
            raise TypeError(f"CachedDataset caches a map-style dataset (rows by index); "
                            f"{type(dataset).__name__} is an IterableDataset: use "
                            f"CachedIterableDataset(source, cache) under a DataLoader")
        self.dataset = dataset
        self._name = name   # for a cache set later (_cache_to_set)
        self._given_name = getattr(cache, "given_name", None)   # as name=, there too
        object.__setattr__(self, "_switching", threading.RLock())   # see __setattr__
        self.cache = cache_for_dataset(dataset, cache, name, allow_random,
                                       bypass_unknown=True)
        self.transform = transform
        self.target_transform = target_transform
        self.transforms = transforms
        self.columns = columns
        self.copy = copy
        self.async_puts = async_puts
        self.put_queue = put_queue
        # Shared with the DataLoader workers forked from here: one warning.
        self._warned_uncacheable = WarnedFlag()
        # The causes of background put drops warned about (async_put), by
        # this process and the workers started from it, over all epochs.
        self._warned_queue = WarnedFlag()
        # Set once a waited put of the default (async_puts=None) found the
        # server not answering: from then on, in this process and the
        # workers started from it, a batch's misses go to the background
        # writer (_waits_for_batch_puts). A stopped server (SIGSTOP) held
        # each worker process of each epoch for the request timeout (5 s).
        self._put_unanswered = WarnedFlag()
        self._putter = self._new_putter()
        _datasets.add(self)
        open_dataset_cache(self.cache)   # a wrong pipeline under this name fails here

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "cache":
            super().__setattr__(name, value)
            if name in _READ_SETTINGS:
                self._forget_hit_path()
            return
        # One assignment at a time, from the cache's opening to the writer
        # redirected and the cache set: the last one to take the lock is
        # ds.cache, and the writer's store is that cache's (two at once had
        # left ds.cache one cache and the rows going to the other).
        with self._switching:
            value = _cache_to_set(self, value)
            putter = getattr(self, "_putter", None)   # None in __init__
            if putter is not None:
                # Before the new cache is seen: a row computed for it is
                # never stored in the old one.
                putter.redirect(functools.partial(_store_rows, value), value.origin, value)
            super().__setattr__(name, value)
            self._forget_hit_path()
            if putter is not None:
                # A server found not answering was the old cache's: a fresh
                # flag, not the old one cleared (the running workers of the
                # old cache still share that one).
                super().__setattr__("_put_unanswered", WarnedFlag())
        if putter is not None:
            putter.wait_redirected()

    def _settle_after_fork(self) -> None:
        """In a child forked while an assignment of `cache` ran on another
        thread of the parent (which the child does not have): the child's
        lock is free, and its writer stores into the cache the child's
        ds.cache shows, the old or the new one, never the other."""
        object.__setattr__(self, "_switching", threading.RLock())
        putter = getattr(self, "_putter", None)
        if putter is not None:
            putter.redirect(functools.partial(_store_rows, self.cache), self.cache.origin,
                            self.cache)

    def _forget_hit_path(self) -> None:
        # object.__setattr__, not self.__dict__[...]: reading __dict__ makes
        # CPython 3.11 turn the instance's attribute values into a dict,
        # after which no attribute load of this object is specialized (the
        # short path's three loads cost a sixth of a small hit then).
        object.__setattr__(self, "_hit_copy", None)
        object.__setattr__(self, "_one_by_one", False)

    def _new_putter(self) -> AsyncPutter | None:
        if self.async_puts is False:
            return None
        # The writer stores into the cache, not through the dataset: a
        # cycle through its store would keep the dataset, its thread and
        # queue after `del ds` until the cyclic collector ran. Retired when
        # the dataset is freed (not at exit: the exit flush writes first),
        # through a weak reference: the dataset holds the putter, the
        # finalizer need not. While its writer runs, the thread holds it;
        # without one there is nothing to retire. A new cache (ds.cache =
        # other) keeps the putter and redirects it (__setattr__).
        # Batched wakes in a DataLoader worker (see shmcache.async_put).
        putter = AsyncPutter(functools.partial(_store_rows, self.cache), self.put_queue,
                             batch_wakes=_ask_in_worker, origin=self.cache.origin,
                             target=self.cache, told=self._warned_queue)
        weakref.finalize(self, _retire, weakref.ref(putter)).atexit = False
        return putter

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_putter"] = None
        state.pop("_switching", None)   # a lock: each copy has its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():    # not __dict__.update: see _forget_hit_path
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_switching", threading.RLock())
        self._putter = self._new_putter()
        self._forget_hit_path()
        _datasets.add(self)

    def __len__(self) -> int:
        return len(self.dataset)

    def _waits_for_batch_puts(self) -> bool:
        """Whether __getitems__ puts a batch's misses itself, before the
        batch returns (async_puts=False; by default, in a DataLoader
        worker), rather than queuing copies of them for the writer."""
        if self._putter is None:
            return True
        if self.async_puts is not None or self._put_unanswered:
            return False
        in_worker = _in_worker
        return _ask_in_worker() if in_worker is None else in_worker

    def _put_waited(self, ids: list[int], rows: list[list[Column]]) -> None:
        """Puts rows now (a waited put); under the default (async_puts=None)
        notes a server found not answering for every process of the
        dataset (_put_unanswered): the workers of later epochs then queue
        their misses rather than each waiting for the request timeout."""
        cache = self.cache
        cache.put_encoded(ids, rows, strict=False)
        if self.async_puts is None and cache.unanswered:
            self._put_unanswered.set()

    def _mode(self) -> tuple[bool, bool]:
        """(whether hits are copied, whether samples go out as read: no
        transform of any kind)."""
        plain = (self.transform is None and self.target_transform is None
                 and self.transforms is None)
        if self.copy is not None:
            return self.copy, plain
        in_worker = _in_worker
        return not (plain and (_ask_in_worker() if in_worker is None else in_worker)), plain

    def _miss(self, index: int, batch: list[tuple[int, list[Column], int]] | None = None,
              transformed: bool = True) -> Any:
        """dataset[index] as a hit would return it, stored in the cache (see
        _compute for `batch` and `transformed`)."""
        self.cache.note_dropped()   # when the miss was a row the server dropped
        return self.project(self._compute(index, batch, transformed))

    def _compute(self, index: int, batch: list[tuple[int, list[Column], int]] | None,
                 transformed: bool, waited: bool = False) -> Any:
        """dataset[index] with all its columns, as a hit of all columns
        returns it, stored in the cache; with `batch` given, its row is
        appended there for the caller's store of the batch (_store_batch)
        instead: its queue entry (a copy), or, `waited`, its columns as
        they are, put with the rows before it once _PUT_ROWS are collected,
        unless `transformed`: a transform will see the sample before the
        batch's put and may change it in place (the sample shares the
        columns' memory), so the row is put now rather than copied to be
        put later. __getitems__ calls this for its misses directly: its
        batched read has just noted dropped rows, and it reads all columns
        (no projection). The sample is returned as the dataset made it
        when decoding its columns would give the same (_decoded_already):
        no second set of objects per row."""
        sample = self.dataset[index]
        cols, why = _cacheable(sample)
        if cols is None:
            self.warn_uncacheable(index, why)
            return sample
        if batch is None:
            self.store_row(index, cols)
        elif waited and transformed:
            self._put_waited([index], [cols])
        elif waited:
            batch.append((index, cols, 0))
            if len(batch) >= _PUT_ROWS:
                self._store_batch(batch, True)
        elif self.cache.accepting:
            batch.append(_queue_entry(index, cols))
        return sample if _decoded_already(sample) else decode(cols, torch=True)

    def _store_batch(self, batch: list[tuple[int, list[Column], int]], waited: bool) -> None:
        """Stores the rows _compute collected: queued for the writer with one
        enqueue_many, or, `waited`, put now with one put_batch (and
        `batch` emptied: the columns put need not stay alive)."""
        if not waited:
            assert self._putter is not None
            self._putter.enqueue_many(batch)
        else:
            self._put_waited([b[0] for b in batch], [b[1] for b in batch])
            batch.clear()

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until this process's queued puts are stored; False when
        `timeout` seconds passed first. True at once without async puts."""
        return True if self._putter is None else self._putter.flush(timeout)

    def apply_transforms(self, sample: Any) -> Any:
        """`sample` after transforms, or transform and target_transform (the
        class docstring's rule): what __getitem__ returns for a sample as
        read or computed. A loader that reads samples itself calls this."""
        if self.transforms is not None:
            return self.transforms(sample)
        if isinstance(sample, (tuple, list)) and sample:
            first = sample[0] if self.transform is None else self.transform(sample[0])
            rest = list(sample[1:])
            if rest and self.target_transform is not None:
                rest[0] = self.target_transform(rest[0])
            return (first, *rest)
        return sample if self.transform is None else self.transform(sample)

    def __getitem__(self, index: int | torch.Tensor) -> Any:
        # The short path of a hit (an int index, all columns, an open
        # cache), written out: on a small hit a Python frame costs as much
        # as the read. What it needs from the settings is decided once per
        # process by _get_general and forgotten when a setting changes.
        copy = self._hit_copy
        c = self.cache.native
        if copy is not None and c is not None and type(index) is int and index >= 0:
            try:
                sample = c.read(index, copy, True)
            except Error:   # read_row says so once and bypasses the cache
                sample = self.cache.read_row(index, None, copy, True)
            if sample is None:
                sample = self._miss(index)
            return sample if self._plain else self.apply_transforms(sample)
        return self._get_general(index)

    def _get_general(self, index: int | torch.Tensor) -> Any:
        if type(index) is not int and isinstance(index, torch.Tensor):
            index = int(index)
        if isinstance(index, (int, np.integer)) and index < 0:
            index = row_id_from_end(int(index), self.dataset)
        copy, plain = self._mode()
        object.__setattr__(self, "_plain", plain)
        if self.columns is None:
            object.__setattr__(self, "_hit_copy", copy)
        sample = self.cache.read_row(index, self.columns, copy, True)
        if sample is None:
            sample = self._miss(index)
        return sample if plain else self.apply_transforms(sample)

    def __getitems__(self, indices: Iterable[int]) -> list[Any]:
        """The samples of a batch (DataLoader's fetcher calls this). Hits of
        all columns are read with one batched call (rows spilled to disk
        are read from the spill database by this process, in one batch);
        projections go row by row. Rows of PIL images that a transform
        turns into something else go row by row too, once seen: each image
        made, transformed and freed before the next, as an uncached
        ImageFolder makes them (a batch of images alive at once costs its
        memory's page faults again every batch, more than the batched
        lookup saves)."""
        indices = row_ids_from_end([int(i) for i in indices], self.dataset)
        if self.columns is not None or self._one_by_one:
            return [self[i] for i in indices]
        rows = self.cache.read_rows(indices, self._mode()[0], True)
        plain = self.transform is None and self.target_transform is None and \
            self.transforms is None
        if not plain and any(_has_pil(row) for row in rows):
            object.__setattr__(self, "_one_by_one", True)   # see _forget_hit_path
        # The batch's misses are stored together, also when a later row of
        # the batch raises (rows computed are not lost): with async puts
        # queued at once (one lock, at most one wake-up of the writer),
        # without them put with one call before the batch is returned (under
        # a transform, _miss puts each row before its transform instead).
        # Each sample is made and transformed before the next, as an
        # uncached dataset's are (a seeded augmentation in the dataset and in
        # the transform then draws what it draws under a plain DataLoader).
        # Without a transform, a sample goes out as read or computed (no
        # apply_transforms call per row: a miss's Python is most of what a
        # cold epoch's worker adds to plain DataLoader's).
        misses: list[tuple[int, list[Column], int]] = []
        compute = self._compute
        waited = self._waits_for_batch_puts()
        try:
            if plain:
                return [row if row is not None else compute(i, misses, False, waited)
                        for i, row in zip(indices, rows)]
            return [self.apply_transforms(row if row is not None
                                          else compute(i, misses, True, waited))
                    for i, row in zip(indices, rows)]
        finally:
            if misses:
                self._store_batch(misses, waited)

    def stats(self) -> CacheStats | None:
        """The cache's counters (all processes), plus `async_puts`: this
        process's queued / written / dropped / not_stored / pending rows
        (with async puts)."""
        st = self.cache.stats()
        if st is not None and self._putter is not None:
            st = st.with_async_puts(self._putter.stats())
        return st

    # ---- package-internal ------------------------------------------------
    # What CachedLoader and PartitionedLoader (other modules of
    # shmcache.torch) call to treat a sample as __getitem__ would; not part
    # of the user's API.

    def store_row(self, index: int, cols: list[Column]) -> None:
        """Caches a computed row: queued for the writer thread, or stored
        now without async puts."""
        putter = self._putter
        if putter is None:
            self.cache.put_encoded([index], [cols], strict=False)
        elif self.cache.accepting:
            putter.enqueue(*_queue_entry(index, cols))

    def warn_uncacheable(self, index: int, why: Exception | str | None) -> None:
        if self._warned_uncacheable.claim():
            warn(f"shmcache: sample {index} cannot be cached ({why}); "
                 "samples like it are read from the dataset", CacheWarning,
                 self.cache.origin)

    def project(self, sample: Any) -> Any:
        cols = self.columns
        if cols is None:
            return sample
        if not _has_columns(sample):
            # One value (an array, a tensor): a hit of it has no column "#0",
            # so neither has the sample (sample[0] would be its first row).
            raise KeyError(_no_column(sample, cols))
        try:
            if isinstance(cols, (str, int)):
                return sample[cols]
            if isinstance(sample, dict):
                return {c: sample[c] for c in cols}
            return tuple(sample[c] for c in cols)
        except (IndexError, KeyError, TypeError):
            # A computed sample says what a hit's read says (row_model.cc):
            # not "tuple index out of range".
            raise KeyError(_no_column(sample, cols)) from None


def _has_columns(sample: Any) -> bool:
    """Whether a sample is stored as columns (a tuple, list or dict), not as
    one value."""
    return isinstance(sample, (tuple, list, dict))


def _no_column(sample: Any, cols: ColumnSelection) -> str:
    """What a columns= selection that a computed sample lacks is told."""
    wanted = cols if isinstance(cols, (str, int)) else list(cols or [])
    msg = f"the dataset's sample has no column {wanted!r} (columns={cols!r})"
    if isinstance(sample, dict):
        return (f"{msg}: its columns are {', '.join(map(repr, sample))}; pass "
                "columns= some of them, or None for all")
    if isinstance(sample, (tuple, list)):
        return (f"{msg}: its columns are the positions of a tuple sample, "
                f"0..{len(sample) - 1}; pass columns= some of them, or None for all")
    return f"{msg}: it is one value, not columns; pass columns=None"


def _retire(putter: weakref.ref[AsyncPutter]) -> None:
    """A freed dataset's finalizer: its writer ends once its queue is written."""
    p = putter()
    if p is not None:
        p.retire()


def _store_rows(cache: DatasetCache, ids: list[int], rows: list[list[Column]]) -> int:
    """The writer thread's put."""
    return sum(cache.put_encoded(ids, rows, strict=False))


# The end of a Python number's stored column name (rows: "label\x1fpy"; a
# name encode makes has no other separator), tested without a native call.
_NUMBER_SUFFIX = "\x1f" + NUMBER_TAG


def _queue_entry(index: int, cols: list[Column]) -> tuple[int, list[Column], int]:
    """(index, columns, bytes) for AsyncPutter. The sample returned shares
    the encoded arrays (and they may be the wrapped dataset's own): the
    queue keeps a copy that nothing can modify before the writer stores
    it. A Python number's column is encode's own array, and its sample
    holds the number, not the array: it is queued as is."""
    copies = [(n, d, a if n.endswith(_NUMBER_SUFFIX) else a.copy()) for n, d, a in cols]
    return index, copies, sum(a.nbytes for _, _, a in copies)


# A waited put's rows at most (the library writes rows in windows of 32):
# a batch's misses are put as they are computed, so that only this many
# rows' columns (a list and a tuple per column each) are alive at once.
# A whole batch's, beside its samples, passed the cyclic collector's
# threshold (700 objects) twice a batch of 256 rows; in a DataLoader worker
# its collections grew into a full one over every object the worker
# inherited from the trainer (60-120 ms an epoch, profiled in
# docs/performance.md).
_PUT_ROWS = 32

# The tensor dtypes that decode gives back as they are (torch 1.13 has no
# unsigned types but uint8: the others are stored widened).
_SAME_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                          torch.float16, torch.float32, torch.float64, torch.bool,
                          torch.complex64, torch.complex128})


def _plain_tensor(v: Any) -> bool:
    """Whether `v` is a tensor that decode of its encoding gives back as it
    is: a plain contiguous CPU tensor of a dtype stored as itself, no grad,
    no conjugate or negative bit, no names (a subclass stays itself)."""
    return (type(v) is torch.Tensor and v.dtype in _SAME_DTYPES and v.device.type == "cpu"
            and v.layout is torch.strided and not v.requires_grad and v.is_contiguous()
            and not v.is_conj() and not v.is_neg() and not v.has_names())


def _decoded_already(sample: Any) -> bool:
    """Whether decode of `sample`'s columns gives what `sample` already is:
    a plain tensor (_plain_tensor), or a tuple of plain tensors and Python
    int, float and bool (a hit gives those as they were stored); decode's
    tensors would share the sample's memory. Then a miss returns the
    sample itself: decode would make a second tuple and tensor per row
    (its cost, and objects for the cyclic collector; see _PUT_ROWS)."""
    if type(sample) is tuple:
        for v in sample:
            t = type(v)
            if t is not int and t is not float and t is not bool and not _plain_tensor(v):
                return False
        return True
    return _plain_tensor(sample)


def _has_pil(row: Any) -> bool:
    """Whether a row read from the cache holds a PIL image."""
    pil = sys.modules.get("PIL.Image")
    if pil is None or row is None:
        return False
    values = row.values() if isinstance(row, dict) else \
        row if isinstance(row, tuple) else (row,)
    return any(isinstance(v, pil.Image) for v in values)


class CachedIterableDataset(IterableDataset):
    """Caches a streaming (non-mappable) source.

    The first complete pass builds the cache: exactly one iterator (over
    all processes of the session) becomes the builder; it stores every
    sample in order and seals the cache at the end of its pass. Until then,
    other iterators stream from the source. Once sealed, every pass reads
    the cache and never touches the source.

    Under DataLoader(num_workers=W), worker w yields samples w, w+W, ...
    of the whole stream: the source is iterated whole in each worker, its
    code run with get_worker_info() None as in the trainer's process
    (_whole_stream.py), so a source that shards itself by worker gives
    every sample once here too.
    A builder that dies before sealing leaves the cache unsealed: readers
    go on streaming from the source (drop the session to rebuild). If the
    cache fills up during the build, or a sample cannot be cached, it is
    not sealed either. cache: default DatasetCache() ($SHMCACHE_SESSION_ID).
    `ds.cache = other` and `ds.cache = None` (caching off) as CachedDataset's;
    a builder's pass under way then stores and seals nothing more (the
    build it claimed was the old cache's), and a later pass builds `other`.
    """

    def __init__(self, source: Iterable[Any], cache: DatasetCache | None = None,
                 name: str | None = None,
                 transform: Callable[[Any], Any] | None = None,
                 allow_random: bool = False) -> None:
        self.source = source
        self._name = name   # for a cache set later (_cache_to_set)
        self._given_name = getattr(cache, "given_name", None)   # as name=, there too
        self.cache = cache_for_dataset(source, cache, name, allow_random,
                                       bypass_unknown=True)
        self.transform = transform
        self.built = False   # this object's iterator was the builder
        open_dataset_cache(self.cache)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, _cache_to_set(self, value) if name == "cache" else value)

    def sealed_count(self) -> int | None:
        """Rows in the sealed cache, or None while it is not sealed."""
        return self.cache.sealed_rows()

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        _ask_in_worker()    # asked now: the source runs with the worker's info set aside
        n = self.sealed_count()
        if n is not None:
            for i in range(wid, n, nw):
                row = self.cache.read_row(i, None, True, True)
                if row is None:        # cache gone: the source is the truth
                    yield from self._stream(wid, nw, False, start=i)
                    return
                yield self._out(row)
            return
        builder = self.cache.claim_build()
        if builder:
            self.built = True
        yield from self._stream(wid, nw, builder)

    def _stream(self, wid: int, nw: int, builder: bool, start: int = 0) -> Iterator[Any]:
        # The build claimed is this cache's: once `ds.cache = other` (or
        # None) replaced it, the pass stores and seals nothing more; other
        # holds none of the rows before, and its build is a later pass's.
        cache = self.cache
        count = 0
        complete = True
        for i, sample in enumerate(whole_stream(self.source)):
            count = i + 1
            builder = builder and self.cache is cache
            cols, _ = _cacheable(sample)
            if cols is None:
                complete = False
            elif builder:
                cache.put_encoded([i], [cols], strict=False)
            if i >= start and i % nw == wid:
                yield self._out(sample if cols is None else decode(cols, torch=True))
        if builder and complete and self.cache is cache and cache.accepting:
            cache.seal(count)

    def _out(self, sample: Any) -> Any:
        return self.transform(sample) if self.transform is not None else sample
