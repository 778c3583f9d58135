"""Run-time tuning of a CachedLoader's threads and prefetch depth (AutoTune).

Every window (at least WINDOW_BATCHES batches and WINDOW_S seconds of the
consumer's steps), the tuner looks at two fractions:
- wait: the share of the consumer's step (from one batch returned to the
  next) spent waiting for a batch;
- busy: the share of the loader threads' time spent assembling batches.
A consumer that waits more than STARVED of its step gets one thread more
(up to max_threads) and a deeper prefetch; one that waits less than FED
while the threads are idle more than half the time gives a thread and a
prefetch slot back (down to 1 thread and MIN_PREFETCH batches), leaving
the CPU to the training step. Prefetch never exceeds what max_bytes holds
in batches. Only settings passed as "auto" change; each change is logged
once, in one line, on the "shmcache" logger.
"""

import logging
import os
import threading
import time

__all__ = ["AutoTune", "usable_cpus"]

log = logging.getLogger("shmcache")

WINDOW_BATCHES = 8
WINDOW_S = 0.2
STARVED = 0.10
FED = 0.02
IDLE = 0.5
MIN_PREFETCH = 2


class AutoTune:
    def __init__(self, threads: int, prefetch: int, auto_threads: bool,
                 auto_prefetch: bool, max_threads: int, max_bytes: int) -> None:
        self.threads, self.prefetch = threads, prefetch
        self.auto_threads, self.auto_prefetch = auto_threads, auto_prefetch
        self.max_threads, self.max_bytes = max_threads, max_bytes
        self.batch_bytes = 0
        self.changes = 0
        self._lock = threading.Lock()
        self._reset_window(time.monotonic(), 0.0)

    def _reset_window(self, now: float, busy_s: float) -> None:
        self._t0, self._busy0 = now, busy_s
        self._batches, self._wait, self._step = 0, 0.0, 0.0

    def prefetch_cap(self) -> int:
        """The deepest prefetch that max_bytes holds (at least 1)."""
        if not self.batch_bytes:
            return self.prefetch
        return max(1, self.max_bytes // self.batch_bytes)

    def observe(self, waited: float, step: float, batch_bytes: int, busy_s: float,
                live_threads: int) -> bool:
        """One consumed batch: `waited` of the consumer's `step` seconds;
        busy_s: the loader threads' assembling seconds so far. Returns True
        when the settings changed."""
        with self._lock:
            self.batch_bytes = max(self.batch_bytes, batch_bytes)
            self._batches += 1
            self._wait += waited
            self._step += step
            now = time.monotonic()
            if self._batches < WINDOW_BATCHES or now - self._t0 < WINDOW_S:
                return False
            wait = self._wait / self._step if self._step > 0 else 0.0
            busy = (busy_s - self._busy0) / ((now - self._t0) * max(1, live_threads))
            self._reset_window(now, busy_s)
            return self._decide(wait, busy)

    def _decide(self, wait: float, busy: float) -> bool:
        threads, prefetch = self.threads, self.prefetch
        if wait > STARVED:
            if self.auto_threads:
                threads = min(self.max_threads, threads + 1)
            if self.auto_prefetch:
                prefetch = max(prefetch + 2, 2 * threads)
        elif wait < FED and busy < IDLE:
            if self.auto_threads:
                threads = max(1, threads - 1)
            if self.auto_prefetch:
                prefetch = max(MIN_PREFETCH, prefetch - 1)
        if self.auto_prefetch:
            prefetch = min(prefetch, self.prefetch_cap())
        if (threads, prefetch) == (self.threads, self.prefetch):
            return False
        log.info("CachedLoader: consumer waited %.0f%% of the step, threads busy "
                 "%.0f%%; threads %d -> %d, prefetch %d -> %d", 100 * wait,
                 100 * busy, self.threads, threads, self.prefetch, prefetch)
        self.threads, self.prefetch = threads, prefetch
        self.changes += 1
        return True


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
