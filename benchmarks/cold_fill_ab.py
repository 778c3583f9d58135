"""Same-run A/B of the host sweep's cold CachedLoader fill against the page
supply of the same round (issue 36's "cold fill" row).

  cold_fill_ab.py --builds OLD,NEW [--rounds N] [--workers 1,2] [--rows N]
                  [--out FILE]

Starts one server per build (BUILD/clients/admin/shmcache --start, its own
port, run dir, /dev/shm), and each round runs, in an order that alternates
between rounds:
  supply   the page supply of all CPUs, as shmcache_bench's sweep section
           makes it (each thread its own files of 64 MB: fallocate, then
           zeros written in 1 MB blocks), the epoch's bytes over the CPUs;
  cold     per build and per num_workers, a fresh process under that
           build's package (PYTHONPATH=BUILD/clients/python) making a fresh
           session and running one first CachedLoader epoch over host_sweep's
           rows (150 KB uint8, no decode cost, batches of 64, shuffled),
           timed as host_sweep.py times it (the loader's iteration).
Prints a line per run (the 1-minute load before it; GB/s; the ratio to the
round's supply; CPU seconds of the trainer, its workers and the daemon; the
counters) and, per (build, workers), the median and range of the ratio to
the supply and of NEW/OLD within each round. Measures; asserts nothing but
that every row arrived and the counters say N misses, 0 hits.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import supply_ab
from first_epoch_cpu import daemon_cpu

KB = 1024
SUPPLY_FILE = 64 << 20


def supply(nbytes, threads):
    """(bytes/s, CPU s) of fresh /dev/shm pages made by `threads` threads,
    nbytes in all (each thread its own files: fallocate, zeros in 1 MB
    writes; the system calls release the GIL)."""
    zeros = memoryview(bytes(1 << 20))
    took = [0.0] * threads
    cpu = [0.0] * threads
    go = threading.Barrier(threads)

    def make(t):
        fds = []
        go.wait()
        t0, c0 = time.perf_counter(), time.thread_time()
        done, mine = 0, nbytes // threads
        while done < mine:
            size = min(SUPPLY_FILE, mine - done)
            path = f"/dev/shm/cold_fill_ab.{os.getpid()}.{t}.{len(fds)}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.unlink(path)
            fds.append(fd)
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            for off in range(0, size, len(zeros)):
                os.pwrite(fd, zeros[:min(len(zeros), size - off)], off)
            done += size
        took[t], cpu[t] = time.perf_counter() - t0, time.thread_time() - c0
        for fd in fds:
            os.close(fd)
    ts = [threading.Thread(target=make, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if not all(took):
        raise RuntimeError("the page supply could not make its files in /dev/shm")
    return nbytes / max(took), sum(cpu)


def child(port, rows, workers):
    """One cold epoch in this process; prints its figures as JSON."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import shmcache
    from host_sweep import Rows, epoch
    from shmcache.torch import CachedDataset, CachedLoader
    client = shmcache.Client(port=port)
    session = client.create_session()
    try:
        cache = shmcache.DatasetCache(session, port=port)
        ds = CachedDataset(Rows(rows, 150 * KB), cache)
        loader = CachedLoader(ds, batch_size=64, shuffle=True, num_workers=workers)
        c0, m0 = os.times(), time.monotonic()
        t, seen = epoch(loader)
        del loader
        ds.flush(600)
        c1, m1 = os.times(), time.monotonic()
        st = ds.cache.stats() or {}
        # m0, m1: the epoch's CLOCK_MONOTONIC bounds (perf record -k
        # CLOCK_MONOTONIC: perf report --time m0,m1).
        print(json.dumps(dict(t=t, m0=m0, m1=m1, pid=os.getpid(), seen=seen,
                              misses=st.get("misses", 0), hits=st.get("hits", 0),
                              mem_rows=st.get("mem_rows", 0),
                              trainer=c1.user + c1.system - c0.user - c0.system,
                              workers=(c1.children_user + c1.children_system
                                       - c0.children_user - c0.children_system))))
    finally:
        client.destroy_session(session)


class Server(supply_ab.Server):
    """A server of one build (supply_ab's), which runs cold epochs."""

    def cold(self, rows, workers):
        d0 = daemon_cpu(self.pid)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                              str(self.port), str(rows), str(workers)], env=self.env,
                             capture_output=True, text=True, timeout=600)
        if out.returncode:
            raise RuntimeError(f"the cold epoch failed:\n{out.stderr}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["daemon"] = daemon_cpu(self.pid) - d0
        if (r["seen"], r["misses"], r["hits"]) != (rows, rows, 0):
            raise RuntimeError(f"a cold epoch over {rows} rows delivered {r['seen']} and "
                               f"counted {r['misses']} misses, {r['hits']} hits")
        return r


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--builds", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--port", type=int, default=47400)
    ap.add_argument("--out")
    args = ap.parse_args()
    builds = [os.path.abspath(b) for b in args.builds.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    cpus = len(os.sched_getaffinity(0))
    nbytes = args.rows * 150 * KB
    tmp = tempfile.mkdtemp(prefix="cold_fill_ab.")
    servers = [Server(b, args.port + i, tmp) for i, b in enumerate(builds)]
    runs = {(b, w): [] for b in range(len(builds)) for w in workers}
    try:
        for rnd in range(args.rounds):
            sup, sup_cpu = supply(nbytes, cpus)
            print(f"round {rnd} supply {sup / 1e9:.2f} GB/s ({cpus} threads), "
                  f"cpu {sup_cpu:.3f} s", flush=True)
            order = [(b, w) for w in workers for b in range(len(builds))]
            for b, w in order if rnd % 2 == 0 else order[::-1]:
                load = os.getloadavg()[0]
                r = servers[b].cold(args.rows, w)
                r.update(gbs=nbytes / r["t"] / 1e9, vs_supply=nbytes / r["t"] / sup,
                         load=load, supply=sup, supply_cpu=sup_cpu)
                runs[(b, w)].append(r)
                print(f"round {rnd} build{b} w{w} load {load:.1f}: {r['gbs']:.2f} GB/s "
                      f"{r['vs_supply']:.2f}x supply; cpu trainer {r['trainer']:.3f} "
                      f"workers {r['workers']:.3f} daemon {r['daemon']:.3f} s; "
                      f"misses {r['misses']} hits {r['hits']} rows {r['seen']}", flush=True)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\nbuild workers  vs supply median [range]   cpu s (trainer+workers+daemon) median"
          "   new/old same round")
    for w in workers:
        for b in range(len(builds)):
            rs = runs[(b, w)]
            v = [r["vs_supply"] for r in rs]
            cpu = [r["trainer"] + r["workers"] + r["daemon"] for r in rs]
            paired = [rb["vs_supply"] / ra["vs_supply"]
                      for ra, rb in zip(runs[(0, w)], rs)]
            print(f"build{b} w{w}   {statistics.median(v):.2f}x [{min(v):.2f}-{max(v):.2f}]"
                  f"   {statistics.median(cpu):.3f}"
                  + (f"   {statistics.median(paired):.2f}x [{min(paired):.2f}-"
                     f"{max(paired):.2f}]" if b else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(builds=builds, runs={f"{b}:w{w}": v for (b, w), v in runs.items()}),
                      f, indent=1)


if __name__ == "__main__":
    main()
