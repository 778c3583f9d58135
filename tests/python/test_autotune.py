"""CachedLoader's num_threads "auto" (torch/_autotune.py) decides from what
it measured: the tuner is fed batches on a simulated clock, each thread
count with its own batch time, and the test checks the thread counts it
chose. No server, no threads, no timing of this machine."""

import logging
import re

import pytest

pytest.importorskip("torch")

from shmcache.torch import _autotune  # noqa: E402
from shmcache.torch._autotune import AutoTune  # noqa: E402

BATCH = 3 << 20     # bytes of one batch


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(_autotune.time, "monotonic", c)
    return c


def feed(tuner, clock, batch_s, batches, held=0.0, nbytes=BATCH):
    """`batches` batches to a consumer that does nothing but wait for them
    (a host-only epoch): each takes batch_s[threads] seconds, all of them
    waited for, the threads always busy, and for `held` of it one of them
    waiting for a prefetch slot. The thread count at each batch."""
    seen = []
    busy = getattr(tuner, "_test_busy", 0.0)
    for _ in range(batches):
        step = batch_s[tuner.threads]
        clock.now += step
        busy += step * tuner.threads
        seen.append(tuner.threads)
        if held:
            tuner.held(held * step)
        tuner.observe(step, step, nbytes, busy, tuner.threads)
    tuner._test_busy = busy
    return seen


def thread_changes(caplog):
    """The log lines of changes of the thread count."""
    lines = []
    for r in caplog.records:
        m = re.search(r"threads (\d+) -> (\d+)", r.getMessage())
        if m and m[1] != m[2]:
            lines.append(r.getMessage())
    return lines


def new_tuner(threads=2):
    return AutoTune(threads, 4, True, True, max_threads=4, max_bytes=1 << 30)


def test_a_thread_that_slows_the_feed_is_given_back_and_not_tried_again(clock, caplog):
    # Small rows on 2 CPUs: every thread added costs more than it brings.
    batch_s = {1: 0.5e-3, 2: 0.65e-3, 3: 0.8e-3, 4: 1.0e-3}
    tuner = new_tuner()
    with caplog.at_level(logging.INFO, logger="shmcache"):
        first = feed(tuner, clock, batch_s, 300)
    later = feed(tuner, clock, batch_s, 1000)
    assert tuner.threads == 1 and set(later) == {1}, (first, later)
    # It got there by trying: one more thread first, then one fewer; each
    # change logged in one line (prefetch grows meanwhile: still starved).
    lines = thread_changes(caplog)
    assert len(lines) == 2, lines
    assert "threads 2 -> 3" in lines[0] and "threads 3 -> 1" in lines[1], lines
    assert "3 threads delivered" in lines[1], lines


def test_threads_that_speed_the_feed_up_are_kept(clock):
    batch_s = {1: 4e-3, 2: 2e-3, 3: 1.4e-3, 4: 1.1e-3}
    tuner = new_tuner()
    feed(tuner, clock, batch_s, 300)
    assert tuner.threads == 4
    assert set(feed(tuner, clock, batch_s, 1000)) == {4}


def test_batches_without_a_byte_count_are_measured_too(clock):
    # Batches through collate_fn (rows of several layouts) count no bytes.
    batch_s = {1: 4e-3, 2: 2e-3, 3: 1.4e-3, 4: 1.1e-3}
    tuner = new_tuner()
    feed(tuner, clock, batch_s, 300, nbytes=0)
    assert tuner.threads == 4


def test_a_thread_that_brings_less_than_the_gain_is_not_kept(clock):
    # 3 threads 1% faster than 2 (within a busy machine's noise), 1 slower:
    # the tuner stays at 2 and does not flip back and forth.
    batch_s = {1: 1.5e-3, 2: 1.0e-3, 3: 0.99e-3, 4: 0.98e-3}
    tuner = new_tuner()
    feed(tuner, clock, batch_s, 300)
    assert tuner.threads == 2
    # 1 ms batches: a window is WINDOW_S long; 5 * HOLD windows of them.
    windows = 5 * _autotune.HOLD
    settled = feed(tuner, clock, batch_s, int(windows * _autotune.WINDOW_S / 1e-3))
    # Each count that lost is tried again once it is no longer barred
    # (HOLD windows later), for a window: 3 and 1, about 5 times each.
    trials = sum(1 for a, b in zip(settled, settled[1:]) if a == 2 and b != 2)
    assert 1 <= trials <= 2 * (windows // _autotune.HOLD + 1), trials
    assert settled.count(2) > 0.95 * len(settled) and tuner.threads == 2


def test_fixed_threads_are_never_tried(clock):
    batch_s = {2: 1e-3}
    tuner = AutoTune(2, 4, False, True, max_threads=4, max_bytes=1 << 30)
    assert set(feed(tuner, clock, batch_s, 500)) == {2}


def test_the_prefetch_deepens_only_when_it_held_the_threads_back(clock, caplog):
    # A starved consumer whose threads never waited for a slot: the feed is
    # as fast as the threads are; a batch more ahead is only a buffer more.
    tuner = AutoTune(2, 4, False, True, max_threads=4, max_bytes=1 << 30)
    feed(tuner, clock, {2: 1e-3}, 2000)
    assert tuner.prefetch == 4
    # Threads held back by the depth 30% of the time: it grows.
    with caplog.at_level(logging.INFO, logger="shmcache"):
        feed(tuner, clock, {2: 1e-3}, 2000, held=0.3)
    assert tuner.prefetch > 4
    assert "held by the prefetch 30%" in caplog.records[0].getMessage()
