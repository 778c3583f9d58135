"""shmcache.Client: the admin API of the native module (sessions, caches,
listings, server info, stop), with its arguments checked as DatasetCache
checks its own (_checks.py): TypeError for a wrong type, ValueError for a
value out of range, each naming the argument, where the native module would
raise pybind11's "incompatible function arguments" or a RuntimeError.
"""

from __future__ import annotations

import os

from . import _shmcache
from ._checks import MAX_INT32, MAX_UINT32, check_int, check_type, port_arg
from .rows import MAX_PORT, MIN_PORT

__all__ = ["Client"]


class Client(_shmcache.Client):
    """A connection to this host's cache server.

    port: the instance, MIN_PORT..MAX_PORT (0: $SHMCACHE_PORT, else 50052);
    hostname: this host ("": $SHMCACHE_HOST, else 127.0.0.1; another host
    is a RuntimeError, InvalidArgumentError); run_dir: the directory of the
    server's socket, absolute ("": $SHMCACHE_RUN_DIR, else
    /tmp/shmcache-<uid>; the variable set but empty is refused, as the
    admin refuses it); timeout_ms: how long one request may take before
    the server is declared unavailable (UnavailableError), > 0. The errors
    of the calls are the package's (shmcache.Error subclasses:
    NotFoundError for a session that does not exist, ...)."""

    def __init__(self, port: int = 0, hostname: str = "", run_dir: str = "",
                 timeout_ms: int = 5000) -> None:
        if not (type(port) is int and port == 0):  # 0: $SHMCACHE_PORT, else 50052
            check_int("port", port, MIN_PORT, MAX_PORT)
        check_type("hostname", hostname, str)
        run_dir = os.fspath(run_dir) if isinstance(run_dir, os.PathLike) else run_dir
        check_type("run_dir", run_dir, str)
        check_int("timeout_ms", timeout_ms, 1, MAX_INT32)
        super().__init__(int(port), hostname, run_dir, int(timeout_ms))
        self._port = int(port)   # for the commands its messages suggest

    def destroy_session(self, id: int, /) -> None:
        _check_session_id(id, self._port)
        super().destroy_session(int(id))

    def check_session(self, id: int, /) -> None:
        _check_session_id(id, self._port)
        super().check_session(int(id))

    def open_cache(self, session_id: int, name: str, fingerprint: str,
                   size_mb: int = 0, spill_requested: bool = False) -> _shmcache.Cache:
        _check_session_id(session_id, self._port)
        check_type("name", name, str)
        check_type("fingerprint", fingerprint, str)
        check_int("size_mb", size_mb, 0, 2**64 - 1)
        check_type("spill_requested", spill_requested, bool)
        return super().open_cache(int(session_id), name, fingerprint, int(size_mb),
                                  spill_requested)


def _check_session_id(id: int, port: int) -> None:
    """A session id the server could hold, as `shmcache -d` checks it: the
    server makes no session 0, so 0 is a ValueError, not a NotFoundError
    for a session that is gone. The commands it names ask the server on
    `port`."""
    p = port_arg(port)
    # Not DatasetCache's "or leave it out": these calls need one.
    check_int("session_id", id, 0, MAX_UINT32,
              fix=f"pass the id `shmcache -g{p}` printed (`shmcache --list_sessions{p}` "
              "lists them)")
    if id == 0:
        raise ValueError(f"session_id 0 is no session: ids are 1..{MAX_UINT32}, as "
                         f"`shmcache -g{p}` prints (a launcher that could not create a "
                         "session exports 0); list the sessions with "
                         f"`shmcache --list_sessions{p}`")
