"""DatasetCache.put_batch: the rows of put, many per call, with put's
per-row rules and its warnings."""

import multiprocessing
import warnings

import numpy as np
import pytest

from shmcache import CacheWarning, DatasetCache

MB = np.zeros(1 << 20, dtype=np.uint8)


def cache_warnings(record):
    return [str(x.message) for x in record if issubclass(x.category, CacheWarning)]


def rows_of_every_kind():
    rng = np.random.default_rng(3)
    return [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        (rng.integers(0, 255, (8, 8, 3), dtype=np.uint8), np.int64(7)),
        {"image": rng.standard_normal((2, 5)), "label": 3, "ok": np.bool_(True)},
        (b"raw bytes", np.float16([1.5, -2.0]), np.int8(-3)),
        np.arange(6, dtype=">i4").reshape(2, 3),     # foreign byte order
        np.asfortranarray(np.arange(6, dtype=np.uint16).reshape(2, 3)),
        np.float64(2.5),
    ]


def assert_same(got, want):
    if isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif isinstance(want, bytes):
        assert got == want
    else:
        w = np.asarray(want)
        if isinstance(want, int):
            w = w.astype(np.int64)
        assert got.dtype == w.dtype.newbyteorder("=") and got.shape == w.shape
        assert np.array_equal(got, w)


def _read_in_child(session, ids, q):
    c = DatasetCache(session)
    q.put([None if r is None else r.tobytes() for r in (c.get(i) for i in ids)])


def test_round_trip_of_every_dtype_and_shape(server, session):
    c = DatasetCache(session)
    rows = rows_of_every_kind()
    assert c.put_batch(list(range(len(rows))), rows) == [True] * len(rows)
    for i, want in enumerate(rows):
        assert_same(c.get(i), want)
    # Another process reads the same bytes.
    payload = [np.full(3072, i, dtype=np.uint8) for i in range(64)]
    assert c.put_batch(range(100, 164), payload) == [True] * 64
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_read_in_child, args=(session, list(range(100, 164)), q))
    p.start()
    got = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert got == [r.tobytes() for r in payload]


def test_first_row_of_an_id_wins_and_cached_ids_are_false(server, session):
    c = DatasetCache(session)
    a, b = np.zeros(4), np.ones(4)
    assert c.put_batch([1, 1, 2], [a, b, b]) == [True, False, True]
    assert np.array_equal(c.get(1), a)
    assert c.put_batch([2, 3], [a, a]) == [False, True]
    assert np.array_equal(c.get(2), b)


def test_full_part_way_keeps_what_was_stored_with_one_warning(server, session):
    c = DatasetCache(session, size_mb=8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        stored = c.put_batch(range(16), [MB] * 16)       # 16 MB into 8 MB
        later = c.put_batch(range(16, 20), [MB] * 4)
    assert stored[0] and not stored[-1]
    k = stored.index(False)
    assert stored == [True] * k + [False] * (16 - k)
    assert later == [False] * 4
    (msg,) = cache_warnings(w)
    assert msg.startswith("shmcache: cache ") and " is full: " in msg, msg
    assert "cached rows are still served" in msg
    assert all(c.get(i) is not None for i in range(k))
    assert not c.accepting


@pytest.mark.parametrize("big_mb, why", [(12, "whole memory budget of 8 MB"),
                                         (5, "the most one row can take")])
def test_row_too_large_is_refused_alone_with_one_warning(server, session, big_mb, why):
    """A row larger than the budget, or within it but larger than any room
    the cache can still give one row (8 MB after small rows: its budget is
    in two 4 MB segments), is refused alone, with one warning that says why
    and the fix; the cache is not full and smaller rows are still cached."""
    c = DatasetCache(session, size_mb=8)
    small = np.zeros(16, dtype=np.uint8)
    big = np.zeros(big_mb << 20, dtype=np.uint8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert c.put_batch([0, 1, 2], [small, big, small]) == [True, False, True]
        assert c.put_batch([3, 4], [big, small]) == [False, True]
    (msg,) = cache_warnings(w)
    assert "row 1 cannot be cached" in msg and why in msg, msg
    assert "size_mb" in msg and "rows like it are read from the source" in msg, msg
    assert c.accepting and c.get(1) is None and c.get(4) is not None


class _OneBigSample:
    """Small samples, and at index 3 one of 5 MB: more than an 8 MB cache
    that took small rows can give one row."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full(5 << 20 if i == 3 else 16, i, dtype=np.uint8)


@pytest.mark.parametrize("async_puts", [False, True])
def test_a_sample_larger_than_the_room_left_never_breaks_training(server, session,
                                                                  async_puts):
    """CachedDataset over an 8 MB cache: the 5 MB sample is delivered every
    epoch from the source, after one CacheWarning; the others are cached
    and hits in the next epoch."""
    torch = pytest.importorskip("torch")
    from shmcache.torch import CachedDataset
    ds = CachedDataset(_OneBigSample(), DatasetCache(session, size_mb=8), name="big",
                       async_puts=async_puts)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for epoch in range(2):
            for i in range(len(ds)):
                assert torch.equal(ds[i], torch.from_numpy(_OneBigSample()[i])), i
            assert ds.flush(60)
    (msg,) = cache_warnings(w)
    assert "row 3 cannot be cached" in msg and "size_mb" in msg, msg
    assert [i for i in range(8) if ds.cache.contains(i)] == [0, 1, 2, 4, 5, 6, 7]
    assert ds.stats().hits == 7 and not ds.stats().full


def test_malformed_row_raises_after_the_others_are_stored(server, session):
    c = DatasetCache(session)
    bad = {"x" * 300: np.zeros(2)}            # a column name the codec refuses
    with pytest.raises(ValueError, match="row 1 cannot be cached"):
        c.put_batch([0, 1, 2], [np.zeros(2), bad, np.ones(2)])
    assert c.get(0) is not None and c.get(2) is not None and c.get(1) is None
    with pytest.raises(ValueError, match="2 ids but 1 rows"):
        c.put_batch([5, 6], [np.zeros(2)])
    with pytest.raises(TypeError):
        c.put_batch([7], [object()])


def test_unreachable_server_drops_the_batch_with_one_warning(server, session):
    c = DatasetCache(session).open()
    assert c.put_batch([0], [MB]) == [True]
    server.kill()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        # Leasing a new chunk needs the daemon: 8 MB do not fit the chunk.
        first = c.put_batch(range(1, 9), [MB] * 8)
        assert c.put_batch([20], [MB]) == [False]
    assert first[-1] is False
    (msg,) = cache_warnings(w)
    assert msg.startswith("shmcache: the cache server is unreachable ("), msg
    assert c.get(0) is not None                 # reads of shared memory go on


def _one_cache_warning(record):
    (w,) = [x for x in record if x.category is CacheWarning]
    return w


@pytest.mark.parametrize("entry", ["put", "put_batch"])
def test_the_full_warning_names_the_callers_line_and_says_it_once(server, session, entry):
    """The CacheWarning of a full cache points at the user's put (not at
    the package's own line: put and put_batch reach it through different
    depths) and says "full" once, with the library's numbers and the fix."""
    c = DatasetCache(session, size_mb=8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if entry == "put":
            for i in range(16):
                c.put(i, MB)
        else:
            c.put_batch(range(16), [MB] * 16)
    w = _one_cache_warning(w)
    assert w.filename == __file__, (w.filename, w.lineno)
    msg = str(w.message)
    assert msg.count("full") == 1, msg
    assert "is full: its budget of 8 MB is used up" in msg, msg
    assert "size_mb" in msg and "cached rows are still served" in msg, msg


def test_other_warnings_name_the_callers_line(server, session):
    """A row too large (put's own path) and a bypassed cache (the
    constructor's) warn at the user's line too."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        DatasetCache(session, size_mb=8).put(0, np.zeros(12 << 20, dtype=np.uint8))
    assert _one_cache_warning(w).filename == __file__
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        DatasetCache(0)
    assert _one_cache_warning(w).filename == __file__
