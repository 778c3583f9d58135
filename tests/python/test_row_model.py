"""The row model (shmcache.rows, one authority in the extension) and what
rests on it: misses and hits of the same types, every column DataLoader
takes cached or delivered, PIL images, counters that count each id once,
the session from the environment, torchvision-style transforms."""

import uuid
import warnings

import numpy as np
import pytest

import shmcache
from shmcache import CacheWarning, DatasetCache, rows

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from shmcache.torch import CachedDataset  # noqa: E402

Image = pytest.importorskip("PIL.Image")


class Listed(Dataset):
    def __init__(self, samples, root):
        self.samples = samples
        self.root = root

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def test_constants_and_dtypes_come_from_the_extension():
    assert shmcache.MAX_ROW_ID == 2**64 - 17 == rows.MAX_ROW_ID
    assert shmcache.LOCAL_HOSTS == ("127.0.0.1", "localhost", "::1")
    assert (rows.MIN_PORT, rows.MAX_PORT, rows.MAX_NAME_BYTES) == (1025, 65535, 255)
    assert rows.torch_dtype("uint16") == "int32"
    assert rows.torch_dtype("uint64") == "int64"
    assert rows.torch_dtype("bytes") is None
    assert rows.DTYPES["complex64"][:2] == (8, "complex64")


def test_row_kind_and_one_column_order():
    assert rows.row_kind(["#"]) == "value"
    assert rows.row_kind(["#0", "#1"]) == "tuple"
    assert rows.row_kind(["x", "#1"]) == "dict"
    cols = rows.encode((np.arange(3, dtype=np.uint16), 7, b"ab"))
    assert [(n, d) for n, d, _ in cols] == [("#0", "uint16"), ("#1\x1fpy", "int64"),
                                            ("#2", "bytes")]
    back = rows.decode(cols, torch=True)
    assert back[0].dtype == torch.int32 and type(back[1]) is int and back[1] == 7
    assert back[2] == b"ab"


def test_a_miss_and_a_hit_have_the_same_types(server, session):
    sample = {"c": np.arange(4, dtype=np.complex64) * 1j, "u": np.arange(3, dtype=np.uint32),
              "b": torch.ones(2, dtype=torch.bfloat16), "n": 5, "raw": b"xyz"}
    ds = CachedDataset(Listed([sample] * 2, "same-types"), DatasetCache(session),
                       async_puts=False)
    miss, hit = ds[0], ds[0]
    assert ds.stats().hits == 1
    for k in sample:
        assert type(miss[k]) is type(hit[k]), k
        if isinstance(miss[k], torch.Tensor):
            assert miss[k].dtype == hit[k].dtype, k
            assert torch.equal(miss[k], hit[k]), k
    assert hit["c"].dtype == torch.complex64 and hit["u"].dtype == torch.int64


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_copied_hits_own_their_memory_and_free_it(server, session):
    # A copied hit is a tensor over a buffer of its own (dlpack_tensor.h):
    # it outlives the cache, and dropping it frees the buffer.
    row = np.arange(1 << 20, dtype=np.float32)           # 4 MiB
    ds = CachedDataset(Listed([row, np.arange(3, dtype=np.uint16)], "owned"),
                       DatasetCache(session), async_puts=False, copy=True)
    ds[0], ds[1]                                          # cached
    kept = ds[0]
    assert ds.stats().hits == 1
    before = _rss_bytes()
    for _ in range(400):                                  # 1.6 GiB if never freed
        t = ds[0]
        assert t.dtype == torch.float32 and t.shape == (1 << 20,)
    del t
    assert _rss_bytes() - before < (256 << 20)
    widened = ds[1]                                       # uint16 -> int32, copied
    assert widened.dtype == torch.int32 and widened.tolist() == [0, 1, 2]
    kept += 1                                             # writable, private
    ds.cache.close()
    assert torch.equal(kept, torch.from_numpy(row) + 1)
    assert row[5] == 5                                    # the source, unchanged


def test_settings_changed_after_a_hit_apply_to_the_next(server, session):
    # __getitem__'s short path decides once per process; a setting changed
    # afterwards is honoured at once.
    ds = CachedDataset(Listed([np.arange(4, dtype=np.int64)], "settings"),
                       DatasetCache(session), async_puts=False)
    assert ds[0].tolist() == [0, 1, 2, 3] and ds[0].tolist() == [0, 1, 2, 3]
    ds.transform = lambda t: t * 2
    assert ds[0].tolist() == [0, 2, 4, 6]
    ds.transform = None
    ds.copy = False                      # a view of the cache's memory
    view = ds[0]
    ds.copy = True
    copied = ds[0]
    copied += 1
    assert view.tolist() == [0, 1, 2, 3] and copied.tolist() == [1, 2, 3, 4]
    assert ds.stats().hits == 4          # one miss, then hits only
    ds.columns = 0                       # a bare value has no column "#0"
    with pytest.raises(KeyError):
        ds[0]


@pytest.mark.parametrize("sample,cols,has", [
    ((np.zeros(2, np.float32), 7), 5, "positions of a tuple sample"),
    ((np.zeros(2, np.float32), 7), ["nope"], "positions of a tuple sample"),
    ({"img": np.zeros(2, np.float32), "label": 7}, 1, "'img', 'label'"),
    ({"img": np.zeros(2, np.float32), "label": 7}, ["nope"], "'img', 'label'"),
    (np.zeros(2, np.float32), 0, "one value, not columns"),
], ids=["tuple-int", "tuple-name", "dict-int", "dict-name", "value"])
def test_a_column_the_sample_lacks_says_what_it_has_on_a_miss_and_a_hit(
        server, session, sample, cols, has):
    """columns= naming what the dataset's sample does not have: a KeyError
    that lists the sample's columns and what to pass, the same on a miss
    (the sample computed; it said "tuple index out of range" or "5") as on
    a hit (the row read; it said only "row 0 has no column '#5'")."""
    name = f"cols-{uuid.uuid4().hex[:8]}"
    full = CachedDataset(Listed([sample] * 2, name), DatasetCache(session), name=name,
                         async_puts=False)
    full[0]                                # row 0 cached, row 1 not
    ds = CachedDataset(Listed([sample] * 2, name), DatasetCache(session), name=name,
                       columns=cols, async_puts=False)
    for i in (0, 1):
        with pytest.raises(KeyError) as e:
            ds[i]
        said = str(e.value)
        assert has in said and "pass columns=" in said, (i, said)


def _tensors():
    grad = torch.arange(6, dtype=torch.float32).requires_grad_()
    return {
        "uint8": torch.arange(12, dtype=torch.uint8).reshape(3, 4),
        "transposed": torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),
        "sliced": torch.arange(20, dtype=torch.float64)[::3],
        "0-d": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 5, dtype=torch.int16),
        "requires_grad": grad * 2,
        "bfloat16": torch.arange(5, dtype=torch.bfloat16),
        "bool": torch.tensor([True, False, True]),
        "parameter": torch.nn.Parameter(torch.ones(2, 3)),
        "conj": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj(),
        "neg": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128).conj().imag,
    }


@pytest.mark.parametrize("kind", sorted(_tensors()))
def test_every_kind_of_tensor_encodes_as_its_values(kind):
    # Plain CPU tensors take a short path (one numpy() call); the rest
    # (grad, bfloat16, conjugate views, subclasses) the general one: the
    # columns must not tell them apart.
    t = _tensors()[kind]
    for _ in range(2):              # the first tensor imports torch's API
        (name, dtype, a), = rows.encode(t)
        want = t.detach().resolve_conj().resolve_neg().contiguous()
        if want.dtype == torch.bfloat16:
            assert dtype == "bfloat16"
            want_a = want.view(torch.int16).numpy().view(np.uint16)
        else:
            want_a = want.numpy()
            assert dtype == str(want_a.dtype)
        assert name == "#" and a.flags.c_contiguous and a.shape == tuple(t.shape)
        np.testing.assert_array_equal(a, want_a)
        got = rows.decode([(name, dtype, a)], torch=True)
        assert got.dtype == t.dtype and torch.equal(got, want)


def test_complex_columns_are_cached(server, session):
    c = DatasetCache(session)
    z = np.arange(6, dtype=np.complex128).reshape(2, 3) * (1 + 2j)
    assert c.put(1, (z, np.complex64(1j)))
    got = c.get(1)
    np.testing.assert_array_equal(got[0], z)
    assert got[1].dtype == np.complex64 and got[1] == 1j


@pytest.mark.parametrize("sample", [
    {f"f{i}": np.float32(i) for i in range(1100)},          # too many columns
    {"x" * 300: np.zeros(2, np.float32)},                   # name too long
    ("text", np.zeros(2)),                                  # a str: no column type
])
def test_a_sample_the_cache_cannot_hold_is_delivered_with_one_warning(
        server, session, sample):
    ds = CachedDataset(Listed([sample] * 4, f"uncacheable-{len(str(sample))}"),
                       DatasetCache(session), async_puts=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [ds[i] for i in range(4)]
    assert len([x for x in w if x.category is CacheWarning]) == 1, [str(x.message) for x in w]
    assert len(got) == 4 and len(got[0]) == len(sample)
    batch = next(iter(DataLoader(ds, batch_size=2, num_workers=0)))
    assert len(batch) == len(sample)


class HashLabels(Dataset):
    """(float32[3], a Python int outside int64: a 64-bit hash label)."""
    root = "hash-labels"

    def __init__(self, sign):
        self.sign = sign

    def __len__(self):
        return 8

    def __getitem__(self, i):
        label = 2**63 + i if self.sign > 0 else -2**63 - 1 - i
        return np.full(3, i, dtype=np.float32), label


def _as_made(batch):
    """A collate_fn that keeps the samples (default_collate cannot hold
    such an int either)."""
    return batch


@pytest.mark.parametrize("sign", [1, -1])
def test_an_int_outside_int64_is_delivered_as_made_after_one_warning(
        server, session, sign):
    from shmcache.torch import CachedLoader
    src = HashLabels(sign)
    ds = CachedDataset(src, DatasetCache(session), async_puts=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [ds[i] for i in range(8)]
        by_dataloader = [s for b in DataLoader(ds, batch_size=3, collate_fn=_as_made)
                         for s in b]
        by_loader = [s for b in CachedLoader(ds, batch_size=3, collate_fn=_as_made,
                                             num_workers=1) for s in b]
    said = [str(x.message) for x in w if x.category is CacheWarning]
    assert len(said) == 1, said
    assert str(src[0][1]) in said[0] and "outside int64" in said[0], said
    for out in (got, by_dataloader, by_loader):
        assert len(out) == 8
        for i, (x, y) in enumerate(out):
            assert type(y) is int and y == src[i][1]
            assert np.asarray(x).tolist() == [i] * 3
    assert ds.stats()["mem_rows"] == 0


def test_put_of_an_int_outside_int64_raises_a_type_error_naming_it(server, session):
    c = DatasetCache(session)
    with pytest.raises(TypeError, match=str(2**64 - 1)):
        c.put(1, (np.zeros(2), 2**64 - 1))
    with pytest.raises(TypeError, match=r"-9223372036854775809.*outside int64"):
        c.put_batch([2], [-2**63 - 1])
    with pytest.raises(TypeError, match="outside int64"):
        rows.encode({"label": 2**70})
    # In a batch, before any row of it is stored (put_batch's docstring).
    with pytest.raises(TypeError, match="outside int64"):
        c.put_batch([4, 5], [np.zeros(2), 2**64])
    assert c.get(1) is None and c.get(2) is None and c.get(4) is None
    # The ends of int64 are columns as before.
    assert c.put(3, (2**63 - 1, -2**63))
    assert [int(v) for v in c.get(3)] == [2**63 - 1, -2**63]


def test_pil_images_round_trip(server, session):
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (5, 7, 3), np.uint8))
    gray = img.convert("L")
    assert rows.split_name(rows.encode(img)[0][0]) == ("#", "RGB")
    assert rows.split_name("label") == ("label", "")
    c = DatasetCache(session)
    assert c.put(3, (img, 1))
    assert c.put(4, {"img": gray})
    got, label = c.get(3)
    assert isinstance(got, Image.Image) and got.mode == "RGB" and got.size == (7, 5)
    assert np.array_equal(np.asarray(got), np.asarray(img)) and label == 1
    assert c.get(3, columns=0).mode == "RGB"
    assert c.get(4)["img"].mode == "L"
    ds = CachedDataset(Listed([(img, 2)] * 2, "pil"), DatasetCache(session),
                       async_puts=False, transform=np.asarray)
    miss, hit = ds[0], ds[0]
    assert np.array_equal(miss[0], hit[0]) and ds.stats().hits == 1


def test_transform_and_target_transform_the_torchvision_way(server, session):
    samples = [(np.full((2, 2), i, np.float32), i) for i in range(3)]
    ds = CachedDataset(Listed(samples, "tv"), DatasetCache(session),
                       transform=lambda x: x * 2, target_transform=lambda t: t + 100)
    x, t = ds[1]
    assert torch.equal(x, torch.full((2, 2), 2.0)) and int(t) == 101
    whole = CachedDataset(Listed(samples, "tv"), DatasetCache(session),
                          transforms=lambda s: (s[1], s[0]))
    assert int(whole[2][0]) == 2
    with pytest.raises(ValueError):
        CachedDataset(Listed(samples, "tv"), DatasetCache(session),
                      transform=abs, transforms=abs)
    assert ds.flush(60) and whole.flush(60)


def test_session_and_cache_from_the_environment(server, session, monkeypatch):
    monkeypatch.delenv("SESSION_ID", raising=False)
    monkeypatch.setenv("SHMCACHE_SESSION_ID", str(session))
    assert DatasetCache().session_id == session
    ds = CachedDataset(Listed([(np.zeros(2), 0)], "env"))
    assert ds.cache.session_id == session
    monkeypatch.delenv("SHMCACHE_SESSION_ID")
    monkeypatch.setenv("SESSION_ID", str(session))
    assert DatasetCache().session_id == session
    monkeypatch.delenv("SESSION_ID")
    with pytest.raises(ValueError, match="SHMCACHE_SESSION_ID"):
        DatasetCache()


def test_read_into_counts_each_id_once(server, session):
    c = DatasetCache(session)
    for i in range(10, 64):
        assert c.put(i, (np.full(4, i, np.uint16), np.int64(i)))
    before = c.stats()
    out = (torch.zeros(64, 4, dtype=torch.int32), torch.zeros(64, dtype=torch.int64))
    hit = c.read_into(np.arange(64), out)
    after = c.stats()
    assert hit.sum() == 54
    assert after.hits - before.hits == 54
    assert after.misses - before.misses == 10
    assert torch.equal(out[0][20], torch.full((4,), 20, dtype=torch.int32))


def test_full_error_carries_its_reason(start_server):
    server = start_server("--memory_cap_mb", "64")
    c = DatasetCache(server.new_session(), size_mb=1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(64):
            if not c.put(i, np.zeros(64 << 10, np.uint8)):
                break
    msgs = [str(x.message) for x in w if x.category is CacheWarning]
    assert msgs and "is full: its budget of 1 MB is used up" in msgs[0], msgs
    native = c.open().native
    with pytest.raises(shmcache.FullError) as e:
        native.put(10_000, rows.encode(np.zeros(64 << 10, np.uint8)))
    assert e.value.reason == "budget"


def test_full_error_names_the_server_cap_after_the_cache_is_marked_full(start_server):
    """Two caches of 12 MB under a 16 MB cap: the second fills by the cap,
    and every later refusal (decided by the client from the cache's state,
    without asking the server) says so, not the cache's budget."""
    server = start_server("--memory_cap_mb", "16")
    session = server.new_session()
    first = DatasetCache(session, name="first", size_mb=12)
    second = DatasetCache(session, name="second", size_mb=12)

    def fill(cache):
        for i in range(64):
            if not cache.put(i, np.zeros(1 << 20, np.uint8)):
                return i
        pytest.fail("64 MB went into a cache of 12 MB")

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        fill(first)
        assert fill(second) < 8      # the cap, well before its own 12 MB
    for cache, reason in ((first, "budget"), (second, "server_cap")):
        native = cache.open().native
        assert native.is_full()
        with pytest.raises(shmcache.FullError) as e:
            native.put(10_000, rows.encode(np.zeros(64 << 10, np.uint8)))
        assert e.value.reason == reason, e.value


def test_list_sessions_text_and_json_agree_on_zero(server, session):
    c = DatasetCache(session)
    c.put(1, np.zeros(3))
    text = server.admin("--list_sessions").stdout
    line = [ln for ln in text.splitlines() if ln.split()[:1] == [str(session)]][0]
    # Session, cache id, mem rows, disk rows, avg size, numa hits, hits, misses
    assert line.split()[5:8] == ["0", "0", "0"], text   # as --json says
    js = server.sessions()
    cache = [s for s in js if s["session"] == session][0]["caches"][0]
    assert cache["hits"] == 0 and cache["misses"] == 0


def test_a_row_of_more_columns_than_copied_inline_comes_back_whole(server, session):
    # RowBuilder keeps its first few copies inline and the rest in a vector:
    # every column of a wider row is copied, as numpy arrays and as tensors.
    sample = {f"c{i}": np.full((3, i + 1), i, np.int32) for i in range(9)}
    c = DatasetCache(session)
    assert c.put(2, sample)
    for got in (c.get(2), c.open().native.read(2, True, True)):
        assert sorted(got) == sorted(sample)
        for k, v in sample.items():
            np.testing.assert_array_equal(np.asarray(got[k]), v)


def test_python_numbers_come_back_as_the_numbers_they_were():
    """A Python int, float or bool is stored tagged as a number and decodes
    to that Python number as a sample (torch); numpy scalars, 0-d arrays and
    0-d tensors stay tensors; numpy rows keep 0-d arrays."""
    # numpy.float64 and complex128 are Python numbers too (subclasses):
    # still numpy scalars, as default_convert sees them.
    sample = (np.arange(3, dtype=np.uint8), 7, 2.5, True, np.int64(3), np.array(4),
              torch.tensor(5), np.float64(6), np.complex128(7))
    cols = rows.encode(sample)
    tagged = [rows.split_name(n)[1] == rows.NUMBER_TAG for n, _, _ in cols]
    assert tagged == [False, True, True, True, False, False, False, False, False]
    assert [d for _, d, _ in cols][1:4] == ["int64", "float64", "bool"]
    got = rows.decode(cols, torch=True)
    assert [type(v) for v in got[1:4]] == [int, float, bool]
    assert got[1:4] == (7, 2.5, True)
    assert all(isinstance(v, torch.Tensor) and v.shape == () for v in got[4:])
    assert [int(v.real) for v in got[4:]] == [3, 4, 5, 6, 7]
    assert [got[7].dtype, got[8].dtype] == [torch.float64, torch.complex128]
    # numpy rows (DatasetCache.get) keep 0-d arrays for every number.
    got = rows.decode(cols, torch=False)
    assert all(isinstance(v, np.ndarray) and v.shape == () for v in got[1:])
    assert [v.item() for v in got[1:4]] == [7, 2.5, True]
    # A bare number and a dict's number are numbers again too.
    assert rows.decode(rows.encode(9), torch=True) == 9
    assert type(rows.decode(rows.encode({"y": 9}), torch=True)["y"]) is int


def test_cached_samples_keep_the_label_types_default_collate_batches(server, session):
    """CachedDataset gives back an int label as an int and a tensor label as
    a 0-d tensor, on a miss and on a hit; the batches DataLoader collates
    of them are the uncached dataset's."""
    images = np.arange(6 * 4, dtype=np.uint8).reshape(6, 4)
    for label, kind in ((lambda i: i, int), (lambda i: float(i) / 2, float),
                        (lambda i: torch.tensor(i), torch.Tensor),
                        (lambda i: np.int64(i), torch.Tensor)):
        ds = Listed([(images[i], label(i)) for i in range(6)], root=f"labels-{kind}")
        cds = CachedDataset(ds, DatasetCache(session), name=f"labels-{kind.__name__}-"
                            f"{type(label(0)).__name__}", async_puts=False)
        for _ in ("miss", "hit"):
            got = [cds[i] for i in range(6)]
            assert all(type(s[1]) is kind or isinstance(s[1], kind) for s in got)
            if kind is torch.Tensor:
                assert all(s[1].shape == () and s[1].dtype == torch.int64 for s in got)
        assert cds.stats()["hits"] == 6
        want = next(iter(DataLoader(ds, batch_size=6)))
        batch = next(iter(DataLoader(cds, batch_size=6)))
        for a, b in zip(batch, want):
            assert a.dtype == b.dtype and torch.equal(a, b)


# What encode makes of each kind of value, per row format: a change to it
# must raise ROW_FORMAT (row_model.h), which keeps rows stored by another
# version of the package out of this one's caches (the cache identity
# includes it). Add the new format's table here when you raise it.
ENCODED = {
    2: [("img", "uint8", (2, 3)), ("i\x1fpy", "int64", ()), ("f\x1fpy", "float64", ()),
        ("b\x1fpy", "bool", ()), ("i64", "int64", ()), ("f64", "float64", ()),
        ("c128", "complex128", ()), ("f32", "float32", ()), ("a0", "int64", ()),
        ("t", "bfloat16", (2,)), ("t0", "int64", ()), ("raw", "bytes", (2,)),
        ("pil\x1fRGB", "uint8", (2, 2, 3))],
}


def test_a_change_to_what_encode_stores_raises_the_row_format():
    sample = {"img": np.zeros((2, 3), np.uint8), "i": 7, "f": 2.5, "b": True,
              "i64": np.int64(3), "f64": np.float64(0.5), "c128": np.complex128(1j),
              "f32": np.float32(1), "a0": np.array(4),
              "t": torch.ones(2, dtype=torch.bfloat16), "t0": torch.tensor(5),
              "raw": b"ab", "pil": Image.new("RGB", (2, 2))}
    got = [(n, d, a.shape) for n, d, a in rows.encode(sample)]
    assert rows.ROW_FORMAT in ENCODED, "ROW_FORMAT was raised: add its table"
    assert got == ENCODED[rows.ROW_FORMAT], \
        "encode stores a value otherwise: raise kRowFormat (row_model.h)"
