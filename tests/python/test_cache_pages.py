"""The cache's pages registered with CUDA (CachedLoader's
register_cache_pages, shmcache/torch/_cache_pages.py): the registration
bookkeeping over real shared memory, with the register / unregister calls
recorded instead of made (what is registered, once, released on close, in
a forked child and at exit), the device gather with its copy made on the
host, and, where CUDA is, the loader's batches from registered pages."""

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from shmcache import DatasetCache

torch = pytest.importorskip("torch")
from shmcache.torch import CachedDataset, CachedLoader  # noqa: E402
from shmcache.torch._cache_pages import (DIRECT_MIN_BYTES, CachePages,  # noqa: E402
                                         DeviceGather, mapping_of)

ROW = 150 * 1024
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA is not available (torch.cuda.is_available() "
                                       "is False): registering pages needs a CUDA device")


class Calls:
    """register / unregister that record their calls."""

    def __init__(self, refuse=None):
        self.registered, self.unregistered = [], []
        self.refuse = refuse

    def register(self, start, length):
        if self.refuse:
            raise RuntimeError(self.refuse)
        self.registered.append((start, length))

    def unregister(self, start):
        self.unregistered.append(start)


def _filled(session, n, size=ROW):
    """A cache of n rows of `size` uint8 bytes (row i filled with i % 251)
    and an int64 label, and their zero-copy views."""
    cache = DatasetCache(session, name=f"pages-{n}-{size}")
    for i in range(n):
        assert cache.put(i, (np.full(size, i % 251, np.uint8), np.int64(i)))
    views = cache.get_batch_columns(list(range(n)), copy=False)
    assert all(v is not None for v in views)
    return cache, views


def _addr(a):
    return a.__array_interface__["data"][0]


def _segment_of(addr):
    lo, hi, path = mapping_of(addr)
    assert ".seg." in os.path.basename(path), path
    return lo, hi - lo


def test_each_segment_a_row_lies_in_is_registered_once_when_first_used(server, session):
    _, views = _filled(session, 100)     # 15 MB of rows: several 4 MB+ segments
    calls = Calls()
    pages = CachePages(calls.register, calls.unregister)
    first = views[0][0][2]
    assert pages.ensure(_addr(first), first.nbytes, first)
    assert calls.registered == [_segment_of(_addr(first))]
    want = set()
    for v in views:
        a = v[0][2]
        assert pages.ensure(_addr(a), a.nbytes, a)
        want.add(_segment_of(_addr(a)))
        want.add(_segment_of(_addr(a) + a.nbytes - 1))
    assert len(want) > 1, "the rows should span several segments"
    # Segments met later were registered when first used, each once.
    assert sorted(calls.registered) == sorted(want)
    assert pages.registered() == sorted(want)
    pages.close()
    assert sorted(calls.unregistered) == sorted(s for s, _ in want)
    assert pages.registered() == []
    assert not pages.ensure(_addr(first), first.nbytes, first)   # closed
    pages.close()                                                 # idempotent
    assert len(calls.unregistered) == len(want)


def test_memory_outside_the_cache_segments_is_never_registered(server, session):
    _, views = _filled(session, 2)
    calls = Calls()
    pages = CachePages(calls.register, calls.unregister)
    heap = np.ones(ROW, np.uint8)
    assert not pages.ensure(_addr(heap), heap.nbytes, heap)
    copied = DatasetCache(session, name="pages-2-153600").get_batch_columns([0])[0][0][2]
    assert not pages.ensure(_addr(copied), copied.nbytes, copied)   # a private copy
    assert calls.registered == []
    a = views[1][0][2]
    assert pages.ensure(_addr(a), a.nbytes, a)
    assert len(calls.registered) == 1


def test_a_refused_registration_stops_registering_and_says_why(server, session):
    _, views = _filled(session, 2)
    calls = Calls(refuse="cudaHostRegister failed: out of memory")
    pages = CachePages(calls.register, calls.unregister)
    a = views[0][0][2]
    assert not pages.ensure(_addr(a), a.nbytes, a)
    assert "out of memory" in pages.failed
    assert pages.registered() == []
    calls.refuse = None
    assert not pages.ensure(_addr(a), a.nbytes, a)   # no second try
    pages.close()
    assert calls.unregistered == []


def test_a_forked_child_owns_no_registration_and_the_parent_keeps_its_own(server, session):
    _, views = _filled(session, 30)
    calls = Calls()
    pages = CachePages(calls.register, calls.unregister)
    for v in views:
        a = v[0][2]
        assert pages.ensure(_addr(a), a.nbytes, a)
    mine = pages.registered()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report what it believes it owns, then leave
        try:
            a = views[0][0][2]
            seen = (pages.registered(), pages.ensure(_addr(a), a.nbytes, a))
            pages.close()
            os.write(w, repr((seen, calls.registered[len(mine):],
                              calls.unregistered)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert child == repr((([], False), [], []))
    assert pages.registered() == mine
    pages.close()
    assert sorted(calls.unregistered) == sorted(s for s, _ in mine)


def test_registrations_are_released_at_exit(server, session, tmp_path):
    log = tmp_path / "calls"
    script = textwrap.dedent(f"""
        import numpy as np
        from shmcache import DatasetCache
        from shmcache.torch._cache_pages import CachePages
        log = open({str(log)!r}, "a", buffering=1)
        cache = DatasetCache({session})
        cache.put(0, np.full({ROW}, 7, np.uint8))
        a = cache.get_batch_columns([0], copy=False)[0][0][2]
        pages = CachePages(lambda s, n: log.write(f"register {{s}}\\n"),
                           lambda s: log.write(f"unregister {{s}}\\n"))
        assert pages.ensure(a.__array_interface__["data"][0], a.nbytes, a)
        # no close(): the exit hook releases it
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120,
                   env=dict(os.environ))
    lines = log.read_text().split()
    assert lines[0::2] == ["register", "unregister"]
    assert lines[1] == lines[3]


def test_the_gather_copies_each_row_into_its_place_from_the_cache_pages(server, session):
    n = 12
    _, views = _filled(session, n, size=3 * DIRECT_MIN_BYTES)
    calls = Calls()
    copies = []

    def copy(dst, src, nbytes, stream):
        copies.append((src, nbytes))
        ctypes.memmove(dst, src, nbytes)
    gather = DeviceGather(CachePages(calls.register, calls.unregister), copy=copy,
                          done=lambda event: True)
    order = [5, 0, 11, 3, 3, 7, 1, 2, 10, 9, 4, 6]
    rows = [views[i] for i in order]
    row_bytes = [3 * DIRECT_MIN_BYTES, 8]
    addrs = gather.sources(rows, row_bytes)
    assert addrs is not None
    dsts = [torch.empty(n, 3 * DIRECT_MIN_BYTES, dtype=torch.uint8),
            torch.empty(n, dtype=torch.int64)]

    class Event:
        recorded = False

        def record(self, stream):
            self.recorded = True
    event = Event()
    gather.gather(rows, row_bytes, dsts, addrs, None, 0, event)
    assert event.recorded
    for p, i in enumerate(order):
        assert torch.equal(dsts[0][p], torch.full((3 * DIRECT_MIN_BYTES,), i % 251,
                                                  dtype=torch.uint8))
        assert int(dsts[1][p]) == i
    # The big column straight from the cache's bytes, one copy per row; the
    # 8-byte labels through the host.
    assert copies == [(_addr(views[i][0][2]), 3 * DIRECT_MIN_BYTES) for i in order]
    assert calls.registered


def test_a_row_outside_registered_pages_sends_the_batch_to_the_staging_copy(server, session):
    _, views = _filled(session, 4)
    gather = DeviceGather(CachePages(Calls().register, Calls().unregister),
                          copy=lambda *a: None, done=lambda e: True)
    heap = [("#0", "uint8", np.ones(ROW, np.uint8)), ("#1", "int64", np.zeros((), np.int64))]
    assert gather.sources(views[:2] + [heap], [ROW, 8]) is None


def test_the_loader_copies_whole_batches_from_registered_pages(server, session, monkeypatch):
    # CachedLoader's own path with CUDA's calls made on the host: the
    # device is the CPU, a copy is a memmove, streams and events do nothing.
    import contextlib

    import shmcache.torch._assemble as assemble

    class Event:
        def record(self, stream=None):
            pass

    class Stage:
        device = torch.device("cpu")

        class stream:   # noqa: N801 -- torch.cuda.Stream's attribute
            cuda_stream = 0

        def finish(self, staged):
            return staged[0]
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", Event)

    class Rows:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.full((2 * DIRECT_MIN_BYTES,), i % 251, dtype=torch.uint8), i

        def __repr__(self):
            return "Rows(64)"
    cds = CachedDataset(Rows(), DatasetCache(session), async_puts=False)
    loader = CachedLoader(cds, batch_size=16, shuffle=True)
    for _ in loader:
        pass
    calls, copies = Calls(), []
    loader._state.pages = CachePages(calls.register, calls.unregister)
    made = assemble.BatchAssembler.__init__

    def on_host(self, *args):
        made(self, *args)
        self.stage = Stage()

        def copy(dst, src, nbytes, stream):
            copies.append(nbytes)
            ctypes.memmove(dst, src, nbytes)
        self.gather = DeviceGather(self.state.pages, copy=copy, done=lambda e: True)
    monkeypatch.setattr(assemble.BatchAssembler, "__init__", on_host)
    hits = loader.stats()["hits"]
    seen = []
    for x, y in loader:
        for k in range(len(y)):
            assert torch.equal(x[k], torch.full((2 * DIRECT_MIN_BYTES,), int(y[k]) % 251,
                                                dtype=torch.uint8))
        seen += y.tolist()
    assert sorted(seen) == list(range(64))
    assert copies == [2 * DIRECT_MIN_BYTES] * 64     # every row from the cache's pages
    assert calls.registered
    assert loader.stats()["hits"] == hits + 64


def test_register_cache_pages_is_checked(server, session):
    cds = CachedDataset(list(range(4)), DatasetCache(session))
    with pytest.raises(TypeError, match="register_cache_pages"):
        CachedLoader(cds, register_cache_pages=1)
    with pytest.raises(ValueError, match="device='cuda'"):
        CachedLoader(cds, register_cache_pages=True)
    loader = CachedLoader(cds, batch_size=2)
    loader.unregister_cache_pages()    # none registered: nothing to do
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


@needs_cuda
def test_batches_from_registered_pages_equal_the_staged_ones(server, session):
    class Rows:
        def __len__(self):
            return 256

        def __getitem__(self, i):
            return torch.full((ROW,), i % 251, dtype=torch.uint8), i

        def __repr__(self):
            return "Rows(256)"
    cds = CachedDataset(Rows(), DatasetCache(session))
    for _ in CachedLoader(cds, batch_size=64):
        pass
    assert cds.flush(60)
    staged = CachedLoader(cds, batch_size=64, device="cuda", pin_memory=True)
    direct = CachedLoader(cds, batch_size=64, device="cuda", pin_memory=True,
                          register_cache_pages=True)
    for (x, y), (u, v) in zip(staged, direct):
        assert u.is_cuda and v.is_cuda
        assert torch.equal(x, u) and torch.equal(y, v)
    pages = direct._state.pages
    assert pages.failed is None and pages.registered()
    direct.unregister_cache_pages()
    assert pages.registered() == []
    # Later batches go through the staging copy, the same.
    for (x, y), (u, v) in zip(staged, direct):
        assert torch.equal(x, u) and torch.equal(y, v)
