"""Same-run A/B of two builds of the Python package on the read path
(scripts/bench.sh runs it when BENCH_AB=<git rev> names the old one).

  ab_bench.py --port P --a BUILD_A --b BUILD_B [--rounds N] [--out FILE]

Two worker processes, one per build (PYTHONPATH=BUILD/clients/python),
each with its own session on the same server, take turns: a round asks
each worker for one short measurement of every case, A then B, then B then
A in the next round, so a burst of load from the machine's other users
falls on both alike. Cases:
  read_into_3k    DatasetCache.read_into of 64 (3 KB uint8, int64) rows
                  into torch tensors: the per-batch cost (batches/s);
  read_into_588k  read_into of 64 x 588 KB float32 rows, 2 threads: the
                  copy (rows/s);
  loader_t1/t2    warm CachedLoader epochs (150 KB float32 rows and an int
                  label, batch 64, num_threads 1 and 2): GB/s;
  loader_auto     the same with num_threads / prefetch "auto";
  loader12k_t1/t2/auto  the same over 12 KB uint8 rows in batches of 256
                  (the issue 36 sweep's small rows).
For each case: the best and the median round of each build, B/A of both,
and the CPU seconds each spent per unit (B/A): on a machine shared with
others the CPU time is the steadier figure. Measures; asserts nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = ("read_into_3k", "read_into_588k", "loader_t1", "loader_t2", "loader_auto",
         "loader12k_t1", "loader12k_t2", "loader12k_auto")


# ---- the worker (runs under one build) ---------------------------------------

def _worker(port, seconds):
    import numpy as np
    import torch
    import shmcache
    from shmcache.torch import CachedDataset, CachedLoader

    client = shmcache.Client(port=port)
    session = client.create_session()
    rng = np.random.default_rng(0)
    cache = shmcache.DatasetCache(session, port=port, name="ab", read_threads=2)
    small = rng.integers(0, 256, (2048, 3072), dtype=np.uint8)
    for i in range(len(small)):
        cache.put(i, (small[i], np.int64(i)))
    big = rng.standard_normal((128, 3, 224, 224), dtype=np.float32)
    for i in range(len(big)):
        cache.put(10000 + i, big[i])
    small_ids = [rng.integers(0, len(small), 64) for _ in range(64)]
    big_ids = [rng.integers(10000, 10000 + len(big), 64) for _ in range(64)]
    small_out = (torch.empty(64, 3072, dtype=torch.uint8), torch.empty(64, dtype=torch.int64))
    big_out = np.empty((64, 3, 224, 224), np.float32)

    class Rows(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n, self.x = n, torch.randn(3, 64, 200)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return self.x + i, i

        def __repr__(self):
            return f"Rows({self.n})"
    cds = CachedDataset(Rows(1024), shmcache.DatasetCache(session, port=port, name="ab-ld"),
                        async_puts=False)
    loaders = {f"loader_t{t}": CachedLoader(cds, batch_size=64, shuffle=True,
                                            num_threads=t, prefetch=4) for t in (1, 2)}
    loaders["loader_auto"] = CachedLoader(cds, batch_size=64, shuffle=True)

    class Small(torch.utils.data.Dataset):
        def __len__(self):
            return 8192

        def __getitem__(self, i):
            return torch.full((12288,), i % 251, dtype=torch.uint8), i

        def __repr__(self):
            return "Small(8192)"
    small_ds = CachedDataset(Small(), shmcache.DatasetCache(session, port=port, name="ab-12k"),
                             async_puts=False)
    for t in (1, 2, "auto"):
        loaders[f"loader12k_{'t' if t != 'auto' else ''}{t}"] = CachedLoader(
            small_ds, batch_size=256, shuffle=True, num_threads=t,
            prefetch=4 if t != "auto" else "auto")
    for loader in loaders.values():
        for _ in loader:       # the first epoch fills the cache; buffers warm
            pass

    def batches(ids, out, unit):
        k = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while True:
            for _ in range(8):
                cache.read_into(ids[k % len(ids)], out)
                k += 1
            wall = time.perf_counter() - t0
            if wall >= seconds:
                return k * unit / wall, (time.process_time() - c0) / (k * unit)

    def epoch(loader):
        t0, c0 = time.perf_counter(), time.process_time()
        nbytes = 0
        while True:
            for x, _ in loader:
                nbytes += x.numel() * x.element_size()
            wall = time.perf_counter() - t0
            if wall >= seconds:
                gb = nbytes / 1e9
                return gb / wall, (time.process_time() - c0) / gb

    print("ready", flush=True)
    try:
        for line in sys.stdin:
            case = line.strip()
            if case == "read_into_3k":
                r = batches(small_ids, small_out, 1)
            elif case == "read_into_588k":
                r = batches(big_ids, big_out, 64)
            else:
                r = epoch(loaders[case])
            print(json.dumps(r), flush=True)
    finally:
        client.destroy_session(session)


# ---- the driver ----------------------------------------------------------------

class Worker:
    def __init__(self, build, port, seconds):
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(build), "clients",
                                                       "python"))
        self.p = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--port", str(port),
             "--seconds", str(seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if self.p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the worker for {build} did not start")

    def run(self, case):
        self.p.stdin.write(case + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--a", help="the old build dir")
    ap.add_argument("--b", help="the new build dir")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return _worker(args.port, args.seconds)
    cases = args.cases.split(",")
    workers = {"a": Worker(args.a, args.port, args.seconds),
               "b": Worker(args.b, args.port, args.seconds)}
    got = {(w, c): [] for w in workers for c in cases}
    try:
        for r in range(args.rounds):
            for case in cases:
                for w in ("ab" if r % 2 == 0 else "ba"):
                    got[(w, case)].append(workers[w].run(case))
    finally:
        for w in workers.values():
            w.close()
    out = {}
    print(f"A = {args.a}, B = {args.b}, {args.rounds} interleaved rounds")
    print(f"{'case':<16} {'A best':>10} {'B best':>10} {'B/A best':>9} "
          f"{'B/A median':>11} {'B/A CPU/unit':>13}")
    for case in cases:
        a_rate = [x[0] for x in got[("a", case)]]
        b_rate = [x[0] for x in got[("b", case)]]
        a_cpu = min(x[1] for x in got[("a", case)])
        b_cpu = min(x[1] for x in got[("b", case)])
        row = dict(a_best=max(a_rate), b_best=max(b_rate),
                   best_ratio=max(b_rate) / max(a_rate),
                   median_ratio=statistics.median(b_rate) / statistics.median(a_rate),
                   cpu_per_unit_ratio=b_cpu / a_cpu)
        out[case] = row
        print(f"{case:<16} {row['a_best']:10.4g} {row['b_best']:10.4g} "
              f"{row['best_ratio']:9.2f} {row['median_ratio']:11.2f} "
              f"{row['cpu_per_unit_ratio']:13.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(a=args.a, b=args.b, rounds=args.rounds, cases=out), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
