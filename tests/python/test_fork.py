"""os.fork() while another thread is inside put: every child finishes (a
DataLoader forks its workers while the trainer's threads run)."""

import os
import signal
import threading

import numpy as np

from conftest import wait_for
from shmcache import DatasetCache

FORKS = 100


def wait_child(pid, what):
    """The child's exit code; fails (killing it) when it runs 20 s."""
    try:
        _, status = wait_for(lambda: [r for r in [os.waitpid(pid, os.WNOHANG)]
                                      if r[0] == pid], timeout=20, what=what)[0]
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(status)


def test_fork_while_a_thread_puts_never_hangs_the_child(server, session):
    cache = DatasetCache(session).open()
    big = np.ones(1 << 20, dtype=np.uint8)    # puts lease chunks often
    go = threading.Semaphore(0)               # one permit: one more put
    putting = threading.Event()
    stop = threading.Event()
    failures = []

    def writer():
        for i in range(FORKS):
            go.acquire()
            if stop.is_set():
                return
            putting.set()
            # The put releases the GIL: the main thread forks meanwhile.
            if not cache.put(10**6 + i, big):
                failures.append(10**6 + i)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for k in range(FORKS):
            putting.clear()
            go.release()
            assert putting.wait(timeout=20)
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    row = np.full(100, k, dtype=np.int32)
                    code = 0 if cache.put(k, row) and \
                        np.array_equal(cache.get(k), row) else 2
                finally:
                    os._exit(code)
            assert wait_child(pid, f"child {k} (pid {pid})") == 0, f"child {k}"
    finally:
        stop.set()
        go.release()
        t.join(timeout=60)
    assert not failures
    assert all(cache.get(k) is not None for k in range(FORKS))


def test_fork_while_a_thread_opens_the_cache_never_hangs_the_child(server, session):
    for k in range(20):
        cache = DatasetCache(session, name=f"c{k}")
        opening = threading.Event()

        def opener():
            opening.set()
            cache.open()            # releases the GIL inside, under its lock

        t = threading.Thread(target=opener)
        t.start()
        assert opening.wait(timeout=20)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                code = 0 if cache.put(k, np.arange(k + 1)) and cache.get(k) is not None else 2
            finally:
                os._exit(code)
        t.join(timeout=60)
        assert wait_child(pid, f"child {k} (pid {pid})") == 0, f"child {k}"
