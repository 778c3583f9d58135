"""What storing a cold epoch's misses costs CachedDataset.__getitems__, in
one process, without DataLoader and without decode: the cache's own CPU per
row, async puts against puts waited for, two builds interleaved.

  miss_put_cpu.py --port P --builds OLD,NEW [--rounds N] [--size 12|150]
                  [--out FILE]

Each run is a fresh process (PYTHONPATH=BUILD/clients/python) that makes a
fresh session on the server at port P and asks __getitems__ for every row
of the host sweep's source (20,000 x 12 KB in batches of 256, or 2,000 x
150 KB in batches of 64, and an int label; no decode time), in a shuffled
order, all misses, then waits for the puts (flush). Modes: async (the
background writer, woken by batch as in a DataLoader worker; a 1 GB queue,
so that no row is dropped and every mode stores all of them) and sync
(async_puts=False). CPU per row is the process's (all its threads) plus the
daemon's (/proc/PID/stat); also the median wall of a batch. A round runs
each (build, mode) once in a shuffled order; the summary gives medians and,
against NEW's sync, the same-round ratios. Asserts that every row was
stored and counted as one miss.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

from first_epoch_cpu import SHAPES, daemon_cpu, server_pid, write_out
from host_sweep import Rows

MODES = ("async", "sync")


def _one(args):
    import shmcache
    import shmcache.torch.datasets as datasets
    # The writer of a DataLoader worker: woken by a batch, not by every row.
    datasets._ask_in_worker = lambda: True
    from shmcache.torch import CachedDataset
    size, bs, n = SHAPES[args.size]
    client = shmcache.Client(port=args.port)
    session = client.create_session()
    try:
        ds = CachedDataset(Rows(n, size), shmcache.DatasetCache(session, port=args.port),
                           name="misses", async_puts=args.mode == "async",
                           put_queue=1 << 30)
        ids = list(range(n))
        random.Random(0).shuffle(ids)
        walls = []
        d0, c0 = daemon_cpu(args.daemon_pid), time.process_time()
        for k in range(0, n, bs):
            t0 = time.perf_counter()
            ds.__getitems__(ids[k:k + bs])
            walls.append(time.perf_counter() - t0)
        ds.flush(600)
        c1, d1 = time.process_time(), daemon_cpu(args.daemon_pid)
        st = ds.cache.stats()
        ds.cache.close()
    finally:
        client.destroy_session(session)
    if st["misses"] != n or st["hits"] or st["mem_rows"] + st["disk_rows"] != n:
        raise RuntimeError(f"{st['misses']} misses, {st['hits']} hits, "
                           f"{st['mem_rows'] + st['disk_rows']} rows stored of {n}")
    print(json.dumps(dict(process_us=(c1 - c0) / n * 1e6, daemon_us=(d1 - d0) / n * 1e6,
                          batch_ms=statistics.median(walls) * 1e3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--daemon-pid", type=int)
    ap.add_argument("--builds", help="OLD,NEW build dirs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=12, choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=0, help="of the rounds' orders")
    ap.add_argument("--out")
    ap.add_argument("--one", action="store_true")
    ap.add_argument("--mode", choices=MODES)
    args = ap.parse_args()
    if args.daemon_pid is None:
        args.daemon_pid = server_pid(args.builds, args.port)
    if args.one:
        return _one(args)
    builds = args.builds.split(",")
    runs = [(b, m) for b in builds for m in MODES]
    got = {r: [] for r in runs}
    rng = random.Random(args.seed)
    for r in range(args.rounds):
        order = runs[:]
        rng.shuffle(order)
        for b, m in order:
            env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(b), "clients",
                                                           "python"))
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--one",
                                "--mode", m, "--port", str(args.port), "--daemon-pid",
                                str(args.daemon_pid), "--size", str(args.size)],
                               env=env, capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                raise RuntimeError(f"{b} {m}: {p.stderr[-2000:]}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            res["total_us"] = res["process_us"] + res["daemon_us"]
            got[(b, m)].append(res)
            print(f"round {r} {b} {m:<5} CPU {res['total_us']:7.1f} us/row (process "
                  f"{res['process_us']:.1f}, daemon {res['daemon_us']:.1f}), batch "
                  f"{res['batch_ms']:.2f} ms", flush=True)
    print(f"\n{args.rounds} rounds, {args.size} KB rows, medians (ranges)")
    print(f"{'build':<28} {'mode':<6} {'CPU us/row':>24} {'process':>8} {'daemon':>8} "
          f"{'batch ms':>9} {'NEW sync / this':>24}")
    ref = got[(builds[-1], "sync")]
    summary = {}
    for (b, m), xs in got.items():
        tot = [x["total_us"] for x in xs]
        ratio = [a["total_us"] / x["total_us"] for a, x in zip(ref, xs)]
        summary[f"{b}:{m}"] = dict(runs=xs, new_sync_over_this=ratio)

        def med(v):
            return statistics.median(v)
        print(f"{b[-28:]:<28} {m:<6} {med(tot):8.1f} ({min(tot):.1f}-{max(tot):.1f})"
              f"{med(x['process_us'] for x in xs):>10.1f} {med(x['daemon_us'] for x in xs):>8.1f}"
              f" {med(x['batch_ms'] for x in xs):>9.2f} {med(ratio):>8.3f} "
              f"({min(ratio):.3f}-{max(ratio):.3f}, lower in "
              f"{sum(v < 1 for v in ratio)}/{len(ratio)})")
    write_out(args, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
