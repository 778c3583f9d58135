"""DatasetCache.read_into: rows copied by native threads straight into
batch arrays and tensors, with a hit mask."""

import warnings

import numpy as np
import pytest

from shmcache import CacheWarning, DatasetCache
from shmcache._read_into import ROW_MISSING, ROW_OTHER_LAYOUT, ROW_READ

torch = pytest.importorskip("torch")

MB = 1 << 20
UNTOUCHED = 0xAB


def img(i):
    return np.random.default_rng(i).integers(0, 256, (4, 8), dtype=np.uint8)


def put_rows(c, ids):
    for i in ids:
        assert c.put(i, (img(i), np.int64(i)))


def test_hits_misses_and_mismatched_rows_into_numpy(server, session):
    c = DatasetCache(session, read_threads=3)
    put_rows(c, [i for i in range(100) if i % 7 and i not in (50, 60)])
    c.put(50, (img(50).reshape(8, 4), np.int64(50)))        # another shape
    c.put(60, (img(60), np.float64(60)))                     # another dtype
    ids = np.array([(k * 37) % 100 for k in range(100)] + [3])
    out = (np.full((120, 4, 8), UNTOUCHED, np.uint8), np.full(120, -1, np.int64))
    hit = c.read_into(ids, out)
    assert hit.dtype == np.bool_ and hit.shape == (101,)
    for k, i in enumerate(ids):
        want = bool(i % 7) and i not in (50, 60)
        assert hit[k] == want, i
        if want:
            np.testing.assert_array_equal(out[0][k], img(i))
            assert out[1][k] == i
        else:
            assert (out[0][k] == UNTOUCHED).all() and out[1][k] == -1
    assert (out[0][101:] == UNTOUCHED).all()                 # past len(ids)
    # A list of ints, a dict of named columns, a selection of columns.
    assert c.read_into([1, 2], [np.zeros((2, 4, 8), np.uint8),
                                np.zeros(2, np.int64)]).all()
    labels = np.zeros(2, np.int64)
    assert c.read_into([5, 6], [labels], columns=[1]).all()
    assert list(labels) == [5, 6]
    assert not c.read_into([], out).size


def test_dict_rows_and_torch_tensors_with_the_package_dtypes(server, session):
    c = DatasetCache(session, read_threads=2)
    bf = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    for i in range(8):
        c.put(i, {"x": torch.full((2, 3), float(i)), "b": bf + i,
                  "u": np.arange(5, dtype=np.uint16) + 60000 + i})
    out = {"x": torch.zeros(8, 2, 3), "b": torch.zeros(8, 2, 3, dtype=torch.bfloat16),
           "u": torch.zeros(8, 5, dtype=torch.int32)}
    hit = c.read_into(range(8), out)
    assert hit.all()
    for i in range(8):
        assert torch.equal(out["x"][i], torch.full((2, 3), float(i)))
        assert torch.equal(out["b"][i], bf + i)
        assert out["u"][i].tolist() == [60000 + i + k for k in range(5)]
    # The same rows as CachedDataset would hand them out.
    for i in range(8):
        assert torch.equal(c.read_row(i, None, True, True)["u"], out["u"][i])
    # Numpy can take the bfloat16 bits as uint16.
    raw = np.zeros((8, 2, 3), np.uint16)
    assert c.read_into(range(8), [raw], columns=["b"]).all()
    assert torch.equal(torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)[3], bf + 3)


def test_bytes_have_no_torch_dtype_and_bad_targets_are_named(server, session):
    c = DatasetCache(session)
    c.put(0, {"blob": b"abcd", "y": np.float32(1)})
    with pytest.raises(TypeError, match="'blob'"):
        c.read_into([0], {"blob": torch.zeros(1, 4, dtype=torch.uint8)})
    blob = np.zeros((1, 4), np.uint8)
    assert c.read_into([0], {"blob": blob}).all() and blob.tobytes() == b"abcd"
    with pytest.raises(ValueError, match="first dimension"):
        c.read_into([0, 0], {"y": np.zeros(1, np.float32)})
    with pytest.raises(ValueError, match="writable"):
        ro = np.zeros(1, np.float32)
        ro.flags.writeable = False
        c.read_into([0], {"y": ro})
    with pytest.raises(ValueError, match="outside"):
        c.read_into([-1], {"y": np.zeros(1, np.float32)})
    with pytest.raises(TypeError):
        c.read_into([0], {"y": [0.0]})


def test_spilled_rows_are_hits(spill_server):
    c = DatasetCache(spill_server.new_session(), size_mb=1, spilling=True, name="s")
    n = 600                                  # 600 x 3 KB: most go to disk
    rows = np.random.default_rng(0).integers(0, 256, (n, 3072), dtype=np.uint8)
    for i in range(n):
        assert c.put(i, rows[i])
    st = c.stats()
    assert st["disk_rows"] > 0 and st["mem_rows"] > 0
    ids = np.arange(n)[::-1]
    out = np.zeros((n, 3072), np.uint8)
    assert c.read_into(ids, out).all()
    np.testing.assert_array_equal(out, rows[::-1])


def test_dead_server_gives_all_false_with_one_warning(server, session):
    c = DatasetCache(session)
    put_rows(c, range(4))
    out = (np.zeros((4, 4, 8), np.uint8), np.zeros(4, np.int64))
    assert c.read_into(range(4), out).all()
    server.kill()
    # Rows in memory are still read without the daemon.
    assert c.read_into(range(4), out).all()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fresh = DatasetCache(session)
        assert not fresh.read_into(range(4), out).any()
        assert not fresh.read_into(range(4), out).any()
    assert len([x for x in w if issubclass(x.category, CacheWarning)]) == 1


def test_each_row_is_matched_on_its_own_and_widened_natively(server, session):
    # Rows of one column stored as uint16 and as int32: both fill an int32
    # tensor (the first widened by the read), whichever comes first; a numpy
    # int32 array takes only the int32 rows. Codes say why a row missed.
    c = DatasetCache(session)
    for i in range(6):
        dt = np.uint16 if i % 2 else np.int32
        assert c.put(i, np.arange(3, dtype=dt) + 60000 + i)
    ids = [1, 0, 3, 2, 5, 4, 9]
    t = torch.full((7, 3), -1, dtype=torch.int32)
    hit = c.read_into(ids, t)
    assert hit.tolist() == [True] * 6 + [False]
    for k, i in enumerate(ids[:6]):
        assert t[k].tolist() == [60000 + i + j for j in range(3)]
    assert t[6].tolist() == [-1] * 3
    a = np.full((7, 3), -1, np.int32)
    codes = c.fill_batch(ids, a, None, 2, codes=True)
    assert codes.dtype == np.uint8
    assert codes.tolist() == [ROW_OTHER_LAYOUT, ROW_READ] * 3 + [ROW_MISSING]
    assert (a[0] == -1).all() and a[1].tolist() == [60000, 60001, 60002]


def test_one_native_call_per_batch_and_each_row_counted_once(server, session):
    # The batch crosses into C++ once: no Python code runs inside the native
    # call (it used to call back for a plan and widen after). Every id is
    # counted once, a hit or a miss.
    import sys
    c = DatasetCache(session)
    put_rows(c, range(10))
    c.put(10, (img(10), np.float32(1)))                  # another layout
    ids = np.arange(14)
    out = (torch.zeros(14, 4, 8, dtype=torch.uint8), torch.zeros(14, dtype=torch.int64))
    c.read_into(ids, out)                                 # opened, warmed
    before = c.stats()
    events, depth = [], [0]

    def prof(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") == "read_into":
            depth[0] += 1
            events.append("native")
        elif event in ("c_return", "c_exception") and \
                getattr(arg, "__name__", "") == "read_into":
            depth[0] -= 1
        elif event == "call" and depth[0]:
            events.append(frame.f_code.co_name)
    sys.setprofile(prof)
    try:
        hit = c.read_into(ids, out)
    finally:
        sys.setprofile(None)
    assert events == ["native"]
    assert hit.tolist() == [True] * 10 + [False] * 4
    after = c.stats()
    assert after["hits"] - before["hits"] == 11
    assert after["misses"] - before["misses"] == 3


def test_an_uncounted_fill_reads_the_same_rows_and_counts_nothing(server, session):
    # fill_batch(count=False): a loader's read-back of the rows its workers
    # stored after its own read of them missed (each read counted once).
    c = DatasetCache(session)
    put_rows(c, range(10))
    ids = np.arange(12)
    out = (torch.zeros(12, 4, 8, dtype=torch.uint8), torch.zeros(12, dtype=torch.int64))
    c.read_into(ids[:1], tuple(t[:1] for t in out))       # opened
    before = c.stats()
    codes = c.fill_batch(ids, out, None, 1, codes=True, count=False)
    assert codes.tolist() == [ROW_READ] * 10 + [ROW_MISSING] * 2
    after = c.stats()
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])
    counted = (torch.zeros_like(out[0]), torch.zeros_like(out[1]))
    assert c.read_into(ids, counted).tolist() == [True] * 10 + [False] * 2
    assert all(torch.equal(a, b) for a, b in zip(out, counted))
    after = c.stats()
    assert after["hits"] - before["hits"] == 10
    assert after["misses"] - before["misses"] == 2


def test_ids_are_checked(server, session):
    c = DatasetCache(session)
    put_rows(c, range(2))
    out = (np.zeros((2, 4, 8), np.uint8), np.zeros(2, np.int64))
    assert c.read_into([np.int64(1), 0], out).all()           # numpy ints in a list
    assert c.read_into(np.array([1, 0], np.uint32), out).all()
    assert c.read_into(torch.tensor([0, 1]), out).all()       # converted first
    with pytest.raises(ValueError, match="outside"):
        c.read_into([0, -1], out)
    with pytest.raises(ValueError, match="outside"):
        c.read_into(np.array([0, -1]), out)
    with pytest.raises(ValueError, match="outside"):
        c.read_into([1 << 64], out)
    with pytest.raises(TypeError, match="row id"):
        c.read_into([True, 0], out)
    with pytest.raises(TypeError, match="row ids are ints"):
        c.read_into(np.array([0.0, 1.0]), out)
    with pytest.raises(ValueError, match="one-dimensional"):
        c.read_into(np.zeros((1, 2), np.int64), out)


def test_rows_with_python_number_labels_read_into_their_targets(server, session):
    """A Python int or float is stored as a tagged number column; read_into
    reads it into the target of its plain name (tuple position or dict key)
    like any 0-d column."""
    cache = DatasetCache(session)
    assert cache.put_batch([0, 1], [(np.full(3, 7, np.uint8), 5),
                                    (np.full(3, 8, np.uint8), 6)])
    assert cache.put_batch([10, 11], [{"x": np.full(2, 1.5), "y": 0.25},
                                      {"x": np.full(2, 2.5), "y": 0.75}])
    rows_out, labels = np.zeros((2, 3), np.uint8), torch.zeros(2, dtype=torch.int64)
    assert cache.read_into([1, 0], (rows_out, labels)).tolist() == [True, True]
    assert rows_out[:, 0].tolist() == [8, 7] and labels.tolist() == [6, 5]
    out = {"x": np.zeros((2, 2)), "y": np.zeros(2)}
    assert cache.read_into([10, 11], out).tolist() == [True, True]
    assert out["y"].tolist() == [0.25, 0.75] and out["x"][:, 0].tolist() == [1.5, 2.5]
