"""Arrays round-trip exactly: every dtype, both byte orders, ranks 0..4."""

import numpy as np
import pytest

from shmcache import DatasetCache

# Every numpy dtype the package stores natively (bfloat16 and bytes travel
# as uint16 / uint8 with their name given; see test_dataset_cache.py).
DTYPES = ["u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "b1"]
SHAPES = [(), (3,), (2, 3), (2, 1, 3), (1, 2, 3, 2)]


def values(dtype, shape):
    """An ndarray (0-d included, not a numpy scalar) of `dtype`, byte order
    included."""
    n = np.arange(1, 1 + int(np.prod(shape)))
    kind = np.dtype(dtype).kind
    if kind == "b":
        n = n % 2
    elif kind == "f":
        n = n * 1.25 - 3                      # fractions, negatives
    else:
        # several bytes per value where the type has several
        n = n * 61 % 2 ** (8 * np.dtype(dtype).itemsize - 1)
    a = np.array(n.tolist(), dtype=dtype).reshape(shape)
    assert isinstance(a, np.ndarray) and a.dtype == dtype and a.shape == shape
    return a


@pytest.mark.parametrize("order", ["<", ">"])
def test_every_dtype_byte_order_and_rank_round_trips(server, session, order):
    c = DatasetCache(session)
    rows = {}
    for i, dt in enumerate(DTYPES):
        for j, shape in enumerate(SHAPES):
            a = values(np.dtype(dt).newbyteorder(order), shape)
            rows[i * 10 + j] = (a, {"x": a}, a)
    for k, (a, d, bare) in rows.items():
        assert c.put(k, (a,)) is True
        assert c.put(1000 + k, d) is True
        assert c.put(2000 + k, bare) is True
    for k, (a, _, _) in rows.items():
        for copy in (True, False):
            for got in (c.get(k, copy=copy)[0], c.get(1000 + k, copy=copy)["x"],
                        c.get(2000 + k, copy=copy),
                        c.get(1000 + k, columns="x", copy=copy)):
                assert got.shape == a.shape, (a.dtype, a.shape, got.shape)
                assert got.dtype == a.dtype.newbyteorder("=")
                assert got.dtype.isnative
                assert got.tolist() == a.tolist(), (a.dtype, a.shape)


def test_non_contiguous_and_zero_d_arrays_keep_their_shape(server, session):
    c = DatasetCache(session)
    t = np.arange(12, dtype=">i4").reshape(3, 4).T       # strided, big-endian
    assert c.put(1, (t, np.array(7), np.array(2.5, ">f8")))
    got = c.get(1)
    assert got[0].shape == (4, 3) and got[0].tolist() == t.tolist()
    assert got[1].shape == () and got[1] == 7
    assert got[2].shape == () and got[2] == 2.5


class Tagged(np.ndarray):
    """An ndarray subclass, as some libraries hand out."""


def test_a_batch_of_many_columns_of_many_ranks_comes_back_whole(server, session):
    # 64 rows of 0-d to 6-d columns (more dimensions in all than the parse
    # makes room for at first), a subclass among them: each row reads back
    # with its own shapes and values.
    c = DatasetCache(session)
    rows = []
    for i in range(64):
        rank = i % 7
        a = np.arange(i, i + 2 ** rank, dtype=np.int32).reshape((2,) * rank)
        sub = np.full((1, 2, 3), i, dtype=np.float32).view(Tagged)
        rows.append({"a": a, "sub": sub, "b": np.full((1,) * (6 - rank) + (2,), i, "u1")})
    assert c.put_batch(range(64), rows) == [True] * 64
    for i, want in enumerate(rows):
        got = c.get(i)
        for k in want:
            assert got[k].shape == want[k].shape, (i, k)
            assert got[k].tolist() == want[k].tolist(), (i, k)


def test_put_columns_takes_arrays_of_any_layout(server, session):
    # Columns given as they are (not through encode): strided, Fortran-
    # ordered, a subclass, the dtype given by name or by the array.
    c = DatasetCache(session)
    t = np.arange(12, dtype=np.int16).reshape(3, 4)
    cols = [("s", None, t.T), ("f", "int16", np.asfortranarray(t)),
            ("k", "float32", np.ones((2, 2), np.float32).view(Tagged)),
            ("e", None, t[:, ::2])]
    assert c.put_columns(1, cols) is True
    got = {name: a for name, _, a in c.get_columns(1)}
    for name, _, a in cols:
        assert got[name].shape == a.shape and got[name].tolist() == a.tolist(), name
    with pytest.raises(ValueError, match="unknown dtype name: nope"):
        c.put_columns(2, [("x", "nope", np.zeros(2))])
    with pytest.raises(RuntimeError):
        c.put_columns(3, [("x", 5, np.zeros(2))])  # a dtype name that is no str
    assert c.get(2) is None and c.get(3) is None and c.accepting


def test_put_columns_refuses_an_array_of_python_objects(server, session):
    # Given a dtype name of its itemsize, an array of objects was stored as
    # the objects' addresses, read back (by every process of the session)
    # as numbers.
    c = DatasetCache(session)
    objects = np.array([object(), object()], dtype=object)
    fields = np.zeros(2, dtype=[("a", "O")])   # an object field: itemsize 8
    for name, a in (("int64", objects), ("uint64", objects), (None, objects),
                    ("int64", fields)):
        with pytest.raises(TypeError, match="column 'x' holds Python objects"):
            c.put_columns(1, [("x", name, a)])
        with pytest.raises(TypeError, match="column 'x' holds Python objects"):
            c.put_encoded([1], [[("x", name, a)]], strict=True)
    assert c.get(1) is None and c.accepting


def test_a_rows_list_emptied_while_put_batch_reads_it_is_refused(server, session):
    # A column that is no ndarray is converted by numpy, which calls its
    # __array__: Python code, here emptying the list being read.
    c = DatasetCache(session)
    rows: list = []

    class Emptying:
        def __array__(self, dtype=None, copy=None):
            rows.clear()
            return np.zeros(3, np.uint8)

    rows += [[("a", None, Emptying())], [("a", None, np.ones(3, np.uint8))]]
    with pytest.raises(ValueError, match="rows list changed"):
        c.put_encoded([1, 2], rows, strict=True)
    assert c.get(1) is None and c.get(2) is None and c.accepting


def test_a_row_emptied_while_its_column_converts_keeps_the_column_held(server, session):
    # The row's list held the column's tuple alone: emptied by the array's
    # __array__, it freed the tuple, its name and its dtype name while
    # put_batch still read them (the name was then stored from freed memory).
    c = DatasetCache(session)
    freed: list = []
    seen: list = []

    class Name(str):
        def __del__(self):
            freed.append(str(self))

    class Emptying:
        def __array__(self, dtype=None, copy=None):
            row.clear()
            seen.append(list(freed))
            return np.arange(3, dtype=np.uint8)

    row = [(Name("image"), Name("uint8"), Emptying())]
    assert c.put_encoded([1], [row], strict=True) == [True]
    assert seen == [[]], "the column was freed while put_batch read it"
    assert [n for n, _, _ in c.get_columns(1)] == ["image"]
    assert list(c.get_columns(1)[0][2]) == [0, 1, 2]


def test_put_columns_refuses_a_foreign_byte_order(server, session):
    c = DatasetCache(session)
    with pytest.raises(ValueError, match="byte order"):
        c.put_columns(1, [("x", None, np.array([1, 2], ">i4"))])
    assert c.get(1) is None and c.accepting


class Labelled:
    """Samples whose label is a 0-d array (np.array(label)), big-endian
    images, as a dataset reading a big-endian file format gives them."""

    root = "labelled-0d"

    def __len__(self):
        return 12

    def __getitem__(self, i):
        img = np.full((2, 3), i, dtype=">f4")
        return img, np.array(i % 5)


def test_zero_d_labels_collate_to_one_label_per_sample(server, session):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader
    from shmcache.torch import CachedDataset

    ds = CachedDataset(Labelled(), DatasetCache(session))
    loader = DataLoader(ds, batch_size=4)
    for _ in range(2):                      # misses, then hits
        imgs, labels = [], []
        for img, label in loader:
            assert img.shape == (4, 2, 3) and label.shape == (4,)
            imgs.append(img)
            labels.append(label)
        assert torch.cat(labels).tolist() == [i % 5 for i in range(12)]
        assert torch.cat(imgs)[:, 0, 0].tolist() == list(range(12))
        torch.nn.functional.cross_entropy(torch.zeros(4, 5), label)
        assert ds.flush(60)                 # the background puts are done
    assert ds.stats()["hits"] == 12
