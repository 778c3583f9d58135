"""Datasets of test_loader_contract.py, in a module of their own so that
spawned workers import them. Each one records what a DataLoader script can
see of the loader: worker ids, seeds, random draws, worker pids."""

import os
import random
import signal
import time

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info


def worker_id():
    info = get_worker_info()
    return -1 if info is None else info.id


class Flaky(Dataset):
    """Sample i is (i, 2 i); indices in `bad` raise ValueError."""

    def __init__(self, n, bad):
        self.n, self.bad, self.root = n, set(bad), f"flaky-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"bad sample {i}")
        return i, 2 * i


class Draws(Dataset):
    """Sample i: i, the worker that computed it, its torch.initial_seed(),
    and one draw of each RNG a worker seeds (torch, numpy, random)."""

    def __init__(self, n):
        self.n, self.root = n, f"draws-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"i": i, "worker": worker_id(), "seed": torch.initial_seed(),
                "torch": torch.rand(2), "numpy": np.random.rand(2),
                "random": random.random()}


class Configured(Dataset):
    """Sample i is offset + i, where `offset` exists only once a
    worker_init_fn set it on the worker's copy (configure())."""

    def __init__(self, n):
        self.n, self.root = n, f"configured-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.offset + i, worker_id()


def configure(wid):
    """worker_init_fn: configures the dataset get_worker_info() names."""
    info = get_worker_info()
    assert info.id == wid and isinstance(info.dataset, Configured), info
    info.dataset.offset = 1000 * (wid + 1)


class Barrier(Dataset):
    """Every sample waits until `parties` samples are being computed at
    once (a bounded wait: a loader with fewer computing fails with
    BrokenBarrierError instead of hanging), then returns its worker's
    torch.initial_seed()."""

    def __init__(self, n, barrier):
        self.n, self.barrier, self.root = n, barrier, f"barrier-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.barrier.wait()
        return torch.initial_seed()


class Sleepy(Dataset):
    """The first sample a process computes sleeps `sleep_s`."""

    def __init__(self, n, sleep_s):
        self.n, self.sleep_s, self.slept, self.root = n, sleep_s, False, f"sleepy-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not self.slept:
            self.slept = True
            time.sleep(self.sleep_s)
        return i


class Killer(Dataset):
    """Sample `at` kills the process computing it with `sig`."""

    def __init__(self, n, at, sig):
        self.n, self.at, self.sig, self.root = n, at, sig, f"killer-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            os.kill(os.getpid(), self.sig)
            time.sleep(60)
        return i


class Uncacheable(Dataset):
    """Samples the cache cannot hold (a str), so that every epoch computes
    them again: (i, the pid that computed it, a name)."""

    def __init__(self, n):
        self.n, self.root = n, f"uncacheable-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, os.getpid(), f"row {i}"


class Started(Dataset):
    """Sample i is i, after checking that `start` is what it was when the
    process got its copy of the dataset (0): workers kept across epochs
    keep their copy."""

    def __init__(self, n):
        self.n, self.start, self.root = n, 0, f"started-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        assert self.start == 0, f"dataset copy changed under the worker: {self.start}"
        return i, os.getpid(), "x"


KILLED = signal.SIGKILL


class TwoArgs(Exception):
    """An exception that cannot be made from a message alone."""

    def __init__(self, what, where):
        super().__init__(f"{what} at {where}")


class WithMessage(Exception):
    """An exception with a `message` field, which DataLoader fills by
    keyword."""
    message = "unset"

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class Raising(Dataset):
    """Sample `at` raises `exc` (a KeyError, or an exception type made
    from (message) or, for TwoArgs, two arguments)."""

    def __init__(self, n, at, exc):
        self.n, self.at, self.exc, self.root = n, at, exc, f"raising-{n}-{exc.__name__}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            raise self.exc("row", i) if self.exc is TwoArgs else self.exc(f"no row {i}")
        return i


def failing_init(wid):
    """worker_init_fn that raises in every worker (before it configures
    its dataset)."""
    raise ValueError(f"worker_init_fn failed in worker {wid}")


class Gated(Dataset):
    """Sample i (an int) is computed once gates[i] is set; sample 0 waits
    on `block` (which the test sets to let its worker end). Bounded waits:
    a test that fails does not leave a worker waiting for ever."""

    def __init__(self, n, ctx):
        self.n, self.root = n, f"gated-{n}"
        self.block = ctx.Event()
        self.gates = [ctx.Event() for _ in range(n)]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        (self.block if i == 0 else self.gates[i]).wait(120)
        return i
