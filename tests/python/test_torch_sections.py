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

SCRIPT = textwrap.dedent(r'''
    import atexit, sys, threading, time
    from shmcache.torch import _exit_threads as x

    def check():   # registered before the module's hook: runs after it
        assert x.exiting()
        frame = sys._current_frames()[w.t.ident]
        where = []
        while frame is not None:
            where.append(frame.f_code.co_name)
            frame = frame.f_back
        print("the thread waits in", where)
        try:
            with x.torch_section():
                pass
            print("the main thread entered a closed section")
        except RuntimeError as e:
            print("refused:", e, flush=True)
    atexit.register(check)

    class Waits:
        """A thread in a torch section, slice after slice, for good."""
        def __init__(self):
            self.slices = 0
            self.t = threading.Thread(target=self.run, daemon=True)
            x.end_at_exit(self)
            self.t.start()
        def run(self):
            with x.torch_section():
                while True:
                    time.sleep(0.001)   # a slice
                    self.slices += 1
                    x.between_slices()
        def stop(self):
            pass                        # as a wait for another rank: no end
        def started_threads(self):
            return [self.t]

    x.EXIT_JOIN_S = 0.2
    w = Waits()
    while not w.slices:
        time.sleep(0.001)
''')


def test_a_thread_in_a_section_stops_between_slices_at_exit():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=PYTHONPATH))
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert "the thread waits in ['wait', 'between_slices', 'run'" in out.stdout, said
    assert "refused: the interpreter is exiting" in out.stdout, said
