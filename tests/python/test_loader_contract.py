"""CachedLoader keeps DataLoader's contract where a script can see it, each
test side by side with torch.utils.data.DataLoader over the same dataset:
a failed batch does not end the epoch, every DataLoader argument is
accepted and checked alike, get_worker_info().dataset is the user's
dataset, a cold epoch computes on every worker at once, worker seeds and
the batch-to-worker order are DataLoader's, the guards and messages
scripts match on, CachedLoader[T], and persistent workers."""

import contextlib
import gc
import inspect
import multiprocessing as mp
import os
import random
import re
import threading
import warnings
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import contract_datasets as cd  # noqa: E402
from bounded_child import run_in_child  # noqa: E402
from conftest import wait_for  # noqa: E402
from shmcache import CacheWarning, DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset, CachedLoader  # noqa: E402
from test_cached_loader import assert_same, assert_same_batches  # noqa: E402

CPUS = len(os.sched_getaffinity(0))


def cached(ds, session, name, **kw):
    """What the README tells a user to write, in a cache of its own."""
    return CachedLoader(CachedDataset(ds, DatasetCache(session), name=name), **kw)


def outcomes(loader, seed=0):
    """Every next() of one epoch: ("batch", batch) or ("error", exception),
    until StopIteration (which must come); the process's RNGs seeded
    first."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    it = iter(loader)
    out = []
    for _ in range(len(loader) + 3):
        try:
            out.append(("batch", next(it)))
        except StopIteration:
            return out
        except Exception as e:   # noqa: BLE001 -- what the script would see
            out.append(("error", e))
    raise AssertionError("the epoch did not end after len(loader) batches")


def no_children():
    gc.collect()
    return not mp.active_children()


@contextlib.contextmanager
def quiet():
    """DataLoader's warning about more workers than CPUs, and the cache's
    about samples it cannot hold, are not what these tests look at."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", CacheWarning)
        yield


# ---- 1. a failed batch raises, and the epoch goes on ----------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failed_batch_raises_and_the_epoch_goes_on(server, session, num_workers):
    ds = cd.Flaky(30, bad=[3, 4, 17, 29])
    kw = dict(batch_size=4, shuffle=True, num_workers=num_workers)
    want = outcomes(DataLoader(ds, **kw), seed=5)
    got = outcomes(cached(ds, session, f"flaky{num_workers}", **kw), seed=5)
    assert [k for k, _ in got] == [k for k, _ in want]
    errors = [k for k, (kind, _) in enumerate(want) if kind == "error"]
    assert errors and errors[0] < len(want) - 1, "some batch after a failure"
    for k, ((_, a), (_, b)) in enumerate(zip(got, want)):
        if k in errors:
            assert type(a) is type(b) is ValueError
            assert re.findall(r"bad sample \d+", str(a)) == \
                re.findall(r"bad sample \d+", str(b))
        else:
            assert_same(a, b, f"batch {k}")
    assert wait_for(no_children, what="workers to end")


@pytest.mark.parametrize("exc", [KeyError, ValueError, cd.TwoArgs, cd.WithMessage])
def test_a_workers_exception_reads_as_dataloaders(server, session, exc):
    """Same type, the same message ("Caught KeyError in ... worker process
    0.", readable, not a KeyError's quoted repr) with the worker's
    traceback, as torch's ExceptionWrapper re-raises it; an exception type
    that is not made from a message becomes a RuntimeError, as there."""
    ds = cd.Raising(6, at=3, exc=exc)
    kw = dict(batch_size=2, num_workers=1)
    raised = []
    for make in (DataLoader, lambda ds, **kw: cached(ds, session, f"r{exc.__name__}", **kw)):
        with pytest.raises(Exception) as e:
            list(make(ds, **kw))
        raised.append((type(e.value), str(e.value)))
        del e
        assert children_end_despite_sigchld_reports()
    (want_type, want), (got_type, got) = raised
    assert got_type is want_type is (RuntimeError if exc is cd.TwoArgs else exc)
    assert got.splitlines()[0] == want.splitlines()[0].replace("DataLoader", "CachedLoader")
    assert got.splitlines()[1] == want.splitlines()[1] == "Original Traceback (most recent call last):"
    # The dataset's own line, and its exception last, as in DataLoader's.
    assert "in __getitem__" in got and got.rstrip().splitlines()[-1] == \
        want.rstrip().splitlines()[-1]


def test_workers_that_cannot_start_fail_as_dataloaders(server, session):
    """spawn pickles worker_init_fn for each worker: a lambda cannot be,
    and DataLoader's iter() raises the pickling error; CachedLoader's
    batch raises it with the same type and message (it was a RuntimeError
    with that message)."""
    ds = cd.Flaky(6, [])
    raised = []
    for make in (DataLoader, lambda ds, **kw: cached(ds, session, "unpicklable", **kw)):
        loader = make(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn",
                      worker_init_fn=lambda wid: None)
        with pytest.raises(Exception) as e:
            next(iter(loader))
        raised.append((type(e.value), str(e.value)))
        del e, loader
    assert raised[0][0] is not RuntimeError and "pickle" in raised[0][1], raised[0]
    assert raised[1] == raised[0]
    assert wait_for(no_children, timeout=30, what="workers to end")


# ---- 2. every DataLoader argument, checked as DataLoader checks it ------

def test_every_dataloader_argument_is_in_the_signature_with_its_default():
    dl = inspect.signature(DataLoader.__init__).parameters
    cl = inspect.signature(CachedLoader.__init__).parameters
    positional = [n for n, p in dl.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [n for n, p in cl.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == positional
    for name, p in dl.items():
        assert name in cl, name
        assert (cl[name].kind, cl[name].default) == (p.kind, p.default), name


ARGUMENTS = [
    dict(prefetch_factor=2), dict(persistent_workers=False), dict(pin_memory_device=""),
    dict(num_workers=2, prefetch_factor=3, persistent_workers=True),
    dict(num_workers=1, multiprocessing_context="spawn"),
    dict(num_workers=1, multiprocessing_context=mp.get_context("fork")),
    dict(num_workers=-1), dict(timeout=-1), dict(timeout=5), dict(prefetch_factor=3),
    dict(persistent_workers=True), dict(multiprocessing_context="fork"),
    dict(num_workers=1, multiprocessing_context="bad"),
    dict(num_workers=1, multiprocessing_context=object()),
    dict(shuffle=True, sampler=range(4)), dict(batch_size=3, batch_sampler=[[0, 1]]),
    dict(drop_last=True, batch_sampler=[[0, 1]]), dict(batch_size=None, drop_last=True),
]


@pytest.mark.parametrize("kw", ARGUMENTS, ids=lambda kw: ",".join(sorted(kw)) + str(
    sorted(str(v) for v in kw.values())))
def test_arguments_are_accepted_or_refused_as_dataloader_does(server, session, kw):
    cds = CachedDataset(cd.Flaky(8, []), DatasetCache(session))

    def build(cls):
        try:
            cls(cds, **kw)
        except Exception as e:   # noqa: BLE001 -- compared below
            return type(e), str(e)
        return None
    assert build(CachedLoader) == build(DataLoader)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_generator_that_is_not_one_fails_at_iter_as_dataloader(server, session, shuffle):
    """DataLoader takes generator=3 and fails at iter(), drawing its
    workers' seed from it: a TypeError naming generator=; CachedLoader
    too (it was an AttributeError, 'int' object has no attribute
    'get_state')."""
    cds = CachedDataset(cd.Flaky(8, []), DatasetCache(session))
    raised = []
    for cls in (DataLoader, CachedLoader):
        loader = cls(cds, batch_size=2, shuffle=shuffle, generator=3)
        with pytest.raises(Exception) as e:
            next(iter(loader))
        raised.append((type(e.value), str(e.value)))
    assert raised[0][0] is TypeError and "generator" in raised[0][1]
    assert raised[1] == raised[0]


# ---- 3. get_worker_info().dataset is the user's dataset ------------------

def test_worker_init_fn_configures_the_dataset_that_computes(server, session):
    ds = cd.Configured(12)
    kw = dict(batch_size=3, num_workers=2, worker_init_fn=cd.configure)
    want = list(DataLoader(ds, **kw))
    got = list(cached(ds, session, "configured", **kw))
    assert_same_batches(got, want)
    assert {int(v) // 1000 for b in got for v in b[0]} == {1, 2}


# ---- 4. a cold epoch computes on every worker at once --------------------

def test_a_cold_epoch_computes_on_every_worker_at_once(server, session):
    workers = 3
    barrier = mp.get_context("fork").Barrier(workers, timeout=30)
    ds = cd.Barrier(2 * workers, barrier)

    def kw():
        return dict(batch_size=1, num_workers=workers, multiprocessing_context="fork",
                    generator=torch.Generator().manual_seed(11))
    with quiet():
        want = sorted(int(b) for b in DataLoader(ds, **kw()))
        got = sorted(int(b) for b in cached(ds, session, "barrier", **kw()))
    assert got == want and len(set(got)) == workers


# ---- 5. worker seeds and the order of batches ----------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("seeded", ["generator", "manual_seed"])
def test_seeds_draws_and_worker_order_match_dataloader(server, session, num_workers,
                                                        seeded):
    ds = cd.Draws(23)

    def kw():
        gen = torch.Generator().manual_seed(7) if seeded == "generator" else None
        return dict(batch_size=3, shuffle=True, num_workers=num_workers, generator=gen)
    with quiet():
        want = outcomes(DataLoader(ds, **kw()), seed=9)
        got = outcomes(cached(ds, session, f"draws{num_workers}{seeded}", **kw()), seed=9)
    assert_same_batches([b for _, b in got], [b for _, b in want])
    for k, (_, b) in enumerate(got):
        # Batch k from worker k mod num_workers, its seed base_seed + worker.
        assert set(b["worker"].tolist()) == {k % num_workers if num_workers else -1}
    if num_workers:
        seeds = {int(b["worker"][0]): int(b["seed"][0]) for _, b in got}
        assert seeds[1] == seeds[0] + 1


# ---- 6. guards and the messages scripts match ----------------------------

@pytest.mark.parametrize("attr", ["batch_size", "sampler", "batch_sampler", "drop_last",
                                  "dataset", "persistent_workers"])
def test_arguments_cannot_change_after_construction(server, session, attr):
    ds = cd.Flaky(8, [])
    messages = []
    for loader in (DataLoader(ds), cached(ds, session, "frozen")):
        with pytest.raises(ValueError) as e:
            setattr(loader, attr, 3)
        messages.append(str(e.value).replace(type(loader).__name__, "LOADER"))
    assert messages[0] == messages[1]


def test_more_workers_than_cpus_warns_as_dataloader(server, session):
    ds = cd.Flaky(8, [])
    found = []
    for make in (lambda: DataLoader(ds, num_workers=CPUS + 1),
                 lambda: cached(ds, session, "many", num_workers=CPUS + 1)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            make()
        found.append([str(x.message) for x in w if "excessive worker creation" in
                      str(x.message)])
    assert len(found[0]) == 1 and found[1] == found[0]


def test_a_pin_memory_device_without_pin_memory_warns_as_dataloader(server, session):
    """DataLoader warns at every iter() that pin_memory_device does nothing
    without pin_memory=True; CachedLoader gave no warning."""
    ds = cd.Flaky(4, [])
    found = []
    for loader in (DataLoader(ds, pin_memory_device="cuda"),
                   cached(ds, session, "pin_device", pin_memory_device="cuda")):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(2):
                assert len(list(loader)) == 4
        found.append([(x.category, str(x.message)) for x in w
                      if "pin memory device" in str(x.message)])
    assert len(found[0]) == 2 and found[1] == found[0]


def test_a_timeout_says_what_dataloader_says(server, session):
    ds = cd.Sleepy(10, 3)
    kw = dict(batch_size=2, num_workers=2, timeout=1)
    for make in (DataLoader, lambda ds, **kw: cached(ds, session, "sleepy", **kw)):
        it = iter(make(ds, **kw))
        with pytest.raises(RuntimeError, match=r"DataLoader timed out after 1 seconds"):
            next(it)
        del it
        assert wait_for(no_children, timeout=30, what="workers to end")


def test_a_timeout_without_workers_is_refused_where_dataloader_refuses_it(server, session):
    """DataLoader(num_workers=0, timeout=5) is built, and its iter() fails
    (torch 1.13: the single-process iterator asserts timeout == 0);
    CachedLoader fails there too, with the same type, saying what to do."""
    cds = CachedDataset(cd.Flaky(8, []), DatasetCache(session))

    def first_batch(cls):
        loader = cls(cds, batch_size=2, timeout=5)
        try:
            next(iter(loader))
        except Exception as e:   # noqa: BLE001 -- compared below
            return e
        return None
    want, got = first_batch(DataLoader), first_batch(CachedLoader)
    assert want is not None and type(got) is type(want), (want, got)
    assert str(got) == ("timeout=5 is only valid with num_workers > 0, as in DataLoader "
                        "(its single-process iterator takes no timeout): pass timeout=0, "
                        "or num_workers > 0"), got
    assert list(CachedLoader(cds, batch_size=4, num_workers=0, timeout=0))


def test_a_timeout_is_one_deadline_for_the_whole_next(server, session):
    """timeout= bounds next() as DataLoader's bounds its queue read, even
    while other batches keep being filed (each wakes the waiting next()):
    batch 0 never comes (nor the batches after it on its worker), the
    batches after it are released one by one, T/4 apart (each of the
    other worker's then wakes the waiter), for 4 T in all. next() raises
    while they are still coming; a wait that restarted at each wake-up
    would raise only once they stopped."""
    T = 3
    n = 17   # batch 0, then 16 released over 4 T
    ds = cd.Gated(n, mp.get_context("fork"))
    loader = cached(ds, session, "gated", batch_size=1, num_workers=2, prefetch_factor=8,
                    timeout=T, multiprocessing_context="fork")
    returned, released_all = threading.Event(), threading.Event()

    def release():
        for k in range(1, n):
            if returned.wait(T / 4):
                return
            ds.gates[k].set()
        released_all.set()
    releaser = threading.Thread(target=release)
    it = iter(loader)
    releaser.start()
    try:
        with pytest.raises(RuntimeError, match=rf"DataLoader timed out after {T} seconds"):
            next(it)
        assert not released_all.is_set(), "next() waited until the wake-ups stopped"
    finally:
        returned.set()
        releaser.join()
        ds.block.set()
        for g in ds.gates:
            g.set()
        del it, loader
    assert wait_for(no_children, timeout=30, what="workers to end")


def children_end_despite_sigchld_reports():
    """Waits for the workers to end. A DataLoader that ran in this (main)
    thread left torch's SIGCHLD handler, which raises a dead worker's
    report in the main thread at the next child's exit (once per
    iterator); the test waits on through those reports."""
    for _ in range(100):
        try:
            return wait_for(no_children, timeout=30, what="workers to end")
        except RuntimeError as e:
            assert "DataLoader worker" in str(e), e
    raise AssertionError("workers did not end")


# One loader's pass over a dataset whose first worker is SIGKILLed in its
# first batch, in a child (bounded_child): the exception, and whether the
# child's processes ended once the pass was dropped. A plain DataLoader
# can hang for good there (bounded_child says how); a hang fails the test
# with the child's stacks.
KILLED_PASS = """
import multiprocessing as mp, time
import contract_datasets as cd
from shmcache import DatasetCache
from shmcache.torch import CachedDataset, CachedLoader
from torch.utils.data import DataLoader

def make(ds, **kw):
    if {plain}:
        return DataLoader(ds, **kw)
    return CachedLoader(CachedDataset(ds, DatasetCache({session}), name="killer"), **kw)

def children_end():
    # Through the reports torch's SIGCHLD handler raises at any child's
    # exit while a dead worker is still registered.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if not mp.active_children():
                return True
            time.sleep(0.05)
        except RuntimeError as e:
            assert "DataLoader worker" in str(e), e
    return False

error = None
try:
    list(make(cd.Killer(8, at=1, sig=cd.KILLED), batch_size=2, num_workers=2))
except Exception as e:
    error = [type(e).__name__, str(e)]
    # Its traceback holds the pass: dropping it is DataLoader.__del__.
    del e
report(dict(error=error, children_ended=children_end()))
"""


def killed_pass(session, plain):
    return run_in_child(KILLED_PASS.format(plain=plain, session=session),
                        what=("DataLoader" if plain else "CachedLoader") +
                        "'s pass with a killed worker")


def test_a_worker_killed_by_a_signal_is_named(server, session):
    """Both raise RuntimeError naming the dead worker; DataLoader's own
    words are a race (its SIGCHLD handler's "is killed by signal" is
    swallowed when the main thread is inside its queue read, which then
    says "exited unexpectedly"): CachedLoader names the signal always.
    Each loader runs in a child of its own, killed on a deadline: torch's
    DataLoader may hang for good in its __del__ after a killed worker
    (bounded_child)."""
    # The first worker dies in its first batch, before it sent one: a batch
    # sent before that worker died reaches DataLoader's trainer as a
    # descriptor to fetch from the dead worker (torch's file_descriptor
    # sharing), which raised ConnectionResetError instead (CI at c6a2837).
    errors = []
    for plain in (True, False):
        got = killed_pass(session, plain)
        assert got["error"] is not None, "the pass raised nothing"
        assert got["error"][0] == "RuntimeError", got["error"]
        assert got["children_ended"], "the workers did not end"
        errors.append(got["error"][1])
    assert re.search(r"DataLoader worker \(pid(\(s\))? \d+\) (is killed by signal: Killed|"
                     r"exited unexpectedly)", errors[0]), errors[0]
    assert re.search(r"DataLoader worker \(pid \d+\) is killed by signal: Killed",
                     errors[1]), errors[1]


# ---- 7. CachedLoader[T] ---------------------------------------------------

def test_cachedloader_is_a_generic_dataloader(server, session):
    alias = CachedLoader[torch.Tensor]
    assert alias.__origin__ is CachedLoader and DataLoader[torch.Tensor].__origin__ is DataLoader
    loader = alias(CachedDataset(cd.Flaky(4, []), DatasetCache(session)), batch_size=2)
    assert isinstance(loader, DataLoader) and len(list(loader)) == 2


# ---- persistent workers ---------------------------------------------------

@pytest.mark.parametrize("persistent", [False, True])
def test_persistent_workers_live_across_epochs(server, session, persistent):
    ds = cd.Uncacheable(12)
    kw = dict(batch_size=2, num_workers=2, persistent_workers=persistent)
    with quiet():
        for make in (DataLoader, lambda ds, **kw: cached(ds, session, f"p{persistent}", **kw)):
            loader = make(ds, **kw)
            epochs = [list(loader) for _ in range(2)]
            pids = [{int(p) for b in e for p in b[1]} for e in epochs]
            assert len(pids[0]) == 2
            assert (pids[0] == pids[1]) if persistent else not (pids[0] & pids[1])
            assert [[b[0].tolist(), list(b[2])] for b in epochs[0]] == \
                [[[i, i + 1], [f"row {i}", f"row {i + 1}"]] for i in range(0, 12, 2)]
            del loader
            assert wait_for(no_children, what="workers to end")


def test_persistent_workers_keep_their_copy_of_the_dataset(server, session):
    ds = cd.Started(8)
    kw = dict(batch_size=2, num_workers=2, persistent_workers=True)
    with quiet():
        for make in (DataLoader, lambda ds, **kw: cached(ds, session, "started", **kw)):
            loader = make(ds, **kw)
            ds.start = 0
            for epoch in range(3):
                assert len(list(loader)) == 4
                ds.start = epoch + 1
            del loader
            assert wait_for(no_children, what="workers to end")


@pytest.mark.parametrize("persistent", [False, True])
def test_a_dropped_loader_ends_its_workers_without_the_cycle_collector(server, session,
                                                                       persistent):
    """`del loader` ends persistent workers, as DataLoader's, by reference
    counting alone: the loader and its passes form no cycle that would keep
    them (and the batch buffers) until the cyclic collector runs, which a
    script that makes a loader per epoch may not reach for a long time."""
    ds = cd.Uncacheable(12)
    kw = dict(batch_size=2, num_workers=2, persistent_workers=persistent)
    gc.collect()
    gc.disable()
    try:
        with quiet():
            for make in (DataLoader, lambda ds, **kw: cached(ds, session, f"d{persistent}", **kw)):
                loader = make(ds, **kw)
                assert len(list(loader)) == 6
                it = iter(loader)
                next(it)
                del it
                gone = weakref.ref(loader)
                del loader
                # A thread of the broken-off pass ends after the row it
                # waits for (close() does not wait for it), then lets go.
                assert wait_for(lambda: gone() is None, what="the dropped loader to be freed")
                assert wait_for(lambda: not mp.active_children(), what="workers to end")
    finally:
        gc.enable()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_whose_batches_failed_is_freed_when_dropped(server, session, num_workers):
    """A failed batch's exception, once the script let go of it, keeps
    nothing of the pass (no cycle through its traceback)."""
    ds = cd.Flaky(12, bad=[3, 9])
    gc.collect()
    gc.disable()
    try:
        for make in (DataLoader, lambda ds, **kw: cached(ds, session, f"f{num_workers}", **kw)):
            loader = make(ds, batch_size=2, num_workers=num_workers)
            # outcomes() would keep the exceptions, whose tracebacks hold
            # its frame: a cycle of the test's own.
            kinds, it = [], iter(loader)
            for _ in range(8):
                try:
                    kinds.append(type(next(it)).__name__)
                except StopIteration:
                    break
                except ValueError as e:
                    kinds.append(re.findall(r"bad sample", str(e))[-1])
            assert kinds.count("bad sample") == 2 and len(kinds) == 6, kinds
            del it
            gone = weakref.ref(loader)
            del loader
            assert wait_for(lambda: gone() is None, what="the dropped loader to be freed")
            assert wait_for(lambda: not mp.active_children(), what="workers to end")
    finally:
        gc.enable()


# ---- a worker_init_fn that raises ---------------------------------------

def test_a_failing_worker_init_fn_fails_every_batch_of_its_worker(server, session):
    """DataLoader raises at every next() of a pass whose workers' init
    failed (torch 1.13: the user's exception, then an UnboundLocalError of
    its own). CachedLoader, cold (every row a miss, computed by the
    workers), raises the user's exception at each next(), with its type,
    message and the worker's traceback, computes nothing with a worker
    never set up, ends the pass, and leaves no worker."""
    ds = cd.Configured(12)
    kw = dict(batch_size=2, num_workers=2, worker_init_fn=cd.failing_init)
    with quiet():
        want = outcomes(DataLoader(ds, **kw))
        assert wait_for(no_children, timeout=30, what="workers to end")
        got = outcomes(cached(ds, session, "initfail", **kw))
        assert wait_for(no_children, timeout=30, what="workers to end")
    assert [k for k, _ in want] == ["error"] * 6
    assert [k for k, _ in got] == ["error"] * 6
    for n, (_, e) in enumerate(got):
        text = str(e)
        assert type(e) is ValueError, text
        assert f"worker_init_fn failed in worker {n % 2}" in text, text
        assert f"Caught ValueError in CachedLoader worker process {n % 2}" in text, text
        assert "Traceback" in text and "in failing_init" in text, text
