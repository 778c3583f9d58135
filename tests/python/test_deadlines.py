"""A hang fails one test, never the suite: the per-test deadline
(deadline.py) fails a test that blocks for good, in a lock or inside a
__del__ that swallows its exception, with its stacks; a test's child that
hangs (bounded_child.py) fails that test with the child's stacks, at its
deadline."""

import shutil

import pytest

from bounded_child import run_in_child
from conftest import inner_pytest

# Blocks for good in a lock acquire: as DataLoader.__del__ in a queue put
# whose lock a signal handler's exception left held.
INNER = """
import threading

class HangsInDel:
    def __del__(self):
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()

def test_blocks_in_a_lock():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()

def test_blocks_in_a_del():
    # Its deadline's exception is swallowed by the __del__ (printed as
    # ignored), and the test then returns: it must fail all the same.
    h = HangsInDel()
    del h

def test_passes():
    pass
"""


def test_a_test_that_hangs_fails_with_its_stacks_and_the_suite_goes_on(tmp_path):
    inner, base = inner_pytest(tmp_path, INNER, SHMCACHE_TEST_DEADLINE_S="2")
    try:
        out, _ = inner.communicate(timeout=300)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.communicate()
        shutil.rmtree(base, ignore_errors=True)
    assert "2 failed, 1 passed" in out, out
    for name in ("test_blocks_in_a_lock", "test_blocks_in_a_del"):
        assert f"test_inner.py::{name} ran past its deadline of 2 s" in out, out
    # The stacks: where the test blocked.
    assert "in test_blocks_in_a_lock" in out and "lock.acquire()" in out, out
    assert "in __del__" in out, out


def test_a_hung_child_fails_the_test_with_the_childs_stacks():
    with pytest.raises(AssertionError) as e:
        run_in_child("""
            import threading
            threading.Event().wait()
            """, deadline=20, grace=10, what="the blocked child")
    text = str(e.value)
    assert text.startswith("the blocked child hung: faulthandler dumped its stacks"), text
    assert 'File "<string>"' in text and "in wait" in text, text


def test_a_child_that_outlives_its_faulthandler_is_killed_at_its_deadline():
    with pytest.raises(AssertionError) as e:
        run_in_child("""
            import threading
            faulthandler.cancel_dump_traceback_later()
            print("blocking", flush=True)
            threading.Event().wait()
            """, deadline=5, grace=2, what="the blocked child")
    text = str(e.value)
    assert text.startswith("the blocked child did not end within its deadline of 5 s"), text
    assert "blocking" in text, text


def test_a_child_reports_what_it_found():
    assert run_in_child("report({'answer': 42})") == {"answer": 42}
    with pytest.raises(AssertionError, match="exited with code 1 and 0 reports"):
        run_in_child("raise ValueError('no')")
