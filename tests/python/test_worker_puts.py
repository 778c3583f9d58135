"""How a DataLoader worker stores CachedDataset's misses by default: a
batch's misses are put by the worker itself before the batch is returned
(no queue copy, no writer thread), a cold epoch counts each row once, and
a miss whose sample already has a hit's form is returned as the dataset
made it (docs/python.md, "Puts in a DataLoader worker")."""

import os
import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import continued_after, stopped, wait_for  # noqa: E402
from shmcache import DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

BATCH = 4


class Probe(Dataset):
    """Row i is (uint8 tensor of i, label i % 10, -1, -1); row BATCH, the
    first of the second batch, reports instead what its worker sees of the
    first batch's rows: how many are in the cache, and how many rows this
    process queued for the background writer."""

    def __init__(self, n):
        self.n, self.cds = n, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        stored = queued = -1
        if i == BATCH and self.cds is not None:
            stored = sum(self.cds.cache.contains(k) for k in range(BATCH))
            # The putter's own count: stats() asks the server too.
            queued = self.cds._putter.stats()["queued"]
        return torch.full((16,), i, dtype=torch.uint8), i % 10, stored, queued


def test_a_workers_batch_of_misses_is_stored_before_the_batch_returns(server, session):
    src = Probe(3 * BATCH)
    ds = CachedDataset(src, DatasetCache(session), name="workerbatch")
    src.cds = ds          # the workers' copy sees its own dataset
    batches = list(DataLoader(ds, batch_size=BATCH, num_workers=1))
    # Row BATCH was made after the first batch had been returned: its rows
    # were in the cache then, put by the worker, none queued for a writer.
    _, _, stored, queued = batches[1]
    assert (int(stored[0]), int(queued[0])) == (BATCH, 0)
    assert [k for k in range(3 * BATCH) if ds.cache.contains(k)] == list(range(3 * BATCH))


def test_explicit_async_puts_in_a_worker_still_go_through_the_writer(server, session):
    src = Probe(3 * BATCH)
    ds = CachedDataset(src, DatasetCache(session), name="workerqueue", async_puts=True)
    src.cds = ds
    batches = list(DataLoader(ds, batch_size=BATCH, num_workers=1))
    assert int(batches[1][3][0]) == BATCH      # the first batch's rows were queued
    # Written by the worker's exit flush at the latest.
    assert [k for k in range(3 * BATCH) if ds.cache.contains(k)] == list(range(3 * BATCH))


class Rows(Dataset):
    """n rows of (float32 tensor of 600 values, label)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((600,), float(i)), i % 10


def test_a_cold_epoch_of_two_workers_counts_each_row_once(server, session):
    # More misses per batch than one put takes (datasets._PUT_ROWS): the
    # batch is put in parts, each row once.
    n = 300
    ds = CachedDataset(Rows(n), DatasetCache(session), name="coldcount")
    seen = {}
    for x, y in DataLoader(ds, batch_size=100, shuffle=True, num_workers=2):
        for row, label in zip(x, y):
            seen[int(row[0])] = (row, int(label))
    assert sorted(seen) == list(range(n))
    assert all(torch.equal(r, torch.full((600,), float(i))) and lb == i % 10
               for i, (r, lb) in seen.items())
    st = ds.cache.stats()
    assert (st.misses, st.hits, st.mem_rows) == (n, 0, n)
    assert sum(len(b[1]) for b in DataLoader(ds, batch_size=100, num_workers=2)) == n
    st = ds.cache.stats()
    assert (st.misses, st.hits) == (n, n)


class Samples(Dataset):
    """Returns the sample objects it was given (row i: samples[i])."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def test_a_miss_returns_the_datasets_own_sample_where_a_hit_has_its_form(server, session):
    t = torch.arange(12, dtype=torch.int32)
    same = [(t, 3), (t, 2.5, True), t]
    other = [(np.arange(4, dtype=np.int32), 1),              # an array: a tensor back
             (torch.arange(6.0).reshape(2, 3).t(), 1),       # not contiguous
             (torch.ones(3, requires_grad=True), 1),         # grad
             [t, 3]]                                         # a list: a tuple back
    samples = same + other
    ds = CachedDataset(Samples(samples), DatasetCache(session), name="ownsample",
                       async_puts=False)
    got = ds.__getitems__(list(range(len(samples))))
    for i, s in enumerate(same):
        assert got[i] is s, i
    for k, s in enumerate(other):
        g = got[len(same) + k]
        assert g is not s and type(g) is tuple and type(g[0]) is torch.Tensor, k
        assert not g[0].requires_grad and g[0].is_contiguous(), k
    # Hits give what the misses gave: the same types and values.
    hits = ds.__getitems__(list(range(len(samples))))
    assert ds.cache.stats().hits == len(samples)
    for m, h in zip(got, hits):
        m, h = (m, h) if type(m) is tuple else ((m,), (h,))
        assert [type(v) for v in m] == [type(v) for v in h]
        for a, b in zip(m, h):
            assert torch.equal(a.detach(), b) if isinstance(a, torch.Tensor) else a == b


def test_after_a_worker_waited_on_a_stopped_server_workers_put_through_the_writer(
        server, session):
    """A stopped server (SIGSTOP) holds a worker's waited put for the request
    timeout (5 s) before the worker reads on without the cache. Once one
    worker met that, the workers of the epochs after it queue their misses
    for the background writer (which never holds a batch) rather than each
    waiting again: each new worker process of each epoch waited its 5 s
    before, and a DataLoader(timeout=3) failed every epoch ('DataLoader
    timed out after 3.0 seconds'), where async_puts=True read on."""
    src = Probe(3 * BATCH)
    ds = CachedDataset(src, DatasetCache(session), name="stoppedserver")
    src.cds = ds
    ds[2 * BATCH]                      # the cache open, then the server stopped
    assert ds.flush(30)
    with continued_after(server.pid):
        os.kill(server.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(server.pid))
        for epoch in range(2):
            batches = list(DataLoader(ds, batch_size=BATCH, num_workers=1))
            assert sum(len(b[1]) for b in batches) == 3 * BATCH
            _, _, _, queued = batches[1]
            # Epoch 0's worker waited on the server, without a queue; epoch
            # 1's queued the first batch's rows for its writer.
            assert int(queued[0]) == (0 if epoch == 0 else BATCH), epoch
