"""The CPU a first (cold) epoch costs, summed over the whole system, and its
wall time against a plain DataLoader: interleaved rounds of two builds of
the Python package (issue 36's first-epoch row).

  first_epoch_cpu.py --port P --builds OLD,NEW [--rounds N] [--size 12|150|jpeg]
                     [--decode-ms D] [--workers W] [--images N] [--workdir DIR]
                     [--out FILE]

Each run is a fresh process (PYTHONPATH=BUILD/clients/python) that makes a
fresh session on the server at port P and runs one first epoch of one
loader over the host sweep's rows (20,000 x 12 KB in batches of 256, or
2,000 x 150 KB in batches of 64, and an int label; or, with --size jpeg,
python_bench.py's JPEG pipeline: --images generated 500x375 JPEGs in
--workdir, PIL decode, resize to 224, normalize, 588 KB float32 rows in
batches of 32, the RESULTS.md row "DataLoader: first epoch with cache vs
no cache"; its decode is the real one, --decode-ms is not used):
  plain   DataLoader over the source (no cache);
  cl      CachedLoader(CachedDataset(source)), num_workers W;
  dl      DataLoader(CachedDataset(source)), num_workers W (background puts;
          the epoch ends when the DataLoader has joined its workers, whose
          exit flush writes what is still queued);
  dls     the same with async_puts=False (every put waited for: each
          batch's misses in one put, or one row at a time in builds before
          that change).
Its CPU is the trainer's and its workers' (os.times, children included once
they are joined: the loaders and the session are closed before the second
reading) plus the server's (/proc/PID/stat of the daemon, read around the
epoch). The decode is D ms of the worker's own CPU (time.thread_time), so
that a worker descheduled in the middle of it still spends it all: CPU per
row is then steady on a machine shared with others, where wall times move
up to 2x. A round runs plain once and each build's cl and dl, in an order
that alternates between rounds; ratios are to the round's plain run.
Prints per-run lines (with the 1-minute load average before the run)
and, per (build, loader), the median and range of CPU per row beyond
plain's (us) and of the wall ratio. Measures; asserts
nothing but that every row arrived and the counters say N misses, 0 hits.
Also the minor page faults per row of the trainer and its joined workers
(fresh memory: the kernel clears a page at its first touch), and the wall
of a worker's batch (its fetch: __getitems__, or plain's
dataset[i] for each index, timed in the worker; mean over the epoch's
batches, in ms): what a synchronous put adds to a worker's latency, which
W workers overlap.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from host_sweep import Rows

KB = 1024
SHAPES = {12: (12 * KB, 256, 20000), 150: (150 * KB, 64, 2000)}
JPEG_BATCH = 32


def _source(args):
    """(dataset, batch size, rows) of the run's --size."""
    if args.size == "jpeg":
        from python_bench import image_dataset_class
        ds = image_dataset_class()(os.path.join(args.workdir, "images"))
        return ds, JPEG_BATCH, len(ds)
    size, bs, n = SHAPES[int(args.size)]
    return Rows(n, size, args.decode_ms / 1e3, clock=time.thread_time), bs, n


def load_average():
    """The 1-minute load average now."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def daemon_cpu(pid):
    """CPU seconds (user + system) process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pid(builds, port):
    """The pid of the server at `port`, asked with the last build's admin."""
    admin = os.path.join(builds.split(",")[-1], "clients", "admin", "shmcache")
    info = subprocess.run([admin, "-p", str(port), "--server_info", "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(info.stdout)["pid"]


def write_out(args, summary):
    """The runs' summary as JSON into --out, when it was given."""
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), runs=summary), f, indent=1)


def _timed(fetch, walls_dir):
    """fetch(indices), its wall appended to this process's file in
    walls_dir (one small write per batch)."""
    t0 = time.perf_counter()
    try:
        return fetch()
    finally:
        with open(os.path.join(walls_dir, str(os.getpid())), "a") as f:
            f.write(f"{time.perf_counter() - t0}\n")


class _Plain:
    """The source, with the fetch a DataLoader makes of it timed."""

    def __init__(self, src, walls_dir):
        self.src, self.walls_dir = src, walls_dir

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return self.src[i]

    def __getitems__(self, indices):   # what DataLoader's fetcher does without it
        return _timed(lambda: [self.src[i] for i in indices], self.walls_dir)


def _batch_walls(walls_dir):
    walls = []
    for name in os.listdir(walls_dir):
        with open(os.path.join(walls_dir, name)) as f:
            walls += [float(x) for x in f.read().split()]
    return walls


def _minor_faults():
    """Minor page faults of this process and its joined children so far:
    fresh memory (a page cleared by the kernel at its first touch) shows
    here; an epoch's faults a row tell a copy into fresh memory from one
    into memory already used."""
    import resource
    return sum(resource.getrusage(w).ru_minflt
               for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def _one(args):
    import gc
    import torch
    from torch.utils.data import DataLoader
    import shmcache
    from shmcache.torch import CachedDataset, CachedLoader

    class Timed(CachedDataset):
        def __getitems__(self, indices):
            return _timed(lambda: super(Timed, self).__getitems__(indices), walls_dir)
    src, bs, n = _source(args)
    walls_dir = tempfile.mkdtemp(prefix="first-epoch-walls-")
    torch.manual_seed(0)
    client = shmcache.Client(port=args.port)
    session = client.create_session()
    ds = None
    try:
        if args.loader == "plain":
            loader = DataLoader(_Plain(src, walls_dir), batch_size=bs, shuffle=True,
                                num_workers=args.workers)
        else:
            cds = Timed if args.loader in ("dl", "dls") else CachedDataset
            ds = cds(src, shmcache.DatasetCache(session, port=args.port),
                     async_puts=args.loader != "dls")
            cls = CachedLoader if args.loader == "cl" else DataLoader
            loader = cls(ds, batch_size=bs, shuffle=True, num_workers=args.workers)
        f0 = _minor_faults()
        t0, d0, c0 = time.perf_counter(), daemon_cpu(args.daemon_pid), os.times()
        seen = 0
        for x, _ in loader:
            seen += x.shape[0]
        wall = time.perf_counter() - t0
        if ds is not None:
            ds.flush(600)
        del loader
        gc.collect()
        st = ds.cache.stats() if ds is not None else {}
        if ds is not None:
            ds.cache.close()
        c1, d1 = os.times(), daemon_cpu(args.daemon_pid)
        f1 = _minor_faults()
    finally:
        client.destroy_session(session)
        walls = _batch_walls(walls_dir)
        for name in os.listdir(walls_dir):
            os.unlink(os.path.join(walls_dir, name))
        os.rmdir(walls_dir)
    if seen != n:
        raise RuntimeError(f"{seen} of {n} rows")
    if ds is not None and (st.get("misses") != n or st.get("hits")):
        raise RuntimeError(f"counters: {st.get('misses')} misses, {st.get('hits')} hits")
    print(json.dumps(dict(
        wall=wall, rows=n,
        trainer=(c1.user - c0.user) + (c1.system - c0.system),
        workers=(c1.children_user - c0.children_user)
        + (c1.children_system - c0.children_system),
        daemon=d1 - d0,
        faults=f1 - f0,
        batch_ms=statistics.fmean(walls) * 1e3 if walls else None)))


def _run(build, loader, args):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(build), "clients",
                                                   "python"))
    cmd = [sys.executable, os.path.abspath(__file__), "--one", "--loader", loader,
           "--port", str(args.port), "--daemon-pid", str(args.daemon_pid),
           "--size", str(args.size), "--decode-ms", str(args.decode_ms),
           "--workers", str(args.workers), "--images", str(args.images),
           "--workdir", args.workdir]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"{build} {loader}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--daemon-pid", type=int)
    ap.add_argument("--builds", help="OLD,NEW build dirs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", default="12", choices=[str(k) for k in SHAPES] + ["jpeg"])
    ap.add_argument("--decode-ms", type=float, default=0.3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--loaders", default="cl,dl")
    ap.add_argument("--images", type=int, default=1200, help="with --size jpeg")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(),
                                                      "first-epoch-jpeg"),
                    help="where --size jpeg's images are made (kept between runs)")
    ap.add_argument("--seed", type=int, default=0, help="of the rounds' orders")
    ap.add_argument("--out")
    ap.add_argument("--one", action="store_true")
    ap.add_argument("--loader")
    args = ap.parse_args()
    if args.daemon_pid is None:
        args.daemon_pid = server_pid(args.builds, args.port)
    if args.one:
        return _one(args)
    if args.size == "jpeg":
        from python_bench import make_images
        make_images(os.path.join(args.workdir, "images"), args.images)
    builds = args.builds.split(",")
    runs = [(None, "plain")] + [(b, ld) for b in builds for ld in args.loaders.split(",")]
    got = {(b, ld): [] for b, ld in runs}
    rng = random.Random(args.seed)
    for r in range(args.rounds):
        order = runs[:]
        rng.shuffle(order)
        plain = None
        results = {}
        for b, ld in order:
            load = load_average()
            res = _run(b or builds[-1], ld, args)
            res["load"] = load
            results[(b, ld)] = res
            cpu = res["trainer"] + res["workers"] + res["daemon"]
            bms = "-" if res.get("batch_ms") is None else f"{res['batch_ms']:.1f} ms"
            faults = "" if res.get("faults") is None else \
                f"  faults {res['faults'] / res['rows']:.1f}/row"
            print(f"round {r} {b or '-'} {ld:<5} wall {res['wall']:6.2f} s  cpu "
                  f"{cpu:6.2f} s (trainer {res['trainer']:.2f}, workers "
                  f"{res['workers']:.2f}, daemon {res['daemon']:.2f})  worker batch "
                  f"{bms}{faults}  load {load:.2f}", flush=True)
        plain = results[(None, "plain")]
        pcpu = plain["trainer"] + plain["workers"] + plain["daemon"]
        for key, res in results.items():
            cpu = res["trainer"] + res["workers"] + res["daemon"]
            got[key].append(dict(res, ratio=res["wall"] / plain["wall"],
                                 extra_us=(cpu - pcpu) / res["rows"] * 1e6,
                                 cpu_us=cpu / res["rows"] * 1e6,
                                 batch_ratio=None if res.get("batch_ms") is None
                                 or plain.get("batch_ms") is None
                                 else res["batch_ms"] / plain["batch_ms"]))
    summary = {}
    loads = [x["load"] for xs in got.values() for x in xs]
    what = "JPEG rows (588 KB)" if args.size == "jpeg" else \
        f"{args.size} KB rows, decode {args.decode_ms} ms CPU"
    print(f"\n{args.rounds} rounds, {what}, {args.workers} workers, load average "
          f"{min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f})")
    print(f"{'build':<28} {'loader':<6} {'CPU us/row':>22} {'extra us/row':>22} "
          f"{'wall / plain':>20} {'worker batch / plain':>22}")

    def med(xs):
        return f"{statistics.median(xs):7.2f} ({min(xs):.2f}-{max(xs):.2f})"
    for (b, ld), xs in got.items():
        cpu = [x["cpu_us"] for x in xs]
        extra = [x["extra_us"] for x in xs]
        ratio = [x["ratio"] for x in xs]
        parts = {k: statistics.median(x[k] / x["rows"] * 1e6 for x in xs)
                 for k in ("trainer", "workers", "daemon")}
        batch = [x["batch_ratio"] for x in xs if x["batch_ratio"] is not None]
        batch_ms = [x["batch_ms"] for x in xs if x.get("batch_ms") is not None]
        summary[f"{b or '-'}:{ld}"] = dict(cpu_us=cpu, extra_us=extra, ratio=ratio,
                                           parts_us=parts, batch_ratio=batch,
                                           batch_ms=batch_ms)
        print(f"{(b or '-')[-28:]:<28} {ld:<6} {med(cpu):>22} {med(extra):>22} "
              f"{med(ratio):>20} {med(batch) if batch else '-':>22}   (median us/row: "
              f"trainer {parts['trainer']:.1f}, workers {parts['workers']:.1f}, daemon "
              f"{parts['daemon']:.1f}; worker batch "
              f"{statistics.median(batch_ms) if batch_ms else 0:.1f} ms)")
    write_out(args, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
