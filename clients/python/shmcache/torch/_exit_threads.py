"""The loader's threads end before the interpreter finalizes.

A CachedLoader pass's threads and its miss pool's threads (the one that
runs the workers' DataLoader, the one that reads their answers) are daemon
threads: a pass never closed must not hold its process's exit. But a
daemon thread that is inside a call into torch (most let the GIL go) when
the interpreter begins to finalize is ended by CPython (pthread_exit) as it
takes the GIL back, and that unwinding through torch's C++ aborts the whole
process: "terminate called without an active exception", after the
script's last line. The pool's thread calls torch until the DataLoader of
its workers has shut them down, which spawned workers make last: a trainer
that ended right after its last pass aborted now and then.

So at exit (an atexit hook: after the script and its non-daemon threads,
before the hooks that torch and multiprocessing registered when they were
imported, which mark the exit and terminate the workers) every pass and
pool of this process still open is closed, and their threads are waited
for, EXIT_JOIN_S at most in all: an exit never hangs on a row that does not
end (a thread still running then is left to the exit, as before).

Thread safety: end_at_exit() may be called from any thread.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from typing import Protocol

__all__ = ["EXIT_JOIN_S", "end_at_exit"]

EXIT_JOIN_S = 10.0


class Stoppable(Protocol):
    def close(self) -> None:
        """Stops the threads (they end after what they compute)."""

    def started_threads(self) -> list[threading.Thread]:
        """The threads started so far."""


_open: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False     # the hook is registered (a forked child inherits it)


def end_at_exit(owner: Stoppable) -> None:
    """At this process's exit, `owner` is closed and its threads are waited
    for (see the module); held weakly."""
    global _hooked
    with _lock:
        _open.add(owner)
        if not _hooked:
            _hooked = True
            atexit.register(_end_all)


def _end_all() -> None:
    deadline = time.monotonic() + EXIT_JOIN_S
    with _lock:
        owners = list(_open)
    for owner in owners:
        owner.close()
    me = threading.current_thread()
    for owner in owners:
        for t in owner.started_threads():
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))


def _forget_in_child() -> None:
    """A forked child has none of its parent's threads (nor, perhaps, a
    free lock)."""
    global _lock
    _lock = threading.Lock()
    _open.clear()


os.register_at_fork(after_in_child=_forget_in_child)
