"""Where a CacheWarning raised off the user's thread points, in a real
trainer process (tests/python/warning_trainer.py, its stderr read as a user
reads it, under Python's default warning filters): on a CachedLoader's
threads, on CachedDataset's background writer and inside DataLoader worker
processes, the warning names a line of the user's script (the loop over the
loader, or the line that made the CachedDataset), never threading.py,
multiprocessing or torch.utils.data, and it is shown once, however many
workers met the cause, forked or spawned (a spawned worker gets the flag's
shared memory with its pickled dataset)."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "warning_trainer.py")
WARNING = re.compile(r"^(.*):(\d+): CacheWarning: (.*)$", re.M)


def user_lines():
    with open(TRAINER) as f:
        text = f.read().splitlines()
    return {k + 1 for k, line in enumerate(text) if line.endswith(("# made", "# loop"))}


def run(server, session, *args):
    env = dict(server.env, SHMCACHE_SESSION_ID=str(session),
               PYTHONPATH=HERE + os.pathsep + server.env["PYTHONPATH"])
    r = subprocess.run([sys.executable, TRAINER, *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("loader,workers,context,problem,says", [
    ("CachedLoader", 0, "fork", "full", "is full"),
    ("CachedLoader", 2, "fork", "full", "is full"),
    ("CachedLoader", 0, "fork", "uncacheable", "cannot be cached"),
    ("CachedLoader", 2, "spawn", "uncacheable", "cannot be cached"),
    ("DataLoader", 0, "fork", "full", "is full"),
    ("DataLoader", 2, "fork", "full", "is full"),
    ("DataLoader", 2, "fork", "uncacheable", "cannot be cached"),
])
def test_a_warning_off_the_users_thread_names_the_users_line_once(
        start_server, loader, workers, context, problem, says):
    server = start_server("--memory_cap_mb", "16")
    r = run(server, server.new_session(), loader, workers, context, problem)
    found = WARNING.findall(r.stderr)
    assert len(found) == 1, r.stderr
    ((where, line, message),) = found
    assert where == TRAINER and int(line) in user_lines(), r.stderr
    assert says in message, message


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_full_put_queue_is_warned_about_once_over_epochs_and_workers(server, session,
                                                                       context):
    """Every worker of every epoch (two workers, three epochs, each a new
    process) drops rows from its full put queue: one warning for the run,
    where each worker process gave its own (16 workers and 90 epochs: 1,440
    lines)."""
    r = run(server, session, "DataLoader", 2, context, "queue")
    found = WARNING.findall(r.stderr)
    assert len(found) == 1, r.stderr
    ((where, line, message),) = found
    assert where == TRAINER and int(line) in user_lines(), r.stderr
    assert "put queue is full" in message, message


@pytest.mark.parametrize("loader,context", [("DataLoader", "fork"),
                                            ("DataLoader", "spawn"),
                                            ("CachedLoader", "fork")])
def test_a_row_too_large_is_warned_about_once_over_epochs_and_workers(server, session,
                                                                      loader, context):
    """Rows larger than the cache, met by every worker of every epoch (two
    workers, three epochs, each a new process): one warning for the run,
    where each worker process gave its own (6 lines), and every sample is
    delivered."""
    r = run(server, session, loader, 2, context, "too_large")
    assert r.stdout.split() == ["64"] * 3, r.stdout
    found = WARNING.findall(r.stderr)
    assert len(found) == 1, r.stderr
    ((where, line, message),) = found
    assert where == TRAINER and int(line) in user_lines(), r.stderr
    assert "cannot be cached" in message and "size_mb" in message, message


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@pytest.mark.parametrize("problem", ["full", "uncacheable"])
def test_spawned_workers_name_the_line_that_made_the_dataset(start_server, problem,
                                                             context):
    """A spawned worker has no frame of the user's: its warning names the
    line that made the CachedDataset, once for all the workers (each said
    it once, before they shared the flag)."""
    server = start_server("--memory_cap_mb", "16")
    r = run(server, server.new_session(), "DataLoader", 3, context, problem)
    found = WARNING.findall(r.stderr)
    assert len(found) == 1, r.stderr
    for where, line, _ in found:
        assert where == TRAINER and int(line) in user_lines(), r.stderr


@pytest.mark.parametrize("loader,context", [("DataLoader", "fork"),
                                            ("DataLoader", "spawn"),
                                            ("CachedLoader", "spawn")])
def test_the_size_over_cap_note_is_said_once_by_trainer_and_workers(start_server, loader,
                                                                     context):
    """The note at open that size_mb is over the cap is said once for the
    trainer and its workers, forked or spawned (each spawned worker opens
    the cache again: the note's mark is shared with them), and the cache
    filling up, which it foretells, is not said after it."""
    server = start_server("--memory_cap_mb", "16")
    r = run(server, server.new_session(), loader, 3, context, "over_cap")
    found = WARNING.findall(r.stderr)
    assert len(found) == 1, r.stderr
    ((where, line, message),) = found
    assert where == TRAINER and int(line) in user_lines(), r.stderr
    assert "is more than the 16 MB" in message, r.stderr

@pytest.mark.parametrize("loader,context", [("DataLoader", "fork"),
                                            ("DataLoader", "spawn"),
                                            ("DataLoader", "forkserver"),
                                            ("CachedLoader", "spawn")])
def test_a_cache_closed_before_the_loop_is_said_once_and_not_reopened(
        start_server, loader, context):
    """A cache the user closed, handed to workers, is read from the source
    in each (never reopened), and its use after close() is said once for
    the trainer and all its workers, as with no worker: a spawned worker
    shares the trainer's flag. Every sample is delivered."""
    server = start_server("--memory_cap_mb", "16")
    session = server.new_session()
    r = run(server, session, loader, 3, context, "closed")
    assert r.stdout.split() == ["64"], r.stdout
    found = WARNING.findall(r.stderr)
    assert len(found) == 1, r.stderr
    ((where, line, message),) = found
    assert where == TRAINER and int(line) in user_lines(), r.stderr
    assert "was closed" in message and "and then used" in message, message


def test_quietly_on_other_threads_never_quiets_this_one():
    """quietly() (a loader's thread or worker whose trainer says the
    warning) quiets its own thread only, however threads enter and leave
    it: it swapped the process's warning filters, so that a warning of the
    user's thread was lost while another thread was quiet, and two threads
    leaving in turn left CacheWarning ignored for good."""
    import threading
    import warnings
    from shmcache import CacheWarning
    from shmcache._user_line import quietly, warn
    entered = [threading.Event(), threading.Event()]
    leave = [threading.Event(), threading.Event()]

    def quiet(k):
        with quietly(CacheWarning):
            warn(f"quiet {k}", CacheWarning)
            entered[k].set()
            assert leave[k].wait(60)

    threads = [threading.Thread(target=quiet, args=(k,)) for k in (0, 1)]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for t, e in zip(threads, entered):
            t.start()
            assert e.wait(60)
        warn("while others are quiet", CacheWarning)
        for t, e in zip(threads, leave):
            e.set()
            t.join()
        warn("after", CacheWarning)
    assert [str(x.message) for x in w] == ["while others are quiet", "after"]


@pytest.mark.parametrize("loader,context", [("DataLoader", "fork"),
                                            ("DataLoader", "spawn"),
                                            ("CachedLoader", "fork")])
def test_persistent_workers_see_a_close_made_after_they_started(
        start_server, loader, context):
    """close() between two passes of persistent workers: the workers of the
    second pass neither read the cache (no hit) nor store the rows the
    first pass did not reach, and its use after close() is said once.
    (They kept the cache they had opened: every row of the first pass a
    hit, the others stored.)"""
    server = start_server()
    r = run(server, server.new_session(), loader, 2, context, "closed_later")
    first, second = [list(map(int, line.split())) for line in r.stdout.splitlines()]
    rows, hits, cached = first
    assert rows == 32 and cached == 32, r.stdout
    assert second == [64, hits, 32], r.stdout
    found = WARNING.findall(r.stderr)
    assert len(found) == 1, r.stderr
    ((where, line, message),) = found
    assert where == TRAINER and int(line) in user_lines(), r.stderr
    assert "was closed" in message and "and then used" in message, message
