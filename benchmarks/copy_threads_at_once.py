"""How many copy threads a warm CachedLoader epoch keeps at work at once,
by num_threads, as a host of --cpus CPUs would share them out (issue 36's
warm feed; a 2-core machine can show what a 16-core one would do).

  copy_threads_at_once.py --port P [--cpus 16] [--read_threads 4]

The loader's CPU count is set to --cpus and the cache's read_threads to
--read_threads (its default there: min(4, CPUs)); each batch's read
(DatasetCache.fill_batch) adds the copy threads it was given while it runs,
held open 2 ms so that the batches in flight overlap as they would with
real copies. Printed per num_threads (1, 2, 4, ... --cpus, prefetch
"auto" as the host sweep runs it): the time-weighted mean and the peak of
the copy threads at work at once over an epoch of 64 batches. Measures the
sharing only, not a copy rate; asserts nothing.
"""

import argparse
import sys
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cpus", type=int, default=16)
    ap.add_argument("--read_threads", type=int, default=4)
    args = ap.parse_args()
    import torch
    import shmcache
    import shmcache.torch._assemble as assemble
    from shmcache.torch import CachedDataset, CachedLoader
    assemble.usable_cpus = lambda: args.cpus   # the loader's view of the host

    lock = threading.Lock()
    at = dict(now=0, last=None, area=0.0, span=0.0, peak=0)

    def tick(delta):
        with lock:
            t = time.perf_counter()
            if at["last"] is not None:
                at["area"] += at["now"] * (t - at["last"])
                at["span"] += t - at["last"]
            at["last"] = t
            at["now"] += delta
            at["peak"] = max(at["peak"], at["now"])
    fill_batch = shmcache.DatasetCache.fill_batch

    def counted(self, ids, out, columns, threads, codes):
        tick(threads)
        try:
            time.sleep(0.002)
            return fill_batch(self, ids, out, columns, threads, codes)
        finally:
            tick(-threads)
    shmcache.DatasetCache.fill_batch = counted

    class Rows:
        def __len__(self):
            return 4096

        def __getitem__(self, i):
            return torch.full((12288,), i % 251, dtype=torch.uint8), i

        def __repr__(self):
            return "Rows(4096 x 12 KB)"
    client = shmcache.Client(port=args.port)
    session = client.create_session()
    try:
        cds = CachedDataset(Rows(), shmcache.DatasetCache(session, port=args.port,
                                                          read_threads=args.read_threads),
                            async_puts=False)
        for _ in CachedLoader(cds, batch_size=64, num_threads=1):
            pass
        print(f"copy threads at work at once, {args.cpus} CPUs, read_threads "
              f"{args.read_threads}:")
        t = 1
        while t <= args.cpus:
            loader = CachedLoader(cds, batch_size=64, num_threads=t)
            for _ in loader:       # the tuner's prefetch settles as in the sweep
                pass
            at.update(now=0, last=None, area=0.0, span=0.0, peak=0)
            for _ in loader:
                pass
            print(f"  num_threads {t:>2}: mean {at['area'] / at['span']:5.1f}, "
                  f"peak {at['peak']}")
            t *= 2
    finally:
        client.destroy_session(session)
    return 0


if __name__ == "__main__":
    sys.exit(main())
