"""CachedLoader's num_threads "auto" (torch/_autotune.py) decides from what
it measured: the tuner is fed batches on a simulated clock, each thread
count with its own batch time, and the test checks the thread counts it
chose. No server, no threads, no timing of this machine."""

import logging
import re
import time

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
    # The tuner counts the consumer's steps; the clock is patched all the
    # same, so that no tuner could read this machine's time.
    monkeypatch.setattr(time, "monotonic", c)
    return c


def feed(tuner, clock, batch_s, batches, held=0.0, nbytes=BATCH, load=None):
    """`batches` batches to a consumer that does nothing but wait for them
    (a host-only epoch): each takes batch_s[threads] seconds (times
    load(clock.now) when given: the machine's other users), all of them
    waited for, the threads always busy, and for `held` of it one of them
    waiting for a prefetch slot. The thread count at each batch."""
    seen = []
    busy = getattr(tuner, "_test_busy", 0.0)
    for _ in range(batches):
        step = batch_s[tuner.threads] * (load(clock.now) if load else 1.0)
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


def test_a_thread_that_slows_the_feed_is_given_back_and_tried_ever_more_rarely(clock, caplog):
    # Small rows on 2 CPUs: every thread added costs more than it brings.
    batch_s = {1: 0.5e-3, 2: 0.65e-3, 3: 0.8e-3, 4: 1.0e-3}
    tuner = new_tuner()
    with caplog.at_level(logging.INFO, logger="shmcache"):
        first = feed(tuner, clock, batch_s, 300)
    later = feed(tuner, clock, batch_s, 5000)
    assert tuner.threads == 1 and later.count(1) > 0.95 * len(later), (first, later)
    # It got there by trying: one more thread first, 2 measured again after
    # it (A/B/A), then one fewer; each change logged in one line (prefetch
    # grows meanwhile: still starved).
    lines = thread_changes(caplog)[:3]
    assert "threads 2 -> 3" in lines[0] and "threads 3 -> 2" in lines[1], lines
    assert "3 threads delivered" in lines[1] and "2 measured again" in lines[1], lines
    assert "threads 2 -> 1" in lines[2] and "before and after" in lines[2], lines
    # 2 lost to 1: tried again, each time after a longer hold.
    trials = [i for i, (a, b) in enumerate(zip(later, later[1:])) if a == 1 and b != 1]
    gaps = [b - a for a, b in zip(trials, trials[1:])]
    assert len(trials) >= 3 and gaps == sorted(gaps), trials


def runs_away_from(seen, count):
    """The lengths (in batches) of the runs of `seen` at another count
    than `count`."""
    runs, n = [], 0
    for t in seen:
        if t != count:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs + ([n] if n else [])


def test_a_trial_of_a_clearly_slower_count_ends_early(clock):
    # Small rows on 2 CPUs, a warm epoch of 78 batches of 0.2 ms (the host
    # sweep's 12 KB rows): one thread and three take twice as long. Each
    # trial of them is cut short once it is clearly slower (after a few
    # batches), not run for a whole window: a window of 20 ms is 50 such
    # batches, most of an epoch, and whole trials of 3 and 1 slowed
    # several epochs.
    batch_s = {1: 0.4e-3, 2: 0.2e-3, 3: 0.4e-3, 4: 0.5e-3}
    tuner = new_tuner()
    seen = []
    for _ in range(40):
        tuner.start_pass()
        seen += feed(tuner, clock, batch_s, 78)
    trials = runs_away_from(seen, 2)
    # Both neighbours tried, each for the batches a pass or a change skips
    # (SETTLE) and the few that show it slower.
    assert {t for t in seen if t != 2} == {1, 3}, seen
    assert trials and max(trials) <= 16, trials
    assert tuner.threads == 2 and seen[-78:].count(2) == 78, seen


def test_a_trial_cut_short_counts_in_no_hold(clock):
    # The same small rows: 3 and 1 lose each trial, cut short after a few
    # batches. Their holds count whole windows (of WINDOW_S: 100 batches
    # of 0.2 ms), not the cut ones: counted, those made holds run out
    # sooner, and more trials made more wrong verdicts on a noisy host.
    batch_s = {1: 0.4e-3, 2: 0.2e-3, 3: 0.4e-3, 4: 0.5e-3}
    tuner = new_tuner()
    seen = feed(tuner, clock, batch_s, 20000)
    starts = [i for i, (a, b) in enumerate(zip(seen, seen[1:])) if a == 2 and b == 3]
    window = _autotune.WINDOW_S / batch_s[2]
    assert len(starts) >= 2, starts
    # Between the first two trials of 3: its cut trial, the window of 2
    # after it (A/B/A), then its hold of HOLD_MIN whole windows (the cut
    # trial of 1 in it counts in none).
    assert starts[1] - starts[0] >= (_autotune.HOLD_MIN + 1) * window, starts


def test_threads_that_speed_the_feed_up_are_kept(clock):
    batch_s = {1: 4e-3, 2: 2e-3, 3: 1.4e-3, 4: 1.1e-3}
    tuner = new_tuner()
    feed(tuner, clock, batch_s, 300)
    assert tuner.threads == 4
    later = feed(tuner, clock, batch_s, 3000)
    assert later.count(4) > 0.95 * len(later) and tuner.threads == 4
    assert tuner.prefetch == 8       # 2 batches ahead per thread that won its trial


def test_a_better_count_that_lost_to_a_burst_of_load_is_tried_again_soon(clock):
    # 3 threads are 30% faster, but the machine's other users take the CPUs
    # during their first trial: they lose it. A long bar would keep the
    # slower count for HOLD_MAX windows; the tuner tries 3 again after
    # HOLD_MIN.
    batch_s = {1: 1.5e-3, 2: 1.0e-3, 3: 0.7e-3, 4: 0.9e-3}
    tuner = new_tuner()
    burst = dict(hit=False, over=False)

    def load(now):
        if tuner.threads == 3 and not burst["over"]:
            burst["hit"] = True
            return 2.0
        burst["over"] = burst["hit"]
        return 1.0
    feed(tuner, clock, batch_s, 300, load=load)
    assert burst["over"] and tuner.threads != 3   # the trial of 3 fell in the burst
    # About 50 windows of 20 ms later (1,500 batches of 0.7 ms at most): 3.
    later = feed(tuner, clock, batch_s, 1500, load=load)
    assert tuner.threads == 3 and later[-300:].count(3) > 0.75 * 300, later


def test_a_burst_of_load_before_a_trial_does_not_make_a_slower_count_win(clock):
    # 2 threads are the fastest, but the machine's other users take the
    # CPUs during the window measured before the first trial: 3 threads
    # look 70% faster than that window. 2 measured again after the trial
    # shows them slower; the tuner stays at 2.
    batch_s = {1: 1.5e-3, 2: 1.0e-3, 3: 1.15e-3, 4: 1.3e-3}
    tuner = new_tuner()

    def load(now):
        return 2.0 if tuner.threads == 2 and not tuner.changes else 1.0
    feed(tuner, clock, batch_s, 300, load=load)
    later = feed(tuner, clock, batch_s, 1500)
    assert tuner.threads == 2 and later.count(2) > 0.9 * len(later), later


def test_the_trainers_time_between_passes_is_no_idle_time_of_the_threads(clock):
    # A fed consumer (10 ms steps, no wait) whose 2 threads are busy 60% of
    # its time, and 300 ms of evaluation after each pass of 20 batches: the
    # threads are needed; the time between passes is not theirs to idle.
    tuner = new_tuner()
    busy, seen = 0.0, []
    for _ in range(20):
        getattr(tuner, "start_pass", lambda: None)()   # as a loader's pass does
        for _ in range(20):
            clock.now += 10e-3
            busy += 2 * 6e-3
            seen.append(tuner.threads)
            tuner.observe(0.0, 10e-3, BATCH, busy, tuner.threads)
        clock.now += 0.3
    assert set(seen) == {2}, seen


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
    # 1 ms batches: a window is WINDOW_S long; 5 * HOLD_MAX windows of them.
    windows = 5 * _autotune.HOLD_MAX
    settled = feed(tuner, clock, batch_s, int(windows * _autotune.WINDOW_S / 1e-3))
    # Each count that lost is tried again once it is no longer barred, for
    # a window: HOLD_MIN windows after its first loss, twice as many after
    # each loss in a row, HOLD_MAX at most: 3 and 1 about 10 times each.
    trials = sum(1 for a, b in zip(settled, settled[1:]) if a == 2 and b != 2)
    doublings = (_autotune.HOLD_MAX // _autotune.HOLD_MIN).bit_length()
    assert 1 <= trials <= 2 * (doublings + windows // _autotune.HOLD_MAX + 1), trials
    assert settled.count(2) > 0.95 * len(settled)


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
