"""The dataset of the prefill process tests (`prefill_helpers:rows`), steered
by environment variables so that a test can act at a given moment of the
run: when a worker has started, while the workers are still being forked,
when a given row is computed.

PREFILL_ROWS        number of rows (default 400); row i is (uint8 3x8x8
                    image of helpers.sample(i, 8), label i % 10).
PREFILL_PIDS        a directory: each worker creates a file named by its pid
                    there before it computes its first row.
PREFILL_COUNTER     a file: the id of every computed row is appended to it.
PREFILL_GATE, PREFILL_GATE_AT
                    rows >= PREFILL_GATE_AT wait until the file PREFILL_GATE
                    exists (at most 120 s).
PREFILL_SIGNAL_PARENT
                    a file: the first row computed sends SIGINT to the
                    worker's parent (prefill), then creates the file.
PREFILL_HOLD_FORKS  a file: in the process that imports this module (the
                    prefill parent), every fork after the first waits until
                    the file exists (at most 120 s), so that something a
                    first worker does happens while later workers are not
                    yet forked.
PREFILL_END_AT      "ROW:HOW": computing ROW ends the worker: HOW "kill"
                    (SIGKILL itself, as the out-of-memory killer does) or
                    "exit3" (os._exit(3)).
PREFILL_STR_LABEL_AT
                    that row's label is a str, which the cache refuses.
PREFILL_RAISE_AT    "ROW:KIND": computing ROW raises an exception of a local
                    class (KIND "unpicklable") or one whose str() raises
                    (KIND "unprintable").
PREFILL_MADE        a file: the factory creates it when prefill calls it
                    (the dataset was loaded).
"""

import os
import signal
import time

from torch.utils.data import Dataset

from helpers import sample

_WAIT_S = 120.0


def _wait_for_file(path):
    deadline = time.monotonic() + _WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


def _row_spec(name):
    v = os.environ.get(name)
    if not v:
        return None, None
    row, _, how = v.partition(":")
    return int(row), how


class Rows(Dataset):
    def __init__(self, n):
        self.n, self.root = n, "prefill-rows"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        env = os.environ
        if env.get("PREFILL_PIDS"):
            open(os.path.join(env["PREFILL_PIDS"], str(os.getpid())), "a").close()
        signalled = env.get("PREFILL_SIGNAL_PARENT")
        if signalled and not os.path.exists(signalled):
            os.kill(os.getppid(), signal.SIGINT)
            open(signalled, "a").close()
        gate, at = env.get("PREFILL_GATE"), int(env.get("PREFILL_GATE_AT", -1))
        if gate and 0 <= at <= i:
            _wait_for_file(gate)
        end_at, how = _row_spec("PREFILL_END_AT")
        if i == end_at:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        raise_at, kind = _row_spec("PREFILL_RAISE_AT")
        if i == raise_at:
            _raise(kind, i)
        if env.get("PREFILL_COUNTER"):
            with open(env["PREFILL_COUNTER"], "a") as f:
                f.write(f"{i}\n")
        img, label = sample(i, 8)
        if str(i) == env.get("PREFILL_STR_LABEL_AT"):
            return img, "cat"
        return img, label


def _raise(kind, i):
    class Unpicklable(Exception):
        pass

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no str for this one")

    if kind == "unpicklable":
        raise Unpicklable(f"boom at row {i}")
    raise Unprintable()


def rows():
    """The MODULE:FACTORY."""
    if os.environ.get("PREFILL_MADE"):
        open(os.environ["PREFILL_MADE"], "w").close()
    return Rows(int(os.environ.get("PREFILL_ROWS", "400")))


_forks = 0


def _hold_fork():
    global _forks
    _forks += 1
    if _forks > 1:
        _wait_for_file(os.environ["PREFILL_HOLD_FORKS"])


if os.environ.get("PREFILL_HOLD_FORKS"):
    os.register_at_fork(before=_hold_fork)
