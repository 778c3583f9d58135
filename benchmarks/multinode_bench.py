#!/usr/bin/python3
"""Rows partitioned over the nodes' caches (PartitionedLoader) on one host:
2 simulated nodes (a server each, own --shm_dir) x 2 ranks, gloo over
127.0.0.1, the ranks started with torch.distributed's env:// variables.

Measures, in one run:
- remote fetch: every rank asks the owner nodes for all the rows of its
  epoch it does not own (warm caches), ROUND rows per round, through the
  exchange (RowExchange.round: headers with the ids, then the rows; the
  owner reads its cache, packs, the asker unpacks); rows/s and GB/s over the job,
  against the same-run limit: bare all_to_all_single calls moving exactly
  the same bytes between the same ranks in the same number of rounds
  (the two alternated --repeat times, the best of each kept);
- epoch time (loading only, no model, max over ranks) with
  DistributedSampler from the source (no cache), NodeAffineSampler over
  DataLoader(CachedDataset), and DistributedSampler through
  PartitionedLoader over DataLoader(CachedDataset) and over CachedLoader
  (each with a cache of its own): cold (first) and warm epochs, warm with
  --window batches per exchange round and with one round per batch
  (window 1), alternated --repeat times, the best of each kept, and the
  rounds each took per epoch.

The source's rows are uint8 images HxWx3 and a label, produced by a seeded
generator plus --decode_us of busy work per row (a stand-in for decoding).
Prints a table and the JSON (also written to --out). A benchmark, not a
test: asserts nothing. Small by default (2,048 rows of 48 KiB): the machine
is shared; --quick is smaller still (512 rows of 12 KiB, 1 repeat).

    benchmarks/multinode_bench.py [--build build] [--rows 2048] [--side 128]
        [--batch 32] [--round 64] [--window 4] [--decode_us 500] [--repeat 3]
        [--quick] [--out FILE]
"""

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES, LOCAL = 2, 2
HERE = Path(__file__).resolve()


def rank_main(a):
    """One rank: runs every measure, rank 0 writes the gathered results."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    import shmcache
    from shmcache.torch import (CachedDataset, CachedLoader, NodeAffineSampler,
                                PartitionedLoader)

    class Images(Dataset):
        def __init__(self, n, side, decode_us):
            self.n, self.side, self.decode_us = n, side, decode_us
            self.root = f"bench-images-{n}-{side}"

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            end = time.perf_counter() + self.decode_us * 1e-6
            x = np.random.default_rng(i).integers(0, 256, (self.side, self.side, 3),
                                                  dtype=np.uint8)
            while time.perf_counter() < end:
                pass
            return x, i % 1000

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = Images(a.rows, a.side, a.decode_us)
    cache = shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"]))
    out = {}

    def epoch_time(loader):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in loader:
            pass
        dist.barrier()
        return time.perf_counter() - t0

    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    out["no_cache_s"] = epoch_time(DataLoader(ds, batch_size=a.batch, sampler=sampler))

    affine_ds = CachedDataset(ds, cache, name="affine", async_puts=False)
    affine = NodeAffineSampler(affine_ds, seed=0)
    aloader = DataLoader(affine_ds, batch_size=a.batch, sampler=affine)
    out["affine_cold_s"] = epoch_time(aloader)
    affine.set_epoch(1)
    out["affine_warm_s"] = epoch_time(aloader)

    def partitioned(kind, make):
        """Cold epoch with window --window, then warm epochs alternating
        window --window and window 1 (best of --repeat each), with the
        rounds of one warm epoch of each; returns the window-K loader."""
        cds = CachedDataset(ds, cache, name=f"partitioned-{kind}", async_puts=False)
        sampler = DistributedSampler(cds, shuffle=True, seed=0)
        wide = PartitionedLoader(make(cds, batch_size=a.batch, sampler=sampler),
                                 window=a.window)
        narrow = PartitionedLoader(make(cds, batch_size=a.batch, sampler=sampler),
                                   window=1)
        out[f"{kind}_cold_s"] = epoch_time(wide)
        best = {}
        epoch = 1
        for _ in range(a.repeat):
            for w, loader in ((a.window, wide), (1, narrow)):
                sampler.set_epoch(epoch)
                epoch += 1
                before = loader.counters
                t = epoch_time(loader)
                after = loader.counters
                best[w] = min(best.get(w, float("inf")), t)
                out[f"{kind}_rounds_w{'K' if w == a.window else 1}"] = \
                    after["rounds"] - before["rounds"]
                out[f"{kind}_warm_misses_w{'K' if w == a.window else 1}"] = \
                    after["misses"] - before["misses"]
        out[f"{kind}_warm_s"] = best[a.window]
        out[f"{kind}_warm_w1_s"] = best[1]
        out[f"{kind}_counters"] = wide.counters
        narrow.close()
        return wide

    ploader = partitioned("partitioned", DataLoader)
    partitioned("partitioned_cl", CachedLoader).close()
    psampler = ploader.sampler

    # Remote fetch against bare all_to_all_single with the same bytes.
    ex = ploader.exchange
    psampler.set_epoch(2)
    mine = list(iter(psampler))
    rounds = fetch_rounds(ex, mine, a.round)
    # Alternated, best of --repeat each: the machine may be shared.
    fetch_s = limit_s = float("inf")
    for rep in range(a.repeat):
        t, got_rows, got_bytes, sizes = fetch(ex, rounds, 1000 + rep)
        fetch_s = min(fetch_s, t)
        limit_s = min(limit_s, limit(ex.group, sizes))
    out.update(fetch_s=fetch_s, limit_s=limit_s, fetch_rows=got_rows,
               fetch_bytes=got_bytes, rounds=len(rounds))
    ploader.close()
    gathered = [None] * world
    dist.all_gather_object(gathered, out)
    if rank == 0:
        with open(a.out_rank, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


def fetch_rounds(ex, ids, per_round):
    """The rows of `ids` another node owns, per_round a round: one list
    per round, as many on every rank (collective: the most any rank needs;
    empty lists at the end)."""
    import torch
    import torch.distributed as dist
    remote = [i for i in ids if ex.owners.owner(i) != ex.node]
    rounds = [remote[k:k + per_round] for k in range(0, len(remote), per_round)]
    n = torch.tensor([len(rounds)])
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return rounds + [[] for _ in range(int(n) - len(rounds))]


def fetch(ex, rounds, tag):
    """Fetches the rows of each of `rounds` through the exchange `ex`, then
    the closing round(s): (seconds, rows, bytes, per round the answer bytes
    (sent, received)). Collective."""
    import torch.distributed as dist
    sizes, rows, b0 = [], 0, ex.bytes_received
    dist.barrier()
    t0 = time.perf_counter()
    for ids in rounds:
        req = {}
        for i in ids:
            req.setdefault(ex.server_of(ex.owners.owner(i)), []).append(i)
        answers, _ = ex.round(req, {}, False, tag)
        rows += sum(r is not None for rs in answers.values() for r in rs)
        sizes.append(ex.last_sizes)
    while not ex.round({}, {}, True, tag)[1]:
        pass
    dist.barrier()
    return time.perf_counter() - t0, rows, ex.bytes_received - b0, sizes


def limit(group, sizes):
    """Seconds of bare all_to_all_single calls on `group` moving the bytes
    of `sizes` (fetch's), one call a round. Collective."""
    import torch
    import torch.distributed as dist
    bufs = [(torch.zeros(sum(s), dtype=torch.uint8),
             torch.empty(sum(r), dtype=torch.uint8), s, r) for s, r in sizes]
    dist.barrier()
    t0 = time.perf_counter()
    for send, recv, s, r in bufs:
        dist.all_to_all_single(recv, send, r, s, group=group)
    dist.barrier()
    return time.perf_counter() - t0

def free_tcp_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KINDS = (("partitioned", "DataLoader(CachedDataset)"),
         ("partitioned_cl", "CachedLoader"))


def summarize(ranks, a, load):
    total_rows = sum(r["fetch_rows"] for r in ranks)
    total_bytes = sum(r["fetch_bytes"] for r in ranks)
    fetch_s = max(r["fetch_s"] for r in ranks)
    limit_s = max(r["limit_s"] for r in ranks)
    row_bytes = a.side * a.side * 3
    per_rank = -(-a.rows // (NODES * LOCAL))
    res = {
        "config": {"nodes": NODES, "ranks_per_node": LOCAL, "rows": a.rows,
                   "row_bytes": row_bytes, "batch": a.batch, "round_rows": a.round,
                   "window": a.window, "batches_per_rank": -(-per_rank // a.batch),
                   "decode_us": a.decode_us, "repeat": a.repeat, "quick": a.quick,
                   "backend": "gloo over 127.0.0.1", "cpus": os.cpu_count(),
                   "load_average": load},
        "remote_fetch": {
            "rows": total_rows, "bytes": total_bytes, "rounds": ranks[0]["rounds"],
            "rows_per_s": total_rows / fetch_s, "GB_per_s": total_bytes / fetch_s / 1e9,
            "limit_GB_per_s": total_bytes / limit_s / 1e9,
            "ratio_to_limit": limit_s / fetch_s},
        "epoch_s": {k: max(r[k] for r in ranks) for k in
                    ["no_cache_s", "affine_cold_s", "affine_warm_s"] +
                    [f"{kind}_{x}" for kind, _ in KINDS
                     for x in ("cold_s", "warm_s", "warm_w1_s")]},
        "rounds_per_warm_epoch": {kind: {"window": ranks[0][f"{kind}_rounds_wK"],
                                         "window_1": ranks[0][f"{kind}_rounds_w1"]}
                                  for kind, _ in KINDS},
        "warm_misses": sum(r[f"{kind}_warm_misses_w{w}"] for r in ranks
                           for kind, _ in KINDS for w in ("K", "1")),
        "counters": {kind: [r[f"{kind}_counters"] for r in ranks] for kind, _ in KINDS},
    }
    return res


def table(res):
    f, e, c = res["remote_fetch"], res["epoch_s"], res["config"]
    r = res["rounds_per_warm_epoch"]
    k = c["window"]
    lines = [
        f"2 nodes x 2 ranks, {c['rows']} rows of {c['row_bytes']} B, batch "
        f"{c['batch']} ({c['batches_per_rank']} batches per rank per epoch), "
        f"{c['decode_us']} us/row source, gloo over 127.0.0.1, {c['cpus']} CPUs, "
        f"load average {c['load_average'][0]:.1f} -> {c['load_average'][1]:.1f}",
        "",
        "| remote fetch | rows/s | GB/s |",
        "|---|---|---|",
        f"| exchange (cache read + pack + 2 all_to_all_single + unpack) | "
        f"{f['rows_per_s']:,.0f} | {f['GB_per_s']:.3f} |",
        f"| bare all_to_all_single, same bytes, same rounds | "
        f"{f['rows_per_s'] / f['ratio_to_limit']:,.0f} | {f['limit_GB_per_s']:.3f} |",
        f"| ratio (target >= 0.5) | {f['ratio_to_limit']:.2f}x | |",
        "",
        f"| epoch (loading only, max over ranks) | first | warm, window {k} "
        "(rounds) | warm, window 1 (rounds) |",
        "|---|---|---|---|",
        f"| DistributedSampler, no cache | {e['no_cache_s']:.2f} s | "
        f"{e['no_cache_s']:.2f} s | |",
        f"| NodeAffineSampler + DataLoader(CachedDataset) | {e['affine_cold_s']:.2f} s | "
        f"{e['affine_warm_s']:.2f} s | |",
    ]
    for kind, label in KINDS:
        lines.append(f"| DistributedSampler + PartitionedLoader({label}) | "
                     f"{e[kind + '_cold_s']:.2f} s | {e[kind + '_warm_s']:.2f} s "
                     f"({r[kind]['window']}) | {e[kind + '_warm_w1_s']:.2f} s "
                     f"({r[kind]['window_1']}) |")
    lines.append("")
    lines.append(f"Rows computed in warm epochs (all kinds, all ranks): {res['warm_misses']}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=str(HERE.parents[1] / "build"))
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--side", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--round", type=int, default=64)
    p.add_argument("--decode_us", type=int, default=500)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="512 rows of 64x64x3, 100 us per row, 1 repeat")
    p.add_argument("--out", default="")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out_rank", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.quick and not a.rank:
        a.rows, a.side, a.decode_us, a.repeat = 512, 64, 100, 1
    if a.rank:
        rank_main(a)
        return 0
    ranks, load = run_job(Path(a.build), HERE, [
        "--rows", str(a.rows), "--side", str(a.side), "--batch", str(a.batch),
        "--round", str(a.round), "--decode_us", str(a.decode_us),
        "--repeat", str(a.repeat), "--window", str(a.window)])
    res = summarize(ranks, a, load)
    print(table(res))
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def run_job(build, script, args, timeout=900):
    """Starts a server per simulated node (its own run dir and --shm_dir, a
    session), runs `script --rank --out_rank FILE args` as each of the
    NODES x LOCAL ranks (torch.distributed's env:// variables, SESSION_ID
    of its node), stops the servers. Returns (the JSON rank 0 wrote to
    FILE, the load average before and after)."""
    admin = str(build / "clients" / "admin" / "shmcache")
    tmp = Path(tempfile.mkdtemp(prefix="shmcache-multinode-bench."))
    pythonpath = str(build / "clients" / "python")
    master = free_tcp_port()
    servers, procs, envs = [], [], []
    try:
        for node in range(NODES):
            run_dir, shm_dir = tmp / f"run{node}", Path(
                f"/dev/shm/shmcache-bench-{os.getpid()}-node{node}")
            run_dir.mkdir()
            shm_dir.mkdir()
            port = 20000 + (os.getpid() * 2 + node) % 20000
            env = dict(os.environ, SHMCACHE_RUN_DIR=str(run_dir), SHMCACHE_PORT=str(port),
                       PYTHONPATH=pythonpath)
            subprocess.run([admin, "--start", "--shm_dir", str(shm_dir),
                            "--log_dir", str(run_dir)], env=env, check=True,
                           capture_output=True, timeout=60)
            servers.append((env, shm_dir))
            session = subprocess.run([admin, "-g"], env=env, check=True,
                                     capture_output=True, text=True,
                                     timeout=60).stdout.split()[-1]
            for local in range(LOCAL):
                envs.append(dict(env, SESSION_ID=session, OMP_NUM_THREADS="1",
                                 RANK=str(node * LOCAL + local),
                                 WORLD_SIZE=str(NODES * LOCAL), LOCAL_RANK=str(local),
                                 LOCAL_WORLD_SIZE=str(LOCAL), MASTER_ADDR="127.0.0.1",
                                 MASTER_PORT=str(master)))
        out_rank = tmp / "ranks.json"
        argv = [sys.executable, str(script), "--rank", "--out_rank", str(out_rank), *args]
        load = [os.getloadavg()[0]]
        procs = [subprocess.Popen(argv, env=e) for e in envs]
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                raise SystemExit("a rank failed or the ranks did not finish")
            time.sleep(0.1)
        load.append(os.getloadavg()[0])
        return json.loads(out_rank.read_text()), load
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for env, shm_dir in servers:
            subprocess.run([admin, "--stop"], env=env, capture_output=True, timeout=60)
            shutil.rmtree(shm_dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
