"""The samples CachedDataset reads to name its cache (dataset_identity) are
read on a thread of their own, from a shallow copy of the dataset, and
waited for at most $SHMCACHE_IDENTITY_SECONDS: a dataset whose reads wait
for DataLoader's workers (PyTorch's own test_worker_seed) is read from its
source after one CacheWarning instead of blocking its trainer for good; a
read given up leaves the caller's RNGs as they were; what a read opens
lazily stays the copy's; a handle bound to the thread that opened it
(sqlite3's) still reads."""

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from conftest import wait_for  # noqa: E402
from shmcache import DatasetCache  # noqa: E402
from shmcache.torch import cache_for_dataset  # noqa: E402
from shmcache.torch.dataset_identity import UnknownContents  # noqa: E402

# PyTorch's SynchronizedSeedDataset, in substance: each read waits until
# every worker has read once, and gives the worker's seed.
TRAINER = textwrap.dedent("""
    import multiprocessing as mp
    import warnings
    import torch
    from torch.utils.data import Dataset
    from shmcache import CacheWarning
    from shmcache.torch import CachedDataset, CachedLoader

    class WaitsForTheWorkers(Dataset):
        def __init__(self, workers):
            self.workers = workers
            self.count = mp.Value("i", 0, lock=True)
            self.barrier = mp.Semaphore(0)

        def __len__(self):
            return self.workers

        def __getitem__(self, i):
            with self.count.get_lock():
                self.count.value += 1
                if self.count.value == self.workers:
                    self.barrier.release()
            self.barrier.acquire()
            self.barrier.release()
            return torch.initial_seed()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = CachedDataset(WaitsForTheWorkers(3))
    said = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(said) == 1 and "took more than 1 s" in said[0], said
    seeds = {int(b) for b in CachedLoader(ds, batch_size=1, num_workers=3)}
    assert len(seeds) == 3, seeds
    print("trained")
""")


def test_a_dataset_whose_reads_wait_for_the_workers_trains_from_its_source(
        server, session, tmp_path):
    """Once the trainer blocked for good making the CachedDataset: its
    identity read was the first of the reads that wait for 3."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120,
                       env=dict(server.env, SHMCACHE_SESSION_ID=str(session),
                                SHMCACHE_IDENTITY_SECONDS="1"))
    assert r.returncode == 0 and "trained" in r.stdout, r.stdout + r.stderr


class Held(Dataset):
    """Reads wait until the test lets them go (at most 60 s, so that a
    read never given up ends too)."""
    root = "held"

    def __init__(self):
        self.go = threading.Event()
        self.reads = []

    def __len__(self):
        return 4

    def __getitem__(self, i):
        self.reads.append(i)
        self.go.wait(60)
        return np.full(2, i, dtype=np.float32)


def _identity_reader_ended():
    return not any(t.name == "shmcache-identity" for t in threading.enumerate())


def test_a_read_given_up_leaves_the_callers_rngs_as_they_were(session, monkeypatch):
    monkeypatch.setenv("SHMCACHE_IDENTITY_SECONDS", "0.3")
    torch.manual_seed(11)
    np.random.seed(12)
    random.seed(13)
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    ds = Held()
    with pytest.raises(UnknownContents, match="took more than 0.3 s.*pass name="):
        cache_for_dataset(ds, DatasetCache(session))
    # The read still running seeded the RNGs for its sample; they are the
    # caller's again, and stay so once it ends.
    assert torch.equal(torch.get_rng_state(), before[0])
    ds.go.set()
    wait_for(_identity_reader_ended, what="the abandoned read to end")
    assert torch.equal(torch.get_rng_state(), before[0])
    assert (np.random.get_state()[1] == before[1]).all()
    assert random.getstate() == before[2]
    assert ds.reads == [0]      # nothing more was read once given up


class HeldThenDraws(Held):
    """A read that waits past the bound, then draws (an augmentation after a
    slow open) and records what it drew."""
    root = "held-then-draws"

    def __init__(self, draw):
        super().__init__()
        self.draw, self.drew = draw, []

    def __getitem__(self, i):
        self.go.wait(60)
        self.drew.append(self.draw())
        return np.full(2, i, dtype=np.float32)


class WorkerSeeds(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return torch.initial_seed()


def seed_as_a_script_does():
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)


def what_the_trainer_draws():
    """Its DataLoader workers' seeds and its next draws of Python's and
    numpy's RNGs."""
    seeds = sorted(int(s) for s in DataLoader(WorkerSeeds(), batch_size=1, num_workers=2,
                                              multiprocessing_context="fork"))
    return seeds, random.random(), float(np.random.rand())


def draw_torch():
    return float(torch.rand(1))


def draw_numpy():
    return float(np.random.rand())


def draw_again_past_a_bare_except():
    """A dataset's retry: its first draw stopped, it tries once more."""
    try:
        return random.random()
    except:  # noqa: E722 -- what the dataset does
        return random.random()


def seed_numpy():
    """A per-sample seed of numpy's global RNG (np.random.seed(index)), a
    module function of numpy's, not a method of its RandomState."""
    np.random.seed(1)
    return 0.0


@pytest.mark.parametrize("draw", [draw_torch, random.random, draw_numpy,
                                  draw_again_past_a_bare_except, seed_numpy],
                         ids=["torch", "random", "numpy", "bare-except", "numpy-seed"])
def test_a_read_given_up_draws_nothing_from_the_trainers_rngs_once_let_go(
        session, monkeypatch, draw):
    """The sample being read when the caller gave up goes on on its thread
    once let go; a draw it makes then would come from the trainer's RNGs,
    between the trainer's own draws (torch's default generator gives the
    DataLoader workers' seeds): the read stops at its first call into
    torch or into Python's or numpy's global RNG instead. It drew there,
    and the trainer's workers got other seeds."""
    seed_as_a_script_does()
    expected = what_the_trainer_draws()
    monkeypatch.setenv("SHMCACHE_IDENTITY_SECONDS", "0.3")
    ds = HeldThenDraws(draw)
    with pytest.raises(UnknownContents, match="took more than 0.3 s"):
        cache_for_dataset(ds, DatasetCache(session))
    seed_as_a_script_does()
    ds.go.set()
    wait_for(_identity_reader_ended, what="the abandoned read to end")
    assert what_the_trainer_draws() == expected
    assert ds.drew == []


def test_a_read_interrupted_by_ctrl_c_is_given_up(session, monkeypatch):
    """Ctrl-C while CachedDataset waits for its identity read (a notebook's
    interrupted cell): the read is given up as at the bound. It went on,
    read every sample and put back the RNGs of before the call at each,
    undoing the seeds the user set after the interrupt."""
    seed_as_a_script_does()
    expected = what_the_trainer_draws()
    monkeypatch.setenv("SHMCACHE_IDENTITY_SECONDS", "60")
    ds = Held()
    main = threading.main_thread().ident

    def interrupt():
        assert wait_for(lambda: ds.reads, what="the identity read to start")
        signal.pthread_kill(main, signal.SIGINT)
    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        cache_for_dataset(ds, DatasetCache(session))
    seed_as_a_script_does()
    ds.go.set()
    wait_for(_identity_reader_ended, what="the interrupted read to end")
    assert what_the_trainer_draws() == expected
    assert ds.reads == [0]      # nothing more was read once given up


class OpensLazily(Dataset):
    """Opens its handle at the first read, as datasets that must not carry
    one across fork do."""
    root = "opens-lazily"

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if not hasattr(self, "opened_by"):
            self.opened_by = threading.get_ident()
        return np.full(2, i, dtype=np.float32)


class InSqlite(Dataset):
    """Rows in an sqlite3 database opened when made: its connection serves
    only the thread that opened it."""
    root = "in-sqlite"

    def __init__(self):
        self.db = sqlite3.connect(":memory:")
        self.db.execute("create table rows (i integer, v real)")
        self.db.executemany("insert into rows values (?, ?)", [(i, i * 0.5) for i in range(6)])

    def __len__(self):
        return 6

    def __getitem__(self, i):
        (v,) = self.db.execute("select v from rows where i = ?", (i,)).fetchone()
        return np.full(2, v, dtype=np.float32)


def test_what_a_read_opens_stays_the_copys_and_a_thread_bound_handle_reads(session):
    ds = OpensLazily()
    a = cache_for_dataset(ds, DatasetCache(session)).name
    assert not hasattr(ds, "opened_by")      # the trainer opens its own, later
    assert cache_for_dataset(OpensLazily(), DatasetCache(session)).name == a
    db = InSqlite()
    b = cache_for_dataset(db, DatasetCache(session)).name   # no UnknownContents
    assert b != a and cache_for_dataset(InSqlite(), DatasetCache(session)).name == b
    assert db[3][0] == 1.5


def test_a_bound_that_is_not_a_positive_number_is_refused(session, monkeypatch):
    monkeypatch.setenv("SHMCACHE_IDENTITY_SECONDS", "soon")
    with pytest.raises(ValueError, match="SHMCACHE_IDENTITY_SECONDS must be a positive "
                                         "number of seconds, got 'soon'"):
        cache_for_dataset(OpensLazily(), DatasetCache(session))


class ForksOnItsFirstRead(Dataset):
    """Its first read forks a process (a pool a dataset starts lazily),
    which says whether it runs under a profile function."""
    root = "forks-on-its-first-read"

    def __init__(self):
        self.child_said = []     # shared with the shallow copy the read reads

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if not self.child_said:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, repr(sys.getprofile()).encode()[:200])
                os._exit(0)
            os.close(w)
            with os.fdopen(r, "rb") as f:
                self.child_said.append(f.read().decode())
            os.waitpid(pid, 0)
        return np.full(2, i, dtype=np.float32)


def test_a_process_the_read_forks_runs_without_its_stop(session):
    """The reading thread's stop (a profile function) is no part of a
    process its dataset forks: that process would run every call profiled
    (2-3x a loop of small Python calls) for its life, and, forked once the
    read was given up, fail at its every torch call."""
    ds = ForksOnItsFirstRead()
    cache_for_dataset(ds, DatasetCache(session))
    assert ds.child_said == ["None"]
