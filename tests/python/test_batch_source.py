"""CachedLoader's batch sources: the batch sampler's exceptions, and a
BatchSource of the user's own through CachedLoader.iter_source (what
PartitionedLoader uses): rows it supplies fill the cache's misses, rows it
does not keep stay out of the cache and come back in its reports."""

import gc
import multiprocessing as mp
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from conftest import wait_for  # noqa: E402
from helpers import Images  # noqa: E402
from shmcache import DatasetCache, rows  # noqa: E402
from shmcache.torch import BatchReport, CachedDataset, CachedLoader  # noqa: E402


def no_leftovers():
    gc.collect()
    return not [t for t in threading.enumerate() if t.name.startswith("shmcache-loader")] \
        and not mp.active_children()


class BrokenSampler:
    """Three batches of 4, then the error a sampler may raise."""

    def __iter__(self):
        for b in range(3):
            yield list(range(4 * b, 4 * b + 4))
        raise ValueError("the sampler broke")

    def __len__(self):
        return 4


@pytest.mark.parametrize("num_threads", [1, 2])
def test_a_samplers_exception_reaches_the_trainer_in_its_place(server, session,
                                                               num_threads):
    ds = Images(16, side=4)
    cds = CachedDataset(ds, DatasetCache(session))
    want = list(DataLoader(cds, batch_size=4))[:3]
    loader = CachedLoader(cds, batch_sampler=BrokenSampler(), num_threads=num_threads,
                          prefetch=2)
    got, raised = [], []

    def epoch():
        try:
            for batch in loader:
                got.append(batch)
        except ValueError as e:
            raised.append(e)

    # The loader of before waited for ever with one thread: the epoch runs
    # on a thread of the test's, waited for with a bound (a timeout= of the
    # loader's own is refused without workers, as DataLoader refuses it).
    t = threading.Thread(target=epoch, daemon=True)
    t.start()
    assert wait_for(lambda: not t.is_alive(), timeout=60, what="the epoch to end")
    assert len(raised) == 1 and "the sampler broke" in str(raised[0]), raised
    assert len(got) == 3    # the batches before the error, in order
    for g, w in zip(got, want):
        assert torch.equal(g[0], w[0]) and torch.equal(g[1], w[1])
    assert wait_for(no_leftovers, what="threads to end after the error")
    assert cds.flush(60)   # a pass its sampler ended does not wait for its puts


class Batch:
    def __init__(self, source, indices):
        self.source, self.indices = source, indices

    def supplied(self, index):
        return self.source.rows.get(index)

    def keeps(self, index):
        return index % 2 == 0

    def settle(self, report):
        with self.source.lock:
            self.source.reports.append((self.indices[0], report))


class Source:
    """Batches of 8 over 24 rows; rows 8..11 supplied (as a row of another
    node would be, in the cache's encoding: the dataset's row with 100
    added), only even rows kept."""

    def __init__(self, ds):
        self.rows = {i: rows.encode((ds[i][0] + 100, ds[i][1])) for i in range(8, 12)}
        self.batches = iter([list(range(k, k + 8)) for k in range(0, 24, 8)])
        self.lock = threading.Lock()
        self.reports = []

    def __iter__(self):
        return self

    def __next__(self):
        return Batch(self, next(self.batches))


class Elsewhere(Batch):
    """Only the rows this cache keeps can be in it: odd and supplied rows
    are not looked up there."""

    def in_cache(self, index):
        return self.keeps(index) and index not in self.source.rows


class ElsewhereSource(Source):
    def __next__(self):
        return Elsewhere(self, next(self.batches))


def test_rows_a_batch_says_are_elsewhere_are_not_looked_up(server, session):
    ds = Images(24, side=4)
    cds = CachedDataset(ds, DatasetCache(session), name="elsewhere", async_puts=False)
    loader = CachedLoader(cds, batch_size=8, num_threads=2)
    misses = []
    for source in (ElsewhereSource, ElsewhereSource, Source):   # cold, warm, warm
        before = cds.stats()["misses"]
        batches = list(loader.iter_source(source(ds)))
        imgs = torch.cat([b[0] for b in batches])
        for i in range(24):
            assert np.array_equal(imgs[i].numpy(), ds[i][0] + (100 if 8 <= i < 12 else 0))
        misses.append(cds.stats()["misses"] - before)
    # Warm, the even rows hit and the odd ones are not asked for; a source
    # without in_cache has them looked up, and missed, every pass.
    assert misses[0] > 0 and misses[1] == 0 and misses[2] >= 12, misses


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_source_supplies_rows_and_keeps_what_it_owns(server, session,
                                                            num_workers):
    ds = Images(24, side=4)
    cds = CachedDataset(ds, DatasetCache(session), name=f"source-{num_workers}",
                        async_puts=False)
    cache = cds.cache
    for i in range(8):
        cds[i]                       # rows 0..7 cached: the first batch hits
    source = Source(ds)
    loader = CachedLoader(cds, batch_size=8, num_workers=num_workers, num_threads=2)
    batches = list(loader.iter_source(source))
    assert len(batches) == 3
    imgs = torch.cat([b[0] for b in batches])
    for i in range(24):
        want = ds[i][0] + (100 if 8 <= i < 12 else 0)
        assert np.array_equal(imgs[i].numpy(), want), i
    reports = dict(source.reports)
    assert sorted(reports) == [0, 8, 16]          # each batch settled once
    assert all(isinstance(r, BatchReport) for r in reports.values())
    assert (reports[0].cache_hits, reports[0].supplied, reports[0].computed) == (8, 0, 0)
    assert (reports[8].cache_hits, reports[8].supplied, reports[8].computed) == (0, 4, 4)
    assert (reports[16].cache_hits, reports[16].supplied, reports[16].computed) == (0, 0, 8)
    not_kept = sorted(i for r in reports.values() for i, _ in r.not_kept)
    assert not_kept == [13, 15, 17, 19, 21, 23]
    for i, cols in (c for r in reports.values() for c in r.not_kept):
        assert np.array_equal(cols[0][2], ds[i][0])   # the computed row's columns
    # Kept rows are in the cache; supplied and not-kept rows are not.
    assert [i for i in range(24) if cache.contains(i)] == \
        list(range(8)) + [12, 14, 16, 18, 20, 22]
    assert wait_for(no_leftovers, what="threads and workers to end")
