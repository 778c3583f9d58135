"""CachedDataset's background puts: a full queue drops (never blocks), exit
and SIGKILL with queued rows leave whole rows and no hang, forked children
start clean, and results are the same with async puts on or off.

A slow cache is simulated deterministically: the cache's put (the writer
thread's fallback path) or put_batch is replaced by one that waits on an
Event the test controls."""

import gc
import multiprocessing
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
import warnings
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import continued_after, wait_for  # noqa: E402
from helpers import Images, sample  # noqa: E402
from shmcache import CacheWarning, DatasetCache  # noqa: E402
import shmcache.async_put  # noqa: E402
from shmcache.torch import CachedDataset  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def block_puts(ds, event):
    """Makes ds's writer wait on `event` before each batch it stores."""
    real = ds.cache.put_encoded

    def put(ids, rows, strict):
        assert event.wait(60), "the test never released the writer"
        return real(ids, rows, strict)
    ds.cache.put_encoded = put


def assert_cached_rows_whole(session, name, n):
    """Every cached row of Images(n) reads back equal to the source; returns
    the cached ids."""
    cache = CachedDataset(Images(n), DatasetCache(session), name=name).cache
    cached = []
    for i in range(n):
        row = cache.get(i)
        if row is not None:
            img, label = sample(i)
            assert np.array_equal(row[0], img) and int(row[1]) == label, i
            cached.append(i)
    return cached


def test_full_queue_drops_puts_instead_of_blocking(server, session, monkeypatch):
    monkeypatch.setattr(shmcache.async_put, "_warned_causes", set())
    ds = CachedDataset(Images(6), DatasetCache(session), put_queue=1)
    release = threading.Event()
    block_puts(ds, release)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The writer is stuck on row 0: the other misses must come back
        # anyway (a blocking queue would hang here until the 60 s assert).
        got = [ds[i] for i in range(6)]
    caught = [w for w in caught if w.category is CacheWarning]
    assert len(caught) == 1 and "put queue is full" in str(caught[0].message)
    for i, (img, label) in enumerate(got):
        assert torch.equal(img, torch.from_numpy(sample(i)[0])) and int(label) == i % 10
    st = ds.stats()["async_puts"]
    assert (st["queued"], st["dropped"]) == (1, 5)
    release.set()
    assert ds.flush(60)
    assert ds.stats()["async_puts"]["written"] == 1
    assert [i for i in range(6) if ds.cache.contains(i)] == [0]
    ds[3]                      # a dropped row is a miss again, queued again
    assert ds.flush(60) and ds.cache.contains(3)


class Mixed(Dataset):
    """Samples with every kind of leaf encode_row distinguishes."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        img, label = sample(i, 8)
        return {"img": img, "f": img.astype(np.float32) / 3,
                "u16": img.astype(np.uint16) * 200, "raw": bytes(img[0, 0]),
                "bf": torch.arange(4, dtype=torch.bfloat16) + i, "label": label}


def same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def test_the_writer_is_woken_by_a_full_batch_not_by_every_row(monkeypatch):
    # A wake-up per row cost a DataLoader worker more CPU than the put (the
    # writer takes the GIL from the decoding thread each time).
    monkeypatch.setattr(shmcache.async_put, "_HOLD_S", 60.0)  # no look by time
    stored = []
    done = threading.Event()

    def store(ids, rows):
        stored.append(list(ids))
        done.set()
        return len(ids)
    p = shmcache.async_put.AsyncPutter(store, batch_wakes=lambda: True)
    wakes = []
    real_notify = p._cond.notify
    p._cond.notify = lambda n=1: (wakes.append(n), real_notify(n))[1]
    batch = shmcache.async_put._BATCH_ROWS
    try:
        for i in range(batch - 1):
            assert p.enqueue(i, [i], 8)
        assert wakes == [] and stored == []
        assert p.enqueue(batch - 1, [batch - 1], 8)
        assert wakes                 # (the writer's own notify_all come later)
        assert done.wait(60)
        assert stored == [list(range(batch))]
        for i in range(3):           # below a batch: flush writes them now
            p.enqueue(100 + i, [i], 8)
        assert p.flush(60)
        assert stored[1:] == [[100, 101, 102]]
        assert p.stats() == dict(queued=batch + 3, written=batch + 3, dropped=0,
                                 not_stored=0, pending=0)
    finally:
        p.close(10)
    assert p._thread is None or not p._thread.is_alive()


def test_a_batchs_misses_are_queued_at_once_with_one_wake(server, session):
    # DataLoader's fetcher asks for a batch (__getitems__): its misses take
    # the queue's lock and wake the writer once, not once per row (each
    # wake-up takes the GIL from the thread computing the next row).
    ds = CachedDataset(Images(24), DatasetCache(session), name="batched")
    ds[0]                          # the writer thread exists, per-row wakes
    assert ds.flush(60)
    p = ds._putter
    wakes = []
    real_notify = p._cond.notify
    p._cond.notify = lambda n=1: (wakes.append(n), real_notify(n))[1]
    got = ds.__getitems__(list(range(1, 17)))
    assert len(wakes) == 1
    assert ds.flush(60)
    for i, (img, label) in zip(range(1, 17), got):
        assert torch.equal(img, torch.from_numpy(sample(i)[0])) and label == i % 10
    assert assert_cached_rows_whole(session, "batched", 24) == list(range(17))


class FailsAt(Dataset):
    """Images whose row `bad` raises."""

    def __init__(self, n, bad):
        self.images, self.bad = Images(n), bad

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"row {i} is unreadable")
        return self.images[i]


@pytest.mark.parametrize("async_puts", [True, False])
def test_rows_computed_before_a_row_that_raises_are_still_stored(server, session,
                                                                 async_puts):
    ds = CachedDataset(FailsAt(10, bad=5), DatasetCache(session), name=f"fails{async_puts}",
                       async_puts=async_puts)
    with pytest.raises(KeyError, match="row 5"):
        ds.__getitems__([7, 1, 5, 3])
    assert ds.flush(60)
    assert [i for i in range(10) if ds.cache.contains(i)] == [1, 7]
    img, label = ds.__getitems__([1])[0]            # a hit, whole
    assert torch.equal(img, torch.from_numpy(sample(1)[0])) and label == 1


READER = r"""
import sys
sys.path.insert(0, {here!r})
import numpy as np
from helpers import Images, sample
from shmcache import DatasetCache
from shmcache.torch import CachedDataset
n = int(sys.argv[3])
c = CachedDataset(Images(n), DatasetCache(int(sys.argv[1])), name=sys.argv[2]).cache
whole = []
for i in range(n):
    row = c.get(i)
    if row is not None:
        assert np.array_equal(row[0], sample(i)[0]) and int(row[1]) == i % 10, i
        whole.append(i)
print(*whole)
"""


def cached_elsewhere(server, session, name, n):
    """The ids of Images(n) that another process reads from the cache
    `name`, each checked whole against its source."""
    r = subprocess.run([sys.executable, "-c", READER.format(here=HERE), str(session),
                        name, str(n)], env=server.env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return [int(i) for i in r.stdout.split()]


def test_without_async_puts_a_batchs_misses_are_stored_by_one_put_before_it_returns(
        server, session):
    ds = CachedDataset(Images(24), DatasetCache(session), name="syncbatch",
                       async_puts=False)
    ds[0]                           # a miss stored alone; a hit in the batch
    puts = []
    real = ds.cache.put_encoded

    def put(ids, rows, strict):
        puts.append((list(ids), rows))
        return real(ids, rows, strict)
    ds.cache.put_encoded = put
    got = ds.__getitems__([5, 0, 9, 2, 17])
    # One put of the four misses, in the batch's order, and all four are in
    # the cache for another process as soon as the batch is returned.
    assert [ids for ids, _ in puts] == [[5, 9, 2, 17]]
    assert cached_elsewhere(server, session, "syncbatch", 24) == [0, 2, 5, 9, 17]
    for i, (img, label) in zip([5, 0, 9, 2, 17], got):
        assert torch.equal(img, torch.from_numpy(sample(i)[0])) and label == i % 10
    # No transform: nothing changes a sample before the put, which takes
    # the columns the samples are made of (no copy of the rows).
    for (img, _), cols in zip([got[0], *got[2:]], puts[0][1]):
        assert np.shares_memory(img.numpy(), cols[0][2])


class Augmented(Dataset):
    """Images whose sample takes a draw of torch's RNG (a seeded
    augmentation inside the dataset)."""

    def __init__(self, n):
        self.images = Images(n)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img, label = self.images[i]
        return torch.from_numpy(img).float() + torch.rand(1), label


def jitter(img):
    """A transform drawing from torch's RNG that changes its input in place."""
    return img.mul_(torch.rand(img.shape[0], 1, 1))


class Transformed(Dataset):
    """What a plain DataLoader script writes: the transform in __getitem__.
    Keeps each sample as the dataset made it (in the process that made it)
    in `made`."""

    def __init__(self, ds, transform):
        self.ds, self.transform, self.made = ds, transform, {}

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        img, label = self.ds[i]
        self.made[i] = img.clone()
        return self.transform(img), label


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("async_puts", [True, False])
def test_a_cold_epoch_draws_what_dataloader_draws_and_stores_the_untransformed_rows(
        server, session, num_workers, async_puts):
    # Each sample is made and then transformed before the next, as by a
    # plain DataLoader: seeded draws in the dataset and in the transform
    # land on the same samples. The transform works in place on a sample
    # that shares the memory of the row to store: the row stored is the
    # dataset's, not the transformed one.
    kw = dict(batch_size=4, shuffle=True, num_workers=num_workers)
    plain = Transformed(Augmented(14), jitter)
    torch.manual_seed(11)
    want = list(DataLoader(plain, **kw))
    name = f"augmented{num_workers}{async_puts}"
    cds = CachedDataset(Augmented(14), DatasetCache(session), name=name,
                        transform=jitter, async_puts=async_puts)
    torch.manual_seed(11)
    got = list(DataLoader(cds, **kw))
    assert len(got) == len(want)
    for (g, gl), (w, wl) in zip(got, want):
        assert torch.equal(g, w) and torch.equal(gl, wl)
    assert cds.flush(60)
    if num_workers == 0:            # plain.made was filled in this process
        assert sorted(plain.made) == list(range(14))
        for i, img in plain.made.items():
            assert torch.equal(torch.from_numpy(cds.cache.get(i)[0]), img), i


@pytest.mark.parametrize("async_puts", [True, False])
@pytest.mark.parametrize("how", ["killed", "stopped", "full"])
def test_batches_go_on_from_the_source_with_one_warning_when_the_cache_fails(
        server, session, async_puts, how):
    # 12 KB rows: a few 4 MB chunks, so puts need the daemon again after
    # it is killed or stopped (SIGSTOP: alive, its socket open, answering
    # nothing, so a put waits out the request timeout once and the cache
    # then stops asking); a 1 MB cache is full after some 80 rows.
    n = 1000
    cache = DatasetCache(session, size_mb=1) if how == "full" else DatasetCache(session)
    ds = CachedDataset(Images(n, side=64), cache, name=f"fails{how}{async_puts}",
                       async_puts=async_puts)
    labels = []
    with continued_after(server.pid):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for start in range(0, n, 50):
                if start == 100 and how != "full":
                    assert ds.flush(60)
                    if how == "killed":
                        server.kill()
                    else:
                        os.kill(server.pid, signal.SIGSTOP)
                for i, (img, label) in zip(range(start, start + 50),
                                           ds.__getitems__(range(start, start + 50))):
                    assert torch.equal(img, torch.from_numpy(sample(i, 64)[0]))
                    labels.append(label)
            assert ds.flush(60)
        stored = [i for i in range(n) if ds.cache.contains(i)]
    assert labels == [i % 10 for i in range(n)]
    cw = [str(x.message) for x in w if issubclass(x.category, CacheWarning)]
    assert len(cw) == 1, cw
    assert ("full" in cw[0]) if how == "full" else \
        ("gone" in cw[0] or "unreachable" in cw[0]), cw[0]
    assert 0 < len(stored) < n
    if how != "full":     # the rows stored before the failure are still hits
        assert stored[:100] == list(range(100))


def test_enqueue_many_drops_only_the_rows_that_do_not_fit(monkeypatch):
    monkeypatch.setattr(shmcache.async_put, "_warned_causes", set())
    release = threading.Event()
    stored = []

    def store(ids, rows):
        assert release.wait(60), "the test never released the writer"
        stored.extend(ids)
        return len(ids)
    p = shmcache.async_put.AsyncPutter(store, limit_bytes=100)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # The first row is taken into an empty queue however large; then
            # 80 bytes do not fit beside it, 20 and 30 do, 60 does not.
            assert p.enqueue_many([(1, "a", 50), (2, "b", 80), (3, "c", 20),
                                   (4, "d", 30), (5, "e", 60)]) == 3
        assert sum(w.category is CacheWarning for w in caught) == 1
        release.set()
        assert p.flush(60)
        assert stored == [1, 3, 4]
        assert p.stats() == dict(queued=3, written=3, dropped=2, not_stored=0, pending=0)
    finally:
        release.set()
        p.close(10)


@pytest.mark.parametrize("stalled_s", [0.0, 1e9])
def test_rows_dropped_behind_a_put_the_server_does_not_answer_name_the_server(
        monkeypatch, stalled_s):
    """A server that stopped answering (SIGSTOP, hung) fills the queue behind
    the put in flight: the one warning says so, not only "raise put_queue=",
    which no queue length would fix (a DataLoader worker may end before the
    put's timeout says it). A put in flight for _STALLED_S or more is the
    server's (here at once: _STALLED_S 0; no test waits for a duration); a
    shorter one may be either, and the warning names both."""
    monkeypatch.setattr(shmcache.async_put, "_warned_causes", set())
    monkeypatch.setattr(shmcache.async_put, "_STALLED_S", stalled_s, raising=False)
    in_put, release = threading.Event(), threading.Event()

    def store(ids, rows):
        in_put.set()
        assert release.wait(60), "the test never released the writer"
        return len(ids)
    p = shmcache.async_put.AsyncPutter(store, limit_bytes=100)
    try:
        assert p.enqueue(1, "a", 100)
        assert in_put.wait(60)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert p.enqueue_many([(2, "b", 50), (3, "c", 50)]) == 0
        (w,) = [w for w in caught if w.category is CacheWarning]
        said = str(w.message)
        assert "put queue is full" in said and "shmcache --server_info" in said, said
        if stalled_s == 0.0:
            assert "has not answered a put" in said and "put_queue=" not in said, said
        else:
            assert "behind a put that has waited" in said and "put_queue=" in said, said
    finally:
        release.set()
        p.close(10)


def test_drops_are_warned_about_once_per_cause(monkeypatch):
    """A queue that drops rows again says nothing more; a new cause (the
    server stopped answering after the queue was found slow) is said once
    too: one warning per process for any cause hid it."""
    monkeypatch.setattr(shmcache.async_put, "_warned_causes", set())
    monkeypatch.setattr(shmcache.async_put, "_STALLED_S", 0.0)
    # Woken by a batch or a flush only: the first row waits in the queue.
    monkeypatch.setattr(shmcache.async_put, "_HOLD_S", 60.0)
    in_put, release = threading.Event(), threading.Event()

    def store(ids, rows):
        in_put.set()
        assert release.wait(60), "the test never released the writer"
        return len(ids)
    p = shmcache.async_put.AsyncPutter(store, limit_bytes=100, batch_wakes=lambda: True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for row in (1, 2):      # queued, not yet being written: slower
                assert p.enqueue_many([(row, "a", 100), (row + 10, "b", 100)]) <= 1
            threading.Thread(target=p.flush, args=(60,), daemon=True).start()
            assert in_put.wait(60)  # now in a put the server has not answered
            for row in (3, 4):
                assert p.enqueue_many([(row, "c", 100)]) == 0
        said = [str(w.message) for w in caught if w.category is CacheWarning]
        assert len(said) == 2, said
        assert "put_queue=" in said[0] and "has not answered a put" in said[1], said
    finally:
        release.set()
        p.close(10)


def test_a_dataloader_workers_rows_are_stored_while_it_lives_and_at_its_exit(
        server, session):
    # A worker's writer (async_puts=True: by default a worker puts its
    # batches itself, test_worker_puts.py) wakes by batch: a row short of a
    # batch is stored within _HOLD_S all the same, and an epoch's rows by
    # the workers' exit.
    ds = CachedDataset(Images(40), DatasetCache(session), name="workers",
                       async_puts=True)
    it = iter(DataLoader(ds, batch_size=1, num_workers=1, persistent_workers=True))
    next(it)                        # the worker lives on, rows 0.. queued
    wait_for(lambda: ds.cache.contains(0), timeout=30, what="row 0 stored")
    del it
    epoch = DataLoader(ds, batch_size=8, num_workers=2)
    assert sum(len(b[1]) for b in epoch) == 40
    assert assert_cached_rows_whole(session, "workers", 40) == list(range(40))


def writer_of(ds, before):
    """The writer thread ds started (not one of `before`)."""
    (t,) = [t for t in threading.enumerate()
            if t.name == "shmcache-put" and t not in before]
    return t


@pytest.mark.parametrize("queued", [False, True])
def test_a_dropped_dataset_ends_its_writer_without_the_cycle_collector(
        server, session, monkeypatch, queued):
    """`del ds` frees a CachedDataset with async puts by reference counting
    alone: no cycle through its writer keeps it (a script that makes a
    dataset per epoch may not reach the cyclic collector for a long time).
    Its writer thread stores the rows still queued, then ends (not after
    its idle time) and lets go of its queue."""
    monkeypatch.setattr(shmcache.async_put, "_IDLE_EXIT_S", 3600.0)
    gc.collect()
    gc.disable()
    try:
        before = set(threading.enumerate())
        ds = CachedDataset(Images(6), DatasetCache(session), name=f"drop{queued}")
        release = threading.Event()
        block_puts(ds, release)
        if not queued:
            release.set()
        for i in range(6):
            ds[i]
        writer = writer_of(ds, before)
        if not queued:
            assert ds.flush(60)
        gone, putter = weakref.ref(ds), weakref.ref(ds._putter)
        cache = ds.cache
        del ds
        assert gone() is None
        release.set()
        assert wait_for(lambda: not writer.is_alive(), what="its writer to end")
        assert putter() is None
        assert [i for i in range(6) if cache.contains(i)] == list(range(6))
    finally:
        gc.enable()


def test_async_and_sync_puts_return_and_store_the_same(server, session):
    on = CachedDataset(Mixed(), DatasetCache(session), name="on")
    off = CachedDataset(Mixed(), DatasetCache(session), name="off", async_puts=False)
    for i in range(5):
        assert same(on[i], off[i])              # misses
    assert on.flush(60)
    for i in range(5):
        assert same(on[i], off[i])              # hits
    assert on.stats()["hits"] == 5
    for i in range(5):                          # the same stored columns
        a, b = on.cache.get_columns(i), off.cache.get_columns(i)
        assert [(n, d) for n, d, _ in a] == [(n, d) for n, d, _ in b]
        assert all(np.array_equal(x, y) for (_, _, x), (_, _, y) in zip(a, b))


def test_sample_modified_in_place_does_not_change_the_queued_row(server, session):
    def zero_in_place(s):
        s[0].zero_()
        return s
    ds = CachedDataset(Images(3), DatasetCache(session), transforms=zero_in_place)
    assert not ds[1][0].any()
    assert ds.flush(60)
    assert np.array_equal(ds.cache.get(1)[0], sample(1)[0])


@pytest.mark.parametrize("async_puts", [True, False])
def test_a_batch_modified_in_place_does_not_change_the_stored_rows(server, session,
                                                                  async_puts):
    # The batch's misses are queued after its transforms ran: the queue's
    # copies must be taken before them. Without async puts, the batch's
    # one put comes after the transforms too: the rows must be put (or
    # copied) before them.
    def zero_in_place(s):
        s[0].zero_()
        return s
    ds = CachedDataset(Images(6), DatasetCache(session), transforms=zero_in_place,
                       name=f"inplace{async_puts}", async_puts=async_puts)
    assert all(not img.any() for img, _ in ds.__getitems__([4, 0, 2]))
    assert ds.flush(60)
    for i in (4, 0, 2):
        assert np.array_equal(ds.cache.get(i)[0], sample(i)[0]), i


# ---- exit, os._exit after multiprocessing's hooks, SIGKILL, fork ----------

CHILD = r"""
import atexit, sys, threading
sys.path.insert(0, {here!r})
from helpers import Images
from shmcache import DatasetCache
import shmcache.async_put
from shmcache.torch import CachedDataset
mode, session, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
shmcache.async_put.EXIT_FLUSH_S = 60 if mode == "exit" else 0.5
ds = CachedDataset(Images(n), DatasetCache(session), name="exit")
real, go, written = ds.cache.put_encoded, threading.Event(), []
def put(ids, rows, strict):
    out = []
    for i, row in zip(ids, rows):   # row by row, gated
        if mode != "kill" or len(written) == n // 2:
            if mode == "kill":
                print("ready", flush=True)
            go.wait()
        written.append(i)
        out += real([i], [row], strict)
    return out
ds.cache.put_encoded = put
for i in range(n):
    ds[i]
# atexit runs last-registered first: the writer is released only once the
# process is exiting, with all n rows still queued.
atexit.register(go.set if mode == "exit" else lambda: None)
if mode == "kill":
    go.wait()
"""


def run_child(server, session, mode, n):
    return subprocess.Popen(
        [sys.executable, "-c", CHILD.format(here=HERE), mode, str(session), str(n)],
        env=server.env, stdout=subprocess.PIPE, text=True)


def test_exit_writes_queued_rows(server, session):
    p = run_child(server, session, "exit", 40)
    assert p.wait(timeout=120) == 0
    assert assert_cached_rows_whole(session, "exit", 40) == list(range(40))


def test_exit_with_a_stuck_writer_drops_the_queue_and_exits(server, session):
    p = run_child(server, session, "stuck", 40)
    assert p.wait(timeout=120) == 0      # the bounded flush gave up
    assert assert_cached_rows_whole(session, "exit", 40) == []


def test_sigkill_with_queued_puts_leaves_whole_rows(server, session):
    p = run_child(server, session, "kill", 40)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    wait_for(lambda: lines, timeout=120, what="the child's ready line")
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert assert_cached_rows_whole(session, "exit", 40) == list(range(20))
    # The cache goes on taking rows from others.
    ds = CachedDataset(Images(40), DatasetCache(session), name="exit")
    ds[30]
    assert ds.flush(60) and ds.cache.contains(30)


def _queue_then_return(session, n):
    """A multiprocessing child that returns (then os._exit, as a DataLoader
    worker does) with n rows queued; the writer is released by an exit
    hook that runs before shmcache's."""
    ds = CachedDataset(Images(n), DatasetCache(session), name="mp")
    go = threading.Event()
    block_puts(ds, go)
    for i in range(n):
        ds[i]
    multiprocessing.util.Finalize(None, go.set, exitpriority=1000)


def test_multiprocessing_child_writes_queued_rows_before_os_exit(server, session):
    p = multiprocessing.get_context("fork").Process(
        target=_queue_then_return, args=(session, 30))
    p.start()
    p.join(120)
    assert p.exitcode == 0
    assert assert_cached_rows_whole(session, "mp", 30) == list(range(30))


def test_forked_child_starts_with_an_empty_queue_and_a_free_lock(server, session):
    ds = CachedDataset(Images(8), DatasetCache(session), name="fork")
    release = threading.Event()
    block_puts(ds, release)
    ds[0], ds[1]                    # queued; the parent's writer is stuck
    held, forked = threading.Event(), threading.Event()

    def hold_queue_lock():          # a thread of the parent holds the lock
        with ds._putter._cond:      # while the main thread forks
            held.set()
            forked.wait(60)
    holder = threading.Thread(target=hold_queue_lock)
    holder.start()
    assert held.wait(60)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            pending = ds.stats()["async_puts"]["pending"]
            release.set()           # the child's own writer must not wait
            ds[5]
            code = 0 if pending == 0 and ds.flush(60) and ds.cache.contains(5) else 3
        finally:
            os._exit(code)
    forked.set()
    holder.join()
    try:
        done = wait_for(lambda: (lambda r: r if r[0] else None)(os.waitpid(pid, os.WNOHANG)),
                        timeout=60, what="the forked child")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    assert os.waitstatus_to_exitcode(done[1]) == 0
    release.set()
    assert ds.flush(60)
    assert all(ds.cache.contains(i) for i in (0, 1, 5))
