"""The cache's own pages as the source of a CachedLoader's copies to the GPU
(CachedLoader(..., register_cache_pages=True)): CachePages, the cache
segments this process maps, registered with CUDA (cudaHostRegister) so
that the device copies rows straight out of them (DeviceGather), with no
copy into a pinned staging buffer on the host.

CachePages' contract:
- Only what holds rows is registered. Segment files are sparse (the daemon
  supplies a segment's pages a bounded step ahead of its carve mark, the
  end of its last chunk carved: daemon/segment_allocator.h), and
  registering a page pins it, so registering a whole segment would
  allocate every hole of it in /dev/shm. When a row in a segment is first
  used (ensure), its mapping (the one that holds the row, as the kernel
  lists it in /proc/self/maps: a cache segment's alone, a file named
  shmcache.<uid>.<port>.seg.*, whose first bytes are a segment header) is
  registered from its start up to the carve mark read from that header,
  rounded up to a 4 KB page. Those pages are allocated already: supplied
  pages reach past the carve mark in whole 2 MB pages.
- A row of that segment past the registered end (the carve mark moved on
  since: the cache grew) registers one more range, from the old end to
  the carve mark now. The ranges of a segment adjoin, and a row lies in
  one of them: a row lies in one chunk (a recycled tail of one
  included), chunks lie between carve marks,
  and carve marks lie on 4 KB pages (SegmentAllocator::ChunkSize), so a
  range ends where a chunk does. A row across two ranges (a segment an
  older build carved, off a page) is not direct: its batch goes through
  the staging copy.
- A row that exists lies below its segment's carve mark as this process
  reads it: the daemon moved the mark past the row's chunk before it
  leased the chunk to the row's writer, which wrote the row before it
  published it in the index this process found the row through, and a
  mark never moves back. A header that says otherwise (a mark below the
  row's end, 0, or past the mapping) is not a segment as this build
  knows it: the row is refused (staging copy), nothing registered.
  Rows read from anywhere else (a spilled row's copy) are not registered
  either and go through the staging copy.
- While registered, a segment stays mapped: each range holds a
  zero-copy view of a row in it, which holds the native cache (the
  mapping lives as long as it does).
- close() unregisters every range (the loader's finalizer calls it when
  the loader is collected, and the module's exit hook at exit). A forked
  child forgets the ranges without unregistering them: the registrations
  are its parent's (CUDA's state does not survive fork), and it never
  registers (ensure says no in a child).
- register / unregister are injected (cuda_calls() gives CUDA's, through
  torch.cuda.cudart(); the tests give their own): register(start, length)
  raises on failure; then the registry stops trying and says why
  (`failed`), and batches go through the staging copy.

Thread safety: every method from any thread (one lock).
"""

from __future__ import annotations

import atexit
import bisect
import ctypes
import os
import re
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .._shmcache import SEGMENT_CARVED_AT, SEGMENT_HEADER_BYTES, SEGMENT_MAGIC

__all__ = ["CachePages", "DeviceGather", "cuda_calls", "mapping_of", "DIRECT_MIN_BYTES"]

# cudaHostRegisterPortable | cudaHostRegisterReadOnly: visible to every
# context, and taken from a PROT_READ mapping (a reader maps segments read
# only; pinning them for writing would fail).
_REGISTER_FLAGS = 0x01 | 0x08
_CUDA_MEMCPY_HOST_TO_DEVICE = 1

# A column whose rows are smaller than this goes through a small staging
# copy even with registered pages: one device copy per row costs more
# than copying it on the host (an int label, a few floats).
DIRECT_MIN_BYTES = 4096

# A segment file starts with its header (format/layout.h's SegmentHeader,
# SEGMENT_HEADER_BYTES): its magic first, and at SEGMENT_CARVED_AT its
# carve mark (the end of the last chunk carved; a multiple of 4 KB).
_PAGE = 4096   # registrations are in whole pages

_SEGMENT = re.compile(r"/shmcache\.\d+\.\d+\.seg\.\d+\.\d+( \(deleted\))?$")

_live: weakref.WeakSet[CachePages] = weakref.WeakSet()


def mapping_of(addr: int) -> tuple[int, int, str] | None:
    """(start, end, path) of this process's mapping that holds byte `addr`
    (/proc/self/maps), or None."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return lo, hi, parts[5].rstrip("\n") if len(parts) > 5 else ""
    return None


def _libcudart() -> Any:
    """The CUDA runtime library this process already loaded (torch's), via
    ctypes; None when none is loaded."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def cuda_calls() -> tuple[Callable[[int, int], None], Callable[[int], None]]:
    """(register, unregister) of host memory with CUDA, through torch's
    bindings of the CUDA runtime (torch.cuda.cudart()); each raises
    RuntimeError with CUDA's words when CUDA refuses."""
    cudart = torch.cuda.cudart()
    ok = cudart.cudaError.success
    lib = _libcudart()

    def failed(what: str, err: Any) -> RuntimeError:
        # A failed runtime call is also the runtime's "last error", which a
        # later kernel launch check of torch's would report as its own.
        if lib is not None:
            lib.cudaGetLastError()
        return RuntimeError(f"{what} failed: {cudart.cudaGetErrorString(err)} "
                            f"(cudaError {int(err)})")

    def register(start: int, length: int) -> None:
        err = cudart.cudaHostRegister(start, length, _REGISTER_FLAGS)
        if err != ok:
            raise failed(f"cudaHostRegister of {length} bytes of a cache segment", err)

    def unregister(start: int) -> None:
        err = cudart.cudaHostUnregister(start)
        if err != ok:
            raise failed("cudaHostUnregister of a cache segment", err)
    return register, unregister


class CachePages:
    """The cache segments registered with CUDA in this process, each up to
    its carve mark (see the module)."""

    def __init__(self, register: Callable[[int, int], None],
                 unregister: Callable[[int], None],
                 find_mapping: Callable[[int], tuple[int, int, str] | None] = mapping_of
                 ) -> None:
        self._register, self._unregister = register, unregister
        self._find = find_mapping
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._starts: list[int] = []                    # sorted
        self._ranges: dict[int, tuple[int, Any]] = {}   # start -> (end, keeper)
        self._seg_starts: list[int] = []                # sorted mapping starts
        # Segments with ranges: mapping start -> (mapping end, registered end).
        self._segments: dict[int, tuple[int, int]] = {}
        self._refused: set[tuple[int, int]] = set()     # mappings not a segment
        self.failed: str | None = None                  # why registering stopped
        self.closed = False
        _live.add(self)

    def registered(self) -> list[tuple[int, int]]:
        """The registered ranges, (start, length), in address order."""
        with self._lock:
            return [(s, self._ranges[s][0] - s) for s in self._starts]

    def _covering(self, addr: int) -> int | None:
        k = bisect.bisect_right(self._starts, addr) - 1
        if k >= 0 and addr < self._ranges[self._starts[k]][0]:
            return self._starts[k]
        return None

    def ensure(self, addr: int, nbytes: int, keeper: Any) -> bool:
        """Whether bytes [addr, addr + nbytes) lie in one registered range of
        a cache segment, registering the segment's pages up to its carve
        mark when they do not yet. `keeper`: an object that keeps that
        memory mapped (a zero-copy view of the row), held while a range it
        made is registered."""
        if nbytes <= 0:
            return False
        with self._lock:
            if self.closed or self.failed is not None or os.getpid() != self._pid:
                return False
            start = self._covering(addr)
            if start is None:
                start = self._add_locked(addr, addr + nbytes, keeper)
                if start is None:
                    return False
            return addr + nbytes <= self._ranges[start][0]

    def _segment_locked(self, addr: int) -> tuple[int, int, int] | None:
        """(mapping start, mapping end, registered end) of the cache segment
        that holds `addr`, one with ranges registered or one found now
        (registered end: its start); None when the mapping is not a cache
        segment's."""
        k = bisect.bisect_right(self._seg_starts, addr) - 1
        if k >= 0:
            lo = self._seg_starts[k]
            hi, end = self._segments[lo]
            if addr < hi:
                return lo, hi, end
        m = self._find(addr)
        if m is None:
            return None
        lo, hi, path = m
        if (lo, hi) in self._refused:
            return None
        # A mapping holding a row is readable: its first page, the header,
        # too (one mapping, one protection).
        if not _SEGMENT.search(path) or hi - lo < SEGMENT_HEADER_BYTES or \
                ctypes.c_uint64.from_address(lo).value != SEGMENT_MAGIC:
            self._refused.add((lo, hi))
            return None
        return lo, hi, lo

    def _add_locked(self, addr: int, row_end: int, keeper: Any) -> int | None:
        """Registers the pages of addr's segment from its registered end up
        to its carve mark; the new range's start, or None."""
        found = self._segment_locked(addr)
        if found is None:
            return None
        lo, hi, start = found
        # The daemon's store of the mark happened before the row was
        # published (see the module); an aligned 8-byte load is whole.
        carved = ctypes.c_uint64.from_address(lo + SEGMENT_CARVED_AT).value
        if not row_end - lo <= carved <= hi - lo:
            return None   # not a header this build knows: the staging copy
        end = min(hi, lo + (carved + _PAGE - 1) // _PAGE * _PAGE)
        if addr < start or end <= start:
            return None   # a row across the last range's end (an off-page mark)
        try:
            self._register(start, end - start)
        except Exception as e:   # noqa: BLE001 -- said in `failed`, staging goes on
            self.failed = str(e)
            return None
        bisect.insort(self._starts, start)
        self._ranges[start] = (end, keeper)
        # Known from now on (mapped while its ranges' keepers are held).
        if lo not in self._segments:
            bisect.insort(self._seg_starts, lo)
        self._segments[lo] = (hi, end)
        return start

    def close(self) -> None:
        """Unregisters every range (in the process that registered them);
        later ensure() says no. Idempotent. The first failure to unregister
        is raised after the others were tried."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            starts, self._starts = self._starts, []
            ranges, self._ranges = self._ranges, {}
            self._seg_starts, self._segments = [], {}
            if os.getpid() != self._pid:
                return   # a forked child owns none of them
        error: Exception | None = None
        for s in starts:
            try:
                self._unregister(s)
            except Exception as e:   # noqa: BLE001 -- the first is raised below
                error = error or e
        del ranges   # the keepers: the segments may be unmapped from now on
        if error is not None:
            raise error

    def _forget_in_child(self) -> None:
        """After fork, in the child: the ranges are the parent's."""
        self._lock = threading.Lock()
        self._starts, self._ranges = [], {}
        self._seg_starts, self._segments = [], {}
        self.closed = True


def _after_fork_in_child() -> None:
    for pages in list(_live):
        pages._forget_in_child()


def _close_all() -> None:
    for pages in list(_live):
        try:
            pages.close()
        except Exception:   # noqa: BLE001 -- at exit, CUDA may be gone first
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all)


class DeviceGather:
    """A batch of fixed-layout rows copied to the device straight from the
    cache's registered pages, on `stream`: one asynchronous copy per row
    and column into the device batch tensor (a row's columns are stored
    with its header between them and the next row's: no two rows' bytes of
    a column are adjacent, so there is no longer run to copy at once);
    columns of rows under DIRECT_MIN_BYTES through a small host buffer and
    one copy. `copy(dst, src, nbytes, stream)` makes one
    asynchronous host-to-device copy (cudaMemcpyAsync's; injected by the
    tests). The rows' views are held until the copies finished (`done`
    says when), so the rows cannot be dropped under a copy."""

    def __init__(self, pages: CachePages, copy: Callable[[int, int, int, Any], None] | None = None,
                 done: Callable[[Any], bool] | None = None) -> None:
        self.pages = pages
        self._copy = copy if copy is not None else _cuda_copy()
        self._done = done if done is not None else (lambda event: event.query())
        self._held: deque[tuple[Any, Any]] = deque()   # (event, views)
        self._lock = threading.Lock()

    def sources(self, rows: Sequence[Any], row_bytes: Sequence[int]) -> list[np.ndarray] | None:
        """Per column (of row_bytes bytes a row), the rows' addresses
        (int64), when every row's column of DIRECT_MIN_BYTES or more lies
        in registered cache pages; None otherwise (the batch goes through
        the staging copy)."""
        out = []
        for k, nbytes in enumerate(row_bytes):
            addrs = np.empty(len(rows), dtype=np.int64)
            for p, cols in enumerate(rows):
                a = cols[k][2]
                addrs[p] = a.__array_interface__["data"][0]
                if nbytes >= DIRECT_MIN_BYTES and not self.pages.ensure(
                        int(addrs[p]), nbytes, a):
                    return None
            out.append(addrs)
        return out

    def gather(self, rows: Sequence[Any], row_bytes: Sequence[int], dsts: Sequence[Any],
               addrs: Sequence[np.ndarray], stream: Any, stream_handle: int,
               event: Any) -> None:
        """Copies column k of rows[p] into dsts[k][p] (device tensors, on
        `stream`, whose handle is stream_handle), then records `event` on
        it; the rows are held until `done(event)`."""
        self._release_finished()
        small = []
        for k, nbytes in enumerate(row_bytes):
            dst = dsts[k].data_ptr()
            if nbytes < DIRECT_MIN_BYTES:
                small.append(k)
                continue
            for p, src in enumerate(addrs[k].tolist()):
                self._copy(dst + p * nbytes, src, nbytes, stream_handle)
        for k in small:
            host = torch.empty(tuple(dsts[k].shape), dtype=dsts[k].dtype,
                               pin_memory=dsts[k].is_cuda)
            h = host.view(torch.uint8).numpy().reshape(len(rows), -1) if host.numel() \
                else None
            if h is not None:
                for p, cols in enumerate(rows):
                    h[p] = cols[k][2].reshape(-1).view(np.uint8)
            with torch.cuda.stream(stream):
                dsts[k].copy_(host, non_blocking=True)
        event.record(stream)
        with self._lock:
            self._held.append((event, rows))

    def _release_finished(self) -> None:
        with self._lock:
            while self._held and self._done(self._held[0][0]):
                self._held.popleft()


def _cuda_copy() -> Callable[[int, int, int, Any], None]:
    """cudaMemcpyAsync host to device through ctypes on the runtime torch
    loaded; without it, torch's copy_ of a tensor over the pages."""
    lib = _libcudart()
    if lib is not None:
        fn = lib.cudaMemcpyAsync
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                       ctypes.c_void_p]

        def copy(dst: int, src: int, nbytes: int, stream: Any) -> None:
            err = fn(dst, src, nbytes, _CUDA_MEMCPY_HOST_TO_DEVICE, stream)
            if err != 0:
                raise RuntimeError(f"cudaMemcpyAsync of {nbytes} bytes from the cache's "
                                   f"pages failed (cudaError {err})")
        return copy
    raise RuntimeError("the CUDA runtime library torch uses was not found in this process")
