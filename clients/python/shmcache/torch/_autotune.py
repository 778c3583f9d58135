"""Run-time tuning of a CachedLoader's threads and prefetch depth (AutoTune).

The tuner measures the consumer's steps (from one batch returned to the
next) over windows:
- wait: the share of the steps spent waiting for a batch;
- rate: the batches delivered per second of the steps (batches, not
  bytes: a batch that went through collate_fn has no byte count);
- busy: the share of the loader threads' time spent assembling batches;
- held: the share of the window during which a thread waited for a
  prefetch slot (every batch up to `prefetch` ahead of the consumer
  already taken; one thread waits for it, the others for that one).

Threads, every short window (WINDOW_BATCHES batches and WINDOW_S seconds
at least): a consumer that waits more than STARVED of its step tries one
thread more (up to max_threads). More threads are not always faster: once
the CPUs are busy they take turns, and a consumer that does little waits
whatever the count, so its wait says nothing of whether a thread helps.
So a new count B is a trial until it was measured against the count A
it came from on both sides (A/B/A): after B's window the tuner goes back
to A for a window, and B stays (the tuner goes to it again) only when its
rate beat both of A's windows by GAIN: a burst of the machine's load on
either of A's windows does not make B win, nor one on B's window alone
make A's later verdicts wrong for long. Otherwise B lost and the tuner
tries one thread fewer than A (or stays). One window of a busy host can
still make a better count lose, so a count that lost is barred only for a
while: HOLD_MIN windows after its first loss, twice as long after each
loss in a row (up to HOLD_MAX), none once it won. A count that keeps
losing costs a trial window every HOLD_MAX windows; one that lost to
noise is tried again soon. The count that a winner replaced is barred in
the same way. A trial whose count is clearly slower (its rate below A's
last window by more than CLEAR_LOSS once it has WINDOW_BATCHES batches
and TRIAL_MIN_S seconds) is judged then, without waiting for its whole
window: a warm epoch of 12 KB rows in batches of 256 takes about 16 ms
on 2 CPUs, less than a window, and whole windows of 3 threads and of 1
(13% and 23% slower than 2) slowed several of the host sweep's epochs
(0.83x of 2 threads' although auto's best epoch matched theirs). A count that
would win is not cut short (it is not slower), and one slowed by a burst
loses as it would have over the whole window: it is tried again after
its hold. Holds count whole windows only: counted in cut windows too,
they ran out sooner, and the more frequent trials made more wrong
verdicts on noisy batch times (autotune_sim.py, 12 KB rows, 60 passes:
0.962 of the best fixed count against 0.984 before the cut; 0.978 so).

A window counts the consumer's time, not the wall clock's: a window may
span two passes of the loader, but the trainer's time between them is in
none (nor in the threads' shares), and the batches right after a pass
starts or the threads change (SETTLE: threads start, buffers are made,
the pipeline fills) count in no window. So a trial under way goes on in
the next pass. Each window (its count, rate and wait) is logged at DEBUG
level on the "shmcache" logger.

Prefetch, every long window (WINDOW_BATCHES batches and DEPTH_WINDOW_S
seconds): a starved consumer gets a deeper prefetch only when the threads
were held back by it (for more than HELD of the window): threads that
never waited for a slot gain nothing from one more, and each batch ahead
is a buffer more to fill. A thread more that won its trial brings the
prefetch to 2 batches per thread. A consumer that waits less than FED
while the threads are idle more than IDLE of the time gives a thread and a
prefetch slot back (down to 1 thread and MIN_PREFETCH batches), leaving
the CPU to the training step. Prefetch never exceeds what max_bytes holds
in batches.

Only settings passed as "auto" change; each change is logged once, in one
line, on the "shmcache" logger. The tuner is the loader's: what it learned
holds for its later passes. Thread safe (one lock).
"""

import logging
import os
import threading

__all__ = ["AutoTune", "usable_cpus"]

log = logging.getLogger("shmcache")

# A thread trial's window: enough batches, and long enough (in the
# consumer's time) to span a few of the scheduler's slices (a batch of
# small rows takes under a millisecond). Not shorter: 10 ms windows made
# more wrong verdicts on this VM under load (150 KB rows: 0.93x of the
# best fixed count against 0.96x, median of 24 runs at load 12-15).
WINDOW_BATCHES = 8
WINDOW_S = 0.02
# A trial clearly slower than its count's last window ends early (the
# module says when): after this much of the consumer's time at least ...
TRIAL_MIN_S = 0.004
# ... when its rate is this much below that window's.
CLEAR_LOSS = 0.10
DEPTH_WINDOW_S = 0.2
STARVED = 0.10
FED = 0.02
IDLE = 0.5
HELD = 0.05
MIN_PREFETCH = 2
GAIN = 0.05       # a trial's thread count stays when its rate is this much higher
HOLD_MIN = 16     # windows a count is not tried after its first loss ...
HOLD_MAX = 256    # ... twice as many after each loss in a row, up to this
SETTLE = 2        # batches after a pass starts or the threads change that no window counts


class _Window:
    """The consumer's steps and the threads' times since the window began
    (busy0, held0: the threads' counts then)."""

    def __init__(self, busy_s: float, held_s: float) -> None:
        self.busy0, self.held0 = busy_s, held_s
        self.batches, self.wait, self.step = 0, 0.0, 0.0

    def add(self, waited: float, step: float) -> None:
        self.batches += 1
        self.wait += waited
        self.step += step

    def full(self, seconds: float) -> bool:
        return self.batches >= WINDOW_BATCHES and self.step >= seconds

    def wait_share(self) -> float:
        return self.wait / self.step if self.step > 0 else 0.0

    def rate(self) -> float:
        return self.batches / self.step if self.step > 0 else 0.0

    def thread_share(self, seconds: float, threads: int) -> float:
        """`seconds` (of the threads' count in the window) as a share of
        the window's thread time."""
        return seconds / (self.step * max(1, threads)) if self.step > 0 else 0.0


class AutoTune:
    def __init__(self, threads: int, prefetch: int, auto_threads: bool,
                 auto_prefetch: bool, max_threads: int, max_bytes: int) -> None:
        self.threads, self.prefetch = threads, prefetch
        self.auto_threads, self.auto_prefetch = auto_threads, auto_prefetch
        self.max_threads, self.max_bytes = max_threads, max_bytes
        self.batch_bytes = 0
        self.changes = 0
        self.rates: dict[int, float] = {}    # the latest rate measured by thread count
        # (count it came from, count on trial) while a window measures a trial.
        self._trial: tuple[int, int] | None = None
        # (A, B, B's rate, A's rate before) while A's window after B's trial is measured.
        self._recheck: tuple[int, int, float, float] | None = None
        self._barred: dict[int, int] = {}    # thread count -> windows it is not tried
        self._losses: dict[int, int] = {}    # thread count -> its trials lost in a row
        self._grew = False     # the window just judged: a thread more won its trial
        self._lock = threading.Lock()
        self._held_s = 0.0
        # The threads' counts at the last batch observed (skipped batches
        # move the windows' starts by what they added).
        self._seen = (0.0, 0.0)
        self._skip = SETTLE
        self._short = _Window(0.0, 0.0)
        self._long = _Window(0.0, 0.0)

    def prefetch_cap(self) -> int:
        """The deepest prefetch that max_bytes holds (at least 1)."""
        if not self.batch_bytes:
            return self.prefetch
        return max(1, self.max_bytes // self.batch_bytes)

    def start_pass(self) -> None:
        """A pass of the loader starts: its first SETTLE batches count in
        no window (the pipeline fills)."""
        with self._lock:
            self._skip = SETTLE

    def held(self, seconds: float) -> None:
        """A loader thread waited `seconds` for a prefetch slot."""
        with self._lock:
            self._held_s += seconds

    def observe(self, waited: float, step: float, batch_bytes: int, busy_s: float,
                live_threads: int) -> bool:
        """One consumed batch: `waited` of the consumer's `step` seconds;
        busy_s: the loader threads' assembling seconds so far. Returns True
        when the settings changed."""
        with self._lock:
            self.batch_bytes = max(self.batch_bytes, batch_bytes)
            seen, self._seen = self._seen, (busy_s, self._held_s)
            if self._skip:
                # Neither the step nor the threads' times of a skipped batch
                # count in a window.
                self._skip -= 1
                for w in (self._short, self._long):
                    w.busy0 += busy_s - seen[0]
                    w.held0 += self._held_s - seen[1]
                return False
            changed = False
            long = self._long
            long.add(waited, step)
            if long.full(DEPTH_WINDOW_S):
                self._long = _Window(busy_s, self._held_s)
                changed = self.decide_depth(
                    long.wait_share(), long.thread_share(busy_s - long.busy0, live_threads),
                    long.thread_share(self._held_s - long.held0, 1))
            short = self._short
            short.add(waited, step)
            whole = short.full(WINDOW_S)
            if whole or self._clearly_slower(short):
                self._short = _Window(busy_s, self._held_s)
                log.debug("CachedLoader: a window of %d batches with %d threads: "
                          "%.0f batches/s, consumer waited %.0f%%", short.batches,
                          self.threads, short.rate(), 100 * short.wait_share())
                changed = self.decide_threads(short.wait_share(), short.rate(), whole) or changed
            return changed

    def _clearly_slower(self, w: _Window) -> bool:
        """The window `w` measures a trial whose count is already clearly
        slower than the count it came from (CLEAR_LOSS, after
        WINDOW_BATCHES batches and TRIAL_MIN_S): judged now, as the
        module says."""
        if self._trial is None or w.batches < WINDOW_BATCHES or w.step < TRIAL_MIN_S:
            return False
        return w.rate() < self.rates.get(self._trial[0], 0.0) * (1 - CLEAR_LOSS)

    def decide_threads(self, wait: float, rate: float, whole: bool = True) -> bool:
        """The thread count after a short window of `wait` (a fraction) and
        `rate` (batches per second of the consumer's steps), as the module
        says; True when it changed. A test may call it with the measures
        it wants. `whole`: the window ran its length (a trial judged early
        counts in no hold)."""
        if whole:
            self._barred = {k: n - 1 for k, n in self._barred.items() if n > 1}
        trial, self._trial = self._trial, None
        recheck, self._recheck = self._recheck, None
        if not self.auto_threads:
            return False
        threads, why = self.threads, f"consumer waited {100 * wait:.0f}% of the step"
        self._grew = False
        if trial is not None:
            threads, why = self._judge(trial, rate)
        elif recheck is not None:
            threads, why = self._judge_again(recheck, rate, wait)
        elif wait > STARVED:
            threads = self._next_trial(threads, +1)
        self.rates[self.threads] = rate
        prefetch = self.prefetch
        if self._grew and self.auto_prefetch:
            # A thread more that won its trial: a batch ahead for it to take.
            prefetch = min(max(prefetch, 2 * threads), max(prefetch, self.prefetch_cap()))
        if (threads, prefetch) == (self.threads, self.prefetch):
            return False
        self._change(why, threads, prefetch)
        return True

    def decide_depth(self, wait: float, busy: float, held: float) -> bool:
        """The prefetch depth (and a thread given back) after a long window
        of `wait`, `busy` and `held` (fractions), as the module says; True
        when they changed."""
        threads, prefetch = self.threads, self.prefetch
        if wait > STARVED:
            if self.auto_prefetch and held > HELD:
                prefetch = max(prefetch + 2, 2 * threads)
        elif wait < FED and busy < IDLE and self._trial is None and self._recheck is None:
            if self.auto_threads:
                threads = max(1, threads - 1)
            if self.auto_prefetch:
                prefetch = max(MIN_PREFETCH, prefetch - 1)
        if self.auto_prefetch:
            prefetch = min(prefetch, self.prefetch_cap())
        if (threads, prefetch) == (self.threads, self.prefetch):
            return False
        self._change(f"consumer waited {100 * wait:.0f}% of the step, threads busy "
                     f"{100 * busy:.0f}%, held by the prefetch {100 * held:.0f}%",
                     threads, prefetch)
        return True

    def _change(self, why: str, threads: int, prefetch: int) -> None:
        log.info("CachedLoader: %s; threads %d -> %d, prefetch %d -> %d", why,
                 self.threads, threads, self.prefetch, prefetch)
        if threads != self.threads:
            self._skip = SETTLE
        self.threads, self.prefetch = threads, prefetch
        self.changes += 1

    def _next_trial(self, threads: int, step: int) -> int:
        """The thread count to try from `threads` for a starved consumer:
        one `step` away, else one on the other side, skipping counts out of
        range or barred; `threads` when there is none."""
        for t in (threads + step, threads - step):
            if 1 <= t <= self.max_threads and t not in self._barred:
                self._trial = (threads, t)
                return t
        return threads

    def _judge(self, trial: tuple[int, int], rate: float) -> tuple[int, str]:
        """(thread count, why) after a window measured `trial` (A, B) at
        `rate`: A again, whose next window decides (_judge_again)."""
        base, tried = trial
        before = self.rates.get(base, 0.0)
        self._recheck = (base, tried, rate, before)
        return base, (f"{tried} threads delivered {rate:.0f} batches/s against {before:.0f} "
                      f"with {base}; {base} measured again")

    def _judge_again(self, recheck: tuple[int, int, float, float], rate: float,
                     wait: float) -> tuple[int, str]:
        """(thread count, why) after A's window at `rate` following the
        trial `recheck` (A, B, B's rate, A's rate before it): B when it beat
        both of A's windows by GAIN, else B lost, and a starved consumer
        tries the other side of A."""
        base, tried, tried_rate, before = recheck
        why = (f"{tried} threads delivered {tried_rate:.0f} batches/s against {before:.0f} "
               f"and {rate:.0f} with {base} before and after")
        if tried_rate > max(before, rate) * (1 + GAIN):
            return self._won(base, tried), why
        self._bar(tried)
        if wait > STARVED:
            return self._next_trial(base, tried - base), why
        return base, why

    def _won(self, base: int, tried: int) -> int:
        """`tried` beat `base`: it is no longer barred, `base` is."""
        self._losses.pop(tried, None)
        self._bar(base)
        self._grew = tried > base
        return tried

    def _bar(self, threads: int) -> None:
        """`threads` lost: not tried for HOLD_MIN windows, doubled with each
        loss in a row, HOLD_MAX at most."""
        n = self._losses[threads] = self._losses.get(threads, 0) + 1
        self._barred[threads] = min(HOLD_MAX, HOLD_MIN << min(n - 1, 16))


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
