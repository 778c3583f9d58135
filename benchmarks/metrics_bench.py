#!/usr/bin/python3
"""How long `shmcache --metrics` takes with many caches (target: < 5 ms with
1,000). Starts a private server, opens CACHES caches spread over sessions
(each with a miss and a put, so that every counter has a value), then runs
the command REPEAT times and prints JSON: wall times of the whole command
(fork, exec, connect, two requests, formatting, printing) with its output
going to /dev/null, and again read through a pipe by this script (Python
reading 1.3 MB in 64 KB pieces), with `shmcache --help` (process start only)
and --metrics on the empty server for scale. A benchmark, not a test: it
asserts nothing.

    benchmarks/metrics_bench.py [--build build] [--caches 1000] [--repeat 50]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv, env, repeat, stdout=subprocess.DEVNULL):
    """Wall times in ms of `repeat` runs, and the output of the last (with
    stdout=subprocess.PIPE)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run(argv, env=env, stdout=stdout, check=True)
        times.append((time.perf_counter() - t0) * 1e3)
    return times, r.stdout


def summary(times):
    times = sorted(times)
    return {"median_ms": round(statistics.median(times), 3),
            "p90_ms": round(times[int(len(times) * 0.9)], 3),
            "min_ms": round(times[0], 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=str(Path(__file__).resolve().parents[1] / "build"))
    p.add_argument("--caches", type=int, default=1000)
    p.add_argument("--per_session", type=int, default=20)
    p.add_argument("--repeat", type=int, default=50)
    a = p.parse_args()
    build = Path(a.build)
    admin = str(build / "clients" / "admin" / "shmcache")
    sys.path.insert(0, str(build / "clients" / "python"))
    import numpy as np
    import shmcache

    run_dir = tempfile.mkdtemp(prefix="shmcache-metrics-bench.")
    port = 20000 + os.getpid() % 20000
    env = dict(os.environ, SHMCACHE_RUN_DIR=run_dir, SHMCACHE_PORT=str(port))
    os.environ.update(SHMCACHE_RUN_DIR=run_dir, SHMCACHE_PORT=str(port))
    subprocess.run([admin, "--start", "--log_dir", run_dir + "/log"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    try:
        start_only, _ = timed([admin, "--help"], env, a.repeat)
        empty, _ = timed([admin, "--metrics"], env, a.repeat)
        caches, session = [], None
        for i in range(a.caches):
            if i % a.per_session == 0:
                out = subprocess.run([admin, "-g"], env=env, check=True,
                                     capture_output=True, text=True).stdout
                session = int(out.split()[-1])
            c = shmcache.DatasetCache(session, name=f"dataset-{i}/train")
            c.get(0)
            c.put(0, (np.zeros(16, dtype=np.uint8),))
            c.close()
            caches.append(c)
        full, _ = timed([admin, "--metrics"], env, a.repeat)
        piped, text = timed([admin, "--metrics"], env, a.repeat, subprocess.PIPE)
    finally:
        subprocess.run([admin, "--stop"], env=env, stdout=subprocess.DEVNULL)
    print(json.dumps({
        "benchmark": "shmcache --metrics",
        "caches": a.caches,
        "sessions": -(-a.caches // a.per_session),
        "output_bytes": len(text),
        "output_lines": text.count(b"\n"),
        "metrics_with_caches": summary(full),
        "metrics_with_caches_piped": summary(piped),
        "metrics_empty_server": summary(empty),
        "help_process_start_only": summary(start_only),
        "target_ms": 5,
    }, indent=2))


if __name__ == "__main__":
    main()
