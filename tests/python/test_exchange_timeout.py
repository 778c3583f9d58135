"""The timeout of PartitionedLoader's exchange group (how long a round waits
for a rank gone or stuck): exchange_timeout= when given, else the job's
(init_process_group's timeout=) read from the default group where torch
keeps it, else torch's default with one warning.

torch 1.13 (installed here) keeps the job's timeout in the default group's
`options`; torch >= 2.5 (PR #132931) has no ProcessGroup.options, and
keeps it in each backend's options (`group._get_backend(device).options`).
The torch 2.5 shape is made here with torch 1.13's own parts: a Python
subclass of torch's ProcessGroup, which has no `options`, registered as a
backend (torch.distributed.Backend.register_backend) and made the default
group by init_process_group, whose `_device_types` and `_get_backend`
give a real ProcessGroupGloo made with init_process_group's timeout, as
torch 2.5's ProcessGroup does. The accessors are torch 2.5's names; that
they are there in torch 2.5 is read from torch's source (the module doc of
shmcache/torch/partitioned/exchange_timeout.py), not run here.

Each test is one rank (world size 1) in the test's process; the
two-rank test of a rank that never comes is in test_partitioned_exit.py.
"""

import warnings
from datetime import timedelta

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torch._C._distributed_c10d import ProcessGroupGloo  # noqa: E402

from shmcache import DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset, PartitionedLoader  # noqa: E402
from shmcache.torch.partitioned import exchange_timeout as timeouts  # noqa: E402

JOB = timedelta(seconds=7)


class BareGroup(dist.ProcessGroup):
    """A ProcessGroup that says no timeout: no `options` (torch >= 2.5),
    and no backend to ask."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)


class BackendsGroup(BareGroup):
    """torch >= 2.5's shape: no `options`; one backend, gloo, for the CPU,
    made with init_process_group's timeout."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(store, rank, size, timeout)
        self.gloo = ProcessGroupGloo(store, rank, size, timeout)

    @property
    def _device_types(self):
        return [torch.device("cpu")]

    def _get_backend(self, device):
        if device != torch.device("cpu"):
            raise RuntimeError(f"no backend for {device}")
        return self.gloo


dist.Backend.register_backend("bare_group", BareGroup)
dist.Backend.register_backend("backends_group", BackendsGroup)


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full(2, i, dtype=np.float32)


@pytest.fixture
def job(tmp_path, monkeypatch, session):
    """join(backend): this process is the job's one rank, the default
    group made by `backend` with the job's timeout JOB; left at the end.
    No warning said yet in this process; the server's session is the
    loaders' ($SHMCACHE_SESSION_ID)."""
    monkeypatch.setattr(timeouts, "_warned", False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("SHMCACHE_SESSION_ID", str(session))

    def join(backend):
        dist.init_process_group(backend, init_method=f"file://{tmp_path}/store",
                                rank=0, world_size=1, timeout=JOB)
    yield join
    if dist.is_initialized():
        dist.destroy_process_group()


def loader(**kw):
    return PartitionedLoader(CachedDataset(Rows(), DatasetCache(), async_puts=False),
                             batch_size=2, **kw)


def group_timeout(pl):
    """The timeout of the gloo group the loader made (torch 1.13: its
    options)."""
    return pl.exchange.group.options._timeout


def timeout_warnings(record):
    return [str(w.message) for w in record if "exchange_timeout=" in str(w.message)]


def made(**kw):
    """A loader, and the warnings its making said."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pl = loader(**kw)
    return pl, timeout_warnings(w)


def test_the_exchange_has_the_jobs_timeout_on_torch_1_13s_group(job):
    job("gloo")
    pl, said = made()
    assert group_timeout(pl) == JOB and said == []
    pl.close()


def test_the_exchange_has_the_jobs_timeout_from_a_group_without_options(job):
    """torch >= 2.5: the default group has no `options`; its backend's
    options hold the job's timeout (it got torch's 30 minutes before)."""
    job("backends_group")
    assert not hasattr(dist.group.WORLD, "options")
    pl, said = made()
    assert group_timeout(pl) == JOB and said == []
    pl.close()


def test_a_group_that_says_no_timeout_gives_torchs_default_with_one_warning(job):
    job("bare_group")
    first, said = made()
    second, said_again = made()
    default = dist.default_pg_timeout
    assert group_timeout(first) == group_timeout(second) == default
    assert len(said) == 1 and said_again == [], (said, said_again)
    assert f"uses a timeout of {default.total_seconds():g} s" in said[0], said[0]
    assert "PartitionedLoader(..., exchange_timeout=SECONDS)" in said[0], said[0]
    first.close()
    second.close()


@pytest.mark.parametrize("backend", ["gloo", "backends_group", "bare_group"])
@pytest.mark.parametrize("given,seconds", [(12.5, 12.5), (3, 3),
                                           (timedelta(minutes=2), 120)])
def test_exchange_timeout_given_is_the_groups_whatever_the_job_says(job, backend,
                                                                    given, seconds):
    job(backend)
    pl, said = made(exchange_timeout=given)
    assert group_timeout(pl) == timedelta(seconds=seconds) and said == []
    pl.close()


@pytest.mark.parametrize("given,error,words", [
    (0, ValueError, "more than 0 s"), (-1.0, ValueError, "more than 0 s"),
    (timedelta(0), ValueError, "more than 0 s"),
    (float("nan"), ValueError, "finite"), (float("inf"), ValueError, "finite"),
    ("30", TypeError, "seconds (a number) or a timedelta, got str"),
    (True, TypeError, "got bool")])
def test_a_bad_exchange_timeout_is_named(job, given, error, words):
    job("gloo")
    with pytest.raises(error, match="exchange_timeout") as e:
        loader(exchange_timeout=given)
    assert words in str(e.value), str(e.value)


def test_exchange_timeout_with_a_group_of_ones_own_is_refused(job):
    job("gloo")
    group = dist.new_group(backend="gloo")
    with pytest.raises(ValueError, match="exchange_timeout= or group=, not both"):
        loader(group=group, exchange_timeout=5)


def test_first_timeout_passes_over_readers_that_do_not_answer(job):
    """The order: a reader that raises AttributeError (torch 2.5 has no
    options) or RuntimeError (no backend for a device), or gives no
    timedelta, is passed over for the next."""
    job("backends_group")
    world = dist.group.WORLD

    def no_backend(g):
        return g._get_backend(torch.device("meta")).options._timeout
    readers = [lambda g: g.options._timeout, no_backend, lambda g: None,
               *timeouts.READERS]
    assert timeouts.first_timeout(world, readers) == JOB
    assert timeouts.first_timeout(world, readers[:3]) is None
