"""Where a server of this user runs on a port when none answers in the
run dir this process looks in: the port's host lock (format/instance.h
HostLockPath, common/instance_lock.h) names its run dir. A cache that
finds no server says so, not "start it": that start is refused (one server
per user and port, whatever its run dir).

Read only, never through a link, never blocking: a file there that is not
a regular file of this user is no lock of its servers (/dev/shm is open to
all).
"""

from __future__ import annotations

import fcntl
import os
import stat

__all__ = ["default_run_dir", "server_elsewhere"]


def default_run_dir() -> str:
    """The run dir a client of this process looks in (format/instance.h
    DefaultRunDir): $SHMCACHE_RUN_DIR, else /tmp/shmcache-<uid>."""
    return os.environ.get("SHMCACHE_RUN_DIR") or f"/tmp/shmcache-{os.geteuid()}"


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a == b


def server_elsewhere(port: int, run_dir: str) -> str | None:
    """The run dir of the server of this user that holds `port`'s host
    lock, when it is not `run_dir`; None when there is none (or it has not
    written its run dir yet). (Its pid is not said: until a starting server
    writes its own, the file names the previous holder.)"""
    path = f"/dev/shm/.shmcache.{os.geteuid()}.{port}.lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        try:
            # Granted only while no server holds the exclusive lock.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            pass
        lines = os.pread(fd, 8192, 0).decode(errors="replace").split("\n")
    finally:
        os.close(fd)
    # "<pid> <start> <boot>\n<run dir>\n[<shm dir>\n]": the second line is
    # whole only once its newline is there.
    if len(lines) < 3 or not lines[1] or _same_dir(lines[1], run_dir):
        return None
    return lines[1]
