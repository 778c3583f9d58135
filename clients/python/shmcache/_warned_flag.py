"""WarnedFlag: a few bytes of memory shared by a process and the processes
started from it after the flag was made (DataLoader workers, forked or
spawned), so that N workers meeting one cause say one warning, and a
close() of the trainer's is seen by workers already running (persistent
workers).

A forked process shares the mapping. A process started by
multiprocessing's spawn or forkserver gets the memory's file descriptor
with its pickled arguments (the way multiprocessing passes a descriptor to
a child) and maps it. Pickled anywhere else (to a file, a queue), a flag is
a fresh one: nothing shares memory with the reader.

The flags of a process lie side by side in pages (memfds) of PAGE bytes,
one descriptor for a page of them, not one per flag: a program making a
CachedDataset per file of its dataset made four descriptors per dataset,
and ran out of them (ulimit -n, often 1024) at about two hundred. Only the
process that made a page hands out its bytes: a forked or spawned child
makes a page of its own for the flags it makes.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import threading
from typing import Any

from ._shmcache import claim_byte

__all__ = ["WarnedFlag"]


class _Page:
    """One memfd of PAGE bytes, mapped; flags take SLOTS bytes of it each,
    in turn (never handed out twice: a flag's copy in a worker may outlive
    the flag here). The descriptor is closed when no flag holds the page."""

    __slots__ = ("fd", "bytes", "used", "__weakref__")

    def __init__(self, fd: int | None = None) -> None:
        self.fd = -1
        if fd is None:
            fd = os.memfd_create("shmcache-warned", os.MFD_CLOEXEC)
            os.ftruncate(fd, PAGE)
        self.fd = fd
        self.bytes = mmap.mmap(fd, PAGE)
        self.used = 0

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        popen = multiprocessing.context.get_spawning_popen()
        if popen is None:
            return _Page, ()
        # Being pickled to start a process (spawn, forkserver): the child
        # gets a copy of the descriptor, as multiprocessing hands one over.
        # Pickled once however many of its flags go (pickle's memo): spawn
        # refuses a descriptor passed twice.
        return _shared_page, (popen.DupFd(popen.duplicate_for_child(self.fd)),)


def _shared_page(dup: Any) -> _Page:
    """The page of the process that started this one (_Page.__reduce__)."""
    return _Page(dup.detach())


# Bytes of a page: its memory is taken when a flag's byte is first written.
PAGE = mmap.PAGESIZE
# The page this process hands flags out of (None: none yet), and the lock
# of handing them out.
_page: _Page | None = None
_page_lock = threading.Lock()


def _forget_page() -> None:
    """In a forked child: the parent hands out the rest of its page."""
    global _page, _page_lock
    _page = None
    _page_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_page)


def _take(size: int) -> tuple[_Page, int]:
    """`size` bytes of this process's page, never handed out before."""
    global _page
    with _page_lock:
        page = _page
        if page is None or page.used + size > PAGE:
            page = _page = _Page()
        at = page.used
        page.used += size
        return page, at


class WarnedFlag:
    """Whether this process, or one started from it after the flag was made
    (see the module), said the warning the flag stands for, per slot: slot
    0 is the flag itself (bool(flag)), the others a second warning or a
    state of the same object (DatasetCache's note on a size over the cap,
    its close(), its note on spilled rows dropped, its warning on a row it
    cannot take)."""

    __slots__ = ("_page", "_at", "__weakref__")

    SLOTS = 5

    def __init__(self, page: _Page | None = None, at: int = 0) -> None:
        if page is None:
            page, at = _take(self.SLOTS)
        self._page = page
        self._at = at

    def __bool__(self) -> bool:
        return self.said()

    def said(self, slot: int = 0) -> bool:
        return self._page.bytes[self._at + self._slot(slot)] != 0

    def claim(self, slot: int = 0) -> bool:
        """Sets the slot; True for the one call, over every process that
        shares the flag, that set it (an atomic compare-and-swap)."""
        return claim_byte(self._page.bytes, self._at + self._slot(slot))

    def set(self, slot: int = 0) -> None:
        self._page.bytes[self._at + self._slot(slot)] = 1

    def _slot(self, slot: int) -> int:
        if not 0 <= slot < self.SLOTS:
            raise IndexError(f"WarnedFlag has slots 0..{self.SLOTS - 1}, not {slot}")
        return slot

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if multiprocessing.context.get_spawning_popen() is None:
            return WarnedFlag, ()
        return WarnedFlag, (self._page, self._at)
