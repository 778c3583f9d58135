"""The tensors the exchange hands to gloo, freed before the interpreter
finalizes.

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
- a round's handles are kept (Kept) until the next round ends, or the
  holder is freed; then they are let go and watched (a weak reference):
  gloo has let go of them by then almost always, and a handle it still
  holds is freed by its thread, with the GIL, as the process runs;
- at exit, once the exchange threads ended or were parked
  (_exit_threads.after_threads), every holder lets go, and the exit waits
  until every handle let go is freed (RELEASE_WAIT_S at most; the GIL let
  go meanwhile): the interpreter finalizes with no tensor of ours in
  gloo's hands. The handles of a round still under way (a thread parked
  in it) are held by that thread's frames, which the interpreter never
  frees: nothing of them is freed, and nobody waits for them.

Thread safety: every function may be called from any thread, gloo's
included (a handle's weak-reference callback runs where it is freed).
"""

from __future__ import annotations

import os
import threading
import weakref

import torch

from .._exit_threads import after_threads

__all__ = ["RELEASE_WAIT_S", "Kept", "handle", "let_go_and_wait"]

RELEASE_WAIT_S = 2.0

# Reentrant: a handle freed by this module's own thread runs _freed there.
_cond = threading.Condition(threading.RLock())
_watched: set[weakref.ref[torch.Tensor]] = set()   # let go, not freed yet
_holders: weakref.WeakSet[Kept] = weakref.WeakSet()


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
    """The handles of the last round of one exchange."""

    def __init__(self) -> None:
        self._handles: list[torch.Tensor] = []
        # An exchange freed while gloo holds its last round's handles: they
        # are watched too (not at the interpreter's end: waited for by then).
        weakref.finalize(self, _let_go, self._handles).atexit = False
        with _cond:
            _holders.add(self)

    def keep(self, handles: list[torch.Tensor]) -> None:
        """Keeps `handles` and lets go of the ones kept before."""
        with _cond:
            old = list(self._handles)
            self._handles[:] = handles
        _let_go(old)

    def let_go(self) -> None:
        self.keep([])


def let_go_and_wait(timeout: float = RELEASE_WAIT_S) -> bool:
    """Every holder lets go of its handles; waits (`timeout` seconds at
    most, the GIL let go) until every handle let go is freed. Whether they
    all were."""
    with _cond:
        holders = list(_holders)
    for kept in holders:
        kept.let_go()
    del holders
    with _cond:
        return _cond.wait_for(lambda: not _watched, timeout)


def _at_exit() -> None:
    let_go_and_wait()


def _forget_in_child() -> None:
    """A forked child has no gloo thread, and perhaps no free lock."""
    global _cond, _watched
    _cond = threading.Condition(threading.RLock())
    _watched = set()


after_threads(_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)
