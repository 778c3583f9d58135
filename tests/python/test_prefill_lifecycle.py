"""python3 -m shmcache.prefill tells the truth about its workers and ends
them: a stop signal is honoured even while the workers are being forked,
SIGINT/SIGTERM end every worker before prefill exits, workers die with a
SIGKILLed prefill, a dead worker fails the run with the number of missing
rows (a resume fills them), and errors name the right row and exception.

The dataset is tests/python/prefill_helpers.py; each test steers it through
environment variables and waits on what it does (a pid file, a line on
stderr), never on time."""

import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("torch")

from conftest import _alive, wait_for  # noqa: E402
from helpers import sample  # noqa: E402
from prefill_helpers import rows  # noqa: E402
from shmcache import DatasetCache  # noqa: E402
from shmcache.torch import cache_for_dataset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = 400


def prefill_cmd(server, session, *args):
    return [sys.executable, "-m", "shmcache.prefill", "prefill_helpers:rows",
            "--session_id", str(session), "-p", str(server.port), *args]


def env(server, **extra):
    e = dict(server.env, **extra)
    e["PYTHONPATH"] = HERE + os.pathsep + e["PYTHONPATH"]
    return e


def run_prefill(server, session, *args, **extra_env):
    return subprocess.run(prefill_cmd(server, session, *args),
                          env=env(server, **extra_env), capture_output=True,
                          text=True, timeout=300)


class Running:
    """A prefill process whose stderr lines are collected as they come."""

    def __init__(self, server, session, *args, **extra_env):
        self.p = subprocess.Popen(prefill_cmd(server, session, *args),
                                  env=env(server, **extra_env),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        self.err = []
        self.reader = threading.Thread(target=lambda: self.err.extend(self.p.stderr),
                                       daemon=True)
        self.reader.start()

    def said(self, text):
        return any(text in ln for ln in self.err)

    def stderr(self):
        self.reader.join(timeout=30)
        return "".join(self.err)


def the_cache(session, name):
    """The cache prefill fills under --cache_name `name`."""
    return cache_for_dataset(rows(), DatasetCache(session), name)


def cached_ids(session, name):
    cache = the_cache(session, name)
    return {i for i in range(ROWS) if cache.contains(i)}


def worker_pids(pid_dir):
    return [int(f) for f in os.listdir(pid_dir)]


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def check_rows(session, name):
    cache = the_cache(session, name)
    for i in range(ROWS):
        img, label = sample(i, 8)
        row = cache.get(i)
        assert row is not None, f"row {i} is not cached"
        assert np.array_equal(row[0], img) and int(row[1]) == label


def test_ctrl_c_while_the_workers_are_being_forked_is_honoured(server, session, tmp_path):
    # Worker 0's first row sends SIGINT to prefill while prefill is held
    # before forking worker 1: the signal arrives inside the window where
    # the pool is still forking. Every other row waits at a gate, which
    # opens once prefill said it is stopping.
    signalled, gate = tmp_path / "signalled", tmp_path / "gate"
    run = Running(server, session, "-j", "3", "--cache_name", "window",
                  PREFILL_SIGNAL_PARENT=str(signalled), PREFILL_HOLD_FORKS=str(signalled),
                  PREFILL_GATE=str(gate), PREFILL_GATE_AT="1")
    try:
        wait_for(lambda: run.said("SIGINT: stopping") or run.p.poll() is not None,
                 timeout=120, what="prefill to act on the SIGINT")
        assert signalled.exists()
        assert run.said("SIGINT: stopping"), run.stderr()
        gate.touch()
        assert run.p.wait(timeout=120) == 130, run.stderr()
    finally:
        gate.touch()
        run.p.kill()
        run.p.wait()
    err = run.stderr()
    assert "interrupted by SIGINT" in err and "run the same command again" in err
    # The workers stored the rows they had in hand and took no other: row 0
    # (worker 0's first), and at most one row behind the gate per worker
    # (3, then 1 and 2, for workers that began one before the stop).
    cached = cached_ids(session, "window")
    assert 0 in cached and cached <= {0, 1, 2, 3}
    r = run_prefill(server, session, "-j", "3", "--cache_name", "window")
    assert r.returncode == 0, r.stderr
    check_rows(session, "window")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_ends_every_worker_before_prefill_exits(server, session, tmp_path, sig):
    pids, gate = tmp_path / "pids", tmp_path / "gate"
    pids.mkdir()
    run = Running(server, session, "-j", "3", "--cache_name", "stop",
                  PREFILL_PIDS=str(pids), PREFILL_GATE=str(gate), PREFILL_GATE_AT="0")
    try:
        wait_for(lambda: len(os.listdir(pids)) == 3, timeout=120,
                 what="three workers computing their first row")
        run.p.send_signal(sig)
        wait_for(lambda: run.said("stopping") or run.p.poll() is not None,
                 timeout=60, what="prefill to act on the signal")
        gate.touch()
        rc = run.p.wait(timeout=120)
        survivors = [pid for pid in worker_pids(pids) if _alive(pid)]
        assert survivors == [], f"workers alive after prefill ended: {survivors}"
        assert rc == 128 + sig, run.stderr()
    finally:
        gate.touch()
        run.p.kill()
        run.p.wait()
        kill_all(worker_pids(pids))
    assert f"interrupted by {signal.Signals(sig).name}" in run.stderr()
    # The rows in hand were stored; no process is left to store more.
    assert cached_ids(session, "stop") == {0, 1, 2}


def test_workers_die_with_a_sigkilled_prefill(server, session, tmp_path):
    pids, gate = tmp_path / "pids", tmp_path / "gate"
    pids.mkdir()
    run = Running(server, session, "-j", "2", "--cache_name", "orphans",
                  PREFILL_PIDS=str(pids), PREFILL_GATE=str(gate), PREFILL_GATE_AT="0")
    try:
        wait_for(lambda: len(os.listdir(pids)) == 2, timeout=120,
                 what="two workers computing their first row")
        run.p.kill()
        run.p.wait()
        workers = worker_pids(pids)
        wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=10,
                 what=f"the workers {workers} to die with their parent")
    finally:
        gate.touch()
        kill_all(worker_pids(pids))


@pytest.mark.parametrize("how,says", [
    ("kill", "was killed by SIGKILL (the out-of-memory killer"),
    ("exit3", "exited with status 3"),
])
def test_a_dead_worker_fails_the_run_and_a_resume_fills_the_rows(server, session, how, says):
    r = run_prefill(server, session, "-j", "2", "--cache_name", "dead",
                    PREFILL_END_AT=f"150:{how}")
    assert r.returncode == 1, r.stderr
    missing = ROWS - len(cached_ids(session, "dead"))
    assert missing > 0
    assert re.search(r"prefill: worker 0 \(pid \d+\) " + re.escape(says), r.stderr), r.stderr
    assert f"{missing} of {ROWS} rows missing" in r.stderr
    assert "done" not in r.stderr and "None" not in r.stderr
    r = run_prefill(server, session, "-j", "2", "--cache_name", "dead")
    assert r.returncode == 0, r.stderr
    assert f"({missing} stored now, {ROWS - missing} already cached)" in r.stderr
    check_rows(session, "dead")


def test_a_row_the_cache_refuses_is_named(server, session):
    r = run_prefill(server, session, "-j", "1", "--cache_name", "refused",
                    PREFILL_STR_LABEL_AT="101")
    assert r.returncode == 1, r.stderr
    assert "prefill: row 101 cannot be cached: TypeError: cannot cache a value of " \
           "type str" in r.stderr
    assert re.findall(r"\brow (\d+)", r.stderr) == ["101"], r.stderr
    # The rows before it are stored, in its batch too.
    assert cached_ids(session, "refused") == set(range(101))
    assert f"{ROWS - 101} of {ROWS} rows missing" in r.stderr


@pytest.mark.parametrize("kind,says", [
    ("unpicklable", "Unpicklable: boom at row 7"),
    ("unprintable", "Unprintable: (its message could not be printed: RuntimeError)"),
])
def test_a_dataset_error_names_the_row_and_the_exception(server, session, kind, says):
    r = run_prefill(server, session, "-j", "2", "--cache_name", "raises",
                    PREFILL_RAISE_AT=f"7:{kind}")
    assert r.returncode == 1, r.stderr
    assert f"prefill: row 7 of the dataset failed: {says}" in r.stderr
    assert "Traceback" not in r.stderr
    missing = ROWS - len(cached_ids(session, "raises"))
    assert missing > 0 and f"{missing} of {ROWS} rows missing" in r.stderr


@pytest.mark.parametrize("args,says", [
    (["-j", "x"], "argument -j/--workers: invalid int value: 'x'"),
    (["--no_such_flag"], "unrecognized arguments: --no_such_flag"),
    (["--cache_name", ""], "--cache_name must not be empty"),
    # Named as written: it said "Input size_mb is not within ...".
    (["--size_mb", "-3"], "--size_mb is a number of MB (0: as much as the server "
                          "allows), got -3"),
    (["--size", "-3"], "--size is a number of MB (0: as much as the server allows), "
                       "got -3"),
    (["--size", "8", "--size_mb", "16"], "--size 8 and --size_mb 16 disagree: --size "
                                         "is the old name of --size_mb"),
])
def test_bad_arguments_are_one_line_and_exit_1(server, session, args, says):
    r = run_prefill(server, session, *args)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("prefill: "), r.stderr
    assert says in r.stderr
    assert server.cache_rows(session) == {}


def test_the_line_it_prints_is_the_listings_with_the_name_as_shown_there(server,
                                                                           session):
    """The header and the cache's line of --list_sessions, its Name column
    too: a name with a tab and a backslash is escaped as the CLI escapes it."""
    r = run_prefill(server, session, "--cache_name", "odd\tname\\here")
    assert r.returncode == 0, r.stderr
    header, line = r.stdout.splitlines()
    listing = server.admin("--list_sessions").stdout.splitlines()
    assert header.endswith("Full  Name") and header in listing, (header, listing)
    assert line.endswith("  odd\\tname\\\\here") and line in listing, (line, listing)


def budget_mb(server, session, name):
    (s,) = [s for s in server.sessions() if s["session"] == session]
    return {c["name"]: c["budget_bytes"] >> 20 for c in s["caches"]}[name]


def test_size_mb_sizes_the_cache_and_size_still_does_with_a_warning(server, session):
    """--size_mb, as DatasetCache(size_mb=) and the rest say it; --size, its
    old name, still works and says it is deprecated."""
    r = run_prefill(server, session, "--cache_name", "new", "--size_mb", "8")
    assert r.returncode == 0, r.stderr
    assert "deprecated" not in r.stderr
    assert budget_mb(server, session, "new") == 8
    r = run_prefill(server, session, "--cache_name", "old", "--size", "12")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("prefill: warning: --size is deprecated: use --size_mb")
    assert budget_mb(server, session, "old") == 12


def test_a_cache_it_cannot_fill_is_one_line_with_the_fix(server):
    """Session 0, or no server: prefill has nothing to fill. It said the
    trainer's words ("the cache is bypassed and rows are read from the
    source") and asked whether the server was started, also for session 0."""
    r = run_prefill(server, 0)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("prefill: no row can be cached: session 0 is no session"), \
        r.stderr
    # prefill was given -p: the command asks that server too.
    assert f"create one with `shmcache -g -p {server.port}`" in r.stderr, r.stderr
    assert "read from the source" not in r.stderr and "started?" not in r.stderr
    session = server.new_session()
    server.stop()
    r = run_prefill(server, session)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("prefill: no row can be cached: the cache server is "
                               "unreachable"), r.stderr
    assert f"start it with 'shmcache --start -p {server.port}'" in r.stderr
    assert "read from the source" not in r.stderr and "started?" not in r.stderr


def test_main_called_in_a_thread_keeps_the_programs_other_warnings(server, capsys):
    """prefill.main() called by a program, in a thread of it, refused
    (session 0): it says its own cause, and every warning of the program's
    other threads meanwhile is shown. (It caught the warnings of its open
    with warnings.catch_warnings: the process's, those of the other
    threads among them, which were then lost, or named as its cause.)"""
    import warnings
    from shmcache import prefill
    calls, codes, done = 300, [], threading.Event()

    def refused():
        try:
            for _ in range(calls):
                codes.append(prefill.main(["prefill_helpers:rows", "--session_id", "0",
                                           "-p", str(server.port)]))
        finally:
            done.set()

    shown = [0]

    def show(message, category, *where):
        if category is UserWarning and str(message).startswith("mine"):
            shown[0] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show    # counted, not kept: they are many
        t = threading.Thread(target=refused)
        t.start()
        mine = 0
        while not done.is_set():
            warnings.warn("mine", UserWarning)
            mine += 1
        t.join()
    assert codes == [1] * calls
    said = set(capsys.readouterr().err.splitlines())
    assert len(said) == 1 and said.pop().startswith(
        "prefill: no row can be cached: session 0 is no session"), said
    assert shown[0] == mine


def without_session(e):
    return {k: v for k, v in e.items() if k not in ("SHMCACHE_SESSION_ID", "SESSION_ID")}


def test_a_missing_required_argument_is_one_line_and_exit_1(server):
    r = subprocess.run([sys.executable, "-m", "shmcache.prefill"],
                       env=without_session(env(server)), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert r.stderr == ("prefill: error: the following arguments are required: "
                        "dataset; see 'python3 -m shmcache.prefill --help'\n")


def test_no_session_given_or_exported_is_one_line_and_exit_1(server):
    r = subprocess.run([sys.executable, "-m", "shmcache.prefill", "prefill_helpers:rows"],
                       env=without_session(env(server)), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert r.stderr == ("prefill: error: no session: pass --session_id S, or export "
                        "$SHMCACHE_SESSION_ID (`shmcache -g` prints one); see "
                        "'python3 -m shmcache.prefill --help'\n")


def test_the_session_comes_from_the_environment_as_for_dataset_cache(server, session):
    """The quick start exports $SHMCACHE_SESSION_ID for the trainers; the
    prefill before them takes it too, as DatasetCache() does."""
    r = subprocess.run([sys.executable, "-m", "shmcache.prefill", "prefill_helpers:rows",
                        "-j", "1"],
                       env=dict(without_session(env(server)),
                                SHMCACHE_SESSION_ID=str(session)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"of session {session}" in r.stderr.splitlines()[0], r.stderr
    bad = subprocess.run([sys.executable, "-m", "shmcache.prefill", "prefill_helpers:rows"],
                         env=dict(without_session(env(server)), SHMCACHE_SESSION_ID="x1"),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr == ("prefill: error: $SHMCACHE_SESSION_ID='x1' is not a session id "
                          "(a number in 0..4294967295 from `shmcache -g`); see "
                          "'python3 -m shmcache.prefill --help'\n")
