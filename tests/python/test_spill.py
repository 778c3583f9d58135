"""Rows spilled to disk: every row put accepts reads back whole, and a row
too large to spill is refused with one warning while the cache goes on."""

import warnings

import numpy as np

from shmcache import CacheWarning, DatasetCache

MB = 1 << 20


def test_large_spilled_rows_read_back_whole(spill_server):
    c = DatasetCache(spill_server.new_session(), size_mb=1, spilling=True, name="big")
    rows = {0: np.arange(40 * MB, dtype=np.uint8),   # 40 MB: spills
            1: np.full(3072, 7, dtype=np.uint8)}     # still fits memory
    for i, a in rows.items():
        assert c.put(i, a) is True
    st = c.stats()
    assert (st["disk_rows"], st["mem_rows"]) == (1, 1)
    for i, a in rows.items():
        np.testing.assert_array_equal(c.get(i), a)
        np.testing.assert_array_equal(c.view(i), a)
    for copy in (True, False):
        got = c.get_batch([0, 1, 0], copy=copy)
        for i, g in zip([0, 1, 0], got):
            np.testing.assert_array_equal(g, rows[i])


def test_row_too_large_to_spill_is_refused_with_one_warning(spill_server):
    c = DatasetCache(spill_server.new_session(), size_mb=1, spilling=True, name="huge")
    huge = np.zeros(70 * MB, dtype=np.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert c.put(0, huge) is False
        assert c.put(1, huge) is False
    msgs = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(msgs) == 1, msgs
    assert "(70.0 MB)" in msgs[0] and "(64.0 MB)" in msgs[0], msgs[0]
    assert not c.contains(0)
    # The cache still takes and serves rows, through the same connection.
    assert c.accepting and not c.bypassed
    small = np.full(3072, 3, dtype=np.uint8)
    assert c.put(2, small) is True
    np.testing.assert_array_equal(c.get(2), small)
