"""shmcache.torch.CachedDataset under DataLoader, samplers and failures."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from helpers import Images, Normalize, RandomFlip, sample  # noqa: E402
from shmcache import CacheWarning, DatasetCache  # noqa: E402
from shmcache.shards import shard_indices  # noqa: E402
from shmcache.torch import CachedDataset  # noqa: E402


def epoch(loader):
    imgs, labels = [], []
    for img, label in loader:
        imgs.append(img)
        labels.append(label)
    return torch.cat(imgs), torch.cat(labels)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_dataloader_two_workers_second_epoch_all_hits(server, session, start_method):
    n = 96
    ds = CachedDataset(Images(n, transform=Normalize(1 / 255)), DatasetCache(session))
    loader = DataLoader(ds, batch_size=8, num_workers=2,
                        multiprocessing_context=start_method)
    imgs1, labels1 = epoch(loader)
    st1 = ds.stats()
    assert st1["mem_rows"] == n
    assert st1["misses"] == n and st1["hits"] == 0
    imgs2, labels2 = epoch(loader)
    st2 = ds.stats()
    assert st2["hits"] - st1["hits"] == n      # every sample a hit
    assert st2["misses"] == st1["misses"]
    assert st2["mem_rows"] == n
    assert torch.equal(imgs1, imgs2) and torch.equal(labels1, labels2)
    want = torch.stack([torch.from_numpy(sample(i)[0].astype(np.float32) / 255)
                        for i in range(n)])
    assert torch.allclose(imgs1, want) and labels1.tolist() == [i % 10 for i in range(n)]


def test_hit_and_miss_return_the_same_types(server, session):
    ds = CachedDataset(Images(4), DatasetCache(session))
    miss = ds[2]
    assert ds.flush(60)   # the background put is done
    hit = ds[2]
    assert type(miss) is tuple and type(hit) is tuple
    a, b = miss[0], hit[0]
    assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    # The int label stays the int the dataset gave.
    assert type(miss[1]) is int and type(hit[1]) is int and miss[1] == hit[1]
    assert ds.stats()["hits"] == 1


class _ListSamples:
    """Samples as lists holding a str (a file name): no column type, so
    never cached."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return [np.full(3, i, dtype=np.float32), f"file-{i}"]


def test_an_uncacheable_sample_goes_out_of_a_batch_as_the_dataset_made_it(server, session):
    """Without a transform, a batch's uncacheable sample (DataLoader's
    __getitems__) is the dataset's own, as ds[i] and plain DataLoader give
    it: a list stays a list (it came out a tuple)."""
    src = _ListSamples()
    ds = CachedDataset(src, DatasetCache(session), name="lists")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)   # cannot be cached: said once
        batch = ds.__getitems__([2, 0])
        one = ds[1]
    for got, i in zip(batch + [one], [2, 0, 1]):
        assert type(got) is list, type(got)
        assert np.array_equal(got[0], src[i][0]) and got[1] == f"file-{i}"
    assert ds.stats()["hits"] == 0


def test_distributed_sampler_shards_share_one_copy(server, session):
    n, world = 50, 3
    cache = DatasetCache(session)
    seen = []
    for rank in range(world):
        ds = CachedDataset(Images(n), cache)
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                     seed=7)
        sampler.set_epoch(3)
        idx = list(sampler)
        assert idx == shard_indices(n, world, rank, shuffle=True, seed=7, epoch=3)
        for img, label in DataLoader(ds, batch_size=5, sampler=sampler):
            seen.extend(label.tolist())
        assert ds.flush(60)
    assert len(seen) == 51   # padded to a multiple of 3, as DistributedSampler does
    assert ds.stats()["mem_rows"] == n


def test_shard_indices_match_distributed_sampler():
    for n in (0, 1, 7, 10, 33):
        for world in (1, 2, 4):
            for drop_last in (False, True):
                for shuffle in (False, True):
                    for rank in range(world):
                        s = DistributedSampler(range(n), num_replicas=world, rank=rank,
                                               shuffle=shuffle, drop_last=drop_last,
                                               seed=1)
                        s.set_epoch(2)
                        assert list(s) == shard_indices(n, world, rank, shuffle, 1, 2,
                                                        drop_last)


def test_random_transform_refused_unless_placed_after_the_cache(server, session):
    cache = DatasetCache(session)
    with pytest.raises(ValueError, match="random"):
        CachedDataset(Images(8, transform=RandomFlip()), cache)
    CachedDataset(Images(8, transform=RandomFlip()), cache, allow_random=True)
    # The random part runs after the cache, on every access.
    calls = []
    ds = CachedDataset(Images(8), cache, transform=lambda s: calls.append(1) or s)
    ds[1], ds.flush(60), ds[1]
    assert len(calls) == 2 and ds.stats()["hits"] == 1


def test_an_allow_random_or_transform_of_the_wrong_type_is_refused_when_made(
        server, session):
    """allow_random="False" (a config file's string) is truthy: taken, it
    turned the random-transform guard off. A transform that cannot be
    called failed at the first sample, as "'int' object is not callable"."""
    cache = DatasetCache(session)
    for bad in ("False", None, 0):
        with pytest.raises(TypeError, match="allow_random must be True or False"):
            CachedDataset(Images(8, transform=RandomFlip()), cache, allow_random=bad)
    for arg in ("transform", "target_transform", "transforms"):
        with pytest.raises(TypeError, match=f"{arg} must be callable"):
            CachedDataset(Images(8), cache, **{arg: 5})


def test_empty_column_selection_is_refused_at_construction(server, session):
    with pytest.raises(ValueError, match="no column"):
        CachedDataset(Images(8), DatasetCache(session), columns=[])
    ds = CachedDataset(Images(8), DatasetCache(session), columns=[1])
    assert [int(x) for x in ds[3]] == [3] == [int(x) for x in ds[3]]   # miss, hit
    assert ds.flush(60)


def test_what_is_no_dataset_is_refused_by_name(server, session):
    """A value that is no dataset at all (neither indexed nor iterated):
    once "'int' object is not iterable" from deep in the cache naming."""
    for not_a_dataset in (42, None, 3.5):
        with pytest.raises(TypeError, match=r"CachedDataset wraps a map-style dataset "
                                            r"\(dataset\[i\], len\(dataset\)\); got "
                                            + type(not_a_dataset).__name__):
            CachedDataset(not_a_dataset, DatasetCache(session))
    ds = CachedDataset([(1, 2), (3, 4)], DatasetCache(session))
    assert ds[1] == (3, 4)
    assert ds.flush(60)


def test_different_pipelines_get_different_caches(server, session):
    cache = DatasetCache(session)
    a = CachedDataset(Images(8, transform=Normalize(1.0)), cache)
    b = CachedDataset(Images(8, transform=Normalize(2.0)), cache)
    assert a.cache.name != b.cache.name
    a[0]
    assert b[0][0].max() > a[0][0].max()
    with pytest.raises(RuntimeError, match="different pipeline"):
        CachedDataset(Images(8, transform=Normalize(3.0)), cache, name=a.cache.name)
    assert a.flush(60) and b.flush(60)


def test_a_name_given_to_the_cache_names_the_datasets_cache(server, session):
    """CachedDataset(ds, DatasetCache(name="mnist")) caches in "mnist", as
    CachedDataset(ds, name="mnist") does: the name was dropped for the
    fingerprint's, silently, and the rows went to a cache the user never
    named (`shmcache --list_sessions` showed no "mnist")."""
    ds = CachedDataset(Images(8), DatasetCache(session, name="mnist"))
    assert ds.cache.name == "mnist"
    ds[3]
    assert ds.flush(60)
    assert ds.stats().name == "mnist" and ds.stats().mem_rows == 1
    # The same name given twice is one name; two names are refused, with both.
    assert CachedDataset(Images(8), DatasetCache(session, name="mnist"),
                         name="mnist").cache.name == "mnist"
    with pytest.raises(ValueError, match="name='val'.*'mnist'"):
        CachedDataset(Images(8), DatasetCache(session, name="mnist"), name="val")
    # A later assignment takes the name as the constructor does.
    other = server.new_session()
    ds.cache = DatasetCache(other, name="mnist-2")
    assert ds.cache.name == "mnist-2" and ds.cache.session_id == other
    # A cache the package named for another dataset is renamed for this one,
    # as before: its name is that dataset's, not the user's.
    b = CachedDataset(Images(9), ds.cache)
    assert b.cache.name.startswith("fp-") and b.cache.session_id == other


def test_daemon_killed_mid_epoch_finishes_from_source_with_one_warning(server, session):
    n = 1000   # 12 KB rows: several 4 MB chunks, so puts need the daemon again
    ds = CachedDataset(Images(n, side=64), DatasetCache(session))
    labels = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(n):
            if i == 100:
                server.kill()
            img, label = ds[i]
            assert img.shape == (3, 64, 64)
            labels.append(int(label))
        # A second epoch after the crash: hits still served from memory.
        for i in range(n):
            assert int(ds[i][1]) == i % 10
    assert labels == [i % 10 for i in range(n)]
    cw = [x for x in w if issubclass(x.category, CacheWarning)]
    assert len(cw) == 1, [str(x.message) for x in cw]
    assert "gone" in str(cw[0].message) or "unreachable" in str(cw[0].message)
