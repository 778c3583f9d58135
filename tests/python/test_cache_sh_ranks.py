"""End to end: scripts/cache.sh with 2 ranks, as README shows it, on a tiny
generated dataset and a server of its own run dir. Both ranks run on one
session and the host holds one copy; the script exits 0 and leaves no
process behind (conftest's leak check: no rank, no server, no shm file once
the fixture stopped the server). One rank that fails (killed, as the
out-of-memory killer does): non-zero exit naming it, the other rank
finishes. cache.sh stopped by a signal (a scheduler's SIGTERM, Ctrl-C, a
closed terminal): its ranks end with it."""

import contextlib
import os
import re
import signal
import stat
import subprocess
import threading

import pytest

from conftest import ROOT, _alive, wait_for

CACHE_SH = ROOT / "scripts" / "cache.sh"
TRAIN = ROOT / "scripts" / "my_training_script.py"
N = 64


def dataset(server, tmp_path):
    data = tmp_path / "cifar10"
    subprocess.run(["/usr/bin/python3", str(TRAIN), "--generate", str(N),
                    "--dataset_path", str(data)], check=True, env=server.env,
                   capture_output=True, timeout=60)
    return data


def python_that_in_rank(tmp_path, rank, command):
    """A $PYTHON for cache.sh that runs the training script, after running
    the bash `command` in rank `rank`."""
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/bash\n"
        f'for a in "$@"; do [ "$prev" = --device ] && [ "$a" = {rank} ] && {command}; '
        'prev=$a; done\n'
        'exec /usr/bin/python3 "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def python_that_kills_rank(tmp_path, rank):
    """Rank `rank` SIGKILLs itself (as the out-of-memory killer would)."""
    return python_that_in_rank(tmp_path, rank, "kill -9 $$")


def test_two_ranks_share_one_session_and_the_host_holds_one_copy(server, tmp_path):
    data = dataset(server, tmp_path)
    r = subprocess.run([str(CACHE_SH), str(data), "2"], env=server.env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    got = dict((int(k), int(v)) for v, k in
               re.findall(r"^Got (\d+) samples on device (\d+)$", r.stdout, re.M))
    assert got == {0: N // 2, 1: N // 2}, r.stdout
    session = int(re.search(r"^cache.sh: session (\d+),", r.stdout, re.M).group(1))
    (cache,) = server.cache_rows(session).values()
    assert cache["mem_cached"] == N and cache["misses"] == N   # one copy, not two
    assert [s["session"] for s in server.sessions()] == [session]


def test_one_rank_killed_fails_the_run_and_names_it(server, tmp_path):
    data = dataset(server, tmp_path)
    r = subprocess.run([str(CACHE_SH), str(data), "2"],
                       env=dict(server.env, PYTHON=str(python_that_kills_rank(tmp_path, 1))),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cache.sh: device 1 failed" in r.stderr
    assert "device 0 failed" not in r.stderr
    assert f"Got {N // 2} samples on device 0" in r.stdout


def python_that_ignores_sigterm_in_rank(tmp_path, rank):
    """Rank `rank` ignores SIGTERM (a handler that hangs, a library that
    masks it): SIG_IGN outlives the exec."""
    return python_that_in_rank(tmp_path, rank, 'trap "" TERM')


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


@contextlib.contextmanager
def training(server, tmp_path, trainers=(0, 1), **env):
    """cache.sh with 2 ranks, those of `trainers` training for good (the
    others end as their $PYTHON makes them), in a session of its own: yields
    (the cache.sh process, its ranks still running) once those train and
    only those run; whatever the test did, ends them all."""
    data = dataset(server, tmp_path)
    p = subprocess.Popen([str(CACHE_SH), str(data), "2"],
                         env=dict(server.env, TRAIN_ARGS="--epochs 100000", **env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)
    reader.start()
    ranks = []
    try:
        wait_for(lambda: {f"device {k} epoch 1" for k in trainers} <=
                 {ln[:16] for ln in out} and len(_children(p.pid)) == len(trainers),
                 timeout=120, what=f"ranks {trainers} training, and only they running")
        ranks = _children(p.pid)
        yield p, ranks
    finally:
        p.kill()
        p.wait()
        for r in ranks:
            if _alive(r):
                os.kill(r, signal.SIGKILL)


def _ended_with(p, ranks, sig):
    """cache.sh exited 128+sig and its ranks ended: its stderr."""
    assert p.wait(timeout=60) == 128 + sig
    wait_for(lambda: not any(_alive(r) for r in ranks), timeout=30,
             what="the ranks to end with cache.sh")
    return p.stderr.read()


@pytest.mark.parametrize("sig,group", [(signal.SIGTERM, False),   # a scheduler, `kill`
                                       (signal.SIGINT, True),     # Ctrl-C: the terminal's group
                                       (signal.SIGHUP, True)])    # the terminal closed
def test_cache_sh_stopped_by_a_signal_stops_its_ranks(server, tmp_path, sig, group):
    """Once a stopped cache.sh left its ranks training: they ignore the
    terminal's SIGINT (started with & by a shell without job control), and
    nothing sent them the SIGTERM."""
    with training(server, tmp_path) as (p, ranks):
        if group:
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
        err = _ended_with(p, ranks, sig)
        assert f"cache.sh: stopped by {sig.name}; stopping the 2 devices still running" \
            in err


def test_a_stopped_cache_sh_signals_only_the_ranks_still_running(server, tmp_path):
    """Once cache.sh sent its SIGTERM to every rank's pid, those of ranks
    that had ended too: bash had reaped them, so the pid could be another
    process's by then."""
    python = python_that_in_rank(tmp_path, 1, "exit 0")
    with training(server, tmp_path, trainers=(0,), PYTHON=str(python)) as (p, ranks):
        p.send_signal(signal.SIGTERM)
        err = _ended_with(p, ranks, signal.SIGTERM)
        assert "cache.sh: stopped by SIGTERM; stopping the 1 device still running" \
            in err, err


# "08": a grace written with a leading zero is decimal, as written; bash
# read it as octal ("010" was 8 s) and "08" failed its arithmetic, which
# SIGKILLed at once.
@pytest.mark.parametrize("grace,said", [("1", "1"), ("08", "8")])
def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace(server, tmp_path, grace,
                                                                said):
    """Once cache.sh waited for good on a rank that ignored its SIGTERM, and
    with it the job its scheduler was stopping."""
    python = python_that_ignores_sigterm_in_rank(tmp_path, 1)
    with training(server, tmp_path, SHMCACHE_STOP_GRACE=grace, PYTHON=str(python)) \
            as (p, ranks):
        p.send_signal(signal.SIGTERM)
        err = _ended_with(p, ranks, signal.SIGTERM)
        assert "cache.sh: device 1 (pid " in err and \
            f"still ran {said}s after SIGTERM; killing it" in err, err
        assert "cache.sh: device 0 (pid" not in err, err
        assert "value too great" not in err, err


def test_a_stop_grace_that_is_not_a_number_is_refused(server, tmp_path):
    data = dataset(server, tmp_path)
    r = subprocess.run([str(CACHE_SH), str(data), "2"],
                       env=dict(server.env, SHMCACHE_STOP_GRACE="10s"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "SHMCACHE_STOP_GRACE must be a whole number of seconds, got '10s'" in r.stderr
