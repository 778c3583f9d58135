"""Where the package's warnings point: the user's line, whichever thread or
process meets the cause, and once for a process and the DataLoader workers
forked from it.

    warn(message, CacheWarning, cache.origin)

The line is the first frame, walking out from the warning, outside this
package, torch.utils.data, threading and multiprocessing: the user's put,
get, ds[i], or the loop over a DataLoader (in a forked worker too: the
child's stack goes on with the frames of the parent that forked it, the
user's loop among them). A thread of the package (a CachedLoader's, the
background writer of CachedDataset's puts) or a spawned worker has no frame
of the user's: there the warning names `origin`, the user's line that made
the cache (user_line(), recorded when it was made and pickled with it). A
fixed stacklevel named the package's own line, DataLoader's fetcher,
threading.py or multiprocessing's process.py, depending on the entry point.
"""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["Origin", "quietly", "said_quietly", "user_line", "warn"]

# (file, line, module name) of a line of the user's.
Origin = tuple[str, int, str]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_THREADING = os.path.abspath(threading.__file__)
_MULTIPROCESSING = os.path.dirname(os.path.abspath(multiprocessing.__file__)) + os.sep
# A process started there has no frame of its user's beneath them.
_PROCESS_STARTS = (_MULTIPROCESSING + "spawn.py", _MULTIPROCESSING + "forkserver.py")
# .categories: the warnings of the package this thread does not show now
# (quietly()); per thread, not the process's warning filters.
_quiet = threading.local()
# The registries of warnings shown at an origin (Python's default filter
# shows a warning once per registry and line).
_registries: dict[str, dict[Any, Any]] = {}


def _machinery() -> tuple[str, ...]:
    """Files and directories whose frames are not the user's: this package,
    threading, multiprocessing, and torch.utils.data once imported (no
    frame of it runs before)."""
    data = sys.modules.get("torch.utils.data")
    where = getattr(data, "__file__", None)
    found = (_PACKAGE, _THREADING, _MULTIPROCESSING)
    return found if where is None else found + (os.path.dirname(where) + os.sep,)


def _user_frame(frame: FrameType | None) -> tuple[FrameType | None, int]:
    """(the first frame of the user's from `frame` outwards, or None; how
    many frames out from `frame` the walk went)."""
    machinery = _machinery()
    hops = 0
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PROCESS_STARTS):
            return None, hops
        if not name.startswith(machinery):
            return frame, hops
        if frame.f_back is None:
            return None, hops
        frame = frame.f_back
        hops += 1
    return None, hops


def _callers_frame() -> FrameType | None:
    """The frame of whoever called the function that calls this."""
    here = inspect.currentframe()
    frame = None if here is None or here.f_back is None else here.f_back.f_back
    # A frame holding itself in a local is a cycle that would keep every
    # caller's frame and locals (a dropped loader, its dataset) until the
    # cyclic collector ran.
    del here
    return frame


def user_line() -> Origin | None:
    """The user's line that called into the package (see the module), for a
    warning raised later where no frame of the user's is on the stack;
    None when there is none."""
    frame, _ = _user_frame(_callers_frame())
    if frame is None:
        return None
    return (frame.f_code.co_filename, frame.f_lineno,
            str(frame.f_globals.get("__name__", "")))


def warn(message: str, category: type[Warning], origin: Origin | None = None) -> None:
    """warnings.warn(message, category) at the user's line (see the module):
    on this thread's stack, else at `origin`. Nothing inside quietly()."""
    if issubclass(category, getattr(_quiet, "categories", ())):
        return
    frame, hops = _user_frame(_callers_frame())
    if frame is None and origin is not None:
        filename, lineno, module = origin
        warnings.warn_explicit(message, category, filename, lineno, module,
                               _registries.setdefault(filename, {}))
        return
    # hops from the caller; warnings.warn counts from this frame.
    warnings.warn(message, category, stacklevel=hops + 2)


@contextlib.contextmanager
def quietly(category: type[Warning]) -> Iterator[None]:
    """The package's warnings (warn()) of `category` are not shown on this
    thread in the block (a loader's thread or worker, whose trainer says
    it), and what it says in it does not count as said for a WarnedFlag
    (said_quietly()). Not warnings.catch_warnings: the filters it swaps
    are the process's, and would quiet the user's thread too, and for good
    when two threads leave in turn."""
    outer = getattr(_quiet, "categories", ())
    _quiet.categories = outer + (category,)
    try:
        yield
    finally:
        _quiet.categories = outer


def said_quietly() -> bool:
    """Whether this thread is inside quietly(): a warning it raises now
    is not shown."""
    return bool(getattr(_quiet, "categories", ()))
