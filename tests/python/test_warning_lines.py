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


@pytest.mark.parametrize("problem", ["full", "uncacheable"])
def test_spawned_workers_name_the_line_that_made_the_dataset(start_server, problem):
    """A spawned worker has no frame of the user's: its warning names the
    line that made the CachedDataset, once for all the workers (each said
    it once, before they shared the flag)."""
    server = start_server("--memory_cap_mb", "16")
    r = run(server, server.new_session(), "DataLoader", 3, "spawn", problem)
    found = WARNING.findall(r.stderr)
    assert len(found) == 1, r.stderr
    for where, line, _ in found:
        assert where == TRAINER and int(line) in user_lines(), r.stderr
