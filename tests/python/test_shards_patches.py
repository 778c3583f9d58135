"""Several processes on one session; shards and patches."""

import multiprocessing as mp

import numpy as np
import pytest

from shmcache import DatasetCache
from shmcache.shards import get_patch, put_patches, shard_indices, slice_patches

N = 400


def row(i):
    return (np.full(256, i % 251, dtype=np.uint8), i)


def device(session, k, devices, barrier, out):
    cache = DatasetCache(session, name="shared")
    bad = 0
    for i in shard_indices(N, devices, k):             # epoch 1: my shard
        if cache.get(i) is None:
            cache.put(i, row(i))
    barrier.wait(timeout=60)
    hits = 0
    for i in range(N):                                  # epoch 2: everything
        got = cache.get(i)
        if got is None:
            cache.put(i, row(i))
            continue
        hits += 1
        bad += int(not (np.array_equal(got[0], row(i)[0]) and got[1] == i))
    out.put((k, hits, bad))


def test_four_processes_disjoint_shards_then_all_hold_one_copy(server, session):
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=device, args=(session, k, 4, barrier, out))
             for k in range(4)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert all(hits == N and bad == 0 for _, hits, bad in results), results
    (c,) = server.cache_rows(session).values()
    assert c["mem_cached"] == N            # not 4 * N
    assert c["hits"] == 4 * N and c["misses"] == N


def patch_reader(session, k, out):
    cache = DatasetCache(session, name="patches")
    got = []
    for i in range(8):
        before = cache.bytes_read
        p = get_patch(cache, i, k)
        got.append((p.tobytes(), cache.bytes_read - before))
    out.put((k, got))


def test_each_device_reads_only_its_patch(server, session):
    cache = DatasetCache(session, name="patches")
    images = [np.random.default_rng(i).integers(0, 256, (96, 96, 3), dtype=np.uint8)
              for i in range(8)]
    for i, img in enumerate(images):
        put_patches(cache, i, slice_patches(img, 2, 2), label=i)
    patch_bytes = 48 * 48 * 3
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=patch_reader, args=(session, k, out)) for k in range(4)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for k in range(4):
        r, c = divmod(k, 2)
        for i, (data, nread) in enumerate(results[k]):
            assert data == images[i][r * 48:(r + 1) * 48, c * 48:(c + 1) * 48].tobytes()
            assert nread == patch_bytes
    # The row is stored once, with every patch; a zero-copy read of one patch
    # copies nothing at all.
    (c,) = server.cache_rows(session).values()
    assert c["mem_cached"] == 8 and c["avg_cache_size"] >= 4 * patch_bytes
    v = get_patch(cache, 3, 2, copy=False)
    assert not v.flags.writeable and not v.flags.owndata and v.nbytes == patch_bytes


def test_slice_patches_pads_uneven_images():
    img = np.arange(5 * 7, dtype=np.int32).reshape(5, 7)
    ps = slice_patches(img, 2, 2)
    assert [p.shape for p in ps] == [(3, 4)] * 4
    assert ps[3][-1, -1] == 0 and ps[0][0, 0] == 0 and ps[1][0, 0] == 4
    with pytest.raises(ValueError):
        slice_patches(np.zeros(3), 1, 1)


@pytest.mark.parametrize("nh, nw", [(0, 1), (1, 0), (-1, 2), (2, -3)])
def test_slice_patches_refuses_fewer_than_one_patch(nh, nw):
    with pytest.raises(ValueError, match="at least 1"):
        slice_patches(np.zeros((4, 4)), nh, nw)


@pytest.mark.parametrize("nh, nw", [(1.5, 1), (1, "2"), (True, 1)])
def test_slice_patches_refuses_counts_that_are_not_ints(nh, nw):
    with pytest.raises(TypeError, match="must be an int"):
        slice_patches(np.zeros((4, 4)), nh, nw)
