"""Fill a cache from a dataset before training, with N worker processes.

  python3 -m shmcache.prefill DATASET [--session_id S] [-j N] [-p PORT]
      [--transform MODULE:FUNCTION] [--cache_name NAME] [--size_mb MB]
      [--spilling] [--progress_interval SECONDS]

DATASET is named as in the cache.sh workflow:
  a CIFAR-10 binary directory (data_batch_*.bin): read as
    scripts/my_training_script.py reads it (shmcache.cifar10);
  another directory: torchvision's ImageFolder(DIR, transform=FUNCTION)
    (--transform MODULE:FUNCTION, optional);
  MODULE:FACTORY: FACTORY() returns any map-style dataset.
Rows go to the cache that CachedDataset(dataset, DatasetCache(S, size_mb,
spilling), name=NAME) uses (name default: the dataset's fingerprint), so a
trainer that wraps the same dataset hits them.

Rows already cached are skipped without computing them, so running the
command again resumes. It prints, on stderr: the cache it fills
("prefill: filling cache 'fp-...' of session S"); progress (a tqdm bar on
a terminal, else a line every --progress_interval seconds: "prefill:
512/1200 rows (42.7%), 310 rows/s, ETA 2 s"); one summary line. Exit
status:
  0    every row of the dataset is cached; the session's --list_sessions
       line is printed on stdout;
  1    bad input (one line, "prefill: ..."; argparse errors too), or rows
       are missing at the end: the dataset raised, the cache refused a row
       (the line names the row), the cache is full, or a worker died (the
       line says how: "was killed by SIGKILL" is what the out-of-memory
       killer does); the summary says how many rows are missing;
  130  SIGINT (Ctrl-C), 143 SIGTERM: the workers store the rows in hand
       and stop (a second signal kills them at once); every worker has
       ended when prefill exits.
Workers never outlive prefill: they die with it even when it is killed
(SIGKILL). Running the same command again fills what is missing.

There is no `shmcache --prefill`: the admin CLI (C++, MindSpore's flags)
manages the server and sessions and runs no Python; computing rows needs
the user's Python dataset, so this module is the command.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import re
import signal
import sys
import threading
import time
from typing import Any, NoReturn, TextIO

from . import CacheWarning, Client, DatasetCache
from ._checks import SESSION_ENV, session_from_env, typed_number_flaw
from ._user_line import quietly
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

# The signals that stop prefill: the parent handles them, workers ignore them.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1

# failed[k] of a worker: why it stopped early.
_OK, _FULL, _DATASET_ERROR, _ROW_REFUSED = 0, 1, 2, 3


class _RowRefused(Exception):
    """The cache refused row `row` (its put raised `error`)."""

    def __init__(self, row: int, error: Exception) -> None:
        super().__init__(row, error)
        self.row, self.error = row, error


def _describe(e: BaseException) -> str:
    """ "Type: message" of an exception, whatever its __str__ does."""
    name = type(e).__name__
    try:
        msg = str(e)
    except Exception as why:  # noqa: BLE001 -- the user's __str__
        msg = f"(its message could not be printed: {type(why).__name__})"
    return f"{name}: {msg}" if msg else name


def _exit_status(code: int | None) -> str:
    """How a worker ended, from its Process.exitcode."""
    if code is None:
        return "is still running"
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if -code == signal.SIGKILL:
        return f"was killed by {name} (the out-of-memory killer does that: see dmesg)"
    return f"was killed by {name}"


def _die_with_parent(parent: int) -> None:
    """This worker gets SIGKILL when the process that forked it dies (even
    by SIGKILL), and exits now if that already happened."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass    # no prctl: the per-row parent check below still stops it
    if os.getppid() != parent:
        os._exit(1)


def _worker_main(parent, *args):
    """A worker's start: the stop signals, which the parent blocked while it
    forked, are ignored here before they are unblocked (a Ctrl-C of the
    whole process group is the parent's to act on), then _worker."""
    for s in _STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    _die_with_parent(parent)
    _worker(parent, *args)


def _put(cache, ids, rows):
    """Stores a batch; when the cache refuses one row of it, raises
    _RowRefused naming that row (the rows before it are stored)."""
    try:
        return put_rows(cache, ids, rows)
    except Exception:   # noqa: BLE001 -- find the row, one at a time
        stored = 0
        for i, row in zip(ids, rows):
            try:
                stored += put_rows(cache, [i], [row])
            except Exception as e:  # noqa: BLE001 -- reported by the caller
                raise _RowRefused(i, e) from None
        raise


def _worker(parent, dataset, cache, ids, k, done, stored, failed, stop):
    """Stores dataset[i] for its ids (those cached meanwhile are skipped),
    in batches; stops between rows when `stop` is set or the parent is
    gone. done[k]: rows handled (stored or found cached), stored[k]: stored
    by this worker, failed[k]: why it stopped early (_FULL, _DATASET_ERROR,
    _ROW_REFUSED), reported on stderr by the worker itself."""
    batch_ids: list[int] = []
    rows: list[Any] = []

    def put():
        stored[k] += _put(cache, batch_ids, rows)
        done[k] += len(batch_ids)
        batch_ids.clear()
        rows.clear()

    i = None
    try:
        for i in ids:
            if stop.is_set() or not cache.accepting or os.getppid() != parent:
                break
            if cache.contains(i):
                done[k] += 1
                continue
            batch_ids.append(i)
            rows.append(dataset[i])
            if len(rows) == _BATCH:
                put()
        put()
    except _RowRefused as r:
        msg = _describe(r.error)
        if isinstance(r.error, ValueError):   # already names the row
            msg = msg.split(" cannot be cached: ", 1)[-1]
        print(f"prefill: row {r.row} cannot be cached: {msg}",
              file=sys.stderr, flush=True)
        failed[k] = _ROW_REFUSED
        return
    except Exception as e:  # noqa: BLE001 -- the user's dataset; one line
        print(f"prefill: row {i} of the dataset failed: {_describe(e)}",
              file=sys.stderr, flush=True)
        failed[k] = _DATASET_ERROR
        return
    if not cache.accepting:
        failed[k] = _FULL


class _Pool:
    """The worker processes. They are forked with SIGINT and SIGTERM
    blocked, so that one arriving meanwhile stays pending for the parent
    (its handler sees it once the mask is restored) instead of being lost
    or reaching a half-started worker; each worker ignores both and dies
    with the parent."""

    def __init__(self, dataset, cache, todo, workers):
        ctx = mp.get_context("fork")
        self.done = ctx.Array("q", workers, lock=False)
        self.stored = ctx.Array("q", workers, lock=False)
        self.failed = ctx.Array("b", workers, lock=False)
        self.stop = ctx.Event()
        self.killed = False
        self.procs: list[Any] = []
        parent = os.getpid()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            for k in range(workers):
                p = ctx.Process(target=_worker_main, daemon=True, args=(
                    parent, dataset, cache, todo[k::workers], k, self.done,
                    self.stored, self.failed, self.stop))
                p.start()
                self.procs.append(p)
        except BaseException:
            self.kill()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def alive(self):
        return any(p.is_alive() for p in self.procs)

    def wait(self, timeout):
        """Until a worker ends or `timeout` seconds passed."""
        live = [p.sentinel for p in self.procs if p.exitcode is None]
        if live:
            mp_connection.wait(live, timeout)

    def kill(self):
        """SIGKILL to every worker still running, then reaps them all."""
        for p in self.procs:
            if p.is_alive():
                self.killed = True
                p.kill()
        for p in self.procs:
            p.join()

    def dead(self) -> list[str]:
        """How each worker that did not end with status 0 ended."""
        return [f"worker {k} (pid {p.pid}) {_exit_status(p.exitcode)}"
                for k, p in enumerate(self.procs) if p.exitcode != 0]


class _StopSignals:
    """While prefill runs, SIGINT and SIGTERM are recorded (`received`)
    rather than raised; the main loop acts on them. Outside the main thread
    (where handlers cannot be set) nothing changes."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in _STOP_SIGNALS:
                self._old[s] = signal.signal(s, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.received.append(signum)

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


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
    """total rows, cached before the run, stored by it, elapsed seconds;
    missing: rows still not cached at the end; signal: the signal that
    stopped the run (SIGINT, SIGTERM) or None; interrupted: a signal stopped
    it; full: the cache stopped taking rows; failed: the dataset raised or
    the cache refused a row; dead_workers: how each worker that died ended
    ("worker 1 (pid 4242) was killed by SIGKILL ...")."""

    def __init__(self, total: int, cached_before: int) -> None:
        self.total, self.cached_before = total, cached_before
        self.stored = 0
        self.missing = total - cached_before
        self.seconds = 0.0
        self.signal: int | None = None
        self.interrupted = self.full = self.failed = False
        self.dead_workers: list[str] = []


def _run_pool(pool, progress, cached_before, signals):
    """Follows the workers until they end. The first SIGINT/SIGTERM sets
    their stop flag (each finishes and stores the rows in hand) and the
    wait goes on; a second one kills them. Returns the first signal or
    None."""
    handled = 0
    while True:
        if len(signals.received) > handled:
            if handled == 0:
                pool.stop.set()
                name = signal.Signals(signals.received[0]).name
                print(f"\nprefill: {name}: stopping after the rows in progress "
                      "(Ctrl-C again to abort)", file=sys.stderr, flush=True)
            if len(signals.received) > 1:
                pool.kill()
                break
            handled = len(signals.received)
        if not pool.alive():
            break
        pool.wait(_POLL_S)
        progress.update(cached_before + sum(pool.done))
    progress.update(cached_before + sum(pool.done))
    return signals.received[0] if signals.received else None


def prefill(dataset: Any, cache: DatasetCache, workers: int = 2,
            progress_stream: TextIO = sys.stderr, interval: float = 5.0) -> Result:
    """Stores every row of `dataset` that `cache` (an opened DatasetCache)
    does not hold, with `workers` forked processes, which end before it
    returns. SIGINT and SIGTERM stop it (see _run_pool) when it runs in the
    main thread. Returns a Result."""
    t0 = time.monotonic()
    with _StopSignals() as signals:
        todo = [i for i in range(len(dataset)) if not cache.contains(i)]
        res = Result(len(dataset), len(dataset) - len(todo))
        progress = Progress(res.total, res.cached_before, progress_stream, interval)
        if todo and not signals.received:
            pool = _Pool(dataset, cache, todo, max(1, min(workers, len(todo))))
            try:
                res.signal = _run_pool(pool, progress, res.cached_before, signals)
            finally:
                pool.kill()   # only on an error of the parent: they ended
            res.stored = sum(pool.stored)
            res.full = _FULL in pool.failed[:]
            res.failed = _DATASET_ERROR in pool.failed[:] or _ROW_REFUSED in pool.failed[:]
            if not pool.killed:
                res.dead_workers = pool.dead()
        elif signals.received:
            res.signal = signals.received[0]
        res.interrupted = res.signal is not None
        res.missing = sum(not cache.contains(i) for i in todo)
        progress.close()
    res.seconds = time.monotonic() - t0
    return res


def _shown_name(name: str) -> str:
    """A cache name as the table shows it: control characters as \\n, \\t
    or \\xNN and a backslash as two (clients/admin/output.cc)."""
    out = []
    for ch in name:
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7f:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def session_lines(port: int | None, session_id: int, cache_id: int) -> list[str]:
    """The header and this cache's line of `shmcache --list_sessions`."""
    fmt = "{:>12}{:>12}{:>12}{:>13}{:>16}{:>10}{:>12}{:>12}{:>6}  {}"
    lines = [fmt.format("Session", "Cache Id", "Mem cached", "Disk cached",
                        "Avg cache size", "Numa hit", "Hits", "Misses", "Full",
                        "Name")]
    for s in Client(port=port or 0).list_sessions():
        for c in s["caches"]:
            if s["session_id"] == session_id and c["cache_id"] == cache_id:
                lines.append(fmt.format(
                    session_id, cache_id, c["mem_rows"], c["disk_rows"],
                    c["avg_row_bytes"], c["numa_hits"], c["hits"], c["misses"],
                    "yes" if c["full"] else "no", _shown_name(c["name"])))
    return lines


# ---- the command ----------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse whose errors are BadInput: one line and exit status 1, as
    the admin CLI reports them, not usage and exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise BadInput(f"error: {message}; see '{self.prog} --help'")


def _typed_int(what: str, leading_zero: bool = True):
    """argparse's type= for a number `what` taken as typed, as the admin
    CLI takes its numbers: int() also took " 12", "+12" and "1_2" (a
    quoting slip hidden); a port without a leading zero (`leading_zero`
    False), which other tools read as octal."""
    def parse(text: str) -> int:
        flaw = typed_number_flaw(text)
        if not flaw and not leading_zero and len(text) > 1 and text[0] == "0":
            flaw = "a leading zero"
        if flaw:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not a number ({flaw}); "
                                             "give the digits alone")
        if not re.fullmatch(r"-?[0-9]+", text):
            raise ValueError(text)   # argparse: "invalid int value: '...'"
        return int(text)
    parse.__name__ = "int"
    return parse


def _parse(argv):
    p = _Parser(
        prog="python3 -m shmcache.prefill",
        description="Fill a shmcache cache from a dataset before training.")
    p.add_argument("dataset", help="CIFAR-10 binary directory, image folder, "
                   "or MODULE:FACTORY")
    workers = min(4, os.cpu_count() or 1)
    p.add_argument("--session_id", type=_typed_int("session id"), default=None,
                   help="the session whose cache is filled (a number from "
                   "`shmcache -g`; default: $SHMCACHE_SESSION_ID, else "
                   "$SESSION_ID, as DatasetCache()'s)")
    p.add_argument("-j", "--workers", type=int, default=workers,
                   help="worker processes that compute the rows (default: "
                   f"min(4, CPUs), here {workers})")
    p.add_argument("-p", "--port", type=_typed_int("port", leading_zero=False),
                   default=None,
                   help="port of the cache server (default: $SHMCACHE_PORT, "
                   "else 50052, as the client's)")
    p.add_argument("--transform", help="MODULE:FUNCTION for an image folder")
    p.add_argument("--cache_name", help="the cache's name (default: the "
                   "dataset's fingerprint, as CachedDataset names it)")
    p.add_argument("--size_mb", type=int, default=None, metavar="MB", help="the cache's size "
                   "in MB, as DatasetCache(size_mb=) takes it (default 0: as much as "
                   "the server allows)")
    p.add_argument("--size", type=int, default=None, metavar="MB",
                   help="deprecated: the old name of --size_mb")
    p.add_argument("--spilling", action="store_true",
                   help="rows that do not fit in memory spill to the server's "
                   "spill directory (`shmcache --start -s DIR`) instead of being "
                   "left out (default: off, as DatasetCache(spilling=False))")
    p.add_argument("--progress_interval", type=float, default=5.0,
                   help="seconds between progress lines when not on a terminal")
    a = p.parse_args(argv)
    if a.session_id is None:
        if not any(os.environ.get(v) for v in SESSION_ENV):
            p.error("no session: pass --session_id S, or export $SHMCACHE_SESSION_ID "
                    "(`shmcache -g` prints one)")
        try:
            a.session_id = session_from_env()
        except ValueError as e:
            p.error(str(e))
    if a.workers < 1:
        raise BadInput(f"-j/--workers must be at least 1, got {a.workers}")
    _take_size_mb(a)
    if a.progress_interval <= 0:
        raise BadInput("--progress_interval must be positive")
    if a.cache_name is not None and not a.cache_name:
        raise BadInput("--cache_name must not be empty (leave it out to name the "
                       "cache by the dataset's fingerprint, as CachedDataset does)")
    return a


def _take_size_mb(a):
    """a.size_mb from --size_mb, or from --size (its old name: still taken,
    with a warning on stderr); its refusal names the flag as written."""
    given = "--size_mb"
    if a.size is not None:
        if a.size_mb is not None and a.size_mb != a.size:
            raise BadInput(f"--size {a.size} and --size_mb {a.size_mb} disagree: "
                           "--size is the old name of --size_mb; give --size_mb only")
        given, a.size_mb = "--size", a.size
    if a.size_mb is None:
        a.size_mb = 0
    if a.size_mb < 0:
        raise BadInput(f"{given} is a number of MB (0: as much as the server allows), "
                       f"got {a.size_mb}")
    if given == "--size":
        print("prefill: warning: --size is deprecated: use --size_mb, the name "
              "DatasetCache(size_mb=) and the rest of shmcache use", file=sys.stderr)


def _open_session(a):
    """The session's base cache, opened before the dataset is loaded (a
    factory or an image folder's scan can take minutes): an argument out
    of range, a session that does not exist or no server is said at once."""
    # Its warnings are not shown: a bypassed cache is said below, as a
    # prefill's error (quietly(): not warnings.catch_warnings, which swaps
    # the process's filters under the other threads of a program calling
    # main(), and recorded their warnings as the cache's).
    with quietly(CacheWarning):
        try:
            base = DatasetCache(a.session_id, size_mb=a.size_mb, spilling=a.spilling,
                                port=a.port)
        except (TypeError, ValueError, RuntimeError) as e:
            raise BadInput(str(e).splitlines()[0]) from None
    _refuse_bypassed(base)
    return base


def _open_cache(a, base, dataset):
    from .torch.fingerprint import cache_for_dataset, open_dataset_cache
    with quietly(CacheWarning):
        try:
            cache = open_dataset_cache(cache_for_dataset(dataset, base, a.cache_name))
        except (TypeError, ValueError, RuntimeError) as e:
            raise BadInput(str(e).splitlines()[0]) from None
    _refuse_bypassed(cache)
    return cache


def _refuse_bypassed(cache):
    if cache.bypassed:
        # The warning's cause, without what it tells a trainer ("... rows
        # are read from the source"): prefill has nothing to do.
        raise BadInput("no row can be cached: "
                       f"{cache.cause or 'the cache could not be opened'}")


def _report(res, cache, port):
    """The summary on stderr (and the session's line on stdout when every
    row is cached); the exit status."""
    cached = res.total - res.missing
    where = f"cache {cache.name!r} of session {cache.session_id}"
    counts = f"{cached}/{res.total} rows cached in {where}"
    for line in res.dead_workers:
        print(f"prefill: {line}", file=sys.stderr)
    if res.interrupted:
        name = signal.Signals(res.signal).name
        print(f"prefill: interrupted by {name}: {counts}, {res.missing} missing; "
              "run the same command again to resume", file=sys.stderr)
        return 128 + res.signal
    if res.full:
        print(f"prefill: the cache stopped taking rows (full): {counts}, "
              f"{res.missing} missing; raise --size_mb or the server's memory cap",
              file=sys.stderr)
        return 1
    if res.failed or res.dead_workers or res.missing:
        why = ("stopped on an error" if res.failed else
               "a worker died" if res.dead_workers else "rows were not stored")
        print(f"prefill: {why}: {res.missing} of {res.total} rows missing "
              f"({counts}); run the same command again to fill them",
              file=sys.stderr)
        return 1
    print(f"prefill: done: {res.total} rows cached ({res.stored} stored now, "
          f"{res.cached_before} already cached) in {res.seconds:.1f} s; "
          f"{where}", file=sys.stderr)
    print("\n".join(session_lines(port, cache.session_id,
                                  cache.stats()["cache_id"])), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        a = _parse(argv)
        base = _open_session(a)
        dataset = load_dataset(a.dataset, a.transform)
        cache = _open_cache(a, base, dataset)
    except BadInput as e:
        print(f"prefill: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # before any worker started
        print("prefill: interrupted", file=sys.stderr)
        return 130
    print(f"prefill: filling cache {cache.name!r} of session {cache.session_id}",
          file=sys.stderr, flush=True)
    res = prefill(dataset, cache, a.workers, sys.stderr, a.progress_interval)
    return _report(res, cache, a.port)


if __name__ == "__main__":
    sys.exit(main())
