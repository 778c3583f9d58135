"""CachedLoader's assembling threads end with their pass, as the miss
pool's threads do (_exit_threads): a break stops a batch's per-sample
work at the next sample (not after the whole batch, which nobody will
take); a trainer that exits with a pass open, while a thread runs a
transform's torch calls, exits 0 (a thread in torch as the interpreter
finalizes aborts the process); a SIGKILLed trainer leaves no process.

Each test runs a trainer of its own: a script, spawned, whose loop breaks
or which exits or is killed."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import PYTHONPATH, wait_for  # noqa: E402
from test_loader_misses import gone, kill_group  # noqa: E402

HERE = Path(__file__).resolve().parent

# The trainers' shared part: a map-style dataset of small fixed rows and a
# cache opened from the session the test passes.
COMMON = textwrap.dedent(r'''
    import atexit, os, sys, threading, time
    import numpy as np
    import torch
    from torch.utils.data import Dataset
    from shmcache import DatasetCache
    from shmcache.torch import CachedDataset, CachedLoader

    class Rows(Dataset):
        def __len__(self):
            return 256
        def __getitem__(self, i):
            return np.full(4, i, dtype=np.float32), i

    cds = CachedDataset(Rows(), DatasetCache(int(sys.argv[1])), name="threads-end")

    def loader_threads():
        return [t for t in threading.enumerate() if t.name.startswith("shmcache-loader")]

    started = threading.Event()

    def augment(sample):
        """A per-sample transform of many torch calls (each lets the GIL go)."""
        started.set()
        for _ in range(3000):
            with torch.autograd.profiler.record_function("augment"):
                pass
        return sample
''')


def run(script, session, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHONPATH, str(HERE)]))
    return subprocess.run([sys.executable, "-c", COMMON + textwrap.dedent(script),
                           str(session)], capture_output=True, text=True,
                          timeout=timeout, env=env)


# The first sample of batch 1 is held in the transform until the loop broke
# out (the iterator is gone and closed); then the rest of that batch would
# be transformed for nothing, by a thread that outlives its pass.
BREAK = r'''
    BATCH, HOLD_S = 8, 120
    calls, entered, broke = [], threading.Event(), threading.Event()

    def transform(sample):
        calls.append(broke.is_set())
        if len(calls) == BATCH + 1:      # batch 1's first sample
            entered.set()
            broke.wait(HOLD_S)
        return sample

    loader = CachedLoader(cds, batch_size=BATCH, num_threads=1, prefetch=1,
                          transform=transform)
    for batch in loader:
        assert entered.wait(HOLD_S)
        break
    broke.set()
    for t in loader_threads():
        t.join(HOLD_S)
    print("alive after the break:", [t.name for t in loader_threads()])
    print("transformed after the break:", sum(calls))
'''


def test_a_break_stops_the_batch_being_assembled_at_its_next_sample(server, session):
    out = run(BREAK, session)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert "alive after the break: []" in out.stdout, said
    assert "transformed after the break: 0" in out.stdout, said


# A trainer that leaves its loop with the iterator kept (a script's last
# line) while the loader's thread runs a transform of many torch calls
# (each lets the GIL go). The joins get no time (the exit hook's
# EXIT_JOIN_S, a budget other threads of the process may take, and the
# pass's own): what keeps the thread out of torch as the interpreter
# finalizes is the torch section it runs in. The check hook, registered
# first, runs last.
EXIT = r'''
    from shmcache.torch import _exit_threads as x, _pipeline
    atexit.register(lambda: print("at exit", x.exiting(), flush=True))
    x.EXIT_JOIN_S = _pipeline._JOIN_S = 0.0
    x.SECTION_CLOSE_S = 120.0

    it = iter(CachedLoader(cds, batch_size=64, num_threads=1, prefetch=1,
                           transform=augment))
    next(it)
    started.clear()
    assert started.wait(120)          # batch 1 is being transformed
    print("last statement", flush=True)
'''


def test_a_trainer_exiting_while_a_thread_transforms_a_batch_exits_0(server, session):
    # Without the sections the thread went on through the batch as the
    # interpreter finalized: "terminate called without an active
    # exception", in 5 of 5 runs.
    for _ in range(3):
        out = run(EXIT, session)
        said = out.stdout + out.stderr
        assert "terminate called" not in said, said
        assert out.returncode == 0, said
        assert "last statement\nat exit True\n" in out.stdout, said


KILLED = r'''

    it = iter(CachedLoader(cds, batch_size=16, num_workers=2, transform=augment))
    next(it)
    started.clear()
    assert started.wait(120)
    print(" ".join(str(p.pid) for p in __import__("multiprocessing").active_children()),
          flush=True)
    sys.stdin.readline()                 # killed meanwhile
'''


def test_a_trainer_killed_while_a_thread_transforms_leaves_no_process(server, session):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHONPATH, str(HERE)]))
    proc = subprocess.Popen([sys.executable, "-c", COMMON + textwrap.dedent(KILLED),
                             str(session)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    pids = []
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids, "the trainer's miss workers"
        proc.kill()
        proc.wait()
        wait_for(lambda: all(gone(p) for p in pids), timeout=30,
                 what=f"the workers {pids} to end after the trainer's SIGKILL")
    finally:
        kill_group(proc)


# A user's exit hook, registered before the first pass (so it runs after
# shmcache's, which closes the torch sections), runs a pass with workers
# over rows not cached yet: a final evaluation, an export.
LATER_HOOK = r'''
    def evaluate():
        other = CachedDataset(Rows(), DatasetCache(int(sys.argv[1])), name="evaluated")
        n = sum(len(y) for _, y in CachedLoader(other, batch_size=64, num_workers=1))
        print("the later hook's pass read", n, "rows", flush=True)
    atexit.register(evaluate)
    print("the pass read", sum(len(y) for _, y in CachedLoader(cds, batch_size=64,
                                                               num_workers=1)), "rows")
'''


def test_a_pass_a_later_exit_hook_runs_reads_to_its_end(server, session):
    # The miss pool's threads waited at the closed sections' door for the
    # process's end, and the pass for them: the trainer never exited.
    out = run(LATER_HOOK, session, timeout=120)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert "the pass read 256 rows\nthe later hook's pass read 256 rows\n" in out.stdout, said
