"""`ds.cache = other` and `ds.cache = None` on a CachedDataset: every row
not yet being written moves to the new cache (None: caching off, quietly),
the batch being written ends in the old one before the assignment returns,
the writer's warnings name the new cache's line, and DataLoader workers
started later get the new cache.

The writer is held at a known point: inside the old cache's put, on an
Event the test releases."""

import gc
import linecache
import logging
import multiprocessing as mp
import threading
import warnings
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import wait_for  # noqa: E402
from helpers import Images, Stream, sample  # noqa: E402
from shmcache import CacheWarning, DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset, CachedIterableDataset, CachedLoader  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def cached_ids(session, name="rows"):
    """The ids cached for CachedDataset(Images(4), name=name) in `session`."""
    cache = CachedDataset(Images(4), DatasetCache(session), name=name).cache
    return [i for i in range(4) if cache.contains(i)]


def hold_puts(cache):
    """Makes every put of `cache` (the writer's) wait on `release`, after
    setting `entered`: the writer is then inside a batch of the old cache.
    By its class, not an attribute: a copy of the cache (named(), caching
    turned off) is not held."""
    entered, release = threading.Event(), threading.Event()

    def put(self, ids, rows, strict, quiet=False):
        entered.set()
        assert release.wait(60), "the test never released the writer"
        return DatasetCache.put_encoded(self, ids, rows, strict, quiet)
    cache.__class__ = type("HeldCache", (DatasetCache,), {"put_encoded": put})
    return entered, release


def set_cache_on_a_thread(ds, value):
    """Starts `ds.cache = value` on a thread and waits until the dataset
    shows the new cache (the assignment may still wait for the batch being
    written); the thread."""
    before = ds.cache
    swap = threading.Thread(target=setattr, args=(ds, "cache", value))
    swap.start()
    assert wait_for(lambda: ds.cache is not before, what="the new cache set")
    return swap


def cache_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def test_a_row_computed_for_the_new_cache_is_never_stored_in_the_old(server, session):
    """A miss of the new cache, queued once ds.cache shows it, while the
    writer is still inside a batch of the old cache (the assignment waits
    for that batch), is stored in the new cache, not in the old one."""
    ds = CachedDataset(Images(4), DatasetCache(session), name="rows")
    new_session = server.new_session()
    other = DatasetCache(new_session)
    entered, release = hold_puts(ds.cache)
    ds[0]
    assert entered.wait(60)
    swap = set_cache_on_a_thread(ds, other)
    ds[1]
    release.set()
    swap.join(60)
    assert not swap.is_alive()
    assert ds.flush(60)
    assert cached_ids(session) == [0]
    assert cached_ids(new_session) == [1]


def test_queued_rows_move_to_the_new_cache_and_the_old_is_let_go(server, session):
    """Rows queued before the switch and not yet being written go to the new
    cache; the batch being written ends in the old one before the
    assignment returns, so that the old cache can be closed at once (no
    'closed and then used' warning from a late put). Counters go on."""
    ds = CachedDataset(Images(4), DatasetCache(session), name="rows")
    new_session = server.new_session()
    old, other = ds.cache, DatasetCache(new_session)
    entered, release = hold_puts(old)
    ds[0]
    assert entered.wait(60)
    ds[1], ds[2]           # queued behind row 0
    swap = set_cache_on_a_thread(ds, other)
    assert swap.is_alive(), "the switch returned while the old cache's put ran"
    release.set()
    swap.join(60)
    assert not swap.is_alive()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old.close()
        assert ds.flush(60)
    assert cache_warnings(caught) == []
    assert cached_ids(session) == [0]
    assert cached_ids(new_session) == [1, 2]
    st = ds.stats()["async_puts"]
    assert (st["queued"], st["written"], st["pending"]) == (3, 3, 0), st


def test_a_replaced_cache_is_let_go_once_its_rows_are_written(server, session):
    """ds.cache = other: nothing of the dataset keeps the old cache (its
    connection and mapped segments) alive afterwards."""
    ds = CachedDataset(Images(4), DatasetCache(session), name="rows")
    ds[0]
    assert ds.flush(60)
    old = weakref.ref(ds.cache)
    new_session = server.new_session()
    ds.cache = DatasetCache(new_session)
    ds[1]
    assert ds.flush(60)
    gc.collect()
    assert wait_for(lambda: old() is None, what="the old cache freed")
    assert cached_ids(session) == [0]
    assert cached_ids(new_session) == [1]


def test_a_server_found_not_answering_is_forgotten_with_the_cache(server, session):
    """A waited put that found the old cache's server not answering sends
    later misses to the background writer (_put_unanswered); that is news
    about the old server only: ds.cache = other starts afresh, and workers
    started later wait for their puts again."""
    ds = CachedDataset(Images(4), DatasetCache(session), name="rows")
    ds._put_unanswered.set()   # as _put_waited leaves it on a stopped server
    assert ds._put_unanswered
    ds.cache = DatasetCache(server.new_session())
    assert not ds._put_unanswered


def test_the_writers_warnings_name_the_line_that_set_the_new_cache(server, session):
    ds = CachedDataset(Images(4), DatasetCache(session))
    made_old = ds.cache.origin
    ds.cache = DatasetCache(server.new_session())   # the line named

    def failing(ids, rows, strict):
        raise RuntimeError("the disk is on fire")
    ds.cache.put_encoded = failing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds[1]
        assert ds.flush(60)
    (w,) = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert "background put failed" in str(w.message) and "on fire" in str(w.message)
    assert (w.filename, w.lineno) == ds.cache.origin[:2] != made_old[:2]
    assert linecache.getline(w.filename, w.lineno).endswith("# the line named\n")


def test_cache_none_turns_caching_off_quietly(server, session, caplog):
    """ds.cache = None while a row is being written and another is queued:
    the queued row is not stored, nothing warns (one INFO line on the
    "shmcache" logger says caching is off), every sample comes from the
    dataset, as the cache would have returned it."""
    ds = CachedDataset(Images(4), DatasetCache(session), name="off")
    entered, release = hold_puts(ds.cache)
    ds[0]
    assert entered.wait(60)
    ds[1]
    with warnings.catch_warnings(record=True) as caught, \
            caplog.at_level(logging.INFO, logger="shmcache"):
        warnings.simplefilter("always")
        swap = set_cache_on_a_thread(ds, None)
        release.set()
        swap.join(60)
        assert not swap.is_alive()
        got = [ds[i] for i in range(4)] + ds.__getitems__([2, 3])
        got += [s for a, b in DataLoader(ds, batch_size=2) for s in zip(a, b)]
        assert ds.flush(60)
        assert ds.stats() is None
    assert cache_warnings(caught) == []
    assert [r.getMessage() for r in caplog.records
            if "caching turned off" in r.getMessage()], caplog.text
    for (img, label), i in zip(got, [0, 1, 2, 3, 2, 3, 0, 1, 2, 3]):
        assert isinstance(img, torch.Tensor)
        assert np.array_equal(img.numpy(), sample(i)[0]) and int(label) == i % 10
    assert cached_ids(session, "off") == [0]
    ds.cache = DatasetCache(session)      # and on again
    ds[2]
    assert ds.flush(60)
    assert cached_ids(session, "off") == [0, 2]


@pytest.mark.parametrize("loader,context", [("DataLoader", "fork"),
                                            ("DataLoader", "spawn"),
                                            ("CachedLoader", "fork")])
def test_workers_of_a_dataset_with_caching_off_read_the_dataset_quietly(
        server, session, capfd, loader, context):
    ds = CachedDataset(Images(4), DatasetCache(session), name="off")
    ds.cache = None
    make = DataLoader if loader == "DataLoader" else CachedLoader
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [s for a, b in make(ds, batch_size=2, num_workers=2,
                                  multiprocessing_context=context)
               for s in zip(a, b)]
        assert ds.flush(60)
    assert cache_warnings(caught) == []
    assert "CacheWarning" not in capfd.readouterr().err
    assert sorted(int(label) for _, label in got) == [i % 10 for i in range(4)]
    for img, label in got:
        assert np.array_equal(img.numpy(), sample(int(label))[0])
    assert cached_ids(session, "off") == []


def test_a_cache_that_is_not_one_is_refused_and_the_old_kept(server, session):
    ds = CachedDataset(Images(4), DatasetCache(session), name="kept")
    old = ds.cache
    with pytest.raises(TypeError, match="shmcache.DatasetCache, or None.*got str"):
        ds.cache = "kept"
    assert ds.cache is old
    ds[1]
    assert ds.flush(60)
    assert cached_ids(session, "kept") == [1]


def test_a_cache_set_later_is_named_for_the_dataset_as_the_constructors(server, session):
    """ds.cache = DatasetCache(other_session) takes that session and size
    and this dataset's name, as CachedDataset(dataset, cache) does: two
    datasets switched to one session never read each other's rows. With
    name=, the name given."""
    new_session = server.new_session()
    big = CachedDataset(Images(4), DatasetCache(session))
    small = CachedDataset(Images(4, side=16), DatasetCache(session))
    mine = CachedDataset(Images(4), DatasetCache(session), name="mine")
    for ds in (big, small, mine):
        ds.cache = DatasetCache(new_session)
    big[0]
    assert big.flush(60)
    img, _ = small[0]
    assert img.shape == (3, 16, 16) and np.array_equal(img.numpy(), sample(0, 16)[0])
    assert small.flush(60)
    fresh = CachedDataset(Images(4), DatasetCache(new_session)).cache
    assert (big.cache.session_id, big.cache.name) == (new_session, fresh.name)
    assert (mine.cache.session_id, mine.cache.name) == (new_session, "mine")


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_a_name_given_to_the_first_caches_constructor_names_a_later_cache(
        server, session, kind):
    """DatasetCache(name="mnist") given to the constructor counts as
    name="mnist": ds.cache = DatasetCache(other_session) then keeps
    "mnist", as after name="mnist" (it took the fingerprint's name, and
    read the dataset's samples to make it)."""
    make = (lambda c: CachedDataset(Images(4), c)) if kind == "map" else \
        (lambda c: CachedIterableDataset(Stream(4), c))
    ds = make(DatasetCache(session, name="mnist"))
    new_session = server.new_session()
    ds.cache = DatasetCache(new_session)
    assert (ds.cache.session_id, ds.cache.name) == (new_session, "mnist")
    # A later cache's own name is taken, and kept by the next unnamed one.
    ds.cache = DatasetCache(session, name="val")
    ds.cache = DatasetCache(new_session)
    assert (ds.cache.session_id, ds.cache.name) == (new_session, "val")


def test_a_streaming_dataset_takes_a_later_cache_and_none_as_cached_dataset(
        server, session, caplog):
    ds = CachedIterableDataset(Stream(6), DatasetCache(session))
    with pytest.raises(TypeError, match="shmcache.DatasetCache, or None.*got int"):
        ds.cache = 3
    new_session = server.new_session()
    ds.cache = DatasetCache(new_session)
    fresh = CachedIterableDataset(Stream(6), DatasetCache(new_session))
    assert (ds.cache.session_id, ds.cache.name) == (new_session, fresh.cache.name)
    with warnings.catch_warnings(record=True) as caught, \
            caplog.at_level(logging.INFO, logger="shmcache"):
        warnings.simplefilter("always")
        ds.cache = None
        got = list(ds)
    assert cache_warnings(caught) == []
    assert "caching turned off" in caplog.text
    assert [int(s["label"]) for s in got] == [i % 10 for i in range(6)]
    assert not ds.built and fresh.sealed_count() is None


def test_a_stream_being_built_when_its_cache_is_replaced_seals_neither(server, session):
    """`ds.cache = other` while a pass builds the stream's cache: the pass
    had claimed the build of the old cache, not of `other`, and `other`
    holds none of the rows before the assignment. The pass goes on from the
    source without storing or sealing anything more: a later pass builds
    `other` whole (sealed with rows missing, it served the tail of the
    stream from the source every epoch); the old cache is not touched
    after the assignment."""
    ds = CachedIterableDataset(Stream(6), DatasetCache(session))
    old = ds.cache
    new_session = server.new_session()
    it = iter(ds)
    first = [next(it) for _ in range(3)]
    ds.cache = DatasetCache(new_session)
    rest = list(it)
    assert [int(s["label"]) for s in first + rest] == [i % 10 for i in range(6)]
    assert ds.cache.sealed_rows() is None
    assert [i for i in range(6) if ds.cache.contains(i)] == []
    assert old.sealed_rows() is None
    assert [i for i in range(6) if old.contains(i)] == [0, 1, 2]
    # The next pass builds the new cache, every row of it.
    again = CachedIterableDataset(Stream(6), DatasetCache(new_session))
    assert [int(s["label"]) for s in again] == [i % 10 for i in range(6)]
    assert again.sealed_count() == 6
    assert [i for i in range(6) if again.cache.contains(i)] == list(range(6))


class CountedImages(Images):
    """Images that count the samples read in this process (the trainer's:
    a worker's reads are its own)."""

    def __init__(self, n):
        super().__init__(n)
        self.reads = 0

    def __getitem__(self, i):
        self.reads += 1
        return super().__getitem__(i)


@pytest.mark.parametrize("switch", ["other", "None"])
def test_a_persistent_loaders_workers_take_a_later_cache(server, session, switch):
    """CachedLoader with persistent_workers: `ds.cache = other` (or None)
    between passes reaches the miss workers of the next pass. They kept
    the cache they started with: they stored the next pass's misses in the
    old cache (still caching, after `ds.cache = None`), and the trainer,
    not finding in its cache the rows they said they stored, computed every
    one again in its own thread."""
    source = CountedImages(8)
    ds = CachedDataset(source, DatasetCache(session), name="pool", async_puts=False)
    rows = [0, 1, 2, 3]
    loader = CachedLoader(ds, batch_size=2, num_workers=2, persistent_workers=True,
                          multiprocessing_context="fork", sampler=rows)
    try:
        assert sorted(int(b) for _, labels in loader for b in labels) == [0, 1, 2, 3]
        pids = loader._state.pool.pids
        new_session = server.new_session()
        ds.cache = DatasetCache(new_session) if switch == "other" else None
        rows[:] = range(8)
        got = [(img, int(b)) for imgs, labels in loader for img, b in zip(imgs, labels)]
        assert loader._state.pool.pids == pids, "the workers were not kept"
    finally:
        del loader
        assert wait_for(lambda: gc.collect() is not None and not mp.active_children(),
                        what="the workers to end")
    assert sorted(b for _, b in got) == [i % 10 for i in range(8)]
    for img, label in got:
        assert np.array_equal(img.numpy(), sample(label)[0])
    assert source.reads == 0, "rows the workers computed were computed again"

    def cached(s):
        cache = CachedDataset(CountedImages(8), DatasetCache(s), name="pool").cache
        return [i for i in range(8) if cache.contains(i)]
    assert cached(session) == [0, 1, 2, 3]
    assert cached(new_session) == (list(range(8)) if switch == "other" else [])


# ---- assignments at once, and forks during one -----------------------------

def hold_redirect(ds):
    """Makes the first redirect of ds's writer (the first assignment of
    ds.cache from now on) wait on `release` once it redirected, after
    setting `entered`: that assignment is then half done, the writer
    redirected and ds.cache not yet set."""
    putter = ds._putter
    entered, release = threading.Event(), threading.Event()
    redirect = putter.redirect

    def held(store, origin, target):
        redirect(store, origin, target)
        if not entered.is_set():
            entered.set()
            assert release.wait(60), "the test never released the assignment"
    putter.redirect = held
    return entered, release


class ObservedLock:
    """Stands in for the lock that orders the assignments of ds.cache and
    says when a thread waits for it."""

    def __init__(self, lock):
        self.lock, self.waiting = lock, threading.Event()

    def __enter__(self):
        if not self.lock.acquire(blocking=False):
            self.waiting.set()
            self.lock.acquire()
        return self

    def __exit__(self, *exc):
        self.lock.release()


def test_two_assignments_at_once_the_last_is_the_cache_and_rows_follow_it(server, session):
    """Two threads set ds.cache at once: the second waits for the first to
    end, so ds.cache is the second's and the writer stores there. Both ran
    at once, the first set ds.cache last, after the second had redirected
    the writer: ds.cache was one cache and every row went to the other."""
    ds = CachedDataset(Images(4), DatasetCache(session), name="rows")
    first, second = server.new_session(), server.new_session()
    lock = ObservedLock(getattr(ds, "_switching", threading.RLock()))
    object.__setattr__(ds, "_switching", lock)
    entered, release = hold_redirect(ds)
    a = threading.Thread(target=setattr, args=(ds, "cache", DatasetCache(first)))
    a.start()
    assert entered.wait(60)
    b = threading.Thread(target=setattr, args=(ds, "cache", DatasetCache(second)))
    b.start()
    assert wait_for(lambda: not b.is_alive() or lock.waiting.is_set(),
                    what="the second assignment to end or wait")
    release.set()
    for t in (a, b):
        t.join(60)
        assert not t.is_alive()
    ds[0], ds[1]
    assert ds.flush(60)
    mine = ds.cache.session_id
    assert cached_ids(mine) == [0, 1], "the rows went to a cache not the dataset's"
    assert cached_ids(first if mine == second else second) == []
    assert mine == second, "the first assignment ended last"


def test_an_assignment_on_the_writer_thread_does_not_wait_for_itself(server, session):
    """ds.cache = other made inside the writer's put (a warnings hook, a
    finalizer the collector runs there) returns; it waited for the batch
    its own thread was writing, and the writer stopped for good."""
    ds = CachedDataset(Images(4), DatasetCache(session), name="rows")
    new_session = server.new_session()
    other = DatasetCache(new_session)
    switched = threading.Event()

    def put(self, ids, rows, strict, quiet=False):
        if not switched.is_set():
            ds.cache = other
            switched.set()
        return DatasetCache.put_encoded(self, ids, rows, strict, quiet)
    ds.cache.__class__ = type("SwitchingCache", (DatasetCache,), {"put_encoded": put})
    ds[0]
    assert wait_for(switched.is_set, what="the assignment on the writer thread")
    ds[1]
    assert ds.flush(60)
    assert cached_ids(session) == [0]
    assert cached_ids(new_session) == [1]


def set_own_cache_off(ds):
    """In a forked child: an assignment of its own, and a read."""
    ds.cache = None
    ds[2]
    raise SystemExit(0 if ds.flush(20) else 3)


def test_a_fork_during_an_assignment_sees_one_cache_whole(server, session):
    """A DataLoader worker forked while another thread of the trainer is
    half through `ds.cache = other` (the writer redirected, ds.cache not
    yet set) stores its misses in the cache its ds.cache shows, the old
    one (they went to `other`, which the worker's dataset did not show);
    a child forked then sets a cache of its own (the assignment's lock,
    held by a thread the child lacks, had held it for good)."""
    ds = CachedDataset(Images(4), DatasetCache(session), name="rows")
    new_session = server.new_session()
    entered, release = hold_redirect(ds)
    swap = threading.Thread(target=setattr, args=(ds, "cache", DatasetCache(new_session)))
    swap.start()
    try:
        assert entered.wait(60)
        got = [int(label) for _, label in DataLoader(
            ds, batch_size=1, sampler=[1], num_workers=1, multiprocessing_context="fork")]
        assert got == [1]
        child = mp.get_context("fork").Process(target=set_own_cache_off, args=(ds,))
        child.start()
        child.join(60)
        if child.is_alive():
            child.kill()
            child.join()
        assert child.exitcode == 0, "the child's assignment did not return"
    finally:
        release.set()
        swap.join(60)
    assert not swap.is_alive()
    assert wait_for(lambda: cached_ids(session) == [1], what="the worker's row stored")
    assert cached_ids(new_session) == []
