"""A deadline per test for the Python suites (its hooks are conftest's): a
test whose setup, call and teardown together run past
SHMCACHE_TEST_DEADLINE_S (default DEFAULT_S; a test that needs longer
says so with @pytest.mark.deadline(seconds)) fails, with every thread's
stack, instead of hanging the suite (CI has one limit, 90 minutes, for
everything: a hang fails every suite).

How: at the deadline SIGALRM (pytest's main thread) raises TestDeadline
in whatever the test runs there, a blocked lock acquire or queue read
included (the wait is interrupted and the handler runs), and raises it
again every REPEAT_S while the test still runs: one raised inside a
__del__, or caught by a broad `except`, is swallowed. The test's report
is failed whatever it caught, its message the stacks at the deadline
(also written to pytest's stderr). A test still running BACKSTOP_S after
its deadline (stuck in C, never back in Python) ends pytest through
faulthandler, every thread's stack on stderr: the Python suites stop
there, and CI goes on with the others.

A test that starts processes which may hang where it cannot reach them
(inside torch) bounds them itself (bounded_child.py): its failure then
names the child and shows the child's stacks.
"""

import faulthandler
import os
import signal
import sys
import threading
import traceback

import pytest

DEFAULT_S = 900.0
REPEAT_S = 20.0
BACKSTOP_S = 120.0

_state = pytest.StashKey[dict]()
_stderr = None      # pytest's own stderr (not a test's captured one)


class TestDeadline(Exception):
    """The test ran past its deadline."""

    __test__ = False    # not a test class, despite its name


def deadline_s(item):
    mark = item.get_closest_marker("deadline")
    own = float(mark.args[0]) if mark is not None else 0.0
    return max(own, float(os.environ.get("SHMCACHE_TEST_DEADLINE_S", DEFAULT_S)))


def _stacks():
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"Thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(f))
                     for ident, f in sys._current_frames().items())


def pytest_configure(config):
    global _stderr
    # Captured output is suspended while pytest configures: fd 2 is the
    # terminal's (or CI's log) here, not a test's capture file.
    _stderr = os.fdopen(os.dup(2), "w")
    config.addinivalue_line("markers", "deadline(seconds): this test's deadline, when "
                            "longer than SHMCACHE_TEST_DEADLINE_S (deadline.py)")


def pytest_unconfigure(config):
    if _stderr is not None:
        _stderr.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = deadline_s(item)
    state = item.stash[_state] = {"message": None, "reported": False}

    def passed_deadline(signum, frame):
        if state["message"] is None:
            state["message"] = (f"{item.nodeid} ran past its deadline of {limit:g} s "
                                f"(SHMCACHE_TEST_DEADLINE_S); its threads then:\n{_stacks()}")
            _stderr.write(f"\n{state['message']}\n")
            _stderr.flush()
        raise TestDeadline(state["message"])

    old = signal.signal(signal.SIGALRM, passed_deadline)
    signal.setitimer(signal.ITIMER_REAL, limit, REPEAT_S)
    faulthandler.dump_traceback_later(limit + BACKSTOP_S, exit=True, file=_stderr)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    state = item.stash.get(_state, None)
    if state is None or state["message"] is None or state["reported"]:
        return
    report = outcome.get_result()
    state["reported"] = True
    if not report.failed:
        report.outcome = "failed"
        report.longrepr = state["message"]
