"""What a dataset holds, in a few bytes: the part of a default cache name
that tells apart two datasets of one class, length, root and transform
(shmcache.torch.fingerprint.cache_for_dataset adds it to
dataset_fingerprint's description; an explicit name= skips it).

    content_identity(ImageFolder("/data/train"))   # "files:5c0e..."
    content_identity(TensorDataset(x, y))          # "samples:91ab..."

It comes from whichever of these the dataset has:

- Its files, when it lists them (`samples` or `imgs` of torchvision's
  DatasetFolder/ImageFolder, a `files` or `paths` list; through Subset's
  `dataset` and ConcatDataset's `datasets`): the size and modification
  time of every listed file, rsync's and make's quick check. A file written
  again, added or removed gives another cache. A copy that keeps both size
  and mtime (cp -p, rsync -t of a same-size file) is not seen: drop the
  session (`shmcache -d`) after such a change. Costs one stat per file; no
  file is read.
- Otherwise its contents: SAMPLES samples at fixed spread indices (the
  first, the last, evenly between), hashed with their structure, types,
  dtypes, shapes and bytes (PIL images with their mode). Each is computed
  with torch's CPU generator, numpy's and Python's global RNGs seeded by
  its index (and restored after), so a dataset with random augmentation
  gives the same identity in every process; the first is computed twice,
  and a dataset whose sample differs between the two reads has no identity
  here (UnknownContents, a ValueError: pass name=). A dataset that has no
  length, raises on one of these samples, or is a one-shot iterator (a
  generator) has none either. A streaming (iterable) source gives its first SAMPLES items of a
  fresh iteration.
- And, in both cases, the size and mtime of a root/path that names a file.

The samples are read on a thread of their own, from a shallow copy of the
dataset (what a read opens lazily, a handle kept on the dataset, stays
the copy's), and waited for at most READ_SECONDS (30 s;
$SHMCACHE_IDENTITY_SECONDS): a dataset whose reads wait until
DataLoader's workers read too (PyTorch's own test_worker_seed) would
otherwise block the process making the CachedDataset for good. Past the
bound the dataset has no identity (UnknownContents; a KeyboardInterrupt
of the wait gives the read up the same way, and is raised): the caller's
RNGs are put back as they were, nothing more is seeded or read, and the thread
is left to end when the sample it is reading does (stopped anywhere in
the dataset's code, it could leave a lock or a semaphore held that
DataLoader's workers wait for). That sample, once its wait ends, stops at
its first call into torch or into numpy's or Python's global RNG (a seed
too), which raises there, and at every such call after it (a profile
function of the reading thread, _stops_draws, that stays when a dataset
catches what it raised): a draw then would come from the caller's RNGs,
between the caller's own draws, and torch's default generator gives
DataLoader's workers their seeds. A thread that already has a profile
function (threading.setprofile) keeps it, without that stop. The profile
function is C's, and reads one byte per call of a builtin until it is
armed (a process the read forks runs without it); a profiled thread still runs Python code unspecialized: a read
made of small Python calls takes 2-3x its time (sys.setprofile's Python
function, called at every call and return, cost 5-8x on the same loop),
a read that decodes in C nothing more. A read
that raises there (a handle bound to the thread that opened it:
sqlite3's connection) is tried once more in the calling thread.

Taken once per CachedDataset (or CachedIterableDataset) made, in the
process that makes it: DataLoader workers receive the cache name with the
pickled dataset. Nothing is read on a hit.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import os
import pickle
import random
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .._shmcache import stat_files, stop_calls

__all__ = ["content_identity", "SAMPLES", "UnknownContents"]

SAMPLES = 8                      # samples hashed when a dataset lists no files
_FILE_LISTS = ("samples", "imgs", "files", "paths")
_ROOTS = ("root", "path", "root_dir", "data_dir", "dataset_path")
_MAX_DEPTH = 64                  # nesting levels hashed in one sample
READ_SECONDS = 30.0              # the most the samples' read is waited for


def content_identity(dataset: Any) -> str:
    """See the module: "files:<hex>" or "samples:<hex>" (plus the root
    file's stat); ValueError naming why when the dataset has none."""
    parts = []
    files = _listed_files(dataset, 0)
    if files is not None:
        parts.append("files:" + _digest(files))
    else:
        parts.append(_read_contents(dataset))
    for attr in _ROOTS:
        path = _str_path(getattr(dataset, attr, None))
        if path is not None and os.path.isfile(path):
            parts.append(f"{attr}:" + _digest(stat_files([path]) or b""))
    return "|".join(parts)


# ---- files ------------------------------------------------------------------

def _str_path(value: Any) -> str | None:
    if not isinstance(value, (str, os.PathLike)):
        return None
    path = os.fspath(value)
    return path if isinstance(path, str) and "\0" not in path else None


def _first_path(value: Any) -> str | None:
    entry = value[0]
    if type(entry) in (list, tuple) and entry:
        entry = entry[0]
    return _str_path(entry)


def _file_stats(value: Any) -> bytes | None:
    """(size, mtime) of every file of a file list (paths, or tuples whose
    first item is a path, as DatasetFolder.samples; the first of them a
    file), else None: a list of samples that start with a str is no file
    list."""
    if type(value) not in (list, tuple) or not value:
        return None
    first = _first_path(value)
    if first is None or not os.path.isfile(first):
        return None
    stats = stat_files(value)
    if stats is None:     # PathLike entries: as str
        paths = [_str_path(e[0] if type(e) in (list, tuple) and e else e) for e in value]
        if any(p is None for p in paths):
            return None
        stats = stat_files(paths)
    return stats


def _listed_files(ds: Any, depth: int) -> bytes | None:
    """The stats of every file the dataset lists (see the module), or None
    when it lists none."""
    if depth > 8:
        return None
    for attr in _FILE_LISTS:
        stats = _file_stats(getattr(ds, attr, None))
        if stats is not None:
            return stats
    inner = getattr(ds, "dataset", None)        # Subset and friends
    if inner is not None and inner is not ds:
        return _listed_files(inner, depth + 1)
    parts = getattr(ds, "datasets", None)       # ConcatDataset
    if type(parts) in (list, tuple) and parts:
        out = []
        for p in parts:
            got = _listed_files(p, depth + 1)
            if got is None:
                return None
            out.append(got)
        return b"".join(out)
    return None


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


# ---- samples ----------------------------------------------------------------

def _is_map_style(ds: Any) -> bool:
    from torch.utils.data import IterableDataset
    return not isinstance(ds, IterableDataset) and hasattr(ds, "__getitem__")


def positions(n: int, k: int = SAMPLES) -> list[int]:
    """k indices spread over range(n): the first, the last, evenly between
    (all of them when n <= k)."""
    if n <= k:
        return list(range(n))
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})


class _Abandoned(BaseException):
    """The caller stopped waiting for this read: it seeds nothing more, and
    stops at its next call into an RNG (_stops_draws). A BaseException: a
    dataset's `except Exception` lets it through."""


class _Rngs:
    """torch's CPU generator, numpy's and Python's global RNGs as they were
    when made, put back after each seeded read, or once and for all by the
    caller that stops waiting for the reads (abandon): after that, a read
    still running on its thread neither seeds nor restores them, so the
    caller's draws are its own. CUDA generators are left alone."""

    def __init__(self) -> None:
        import torch
        self._lock = threading.Lock()
        self._abandoned = False
        # Its first byte set once abandoned: what arms the reading thread's
        # stop (_stops_draws), which reads nothing else until then.
        self.armed = bytearray(1)
        self._saved = (torch.get_rng_state(), random.getstate(), np.random.get_state())

    def seed(self, seed: int) -> None:
        import torch
        with self._lock:
            if self._abandoned:
                raise _Abandoned
            torch.default_generator.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)

    def restore(self) -> None:
        with self._lock:
            if not self._abandoned:
                self._put_back()

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            self.armed[0] = 1     # before the RNGs are the caller's again
            self._put_back()

    def _put_back(self) -> None:
        import torch
        torch.set_rng_state(self._saved[0])
        random.setstate(self._saved[1])
        np.random.set_state(self._saved[2])


@contextmanager
def _seeded(rngs: _Rngs, seed: int) -> Iterator[None]:
    """The global RNGs seeded with `seed` inside, restored after."""
    rngs.seed(seed)
    try:
        yield
    finally:
        rngs.restore()


def _stops_draws() -> Callable[[Any], None]:
    """The check (_shmcache.stop_calls) of the thread that reads for an
    _Rngs, armed once they are abandoned: then the read's every call of a
    builtin of torch (any: a generator's, a tensor's, torch's functions),
    of numpy's global RandomState or numpy.random's functions (seed,
    sample) or of Python's global Random raises _Abandoned, as if that call
    had raised, before it draws or seeds. The sample being read when the
    caller gave up goes on once its wait ends (stopping a thread anywhere
    else could leave a lock or semaphore of the dataset held, that
    DataLoader's workers wait for); a draw of it would come from the
    caller's RNGs, between the caller's own draws: torch's default generator
    gives DataLoader's workers their seeds.
    The stop stays after it raised: a dataset that catches it (a bare
    `except:`) and draws again is stopped again."""
    import torch
    # The global Random and RandomState: what their module's functions are
    # bound to.
    globals_ = (getattr(random.random, "__self__", None),
                getattr(np.random.random, "__self__", None))

    def draws(fn: Any) -> bool:
        owner = getattr(fn, "__self__", None)
        if owner is not None and (any(owner is g for g in globals_ if g is not None)
                                  or isinstance(owner, (torch.Tensor, torch.Generator))):
            return True
        module = getattr(fn, "__module__", None)
        if not isinstance(module, str):
            return False
        # numpy.random's own functions (seed, sample, set_bit_generator)
        # reach the global RandomState from C, where no call is seen.
        return module == "torch" or module.startswith("torch.") or \
            (owner is None and module == "numpy.random.mtrand")

    def check(fn: Any) -> None:
        if draws(fn):
            raise _Abandoned
    _checks.add(check)
    return check


# The checks of the stops installed (_stops_draws), to tell them in a
# forked child.
_checks: weakref.WeakSet[Callable[[Any], None]] = weakref.WeakSet()


def _no_stop_in_child() -> None:
    """A process forked by a reading thread (a dataset that starts a pool
    at its first read) is no read: it runs without the stop, which would
    profile its every call, and once armed raise at its every torch call."""
    # (check, armed), as stop_calls set it: typeshed knows only functions.
    profile: Any = sys.getprofile()
    if type(profile) is tuple and len(profile) == 2 and profile[0] in _checks:
        sys.setprofile(None)


os.register_at_fork(after_in_child=_no_stop_in_child)


def _read_seconds() -> float:
    """$SHMCACHE_IDENTITY_SECONDS (a positive number), else READ_SECONDS."""
    v = os.environ.get("SHMCACHE_IDENTITY_SECONDS")
    try:
        seconds = float(v) if v else READ_SECONDS
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"SHMCACHE_IDENTITY_SECONDS must be a positive number of "
                         f"seconds, got {v!r}")
    return seconds


def _contents_digest(ds: Any, rngs: _Rngs) -> str:
    if _is_map_style(ds):
        return "samples:" + _samples_digest(ds, rngs)
    return "stream:" + _stream_digest(ds, rngs)


def _read_contents(dataset: Any) -> str:
    """_contents_digest on a thread of its own over a shallow copy of the
    dataset, waited for at most _read_seconds() (the module says why)."""
    seconds = _read_seconds()
    try:
        target = copy.copy(dataset)
    except Exception:   # noqa: BLE001 -- not copyable: read the dataset itself
        target = dataset
    rngs = _Rngs()
    got: dict[str, Any] = {}

    def read() -> None:
        # A profiler of the user's (threading.setprofile) is left alone.
        guard = sys.getprofile() is None
        if guard:
            stop_calls(_stops_draws(), rngs.armed)
        try:
            got["digest"] = _contents_digest(target, rngs)
        except _Abandoned:
            pass
        except BaseException as e:   # noqa: BLE001 -- handed to the caller
            got["error"] = e
        finally:
            if guard:
                sys.setprofile(None)

    reader = threading.Thread(target=read, name="shmcache-identity", daemon=True)
    try:
        try:
            reader.start()
        except RuntimeError:   # no thread to be had: read here, unbounded
            return _contents_digest(dataset, rngs)
        reader.join(seconds)
    except BaseException:
        # Ctrl-C (a notebook's interrupted cell), from the start on (the
        # read may be under way before start() returns): given up as at
        # the bound, or the read would go on putting back the RNGs of
        # before the call.
        rngs.abandon()
        raise
    if reader.is_alive():
        rngs.abandon()
        raise _no_identity(f"reading its samples took more than {seconds:g} s: a "
                           "dataset whose reads wait for DataLoader's workers waits "
                           "there for good; $SHMCACHE_IDENTITY_SECONDS sets the bound")
    error = got.get("error")
    if error is None:
        return str(got["digest"])
    if isinstance(error, UnknownContents) and error.__cause__ is not None:
        # The read raised on that thread; a handle bound to the thread
        # that opened it reads in this one.
        return _contents_digest(dataset, _Rngs())
    raise error


class UnknownContents(ValueError):
    """The dataset's contents cannot be told apart from another's: a cache
    name must be given (cache_for_dataset raises it; CachedDataset bypasses
    its cache instead, with one CacheWarning)."""


def _no_identity(why: str) -> UnknownContents:
    return UnknownContents(
        f"CachedDataset cannot tell this dataset's contents from another's "
        f"({why}), so it cannot name its cache by them: pass name= (a name "
        "that differs for different data), as prefill's --cache_name")


def _sample_digest(ds: Any, i: int, rngs: _Rngs) -> bytes:
    try:
        with _seeded(rngs, i):
            sample = ds[i]
    except _Abandoned:
        raise
    except Exception as e:   # noqa: BLE001 -- reported with the fix
        raise _no_identity(f"sample {i} raised {type(e).__name__}: {e}") from e
    h = hashlib.blake2b(digest_size=20)
    _feed(h, sample, 0)
    return h.digest()


def _samples_digest(ds: Any, rngs: _Rngs) -> str:
    try:
        n = len(ds)
    except TypeError:
        raise _no_identity("it has no length") from None
    at = positions(n)
    digests = [_sample_digest(ds, i, rngs) for i in at]
    if at and _sample_digest(ds, at[0], rngs) != digests[0]:
        raise _no_identity(f"sample {at[0]} differs between two reads with the "
                           "same seeds")
    return hashlib.blake2b(b"".join(digests), digest_size=20).hexdigest()


def _stream_digest(source: Any, rngs: _Rngs) -> str:
    def first(k: int) -> bytes:
        it = iter(source)
        if it is source:
            raise _no_identity("it is a one-shot iterator, which reading ahead "
                               "would consume")
        h = hashlib.blake2b(digest_size=20)
        try:
            with _seeded(rngs, 0):
                for item in itertools.islice(it, k):
                    _feed(h, item, 0)
        except _Abandoned:
            raise
        except Exception as e:   # noqa: BLE001 -- reported with the fix
            raise _no_identity(f"iterating it raised {type(e).__name__}: {e}") from e
        return h.digest()
    digest = first(SAMPLES)
    if first(1) != first(1):
        raise _no_identity("its first item differs between two iterations "
                           "with the same seeds")
    return digest.hex()


def _feed(h: Any, v: Any, depth: int) -> None:
    """Hashes `v` with its structure and types (the bytes of arrays,
    tensors and PIL images)."""
    if depth > _MAX_DEPTH:
        h.update(b"<deep>")
        return
    t = type(v)
    if v is None or t in (bool, int, float, complex, str):
        h.update(f"{t.__name__}:{v!r};".encode())
    elif t in (bytes, bytearray):
        h.update(b"bytes:%d;" % len(v))
        h.update(v)
    elif isinstance(v, (np.ndarray, np.generic)):
        _feed_array(h, np.asarray(v), depth)
    elif t.__module__.startswith("torch") and hasattr(v, "detach"):
        _feed_tensor(h, v, depth)
    elif t.__module__.startswith("PIL.") and hasattr(v, "tobytes"):
        h.update(f"PIL:{v.mode}:{v.size};".encode())
        h.update(v.tobytes())
    elif isinstance(v, dict):
        h.update(f"{t.__name__}:{len(v)};".encode())
        for k, x in v.items():
            _feed(h, k, depth + 1)
            _feed(h, x, depth + 1)
    elif isinstance(v, (tuple, list)):
        h.update(f"{t.__name__}:{len(v)};".encode())
        for x in v:
            _feed(h, x, depth + 1)
    elif isinstance(v, (set, frozenset)):
        # Iteration order depends on the process's hash seed: sort digests.
        subs = []
        for x in v:
            s = hashlib.blake2b(digest_size=20)
            _feed(s, x, depth + 1)
            subs.append(s.digest())
        h.update(f"{t.__name__}:{len(v)};".encode() + b"".join(sorted(subs)))
    else:
        h.update(f"{t.__module__}.{t.__qualname__};".encode())
        try:
            h.update(pickle.dumps(v, protocol=4))
        except Exception:   # noqa: BLE001 -- unpicklable: its type alone
            pass


def _feed_array(h: Any, a: np.ndarray, depth: int) -> None:
    h.update(f"nd:{a.dtype.str}:{a.shape};".encode())
    if a.dtype.hasobject:
        for x in a.flat:
            _feed(h, x, depth + 1)
    elif a.size:
        h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _feed_tensor(h: Any, v: Any, depth: int) -> None:
    import torch
    t = v.detach().cpu().contiguous()
    h.update(f"tensor:{t.dtype}:{tuple(t.shape)};".encode())
    if t.numel():
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        try:
            h.update(t.reshape(-1).numpy().view(np.uint8))
        except (TypeError, RuntimeError):   # no numpy view (sparse, quantized)
            _feed(h, t.tolist(), depth + 1)
