"""The default cache name tells datasets apart by what they hold
(shmcache.torch.dataset_identity): two datasets of one class and length but other
contents never share a cache, the same data opened twice does, and a
dataset whose contents cannot be told gets no cache (CachedDataset: rows
from the source after one CacheWarning naming the fix, name=;
cache_for_dataset and prefill: refused with it)."""

import hashlib
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import (DataLoader, Dataset, IterableDataset, Subset,  # noqa: E402
                              TensorDataset)

from helpers import Images, RandomFlip, sample  # noqa: E402
from shmcache import CacheWarning, DatasetCache, FingerprintMismatchError  # noqa: E402
from shmcache.rows import NUMBER_TAG  # noqa: E402
from shmcache.torch import (CachedDataset, CachedIterableDataset,  # noqa: E402
                            CachedLoader, cache_for_dataset, dataset_fingerprint)
from shmcache.torch.dataset_identity import content_identity  # noqa: E402


def name_of(ds, session, **kw):
    return cache_for_dataset(ds, DatasetCache(session), **kw).name


def test_equal_length_tensor_datasets_of_other_values_do_not_share(server, session):
    # The reported case: train cached first, then val of the same shape.
    train = TensorDataset(torch.ones(100, 4), torch.zeros(100, dtype=torch.int64))
    val = TensorDataset(torch.full((100, 4), 7.0), torch.zeros(100, dtype=torch.int64))
    a = CachedDataset(train, DatasetCache(session), async_puts=False)
    for i in range(100):
        a[i]
    b = CachedDataset(val, DatasetCache(session), async_puts=False)
    assert a.cache.name != b.cache.name
    x, _ = b[3]
    assert x.tolist() == [7.0] * 4
    assert b.stats()["hits"] == 0


def test_a_difference_in_one_sampled_row_is_enough(session):
    x = torch.arange(400, dtype=torch.float32).reshape(100, 4)
    y = x.clone()
    y[99, 2] = -1.0     # the last row is always one of the samples
    assert name_of(TensorDataset(x), session) != name_of(TensorDataset(y), session)


@pytest.mark.parametrize("other", ["float64", "int32", "shape", "label dtype"])
def test_equal_values_in_other_dtypes_or_shapes_do_not_share(server, session, other):
    base = TensorDataset(torch.ones(50, 4, dtype=torch.float32), torch.arange(50))
    changed = {
        "float64": lambda: TensorDataset(torch.ones(50, 4, dtype=torch.float64),
                                         torch.arange(50)),
        "int32": lambda: TensorDataset(torch.ones(50, 4, dtype=torch.int32),
                                       torch.arange(50)),
        "shape": lambda: TensorDataset(torch.ones(50, 2, 2, dtype=torch.float32),
                                       torch.arange(50)),
        "label dtype": lambda: TensorDataset(torch.ones(50, 4, dtype=torch.float32),
                                             torch.arange(50, dtype=torch.int32)),
    }[other]()
    first = CachedDataset(base, DatasetCache(session), async_puts=False)
    loader = DataLoader(first, batch_size=10)
    for _ in loader:
        pass
    second = CachedDataset(changed, DatasetCache(session), async_puts=False)
    assert first.cache.name != second.cache.name
    got = next(iter(DataLoader(second, batch_size=10)))
    want = next(iter(DataLoader(changed, batch_size=10)))
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_same_data_opened_twice_shares_one_cache(server, session):
    a = CachedDataset(Images(40), DatasetCache(session), async_puts=False)
    for i in range(40):
        a[i]
    # Another object, equal contents: the same cache, all hits.
    b = CachedDataset(Images(40), DatasetCache(session), async_puts=False)
    assert b.cache.name == a.cache.name
    before = b.stats()["hits"]
    for i in range(40):
        b[i]
    assert b.stats()["hits"] - before == 40
    t1 = TensorDataset(torch.arange(80.0).reshape(20, 4))
    t2 = TensorDataset(torch.arange(80.0).reshape(20, 4))
    assert name_of(t1, session) == name_of(t2, session)
    (cache,) = [c for c in server.cache_rows(session).values()]
    assert cache["mem_cached"] == 40


def _folder(root, n, seed):
    from PIL import Image
    for k in range(n):
        d = root / ("cat", "dog")[k % 2]
        d.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed * 1000 + k)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(d / f"{k}.png")


def _yesterday(root):
    """Dates every file a day back: the files of an earlier run."""
    day = time.time() - 86400
    for dirpath, _, names in os.walk(root):
        for name in names:
            os.utime(os.path.join(dirpath, name), (day, day))


def test_an_image_folder_changed_between_runs_gets_another_cache(server, session, tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    root = tmp_path / "images"
    _folder(root, 6, seed=1)
    _yesterday(root)
    first = CachedDataset(datasets.ImageFolder(str(root)), DatasetCache(session),
                          async_puts=False)
    old = [np.asarray(first[i][0]) for i in range(6)]
    # The next run: same root, same count; one image written again.
    from PIL import Image
    changed = root / "dog" / "3.png"
    Image.fromarray(np.full((8, 8, 3), 9, dtype=np.uint8)).save(changed)
    folder = datasets.ImageFolder(str(root))
    assert len(folder) == 6
    second = CachedDataset(folder, DatasetCache(session), async_puts=False)
    assert second.cache.name != first.cache.name
    (k,) = [k for k, (p, _) in enumerate(folder.samples) if p == str(changed)]
    assert np.asarray(second[k][0]).tolist() == np.full((8, 8, 3), 9).tolist()
    for i in range(6):
        if i != k:
            assert np.array_equal(np.asarray(second[i][0]), old[i])
    # Unchanged since: the same cache again.
    again = CachedDataset(datasets.ImageFolder(str(root)), DatasetCache(session))
    assert again.cache.name == second.cache.name
    # Every image written again (a regenerated set): another cache.
    _folder(root, 6, seed=2)
    assert name_of(datasets.ImageFolder(str(root)), session) not in (
        first.cache.name, second.cache.name)


def test_files_are_stat_ed_not_read(tmp_path):
    from shmcache.torch.dataset_identity import content_identity
    datasets = pytest.importorskip("torchvision.datasets")
    _folder(tmp_path / "images", 4, seed=1)

    class Unreadable(datasets.ImageFolder):
        def __getitem__(self, i):
            raise AssertionError("the identity of a file list reads no sample")

    assert content_identity(Unreadable(str(tmp_path / "images"))).startswith("files:")
    # Through a Subset too.
    sub = Subset(Unreadable(str(tmp_path / "images")), [0, 2])
    assert content_identity(sub).startswith("files:")


class Listing(Dataset):
    """A dataset that lists its files (`files`), one row per file."""

    def __init__(self, root):
        self.root = str(root)
        self.files = sorted(str(p) for p in root.iterdir())

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return np.frombuffer(open(self.files[i], "rb").read(), dtype=np.uint8)


def test_a_change_to_any_one_of_many_files_is_seen(tmp_path):
    from shmcache.torch.dataset_identity import content_identity
    root = tmp_path / "many"
    root.mkdir()
    for k in range(3000):           # stat'ed by several threads
        (root / f"{k:05d}.bin").write_bytes(b"%d" % k)
    _yesterday(root)
    before = content_identity(Listing(root))
    assert before == content_identity(Listing(root))
    (root / "02345.bin").write_bytes(b"changed")      # a late thread's share
    after = content_identity(Listing(root))
    assert after != before
    listed = Listing(root)
    os.unlink(root / "01000.bin")   # listed, but gone since
    assert content_identity(listed) != after


class Tagged(Dataset):
    """A list of samples that start with a str: no file list."""
    root = "tagged"

    def __init__(self, value):
        self.samples = [("text", np.full(2, value))] * 5

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def test_a_list_of_samples_starting_with_a_str_is_hashed_as_samples(session):
    assert name_of(Tagged(1), session) != name_of(Tagged(2), session)
    assert name_of(Tagged(1), session) == name_of(Tagged(1), session)


class Noise(Dataset):
    """Samples from the OS's entropy: no two reads alike."""
    root = "noise"

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return np.frombuffer(os.urandom(16), dtype=np.uint8)


class Broken(Dataset):
    root = "broken"

    def __len__(self):
        return 10

    def __getitem__(self, i):
        raise KeyError(f"no row {i} in this process")


@pytest.mark.parametrize("ds,why", [
    (Noise(), "differs between two reads"),
    (Broken(), "KeyError"),
    ((x for x in range(3)), "one-shot iterator"),
])
def test_a_dataset_whose_contents_cannot_be_told_needs_a_name(session, ds, why):
    with pytest.raises(ValueError, match="pass name=") as e:
        cache_for_dataset(ds, DatasetCache(session))
    assert why in str(e.value)
    # With a name nothing is read.
    assert cache_for_dataset(ds, DatasetCache(session), name="mine").name == "mine"


class CorruptFirst(Dataset):
    """Row 0 is corrupt (raises), as a bad file among good ones."""
    root = "corrupt-first"

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 0:
            raise KeyError("row 0 is corrupt")
        return np.full(4, i, dtype=np.float32)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_whose_contents_cannot_be_told_is_read_from_the_source(
        server, session, num_workers):
    with pytest.warns(CacheWarning) as caught:
        cds = CachedDataset(CorruptFirst(), DatasetCache(session))
    assert len(caught) == 1
    assert "pass name=" in str(caught[0].message) and "KeyError" in str(caught[0].message)
    assert cds.cache.bypassed and cds.stats() is None
    # As DataLoader: the batch with the corrupt row raises, the epoch goes on.
    got, errors = [], 0
    it = iter(CachedLoader(cds, batch_size=3, num_workers=num_workers))
    while True:
        try:
            got.append(next(it))
        except StopIteration:
            break
        except KeyError:
            errors += 1
    assert errors == 1
    assert torch.cat(got)[:, 0].tolist() == list(range(3, 10))
    # Nothing went into the session under the name it would have had.
    probe = DatasetCache(session).named(cds.cache.name, cds.cache.fingerprint).open()
    st = probe.stats()
    assert st.mem_rows == 0 and st.disk_rows == 0


def test_random_augmentation_inside_the_dataset_names_one_cache(session):
    # Seeded per sample while the identity is taken: every process agrees.
    a = name_of(Images(30, transform=RandomFlip()), session, allow_random=True)
    np.random.seed(123)
    torch.manual_seed(5)
    b = name_of(Images(30, transform=RandomFlip()), session, allow_random=True)
    assert a == b
    # ...and the caller's random streams are left as they were.
    np.random.seed(7)
    want = np.random.rand()
    np.random.seed(7)
    name_of(Images(30, transform=RandomFlip()), session, allow_random=True)
    assert np.random.rand() == want


def test_only_a_few_samples_are_read(session):
    from shmcache.torch.dataset_identity import SAMPLES

    class Counted(Images):
        def __getitem__(self, i):
            self.read.append(i)
            return super().__getitem__(i)

    ds = Counted(1000)
    ds.read = []
    name_of(ds, session)
    assert len(ds.read) == SAMPLES + 1
    assert 0 in ds.read and 999 in ds.read


class Offset(IterableDataset):
    """A stream of sample(i, 8) images plus `offset`."""
    path = "offset-stream"

    def __init__(self, n, offset):
        self.n, self.offset = n, offset

    def __iter__(self):
        for i in range(self.n):
            img, label = sample(i, 8)
            yield {"image": img + self.offset, "label": label}


def test_streams_of_other_contents_do_not_share(server, session):
    a = CachedIterableDataset(Offset(20, 0), DatasetCache(session))
    assert len(list(a)) == 20 and a.sealed_count() == 20
    b = CachedIterableDataset(Offset(20, 1), DatasetCache(session))
    assert b.cache.name != a.cache.name
    first = next(iter(b))
    assert np.array_equal(np.asarray(first["image"]), sample(0, 8)[0] + 1)
    assert CachedIterableDataset(Offset(20, 0), DatasetCache(session)).cache.name \
        == a.cache.name


class Halves(Dataset):
    """(numpy.float64, int) samples: a numpy.float64 was stored as a Python
    float by row format 1 (shmcache before 6caecb3), as a numpy scalar
    since."""
    root = "halves"

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.float64(i / 2), i


def format_1_cache(ds, session, name=None):
    """The cache that a shmcache of row format 1 opened for CachedDataset(ds,
    name=name): named and fingerprinted as that version did (a row format
    was no part of it), holding the rows it stored for Halves (both fields
    tagged as Python numbers)."""
    desc = dataset_fingerprint(ds)
    if name is None:
        desc += "|content=" + content_identity(ds)
    fp = "fp-" + hashlib.sha256(desc.encode()).hexdigest()[:40]
    old = DatasetCache(session).named(name or fp, fp).open()
    for i in range(0, len(ds), 2):   # half of them: its batches would mix
        assert old.put_columns(i, [(f"#0\x1f{NUMBER_TAG}", "float64", np.array(i / 2)),
                                   (f"#1\x1f{NUMBER_TAG}", "int64", np.array(i))])
    return old


@pytest.mark.parametrize("batch_size", [None, 4])
def test_rows_of_another_row_format_are_never_read(server, session, batch_size):
    """Rows that an older shmcache stored in another row format (the spill
    database survives restarts; two package versions share a daemon) are
    not this version's hits: batches come out as DataLoader's, not with a
    Python float in some rows and a 0-d tensor in others."""
    format_1_cache(Halves(), session)
    want = list(DataLoader(Halves(), batch_size=batch_size))
    cds = CachedDataset(Halves(), DatasetCache(session), async_puts=False)
    for loader in (DataLoader, CachedLoader):
        got = list(loader(cds, batch_size=batch_size))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert type(a[0]) is type(b[0]) and a[0].dtype == b[0].dtype
            assert torch.equal(a[0], b[0])
            assert type(a[1]) is type(b[1]) and torch.equal(torch.as_tensor(a[1]),
                                                             torch.as_tensor(b[1]))
    st = cds.stats()
    assert (st.hits, st.misses) == (8, 8)   # the second pass read the first's


def test_a_named_cache_of_another_row_format_is_another_cache(server, session):
    """name= keeps the user's name; a cache of that name filled in another
    row format is refused as another pipeline's is, saying so and what to do."""
    format_1_cache(Halves(), session, name="halves")
    with pytest.raises(FingerprintMismatchError) as e:
        CachedDataset(Halves(), DatasetCache(session), name="halves")
    assert "row format" in str(e.value) and "name=" in str(e.value)
    assert f"shmcache -d {session}" in str(e.value)
    cds = CachedDataset(Halves(), DatasetCache(session), name="halves-2",
                        async_puts=False)
    assert cds.cache.name == "halves-2"
    assert [type(v) for v in cds[2]] == [torch.Tensor, int]
