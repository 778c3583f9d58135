"""CachedIterableDataset: one builder, sealing, reads after sealing."""

import multiprocessing as mp
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset, get_worker_info  # noqa: E402

from helpers import Stream, sample  # noqa: E402
import shmcache  # noqa: E402
from shmcache import DatasetCache  # noqa: E402
from shmcache.torch import CachedIterableDataset  # noqa: E402

N = 300


def labels_ok(rows):
    return [int(r["label"]) for r in rows] == [i % 10 for i in range(N)] and all(
        np.array_equal(r["image"].numpy(), sample(i, 8)[0]) for i, r in enumerate(rows))


def reader(session, start, barrier, out):
    src = Stream(N)
    ds = CachedIterableDataset(src, DatasetCache(session))
    named = src.reads       # the first items, read once for the cache name
    start.wait(timeout=60)
    first = list(ds)                     # the race on the first pass
    reads_first = src.reads - named
    barrier.wait(timeout=60)             # both first passes are over
    second = list(ds)
    out.put((ds.built, reads_first, src.reads - reads_first - named,
             labels_ok(first), labels_ok(second), len(first), len(second)))


def test_two_readers_race_one_build_then_both_read_the_cache(server, session):
    ctx = mp.get_context("fork")
    start, barrier, out = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=reader, args=(session, start, barrier, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(r[0] for r in results) == [False, True]   # exactly one build
    for built, reads1, reads2, ok1, ok2, n1, n2 in results:
        assert reads1 == N and n1 == N and ok1        # every row once, epoch 1
        assert reads2 == 0 and n2 == N and ok2        # sealed: from the cache
    st = DatasetCache(session).named(
        CachedIterableDataset(Stream(N), DatasetCache(session)).cache.name).stats()
    assert st["mem_rows"] == N + 2        # the rows, a builder and a seal mark


def test_unsealed_cache_streams_and_workers_split_the_rows(server, session):
    src = Stream(N)
    ds = CachedIterableDataset(src, DatasetCache(session))
    named = src.reads       # the first items, read once for the cache name
    assert ds.sealed_count() is None
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    first = [int(r["label"]) for r in loader]
    assert sorted(first) == sorted(i % 10 for i in range(N))
    assert ds.sealed_count() == N        # one worker built and sealed it
    rows = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(rows) == N
    assert sorted(int(r["label"]) for r in rows) == sorted(i % 10 for i in range(N))
    assert src.reads == named            # in this process: all from workers/cache
    assert labels_ok(list(ds))           # single process, sealed: in order


class WorkerSharded(IterableDataset):
    """A source that shards itself over DataLoader's workers, as torch's
    IterableDataset documentation shows: worker w of W yields w, w+W, ..."""

    def __init__(self, n):
        self.n, self.path = n, "worker-sharded"

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(wid, self.n, nw):
            yield {"x": np.full(2, i, np.float32), "label": i}


def test_a_source_that_shards_itself_over_the_workers_loses_no_sample(server, session):
    """Plain DataLoader(source, num_workers=2) gives every sample once;
    so does DataLoader(CachedIterableDataset(source)), building and then
    reading the sealed cache: the source is iterated whole in each worker
    (get_worker_info() is None inside it), as in the trainer's process,
    and the wrapper shards. Before, the source's sharding and the
    wrapper's compounded: 6 of 12 samples, and a cache sealed with 6 rows."""
    n = 12
    want = sorted(int(r["label"]) for r in DataLoader(WorkerSharded(n), batch_size=None,
                                                      num_workers=2))
    assert want == list(range(n))
    ds = CachedIterableDataset(WorkerSharded(n), DatasetCache(session))
    for _ in range(2):      # the pass that builds, then the sealed cache's
        rows = list(DataLoader(ds, batch_size=None, num_workers=2))
        assert sorted(int(r["label"]) for r in rows) == want
        assert all(np.array_equal(r["x"].numpy(), np.full(2, int(r["label"]), np.float32))
                   for r in rows)
        assert ds.sealed_count() == n
    assert [int(r["label"]) for r in ds] == want      # this process: the cache, in order


def test_the_library_seals_and_caches_sealed_before_still_read(server, session):
    # Sealed by the library (Cache::Seal) after one pass.
    ds = CachedIterableDataset(Stream(N), DatasetCache(session))
    assert ds.cache.open().native.sealed_rows() is None
    assert labels_ok(list(ds)) and ds.built
    assert ds.cache.open().native.sealed_rows() == N == ds.sealed_count()
    # A cache sealed as the package did before the library could: the rows,
    # a builder mark and a seal mark under the ids above MAX_ROW_ID.
    old = CachedIterableDataset(Stream(N, path="sealed-before"), DatasetCache(session))
    native = old.cache.open().native
    named = old.source.reads    # the first items, read once for the cache name
    for i, s in enumerate(Stream(N)):
        native.put(i, shmcache.rows.encode(s))
    native.put(2**64 - 1, [("builder", None, np.array([1], dtype=np.int64))])
    native.put(2**64 - 2, [("count", None, np.array(N, dtype=np.int64))])
    assert old.sealed_count() == N
    rows = list(old)
    assert labels_ok(rows) and old.source.reads == named and not old.built


def test_a_destroyed_session_is_no_unsealed_cache(server, session):
    """Once the session is destroyed, sealed_rows() is not None-for-unsealed
    in silence: the native call raises NotFoundError naming the destroyed
    session (as Cache::GetSealedRows says), and DatasetCache.sealed_rows()
    returns None after the one CacheWarning a destroyed session gives every
    call. The dataset then streams from its source."""
    ds = CachedIterableDataset(Stream(N), DatasetCache(session))
    native = ds.cache.open().native
    assert native.sealed_rows() is None
    shmcache.Client().destroy_session(session)
    with pytest.raises(shmcache.NotFoundError, match=f"session {session} was destroyed"):
        native.sealed_rows()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert ds.sealed_count() is None
        assert labels_ok(list(ds)) and not ds.built
    said = [str(x.message) for x in w if x.category is shmcache.CacheWarning]
    assert len(said) == 1 and f"session {session} was destroyed" in said[0], said
