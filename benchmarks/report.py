"""Turns the JSON of one bench run into the table, the targets of docs/performance.md
with their ratios, a Markdown copy (benchmarks/RESULTS.md) and the plot
(docs/bench.png). Run by scripts/bench.sh.

  report.py --cpp cpp.json [--python python.json] [--multinode multinode.json]
            [--sweep sweep.json]
            --json latest.json --markdown RESULTS.md --plot bench.png
            [--elapsed S] [--command C]
"""

import argparse
import datetime
import json
import os
import platform
import subprocess

from sweep_report import sweep_lines, sweep_targets

KB = 1024
SIZES = (3 * KB, 150 * KB, 600 * KB)
# What the harness's page-supply reference ("shm pages", "fallocate+clear")
# times: a file of the server's shm dir sized, fallocated and written once
# through its descriptor in 1 MB blocks of zeros. On 4 KB pages the daemon
# only fallocates a segment and a batch's rows are written into it with
# pwritev (docs/performance.md, the put path profiled again), so this is
# the least those pages cost; on huge pages the daemon still clears them
# so, and the writer's copy comes on top.
SUPPLY = ("fresh pages of the shm dir fallocated and written once through the descriptor "
          "by one thread (1 MB writes: the least a put's pages cost)")
# How the harness times puts and their reference (bench_shmcache.cc,
# BenchPut): each figure the best of 3 rounds, each round right after an
# unmeasured fill of the same bytes; and once more after 3 s of nothing,
# when this VM's kernel has given free 2 MB blocks back to its host, whose
# next touch costs a host fault each ("first fill after idle").
FIRST = "first fill after idle"
FIRST_HOW = ("nothing ran for 3 s before it: huge pages freed by then are back with "
             "this VM's host")


def load_samples(path):
    out = []
    if path and os.path.exists(path):
        for line in open(path):
            stage, _, la = line.strip().rpartition(" ")
            try:
                out.append((stage, float(la)))
            except ValueError:
                pass
    return out


def load(path):
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"results": [], "values": {}, "skipped": {}}


class Data:
    def __init__(self, cpp, py, extra=None, load=None, headline="/dev/shm (4 KB pages)",
                 extra_label="huge pages", extra_how="", multinode=None, sweep=None):
        sweep = sweep or {"results": [], "values": {}, "skipped": {}}
        self.results = cpp["results"] + py["results"] + sweep["results"]
        self.values = {**cpp["values"], **py["values"], **sweep["values"]}
        self.skipped = {**cpp["skipped"], **py["skipped"], **sweep["skipped"]}
        # Where the headline server kept its segments, e.g. its own tmpfs
        # mounted huge=within_size (root) or /dev/shm (4 KB pages).
        self.headline = headline
        # The put and shmcache sections again on a second server with the
        # other kind of pages: the same rows, labelled; never the headline.
        extra = extra or {"results": [], "values": {}, "skipped": {}}
        self.extra_label, self.extra_how = extra_label, extra_how
        self.suffix = f" ({extra_label})"
        for r in extra["results"]:
            if r["system"] in ("shmcache", "shm pages"):
                self.results.append(dict(r, variant=r["variant"] + self.suffix))
        self.skipped.update({k + self.suffix: v for k, v in extra["skipped"].items()})
        self.extra = bool(extra["results"])
        self.load = load or []     # [(stage, 1-minute load average)]
        # benchmarks/multinode_bench.py's JSON (None: not run).
        self.multinode = multinode
        # benchmarks/ab_bench.py's JSON and A's revision (BENCH_AB; None: not run).
        self.ab, self.ab_label = None, ""

    def rate(self, bench, system, variant=None, size=3 * KB, procs=1):
        for r in self.results:
            if (r["bench"], r["system"], r["row_bytes"], r["procs"]) == \
                    (bench, system, size, procs) and \
                    (variant is None or r["variant"] == variant):
                return r["rows_per_s"]
        return None



def first_row(d, row, suffix, label=""):
    """The first fill after idle: PutBatch of 64 against the reference's
    first fill, 3 KB rows, and the reference's first fill against its best."""
    fb = d.rate("put", "shmcache", f"PutBatch 64, {FIRST}{suffix}")
    fp = d.rate("put", "shm pages", f"fallocate+clear, {FIRST}{suffix}")
    best = d.rate("put", "shm pages", "fallocate+clear" + suffix)
    if fb is None and fp is None:
        return
    r = ratio(fb, fp)
    row(f"{label}{FIRST} ({FIRST_HOW}), 3 KB: PutBatch of 64 vs the reference's own "
        f"first fill (not a target; the reference's first fill is "
        f"{fmt_ratio(ratio(fp, best))} of its best)",
        f"{fmt_rate(fb)} vs {fmt_rate(fp)} rows/s", fmt_ratio(r), "—", None)


def fmt_ratio(r):
    return f"{r:.2f}x" if r else "—"

def machine():
    model = "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("L3 cache:"):
                model += ", L3 " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    os_name = "?"
    if os.path.exists("/etc/os-release"):
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip().strip('"')
    return (f"{model}; {os.cpu_count()} CPUs; {mem:.0f} GiB RAM; {os_name}; "
            f"Linux {platform.release()}")


def fmt_rate(x):
    if x is None:
        return "—"
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.0f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def targets(d):
    """[(measure, measured, ratio/value, target, met)]"""
    v = d.values
    out = []

    def row(measure, measured, value, target, ok):
        met = "—" if ok is None else ("met" if ok else "MISSED")
        out.append((measure, measured, value, target, met))

    get = d.rate("get", "shmcache", "copy-out")
    mc = d.rate("get", "memcpy")
    r = ratio(get, mc)
    row("hit, copy-out, 3 KB, 1 process",
        f"{fmt_rate(get)} rows/s vs memcpy {fmt_rate(mc)} rows/s",
        f"{r:.2f}x" if r else "—", ">= 0.80x", r and r >= 0.8)
    view = d.rate("view", "shmcache", "zero-copy")
    row("hit, zero-copy view, 3 KB (per process)",
        f"{fmt_rate(view)} lookups/s", f"{view / 1e6:.2f} M/s" if view else "—",
        ">= 10 M/s", view and view >= 10e6)
    view2 = d.rate("view", "shmcache", "zero-copy", procs=2)
    if view2:
        row("hit, zero-copy view, 3 KB, 2 processes (per process)",
            f"{fmt_rate(view2)} lookups/s in all", f"{view2 / 2e6:.2f} M/s",
            ">= 10 M/s", view2 / 2 >= 10e6)
    # The hit section (bench_hit.cc): single-row hits against the same-run
    # limits, interleaved best-of rounds, at two index sizes.
    for label, size in (("64Ki x 3 KB", 3 * KB), ("1Mi x 1 KB", KB)):
        chase = d.rate("hit", "limit", "chase " + label, size)
        hview = d.rate("hit", "shmcache", "View+touch " + label, size)
        r = ratio(hview, chase)
        if chase and hview:
            row(f"hit, single view + one byte read, {label} rows, vs one dependent "
                "DRAM read per row (pointer chase, same bytes)",
                f"{fmt_rate(hview)} vs {fmt_rate(chase)} rows/s",
                f"{r:.2f}x", ">= 0.80x", r >= 0.8)
        lm = d.rate("hit", "lmdb", "long txn view+touch " + label, size)
        r = ratio(hview, lm)
        if lm and hview:
            row(f"hit, single view + one byte read, {label} rows, vs LMDB in one "
                "long read txn (integer keys, one byte read)",
                f"{fmt_rate(hview)} vs {fmt_rate(lm)} rows/s",
                f"{r:.2f}x", ">= 1.5x", r >= 1.5)
        hmc = d.rate("hit", "limit", "memcpy " + label, size)
        hget = d.rate("hit", "shmcache", "Get " + label, size)
        r = ratio(hget, hmc)
        if hmc and hget:
            row(f"hit, single Get (copy-out), {label} rows, vs memcpy of random rows",
                f"{fmt_rate(hget)} vs {fmt_rate(hmc)} rows/s",
                f"{r:.2f}x", ">= 0.80x", r >= 0.8)
        probe = d.rate("hit", "limit", "probe+memcpy " + label, size)
        if hmc and hget and probe:
            row(f"reference: a copy behind a one-probe index (one 16-byte slot read, then "
                f"the row), {label} rows, vs memcpy; single Get vs it (not a target: the "
                "ceiling of any per-row lookup-then-copy here, docs/hit-path.md)",
                f"{fmt_rate(probe)} rows/s, {probe / hmc:.2f}x memcpy",
                f"{hget / probe:.2f}x", "—", None)
    getb = d.rate("get", "shmcache", "copy-out GetBatch 64")
    r = ratio(getb, mc)
    row("hit, copy-out, 3 KB, 1 process, batched (GetBatch of 64)",
        f"{fmt_rate(getb)} rows/s vs memcpy {fmt_rate(mc)} rows/s",
        f"{r:.2f}x" if r else "—", ">= 0.80x", r and r >= 0.8)
    viewb = d.rate("view", "shmcache", "zero-copy ViewBatch 64")
    row("hit, zero-copy view, 3 KB (per process), batched (ViewBatch of 64)",
        f"{fmt_rate(viewb)} lookups/s", f"{viewb / 1e6:.2f} M/s" if viewb else "—",
        ">= 10 M/s", viewb and viewb >= 10e6)
    put = d.rate("put", "shmcache", "put")
    row("put, 3 KB, 1 process", f"{fmt_rate(put)} rows/s",
        f"{put / 1e6:.2f} M/s" if put else "—", ">= 1 M/s", put and put >= 1e6)
    putb = d.rate("put", "shmcache", "PutBatch 64")
    row("put, 3 KB, 1 process, batched (PutBatch of 64)", f"{fmt_rate(putb)} rows/s",
        f"{putb / 1e6:.2f} M/s" if putb else "—", ">= 1 M/s", putb and putb >= 1e6)
    pages = d.rate("put", "shm pages", "fallocate+clear")
    r = ratio(putb, pages)
    row(f"reference: {SUPPLY}, as 3 KB rows; PutBatch vs it (not a target)",
        f"{fmt_rate(putb)} vs {fmt_rate(pages)} rows/s", f"{r:.2f}x" if r else "—",
        "—", None)
    first_row(d, row, "")
    pyb = d.rate("put", "python", "DatasetCache.put_batch 64")
    row("Python put_batch, 3 KB, 1 process (batches of 64)", f"{fmt_rate(pyb)} rows/s",
        f"{pyb / 1e6:.2f} M/s" if pyb else "—", ">= 0.5 M/s", pyb and pyb >= 0.5e6)
    if d.extra:
        x = d.extra_label
        hg = d.rate("get", "shmcache", "copy-out" + d.suffix)
        r = ratio(hg, mc)
        row(f"{x}: hit, copy-out, 3 KB vs memcpy (extra configuration)",
            f"{fmt_rate(hg)} vs {fmt_rate(mc)} rows/s", f"{r:.2f}x" if r else "—",
            ">= 0.80x", r and r >= 0.8)
        hv = d.rate("view", "shmcache", "zero-copy" + d.suffix)
        row(f"{x}: hit, zero-copy view, 3 KB (extra configuration)",
            f"{fmt_rate(hv)} lookups/s", f"{hv / 1e6:.2f} M/s" if hv else "—",
            ">= 10 M/s", hv and hv >= 10e6)
        hp = d.rate("put", "shmcache", "put" + d.suffix)
        row(f"{x}: put, 3 KB (extra configuration)", f"{fmt_rate(hp)} rows/s",
            f"{hp / 1e6:.2f} M/s" if hp else "—", ">= 1 M/s", hp and hp >= 1e6)
        hb = d.rate("put", "shmcache", "PutBatch 64" + d.suffix)
        row(f"{x}: put, 3 KB, batched (PutBatch of 64) (extra configuration)",
            f"{fmt_rate(hb)} rows/s", f"{hb / 1e6:.2f} M/s" if hb else "—", ">= 1 M/s",
            hb and hb >= 1e6)
        hpages = d.rate("put", "shm pages", "fallocate+clear" + d.suffix)
        r = ratio(hb, hpages)
        row(f"{x}: reference: {SUPPLY}, as 3 KB rows; PutBatch vs it (not a target)",
            f"{fmt_rate(hb)} vs {fmt_rate(hpages)} rows/s", f"{r:.2f}x" if r else "—",
            "—", None)
        first_row(d, row, d.suffix, f"{x}: ")
    redis = d.rate("get", "redis", "GET")
    r = ratio(get, redis)
    row("vs Redis GET (Unix socket, unpipelined), 3 KB",
        f"{fmt_rate(get)} vs {fmt_rate(redis)} rows/s",
        f"{r:.1f}x" if r else "—", ">= 50x", r and r >= 50)
    redis_p = next((x["rows_per_s"] for x in d.results if x["system"] == "redis"
                    and x["variant"].startswith("GET pipelined")
                    and x["row_bytes"] == 3 * KB and x["procs"] == 1), None)
    r = ratio(get, redis_p)
    row("vs Redis GET pipelined, 3 KB (not a target)",
        f"{fmt_rate(get)} vs {fmt_rate(redis_p)} rows/s",
        f"{r:.1f}x" if r else "—", "—", None)
    lmdb = d.rate("get", "lmdb", "copy-out")
    r = ratio(get, lmdb)
    row("vs LMDB random get (txn + get + copy), 3 KB",
        f"{fmt_rate(get)} vs {fmt_rate(lmdb)} rows/s",
        f"{r:.2f}x" if r else "—", ">= 2x", r and r >= 2)
    lmdb_z = d.rate("view", "lmdb", "zero-copy")
    r = ratio(view, lmdb_z)
    row("vs LMDB zero-copy (one long txn), 3 KB view",
        f"{fmt_rate(view)} vs {fmt_rate(lmdb_z)} rows/s",
        f"{r:.2f}x" if r else "—", ">= 2x", r and r >= 2)
    sp = d.rate("get", "shmcache", "spilled")
    rk = d.rate("get", "rocksdb", "raw")
    # The spilled-row targets (docs/performance.md#targets), against RocksDB's best of four
    # configurations for the same rows (bench_rocksdb.cc): the reader
    # process reads the spill database itself (docs/spill-reads.md).
    for size, label in ((3 * KB, "3 KB"), (150 * KB, "150 KB"), (1024 * KB, "1 MB")):
        spb_s = d.rate("get", "shmcache", "spilled GetBatch 64", size=size)
        rkm_s = d.rate("get", "rocksdb", "raw MultiGet 64", size=size)
        r = ratio(spb_s, rkm_s)
        row(f"spilled-row read, GetBatch of 64 vs RocksDB MultiGet of 64 (best of "
            f"default / no compression / BlobDB + 256 MB cache / shmcache's spill "
            f"options), {label}",
            f"{fmt_rate(spb_s)} vs {fmt_rate(rkm_s)} rows/s",
            f"{r:.2f}x" if r else "—", ">= 0.80x", r and r >= 0.8)
    r = ratio(sp, rk)
    row("spilled-row read, one row per Get (read in the process) vs RocksDB Get "
        "(best configuration), 3 KB", f"{fmt_rate(sp)} vs {fmt_rate(rk)} rows/s",
        f"{r:.2f}x" if r else "—", ">= 0.33x (within 3x)", r and r >= 1 / 3)
    spb = d.rate("get", "shmcache", "spilled GetBatch 64")
    sp4 = d.rate("get", "shmcache", "spilled GetBatch 64", procs=4)
    r = ratio(sp4, spb)
    if sp4:
        row("spilled-row GetBatch of 64, 3 KB, 4 processes vs 1 (total rows/s)",
            f"{fmt_rate(sp4)} vs {fmt_rate(spb)} rows/s",
            f"{r:.2f}x" if r else "—", ">= 1.6x", r and r >= 1.6)
    rk4 = d.rate("get", "rocksdb", "raw MultiGet 64", procs=4)
    rk1 = d.rate("get", "rocksdb", "raw MultiGet 64")
    r = ratio(rk4, rk1)
    if rk4:
        row("RocksDB MultiGet of 64, 3 KB, 4 processes vs 1 (the peer's own scaling)",
            f"{fmt_rate(rk4)} vs {fmt_rate(rk1)} rows/s",
            f"{r:.2f}x" if r else "—", "—", None)
    oh = v.get("mem.overhead_per_row.3072")
    if oh is not None:
        enc = v.get("mem.encoding_overhead_per_row.3072")
        idx = v.get("mem.index_bytes_per_row.3072")
        row("per-row memory overhead, 3 KB rows",
            f"{enc:.0f} B row header + {idx:.0f} B index",
            f"{oh:.0f} B", "<= 64 B", round(oh) <= 64)
    else:
        row("per-row memory overhead", "not measured", "—", "<= 64 B", None)
    for key, label, target, want in (
            ("python.get_vs_lmdb_long_txn", "Python DatasetCache.get vs py-lmdb's fastest use "
             "(one long read txn, buffers=True, frombuffer+copy), 3 KB", ">= 1.0x", 1.0),
            ("python.view_vs_lmdb_long_txn", "Python DatasetCache.view vs py-lmdb's fastest "
             "use (one long read txn), 3 KB", ">= 2x", 2.0),
            ("python.cached_dataset_vs_lmdb_long_txn", "CachedDataset[i] vs py-lmdb's "
             "fastest use (one long read txn), 3 KB", ">= 1.0x", 1.0),
            ("python.cached_dataset_tuple_vs_lmdb_long_txn_labelled", "CachedDataset[i] "
             "of a (3 KB row, int label) tuple vs py-lmdb's fastest use (one long read "
             "txn) returning the same sample (frombuffer+copy of the row, the label)",
             ">= 1.0x", 1.0),
            ("python.cached_dataset_tuple_vs_lmdb_long_txn", "CachedDataset[i] of the "
             "same tuple vs py-lmdb's fastest use reading the 3 KB row alone", "—", None),
            ("python.get_vs_lmdb", "Python DatasetCache.get vs py-lmdb, a read txn per "
             "get (+frombuffer+copy), 3 KB", ">= 1.0x", 1.0),
            ("python.view_vs_lmdb", "Python DatasetCache.view vs py-lmdb, a read txn per "
             "get, 3 KB", ">= 2x", 2.0),
            ("python.cached_dataset_vs_lmdb",
             "CachedDataset[i] vs py-lmdb, a read txn per get, 3 KB", ">= 1.0x", 1.0),
            ("read_into.vs_memcpy", "read_into batches of 588 KB rows (2 threads) vs memcpy "
             "of the same bytes (2 threads)", ">= 0.7x", 0.7)):
        r = v.get(key)
        row(label, "measured in one run" if r is not None else "not measured",
            f"{r:.2f}x" if r is not None else "—", target,
            None if want is None else r is not None and r >= want)
    speed = v.get("dataloader.steady_speedup")
    first = v.get("dataloader.first_epoch_ratio")
    if speed is not None:
        row("DataLoader (2 workers, JPEG decode+resize+normalize): steady epoch",
            f"{v['dataloader.epoch_no_cache_s']:.2f} s -> "
            f"{v['dataloader.steady_epoch_cache_s']:.2f} s",
            f"{speed:.2f}x faster", ">= 5x", speed >= 5)
        fl = v.get("dataloader.epoch_floor_s")
        if fl:
            row("DataLoader's own floor: the same loader over one ready tensor "
                "(no decode, no cache; bounds any cache's speedup)",
                f"{v['dataloader.epoch_no_cache_s']:.2f} s -> {fl:.2f} s",
                f"{v['dataloader.floor_speedup']:.2f}x faster", "—", None)
        row("DataLoader: first epoch with cache vs no cache",
            f"{v['dataloader.epoch1_cache_s']:.2f} s vs "
            f"{v['dataloader.epoch_no_cache_s']:.2f} s",
            f"{first:.2f}x", "<= 1.05x", first <= 1.05)
        sync = v.get("dataloader.first_epoch_ratio_sync_puts")
        if sync is not None:
            # Runs before this change measured it against the first
            # uncached epoch, minutes earlier.
            again = v.get("dataloader.epoch_no_cache_again_s")
            row("DataLoader: first epoch with every put waited for "
                "(async_puts=False) vs no cache" +
                (" (an uncached epoch run just before it)" if again else ""),
                f"{v['dataloader.epoch1_sync_puts_s']:.2f} s vs "
                f"{again or v['dataloader.epoch_no_cache_s']:.2f} s", f"{sync:.2f}x", "—",
                None)
    lw = v.get("loader.speedup_vs_no_cache")
    if lw is not None:
        path = "native read_into" if v.get("loader.native_read_into") else \
            "Python read path"
        row(f"CachedLoader ({path}): warm epoch vs no cache",
            f"{v['dataloader.epoch_no_cache_s']:.2f} s -> "
            f"{v['loader.steady_epoch_s']:.3f} s",
            f"{lw:.1f}x faster", ">= 50x", lw >= 50)
        lf = v["loader.speedup_vs_floor"]
        row("CachedLoader: warm epoch vs DataLoader's own floor",
            f"{v['dataloader.epoch_floor_s']:.2f} s -> {v['loader.steady_epoch_s']:.3f} s",
            f"{lf:.1f}x faster", ">= 5x", lf >= 5)
    idf = v.get("loader.identity_fraction")
    if idf is not None:
        row("default cache name (content identity) vs a warm CachedLoader epoch",
            f"{v['loader.identity_s'] * 1e3:.2f} ms (stat of {v['dataloader.images']:.0f} "
            f"files) vs {v['loader.steady_epoch_s']:.3f} s; 9 decoded samples "
            f"instead: {v['loader.identity_samples_s'] * 1e3:.1f} ms "
            f"({v['loader.identity_samples_fraction'] * 100:.1f}%)",
            f"{idf * 100:.2f}%", "< 1%", idf < 0.01)
    hs = v.get("loader.half_spilled.vs_memory")
    if hs is not None:
        # A cache whose memory holds half the rows, the rest spilled: the
        # loader's threads read a batch's spilled rows (in this process,
        # from the spill database) batches ahead of the trainer.
        rows = (f"{v['loader.half_spilled.disk_rows']:.0f} of "
                f"{v['loader.half_spilled.rows']:.0f} rows spilled")
        row(f"CachedLoader, warm epoch, half the rows spilled ({rows}) vs all in "
            "memory (interleaved, best of 3; the trainer does nothing with a batch)",
            f"{v['loader.half_spilled.epoch_s']:.3f} s vs "
            f"{v['loader.half_spilled.mem_epoch_s']:.3f} s",
            f"{hs:.2f}x", "—", None)
        hst = v["loader.half_spilled.step_vs_memory"]
        row("CachedLoader, warm epoch, half the rows spilled vs all in memory, the "
            f"trainer waiting {v['loader.half_spilled.step_s'] * 1e3:.0f} ms per batch "
            f"(a GPU step; floor {v['loader.half_spilled.step_floor_s']:.2f} s): disk "
            "reads hidden behind the step",
            f"{v['loader.half_spilled.step_epoch_s']:.3f} s vs "
            f"{v['loader.half_spilled.step_mem_epoch_s']:.3f} s",
            f"{hst:.2f}x", "<= 1.10x", hst <= 1.10)
        hn = v["loader.half_spilled.speedup_vs_no_cache"]
        row("CachedLoader, warm epoch, half the rows spilled vs no cache (DataLoader, "
            "2 workers, JPEG decode)",
            f"{v['loader.half_spilled.no_cache_epoch_s']:.2f} s -> "
            f"{v['loader.half_spilled.epoch_s']:.3f} s",
            f"{hn:.1f}x faster", "—", None)
    l1 = v.get("loader.first_epoch_vs_dataloader")
    if l1 is not None:
        row("CachedLoader: first epoch vs DataLoader(CachedDataset), 2 workers each",
            f"{v['loader.epoch1_s']:.2f} s vs {v['dataloader.epoch1_cache_s']:.2f} s",
            f"{l1:.2f}x", "<= 1.00x", l1 <= 1.0)
    sw = v.get("switch.warm_vs_uncached")
    if sw is not None:
        row(f"imagenet/main.py with the 3-line switch, its loop on the CPU: Data time at "
            f"-j 0, warm vs uncached ({v['switch.images']:.0f} JPEGs 500x375, batches of "
            f"{v['switch.batch']:.0f}, interleaved, best of each)",
            f"{v['switch.warm_data_ms']:.1f} ms vs {v['switch.uncached_data_ms']:.1f} ms "
            "per batch", f"{sw:.2f}x", "<= 0.6x", sw <= 0.6)
    elif "switch" in d.skipped:
        row("imagenet/main.py with the 3-line switch: Data time at -j 0, warm vs uncached",
            "skipped: " + d.skipped["switch"], "—", "<= 0.6x", None)
    if speed is None:
        row("DataLoader steady / first epoch", "skipped: " +
            d.skipped.get("dataloader", "?"), "—", ">= 5x / <= 1.05x", None)
    pf = v.get("prefill.vs_decode_epoch")
    if pf is not None:
        row(f"prefill of {v['prefill.rows']:.0f} JPEGs, 2 processes, vs an "
            "uncached DataLoader epoch (2 workers)",
            f"{v['prefill.seconds']:.2f} s vs {v['prefill.decode_epoch_s']:.2f} s",
            f"{pf:.2f}x", "<= 1.10x", pf <= 1.10)
    elif "prefill" in d.skipped:
        row("prefill", "skipped: " + d.skipped["prefill"], "—", "<= 1.10x", None)
    mn = d.multinode
    if mn:
        f = mn["remote_fetch"]
        row("remote-row fetch across nodes (2 simulated nodes x 2 ranks, gloo over "
            "loopback) vs all_to_all_single of the same bytes",
            f"{f['GB_per_s']:.3f} GB/s vs {f['limit_GB_per_s']:.3f} GB/s",
            f"{f['ratio_to_limit']:.2f}x", ">= 0.5x", f["ratio_to_limit"] >= 0.5)
    elif "multinode" in d.skipped:
        row("remote-row fetch across nodes", "skipped: " + d.skipped["multinode"],
            "—", ">= 0.5x", None)
    sh = v.get("shared.shm_vs_data")
    if sh is not None:
        rows_ok = v["shared.cached_rows"] == v["shared.rows"]
        row("4 processes sharing one session: shared memory vs data",
            f"{v['shared.cached_rows']:.0f} of {v['shared.rows']:.0f} rows cached once; "
            f"sum of Pss {v['shared.sum_pss_vs_data']:.2f}x, Rss {v['shared.sum_rss_vs_data']:.2f}x",
            f"{sh:.2f}x (allocated shm)", "1x, not 4x", rows_ok and sh < 2)
    else:
        row("4 processes sharing one session", "skipped: " +
            d.skipped.get("shared", "?"), "—", "1x, not 4x", None)
    sweep_targets(d, row)
    return out


def throughput_rows(d):
    """(row label, size, procs, rows/s, GB/s, vs memcpy) for the full table."""
    order = [
        ("get", "memcpy", None, "memcpy limit (random row)"),
        ("get", "shmcache", "copy-out", "shmcache Get (copy-out)"),
        ("view", "shmcache", "zero-copy", "shmcache View (zero-copy)"),
        ("get", "shmcache", "copy-out GetBatch 64", "shmcache GetBatch of 64 (copy-out)"),
        ("view", "shmcache", "zero-copy ViewBatch 64", "shmcache ViewBatch of 64"),
        ("put", "shmcache", "put", "shmcache Put"),
        ("put", "shmcache", "PutBatch 64", "shmcache PutBatch of 64"),
        ("put", "shm pages", "fallocate+clear",
         "fresh shm pages, fallocated and written once, one thread (reference for puts)"),
        ("put", "shmcache", f"PutBatch 64, {FIRST}", f"shmcache PutBatch of 64, {FIRST}"),
        ("put", "shm pages", f"fallocate+clear, {FIRST}",
         f"fresh shm pages (reference for puts), {FIRST}"),
        ("get", "python", "DatasetCache.get", "Python DatasetCache.get"),
        ("view", "python", "DatasetCache.view", "Python DatasetCache.view"),
        ("put", "python", "DatasetCache.put", "Python DatasetCache.put"),
        ("put", "python", "DatasetCache.put_batch 64", "Python DatasetCache.put_batch of 64"),
        ("get", "python", "CachedDataset[i]", "Python CachedDataset[i]"),
        ("get", "py-lmdb", "get+frombuffer+copy", "py-lmdb get+frombuffer+copy"),
        ("batch", "python", None, "Python read_into (batch of 64)"),
        ("batch", "numpy", None, "memcpy of a batch, numpy (reference)"),
        ("get", "numpy", None, "Python numpy row copy (reference)"),
        ("get", "redis", "GET", "Redis GET"),
        ("get", "redis", "GET pipelined x32", "Redis GET pipelined x32"),
        # bench_redis.cc loads the rows into an emptied database pipelined,
        # then times single SETs of rows already there: overwrites.
        ("put", "redis", "SET", "Redis SET, overwriting a stored row"),
        ("put", "redis", "SET pipelined", "Redis SET pipelined x32, loading an empty database"),
        ("get", "lmdb", "copy-out", "LMDB get (txn+get+copy)"),
        ("view", "lmdb", "zero-copy", "LMDB get (long txn, zero-copy)"),
        ("get", "rocksdb", "raw", "RocksDB get (raw)"),
        ("get", "rocksdb", "raw MultiGet 64", "RocksDB MultiGet of 64 (raw)"),
        ("get", "shmcache", "spilled", "shmcache Get of a spilled row"),
        ("get", "shmcache", "spilled GetBatch 64", "shmcache GetBatch of 64 spilled rows"),
        ("get", "shmcache", "copy-out" + d.suffix, f"shmcache Get, {d.extra_label}"),
        ("view", "shmcache", "zero-copy" + d.suffix, f"shmcache View, {d.extra_label}"),
        ("put", "shmcache", "put" + d.suffix, f"shmcache Put, {d.extra_label}"),
        ("put", "shm pages", "fallocate+clear" + d.suffix,
         f"fresh shm pages, fallocated and written once, one thread (reference for puts), "
         f"{d.extra_label}"),
        ("put", "shmcache", "PutBatch 64" + d.suffix,
         f"shmcache PutBatch of 64, {d.extra_label}"),
        ("put", "shmcache", f"PutBatch 64, {FIRST}" + d.suffix,
         f"shmcache PutBatch of 64, {d.extra_label}, {FIRST}"),
        ("put", "shm pages", f"fallocate+clear, {FIRST}" + d.suffix,
         f"fresh shm pages (reference for puts), {d.extra_label}, {FIRST}"),
        ("cpu", "spin", None, "CPU-only loop (core scaling)"),
    ]
    rows = []
    for bench, system, variant, label in order:
        for r in d.results:
            if r["bench"] == bench and r["system"] == system and \
                    (variant is None or r["variant"] == variant):
                mc = d.rate("get", "memcpy", size=r["row_bytes"], procs=r["procs"])
                vs = ratio(r["rows_per_s"], mc) if bench == "get" and system != "memcpy" else None
                # A zero-copy view reads none of the row's bytes: lookups
                # times the row size is no byte rate (it gave "39,000 GB/s").
                gb = None if bench in ("view", "cpu") else r["gb_per_s"]
                rows.append((label, r["row_bytes"], r["procs"], r["rows_per_s"], gb, vs))
    return rows


def size_label(b):
    return "—" if b == 0 else (f"{b // KB} KB" if b % KB == 0 else f"{b} B")


def run_time(started, elapsed):
    """'2026-11-29 15:20-15:28 UTC' for a run that started at `started` (epoch
    seconds) and took `elapsed` seconds; today's date when not known."""
    if not started:
        return str(datetime.date.today())
    utc = datetime.timezone.utc
    t0 = datetime.datetime.fromtimestamp(started, utc)
    t1 = datetime.datetime.fromtimestamp(started + elapsed, utc)
    return f"{t0:%Y-%m-%d %H:%M}-{t1:%H:%M} UTC"


def render(d, elapsed, command, commit="", started=0):
    lines = []
    lines.append(f"Command: `{command}` — {run_time(started, elapsed)} — "
                 f"whole run {elapsed:.0f} s" if elapsed else f"Command: `{command}`")
    lines.append("")
    if commit:
        lines.append(f"Tree measured: {commit}")
        lines.append("")
    lines.append(f"Machine: {machine()}")
    lines.append("")
    if d.load:
        lines.append("Load average (1 min) after each stage: " + ", ".join(
            f"{stage} {la:.2f}" for stage, la in d.load) +
            (f" — above the {os.cpu_count()} CPUs: other work shared the machine"
             if max(la for _, la in d.load) > os.cpu_count() else ""))
        lines.append("")
    lines.append(f"Headline figures: the server's default configuration, segments in "
                 f"{d.headline}." +
                 (f" Rows marked *{d.extra_label}* come from a second server: "
                  f"{d.extra_how}." if d.extra else ""))
    lines.append("")
    lines.append("### Targets (docs/performance.md#targets), as ratios measured in this run")
    lines.append("")
    lines.append("| measure | measured | value | target | |")
    lines.append("|---|---|---|---|---|")
    for t in targets(d):
        lines.append("| " + " | ".join(t) + " |")
    lines.append("")
    lines.append("### Throughput (random rows from a working set larger than the LLC)")
    lines.append("")
    lines.append("GB/s: the rows' bytes copied per second (none for a zero-copy view, "
                 "which reads none of them: its rows/s are lookups).")
    lines.append("")
    lines.append("| what | row | procs | rows/s | GB/s | vs memcpy |")
    lines.append("|---|---|---|---|---|---|")
    for label, size, procs, rate, gb, vs in throughput_rows(d):
        lines.append(f"| {label} | {size_label(size)} | {procs} | {fmt_rate(rate)} | "
                     f"{'—' if gb is None else f'{gb:.2f}'} | "
                     f"{'' if vs is None else f'{vs:.2f}x'} |")
    mem = [(k, x) for k, x in d.values.items() if k.startswith("mem.")]
    if mem:
        lines.append("")
        lines.append("### Shared memory per cached row (bytes)")
        lines.append("")
        lines.append("| row | header+descriptor | index | overhead | shm allocated/row |")
        lines.append("|---|---|---|---|---|")
        for s in SIZES:
            k = str(s)
            if f"mem.overhead_per_row.{k}" in d.values:
                v = d.values
                lines.append(
                    f"| {size_label(s)} | {v[f'mem.encoding_overhead_per_row.{k}']:.0f} | "
                    f"{v[f'mem.index_bytes_per_row.{k}']:.0f} | "
                    f"{v[f'mem.overhead_per_row.{k}']:.0f} | "
                    f"{v[f'mem.shm_bytes_per_row.{k}']:.0f} |")
    dl = {k: x for k, x in d.values.items() if k.startswith("dataloader.")}
    if dl:
        lines.append("")
        lines.append("### PyTorch DataLoader, 2 workers, "
                     f"{dl.get('dataloader.images', 0):.0f} JPEGs 500x375 -> "
                     "decode, resize 224, normalize (float32 rows of 588 KB)")
        lines.append("")
        lines.append("| epoch | seconds | images/s |")
        lines.append("|---|---|---|")
        n = dl.get("dataloader.images", 0)
        for k, label in (("epoch_no_cache_s", "no cache"), ("epoch1_cache_s", "1st, cache cold"),
                         ("epoch2_cache_s", "2nd, cache warm"), ("epoch3_cache_s", "3rd, cache warm"),
                         ("epoch_floor_s", "loader floor: one ready tensor, no decode, no cache"),
                         ("loader.epoch1_s", "CachedLoader 1st, cache cold"),
                         ("loader.steady_epoch_s", "CachedLoader, cache warm"),
                         ("loader.half_spilled.mem_epoch_s",
                          "CachedLoader, cache warm, all in memory (interleaved with:)"),
                         ("loader.half_spilled.epoch_s",
                          "CachedLoader, cache warm, half the rows spilled"),
                         ("loader.half_spilled.step_mem_epoch_s",
                          "the same, all in memory, a step per batch (GPU wait)"),
                         ("loader.half_spilled.step_epoch_s",
                          "the same, half spilled, a step per batch (GPU wait)")):
            key = k if k.startswith("loader.") else f"dataloader.{k}"
            if key in d.values:
                t = d.values[key]
                lines.append(f"| {label} | {t:.{2 if t >= 0.1 else 3}f} | {n / t:.0f} |")
    sw = {k: x for k, x in d.values.items() if k.startswith("switch.")}
    if sw:
        lines.append("")
        lines.append("### The 3-line switch of imagenet/main.py, in main.py's loop "
                     "(mobilenet_v3_small on the CPU): its Data time, "
                     f"{sw.get('switch.images', 0):.0f} JPEGs 500x375, batches of "
                     f"{sw.get('switch.batch', 0):.0f}, main.py's train transform")
        lines.append("")
        lines.append("| loader | Data time per batch (ms) | vs uncached |")
        lines.append("|---|---|---|")
        unc = sw.get("switch.uncached_data_ms")
        for k, label in (("uncached_data_ms", "-j 0, uncached (ImageFolder)"),
                         ("first_data_ms", "-j 0, first epoch (cache cold)"),
                         ("warm_data_ms", "-j 0, cache warm")):
            t = sw.get(f"switch.{k}")
            if t is not None and unc:
                lines.append(f"| {label} | {t:.1f} | {t / unc:.2f}x |")
        j2u, j2w = sw.get("switch.j2_uncached_data_ms"), sw.get("switch.j2_warm_data_ms")
        if j2u and j2w:
            lines.append(f"| -j 2, uncached | {j2u:.1f} | 1.00x |")
            lines.append(f"| -j 2, cache warm | {j2w:.1f} | {j2w / j2u:.2f}x |")
    lines += sweep_lines(d)
    lines += multinode_lines(d.multinode)
    lines += ab_lines(d.ab, d.ab_label)
    if d.skipped:
        lines.append("")
        lines.append("Skipped: " + "; ".join(f"{k} ({r})" for k, r in d.skipped.items()))
    return "\n".join(lines) + "\n"


def ab_lines(ab, label):
    """benchmarks/ab_bench.py's same-run A/B (BENCH_AB=<rev>), as a table."""
    if not ab or "cases" not in ab:
        return []
    lines = ["", f"### A/B: the read path, {label or ab['a']} (A) against this tree (B), "
             f"{ab['rounds']} interleaved rounds (benchmarks/ab_bench.py)", "",
             "| case | A best | B best | B/A best round | B/A median round "
             "| B/A CPU s per unit |", "|---|---|---|---|---|---|"]
    for case, r in ab["cases"].items():
        lines.append(f"| {case} | {r['a_best']:.4g} | {r['b_best']:.4g} | "
                     f"{r['best_ratio']:.2f} | {r['median_ratio']:.2f} | "
                     f"{r['cpu_per_unit_ratio']:.2f} |")
    return lines


MULTINODE_KINDS = (("partitioned", "DataLoader(CachedDataset)"),
                   ("partitioned_cl", "CachedLoader"))


def multinode_lines(mn):
    """The epochs of benchmarks/multinode_bench.py, as a Markdown table."""
    if not mn:
        return []
    c, e, r = mn["config"], mn["epoch_s"], mn["rounds_per_warm_epoch"]
    k = c["window"]
    lines = ["", f"### More than one host: {c['nodes']} simulated nodes x "
             f"{c['ranks_per_node']} ranks, {c['rows']} rows of {size_label(c['row_bytes'])}, "
             f"batch {c['batch']} ({c['batches_per_rank']} per rank per epoch), "
             f"{c['decode_us']} us/row source, {c['backend']}", "",
             f"| epoch (loading only, max over ranks) | first | warm, window {k} (rounds) "
             "| warm, window 1 (rounds) |", "|---|---|---|---|",
             f"| DistributedSampler, no cache | {e['no_cache_s']:.2f} s | "
             f"{e['no_cache_s']:.2f} s | |",
             f"| NodeAffineSampler + DataLoader(CachedDataset) | {e['affine_cold_s']:.2f} s "
             f"| {e['affine_warm_s']:.2f} s | |"]
    for kind, label in MULTINODE_KINDS:
        if f"{kind}_cold_s" in e:
            lines.append(f"| DistributedSampler + PartitionedLoader({label}) | "
                         f"{e[kind + '_cold_s']:.2f} s | {e[kind + '_warm_s']:.2f} s "
                         f"({r[kind]['window']}) | {e[kind + '_warm_w1_s']:.2f} s "
                         f"({r[kind]['window_1']}) |")
    return lines


EPOCH_BARS = (
    ("dataloader.epoch_no_cache_s", "DataLoader, no cache"),
    ("dataloader.epoch1_cache_s", "DataLoader(CachedDataset), cold"),
    ("dataloader.epoch2_cache_s", "DataLoader(CachedDataset), warm"),
    ("dataloader.epoch_floor_s", "DataLoader floor (one ready tensor)"),
    ("loader.epoch1_s", "CachedLoader, cold"),
    ("loader.steady_epoch_s", "CachedLoader, warm"),
    ("loader.half_spilled.epoch_s", "CachedLoader, warm, half spilled"),
)


def plot_epochs(d, ax):
    """Images/s of one epoch of the JPEG pipeline, per loader and cache state."""
    n = d.values.get("dataloader.images", 0)
    bars = [(label, n / d.values[k]) for k, label in EPOCH_BARS
            if n and d.values.get(k)]
    if not bars:
        ax.set_axis_off()
        return
    ax.barh([b[0] for b in bars], [b[1] for b in bars], color="tab:blue")
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("images/s (588 KB float32 rows, 2 workers)")
    ax.set_title("One epoch of the JPEG pipeline")
    ax.grid(True, axis="x", which="both", alpha=0.3)


def plot(d, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(17, 4.8))
    series = [
        ("memcpy limit", "get", "memcpy", None, "k--"),
        ("shmcache Get (copy-out)", "get", "shmcache", "copy-out", "o-"),
        ("shmcache Put", "put", "shmcache", "put", "s-"),
        ("Redis GET", "get", "redis", "GET", "^-"),
        ("Redis GET pipelined", "get", "redis", "GET pipelined x32", "^:"),
        ("LMDB get+copy", "get", "lmdb", "copy-out", "D-"),
    ]
    xs = [s / KB for s in SIZES]
    for label, bench, system, variant, style in series:
        ys = [d.rate(bench, system, variant, size=s) for s in SIZES]
        if any(y is not None for y in ys):
            a.plot([x for x, y in zip(xs, ys) if y], [y * s / 1e9 for s, y in zip(SIZES, ys) if y],
                   style, label=label)
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xticks(xs)
    a.set_xticklabels([size_label(s) for s in SIZES])
    a.set_xlabel("row size")
    a.set_ylabel("GB/s of rows (1 process)")
    a.set_title("Throughput vs row size")
    a.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=8)
    series_p = series[:2] + [("shmcache View (zero-copy)", "view", "shmcache", "zero-copy", "o:")] \
        + series[2:]
    procs = sorted({r["procs"] for r in d.results})
    for label, bench, system, variant, style in series_p:
        ys = [d.rate(bench, system, variant, size=3 * KB, procs=p) for p in procs]
        if any(y is not None for y in ys):
            b.plot([p for p, y in zip(procs, ys) if y], [y for y in ys if y], style, label=label)
    b.set_yscale("log")
    b.set_xticks(procs)
    b.set_xlabel("processes")
    b.set_ylabel("rows/s, all processes (3 KB rows)")
    b.set_title("Throughput vs processes (3 KB rows)")
    b.grid(True, which="both", alpha=0.3)
    b.legend(fontsize=8)
    plot_epochs(d, c)
    fig.suptitle("shmcache vs the memcpy limit, Redis and LMDB — " + machine().split(";")[0] +
                 f", {os.cpu_count()} CPUs", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


HAND_WRITTEN = "(by hand, not by report.py"


def hand_written_sections(path):
    """The sections of an earlier RESULTS.md whose heading says they were
    written by hand (same-run A/Bs of one change), kept after a new run's
    table: a run of scripts/bench.sh replaces only what it measured."""
    try:
        with open(path) as f:
            lines = f.read().splitlines(keepends=True)
    except OSError:
        return ""
    out, keep = [], False
    for line in lines:
        if line.startswith("#"):
            keep = line.startswith("### ") and HAND_WRITTEN in line
        if keep:
            out.append(line)
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpp", required=True)
    ap.add_argument("--python")
    ap.add_argument("--extra", "--huge", dest="extra",
                    help="put and shmcache sections on a second server")
    ap.add_argument("--extra_label", default="huge pages",
                    help="what marks the second server's rows")
    ap.add_argument("--extra_how", default="its --shm_dir is a tmpfs mounted "
                    "huge=within_size (2 MB pages)", help="how it was configured")
    ap.add_argument("--headline", default="/dev/shm (4 KB pages)",
                    help="where the headline server keeps its segments")
    ap.add_argument("--load", help="'stage load' lines")
    ap.add_argument("--multinode", help="benchmarks/multinode_bench.py's JSON")
    ap.add_argument("--sweep", help="benchmarks/host_sweep.py's JSON")
    ap.add_argument("--ab", help="benchmarks/ab_bench.py's JSON (BENCH_AB)")
    ap.add_argument("--ab_label", default="", help="the revision A was built from")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--plot")
    ap.add_argument("--elapsed", type=float, default=0)
    ap.add_argument("--started", type=float, default=0, help="the run's start, epoch seconds")
    ap.add_argument("--commit", default="", help="the commit the run built and measured")
    ap.add_argument("--skip", action="append", default=[], metavar="WHAT=WHY",
                    help="a part the run itself skipped, and why (repeatable)")
    ap.add_argument("--command", default="scripts/bench.sh")
    args = ap.parse_args()
    multinode = None
    if args.multinode and os.path.exists(args.multinode):
        with open(args.multinode) as f:
            multinode = json.load(f)
    d = Data(load(args.cpp), load(args.python), load(args.extra),
             load_samples(args.load), args.headline, args.extra_label, args.extra_how,
             multinode, load(args.sweep))
    d.ab, d.ab_label = load(args.ab), args.ab_label
    for item in args.skip:
        what, _, why = item.partition("=")
        d.skipped[what] = why
    text = render(d, args.elapsed, args.command, args.commit, args.started)
    print()
    print(text)
    if args.markdown:
        kept = hand_written_sections(args.markdown)
        with open(args.markdown, "w") as f:
            f.write("# Benchmark results\n\nLatest run of `scripts/bench.sh` "
                    "(written by benchmarks/report.py).\n\n" + text)
            if kept:
                f.write("\n" + kept)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=machine(), command=args.command, commit=args.commit,
                           elapsed_s=args.elapsed, date=str(datetime.date.today()),
                           time=run_time(args.started, args.elapsed),
                           headline=d.headline, load=d.load,
                           targets=[dict(zip(("measure", "measured", "value", "target",
                                              "status"), t)) for t in targets(d)],
                           results=d.results, values=d.values, skipped=d.skipped,
                           multinode=d.multinode),
                      f, indent=1)
    if args.plot:
        try:
            plot(d, args.plot)
        except Exception as e:  # the table matters more than the picture
            print(f"plot failed: {e}")
    print("Written: " + ", ".join(f"{what} {path}" for what, path in (
        ("JSON", args.json), ("table", args.markdown), ("plot", args.plot)) if path))


if __name__ == "__main__":
    main()
