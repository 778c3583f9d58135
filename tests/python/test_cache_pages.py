"""The cache's pages registered with CUDA (CachedLoader's
register_cache_pages, shmcache/torch/_cache_pages.py): the registration
bookkeeping over real shared memory, with the register / unregister calls
recorded instead of made (what is registered, once, released on close, in
a forked child and at exit), the device gather with its copy made on the
host, and, where CUDA is, the loader's batches from registered pages. Segment
files are sparse: only the pages up to each segment's carve mark are
registered (registering a page pins it, which would allocate a hole), one
more range each time a segment grew past what was registered."""

import ctypes
import glob
import mmap
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import wait_for
from shmcache import DatasetCache

torch = pytest.importorskip("torch")
from shmcache._shmcache import SEGMENT_CARVED_AT, SEGMENT_MAGIC  # noqa: E402
from shmcache.torch import CachedDataset, CachedLoader  # noqa: E402
from shmcache.torch._cache_pages import (DIRECT_MIN_BYTES, CachePages,  # noqa: E402
                                         DeviceGather, mapping_of)

ROW = 150 * 1024
PAGE = 4096
# SegmentAllocator::kSupplyStep and a 2 MB page: what the daemon may still
# be supplying past a segment's carve mark after a fill.
STEP = (8 + 2) << 20
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


def _carved(lo):
    """The carve mark in the header of the segment mapped at lo."""
    return ctypes.c_uint64.from_address(lo + SEGMENT_CARVED_AT).value


def _up_to_carve_mark(addr):
    """(start, length) of the mapped segment holding addr, up to its carve
    mark rounded up to a page."""
    lo, _ = _segment_of(addr)
    return lo, -(-_carved(lo) // PAGE) * PAGE


def _ranges_by_segment(ranges):
    """The registered ranges grouped by segment, each segment's adjoining
    from its mapping's start and ending at most at its carve mark (rounded
    up to a page): {mapping start: [(start, length)]}."""
    by_seg = {}
    for start, length in ranges:
        by_seg.setdefault(_segment_of(start)[0], []).append((start, length))
    for lo, rs in by_seg.items():
        rs.sort()
        assert rs[0][0] == lo, "a segment's first range starts at its header"
        for (a, n), (b, _) in zip(rs, rs[1:]):
            assert a + n == b, f"ranges of a segment adjoin: {rs}"
        end = rs[-1][0] + rs[-1][1]
        assert (end - lo) % PAGE == 0
        assert end - lo <= -(-_carved(lo) // PAGE) * PAGE, \
            f"registered past the carve mark: {end - lo} > {_carved(lo)}"
        _, mapped = _segment_of(lo)
        assert end - lo < mapped or _carved(lo) == mapped
    return by_seg


def _in_one_range(addr, nbytes, ranges):
    return any(s <= addr and addr + nbytes <= s + n for s, n in ranges)


def test_each_segment_a_row_lies_in_is_registered_up_to_its_carve_mark_when_first_used(
        server, session):
    _, views = _filled(session, 100)     # 15 MB of rows: several 4 MB+ segments
    calls = Calls()
    pages = CachePages(calls.register, calls.unregister)
    first = views[0][0][2]
    assert pages.ensure(_addr(first), first.nbytes, first)
    assert calls.registered == [_up_to_carve_mark(_addr(first))]
    want = set()
    for v in views:
        a = v[0][2]
        assert pages.ensure(_addr(a), a.nbytes, a)
        want.add(_up_to_carve_mark(_addr(a)))
        want.add(_up_to_carve_mark(_addr(a) + a.nbytes - 1))
        assert _in_one_range(_addr(a), a.nbytes, pages.registered())
    assert len(want) > 1, "the rows should span several segments"
    _ranges_by_segment(calls.registered)
    # Segments met later were registered when first used, each once.
    assert sorted(calls.registered) == sorted(want)
    assert pages.registered() == sorted(want)
    pages.close()
    assert sorted(calls.unregistered) == sorted(s for s, _ in want)
    assert pages.registered() == []
    assert not pages.ensure(_addr(first), first.nbytes, first)   # closed
    pages.close()                                                 # idempotent
    assert len(calls.unregistered) == len(want)


def _one_preparer_server(start_server):
    """A server started on one CPU: it has one preparer thread, so each
    batch of segments made ahead is one segment of a quarter of what the
    cache holds (on more CPUs a batch is split over as many segments as
    writers showed they need: small segments, one chunk and few holes
    each)."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        s = start_server()
    finally:
        os.sched_setaffinity(0, cpus)
    assert len(os.sched_getaffinity(s.pid)) == 1, "the server runs on the CPU it was given"
    return s


def test_a_segment_that_grows_gets_one_more_range_adjoining_the_last(start_server):
    # A reader that reads rows while they are written (a first epoch): each
    # row is made direct as soon as it is read, so the segment being carved
    # is registered chunk by chunk, never past its carve mark.
    s = _one_preparer_server(start_server)
    cache = DatasetCache(s.new_session(), size_mb=512, name="pages-growing")
    calls = Calls()
    pages = CachePages(calls.register, calls.unregister)
    gather = DeviceGather(pages, copy=lambda *a: None, done=lambda e: True)
    for i in range(400):                  # 59 MB: segments of up to 15 MB
        assert cache.put(i, (np.full(ROW, i % 251, np.uint8), np.int64(i)))
        row = cache.get_batch_columns([i], copy=False)[0]
        addrs = gather.sources([row], [ROW, 8])
        assert addrs is not None, f"row {i} was not made direct"
        assert _in_one_range(int(addrs[0][0]), ROW, pages.registered())
        assert int(addrs[0][0]) == _addr(row[0][2])
    by_seg = _ranges_by_segment(calls.registered)
    grown = {lo: rs for lo, rs in by_seg.items() if len(rs) > 1}
    assert grown, f"no segment grew while it was read: {by_seg}"
    # Each range was registered once, and every row read lies in one.
    assert len(set(calls.registered)) == len(calls.registered)
    views = cache.get_batch_columns(list(range(400)), copy=False)
    assert all(_in_one_range(_addr(v[0][2]), ROW, calls.registered) for v in views)
    pages.close()
    assert sorted(calls.unregistered) == sorted(s for s, _ in calls.registered)


def _whole_segment_files(port):
    """The instance's segment files once each is whole (its magic written,
    which the daemon does last): a preparer makes a segment under its final
    name, then sizes it and supplies its first pages (format/shm_file.cc,
    SegmentAllocator::FormatSegment), so a file listed mid-way would count
    that supply as pages the test's own calls allocated."""
    def listed():
        files = sorted(glob.glob(f"/dev/shm/shmcache.{os.getuid()}.{port}.seg.*"))
        for path in files:
            try:
                with open(path, "rb") as f:
                    head = f.read(8)
            except FileNotFoundError:   # a failed one removed: list again
                return None
            if len(head) < 8 or int.from_bytes(head, "little") != SEGMENT_MAGIC:
                return None
        return files
    return wait_for(listed, what="the segments being made to be whole")


def test_registering_allocates_no_page_of_a_sparse_segment(start_server):
    # Registering pins a range's pages, which faults in (allocates) every
    # hole of a sparse segment file: the register given here first checks
    # that the range holds no hole (SEEK_HOLE), then reads a byte of every
    # page, as pinning would.
    # The rows are put one by one under 64 KB, so each goes through the
    # mapping and the chunk it leased is written whole: on tmpfs SEEK_HOLE
    # also reports a page the daemon allocated (fallocate) but nobody wrote
    # as a hole, which is what a batch's rows, or a larger row put alone,
    # leave past their end in a chunk (lib/chunk_writer.h); pinning such a
    # page allocates nothing, but this check cannot tell it from a hole.
    s = _one_preparer_server(start_server)
    cache = DatasetCache(s.new_session(), size_mb=1024, name="pages-sparse")
    size, n = 48 << 10, 0
    while True:   # until a row lies in a segment with a hole past two steps
        assert n < 20000, "no segment with a hole was made"
        assert cache.put(n, np.full(size, n % 251, np.uint8))
        v = cache.get_batch_columns([n], copy=False)[0][0][2]
        n += 1
        path = mapping_of(_addr(v))[2].removesuffix(" (deleted)")
        if os.stat(path).st_size - os.stat(path).st_blocks * 512 > 2 * STEP:
            break
    views = cache.get_batch_columns(list(range(n)), copy=False)
    files = _whole_segment_files(s.port)
    before = {p: os.stat(p).st_blocks * 512 for p in files}
    touched, holes_in_ranges = [], []

    def register(start, length):
        lo, _, path = mapping_of(start)
        fd = os.open(path.removesuffix(" (deleted)"), os.O_RDONLY)
        try:
            hole = os.lseek(fd, start - lo, os.SEEK_HOLE)
        finally:
            os.close(fd)
        if hole < start - lo + length:
            holes_in_ranges.append((path, start - lo, length, hole))
        touched.append(length)
        for off in range(0, length, PAGE):
            ctypes.c_char.from_address(start + off).value   # faults the page in
    pages = CachePages(register, lambda start: None)
    for v in views:
        a = v[0][2]
        assert pages.ensure(_addr(a), a.nbytes, a)
    assert sum(touched) >= n * size
    assert holes_in_ranges == [], "registered ranges held holes (path, offset, " \
                                  f"length, first hole): {holes_in_ranges}"
    # Files grew by no more than the daemon's own supply may still add (a
    # step ahead of a segment's carve mark, off the store's lock): a whole
    # segment registered would have allocated each one whole.
    after = {p: os.stat(p).st_blocks * 512 for p in files}
    grew = {os.path.basename(p): (before[p] >> 20, after[p] >> 20)
            for p in files if after[p] > before[p] + STEP}
    assert not grew, f"registering allocated pages (MB before, after): {grew}"
    _ranges_by_segment(pages.registered())
    pages.close()


class FakeSegment:
    """A file named as a cache segment, mapped here, whose header the test
    writes: what CachePages finds when a mapping is named like a segment
    but its header is not one this build wrote."""

    def __init__(self, tmp_path, size=1 << 20):
        self.path = str(tmp_path / f"shmcache.{os.getuid()}.1.seg.0.0")
        with open(self.path, "wb") as f:
            f.truncate(size)
        with open(self.path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), size)
        self.lo = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.hi = self.lo + size
        self.header(SEGMENT_MAGIC, 0)

    def header(self, magic, carved):
        ctypes.c_uint64.from_address(self.lo).value = magic
        ctypes.c_uint64.from_address(self.lo + SEGMENT_CARVED_AT).value = carved

    def find(self, addr):
        return (self.lo, self.hi, self.path) if self.lo <= addr < self.hi else None


def test_a_header_that_does_not_hold_the_row_registers_nothing(tmp_path):
    seg = FakeSegment(tmp_path)
    calls = Calls()
    pages = CachePages(calls.register, calls.unregister, find_mapping=seg.find)
    row, nbytes = seg.lo + 8192 + 64, 3 * PAGE      # a row at [8 KB + 64, 20 KB + 64)
    for magic, carved in [(SEGMENT_MAGIC, 0),                  # never carved
                          (SEGMENT_MAGIC, 8192 + 64),          # below the row's end
                          (SEGMENT_MAGIC, (1 << 20) + PAGE),   # past the mapping
                          (0, 6 * PAGE)]:                      # not a segment header
        seg.header(magic, carved)
        assert not pages.ensure(row, nbytes, None), (magic, carved)
        assert calls.registered == [] and pages.failed is None
    # A header that holds it: registered up to its carve mark, in whole pages.
    pages = CachePages(calls.register, calls.unregister, find_mapping=seg.find)
    seg.header(SEGMENT_MAGIC, 6 * PAGE + 64)                   # off a page (an older build)
    assert pages.ensure(row, nbytes, None)
    assert calls.registered == [(seg.lo, 7 * PAGE)]
    # The segment grew: a row past the registered end gets one more range;
    # a row across the old end (carved off a page) is not made direct.
    seg.header(SEGMENT_MAGIC, 12 * PAGE)
    assert not pages.ensure(seg.lo + 7 * PAGE - 64, 2 * PAGE, None)
    assert pages.ensure(seg.lo + 7 * PAGE, 2 * PAGE, None)
    assert calls.registered == [(seg.lo, 7 * PAGE), (seg.lo + 7 * PAGE, 5 * PAGE)]
    assert pages.ensure(seg.lo + 9 * PAGE, PAGE, None)         # within it: no call
    assert not pages.ensure(seg.lo + 11 * PAGE, 2 * PAGE, None)   # past the mark
    assert len(calls.registered) == 2
    pages.close()
    assert calls.unregistered == [seg.lo, seg.lo + 7 * PAGE]
    seg.map.close()


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
    assert all(_in_one_range(src, nbytes, calls.registered) for src, nbytes in copies)
    _ranges_by_segment(calls.registered)


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
