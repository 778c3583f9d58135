#!/usr/bin/python3
"""Same-run A/B of two builds' PartitionedLoader exchange on the remote-row
fetch of benchmarks/multinode_bench.py (2 simulated nodes x 2 ranks, gloo
over 127.0.0.1), without its epochs: the nodes' caches are filled
directly.

    exchange_ab.py --a BUILD_A [--b BUILD_B] [--rows 2048] [--side 128]
        [--round 64] [--rounds 12] [--out FILE]

The ranks run build B's package; build A's exchange (its
shmcache/torch/partitioned sources) is loaded beside it as a package of
its own, on B's native module, so both share the ranks, servers and
caches. Each round fetches every rank's remote rows of an epoch once with
each exchange (A then B, B then A in the next round), each fetch followed
by bare all_to_all_single calls moving the same bytes (multinode_bench's
limit). Prints, per build, the best and median fetch, its ratio to the bare
call (best against best, and the median of the per-fetch ratios) and the
CPU each rank spent per fetch (the steadier figure on a shared machine),
beside the CPU of the bare calls that followed it.
Measures; asserts nothing.
"""

import argparse
import datetime
import importlib
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from multinode_bench import LOCAL, NODES, fetch, fetch_rounds, limit, run_job  # noqa: E402


def _exchange_of(pkg_dir, name):
    """RowExchange and RowOwners of the partitioned package in `pkg_dir`,
    imported as shmcache.torch.<name> (relative imports reach this
    process's shmcache)."""
    full = f"shmcache.torch.{name}"
    pkg = types.ModuleType(full)
    pkg.__path__ = [str(pkg_dir)]
    pkg.__package__ = full
    sys.modules[full] = pkg
    ex = importlib.import_module(full + ".exchange")
    return ex.RowExchange, importlib.import_module(full + ".ownership").RowOwners


def _row(i, side):
    import numpy as np
    return np.random.default_rng(i).integers(0, 256, (side, side, 3), dtype=np.uint8), i % 1000


def rank_main(a):
    import torch
    import torch.distributed as dist
    import shmcache

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    builds = {"A": _exchange_of(a.a_pkg, "_ab_partitioned"),
              "B": _exchange_of(Path(shmcache.__file__).parent / "torch" / "partitioned",
                                "partitioned")}
    cache = shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"])).named(
        "exchange-ab", "exchange-ab")
    exchanges = {}
    for name, (exchange, owners) in builds.items():
        group = exchange.new_group(datetime.timedelta(seconds=300))
        exchanges[name] = exchange(lambda: cache, owners(a.rows, NODES), group, LOCAL)
    ex = exchanges["B"]
    if rank % LOCAL == 0:   # one rank per node fills its node's rows
        mine = ex.owners.owned(ex.node)
        for k in range(0, len(mine), 64):
            ids = mine[k:k + 64]
            cache.put_batch(ids, [_row(i, a.side) for i in ids])
    dist.barrier()
    g = torch.Generator()
    g.manual_seed(0)
    epoch = torch.randperm(a.rows, generator=g).tolist()[rank::world]
    rounds = fetch_rounds(ex, epoch, a.round)
    out = {"A": [], "B": [], "bytes": 0}
    for k in range(a.rounds):
        for name in ("A", "B") if k % 2 == 0 else ("B", "A"):
            c0 = time.process_time()
            t, _, nbytes, sizes = fetch(exchanges[name], rounds, 1000 + 2 * k + (name == "B"))
            cpu = time.process_time() - c0
            c0 = time.process_time()
            bare = limit(ex.group, sizes)
            out[name].append((t, cpu, bare, time.process_time() - c0))
            out["bytes"] = nbytes
    gathered = [None] * world
    dist.all_gather_object(gathered, out)
    if rank == 0:
        Path(a.out_rank).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def summarize(ranks, load):
    total = sum(r["bytes"] for r in ranks)
    res = {"load_average": load, "bytes_per_fetch": total}
    for name in ("A", "B"):
        n = len(ranks[0][name])
        # A fetch lasts as long as its slowest rank.
        fetch_s = [max(r[name][k][0] for r in ranks) for k in range(n)]
        limit_s = [max(r[name][k][2] for r in ranks) for k in range(n)]
        cpu = [r[name][k][1] for r in ranks for k in range(n)]
        res[name] = {
            "best_s": min(fetch_s), "median_s": statistics.median(fetch_s),
            "GB_per_s": total / min(fetch_s) / 1e9,
            "limit_best_s": min(limit_s),
            "ratio_best": min(limit_s) / min(fetch_s),
            "ratio_median": statistics.median(x / y for x, y in zip(limit_s, fetch_s)),
            "cpu_per_rank_s": statistics.median(cpu),
            # The bare calls' CPU per rank (buffers made, calls, barriers).
            "limit_cpu_per_rank_s": statistics.median(
                r[name][k][3] for r in ranks for k in range(n))}
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", default="", help="build dir of A (e.g. main's); required")
    p.add_argument("--b", default=str(HERE.parents[1] / "build"))
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--side", type=int, default=128)
    p.add_argument("--round", type=int, default=64)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--out", default="")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out_rank", default="", help=argparse.SUPPRESS)
    p.add_argument("--a_pkg", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank:
        rank_main(a)
        return 0
    if not a.a:
        p.error("--a BUILD_A is required")
    a_pkg = Path(a.a).resolve() / "clients" / "python" / "shmcache" / "torch" / "partitioned"
    if not (a_pkg / "exchange.py").is_file():
        raise SystemExit(f"{a.a}: no built Python package with an exchange ({a_pkg}); "
                         "give --a the build dir of a built checkout")
    ranks, load = run_job(Path(a.b), HERE, [
        "--rows", str(a.rows), "--side", str(a.side), "--round", str(a.round),
        "--rounds", str(a.rounds), "--a_pkg", str(a_pkg)])
    res = summarize(ranks, load)
    print(f"{NODES} nodes x {LOCAL} ranks, {a.rows} rows of {a.side * a.side * 3} B, "
          f"{a.round} a round, {a.rounds} rounds A/B, {res['bytes_per_fetch']} B a fetch, "
          f"load average {load[0]:.1f} -> {load[1]:.1f}\n")
    print("| build | best | median | GB/s | vs bare call (best; median of fetches) "
          "| CPU per rank per fetch | the bare calls' CPU |")
    print("|---|---|---|---|---|---|---|")
    for name in ("A", "B"):
        r = res[name]
        print(f"| {name} | {r['best_s'] * 1e3:.1f} ms | {r['median_s'] * 1e3:.1f} ms | "
              f"{r['GB_per_s']:.3f} | {r['ratio_best']:.2f}x; {r['ratio_median']:.2f}x | "
              f"{r['cpu_per_rank_s'] * 1e3:.1f} ms | "
              f"{r['limit_cpu_per_rank_s'] * 1e3:.1f} ms |")
    print(f"\nB/A best {res['A']['best_s'] / res['B']['best_s']:.2f}x faster")
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
