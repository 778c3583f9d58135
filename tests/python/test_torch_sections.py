"""The torch sections of shmcache.torch._exit_threads: once the exit hook
closed them, a thread of ours waiting on torch in slices stops between two
slices, outside torch, and the process still exits 0; the thread that
finalizes is refused instead of stopped (it would wait for good).

The script's own exit hook is registered before the module's (at the
first end_at_exit), so it runs after it. The thread's slices are sleeps:
test_partitioned_exit.py has the real thing (gloo's waits for a rank)."""

import os
import subprocess
import sys
import textwrap

from conftest import PYTHONPATH

# What both scripts share: a thread of ours (run() in a subclass), and
# where a thread is (its frames' names, innermost first).
OURS = textwrap.dedent(r'''
    import atexit, sys, threading, time
    from shmcache.torch import _exit_threads as x

    def where(t):
        frame, names = sys._current_frames()[t.ident], []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        return names

    class Ours:
        def __init__(self):
            self.count = 0
            self.t = threading.Thread(target=self.run, daemon=True)
            x.end_at_exit(self)
            self.t.start()
        def stop(self):
            pass                        # as a wait for another rank: no end
        def started_threads(self):
            return [self.t]
''')

SCRIPT = OURS + textwrap.dedent(r'''
    def check():   # registered before the module's hook: runs after it
        assert x.exiting()
        print("the thread waits in", where(w.t))
        try:
            with x.torch_section():
                pass
            print("the main thread entered a closed section")
        except RuntimeError as e:
            print("refused:", e, flush=True)
    atexit.register(check)

    class Waits(Ours):
        """A thread in a torch section, slice after slice, for good."""
        def run(self):
            with x.torch_section():
                while True:
                    time.sleep(0.001)   # a slice
                    self.count += 1
                    x.between_slices()

    x.EXIT_JOIN_S = 0.2
    w = Waits()
    while not w.count:
        time.sleep(0.001)
''')


def test_a_thread_in_a_section_stops_between_slices_at_exit():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=PYTHONPATH))
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert "the thread waits in ['wait', 'between_slices', 'run'" in out.stdout, said
    assert "refused: the interpreter is exiting" in out.stdout, said


# A thread that runs torch code it does not control between waits, as the
# miss pool's DataLoader thread does: each next() of a DataLoader enters
# and leaves a record_function (torch calls that let the GIL go) and frees
# its handle tensor (which lets the GIL go too). A thread that takes the
# GIL back in there as the interpreter finalizes aborts the process; with
# a plain thread (no waits_are_slices()) this script did, 4 runs in 10
# (the test runs it 5 times).
CALLS = OURS + textwrap.dedent(r'''
    import torch

    def check():   # registered before the module's hook: runs after it
        while where(w.t)[:2] != ["wait", "_enter_section"]:
            time.sleep(0.001)   # until it stops (its wait returns), or it aborted us
        print("the thread waits in", where(w.t)[:4], flush=True)
    atexit.register(check)

    class Calls(Ours):
        def run(self):
            with x.waits_are_slices():
                while True:
                    time.sleep(0.0005)          # a wait for a worker
                    for _ in range(200):        # next()s' torch calls
                        with torch.autograd.profiler.record_function("next"):
                            self.count += 1

    x.EXIT_JOIN_S = 0.0
    w = Calls()
    while w.count < 100 and w.t.is_alive():
        time.sleep(0.001)
''')


def test_a_thread_of_torch_calls_stops_at_a_wait_at_exit():
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", CALLS], capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, PYTHONPATH=PYTHONPATH))
        said = out.stdout + out.stderr
        assert out.returncode == 0, said
        assert "terminate called" not in said, said
        assert "the thread waits in ['wait', '_enter_section', '__call__', 'run']" \
            in out.stdout, said


def test_a_user_profile_function_still_sees_a_sectioned_thread():
    import threading
    import torch
    from shmcache.torch import _exit_threads as x

    seen, after = [], []

    def user(frame, event, arg):
        seen.append(event)

    def run():
        sys.setprofile(user)
        with x.waits_are_slices():
            torch.zeros(1)
        after.append(sys.getprofile())
        sys.setprofile(None)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert "c_call" in seen and "c_return" in seen, seen
    assert after == [user]


def test_a_user_profile_function_raising_in_a_wait_keeps_the_sections_count():
    """Python drops a profile function that raises, and the sectioned
    thread's with it: dropped in a wait, where the thread is outside its
    section, the block's end must not leave the section again (the count
    went to -1: the exit hook then waited its whole bound for a count of
    0, or found 0 with a thread inside torch)."""
    import threading
    import time
    from shmcache.torch import _exit_threads as x

    def user(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") == "sleep":
            raise RuntimeError("the user's profile function fails")

    def run():
        sys.setprofile(user)
        with x.waits_are_slices():
            try:
                time.sleep(0.001)
            except RuntimeError:
                pass
        sys.setprofile(None)

    inside = x._inside
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert x._inside == inside
