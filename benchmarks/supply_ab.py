"""Same-run A/B of two builds' daemons on cold puts: the pages they supply
ahead of need and what that costs (issue 36, "Where a put's CPU goes").

  supply_ab.py --builds OLD,NEW [--rounds N] [--cases fill,put] [--out FILE]

Starts one server per build (BUILD/clients/admin/shmcache --start, its own
port, run dir and shm dir /dev/shm; 4 KB pages), and for each round runs
every case against each server in turn, the order alternating between
rounds, each in a fresh process under that build's Python package and a
fresh session (destroyed after):
  fill_150k / fill_588k  one writer, put_batch of 8, 2,000 x 150 KB and
          1,200 x 588 KB rows (fill_588k_nN: N rows) (float32 for 588 KB, as the JPEG rows) into a
          2 GB cache: the segment files' allocated bytes (st_blocks) against
          the rows' bytes, the number of segments, and the daemon's CPU per
          row (/proc/PID/stat around the puts);
  put_3k_pP / put_150k_pP  P = 1, 2 writer processes, each put_batch of 64
          rows (3 KB: 400 batches each; 150 KB: 40 each) into one cache:
          rows/s from the first put to the last (the processes start
          together on a pipe).
Prints a line per run and, per case, each build's median and range,
NEW/OLD of the medians, and the median and range of NEW/OLD within each
round (the two runs of a round are adjacent in time). Measures; asserts nothing but that every put was
stored.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from first_epoch_cpu import daemon_cpu

KB = 1024


class Server:
    def __init__(self, build, port, tmp):
        self.build, self.port = build, port
        self.env = dict(os.environ, SHMCACHE_PORT=str(port),
                        SHMCACHE_RUN_DIR=os.path.join(tmp, f"run{port}"),
                        PYTHONPATH=os.path.join(build, "clients", "python"))
        os.makedirs(self.env["SHMCACHE_RUN_DIR"])
        self.admin("--start", "--log_dir", tmp, "--shm_dir", "/dev/shm")
        self.pid = json.loads(self.admin("--server_info", "--json"))["pid"]

    def admin(self, *args):
        return subprocess.run([os.path.join(self.build, "clients", "admin", "shmcache"),
                               "-p", str(self.port), *args], env=self.env, check=True,
                              capture_output=True, text=True, timeout=60).stdout

    def segments(self):
        files = glob.glob(f"/dev/shm/shmcache.{os.getuid()}.{self.port}.seg.*")
        return [os.stat(f) for f in files]

    def stop(self):
        subprocess.run([os.path.join(self.build, "clients", "admin", "shmcache"),
                        "-p", str(self.port), "--stop"], env=self.env,
                       capture_output=True, timeout=60)


# ---- the writers (run under one build's package) -----------------------------

def _rows(size, n, first):
    import numpy as np
    if size == 588 * KB:
        return [np.full(size // 4, i, np.float32) for i in range(first, first + n)]
    return [np.full(size, i % 251, np.uint8) for i in range(first, first + n)]


def writer(port, session, size, batches, bs, first, go_fd):
    import shmcache
    cache = shmcache.DatasetCache(session, port=port, size_mb=2048, name="ab")
    todo = [(first + b * bs, _rows(size, bs, first + b * bs)) for b in range(batches)]
    if go_fd >= 0:
        os.read(go_fd, 1)
    t0 = time.perf_counter()
    for b, rows in todo:
        assert all(cache.put_batch(list(range(b, b + bs)), rows))
    t1 = time.perf_counter()
    cache.close()
    print(json.dumps(dict(t0=t0, t1=t1)))


def run_case(srv, case):
    sid = int(srv.admin("-g").split()[-1])
    kind, size_s, *rest = case.split("_")
    size = {"3k": 3 * KB, "150k": 150 * KB, "588k": 588 * KB}[size_s]
    procs = int(rest[0][1:]) if rest and rest[0][0] == "p" else 1
    if kind == "fill":
        n = int(rest[0][1:]) if rest else 2000 if size == 150 * KB else 1200
        bs, batches = 8, n // 8
    else:
        bs, batches = 64, 400 if size == 3 * KB else 40
    r, w = os.pipe()
    ps = [subprocess.Popen([sys.executable, __file__, "--writer", str(srv.port), str(sid),
                            str(size), str(batches), str(bs), str(i * batches * bs),
                            str(r)], env=srv.env, stdout=subprocess.PIPE, text=True,
                           pass_fds=(r,)) for i in range(procs)]
    os.close(r)
    time.sleep(1.0)  # the writers make their rows before the go
    cpu0 = daemon_cpu(srv.pid)
    os.write(w, b"g" * procs)
    outs = [json.loads(p.communicate()[0]) for p in ps]
    os.close(w)
    assert all(p.returncode == 0 for p in ps)
    cpu = daemon_cpu(srv.pid) - cpu0
    rows = procs * batches * bs
    segs = srv.segments()
    res = dict(rows_per_s=rows / (max(o["t1"] for o in outs) - min(o["t0"] for o in outs)),
               daemon_us_per_row=cpu / rows * 1e6,
               allocated_mb=sum(s.st_blocks * 512 for s in segs) / 2**20,
               segment_mb=sum(s.st_size for s in segs) / 2**20,
               segments=len(segs), rows_mb=rows * size / 2**20)
    srv.admin("-d", str(sid))
    return res


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--writer":
        port, sid, size, batches, bs, first, fd = map(int, sys.argv[2:9])
        writer(port, sid, size, batches, bs, first, fd)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--builds", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="fill,put",
                    help="fill, put, or case names (fill_588k, put_150k_p2, ...)")
    ap.add_argument("--port", type=int, default=47300)
    ap.add_argument("--out")
    args = ap.parse_args()
    builds = args.builds.split(",")
    cases = [c for c in args.cases.split(",") if "_" in c]
    if "fill" in args.cases.split(","):
        cases += ["fill_150k", "fill_588k"]
    if "put" in args.cases.split(","):
        cases += [f"put_{s}_p{p}" for s in ("3k", "150k") for p in (1, 2)]
    tmp = tempfile.mkdtemp(prefix="supply_ab.")
    servers = [Server(os.path.abspath(b), args.port + i, tmp) for i, b in enumerate(builds)]
    results = {(b, c): [] for b in range(len(builds)) for c in cases}
    try:
        for rnd in range(args.rounds):
            order = list(range(len(builds)))
            if rnd % 2:
                order.reverse()
            for c in cases:
                for b in order:
                    r = run_case(servers[b], c)
                    results[(b, c)].append(r)
                    print(f"round {rnd} {c:<12} {os.path.basename(os.path.dirname(builds[b]))}/"
                          f"{os.path.basename(builds[b])}: " +
                          " ".join(f"{k}={v:.1f}" for k, v in r.items()), flush=True)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    print("\ncase          key                 " +
          "  ".join(f"build{b} median [range]" for b in range(len(builds))) + "  new/old")
    for c in cases:
        for k in ("rows_per_s", "daemon_us_per_row", "allocated_mb", "segment_mb", "rows_mb",
                  "segments"):
            meds = []
            cols = []
            for b in range(len(builds)):
                v = [r[k] for r in results[(b, c)]]
                meds.append(statistics.median(v))
                cols.append(f"{meds[-1]:10.1f} [{min(v):.1f}-{max(v):.1f}]")
            ratio = meds[-1] / meds[0] if meds[0] else float("nan")
            # The same round's runs are adjacent in time: their ratio is
            # steadier than the ratio of medians on a machine shared with others.
            paired = [rb[k] / ra[k] for ra, rb in zip(results[(0, c)], results[(len(builds) - 1, c)])
                      if ra[k]]
            pm = statistics.median(paired) if paired else float("nan")
            summary[f"{c}.{k}"] = dict(medians=meds, ratio=ratio, paired=paired)
            print(f"{c:<13} {k:<18} " + "  ".join(cols) + f"  {ratio:.3f}  paired "
                  f"{pm:.3f} [{min(paired, default=0):.2f}-{max(paired, default=0):.2f}]")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(builds=builds, results={f"{b}:{c}": v for (b, c), v in
                                                   results.items()}, summary=summary), f,
                      indent=1)


if __name__ == "__main__":
    main()
