"""The tensors the exchange hands to gloo: none is freed by gloo's thread
as the interpreter finalizes.

gloo's worker thread (ProcessGroupGloo::runLoop) wakes the waiter of a
collective, so that work.wait() returns, and only then lets go of the
collective's work and of the tensors the work holds: a moment later, or
much later on a loaded host. Seen in cores of a trainer that aborted at
exit: a worker let go of an all_to_all_single of an epoch's next-to-last
round (step 3's two int64 answer sizes; step 4's answers) only once the
last round had ended, the exchange thread had ended, and the main thread
was in Py_FinalizeEx's collection. A tensor whose Python object went
first is freed by gloo's last reference, and freeing it takes the GIL
(torch keeps the Python object alive while C++ holds the tensor); once the
interpreter finalizes, CPython ends a thread that takes the GIL
(pthread_exit), and that unwinding through torch's noexcept frames aborts
the process: "terminate called without an active exception", after the
script's last line.

So:
- gloo gets a handle of each tensor (handle(): an alias of its own, on the
  same storage), which nothing but the round and gloo refers to, while the
  tensor itself may live on (the answers' rows are numpy views of theirs);
- the handles of an exchange's last ROUNDS_KEPT rounds are kept (Kept);
  older ones, and those of an exchange freed, are let go and watched (a
  weak reference): gloo has let go of them long before, almost always, and
  one it still holds is freed by its thread, with the GIL, as the process
  runs;
- at exit, once the exchange threads ended or were parked
  (_exit_threads.after_threads), the handles still kept are never freed
  (gloo's thread then frees nothing of Python's: the Python object holds
  the tensor), and the exit waits until every handle let go is freed
  (RELEASE_WAIT_S at most; the GIL let go meanwhile). A handle that gloo's
  thread frees in that wait is freed with the GIL let go once more, after
  its weak reference is told (torch frees the tensor's C++ side so): the
  exit lets the GIL go once more after the last, so that the thread takes
  it back before the interpreter finalizes. The handles of a round still
  under way (a thread parked in it) are held by that thread's frames,
  which the interpreter never frees.

Thread safety: every function may be called from any thread, gloo's
included (a handle's weak-reference callback runs where it is freed).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref

import torch

from .._exit_threads import after_threads

__all__ = ["RELEASE_WAIT_S", "ROUNDS_KEPT", "Kept", "handle", "keep_at_exit"]

RELEASE_WAIT_S = 2.0
ROUNDS_KEPT = 2
# How long the exit lets the GIL go after the last handle let go was freed
# by another thread: that thread takes it back at once (see the module).
_TAKE_BACK_S = 0.01

# Reentrant: a handle freed by this module's own thread runs _freed there.
_cond = threading.Condition(threading.RLock())
_watched: set[weakref.ref[torch.Tensor]] = set()   # let go, not freed yet
_holders: weakref.WeakSet[Kept] = weakref.WeakSet()
_immortal: list[torch.Tensor] = []   # at exit (keep_at_exit)


def handle(t: torch.Tensor) -> torch.Tensor:
    """What to hand gloo for `t`: an alias of its own (the same storage, a
    new tensor object), to be kept in a Kept once the call is made."""
    return t.detach()


def _freed(ref: weakref.ref[torch.Tensor]) -> None:
    with _cond:
        _watched.discard(ref)
        _cond.notify_all()


def _let_go(handles: list[torch.Tensor]) -> None:
    """Watches each of `handles`, then empties the list (its references
    were the last of ours)."""
    with _cond:
        _watched.update(weakref.ref(h, _freed) for h in handles)
    handles.clear()


class Kept:
    """The handles of the last ROUNDS_KEPT rounds of one exchange."""

    def __init__(self) -> None:
        self._handles: list[torch.Tensor] = []
        self._rounds: list[int] = []   # handles per round, oldest first
        # An exchange freed while gloo holds its last rounds' handles: they
        # are watched too (not at the interpreter's end: kept by then).
        weakref.finalize(self, _let_go, self._handles).atexit = False
        with _cond:
            _holders.add(self)

    def keep(self, handles: list[torch.Tensor]) -> None:
        """Keeps a round's `handles`; lets go of those of the round
        ROUNDS_KEPT before."""
        with _cond:
            self._handles.extend(handles)
            self._rounds.append(len(handles))
            n = sum(self._rounds[:-ROUNDS_KEPT])
            del self._rounds[:-ROUNDS_KEPT]
            old = self._handles[:n]
            del self._handles[:n]
        _let_go(old)

    def _keep_forever(self) -> None:
        with _cond:
            _immortal.extend(self._handles)
            self._handles.clear()
            self._rounds.clear()


def keep_at_exit(timeout: float = RELEASE_WAIT_S) -> bool:
    """The handles every holder keeps are never freed; waits (`timeout`
    seconds at most, the GIL let go) until every handle let go is freed.
    Whether they all were."""
    with _cond:
        holders = list(_holders)
    for kept in holders:
        kept._keep_forever()
    del holders
    # The list holds them through the interpreter's end: one reference
    # more than any it drops (the module's dict is cleared as it ends).
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_immortal))
    with _cond:
        elsewhere = bool(_watched)   # only gloo's threads hold those
        done = _cond.wait_for(lambda: not _watched, timeout)
    if elsewhere:
        time.sleep(_TAKE_BACK_S)
    return done


def _at_exit() -> None:
    keep_at_exit()


def _forget_in_child() -> None:
    """A forked child has no gloo thread, and perhaps no free lock."""
    global _cond, _watched
    _cond = threading.Condition(threading.RLock())
    _watched = set()


after_threads(_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)
