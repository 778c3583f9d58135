"""`ds.cache.close()` while the CachedDataset's background writer still
holds rows for it: close() stores them first (for at most CLOSE_FLUSH_S);
rows it cannot wait for are named in one CacheWarning that says what
happened and what to do, never in the misleading "closed and then used",
and the dataset goes on from its source.

The writer is held at a known point: inside the cache's put, on an Event
the test releases."""

import json
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shmcache._cache  # noqa: E402
from helpers import Images, sample  # noqa: E402
from shmcache import CacheWarning, DatasetCache  # noqa: E402
from shmcache.async_put import AsyncPutter  # noqa: E402
from shmcache.torch import CachedDataset  # noqa: E402
from test_async_puts import assert_cached_rows_whole  # noqa: E402


def hold_writer(ds):
    """Makes every put of ds's writer wait on `release`, after setting
    `entered`."""
    entered, release = threading.Event(), threading.Event()
    real = ds.cache.put_encoded

    def put(ids, rows, strict, quiet=False):
        entered.set()
        assert release.wait(60), "the test never released the writer"
        return real(ids, rows, strict, quiet)
    ds.cache.put_encoded = put
    return entered, release


def cache_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def test_rows_queued_when_the_cache_is_closed_are_stored_before_it_closes(
        server, session, monkeypatch):
    # Before, the writer's rows went to a closed cache: none was stored, and
    # the warning said the cache "was closed ... and then used".
    monkeypatch.setattr(shmcache._cache, "CLOSE_FLUSH_S", 60.0)   # not what is tested
    waiting = threading.Event()
    real_flush = AsyncPutter.flush

    def flush(self, timeout=None):
        waiting.set()
        return real_flush(self, timeout)
    monkeypatch.setattr(AsyncPutter, "flush", flush)
    ds = CachedDataset(Images(8), DatasetCache(session), name="closed-with-rows")
    entered, release = hold_writer(ds)
    # The writer is let go once close() waits for it (or, where close()
    # does not wait, once the test gave up on that).
    threading.Thread(target=lambda: (waiting.wait(20), release.set()), daemon=True).start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(8):
            ds[i]
        assert entered.wait(60)
        ds.cache.close()
    assert cache_warnings(caught) == []
    assert assert_cached_rows_whole(session, "closed-with-rows", 8) == list(range(8))
    assert ds._putter.stats()["written"] == 8


def test_rows_close_cannot_wait_for_are_named_in_one_warning_and_training_goes_on(
        server, session, monkeypatch):
    monkeypatch.setattr(shmcache._cache, "CLOSE_FLUSH_S", 0.05)
    ds = CachedDataset(Images(8), DatasetCache(session), name="closed-stuck")
    entered, release = hold_writer(ds)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds[0]
        assert entered.wait(60)   # the writer holds row 0; rows 1..7 queue
        for i in range(1, 8):
            ds[i]
        ds.cache.close()
        release.set()             # row 0's put now meets the closed cache
        assert ds.flush(60)
        # Training goes on from the source.
        for i in range(8):
            img, label = ds[i]
            want, want_label = sample(i)
            assert np.array_equal(img.numpy(), want) and int(label) == want_label
        assert ds.flush(60)
    said = cache_warnings(caught)
    assert len(said) == 1, said
    assert ("'closed-stuck'" in said[0] and "7 rows (and 1 being written)" in said[0]
            and "not cached" in said[0] and "ds.flush() (CachedLoader: loader.flush()) "
            "before closing the cache" in said[0]), said
    assert "and then used" not in said[0], said
    assert caught[0].filename == __file__   # the user's close() line
    assert assert_cached_rows_whole(session, "closed-stuck", 8) == []
    assert ds._putter.stats()["dropped"] == 7


# A trainer whose SIGTERM handler closes its cache. The signal lands while
# the first miss's row is being queued for the background writer: the
# putter's lock is held (here while it asks, at its writer thread's start,
# whether it runs in a DataLoader worker; any line of enqueue_many's locked
# part is the same). Python runs the handler on that thread, there.
_CLOSE_IN_HANDLER = """
import json, os, signal, sys, warnings
import numpy as np
from helpers import Images, sample
from shmcache import CacheWarning, DatasetCache
from shmcache.torch import CachedDataset

ds = CachedDataset(Images(8), DatasetCache(int(sys.argv[1])), name="closed-in-handler")
closed = []

def on_term(signum, frame):
    ds.cache.close()
    closed.append(True)

signal.signal(signal.SIGTERM, on_term)
ask = ds._putter._batch_wakes

def asked_with_the_lock_held():
    ds._putter._batch_wakes = ask
    os.kill(os.getpid(), signal.SIGTERM)
    return ask()

ds._putter._batch_wakes = asked_with_the_lock_held
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = ds[0]
    rest = [ds[i] for i in range(1, 8)]
    flushed = ds.flush(60)
for i, (img, label) in enumerate([first] + rest):
    want, want_label = sample(i)
    assert np.array_equal(img.numpy(), want) and int(label) == want_label, i
print(json.dumps(dict(closed=closed, flushed=flushed, warnings=[
    str(w.message) for w in caught if issubclass(w.category, CacheWarning)])))
"""


def test_a_close_in_a_signal_handler_that_lands_while_a_row_is_queued_returns(
        server, session, tmp_path):
    # Before, close() waited for the putter's lock, which the interrupted
    # enqueue on the same thread held: the trainer hung in its handler.
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(server.env, PYTHONPATH=here + os.pathsep + server.env["PYTHONPATH"])
    child = subprocess.Popen([sys.executable, "-c", _CLOSE_IN_HANDLER, str(session)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the trainer hung in its SIGTERM handler's close()")
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err
    got = json.loads(out)
    assert got["closed"] == [True] and got["flushed"], got
    # The row being queued when the cache closed is not stored, and that
    # is said once; the samples came from the source all the same.
    said = got["warnings"]
    assert len(said) == 1 and "'closed-in-handler'" in said[0] and \
        "not cached" in said[0], said
    assert assert_cached_rows_whole(session, "closed-in-handler", 8) == []
