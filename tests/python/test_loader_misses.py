"""CachedLoader's misses, computed on DataLoader's worker machinery: no
deadlock when every row comes back from the workers, workers that end with
their trainer (SIGKILL included), nothing computed in the trainer after a
break, prompt timeout/break, tensor indices, DataLoader's seed order, and
samples the cache cannot hold."""

import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from bounded_child import run_in_child  # noqa: E402
from conftest import PYTHONPATH, wait_for  # noqa: E402
from shmcache import CacheWarning, DatasetCache  # noqa: E402
import shmcache.torch._misses  # noqa: E402
import shmcache.torch._pipeline  # noqa: E402
from shmcache._read_into import ROW_OTHER_LAYOUT, ROW_READ  # noqa: E402
from shmcache.async_put import AsyncPutter  # noqa: E402
from shmcache.torch._misses import Closed, MissWorkers  # noqa: E402
from shmcache.torch import CachedDataset, CachedLoader  # noqa: E402
from test_cached_loader import (Rows, assert_same_batches, loader_threads,  # noqa: E402
                                no_leftovers, reference)

HERE = Path(__file__).resolve().parent

# A row held back for HOLD_S (until the test releases it) stands for a slow
# one. Nothing but a wait on that row can make leaving take HOLD_S, so the
# bounds below are far under it and far over what a loaded machine needs.
HOLD_S = 90
PROMPT_S = 30


def child_env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHONPATH, str(HERE)]))


def gone(pid):
    """True once pid has exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ---- no deadlock: every row of a 65536-row batch comes back from workers ---

BIG_BATCH = """
import sys, warnings
import numpy as np
from torch.utils.data import Dataset
from shmcache import DatasetCache
from shmcache.torch import CachedDataset, CachedLoader

class Small(Dataset):
    def __len__(self): return 200000
    def __getitem__(self, i): return np.full(4, i, dtype=np.int64), i % 7

warnings.simplefilter("ignore")
cds = CachedDataset(Small(), DatasetCache(int(sys.argv[1])))
print("opened", flush=True)
sys.stdin.readline()                 # the test kills the daemon meanwhile
ids = range(100000, 165536)           # ids past 2**16: tasks over 64 KB
(x, y), = list(CachedLoader(cds, batch_size=65536, sampler=ids, num_workers=2))
assert x.shape == (65536, 4) and int(x[12345, 0]) == 112345 and int(y[8]) == 100008 % 7
print("done", flush=True)
"""


def test_no_deadlock_when_every_row_comes_back_from_the_workers(server, session):
    proc = subprocess.Popen([sys.executable, "-c", BIG_BATCH, str(session)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env(), start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "opened"
        server.kill()                      # every put fails: rows come back
        out, _ = proc.communicate("go\n", timeout=120)
        assert proc.returncode == 0 and "done" in out, out
    except subprocess.TimeoutExpired:
        pytest.fail("CachedLoader hung on a 65536-row batch of returned rows")
    finally:
        kill_group(proc)


# ---- workers end with a SIGKILLed trainer -----------------------------------

# A trainer whose 2 miss workers compute (slowly) when it is killed; its
# workers started by the method argv[2] names, torch's default without one.
TRAINER = """
import multiprocessing as mp, sys, time
import numpy as np
from torch.utils.data import Dataset
from shmcache import DatasetCache
from shmcache.torch import CachedDataset, CachedLoader

class Slow(Dataset):
    def __len__(self): return 4096
    def __getitem__(self, i):
        time.sleep(0.02)
        return np.full(8, i, dtype=np.float32), i

if __name__ == "__main__":
    cds = CachedDataset(Slow(), DatasetCache(int(sys.argv[1])))
    it = iter(CachedLoader(cds, batch_size=16, num_workers=2,
                           multiprocessing_context=sys.argv[2] if len(sys.argv) > 2 else None))
    next(it)
    print(" ".join(str(p.pid) for p in mp.active_children()), flush=True)
    sys.stdin.readline()                  # killed while the workers compute
"""


def kill_trainer_and_wait_for_its_workers(args, what):
    """Starts the trainer `args` (it prints its 2 workers' pids), SIGKILLs
    it and waits up to 5 s for its workers to end."""
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env())
    pids = []
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, pids
        proc.kill()
        proc.wait()
        wait_for(lambda: all(gone(p) for p in pids), timeout=5,
                 what=f"{what} {pids} to end after the trainer's SIGKILL")
    finally:
        proc.kill()
        proc.wait()
        for p in pids:
            if not gone(p):
                os.kill(p, signal.SIGKILL)


def test_workers_end_within_5s_of_the_trainers_sigkill(server, session):
    kill_trainer_and_wait_for_its_workers([sys.executable, "-c", TRAINER, str(session)],
                                          "workers")


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_workers_of_any_start_method_end_with_the_trainers_sigkill(
        server, session, tmp_path, start):
    """A forkserver worker's parent is the fork server, which outlives the
    trainer: the workers watched only their parent and computed on, for good
    (a plain DataLoader's do too). They watch the trainer itself."""
    script = tmp_path / "trainer.py"      # a file: spawned workers import Slow
    script.write_text(TRAINER)
    kill_trainer_and_wait_for_its_workers([sys.executable, str(script), str(session), start],
                                          f"{start} workers")


# ---- nothing is computed in the trainer after a break -------------------------

class Recorded(Dataset):
    """Rows that record, as files, which process computed them."""

    def __init__(self, n, where):
        self.n, self.where = n, str(where)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        Path(self.where, f"{i}.{os.getpid()}").touch()
        return np.full(16, i, dtype=np.float32), i


def test_a_break_computes_nothing_in_the_trainer(server, session, tmp_path):
    where = tmp_path / "computed"
    where.mkdir()
    ds = Recorded(2048, where)
    rounds = []
    for k in range(8):
        cds = CachedDataset(ds, DatasetCache(session), name=f"round-{k}")
        rounds.append(cds)
        it = iter(CachedLoader(cds, batch_size=8, num_workers=2, num_threads=8,
                               prefetch=32))
        next(it)
        # A training step while the threads cycle through batches of misses.
        done = len(list(where.iterdir()))
        wait_for(lambda: len(list(where.iterdir())) >= done + 96,
                 what="the workers to compute more rows")
        it.close()
        del it
        wait_for(no_leftovers, what="loader threads and workers to end")
    computed_by = {int(f.name.split(".")[1]) for f in where.iterdir()}
    assert os.getpid() not in computed_by
    # The workers put the rows they computed: the trainer's writer queued
    # none (its counters, not the process's threads: an earlier test's
    # idle writer may still be alive).
    queued = [cds.stats().async_puts["queued"] for cds in rounds]
    assert queued == [0] * 8, queued


class Held(Dataset):
    """Row i waits until the file `open` exists in `where` (at most
    HOLD_S) for i >= 8; files, not events: rows are computed in workers."""

    def __init__(self, where):
        self.where = str(where)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        deadline = time.monotonic() + HOLD_S
        while i >= 8 and not os.path.exists(os.path.join(self.where, "open")) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        return np.full(4, i, dtype=np.float32)


def test_close_while_a_worker_computes_returns_and_ends_the_workers(server, session,
                                                                     tmp_path):
    """close() while a worker computes a batch returns at once, the batch
    waiting raises Closed, nothing more is computed, and the workers end
    with no garbage collection to help (the workers of a closed CachedLoader
    once lived on until one ran)."""
    cds = CachedDataset(Held(tmp_path), DatasetCache(session), name="held")
    workers = MissWorkers(cds, 2)
    assert len(workers.compute(range(4))) == 4
    wait_for(lambda: len(workers.pids) == 2, what="both workers to start")
    assert {p.pid for p in mp.active_children()} == set(workers.pids)
    gc.disable()
    try:
        held = workers.submit(0, [9])            # held until `open` exists
        t0 = time.monotonic()
        workers.close()
        assert time.monotonic() - t0 < PROMPT_S
        with pytest.raises(Closed):
            held.result(PROMPT_S)
        with pytest.raises(Closed):
            workers.compute([5])
        (tmp_path / "open").touch()
        wait_for(lambda: not mp.active_children(), timeout=30,
                 what="the workers to end with no garbage collection")
    finally:
        gc.enable()
        (tmp_path / "open").touch()
    cds.flush(10)


def test_the_pool_s_result_reader_ends_with_the_pool_not_at_its_next_poll(
        server, session, monkeypatch):
    """The thread reading the workers' results ends when close() stops the
    idle workers, woken by them, not when its poll for dead workers times
    out: every pass ended with that wait (0.1 s, on each cold epoch). A
    poll stretched past the test's bound shows which of the two ends it."""
    monkeypatch.setattr(shmcache.torch._misses, "POLL_S", HOLD_S)
    cds = CachedDataset(Rows(8, "tuple"), DatasetCache(session))
    workers = MissWorkers(cds, 2)
    assert len(workers.compute(range(8))) == 8
    reader = [t for t in workers.started_threads() if t.name == "shmcache-miss-results"]
    assert len(reader) == 1
    workers.close()
    reader[0].join(PROMPT_S)
    assert not reader[0].is_alive(), "the result reader waited out its poll"
    wait_for(no_leftovers, what="loader threads and workers to end")
    cds.flush(10)


# ---- timeout= and break return promptly ----------------------------------------


class GatedRows(Dataset):
    """Rows 0 and 1 (the first batch) are quick; each other row records
    that it started (a file `started.<i>`) and is held until the file
    `open` exists in `where`, for at most HOLD_S. Files, not events: the
    rows may be computed in worker processes."""

    def __init__(self, where):
        self.where = str(where)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 2:
            Path(self.where, f"started.{i}").touch()
            deadline = time.monotonic() + HOLD_S
            while not os.path.exists(os.path.join(self.where, "open")) and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
        return np.full(4, i, dtype=np.float32)


def test_timeout_raises_on_time_and_leaving_is_prompt(server, session, tmp_path):
    # The rows of the first batch but two are held in the workers (timeout=
    # needs workers, as in DataLoader's), which end once they are let go.
    cds = CachedDataset(GatedRows(tmp_path), DatasetCache(session), name="gated")
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="timed out"):
            for _ in CachedLoader(cds, batch_size=8, timeout=2, num_threads=2,
                                  num_workers=2):
                pass
        raised = time.monotonic() - t0
        gc.collect()
        left = time.monotonic() - t0 - raised
        # Not before the timeout; not when the held rows come back.
        assert 2 <= raised < PROMPT_S, raised
        assert left < PROMPT_S, f"leaving the except block took {left:.1f} s"
    finally:
        (tmp_path / "open").touch()
        cds.flush(10)
    wait_for(no_leftovers, timeout=PROMPT_S, what="the loader threads and workers to end")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_break_returns_while_rows_are_still_being_computed(server, session,
                                                             tmp_path, num_workers):
    # Named: the default name would compute a few (held) rows to tell the
    # dataset's contents.
    cds = CachedDataset(GatedRows(tmp_path), DatasetCache(session), name="gated")
    it = iter(CachedLoader(cds, batch_size=2, num_workers=num_workers,
                           num_threads=4, prefetch=4))
    next(it)
    wait_for(lambda: list(tmp_path.glob("started.*")), what="a row of batch 1 to start")
    try:
        t0 = time.monotonic()
        del it                                   # an early break
        gc.collect()
        took = time.monotonic() - t0
        # The rows in progress are still held: the break did not wait for them.
        assert took < PROMPT_S, f"the break took {took:.1f} s"
    finally:
        (tmp_path / "open").touch()
    wait_for(no_leftovers, what="loader threads and workers to end")
    cds.flush(10)


# ---- tensor indices ----------------------------------------------------------------

def test_tensor_indices_from_samplers(server, session):
    ds = Rows(40, "tuple")
    cds = CachedDataset(ds, DatasetCache(session))
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    want = reference(ds, session, batch_size=8, sampler=perm)
    assert_same_batches(list(CachedLoader(cds, batch_size=8, sampler=perm)), want)
    tensors = [perm[k:k + 8] for k in range(0, 40, 8)]
    want = reference(ds, session, batch_sampler=tensors)
    assert_same_batches(list(CachedLoader(cds, batch_sampler=tensors)), want)
    assert cds.flush(10)


# ---- the shuffle seed drawn where DataLoader draws it --------------------------------

def test_shuffles_match_dataloader_when_iterators_interleave(server, session):
    ds = Rows(48, "tuple")
    ref = CachedDataset(ds, DatasetCache(session), name="ref")
    cds = CachedDataset(ds, DatasetCache(session), name="mine")
    def zipped(loader):
        torch.manual_seed(5)
        return [b for pair in zip(loader, loader) for b in pair]

    def rand_between(loader):
        torch.manual_seed(6)
        it = iter(loader)
        torch.rand(3)
        return list(it)

    for run in (zipped, rand_between):
        want = run(DataLoader(ref, batch_size=8, shuffle=True))
        got = run(CachedLoader(cds, batch_size=8, shuffle=True))
        assert_same_batches(got, want)
    assert cds.flush(10) and ref.flush(10)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_pin_memory_without_cuda_warns_as_dataloader_and_goes_on(server, session):
    """Unpinned batches, and DataLoader's own warnings about it (torch
    1.13's: none, so a script run with warnings as errors goes on)."""
    cds = CachedDataset(Rows(8, "tuple"), DatasetCache(session))
    pins = []
    for make in (DataLoader, CachedLoader):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make(cds, batch_size=4, pin_memory=True)
            got = list(loader)
        assert len(got) == 2 and not got[0][0].is_pinned()
        pins.append([str(w.message) for w in caught if "pin" in str(w.message)])
    assert pins[1] == pins[0]
    if not pins[0]:     # as torch 1.13's DataLoader: nothing to turn into an error
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader = CachedLoader(cds, batch_size=4, pin_memory=True)
            assert len(list(loader) + list(loader)) == 4
    assert cds.flush(10)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_pin_memory_without_cuda_leaves_the_seeded_shuffle_as_dataloader_s(server, session):
    """Finding the warnings DataLoader gives there starts a DataLoader pass,
    which draws its base seed from torch's global generator: the first
    CachedLoader(pin_memory=True) of a process once moved the trainer's
    torch.manual_seed stream by one draw, so its shuffled order (and every
    later random number) was not DataLoader's."""
    from shmcache.torch import _device
    cds = CachedDataset(Rows(32, "tuple"), DatasetCache(session))
    orders = []
    for make in (DataLoader, CachedLoader):
        _device._dataloader_pin_warnings.cache_clear()   # as a process's first loader
        torch.manual_seed(7)
        loader = make(cds, batch_size=4, shuffle=True, pin_memory=True)
        orders.append([b[1].tolist() for b in loader] + [torch.rand(2).tolist()])
    assert orders[1] == orders[0]
    assert cds.flush(10)


# ---- samples the cache cannot hold ------------------------------------------------

class Awkward(Dataset):
    """complex64 columns, 1,100 features, 300-byte feature names."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 24

    def __getitem__(self, i):
        if self.kind == "complex":
            return np.full(3, i + 1j, dtype=np.complex64), i
        if self.kind == "features":
            return {f"f{k}": np.float32(i + k) for k in range(1100)}
        return {"n" * 300: np.full(2, i, dtype=np.float32), "label": i}


@pytest.mark.parametrize("kind", ["complex", "features", "long_names"])
def test_every_sample_dataloader_delivers(server, session, kind):
    ds = Awkward(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        want = reference(ds, session, batch_size=8, num_workers=2)
    cds = CachedDataset(ds, DatasetCache(session))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = list(CachedLoader(cds, batch_size=8, num_workers=2))
        again = list(CachedLoader(cds, batch_size=8, num_workers=2))
        assert cds.flush(10)
    assert_same_batches(got, want)
    assert_same_batches(again, want)
    cw = [w for w in caught if issubclass(w.category, CacheWarning)]
    # complex64 is a column type; the others are delivered after one warning.
    assert len(cw) == (0 if kind == "complex" else 1), [str(w.message) for w in cw]


class TwoShapes(Dataset):
    """Rows 0..63 of one shape, the rest of another."""
    root = "two-shapes"

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((4 if i < 64 else 6, 2), i, dtype=np.float32), i


def test_a_stored_row_of_another_layout_is_read_back_as_columns(
        server, session, monkeypatch):
    # The layout is learned from the first batch (rows of 4 x 2); batch 4
    # (rows 64.., 6 x 2) starts once batch 0 was taken, so its rows, stored
    # by a worker, are read back into the buffers of the learned layout,
    # which they do not fit: they come back as columns and the batch is
    # collated sample by sample, as DataLoader(CachedDataset) makes it.
    def as_list(samples):
        return [list(s) for s in samples]
    uncounted = []
    real = DatasetCache.fill_batch

    def spy(self, ids, out, columns, threads, codes, count=True):
        got = real(self, ids, out, columns, threads, codes, count)
        if not count:
            uncounted.append((list(ids), got.tolist()))
        return got
    monkeypatch.setattr(DatasetCache, "fill_batch", spy)
    want = reference(TwoShapes(96), session, batch_size=16, collate_fn=as_list)
    cds = CachedDataset(TwoShapes(96), DatasetCache(session), async_puts=False)
    got = list(CachedLoader(cds, batch_size=16, num_workers=2, collate_fn=as_list))
    assert_same_batches(got, want)
    st = cds.stats()
    assert (st.misses, st.hits) == (96, 0), st
    assert [codes for ids, codes in uncounted if ids[0] == 64] == [[ROW_OTHER_LAYOUT] * 16]


# ---- counters: each read counted once (issue 36) ----------------------------

def test_a_cold_epoch_reads_the_rows_workers_stored_into_the_batch_uncounted(
        server, session, monkeypatch):
    # Once the row layout is known, the rows a worker stored are read from
    # the cache straight into the batch's buffers: one uncounted native read
    # per run of batch positions (not row by row as columns). The batches
    # are DataLoader(CachedDataset)'s; the counters say n misses, 0 hits.
    n, bs = 192, 16
    uncounted = []
    real = DatasetCache.fill_batch

    def spy(self, ids, out, columns, threads, codes, count=True):
        if not count:
            uncounted.append(len(ids))
        return real(self, ids, out, columns, threads, codes, count)
    monkeypatch.setattr(DatasetCache, "fill_batch", spy)
    want = reference(Rows(n, "tuple"), session, batch_size=bs)
    cds = CachedDataset(Rows(n, "tuple"), DatasetCache(session), async_puts=False)
    got = list(CachedLoader(cds, batch_size=bs, num_workers=2))
    assert_same_batches(got, want)
    st = cds.stats()
    assert (st.misses, st.hits) == (n, 0), st
    # The batches assembled before the first one taught the layout (at
    # most the 2 x 2 in flight then) read back as columns; the rest so.
    assert sum(uncounted) >= n - 4 * bs, uncounted


def test_batches_sent_before_the_layout_was_known_read_their_rows_into_the_buffers(
        server, session, monkeypatch):
    # prefetch_factor * num_workers = 8 batches go to the workers before
    # the first comes back with the row layout. Each of them reads one row
    # back as columns to learn the layout and the rest straight into its
    # buffers (issue 36: on a 16-worker host every batch of a 2,000-row
    # epoch was sent before the layout was known, and every row was read
    # back as columns, into fresh memory, and copied again). Counters and
    # batches as DataLoader(CachedDataset)'s.
    n, bs = 192, 8
    into, as_columns = [], []
    real_fill, real_columns = DatasetCache.fill_batch, DatasetCache.get_batch_columns

    def fill_spy(self, ids, out, columns, threads, codes, count=True):
        got = real_fill(self, ids, out, columns, threads, codes, count)
        if not count:
            into.append(int((got == ROW_READ).sum()))
        return got

    def columns_spy(self, ids, copy=True, count=True):
        ids = list(ids)
        if not count:
            as_columns.append(len(ids))
        return real_columns(self, ids, copy, count)
    monkeypatch.setattr(DatasetCache, "fill_batch", fill_spy)
    monkeypatch.setattr(DatasetCache, "get_batch_columns", columns_spy)
    want = reference(Rows(n, "tuple"), session, batch_size=bs)
    cds = CachedDataset(Rows(n, "tuple"), DatasetCache(session), async_puts=False)
    got = list(CachedLoader(cds, batch_size=bs, num_workers=2, prefetch_factor=4))
    assert_same_batches(got, want)
    st = cds.stats()
    assert (st.misses, st.hits) == (n, 0), st
    assert as_columns and set(as_columns) == {1}, as_columns
    assert sum(into) + len(as_columns) == n, (into, as_columns)


class HeldPastHalf(Dataset):
    """64 rows; row i >= 32 records that it started (a file `started.<i>`)
    and is held until the file `open` exists in `where`, for at most
    HOLD_S (files: rows are computed in workers)."""

    def __init__(self, where):
        self.where = str(where)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 32:
            Path(self.where, f"started.{i}").touch()
            deadline = time.monotonic() + HOLD_S
            while not os.path.exists(os.path.join(self.where, "open")) and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
        return np.full((3, 8, 8), i, dtype=np.float32), i % 10


class Halves:
    """A batch sampler: batches of 8 of rows 0..31 on its first pass, of
    rows 32..63 on the next ones."""

    def __init__(self):
        self.passes = 0

    def __iter__(self):
        start = 0 if self.passes == 0 else 32
        self.passes += 1
        return iter([list(range(a, a + 8)) for a in range(start, start + 32, 8)])

    def __len__(self):
        return 4


def test_a_batch_holds_no_buffer_while_its_missed_rows_are_computed(
        server, session, tmp_path):
    # The first pass teaches the layout (the loader keeps it) and leaves
    # buffers in the loader's pool; the second pass's rows are all misses,
    # held in the workers. A batch none of whose rows were read holds no
    # buffer while its rows are computed: a cold pass has
    # prefetch_factor * num_workers batches waiting at once, more than the
    # pool keeps, and each buffer held so was fresh memory for the next
    # batch (issue 36). On the old code the waiting batches held theirs.
    cds = CachedDataset(HeldPastHalf(tmp_path), DatasetCache(session), name="held-half")
    loader = CachedLoader(cds, batch_sampler=Halves(), num_workers=2, num_threads=1,
                          prefetch=1)
    first = list(loader)
    assert [int(y[0]) for _, y in first] == [0, 8 % 10, 16 % 10, 24 % 10]
    del first
    pool = loader._state.buffers
    assert pool.in_use() == 0
    it = iter(loader)
    got = []
    consumer = threading.Thread(target=lambda: got.append(next(it)), daemon=True)
    consumer.start()
    try:
        wait_for(lambda: len(list(tmp_path.glob("started.*"))) >= 2,
                 what="both workers to hold a row of the second pass")
        wait_for(lambda: pool.in_use() == 0, timeout=PROMPT_S,
                 what="no batch buffer held while the workers compute")
    finally:
        (tmp_path / "open").touch()
    consumer.join(PROMPT_S)
    assert got and int(got[0][0][0, 0, 0, 0]) == 32
    rest = list(it)
    assert [int(x[0, 0, 0, 0]) for x, _ in rest] == [40, 48, 56]
    st = cds.stats()
    assert (st.misses, st.hits) == (64, 0), st
    del got, rest, it
    wait_for(no_leftovers, what="loader threads and workers to end")
    cds.flush(10)


@pytest.mark.parametrize("kind,workers", [("CachedLoader", 0), ("CachedLoader", 2),
                                          ("DataLoader", 2)])
def test_a_cold_epoch_counts_n_misses_and_no_hit_and_a_warm_one_n_hits(
        server, session, kind, workers):
    # CachedLoader's workers put the rows they compute; the trainer reads
    # them back without counting that read again: a cold epoch over n rows
    # is n misses, 0 hits, in the cache's counters (all processes) as in
    # the loader's; a warm epoch n hits, 0 misses. DataLoader(CachedDataset)
    # likewise.
    n = 96
    cds = CachedDataset(Rows(n, "tuple"), DatasetCache(session), async_puts=False)
    loader = (CachedLoader if kind == "CachedLoader" else DataLoader)(
        cds, batch_size=16, num_workers=workers)
    got = [b for b in loader]
    assert sum(len(y) for _, y in got) == n
    st = cds.stats()
    assert (st.misses, st.hits) == (n, 0), (kind, workers, st)
    if kind == "CachedLoader":
        assert (loader.stats()["misses"], loader.stats()["hits"]) == (n, 0)
    assert_same_batches(list(loader), got)
    st = cds.stats()
    assert (st.misses, st.hits) == (n, n), (kind, workers, st)


def test_a_pass_ends_once_the_rows_it_queued_for_the_cache_are_stored(
        server, session, monkeypatch):
    # With num_workers=0 the misses go to the dataset's background writer.
    # The pass's StopIteration comes once they are stored, as DataLoader's
    # workers store theirs before they exit: stats() right after the epoch
    # and the next epoch see every row. Before, the pass ended with rows
    # still queued, and a check right after it raced the writer. The writer
    # is held inside its put until the pass waits for it.
    monkeypatch.setattr(shmcache.torch._pipeline, "PASS_FLUSH_S", 60.0)  # not what is tested
    n = 64
    cds = CachedDataset(Rows(n, "tuple"), DatasetCache(session), name="pass-flush")
    release = threading.Event()
    real_put = cds.cache.put_encoded

    def put(ids, rows, strict, quiet=False):
        assert release.wait(60), "the pass never waited for the writer"
        return real_put(ids, rows, strict, quiet)
    cds.cache.put_encoded = put
    real_flush = AsyncPutter.flush

    def flush(self, timeout=None):
        release.set()
        return real_flush(self, timeout)
    monkeypatch.setattr(AsyncPutter, "flush", flush)
    loader = CachedLoader(cds, batch_size=16)
    got = list(loader)
    st = cds.stats()
    assert (st.async_puts["pending"], st.async_puts["written"]) == (0, n), st
    assert (st.misses, st.hits, st.mem_rows) == (n, 0, n), st
    assert_same_batches(list(loader), got)
    st = cds.stats()
    assert (st.misses, st.hits) == (n, n), st
    assert (loader.stats()["misses"], loader.stats()["hits"]) == (n, n)


# ---- a trainer that exits with a pass open: its threads end first ----------

# The first atexit hook, run last, names the loader's threads still alive;
# the interpreter finalizes right after it. The gate hook, registered once
# the pass runs, runs first: the rows the spawned workers compute at exit
# end then (CountedImages waits for the gate from id 4 on).
EXIT_WITH_A_PASS_OPEN = """
import atexit, threading
atexit.register(lambda: print("at exit", sorted(
    t.name for t in threading.enumerate() if t.name.startswith("shmcache-")), flush=True))
import os, pathlib, sys
from shmcache import DatasetCache
from shmcache.torch import CachedDataset, CachedLoader
from helpers import CountedImages
cds = CachedDataset(CountedImages(200), DatasetCache(int(sys.argv[1])), name="gated")
it = iter(CachedLoader(cds, batch_size=4, num_workers=2, multiprocessing_context="spawn"))
next(it)
atexit.register(pathlib.Path(os.environ["PREFILL_GATE"]).touch)
print("last statement", flush=True)
"""


def test_the_loaders_threads_end_before_the_interpreter_finalizes(server, session,
                                                                  tmp_path):
    # A daemon thread still in a torch call as the interpreter finalizes
    # aborts the process (the miss pool's thread shuts the spawned
    # workers' DataLoader down: "terminate called without an active
    # exception", now and then, after a trainer's last line).
    env = dict(child_env(), PREFILL_GATE=str(tmp_path / "gate"), PREFILL_GATE_AT="4",
               PREFILL_COUNTER=str(tmp_path / "counter"))
    proc = subprocess.Popen([sys.executable, "-c", EXIT_WITH_A_PASS_OPEN, str(session)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
        assert "last statement\nat exit []\n" in out, out + err
        assert proc.returncode == 0, err
    finally:
        kill_group(proc)


class Profiled(Dataset):
    """Each row says whether its worker runs under a profile function."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.array([sys.getprofile() is None], dtype=np.float32)


def test_the_workers_compute_without_the_pool_threads_profile_function(server, session):
    """The pool's thread, which forks the workers, runs under a profile
    function (_exit_threads.waits_are_slices): a forked worker computes its
    rows without it (the dataset once ran under it, every call a Python
    callback)."""
    cds = CachedDataset(Profiled(), DatasetCache(session), name="profiled")
    workers = MissWorkers(cds, 1)
    try:
        rows = workers.compute(range(4), owned=[False] * 4)
    finally:
        workers.close()
    assert [r.cols[0][2].tolist() for r in rows] == [[1.0]] * 4, rows


# A script that iterated a DataLoader in its main thread (torch's SIGCHLD
# handler installed), then a CachedLoader in another thread, whose worker
# is SIGKILLed while the main thread does other work (here, waits for that
# thread): what the loader raised, and what was raised in the main thread.
WORKER_KILLED_UNDER_TORCHS_HANDLER = """
import multiprocessing as mp, threading, time
import contract_datasets as cd
from torch.utils.data import DataLoader
from shmcache import DatasetCache
from shmcache.torch import CachedDataset, CachedLoader

assert len(list(DataLoader(range(4), batch_size=2, num_workers=1))) == 2
loader = CachedLoader(CachedDataset(cd.Killer(8, at=1, sig=cd.KILLED),
                                    DatasetCache({session}), name="killer"),
                      batch_size=2, num_workers=2)
errors, raised_here = [], []

def consume():
    try:
        list(loader)
    except RuntimeError as e:
        errors.append(str(e))

t = threading.Thread(target=consume)
t.start()
while t.is_alive():
    try:
        t.join(0.05)
    except RuntimeError as e:
        raised_here.append(str(e))
deadline = time.monotonic() + 60
while mp.active_children() and time.monotonic() < deadline:
    time.sleep(0.05)
report(dict(errors=errors, raised_here=raised_here, ended=not mp.active_children()))
"""


def test_torchs_sigchld_handler_never_raises_a_cachedloader_workers_death(server, session):
    """A CachedLoader's workers are not in torch's list of workers its
    SIGCHLD handler reports: once a DataLoader installed that handler in
    the main thread, a listed worker's death is raised there at the next
    child's exit, at whatever runs (inside a Condition's __enter__ it
    leaves a lock held for good: the hang of DataLoader.__del__,
    bounded_child.py). The pass reports the death itself, naming the
    signal. In a child killed on a deadline: what it runs may hang."""
    got = run_in_child(WORKER_KILLED_UNDER_TORCHS_HANDLER.format(session=session),
                       what="a CachedLoader with a killed worker under torch's handler")
    assert got["raised_here"] == [], got["raised_here"]
    assert len(got["errors"]) == 1 and "is killed by signal: Killed" in got["errors"][0], got
    assert got["ended"], "the workers did not end"
