"""A spilled row damaged on the server's disk (a bit flipped in its table
file, as a bad disk flips one) costs that row, not the cache: the epoch
that meets it reads it from the source as a counted miss, with one
CacheWarning naming the cache and how many rows; the server drops it, the
epoch's put stores it again, and every other row is served from the cache
throughout."""

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from conftest import wait_for  # noqa: E402
from helpers import Images, sample  # noqa: E402
from shmcache import CacheWarning, DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset, CachedLoader  # noqa: E402

N = 96          # 12 KB rows (3x64x64 uint8) in a 1 MB cache: about a third spill
BATCH = 16
SIDE = 64


def places_in_tables(spill_dir, data):
    """(file, offset) of every copy of `data` in the spill database's table
    files (an obsolete file a compaction left may hold one too)."""
    at = []
    for f in Path(spill_dir).rglob("*.sst"):
        table = f.read_bytes()
        i = table.find(data)
        while i >= 0:
            at.append((f, i))
            i = table.find(data, i + 1)
    return at


def flip_a_bit(spill_dir, row_id):
    """Flips a bit in the middle of spilled row `row_id`'s image, in every
    table file that holds it, once the server has flushed it to one."""
    img = sample(row_id, SIDE)[0].tobytes()
    at = wait_for(lambda: places_in_tables(spill_dir, img),
                  what=f"row {row_id} to reach a table file")
    for f, offset in at:
        with open(f, "r+b") as fh:
            fh.seek(offset + len(img) // 2)
            b = fh.read(1)
            fh.seek(offset + len(img) // 2)
            fh.write(bytes([b[0] ^ 0x20]))


def epoch(cds, seed):
    torch.manual_seed(seed)
    loader = CachedLoader(cds, batch_size=BATCH, shuffle=True)
    got = list(loader)
    assert loader.flush(60)
    return got


def source_epoch(ds, seed):
    torch.manual_seed(seed)
    return list(DataLoader(ds, batch_size=BATCH, shuffle=True))


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for k, ((gi, gl), (wi, wl)) in enumerate(zip(got, want)):
        assert torch.equal(gi, wi), f"batch {k}: images differ"
        assert torch.equal(gl, wl), f"batch {k}: labels differ"


def counts(cds):
    st = cds.stats()
    assert st is not None, "the cache was bypassed"
    return st["hits"], st["misses"]


def cache_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def test_a_corrupt_spilled_row_is_a_counted_miss_and_the_cache_serves_on(spill_server,
                                                                        tmp_path):
    ds = Images(N, side=SIDE)
    cds = CachedDataset(ds, DatasetCache(spill_server.new_session(), size_mb=1,
                                         spilling=True), name="damaged")
    for i in range(N):   # rows spill in the order they are put
        cds[i]
    assert cds.flush(60)
    st = cds.stats()
    assert st["mem_rows"] + st["disk_rows"] == N and st["disk_rows"] >= 8, st
    bad = st["mem_rows"] + st["disk_rows"] // 2
    flip_a_bit(tmp_path / "spill", bad)

    hits, misses = counts(cds)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same_batches(epoch(cds, 0), source_epoch(ds, 0))
    said = cache_warnings(caught)
    assert len(said) == 1, said
    assert "1 spilled row of cache 'damaged'" in said[0], said[0]
    assert "Fix:" in said[0], said[0]
    assert not cds.cache.bypassed
    # The damaged row was a miss; every other row, spilled or in memory, a hit.
    assert counts(cds) == (hits + N - 1, misses + 1)

    # The epoch's miss put the row again: the next epoch finds it healthy,
    # with no warning and nothing read from the source.
    hits, misses = counts(cds)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same_batches(epoch(cds, 1), source_epoch(ds, 1))
    assert cache_warnings(caught) == []
    assert counts(cds) == (hits + N, misses)
    assert cds.stats()["disk_rows"] == st["disk_rows"]
