"""Fill a cache from a dataset before training, with N worker processes.

  python3 -m shmcache.prefill DATASET --session_id S [-j N] [-p PORT]
      [--transform MODULE:FUNCTION] [--cache_name NAME] [--size MB]
      [--spilling] [--progress_interval SECONDS]

DATASET is named as in the cache.sh workflow:
  a CIFAR-10 binary directory (data_batch_*.bin): read as
    scripts/my_training_script.py reads it (shmcache.cifar10);
  another directory: torchvision's ImageFolder(DIR, transform=FUNCTION)
    (--transform MODULE:FUNCTION, optional);
  MODULE:FACTORY: FACTORY() returns any map-style dataset.
Rows go to the cache that CachedDataset(dataset, DatasetCache(S, size,
spilling), name=NAME) uses (name default: the dataset's fingerprint), so a
trainer that wraps the same dataset hits them.

Rows already cached are skipped without computing them, so running the
command again resumes. Progress goes to stderr: a tqdm bar on a terminal,
else a line every --progress_interval seconds ("prefill: 512/1200 rows
(42.7%), 310 rows/s, ETA 2 s"). Ctrl-C stops the workers after the rows
they are computing (those are stored) and exits with 130. At the end the
session's --list_sessions line is printed on stdout. Bad input: one line
on stderr and exit status 1.

There is no `shmcache --prefill`: the admin CLI (C++, MindSpore's flags)
manages the server and sessions and runs no Python; computing rows needs
the user's Python dataset, so this module is the command.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing as mp
import os
import signal
import sys
import time
import warnings
from typing import Any, TextIO

from . import CacheWarning, Client, DatasetCache
from .async_put import put_rows
from .cifar10 import Cifar10Bin, Normalize, is_cifar10_dir

__all__ = ["prefill", "load_dataset", "BadInput"]

_BATCH = 16            # rows per put_batch
_POLL_S = 0.1          # how often the parent looks at the workers


class BadInput(Exception):
    """What was wrong with the command's input and what to do (one line)."""


# ---- naming the dataset ---------------------------------------------------

def _import_callable(spec, what):
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise BadInput(f"{what} must be MODULE:NAME, got {spec!r}")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise BadInput(f"cannot import {module!r} for {what} {spec!r}: {e}") from None
    except AttributeError:
        raise BadInput(f"module {module!r} has no {attr!r} ({what} {spec!r})") from None
    if not callable(obj):
        raise BadInput(f"{what} {spec!r} is not callable")
    return obj


def _image_folder(path, transform):
    try:
        from torchvision.datasets import ImageFolder
    except ImportError:
        raise BadInput(f"{path} is an image folder, which needs torchvision: "
                       "apt-get install python3-torchvision") from None
    try:
        return ImageFolder(path, transform=transform)
    except (FileNotFoundError, RuntimeError) as e:
        raise BadInput(f"{path} is not an image folder (class subfolders of "
                       f"images): {e}") from None


def load_dataset(spec: str, transform: str | None = None) -> Any:
    """The map-style dataset that DATASET (and --transform) name."""
    fn = _import_callable(transform, "--transform") if transform else None
    if os.path.isdir(spec):
        if is_cifar10_dir(spec):
            if fn is not None:
                raise BadInput("--transform applies to image folders; a CIFAR-10 "
                               "directory is read as the training script reads it")
            return Cifar10Bin(spec, Normalize())
        return _image_folder(spec, fn)
    if os.path.exists(spec) or ":" not in spec:
        raise BadInput(f"no dataset at {spec!r}: give a CIFAR-10 binary directory, "
                       "an image folder, or MODULE:FACTORY")
    if fn is not None:
        raise BadInput("--transform applies to image folders, not to MODULE:FACTORY")
    factory = _import_callable(spec, "the dataset factory")
    try:
        ds = factory()
    except Exception as e:  # the user's code: reported, not a traceback
        raise BadInput(f"{spec}() failed: {type(e).__name__}: {e}") from None
    if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise BadInput(f"{spec} returned a {type(ds).__name__}, not a map-style "
                       "dataset (__len__ and __getitem__)")
    return ds


# ---- the workers ----------------------------------------------------------

def _worker(dataset, cache, ids, k, done, stored, failed, stop):
    """Stores dataset[i] for its ids (those cached meanwhile are skipped),
    in batches; stops between rows when `stop` is set. done[k]: rows handled
    (stored or found cached), stored[k]: stored by this worker, failed[k]:
    1 when the cache stopped taking rows, 2 when the dataset raised."""
    batch_ids: list[int] = []
    rows: list[Any] = []

    def put():
        stored[k] += put_rows(cache, batch_ids, rows)
        done[k] += len(batch_ids)
        batch_ids.clear()
        rows.clear()

    try:
        for i in ids:
            if stop.is_set() or not cache.accepting:
                break
            if cache.contains(i):
                done[k] += 1
                continue
            batch_ids.append(i)
            rows.append(dataset[i])
            if len(rows) == _BATCH:
                put()
        put()
    except Exception as e:  # reported as one line; the parent exits with 1
        print(f"prefill: row {i} of the dataset failed: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        failed[k] = 2
        return
    if not cache.accepting:
        failed[k] = 1


class _Pool:
    """The worker processes (forked, SIGINT ignored: the parent stops them)."""

    def __init__(self, dataset, cache, todo, workers):
        ctx = mp.get_context("fork")
        self.done = ctx.Array("q", workers, lock=False)
        self.stored = ctx.Array("q", workers, lock=False)
        self.failed = ctx.Array("b", workers, lock=False)
        self.stop = ctx.Event()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.procs = [ctx.Process(target=_worker, daemon=True, args=(
                dataset, cache, todo[k::workers], k, self.done, self.stored,
                self.failed, self.stop)) for k in range(workers)]
            for p in self.procs:
                p.start()
        finally:
            signal.signal(signal.SIGINT, old)

    def alive(self):
        return any(p.is_alive() for p in self.procs)

    def wait(self, timeout):
        for p in self.procs:
            p.join(timeout)

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
        self.wait(None)


# ---- progress -------------------------------------------------------------

def _eta(seconds):
    if seconds < 100:
        return f"{seconds:.0f} s"
    m, s = divmod(int(seconds), 60)
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min {s:02d} s"


class Progress:
    """Rows done of `total` on `stream`: a tqdm bar on a terminal (when
    tqdm is installed), else a plain line every `interval` seconds and one
    at the end."""

    def __init__(self, total: int, initial: int, stream: TextIO = sys.stderr,
                 interval: float = 5.0) -> None:
        self.total, self.initial, self.done = total, initial, initial
        self.stream, self.interval = stream, interval
        self.t0 = self.last = time.monotonic()
        self.bar = None
        if stream.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, initial=initial, unit="rows",
                                desc="prefill", file=stream, smoothing=0.1)
            except ImportError:
                pass

    def rate(self) -> float:
        elapsed = time.monotonic() - self.t0
        return (self.done - self.initial) / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        left = self.total - self.done
        eta = _eta(left / rate) if rate > 0 else "0 s" if not left else "?"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (f"prefill: {self.done}/{self.total} rows ({pct:.1f}%), "
                f"{rate:.0f} rows/s, ETA {eta}")

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done
        now = time.monotonic()
        if self.bar is None and now - self.last >= self.interval:
            self.last = now
            print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(self.line(), file=self.stream, flush=True)


# ---- the run --------------------------------------------------------------

class Result:
    """total rows, cached before the run, stored by it, elapsed seconds,
    interrupted (Ctrl-C), full (the cache stopped taking rows), failed (the
    dataset raised)."""

    def __init__(self, total: int, cached_before: int) -> None:
        self.total, self.cached_before = total, cached_before
        self.stored = 0
        self.seconds = 0.0
        self.interrupted = self.full = self.failed = False


def _run_pool(pool, progress, cached_before):
    """Follows the workers until they end; Ctrl-C sets their stop flag and
    goes on waiting (a second Ctrl-C kills them). Returns interrupted."""
    interrupted = False
    while pool.alive():
        try:
            pool.wait(_POLL_S)
            progress.update(cached_before + sum(pool.done))
        except KeyboardInterrupt:
            if interrupted:
                pool.kill()
                break
            interrupted = True
            pool.stop.set()
            print("\nprefill: stopping after the rows in progress (Ctrl-C again "
                  "to abort)", file=sys.stderr, flush=True)
    progress.update(cached_before + sum(pool.done))
    return interrupted


def prefill(dataset: Any, cache: DatasetCache, workers: int = 2,
            progress_stream: TextIO = sys.stderr, interval: float = 5.0) -> Result:
    """Stores every row of `dataset` that `cache` (an opened DatasetCache)
    does not hold, with `workers` forked processes. Returns a Result."""
    t0 = time.monotonic()
    todo = [i for i in range(len(dataset)) if not cache.contains(i)]
    res = Result(len(dataset), len(dataset) - len(todo))
    progress = Progress(res.total, res.cached_before, progress_stream, interval)
    if todo:
        pool = _Pool(dataset, cache, todo, max(1, min(workers, len(todo))))
        res.interrupted = _run_pool(pool, progress, res.cached_before)
        res.stored = sum(pool.stored)
        res.full = 1 in pool.failed[:]
        res.failed = 2 in pool.failed[:]
    progress.close()
    res.seconds = time.monotonic() - t0
    return res


def session_lines(port: int | None, session_id: int, cache_id: int) -> list[str]:
    """The header and this cache's line of `shmcache --list_sessions`."""
    fmt = "{:>12}{:>12}{:>12}{:>13}{:>16}{:>10}{:>12}{:>12}{:>6}"
    lines = [fmt.format("Session", "Cache Id", "Mem cached", "Disk cached",
                        "Avg cache size", "Numa hit", "Hits", "Misses", "Full")]
    for s in Client(port=port or 0).list_sessions():
        for c in s["caches"]:
            if s["session_id"] == session_id and c["cache_id"] == cache_id:
                lines.append(fmt.format(
                    session_id, cache_id, c["mem_rows"], c["disk_rows"],
                    c["avg_row_bytes"], c["numa_hits"], c["hits"], c["misses"],
                    "yes" if c["full"] else "no"))
    return lines


# ---- the command ----------------------------------------------------------

def _parse(argv):
    p = argparse.ArgumentParser(
        prog="python3 -m shmcache.prefill",
        description="Fill a shmcache cache from a dataset before training.")
    p.add_argument("dataset", help="CIFAR-10 binary directory, image folder, "
                   "or MODULE:FACTORY")
    p.add_argument("--session_id", type=int, required=True)
    p.add_argument("-j", "--workers", type=int, default=min(4, os.cpu_count() or 1))
    p.add_argument("-p", "--port", type=int, default=None)
    p.add_argument("--transform", help="MODULE:FUNCTION for an image folder")
    p.add_argument("--cache_name", help="the cache's name (default: the "
                   "dataset's fingerprint, as CachedDataset names it)")
    p.add_argument("--size", type=int, default=0, help="cache size in MB (0: "
                   "as much as the server allows)")
    p.add_argument("--spilling", action="store_true")
    p.add_argument("--progress_interval", type=float, default=5.0,
                   help="seconds between progress lines when not on a terminal")
    a = p.parse_args(argv)
    if a.workers < 1:
        raise BadInput(f"-j/--workers must be at least 1, got {a.workers}")
    if a.progress_interval <= 0:
        raise BadInput("--progress_interval must be positive")
    return a


def _open_cache(a, dataset):
    from .torch import cache_for_dataset
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CacheWarning)
        try:
            base = DatasetCache(a.session_id, size=a.size, spilling=a.spilling,
                                port=a.port)
            cache = cache_for_dataset(dataset, base, a.cache_name).open()
        except (TypeError, ValueError, RuntimeError) as e:
            raise BadInput(str(e).splitlines()[0]) from None
    if cache.bypassed:
        why = caught[0].message if caught else "the cache could not be opened"
        raise BadInput(f"{why} (is the server started? shmcache --start)")
    return cache


def _report(res, cache, port):
    cached = res.cached_before + res.stored
    if res.interrupted:
        print(f"prefill: interrupted: {cached}/{res.total} rows cached; run the "
              "same command again to resume", file=sys.stderr)
        return 130
    if res.failed:
        print(f"prefill: stopped on a dataset error: {cached}/{res.total} rows "
              "cached", file=sys.stderr)
        return 1
    if res.full:
        print(f"prefill: the cache stopped taking rows (full): {cached}/"
              f"{res.total} rows cached; raise --size or the server's memory "
              "cap", file=sys.stderr)
        return 1
    print(f"prefill: done: {cached} rows cached ({res.stored} stored now, "
          f"{res.cached_before} already cached) in {res.seconds:.1f} s",
          file=sys.stderr)
    print("\n".join(session_lines(port, cache.session_id,
                                  cache.stats()["cache_id"])), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        a = _parse(argv)
        dataset = load_dataset(a.dataset, a.transform)
        cache = _open_cache(a, dataset)
    except BadInput as e:
        print(f"prefill: {e}", file=sys.stderr)
        return 1
    try:
        res = prefill(dataset, cache, a.workers, sys.stderr, a.progress_interval)
    except KeyboardInterrupt:   # before the workers started
        print("prefill: interrupted", file=sys.stderr)
        return 130
    return _report(res, cache, a.port)


if __name__ == "__main__":
    sys.exit(main())
