"""CachedLoader over a cache that holds half its rows in memory and half in
the spill database: the loader threads read a batch's spilled rows (with
its in-memory rows, through DatasetCache.read_into, in the process itself)
while the trainer still holds earlier batches; the batches are exactly the
all-in-memory ones, and a daemon killed mid-epoch costs one warning."""

import gc
import multiprocessing as mp
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from conftest import wait_for  # noqa: E402
from helpers import Images, Normalize  # noqa: E402
from shmcache import CacheWarning, DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset, CachedLoader  # noqa: E402

N = 160         # 12 KB rows (3x64x64 uint8, 3x32x32 float32): 1.9 MB in a 1 MB cache
BATCH = 16


def fill(cds):
    for i in range(len(cds)):
        cds[i]
    assert cds.flush(60)


def half_spilled(session, ds, name="half"):
    cds = CachedDataset(ds, DatasetCache(session, size_mb=1, spilling=True), name=name)
    fill(cds)
    st = cds.stats()
    assert st["mem_rows"] + st["disk_rows"] == N, st
    # About half of the rows on each side (the budget holds ~1 MB of them).
    assert N // 4 <= st["disk_rows"] <= 3 * N // 4, st
    return cds


def epoch(cds, seed, **kw):
    torch.manual_seed(seed)
    return list(CachedLoader(cds, batch_size=BATCH, shuffle=True, **kw))


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for k, ((gi, gl), (wi, wl)) in enumerate(zip(got, want)):
        assert gi.dtype == wi.dtype and gi.shape == wi.shape, f"batch {k}"
        assert torch.equal(gi, wi), f"batch {k}: images differ"
        assert torch.equal(gl, wl), f"batch {k}: labels differ"


def no_leftovers():
    gc.collect()
    return not [t for t in threading.enumerate()
                if t.name.startswith("shmcache-loader")] and not mp.active_children()


@pytest.mark.parametrize("num_threads,prefetch", [(1, 1), (2, 4)])
def test_half_spilled_epoch_is_the_all_in_memory_epoch(spill_server, num_threads,
                                                       prefetch):
    session = spill_server.new_session()
    ds = Images(N, side=64)
    mem = CachedDataset(ds, DatasetCache(session), name="mem")
    fill(mem)
    assert mem.stats()["disk_rows"] == 0
    half = half_spilled(session, ds)
    for seed in (0, 1):
        want = epoch(mem, seed, num_threads=num_threads, prefetch=prefetch)
        torch.manual_seed(seed)
        loader = CachedLoader(half, batch_size=BATCH, shuffle=True,
                              num_threads=num_threads, prefetch=prefetch)
        assert_same_batches(list(loader), want)
        # Every row was read from the cache (memory or spill database):
        # nothing was computed again from the source.
        st = loader.stats()
        assert (st["hits"], st["misses"]) == (N, 0), st
    assert wait_for(no_leftovers, what="loader threads to end")


def test_half_spilled_epoch_survives_the_daemon_killed(spill_server):
    session = spill_server.new_session()
    ds = Images(N, side=32, transform=Normalize(1.0))   # float32: 12 KB too
    torch.manual_seed(3)
    want = list(DataLoader(ds, batch_size=BATCH, shuffle=True))   # the source's
    half = half_spilled(session, ds)
    torch.manual_seed(3)
    # One thread, two batches ahead: most batches are read after the kill.
    loader = CachedLoader(half, batch_size=BATCH, shuffle=True, num_workers=2,
                          num_threads=1, prefetch=2)
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, batch in enumerate(loader):
            if k == 1:
                spill_server.kill()
            got.append(batch)
        loader.flush(10)
        assert_same_batches(got, want)
        # A whole epoch more with the daemon gone.
        torch.manual_seed(3)
        again = list(CachedLoader(half, batch_size=BATCH, shuffle=True, num_workers=2))
        assert_same_batches(again, want)
    cw = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    # Rows come from memory or the spill database, read in this process
    # (no daemon needed), or else from the source: at most one warning.
    assert len(cw) <= 1, cw
    assert wait_for(no_leftovers, what="loader threads and workers to end")


def test_spilled_rows_of_the_next_batches_are_read_ahead(spill_server):
    """While the trainer holds batch 0 and asks for nothing more, the
    loader's threads read batches 1..prefetch from the cache, spilled rows
    included."""
    session = spill_server.new_session()
    half = half_spilled(session, Images(N, side=64))
    prefetch = 3
    ahead = (1 + prefetch) * BATCH
    # Rows past the memory budget were spilled, in put order: the last
    # `ahead` rows, read first here, are all on disk.
    assert half.stats()["disk_rows"] >= ahead
    order = list(reversed(range(N)))
    loader = CachedLoader(half, batch_size=BATCH, sampler=order, num_threads=2,
                          prefetch=prefetch)
    it = iter(loader)
    first = next(it)
    assert wait_for(lambda: loader.stats()["hits"] >= ahead,
                    what="the next batches to be read ahead")
    st = loader.stats()
    assert st["batches"] == 1 and (st["hits"], st["misses"]) == (ahead, 0), st
    assert torch.equal(first[0][0], torch.from_numpy(Images(N, side=64)[N - 1][0]))
    del first
    it.close()
    assert wait_for(no_leftovers, what="loader threads to end")
