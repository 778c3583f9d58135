"""Zero-copy hits of CachedDataset, batched gets, and spilled rows read
through views and batches."""

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from shmcache import DatasetCache

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from helpers import Images, sample  # noqa: E402
from shmcache.torch import CachedDataset  # noqa: E402


def _identity(sample):
    return sample


def test_zero_copy_hits_alias_shared_memory_and_copies_do_not(server, session):
    src = Images(8)
    zc = CachedDataset(src, DatasetCache(session), copy=False)
    cp = CachedDataset(src, DatasetCache(session), copy=True)
    miss = zc[3]
    assert zc.flush(60)
    h1, h2 = zc[3], zc[3]
    assert h1[0].data_ptr() == h2[0].data_ptr()          # the same shared bytes
    c1, c2 = cp[3], cp[3]
    assert c1[0].data_ptr() != c2[0].data_ptr()
    assert c1[0].data_ptr() != h1[0].data_ptr()
    for s in (miss, h1, c1):
        assert torch.equal(s[0], torch.from_numpy(sample(3)[0])) and int(s[1]) == 3
    # A write to a copy stays private.
    c1[0].add_(1)
    assert torch.equal(zc[3][0], torch.from_numpy(sample(3)[0]))


def test_zero_copy_default_only_in_workers_without_transform(server, session):
    cache = DatasetCache(session)
    assert CachedDataset(Images(4), cache)._mode()[0]                # main process: copies
    assert not CachedDataset(Images(4), cache, copy=False)._mode()[0]
    with pytest.raises(TypeError):
        CachedDataset(Images(4), cache, copy="no")
    plain = CachedDataset(Images(4), cache)
    shaped = CachedDataset(Images(4), cache, transform=_identity)
    for ds, want in ((plain, True), (shaped, False)):
        loader = DataLoader(ds, batch_size=2, num_workers=1,
                            collate_fn=lambda b, ds=ds: not ds._mode()[0])
        assert list(loader) == [want, want]


def test_zero_copy_hits_do_not_warn(server, session):
    # torch warns once per process about non-writable arrays: a fresh
    # process with warnings as errors catches it.
    code = textwrap.dedent(f"""
        import warnings; warnings.simplefilter("error")
        import sys; sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})
        from helpers import Images
        from shmcache import DatasetCache
        from shmcache.torch import CachedDataset
        ds = CachedDataset(Images(4), DatasetCache({session}), copy=False)
        first = [ds[i] for i in range(4)]
        again = [ds[i] for i in range(4)]
        assert all(a[0].equal(b[0]) for a, b in zip(first, again))
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=server.env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_two_worker_epochs_identical_with_zero_copy(server, session):
    n = 64
    ds = CachedDataset(Images(n), DatasetCache(session))
    loader = DataLoader(ds, batch_size=8, num_workers=2)
    e1 = [b for b in loader]
    e2 = [b for b in loader]
    assert ds.stats()["hits"] == n
    for (a1, l1), (a2, l2) in zip(e1, e2):
        assert torch.equal(a1, a2) and torch.equal(l1, l2)
    want = torch.stack([torch.from_numpy(sample(i)[0]) for i in range(n)])
    assert torch.equal(torch.cat([a for a, _ in e2]), want)


def test_get_batch_hits_misses_and_private_copies(server, session):
    c = DatasetCache(session)
    rows = {i: np.full((5, 7), i, dtype=np.float32) for i in range(10) if i != 5}
    for i, a in rows.items():
        c.put(i, (a, i))
    got = c.get_batch([0, 5, 9, 3])
    assert got[1] is None
    for i, g in zip((0, 9, 3), (got[0], got[2], got[3])):
        np.testing.assert_array_equal(g[0], rows[i])
        assert int(g[1]) == i
    got[0][0][0, 0] = -1                          # writable, private
    np.testing.assert_array_equal(c.get(0)[0], rows[0])
    assert c.get_batch([]) == []
    with pytest.raises(ValueError):
        c.get_batch([1, -1])
    ds = CachedDataset(Images(6), c, copy=True)
    singles = [ds[i] for i in range(6)]           # misses, then stored
    batch = ds.__getitems__([5, 0, 3])
    for i, s in zip((5, 0, 3), batch):
        assert torch.equal(s[0], singles[i][0]) and int(s[1]) == int(singles[i][1])
    assert ds.flush(60)


def test_spilled_rows_read_right_through_views_and_batches(spill_server):
    session = spill_server.new_session()
    c = DatasetCache(session, size_mb=1, spilling=True, name="spill")
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 255, 64 * 1024, dtype=np.uint8) for _ in range(40)]
    for i, a in enumerate(rows):
        assert c.put(i, a)
    st = c.stats()
    assert st["disk_rows"] > 1 and st["mem_rows"] > 0
    spilled = [i for i in range(40)][-st["disk_rows"]:]
    # Two views of spilled rows: the first must not change under the second.
    v1, v2 = c.view(spilled[0]), c.view(spilled[1])
    np.testing.assert_array_equal(v1, rows[spilled[0]])
    np.testing.assert_array_equal(v2, rows[spilled[1]])
    for copy in (True, False):
        got = c.get_batch(list(range(40)), copy=copy)
        for i, g in enumerate(got):
            np.testing.assert_array_equal(g, rows[i])
    ds = CachedDataset(Images(40, side=128), DatasetCache(session, size_mb=1, spilling=True),
                       copy=False, name="imgs")
    [ds[i] for i in range(40)]                      # misses: 40 x 48 KB into 1 MB
    assert ds.flush(60)
    assert ds.stats()["disk_rows"] > 1
    held = [ds[i] for i in range(40)]               # hits, all alive at once
    for i, s in enumerate(held):
        assert torch.equal(s[0], torch.from_numpy(sample(i, 128)[0]))


def test_in_place_write_to_a_zero_copy_hit_faults_and_changes_nothing(server, session):
    src = Images(4)
    ds = CachedDataset(src, DatasetCache(session), copy=False)
    ds[2]
    assert ds.flush(60)
    view = DatasetCache(session).named(ds.cache.name, ds.cache.fingerprint).view(2)
    with pytest.raises(ValueError, match="read-only"):
        view[0][0, 0, 0] = 1                    # numpy views refuse writes
    # A zero-copy tensor (torch has no read-only tensors) over memory this
    # process maps read-only: the write kills the writer, loudly.
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})
        from helpers import Images
        from shmcache import DatasetCache
        from shmcache.torch import CachedDataset
        ds = CachedDataset(Images(4), DatasetCache({session}), copy=False)
        img, label = ds[2]
        print("hit", flush=True)
        img.add_(1)
        print("written", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", code], env=server.env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGSEGV and r.stdout.split() == ["hit"], r
    # Every other reader still sees the row as it was put.
    again = CachedDataset(src, DatasetCache(session), copy=True)[2]
    assert torch.equal(again[0], torch.from_numpy(sample(2)[0]))


def test_memory_rows_of_a_spilling_cache_are_still_zero_copy(spill_server):
    c = DatasetCache(spill_server.new_session(), size_mb=1, spilling=True, name="z")
    rows = np.random.default_rng(0).integers(0, 256, (600, 3072), dtype=np.uint8)
    for i in range(600):
        assert c.put(i, rows[i])
    assert c.stats()["disk_rows"] > 0
    mem, disk = 0, 599                     # the first rows stay in memory
    m1, m2, d1, d2 = c.view(mem), c.view(mem), c.view(disk), c.view(disk)
    assert m1.ctypes.data == m2.ctypes.data       # the same shared bytes
    assert d1.ctypes.data != d2.ctypes.data       # private copies
    for i in (mem, disk):
        np.testing.assert_array_equal(c.view(i), rows[i])
