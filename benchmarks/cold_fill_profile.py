"""Where the CPU of one cold CachedLoader fill goes: `perf record -g` of the
trainer with its workers and of the daemon, cut to the epoch, in buckets
(issue 36's "cold fill" row; docs/performance.md, "The cold fill profiled
by process").

  cold_fill_profile.py --build BUILD [--workers 2] [--rows 2000] [--keep DIR]

Starts a server of BUILD (its own port and run dir, /dev/shm), records the
daemon (perf record -p) and one cold epoch of cold_fill_ab.py's child (perf
record of the process and the workers it forks), both on CLOCK_MONOTONIC so
that the samples can be cut to the epoch the child reports (m0..m1), and
prints, per process (the daemon, the trainer, each worker), its CPU in the
epoch and what it was doing by the kernel and library frames of each sample
(the first bucket of BUCKETS that a sample's stack matches; user stacks
without frame pointers are often cut short, so Python-level detail is not
here). With it, the page supply's CPU for the same bytes (cold_fill_ab's
supply()). Needs perf and the right to use it (perf_event_paranoid, or
root). Measures; asserts nothing.
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from cold_fill_ab import Server, supply

KB = 1024
HZ = 4999
# (bucket, frames that put a sample in it), first match wins.
BUCKETS = (
    ("fork (DataLoader's workers)", ("copy_page_range", "dup_mmap", "copy_process")),
    ("process exit", ("exit_mmap", "do_exit")),
    ("fallocate (page making)", ("shmem_fallocate",)),
    ("pwritev into the cache", ("do_pwritev", "shmem_file_write_iter")),
    ("page faults: mapping cache pages", ("filemap_map_pages", "next_uptodate_folio")),
    ("page faults: fresh memory cleared", ("clear_page", "folio_zero_user")),
    ("page faults: other", ("handle_mm_fault", "exc_page_fault")),
    ("mmap / munmap", ("do_mmap", "__vm_munmap", "do_vmi_munmap")),
    ("futex, scheduling", ("futex", "__schedule", "finish_task_switch")),
    ("sockets, pipes, poll", ("unix_stream", "sock_", "pipe_", "do_sys_poll", "do_select")),
    ("memcpy in user space (the read-back)", ("__memmove", "memcpy")),
    ("torch's thread pool starting", ("libpthreadpool",)),
    ("Python interpreter", ("python3",)),
    ("torch", ("libtorch", "libc10")),
    ("numpy", ("_multiarray",)),
    ("shmcache library", ("libshmcache", "_shmcache")),
    ("libc, other", ("libc.so",)),
    ("kernel, other", ("kernel.kallsyms",)),
)


def samples(path, window):
    """(pid, stack text) of each sample of `path` within `window` (m0,m1)."""
    out = subprocess.run(["perf", "script", "-i", path, "--time", window,
                          "-F", "pid,tid,ip,sym,dso"], capture_output=True, text=True,
                         check=True).stdout
    for block in out.split("\n\n"):
        lines = [ln for ln in block.strip().splitlines() if ln.strip()]
        if lines:
            yield int(lines[0].split()[0].split("/")[0]), " ".join(lines[1:])


def bucket(stack):
    for name, frames in BUCKETS:
        if any(f in stack for f in frames):
            return name
    return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--port", type=int, default=47490)
    ap.add_argument("--keep", help="a directory to keep perf's data files in")
    args = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf is not installed: apt-get install linux-perf")
    tmp = tempfile.mkdtemp(prefix="cold_fill_profile.")
    data = args.keep or tmp
    srv = Server(os.path.abspath(args.build), args.port, tmp)
    rec = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "cpu-clock", "-F", str(HZ),
           "-g"]
    try:
        daemon = subprocess.Popen(rec + ["-p", str(srv.pid), "-o",
                                         os.path.join(data, "daemon.data")])
        time.sleep(0.5)   # perf attached
        child = subprocess.run(rec + ["-o", os.path.join(data, "trainer.data"), "--",
                                      sys.executable, os.path.join(os.path.dirname(
                                          os.path.abspath(__file__)), "cold_fill_ab.py"),
                                      "--child", str(srv.port), str(args.rows),
                                      str(args.workers)],
                               env=srv.env, capture_output=True, text=True, timeout=600)
        daemon.send_signal(2)
        daemon.wait(60)
        if child.returncode:
            sys.exit(f"the cold epoch failed:\n{child.stderr}")
        r = json.loads(child.stdout.strip().splitlines()[-1])
        window = f"{r['m0']:.6f},{r['m1']:.6f}"
        by = collections.defaultdict(collections.Counter)
        trainer = r["pid"]
        for pid, stack in samples(os.path.join(data, "trainer.data"), window):
            by[pid][bucket(stack)] += 1
        for _, stack in samples(os.path.join(data, "daemon.data"), window):
            by["daemon"][bucket(stack)] += 1
        sup_rate, sup_cpu = supply(args.rows * 150 * KB, len(os.sched_getaffinity(0)))
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    n = args.rows
    print(f"cold epoch: {n} x 150 KB rows, {args.workers} worker(s), {r['t']:.3f} s "
          f"({n * 150 * KB / r['t'] / 1e9:.2f} GB/s); misses {r['misses']}, hits {r['hits']}; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"page supply of the same bytes, all CPUs: {sup_rate / 1e9:.2f} GB/s, "
          f"{sup_cpu * 1e3:.1f} ms of CPU ({sup_cpu / n * 1e6:.1f} us a row)")
    total = 0
    for who in ["daemon", trainer] + sorted(p for p in by if p not in ("daemon", trainer)):
        counts = by.get(who)
        if not counts:
            continue
        ms = sum(counts.values()) / HZ * 1e3
        total += ms
        name = "daemon" if who == "daemon" else "trainer" if who == trainer else \
            f"worker (pid {who})"
        print(f"\n{name}: {ms:.1f} ms ({ms / n * 1e3:.1f} us a row)")
        for b, c in counts.most_common():
            print(f"  {b:<40} {c / HZ * 1e3:6.1f} ms  {100 * c / sum(counts.values()):3.0f}%")
    print(f"\nall of them: {total:.1f} ms of CPU, {total / (sup_cpu * 1e3):.2f}x the supply's")


if __name__ == "__main__":
    main()
