"""CachedLoader's num_threads "auto" (torch/_autotune.py) against every
fixed thread count on simulated, noisy batch times: what its trials cost
and what a wrong verdict costs, apart from this machine's load.

  autotune_sim.py [--seeds 40] [--passes 60] [--out FILE]
                  [--tuner PATH_TO_ANOTHER_autotune.py]

A profile is a batch rate by thread count and the batches of a pass:
this 2-CPU VM's warm epochs (12 KB rows in batches of 256, 150 KB in
batches of 64, 78 and 31 batches a pass, measured by host_sweep.py), two
made-up ones whose best count is not the tuner's start (1 or 3 threads),
and issue 36's 16-core host (150 KB rows, 1/2/4/8/16 threads: 16.4 /
28.8 / 25.2 / 13.2 / 8.3 GB/s, the counts between interpolated). Each
batch's time is the rate's times a noise factor: lognormal per batch
(sigma), and bursts of the machine's other users (a burst starts at a
batch with probability p, lasts `length` batches, and slows them by 1.5x
up to `x`). Every tuner and fixed count of a seed sees the same noise,
batch by batch (common random numbers), as the consumer of a host-only
epoch that waits for every batch, with a new pass (start_pass) every
pass's batches. Printed for each profile and noise, over the seeds: the
tuner's whole run against the best fixed count's (its time / the tuner's;
median and worst seed), and the median of its passes against the same
passes of that count (the first pass apart), as host_sweep.py reports a
real run. --tuner measures another version of the module (e.g. main's,
from `git show main:clients/python/shmcache/torch/_autotune.py`) beside
this one. Deterministic; measures only.
"""

import argparse
import importlib.util
import json
import math
import random
import statistics
import sys

KB = 1024

# name -> ({threads: batches per second}, batches per pass, max_threads)
PROFILES = {
    "2 CPUs, 12 KB x 256": ({1: 982e3 / 256, 2: 1268e3 / 256, 3: 1110e3 / 256,
                             4: 1000e3 / 256}, 78, 4),
    "2 CPUs, 150 KB x 64": ({1: 133e3 / 64, 2: 154e3 / 64, 3: 147e3 / 64, 4: 140e3 / 64},
                            31, 4),
    "best 3 (made up)": ({1: 600.0, 2: 850.0, 3: 1000.0, 4: 900.0}, 78, 4),
    "best 1 (made up)": ({1: 1000.0, 2: 850.0, 3: 750.0, 4: 700.0}, 78, 4),
}
NOISES = {  # name -> (sigma, p, length, x)
    "quiet": (0.05, 0.0, 1, 1.0),
    "noisy": (0.3, 0.01, 40, 4.0),
    "very noisy": (0.6, 0.03, 80, 6.0),
}


def _issue36_host():
    """Issue 36's 16-core host, 150 KB rows in batches of 64: GB/s by
    threads 1/2/4/8/16, log-interpolated between, 8.3 beyond 16."""
    known = {1: 16.4, 2: 28.8, 4: 25.2, 8: 13.2, 16: 8.3}
    pts = sorted(known)
    rates = {}
    for t in range(1, 33):
        lo = max(p for p in pts if p <= t)
        hi = min((p for p in pts if p >= t), default=lo)
        if lo == hi:
            gb = known[lo]
        else:
            f = math.log(t / lo) / math.log(hi / lo)
            gb = known[lo] ** (1 - f) * known[hi] ** f
        rates[t] = gb * 1e9 / (64 * 150 * KB)
    return rates, 2_000 * 16 // 64, 32


PROFILES["16 cores, 150 KB x 64 (issue 36)"] = _issue36_host()


class _Clock:
    """The simulated time (run() advances it by each batch)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


CLOCK = _Clock()


def noise(seed, n, sigma, p, length, x):
    rnd = random.Random(seed)
    out, left, burst = [], 0, 1.0
    for _ in range(n):
        if left == 0 and rnd.random() < p:
            left, burst = length, rnd.uniform(1.5, x)
        out.append(rnd.lognormvariate(0, sigma) * (burst if left else 1.0))
        left = max(0, left - 1)
    return out


def run(module, rates, per_pass, max_threads, factors, fixed=None):
    """(whole run's seconds, seconds by pass) of one tuner (fixed: that
    count, never changed) over the batches' noise `factors`."""
    tuner = module.AutoTune(fixed or 2, 4, fixed is None, False, max_threads=max_threads,
                            max_bytes=1 << 40)
    busy, passes = 0.0, []
    for i, f in enumerate(factors):
        if i % per_pass == 0:
            passes.append(0.0)
            getattr(tuner, "start_pass", lambda: None)()
        step = f / rates[tuner.threads]
        CLOCK.now += step
        busy += step * tuner.threads
        passes[-1] += step
        tuner.observe(step, step, 1 << 20, busy, tuner.threads)
    return sum(passes), passes


def measure(module, args):
    out = {}
    for pname, (rates, per_pass, max_threads) in PROFILES.items():
        for nname, spec in NOISES.items():
            whole, by_pass = [], []
            for seed in range(args.seeds):
                f = noise(seed, per_pass * args.passes, *spec)
                ref = min((run(module, rates, per_pass, max_threads, f, fixed=t)
                           for t in rates), key=lambda r: r[0])
                total, passes = run(module, rates, per_pass, max_threads, f)
                whole.append(ref[0] / total)
                by_pass.append(statistics.median(
                    b / a for a, b in zip(passes[1:], ref[1][1:])))
            out[f"{pname} | {nname}"] = dict(
                whole_median=statistics.median(whole), whole_worst=min(whole),
                passes_median=statistics.median(by_pass))
    return out


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--passes", type=int, default=60)
    ap.add_argument("--tuner", help="another _autotune.py to measure beside this one")
    ap.add_argument("--out")
    args = ap.parse_args()
    import logging
    logging.getLogger("shmcache").setLevel(logging.WARNING)
    from shmcache.torch import _autotune
    tuners = {"this": _autotune}
    if args.tuner:
        tuners["other"] = load(args.tuner, "other_autotune")
    # A tuner that reads the clock (main's) reads the simulated one.
    import time
    time.monotonic = CLOCK
    results = {name: measure(m, args) for name, m in tuners.items()}
    print(f"{'profile | noise':52} " + "  ".join(
        f"{n + ': run (worst), passes':>30}" for n in tuners))
    for key in results["this"]:
        print(f"{key:52} " + "  ".join(
            f"{r[key]['whole_median']:10.3f} ({r[key]['whole_worst']:.3f}), "
            f"{r[key]['passes_median']:.3f}" for r in results.values()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
