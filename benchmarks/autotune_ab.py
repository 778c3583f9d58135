"""Two versions of CachedLoader's num_threads "auto" (torch/_autotune.py)
side by side in one process, on host_sweep.py's warm epochs: the same
cache, fresh loaders each run (num_threads 1, 2, auto with tuner A, auto
with tuner B), a first round then ROUNDS rounds of one epoch each,
interleaved, the order turned each round and rotated each run; each auto
against the fixed count of the fastest median epoch as host_sweep.py
reports it (the median over the rounds of their epochs' ratio, the first
round apart).

  autotune_ab.py --port P --a OLD_autotune.py [--b NEW_autotune.py]
                 [--runs 8] [--out FILE]

--a is e.g. main's, from `git show main:clients/python/shmcache/torch/
_autotune.py`; --b defaults to the package's own. Printed per run and row
size: both ratios, the GB/s of each setting (median epoch), the load
average; then the median and mean over the runs. Measures only.
"""

import argparse
import json
import os
import statistics
import sys

from autotune_sim import load
from host_sweep import KB, Rows, epoch, new_cache

ROUNDS = 6


def one_run(ds, bs, tuners, run):
    """{setting: [epoch seconds by round]} of fresh loaders."""
    import shmcache.torch.loader as loader_module
    from shmcache.torch import CachedLoader
    loaders = {t: CachedLoader(ds, batch_size=bs, shuffle=True, num_threads=t) for t in (1, 2)}
    own = loader_module.AutoTune
    try:
        for name, module in tuners.items():
            # The loader makes its tuner from the name its module imported.
            loader_module.AutoTune = module.AutoTune
            loaders[name] = CachedLoader(ds, batch_size=bs, shuffle=True)
    finally:
        loader_module.AutoTune = own
    order = list(loaders)
    order = order[run % len(order):] + order[:run % len(order)]
    times = {t: [] for t in order}
    for r in range(1 + ROUNDS):
        for t in order if r % 2 == 0 else order[::-1]:
            times[t].append(epoch(loaders[t])[0])
    return times, {name: loaders[name].stats()["num_threads"] for name in tuners}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    import shmcache
    from shmcache.torch import CachedDataset, CachedLoader
    from shmcache.torch import _autotune
    tuners = {"A": load(args.a, "autotune_a"),
              "B": load(args.b, "autotune_b") if args.b else _autotune}
    results = {}
    client, session, cache = new_cache(shmcache, args.port)
    try:
        for size, bs, n in ((12 * KB, 256, 20000), (150 * KB, 64, 2000)):
            ds = CachedDataset(Rows(n, size), cache, name=f"autotune-ab-{size}")
            epoch(CachedLoader(ds, batch_size=bs, shuffle=True, num_workers=2))
            ds.flush(600)
            res = results[size] = {"A": [], "B": [], "threads": [], "load": []}
            for run in range(args.runs):
                times, threads = one_run(ds, bs, tuners, run)
                best = min((1, 2), key=lambda t: statistics.median(times[t][1:]))
                for k in tuners:
                    res[k].append(statistics.median(
                        times[best][r] / times[k][r] for r in range(1, 1 + ROUNDS)))
                res["threads"].append(threads)
                res["load"].append(os.getloadavg()[0])
                gbs = {str(t): round(n * size / statistics.median(v[1:]) / 1e9, 2)
                       for t, v in times.items()}
                print(f"{size // KB} KB run {run}: auto vs best ({best} threads) "
                      f"A {res['A'][-1]:.3f} B {res['B'][-1]:.3f}; GB/s {gbs}; settled "
                      f"{threads}; load {res['load'][-1]:.1f}", flush=True)
            print(f"{size // KB} KB over {args.runs} runs: A median "
                  f"{statistics.median(res['A']):.3f} mean {statistics.mean(res['A']):.3f}; "
                  f"B median {statistics.median(res['B']):.3f} mean "
                  f"{statistics.mean(res['B']):.3f}", flush=True)
    finally:
        client.destroy_session(session)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
