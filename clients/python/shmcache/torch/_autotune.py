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
So a new count is a trial until its window measured it: it stays when its
rate beat the count it came from by GAIN (which is then barred),
otherwise it is barred and the tuner tries one thread fewer than the count
it came from, or goes back to it. A barred count is not tried for HOLD
windows. The batches right after a change of the threads (SETTLE: a
thread starts, buffers are made) count in no window.

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
import time

__all__ = ["AutoTune", "usable_cpus"]

log = logging.getLogger("shmcache")

# A thread trial's window: enough batches, and long enough to span a few of
# the scheduler's slices (a batch of small rows takes under a millisecond).
WINDOW_BATCHES = 8
WINDOW_S = 0.02
DEPTH_WINDOW_S = 0.2
STARVED = 0.10
FED = 0.02
IDLE = 0.5
HELD = 0.05
MIN_PREFETCH = 2
GAIN = 0.05       # a trial's thread count stays when its rate is this much higher
HOLD = 100        # windows during which a count that lost is not tried again
SETTLE = 2        # batches after a change of the threads that no window counts


class _Window:
    """The consumer's steps and the threads' times since `t0`."""

    def __init__(self, now: float, busy_s: float, held_s: float) -> None:
        self.t0, self.busy0, self.held0 = now, busy_s, held_s
        self.batches, self.wait, self.step = 0, 0.0, 0.0

    def add(self, waited: float, step: float) -> None:
        self.batches += 1
        self.wait += waited
        self.step += step

    def full(self, now: float, seconds: float) -> bool:
        return self.batches >= WINDOW_BATCHES and now - self.t0 >= seconds

    def wait_share(self) -> float:
        return self.wait / self.step if self.step > 0 else 0.0

    def rate(self) -> float:
        return self.batches / self.step if self.step > 0 else 0.0

    def thread_share(self, now: float, seconds: float, threads: int) -> float:
        """`seconds` (of the threads' count since t0) as a share of the
        window's thread time."""
        return seconds / ((now - self.t0) * max(1, threads)) if now > self.t0 else 0.0


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
        self._barred: dict[int, int] = {}    # thread count -> windows it is not tried
        self._lock = threading.Lock()
        self._held_s = 0.0
        self._skip = SETTLE
        now = time.monotonic()
        self._short = _Window(now, 0.0, 0.0)
        self._long = _Window(now, 0.0, 0.0)

    def prefetch_cap(self) -> int:
        """The deepest prefetch that max_bytes holds (at least 1)."""
        if not self.batch_bytes:
            return self.prefetch
        return max(1, self.max_bytes // self.batch_bytes)

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
            now = time.monotonic()
            changed = False
            long = self._long
            long.add(waited, step)
            if long.full(now, DEPTH_WINDOW_S):
                self._long = _Window(now, busy_s, self._held_s)
                changed = self.decide_depth(
                    long.wait_share(), long.thread_share(now, busy_s - long.busy0, live_threads),
                    long.thread_share(now, self._held_s - long.held0, 1))
            if self._skip:
                self._skip -= 1
                if not self._skip:
                    self._short = _Window(now, busy_s, self._held_s)
            else:
                short = self._short
                short.add(waited, step)
                if short.full(now, WINDOW_S):
                    self._short = _Window(now, busy_s, self._held_s)
                    changed = self.decide_threads(short.wait_share(), short.rate()) or changed
            return changed

    def decide_threads(self, wait: float, rate: float) -> bool:
        """The thread count after a short window of `wait` (a fraction) and
        `rate` (batches per second of the consumer's steps), as the module
        says; True when it changed. A test may call it with the measures
        it wants."""
        self._barred = {k: n - 1 for k, n in self._barred.items() if n > 1}
        trial, self._trial = self._trial, None
        if not self.auto_threads:
            return False
        threads = self.threads
        if trial is not None:
            threads = self._judge(trial, rate)
            why = (f"{trial[1]} threads delivered {rate:.0f} batches/s against "
                   f"{self.rates.get(trial[0], 0.0):.0f} with {trial[0]}")
        else:
            why = f"consumer waited {100 * wait:.0f}% of the step"
            if wait > STARVED:
                threads = self._next_trial(threads, +1)
        self.rates[self.threads] = rate
        prefetch = self.prefetch
        if trial is not None and threads == trial[1] > trial[0] and self.auto_prefetch:
            # A thread more that stays: a batch ahead for it to take.
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
        elif wait < FED and busy < IDLE and self._trial is None:
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

    def _judge(self, trial: tuple[int, int], rate: float) -> int:
        """The thread count after a window measured `trial` (from, to) at
        `rate`: `to` when it beat `from` by GAIN (`from` is then barred),
        else `to` is barred and the other side of `from` is tried, or
        `from` is taken back."""
        base, tried = trial
        if rate > self.rates.get(base, 0.0) * (1 + GAIN):
            self._barred[base] = HOLD
            return tried
        self._barred[tried] = HOLD
        return self._next_trial(base, tried - base)


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
