"""How long a PartitionedLoader's exchange round waits for the other ranks
before it fails (the timeout of the gloo group it runs on, RowExchange.
new_group): what the user gave (PartitionedLoader(exchange_timeout=)),
else the job's timeout (the one init_process_group was given), read from
the default group, else torch's default with one warning that says so.

Where the default group keeps its timeout depends on torch:
- torch < 2.5: the group's options (`group.options._timeout`; in torch 1.13
  the default group is the backend itself, ProcessGroupGloo or NCCL);
- torch >= 2.5 (PR #132931 removed ProcessGroup.options): each backend
  of the group has its options (`group._get_backend(device).options.
  _timeout`, one backend per device of `group._device_types`; every one
  was made with init_process_group's timeout).
Both are private attributes: a torch where neither answers gets the
default and the warning, never an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..._user_line import warn

__all__ = ["exchange_timeout", "first_timeout", "job_timeout", "READERS"]

Reader = Callable[[Any], Any]


def _options(group: Any) -> Any:
    return group.options._timeout


def _backends(group: Any) -> Any:
    for device in group._device_types:
        timeout = group._get_backend(device).options._timeout
        if isinstance(timeout, timedelta):
            return timeout
    return None


# In the order tried: torch < 2.5, then torch >= 2.5.
READERS: tuple[Reader, ...] = (_options, _backends)

_warned = False


def first_timeout(group: Any, readers: Sequence[Reader]) -> timedelta | None:
    """The first timedelta that one of `readers` (each given `group`)
    returns; a reader that raises AttributeError or RuntimeError (the
    attribute or the backend is not there) or returns anything else is
    passed over. None when no reader answers."""
    for read in readers:
        try:
            timeout = read(group)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return None


def job_timeout() -> timedelta | None:
    """The default group's timeout (init_process_group's timeout=), or None
    where this torch does not say it (or there is no group)."""
    world = dist.group.WORLD
    return None if world is None else first_timeout(world, READERS)


def _seconds(given: float | timedelta) -> timedelta:
    if isinstance(given, timedelta):
        timeout = given
    elif isinstance(given, (int, float)) and not isinstance(given, bool):
        if not math.isfinite(given):
            raise ValueError(f"exchange_timeout must be a finite number of "
                             f"seconds, got {given!r}")
        timeout = timedelta(seconds=given)
    else:
        raise TypeError(f"exchange_timeout must be seconds (a number) or a "
                        f"timedelta, got {type(given).__name__}")
    if not timeout > timedelta(0):
        raise ValueError(f"exchange_timeout must be more than 0 s, got {given!r}")
    return timeout


def exchange_timeout(given: float | timedelta | None) -> timedelta:
    """The exchange's timeout: `given` (seconds or a timedelta, > 0), else
    the job's, else torch's default, with one warning per process."""
    if given is not None:
        return _seconds(given)
    timeout = job_timeout()
    if timeout is not None:
        return timeout
    global _warned
    timeout = dist.default_pg_timeout
    if not _warned:
        _warned = True
        warn(f"shmcache: PartitionedLoader's exchange uses a timeout of "
             f"{timeout.total_seconds():g} s (torch's default) for a rank gone or "
             f"stuck: this torch ({torch.__version__}) does not say the timeout "
             f"init_process_group was given. Pass PartitionedLoader(..., "
             f"exchange_timeout=SECONDS) to set it.", UserWarning)
    return timeout
