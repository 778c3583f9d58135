"""How a DatasetCache stops helping without breaking training: the states
it degrades through (only ever worse), the one CacheWarning that says so,
and the words of that warning (what stopped the cache; for a size over the
server's cap, which bound set the cap and how to raise it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

from ._checks import port_arg
from ._shmcache import (AlreadyExistsError, Error, FullError, NotFoundError,
                        PermissionDeniedError, UnavailableError)

__all__ = ["CacheWarning", "State", "cause", "describe", "cap_bound",
           "CAP_BOUNDS", "ServerInfo", "CacheFigures"]

class CacheWarning(UserWarning):
    """The cache stopped helping (daemon gone, full, error); training goes on."""


class State(enum.IntEnum):
    """How far a DatasetCache degraded; it only ever gets worse."""
    SERVING = 0     # hits and puts go to the cache
    FULL = 1        # puts are refused (and counted) by the cache; hits served
    READ_ONLY = 2   # the daemon is gone: hits still served, puts dropped
    BYPASSED = 3    # nothing works: every read is a miss, every put dropped


# FullError.reason (set by the native module) -> the CacheWarning's words.
_FULL_CAUSES = {
    "shm_filesystem": "no room left in the shared-memory filesystem",
    "server_cap": "the cache server's memory cap is used up",
    "budget": "the cache is full",
}


def cause(err: Error) -> str:
    """What stopped the cache, in a few words, for the CacheWarning; the
    library's message that follows it has the numbers and the fix."""
    if isinstance(err, UnavailableError):
        return "the cache server is unreachable"
    if isinstance(err, FullError):
        return _FULL_CAUSES.get(getattr(err, "reason", ""), "the cache is full")
    if isinstance(err, AlreadyExistsError):
        return "a shared-memory file of the cache already exists"
    if isinstance(err, PermissionDeniedError):
        return "permission denied"
    if isinstance(err, NotFoundError):
        return "the cache or its session no longer exists"
    return "the cache failed"


# FullError.reason -> what to do about it, when the server's figures are
# not at hand (_cap_fix says it with them).
_FULL_FIXES = {
    "budget": "open the cache with a larger size_mb, or with spilling=True, or cache "
              "a smaller dataset",
    "server_cap": "see what each session holds with `shmcache --list_sessions` and "
                  "destroy those no longer used (`shmcache -d ID`), or restart the "
                  "server with a larger memory cap (-r, --memory_cap_mb)",
    "whole_cap": "size_mb=0 gave the cache all the server allows: open it with "
                 "spilling=True, or restart the server with a larger memory cap "
                 "(-r, --memory_cap_mb)",
}

ServerInfo = Mapping[str, Any]
CacheFigures = Mapping[str, Any]


def describe(err: Error, size_mb: int = -1,
             server_info: Callable[[], ServerInfo | None] = lambda: None,
             figures: Callable[[], CacheFigures | None] = lambda: None) -> str:
    """cause(err) and the library's message, said once, and for a
    FullError how full and the fix. A FullError's message says what is
    full (the cache, the cap, the filesystem), with its numbers where the
    server decided it; a writer that found the cache already marked full
    says only that, so the figures come from here: the budget used up by
    the rows the cache holds, and the server's memory cap. size_mb is the
    cache's (0: all the server allows, its budget is the cap); server_info
    gives the cap and what holds it, figures the cache's stats (each None
    when it cannot be had: said without them)."""
    msg = str(err)
    if not isinstance(err, FullError):
        return f"{cause(err)} ({msg})"
    msg = msg.removeprefix("Cache full: ")
    if "is full" not in msg and "used up" not in msg:
        msg = f"{cause(err)} ({msg})"
    reason = getattr(err, "reason", "")
    if reason == "budget" and size_mb == 0:
        reason = "whole_cap"
    info = server_info() if reason != "shm_filesystem" else None
    msg = _with_figures(msg, reason, figures(), info)
    fix: str | None
    if reason == "shm_filesystem":
        fix = CAP_BOUNDS["shm_filesystem"][1]
    elif reason in ("server_cap", "whole_cap"):
        fix = _FULL_FIXES[reason] if info is None else _cap_fix(reason, info)
    else:
        fix = _FULL_FIXES.get(reason)
    return f"{msg} (fix: {fix})" if fix else msg


def _with_figures(msg: str, reason: str, held: CacheFigures | None,
                  info: ServerInfo | None) -> str:
    """A full cache's message with how full it is: its budget used up (the
    library's words where it said them), by how many rows and MB, and the
    server's memory cap."""
    if held is None:
        return msg
    mb = 1 << 20
    budget = reason in ("budget", "whole_cap")
    if budget and msg.endswith(" is full"):
        msg += f": its budget of {int(held['budget_bytes']) // mb} MB is used up"
    rows, used = int(held["mem_rows"]), int(held["mem_bytes"]) / mb
    msg += (" by" if budget and msg.endswith(" used up") else "; it holds") + \
        f" {rows} rows ({used:.1f} MB)"
    if info is not None and reason == "budget":   # (whole_cap's fix names the cap)
        msg += f"; the server's memory cap is {int(info['memory_cap_bytes']) // mb} MB"
    return msg


def _cap_fix(reason: str, info: ServerInfo) -> str:
    """The fix of a used-up cap, with the server's figures: the cap and
    its bound, and (server_cap) how much the caches of which sessions hold."""
    mb = 1 << 20
    cap = int(info["memory_cap_bytes"]) // mb
    bound, where, raise_it = cap_bound(info)
    if reason == "whole_cap":
        return (f"size_mb=0 gave the cache all the server allows, its memory cap of "
                f"{cap} MB ({bound}: {where}): open it with spilling=True, or {raise_it}")
    used = int(info["memory_used_bytes"]) / mb
    held = int(info.get("memory_held_bytes", 0)) / mb   # part of used
    if held >= 0.1 and used - held < 0.1:
        # Destroying a session frees none of it: the live ones hold nothing.
        return (f"destroyed sessions that processes still map hold {held:.1f} MB of "
                f"the {cap} MB cap ({bound}: {where}), freed when those processes "
                f"exit: end them, or {raise_it}")
    sessions = [str(s) for s in info.get("sessions", ())]
    holders = ("no session" if not sessions else
               ("session " if len(sessions) == 1 else "sessions ") + ", ".join(sessions[:8])
               + (f" and {len(sessions) - 8} more" if len(sessions) > 8 else ""))
    still = (f", destroyed sessions that processes still map {held:.1f} MB (freed "
             f"when they exit)" if held >= 0.1 else "")
    p = port_arg(info.get("port"))
    return (f"the caches of {holders} hold "
            f"{used - held:.1f} MB of the {cap} MB cap "
            f"({bound}: {where}){still}: see what each session holds with "
            f"`shmcache --list_sessions{p}` and destroy those no longer used "
            f"(`shmcache -d ID{p}`), or {raise_it}")


def cap_bound(info: ServerInfo) -> tuple[str, str, str]:
    """(the bound that sets the server's memory cap, what it is, how to
    raise it), from its server info."""
    bound = str(info.get("memory_cap_bound", ""))
    why, raise_it = CAP_BOUNDS.get(bound, ("the server's memory cap",
                                           "restart the server with a larger memory "
                                           "cap (-r, --memory_cap_mb)"))
    where = why.format(shm_dir=info.get("shm_dir", ""),
                       cgroup_mb=int(info.get("memory_cgroup_limit_bytes", 0)) >> 20)
    return bound, where, raise_it


# What bounds a server's memory cap (the server info's memory_cap_bound):
# what it is, and how to raise it (cap_bound).
CAP_BOUNDS: dict[str, tuple[str, str]] = {
    "shm_filesystem": (
        "the room in the shm filesystem {shm_dir}",
        "give the container a larger /dev/shm (docker run --shm-size=8g; in "
        "Kubernetes an emptyDir with medium: Memory and a sizeLimit mounted at "
        "/dev/shm), or restart the server with --shm_dir on a larger tmpfs"),
    "cgroup": (
        "-r of the memory limit of the server's cgroup, {cgroup_mb} MB",
        "raise the container's memory limit (docker run --memory, Kubernetes "
        "resources.limits.memory) or restart the server with a larger -r"),
    "physical_memory": (
        "-r of the physical memory",
        "restart the server with a larger -r"),
    "memory_cap_mb": (
        "the server's --memory_cap_mb",
        "restart the server with a larger --memory_cap_mb"),
}
