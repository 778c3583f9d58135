"""The one CacheWarning names the real cause: full, no room in the shm
filesystem, or an unreachable server. (A file planted under a cache's name
no longer stops a cache from opening: names are random and a taken one is
skipped; tests/reliability/planted_files_test.cc covers it.)"""

import warnings

import numpy as np
import pytest

from shmcache import CacheWarning, DatasetCache

MB = np.zeros(1 << 20, dtype=np.uint8)


def cache_warnings(record):
    return [str(x.message) for x in record if issubclass(x.category, CacheWarning)]


def test_server_memory_cap_used_up_at_open_is_named(start_server):
    s = start_server("--memory_cap_mb", "16")
    sid = s.new_session()
    first, second = DatasetCache(sid, name="a"), DatasetCache(sid, name="b")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        stored = [first.put(i, MB) for i in range(32)]
        assert stored[0] and not stored[-1]
        assert second.put(0, MB) is False       # no room for another cache
    msgs = cache_warnings(w)
    assert len(msgs) == 2, msgs
    # Said once, with the library's numbers and the fix.
    assert msgs[0].startswith("shmcache: cache ") and msgs[0].count("full") == 1, msgs[0]
    assert "is full: its budget of 16 MB is used up" in msgs[0] and "size_mb" in msgs[0]
    assert "cached rows are still served" in msgs[0]
    assert msgs[1].startswith("shmcache: the cache server's memory cap is used up (")
    assert "unreachable" not in msgs[1] and "bypassed" in msgs[1]
    assert first.get(0) is not None


def test_a_size_over_the_server_cap_is_compared_in_mb(start_server):
    s = start_server("--memory_cap_mb", "64")
    sid = s.new_session()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        DatasetCache(sid, size_mb=32, name="fits").open()
        big = DatasetCache(sid, size_mb=1000, name="big").open()
    msgs = cache_warnings(w)
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("shmcache: cache size 1000 MB is more than the 64 MB "
                              "the server can have (memory_cap_mb: "), msgs[0]
    assert "--memory_cap_mb" in msgs[0]
    assert big.size_mb == 1000 and not big.bypassed


def test_size_is_a_deprecated_name_of_size_mb(start_server):
    s = start_server("--memory_cap_mb", "64")
    sid = s.new_session()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = DatasetCache(sid, size=1000, name="old").open()   # MindSpore's keyword
    (dep,) = [str(x.message) for x in w if x.category is DeprecationWarning]
    assert "size_mb=" in dep and "MB" in dep
    assert [m.split(" is more")[0] for m in cache_warnings(w)] == \
        ["shmcache: cache size 1000 MB"]
    assert c.size_mb == c.size == 1000
    with pytest.raises(TypeError, match="size_mb"):
        DatasetCache(sid, size_mb=8, size=8)


@pytest.fixture
def small_tmpfs(small_tmpfs_of):
    return small_tmpfs_of("24m")


def test_full_shm_filesystem_is_named_not_cache_full(start_server, small_tmpfs):
    s = start_server("--shm_dir", str(small_tmpfs))
    c = DatasetCache(s.new_session())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        stored = [c.put(i, MB) for i in range(48)]   # 48 MB into 24 MB
    assert stored[0] and not stored[-1]
    (msg,) = cache_warnings(w)
    assert msg.startswith("shmcache: no room left in the shared-memory filesystem ("), msg
    assert str(small_tmpfs) in msg and "cache is full" not in msg
    assert c.get(0) is not None


def test_unreachable_server_is_named(server, session):
    server.kill()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert DatasetCache(session).get(1) is None
    (msg,) = cache_warnings(w)
    assert msg.startswith("shmcache: the cache server is unreachable ("), msg
