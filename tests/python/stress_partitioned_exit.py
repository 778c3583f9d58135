"""Runs the two-rank jobs of test_partitioned_exit.py again and again, with
busy loops beside them, and counts how each ended: a stress script for the
rare exit failures (an abort, "terminate called without an active
exception"; a rank that never ends), not a test.

    stress_partitioned_exit.py [--runs N] [--cases kept,parked,...]
                               [--kinds dataloader,cachedloader]
                               [--load K] [--server] [--out DIR]

--runs N    rounds of every (case, kind) (default 10)
--cases     test_partitioned_exit.CASES names (default: all)
--kinds     what PartitionedLoader wraps (default: both)
--load K    busy loops of this script beside the jobs, 0..2 (default 2)
--server    a shmcached of its own (default: none, the cache is bypassed)
--jobs J    jobs at once (default 1): more load, of the jobs' own kind
--timeout   seconds a job may take before it counts as a hang (default 120)
--exit-join-s S  the exit hook's bound made S (a diagnosis: a thread left
            running at the interpreter's end shows where it was)
--out DIR   where the outputs of failed jobs go (default: a new temp dir)

Each rank runs with faulthandler on (an abort prints every thread's Python
stack), dumps its threads' stacks on SIGUSR1, and its last exit hook prints
where shmcache's threads still alive are ("at exit: ..."); core files are allowed
(core_pattern "core": they land in the job's dir). A job that outlives
--timeout gets, before it is killed, SIGUSR1 and a gdb "thread apply all
bt" of each of its live processes (the ranks and their children). Prints
one line per job and the counts by outcome at the end (also written to
DIR/counts.json).
"""

import argparse
import collections
import concurrent.futures
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from conftest import ADMIN, BUILD, PYTHONPATH, free_tcp_port  # noqa: E402
from test_partitioned_exit import CASES  # noqa: E402


WRAP = r'''
import faulthandler, os, runpy, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)
if os.environ.get("STRESS_EXIT_JOIN_S"):   # --exit-join-s: a wider window
    from shmcache.torch import _exit_threads
    _exit_threads.EXIT_JOIN_S = float(os.environ["STRESS_EXIT_JOIN_S"])

def _where_at_exit():   # the last exit hook: where our threads are then
    import threading, traceback
    frames = sys._current_frames()
    for t in threading.enumerate():
        if t.name.startswith("shmcache") and t.ident in frames:
            print("at exit:", t.name, "".join(traceback.format_stack(frames[t.ident])[-4:]),
                  flush=True)
import atexit
atexit.register(_where_at_exit)
sys.path.insert(0, {here!r})
sys.argv = [{script!r}] + sys.argv[1:]
runpy.run_path({script!r}, run_name="__main__")
'''


def _cores():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _children(pid):
    """pid and its descendants, as /proc shows them now."""
    kids = collections.defaultdict(list)
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids[ppid].append(int(p))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _dump_hung(ranks, where):
    """SIGUSR1 (Python stacks) and gdb's C stacks of every live process."""
    notes = []
    for r, p in enumerate(ranks):
        if p.poll() is not None:
            continue
        for pid in _children(p.pid):
            if pid == p.pid:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
            g = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt"],
                               capture_output=True, text=True, timeout=120)
            path = os.path.join(where, f"gdb-rank{r}-{pid}.txt")
            with open(path, "w") as f:
                f.write(g.stdout + g.stderr)
            notes.append(path)
    time.sleep(1)   # the SIGUSR1 dumps reach the pipes
    return notes


def run_job(case, kind, env, where, timeout):
    """Runs one two-rank job in `where`; returns (outcome, text)."""
    script = os.path.join(HERE, "partition_exit_rank.py")
    code = WRAP.format(here=HERE, script=script)
    gone_r, gone_w = os.pipe()
    env = dict(env, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_tcp_port()), OMP_NUM_THREADS="1",
               GONE_FD=str(gone_r))
    ranks, logs = [], []
    try:
        for r, fd in ((0, gone_w), (1, gone_r)):
            log = open(os.path.join(where, f"rank{r}.log"), "w+")
            logs.append(log)
            ranks.append(subprocess.Popen(
                [sys.executable, "-X", "faulthandler", "-c", code, kind, case],
                env=dict(env, RANK=str(r)), pass_fds=(fd,), stdout=log,
                stderr=subprocess.STDOUT, cwd=where, preexec_fn=_cores))
    finally:
        os.close(gone_r)
        os.close(gone_w)
    hung = []
    try:
        deadline = time.monotonic() + timeout
        if case == "sigterm":
            while True:
                with open(logs[0].name) as f:
                    said = f.read()
                if "batch\n" in said or ranks[0].poll() is not None:
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if ranks[0].poll() is None:
                ranks[0].send_signal(signal.SIGTERM)
        while any(p.poll() is None for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        hung = [r for r, p in enumerate(ranks) if p.poll() is None]
        if hung:
            _dump_hung(ranks, where)
    finally:
        for p in ranks:
            if p.poll() is None:
                for pid in reversed(_children(p.pid)):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                p.wait()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    rcs = tuple(p.returncode for p in ranks)
    text = f"rcs {rcs} hung {hung}\n" + "\n---- rank 1\n".join(outs)
    if hung:
        return "hang-rank" + ",".join(map(str, hung)), text
    if any(rc == -signal.SIGABRT for rc in rcs) or "terminate called" in "".join(outs):
        return "abort-rank" + ",".join(str(r) for r, rc in enumerate(rcs)
                                        if rc == -signal.SIGABRT), text
    if rcs != CASES[case]:
        return f"rc{rcs}", text
    return "ok", text


def start_server(where):
    port = free_tcp_port()
    env = dict(os.environ, SHMCACHE_PORT=str(port), SHMCACHE_RUN_DIR=os.path.join(where, "run"),
               PYTHONPATH=PYTHONPATH, SHMCACHE_BUILD_DIR=str(BUILD))
    os.mkdir(env["SHMCACHE_RUN_DIR"])
    subprocess.run([str(ADMIN), "-p", str(port), "--start", "--log_dir", where], env=env,
                   check=True, capture_output=True)
    return env


def stop_server(env):
    subprocess.run([str(ADMIN), "-p", env["SHMCACHE_PORT"], "--stop"], env=env,
                   capture_output=True)


def session(env):
    out = subprocess.run([str(ADMIN), "-p", env["SHMCACHE_PORT"], "-g"], env=env, check=True,
                         capture_output=True, text=True).stdout
    return out.split()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cases", default=",".join(sorted(CASES)))
    ap.add_argument("--kinds", default="dataloader,cachedloader")
    ap.add_argument("--load", type=int, default=2, choices=(0, 1, 2))
    ap.add_argument("--server", action="store_true")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--exit-join-s", help="the exit hook's bound (EXIT_JOIN_S), made "
                    "shorter: threads still running at the interpreter's end more often")
    ap.add_argument("--out")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="stress-exit-")
    os.makedirs(out, exist_ok=True)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(a.load)]
    counts = collections.Counter()
    lock = threading.Lock()
    env = None
    try:
        if a.server:
            env = start_server(out)
        else:   # no daemon on this port: the cache is bypassed
            env = dict(os.environ, SHMCACHE_PORT=str(free_tcp_port()),
                       SHMCACHE_RUN_DIR=tempfile.mkdtemp(dir=out),
                       PYTHONPATH=PYTHONPATH, SHMCACHE_BUILD_DIR=str(BUILD))
        if a.exit_join_s:
            env["STRESS_EXIT_JOIN_S"] = a.exit_join_s
        jobs = [(run, case, kind) for run in range(a.runs)
                for case in a.cases.split(",") for kind in a.kinds.split(",")]

        def one(job):
            run, case, kind = job
            where = os.path.join(out, f"{run:03d}-{case}-{kind}")
            os.mkdir(where)
            sid = session(env) if a.server else "1"
            t0 = time.monotonic()
            outcome, text = run_job(case, kind, dict(env, SESSION_ID=sid), where, a.timeout)
            with lock:
                counts[(case, kind, outcome)] += 1
            with open(os.path.join(where, "outcome.txt"), "w") as f:
                f.write(outcome + "\n" + text)
            print(f"{run:3d} {case:8s} {kind:12s} {outcome} "
                  f"{time.monotonic() - t0:5.1f}s load {os.getloadavg()[0]:.1f}", flush=True)
            if outcome == "ok":   # keep only the failures' files
                subprocess.run(["rm", "-rf", where])

        with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
            for f in [pool.submit(one, j) for j in jobs]:
                f.result()
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if a.server and env is not None:
            stop_server(env)
    table = {f"{c}/{k}/{o}": n for (c, k, o), n in sorted(counts.items())}
    with open(os.path.join(out, "counts.json"), "w") as f:
        json.dump(table, f, indent=1)
    jobs = sum(counts.values())
    failed = sum(n for (_, _, o), n in counts.items() if o != "ok")
    print(f"{jobs} jobs, {failed} failed; outputs of failures in {out}")
    for key, n in table.items():
        print(f"  {key}: {n}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
