"""The loader's threads end before the interpreter finalizes, or wait
outside torch for the process to end.

A CachedLoader pass's threads, its miss pool's threads (the one that runs
the workers' DataLoader, the one that reads their answers) and a
PartitionedLoader pass's exchange thread are daemon threads: a pass never
closed must not hold its process's exit. But a daemon thread that is
inside a call into torch (most let the GIL go) when the interpreter begins
to finalize is ended by CPython (pthread_exit) as it takes the GIL back,
and that unwinding through torch's C++ aborts the whole process:
"terminate called without an active exception", after the script's last
line. The pool's thread calls torch until the DataLoader of its workers
has shut them down, which spawned workers make last; the exchange thread
of a pass whose iterator the script kept waits in gloo for the other
ranks' next round.

So at exit (an atexit hook: after the script and its non-daemon threads,
before the hooks that torch and multiprocessing registered when they were
imported, which mark the exit and terminate the workers):

1. every pass, pool and exchange of this process still open is stopped
   (stop(): returns at once or after a bounded wait), and their threads
   are waited for, EXIT_JOIN_S at most in all: an exit never hangs on a
   row, or on another rank, that does not end;
2. then the torch sections close (torch_section): a thread of ours that
   waits on torch for long (an exchange round waiting for another rank)
   does it inside a section, in slices (between_slices()); once no thread
   is inside one (SECTION_CLOSE_S at most: a slice), none enters one again
   and a thread that tries waits there, outside torch (a Python lock, the
   GIL let go), until the process ends. What it had asked of torch
   (gloo's work) goes on in torch's own threads; the thread's frames keep
   the tensors that work holds, so those threads free none (freeing a
   tensor whose Python object went first takes the GIL).

A thread of ours that runs torch code it does not control (the miss
pool's thread iterating the workers' DataLoader: each next() enters and
leaves a record_function, torch calls that let the GIL go, and frees its
handle tensor, which lets the GIL go too) cannot take slices between its
calls; it runs that code under waits_are_slices() instead: the whole is a
torch section, and the thread's blocking waits (a lock, a poll, a sleep,
a read: found by a profile function, sys.setprofile, from CPython's
C-call events) are its slices. Such a thread is mostly waiting (for a
worker's answer), so the sections close at once, and the thread stops as
its wait returns.

A CachedLoader pass's assembling threads call torch (tensors, collate,
the user's transforms) between waits that the pass's stop ends (a slot,
the miss turn, the workers' answer): each runs its whole life as a
section (owned_section()), and stops, once its pass is, after the sample
it transforms or the row it computes. So the exit waits for it to leave
torch even when the threads before it took EXIT_JOIN_S.

A thread still inside a torch call after both bounds (a user's dataset
computing a row on a loader thread) is left to the exit, as before.

3. last, the functions given to after_threads() run: what must be done
   once those threads made their last torch call, before the interpreter
   finalizes (partitioned/gloo_handles.py keeps the tensors of the
   exchange's last rounds for good, and waits for older ones that gloo's
   threads still hold).

Thread safety: every function may be called from any thread.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Protocol

__all__ = ["EXIT_JOIN_S", "SECTION_CLOSE_S", "end_at_exit", "after_threads", "exiting",
           "torch_section", "between_slices", "waits_are_slices", "owned_section"]

EXIT_JOIN_S = 10.0
SECTION_CLOSE_S = 2.0


class Stoppable(Protocol):
    def stop(self) -> None:
        """Stops the threads (they end after what they compute); returns at
        once or after a bounded wait."""

    def started_threads(self) -> list[threading.Thread]:
        """The threads started so far."""


_open: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False     # the hook is registered (a forked child inherits it)
_after: list[Callable[[], None]] = []   # after_threads(), in order

# The torch sections: threads inside one, and whether they closed (exit).
_sections = threading.Condition()
_inside = 0
_closed = False


def end_at_exit(owner: Stoppable) -> None:
    """At this process's exit, `owner` is stopped and its threads are waited
    for (see the module); held weakly."""
    global _hooked
    with _lock:
        _open.add(owner)
        if not _hooked:
            _hooked = True
            atexit.register(_end_all)


def after_threads(fn: Callable[[], None]) -> None:
    """At this process's exit, once the threads of every owner given to
    end_at_exit ended or were parked (the torch sections closed), fn()
    runs (see the module): in the exit hook, which end_at_exit registers
    (no owner, no hook: nothing of theirs to follow)."""
    with _lock:
        _after.append(fn)


def exiting() -> bool:
    """Whether the exit hook has closed the torch sections: a thread of ours
    may then never end, and nothing may wait for it."""
    return _closed


@contextlib.contextmanager
def torch_section() -> Iterator[None]:
    """A stretch of a thread of ours that calls torch and may wait on it for
    long: its waits must be slices with between_slices() after each. Once
    the exit hook closed the sections, entering one waits for the process's
    end."""
    _enter_section()
    try:
        yield
    finally:
        _leave_section()


@contextlib.contextmanager
def owned_section() -> Iterator[None]:
    """A torch section for a thread whose every wait its owner's stop()
    ends (a CachedLoader pass's assembling threads: their waits for a
    slot, the miss turn and the workers all end at close()): the exit
    hook's close waits for the thread to leave it, which it does once its
    work in hand is done (a batch's current sample: the pass is stopped),
    so it needs no slices. Once the sections closed (a pass started in a
    later exit hook), the block runs outside any section: nothing would
    let the thread in, and the pass's consumer waits for it."""
    entered = _enter_unless_closed()
    try:
        yield
    finally:
        if entered:
            _leave_section()


def _enter_unless_closed() -> bool:
    """Enters a section, unless they closed (then False)."""
    global _inside
    with _sections:
        if _closed:
            return False
        _inside += 1
        return True


def _enter_section() -> None:
    global _inside
    with _sections:
        _refuse_in_main_thread()
        while _closed:
            _sections.wait()
        _inside += 1


def _leave_section() -> None:
    global _inside
    with _sections:
        _inside -= 1
        _sections.notify_all()


@contextlib.contextmanager
def waits_are_slices() -> Iterator[None]:
    """The block is a torch section whose slices are this thread's
    blocking waits (see the module): the thread is outside the section
    while it waits (a lock, a poll, a sleep, a read), and a wait that
    returns once the sections closed waits there, outside torch, for the
    process's end. The thread's profile function before the block (a
    user's, from threading.setprofile) still gets every event. A block
    begun once the sections closed (a pass that a later exit hook runs)
    runs outside them: waiting at their door, it would hold that hook,
    and the process's exit, for good."""
    if not _enter_unless_closed():
        yield
        return
    before = sys.getprofile()
    profile = _WaitsAreSlices(before)
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(before)
        # Python drops a profile function that raised (the user's it
        # calls): dropped in a wait, the thread is outside already.
        if profile.waiting is None:
            _leave_section()


# The C functions that wait (and let the GIL go) and free nothing: the
# places where a thread under waits_are_slices() is outside its section.
_WAITS = frozenset([
    ("_thread", "lock.acquire"), ("_thread", "RLock.acquire"),
    ("select", "poll.poll"), ("select", "epoll.poll"), ("select", "select"),
    ("time", "sleep"), ("posix", "read"), ("posix", "waitpid"), ("posix", "waitid"),
    ("_socket", "socket.recv"), ("_socket", "socket.recv_into"),
    ("_multiprocessing", "SemLock.acquire")])


def _is_wait(fn: Any) -> bool:
    owner = getattr(fn, "__self__", None)
    module = getattr(fn, "__module__", None) or type(owner).__module__
    return (module, getattr(fn, "__qualname__", "")) in _WAITS


class _WaitsAreSlices:
    """The profile function of waits_are_slices()."""

    def __init__(self, chained: Callable[..., Any] | None) -> None:
        self.chained = chained
        self.waiting: Any = None    # the wait in progress

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            if self.waiting is None and _is_wait(arg):
                self.waiting = arg
                _leave_section()
        elif event in ("c_return", "c_exception"):
            if arg is self.waiting:
                self.waiting = None
                _enter_section()
        if self.chained is not None:
            self.chained(frame, event, arg)


def between_slices() -> None:
    """In a torch section, between two calls: where the exit hook may close
    the sections (the thread then waits here for the process's end)."""
    global _inside
    with _sections:
        if not _closed:
            return
        _refuse_in_main_thread()
        _inside -= 1
        _sections.notify_all()
        while True:
            _sections.wait()


def _refuse_in_main_thread() -> None:
    """The thread that finalizes must not wait for the end: it would never
    come (a pass started in a later exit hook, or in a finalizer)."""
    if _closed and threading.current_thread() is threading.main_thread():
        raise RuntimeError("the interpreter is exiting: shmcache's torch sections are closed")


def _close_sections(timeout: float) -> None:
    global _closed
    with _sections:
        _closed = True
        _sections.wait_for(lambda: _inside == 0, timeout)


def _end_all() -> None:
    deadline = time.monotonic() + EXIT_JOIN_S
    with _lock:
        owners = list(_open)
    for owner in owners:
        owner.stop()
    me = threading.current_thread()
    for owner in owners:
        for t in owner.started_threads():
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))
    _close_sections(SECTION_CLOSE_S)
    with _lock:
        after = list(_after)
    for fn in after:
        fn()


def _forget_in_child() -> None:
    """A forked child has none of its parent's threads (nor, perhaps, a
    free lock). A child forked by a thread under waits_are_slices() (a
    DataLoader worker, started by the miss pool's thread) computes rows
    without its profile function."""
    global _lock, _sections, _inside, _closed
    profile = sys.getprofile()
    if isinstance(profile, _WaitsAreSlices):
        sys.setprofile(profile.chained)
    _lock = threading.Lock()
    _open.clear()
    _sections = threading.Condition()
    _inside = 0
    _closed = False


os.register_at_fork(after_in_child=_forget_in_child)
