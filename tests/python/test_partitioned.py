"""PartitionedLoader on two simulated nodes x two ranks on one host: one
shmcache server per node (own port, own --shm_dir), ranks launched as srun
launches them (env:// variables, gloo over 127.0.0.1), each rank using its
node's server; rows a node does not own come from their owner node over the
job's process group.

partition_rank.py trains with DistributedSampler(shuffle=True) from the
source and through PartitionedLoader; the tests compare the two and check
what the caches hold, with everything working, with a rank that leaves an
epoch early, and with one node's server dead; each case for both loader
kinds PartitionedLoader wraps (DataLoader(CachedDataset) and CachedLoader),
with windows of 1 and 3 batches per exchange round.
"""

import contextlib
import json
import math
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import free_tcp_port, node_server, run_ranks

HERE = Path(__file__).resolve().parent
NODES, LOCAL = 2, 2
WORLD = NODES * LOCAL
# 100 rows: 25 per rank, batches of 8: three full batches and one of 1.
N, EPOCHS, BATCH = 100, 3, 8
BATCHES = 4
# (what PartitionedLoader wraps, its window): one round per batch for the
# DataLoader, one per 3 batches (2 rounds for 4 batches) for the CachedLoader.
KINDS = {"dataloader": 1, "cachedloader": 3}


def _run_ranks(envs, args, timeout=150, script="partition_rank.py"):
    """Runs one `script` per env; fails (killing the others) when one fails
    or when they are not all done within `timeout` s."""
    run_ranks(["/usr/bin/python3", str(HERE / script), *map(str, args)], envs, timeout)


def _job(tmp, kind, workers=0, brk=None, dead_node=None, script="partition_rank.py",
         args=None):
    """Starts a server per node, runs the ranks, stops the servers;
    {rank: results of `script`} (partition_rank.py with the module's sizes
    unless `args`)."""
    master_port = free_tcp_port()
    servers, envs = [], []
    with contextlib.ExitStack() as undo:
        try:
            for node in range(NODES):
                s, session = node_server(undo, tmp, node, "part", servers)
                if node == dead_node:
                    s.kill()
                for local in range(LOCAL):
                    envs.append(dict(
                        s.env, SESSION_ID=str(session), OMP_NUM_THREADS="1",
                        RANK=str(node * LOCAL + local), WORLD_SIZE=str(WORLD),
                        LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(LOCAL),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port)))
            if args is None:
                args = [N, EPOCHS, BATCH, workers, kind, KINDS[kind]] + ([brk] if brk else [])
            _run_ranks(envs, [tmp] + args, script=script)
            return {r: json.loads((tmp / f"rank{r}.json").read_text())
                    for r in range(WORLD)}
        finally:
            for s in servers:
                s.stop()


def _same_batches(res, rank, epochs=range(EPOCHS)):
    for e in epochs:
        src = res["source"][e]["batches"]
        got = res["partitioned"][e]["batches"]
        assert got == src, f"rank {rank}, epoch {e}: batches differ"


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def job(tmp_path_factory, kind):
    return _job(tmp_path_factory.mktemp(f"partitioned-{kind}"), kind, workers=1)


def test_batches_and_losses_are_distributed_samplers(job):
    for rank, res in job.items():
        _same_batches(res, rank)
        assert [len(b["indices"]) for b in res["source"][0]["batches"]] == [8, 8, 8, 1]
        assert res["len"] == BATCHES
        cached = [e["loss_sum"] for e in res["partitioned"]]
        assert cached == [e["loss_sum"] for e in res["source"]], f"rank {rank}"
        assert res["threads"] == [], "threads outlived the loader"


def test_one_exchange_round_per_window_of_batches(job, kind):
    """An epoch of 4 batches takes ceil(4 / window) rounds that carry
    batches, then (warm epochs: nothing left to push) one closing round
    where every rank says done."""
    rounds = math.ceil(BATCHES / KINDS[kind])
    for rank, res in job.items():
        per = [e["counters"] for e in res["partitioned"]]
        assert [c["rounds"] for c in per] == [rounds] * EPOCHS, f"rank {rank}: {per}"
        assert all(c["closing_rounds"] == 1 for c in per[1:]), f"rank {rank}: {per}"


def test_first_epoch_misses_then_every_row_a_hit_local_or_remote(job):
    for rank, res in job.items():
        per = [e["counters"] for e in res["partitioned"]]
        print(f"rank {rank} per epoch: {per}")
        rows = N // WORLD
        assert per[0]["misses"] == rows and per[0]["local_hits"] == 0 \
            and per[0]["remote_hits"] == 0
        # Rows of the other node were computed here and sent to their owner.
        assert 0 < per[0]["pushed"] < rows
        for c in per[1:]:
            assert c["misses"] == 0
            assert c["local_hits"] + c["remote_hits"] == rows
            assert c["remote_hits"] > 0 and c["local_hits"] > 0


def test_warm_epochs_look_up_nothing_the_cache_lacks(job):
    """The caches' own misses counters stay flat after the first epoch: a
    rank never looks up, in its node's cache, a row another node owns."""
    for rank, res in job.items():
        misses = [e["cache_misses"] for e in res["partitioned"]]
        assert misses[0] > 0 and misses[1:] == [misses[0]] * (EPOCHS - 1), \
            f"rank {rank}: the node's cache misses at each epoch's end: {misses}"


def test_each_node_holds_its_half(job):
    owned = []
    for node in range(NODES):
        ranks = [job[node * LOCAL + k] for k in range(LOCAL)]
        assert ranks[0]["owned"] == ranks[1]["owned"]
        assert ranks[0]["mem_rows"] == len(ranks[0]["owned"]) == N // NODES
        owned += ranks[0]["owned"]
    assert sorted(owned) == list(range(N))
    assert all(not res["warnings"] for res in job.values())


def test_a_rank_leaving_an_epoch_early_hangs_nobody(tmp_path, kind):
    """Rank 0 breaks out of epoch 1 after one batch; the others read the
    whole epoch (rank 0 keeps answering them), then all go on."""
    res = _job(tmp_path, kind, brk="0:1:1")
    for rank in range(WORLD):
        epochs = [0, 2] if rank == 0 else range(EPOCHS)
        _same_batches(res[rank], rank, epochs)
        for e in epochs[1:]:
            assert res[rank]["partitioned"][e]["counters"]["misses"] == 0
    assert res[0]["partitioned"][1]["batches"] == res[0]["source"][1]["batches"][:1]


def test_a_dead_server_on_one_node_its_rows_come_from_the_source(tmp_path, kind):
    res = _job(tmp_path, kind, dead_node=1)
    for rank in range(WORLD):
        _same_batches(res[rank], rank)
        node = rank // LOCAL
        assert len(res[rank]["warnings"]) == (1 if node == 1 else 0), \
            res[rank]["warnings"]
        if node == 0:
            mine = set(res[rank]["owned"])
            for e in range(1, EPOCHS):
                read = [i for b in res[rank]["source"][e]["batches"]
                        for i in b["indices"]]
                c = res[rank]["partitioned"][e]["counters"]
                assert c["misses"] == sum(i not in mine for i in read)
    assert res[0]["mem_rows"] == N // NODES
    assert res[2]["mem_rows"] is None


def test_every_column_type_arrives_as_a_local_hit_decodes(tmp_path, kind):
    """PIL images of every mode, bfloat16, float16, bool, widened uints,
    complex, 0-d, bytes, and samples the cache cannot hold (strings, nested
    tuples and dicts), from this node's cache, another node's or the
    source: each sample of each batch, in DistributedSampler's order, is
    what a cache hit of it decodes to (partition_types_rank.py); warm
    epochs of cacheable rows look up nothing their node's cache lacks."""
    epochs = 3
    res = _job(tmp_path, kind, script="partition_types_rank.py",
               args=[48, epochs, 4, kind, KINDS[kind]])
    for rank, r in res.items():
        for name in ("fixed", "mixed"):
            per = r[name]
            for e, ep in enumerate(per):
                assert len(ep["got"]) == 3, (rank, name, e)
                for b, (got, want) in enumerate(zip(ep["got"], ep["want"])):
                    assert got == want, f"rank {rank}, {name}, epoch {e}, batch {b}"
            c = per[-1]["counters"]
            assert c["remote_hits"] > 0 and c["local_hits"] > 0, (rank, name, c)
        # Every fixed row is cached: no lookup misses after the first epoch
        # (the mixed set's strings and nested samples are never cached).
        misses = [ep["cache_misses"] for ep in r["fixed"]]
        assert misses[1:] == [misses[0]] * (epochs - 1), (rank, misses)
        # One warning: the mixed set's samples with no column encoding.
        assert len(r["warnings"]) == 1 and "cannot be cached" in r["warnings"][0], \
            r["warnings"]


# ---- without servers: the row codec and the ownership split ---------------

def test_rows_travel_whole_in_the_caches_own_encoding():
    import numpy as np
    import torch
    from PIL import Image
    from shmcache import rows as row_model
    from shmcache.torch.partitioned.exchange import pack_rows, unpack_rows
    strided = np.arange(12, dtype=np.uint16).reshape(3, 4)[:, ::2]
    img = Image.fromarray(np.arange(12, dtype=np.uint8).reshape(2, 2, 3), "RGB")
    samples = [(np.arange(4, dtype=np.float32), 7), None,
               {"img": strided, "raw": b"\x00ab", "y": np.float64(2.5),
                "bf": torch.tensor([12.5, -1.0], dtype=torch.bfloat16), "pil": img},
               np.zeros((0, 3), dtype=np.int8)]
    rows = [None if x is None else row_model.encode(x) for x in samples]
    buf = pack_rows([5, 6, 7, 8], rows)
    ids, back = unpack_rows(buf[:])
    assert ids == [5, 6, 7, 8] and back[1] is None
    for sent, got in zip(rows, back):
        if sent is None:
            continue
        # The same columns: names (a PIL mode in its name), dtype names, bytes.
        assert [(n, d, a.shape) for n, d, a in got] == \
            [(n, d, a.shape) for n, d, a in sent]
        for (_, _, a), (_, _, b) in zip(got, sent):
            assert a.tobytes() == np.ascontiguousarray(b).tobytes()
            assert a.ctypes.data % 8 == 0    # aligned in the buffer
    # Decoded, a row that travelled is what a hit of it is.
    x, y = row_model.decode(back[0], torch=True)
    assert x.dtype == torch.float32 and x.tolist() == [0, 1, 2, 3] and int(y) == 7
    d = row_model.decode(back[2], torch=True)
    assert d["bf"].dtype == torch.bfloat16 and d["bf"].tolist() == [12.5, -1.0]
    assert d["raw"] == b"\x00ab" and d["img"].dtype == torch.int32
    assert d["pil"].mode == "RGB" and d["pil"].tobytes() == img.tobytes()
    assert row_model.decode(back[3], torch=True).shape == (0, 3)


def test_ownership_is_a_fixed_even_split_unrelated_to_the_sampler():
    import torch
    from shmcache.torch.partitioned.ownership import RowOwners
    a, b = RowOwners(1001, 3, seed=4), RowOwners(1001, 3, seed=4)
    assert (a.owners == b.owners).all()
    parts = [a.owned(k) for k in range(3)]
    assert sorted(sum(parts, [])) == list(range(1001))
    assert sorted(map(len, parts)) == [333, 334, 334]
    assert (RowOwners(1001, 3, seed=5).owners != a.owners).any()
    # DistributedSampler(seed=s)'s first epoch deals randperm(n, seed s) to
    # the ranks: the split must not follow it (each rank needs rows of
    # every node, or its node's cache is the only one it reads).
    g = torch.Generator()
    g.manual_seed(0)
    perm = torch.randperm(100, generator=g).tolist()
    own = RowOwners(100, 2, seed=0)
    for rank in range(4):
        assert len({own.owner(i) for i in perm[rank::4]}) == 2


# ---- one rank: how a pass ends ---------------------------------------------

_ONE_RANK = r'''
import datetime, os, sys, threading
import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
import shmcache
from shmcache.torch import CachedDataset, CachedLoader, PartitionedLoader

class Rows(Dataset):
    fail = None
    root = "one-rank"
    def __len__(self):
        return 40
    def __getitem__(self, i):
        if i == self.fail:
            raise RuntimeError(f"row {i} failed")
        return np.full(4, i, dtype=np.float32), i

def exchange_threads():
    return [t for t in threading.enumerate() if t.name == "shmcache-exchange"]

dist.init_process_group("gloo", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
src = Rows()
cds = CachedDataset(src, shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"])),
                    async_puts=False)
sampler = DistributedSampler(cds, shuffle=False)
make = {"dataloader": DataLoader, "cachedloader": CachedLoader}[sys.argv[1]]
loader = PartitionedLoader(make(cds, batch_size=4, sampler=sampler), window=2,
                           local_world_size=1)
order = list(range(40))

# A row that fails: raised to the caller, after the batches before its
# own (CachedLoader) or before its window's (DataLoader: the exchange
# thread computes a window's misses at once); the pass's thread is gone
# once the loop has left.
src.fail = 13
seen = []
try:
    for x, i in loader:
        seen += i.tolist()
    sys.exit("no exception")
except RuntimeError as e:
    assert "row 13 failed" in str(e), e
assert seen == order[:12 if sys.argv[1] == "cachedloader" else 8], seen
assert not exchange_threads()
src.fail = None

# iter() without next(), then a whole epoch: every batch, in order.
it = iter(loader)
assert [j for _, i in loader for j in i.tolist()] == order
assert not exchange_threads()

# An early break: the thread ends with the loop.
for x, i in loader:
    break
assert not exchange_threads()
c = loader.counters
assert c["misses"] >= 40 and c["local_hits"] > 0 and c["remote_hits"] == 0, c
loader.close()
assert not exchange_threads()
dist.destroy_process_group()
print("ok")
'''


def test_a_pass_that_raises_or_breaks_leaves_no_exchange_thread(session, tmp_path, kind):
    _one_rank(_ONE_RANK, kind, SESSION_ID=str(session))


_UNCACHEABLE = r'''
import datetime, os, sys, warnings
import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
import shmcache
from shmcache.torch import CachedDataset, CachedLoader, PartitionedLoader

class Named(Dataset):
    root = "one-rank-named"
    def __len__(self):
        return 24
    def __getitem__(self, i):   # a str has no column type: never cached
        return {"x": np.full(4, i, dtype=np.float32), "path": f"img{i}.jpg"}

dist.init_process_group("gloo", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
cds = CachedDataset(Named(), shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"])),
                    async_puts=False)
make = {"dataloader": DataLoader, "cachedloader": CachedLoader}[sys.argv[1]]
loader = PartitionedLoader(make(cds, batch_size=4, sampler=DistributedSampler(cds, shuffle=False),
                                num_workers=int(sys.argv[2])),
                           window=2, local_world_size=1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for epoch in range(2):
        paths, xs = [], []
        for b in loader:
            paths += b["path"]
            xs += b["x"][:, 0].tolist()
        assert paths == [f"img{i}.jpg" for i in range(24)], paths
        assert xs == list(range(24)), xs
said = [w for w in caught if issubclass(w.category, shmcache.CacheWarning)]
assert len(said) == 1 and "cannot be cached" in str(said[0].message), \
    [str(w.message) for w in caught]
loader.close()
dist.destroy_process_group()
print("ok")
'''


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_the_cache_cannot_hold_are_delivered_with_one_warning(
        session, kind, workers):
    _one_rank(_UNCACHEABLE, kind, workers, SESSION_ID=str(session))


def _rows_rank(root, n):
    """The start of a rank's script: imports, Rows (n rows, row i a float32
    [4] of i and the label i) and the process group from env://."""
    return f"""
import datetime, os, signal, sys, warnings
import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
import shmcache
from shmcache.torch import CachedDataset, CachedLoader, PartitionedLoader

class Rows(Dataset):
    root = {root!r}
    def __len__(self):
        return {n}
    def __getitem__(self, i):
        return np.full(4, i, dtype=np.float32), i

dist.init_process_group("gloo", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
"""


def _one_rank(script, *args, **env):
    """Runs `script` as the only rank of a job, with `env` added; its
    stdout must end with "ok"."""
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_tcp_port()), OMP_NUM_THREADS="1", **env)
    out = subprocess.run(["/usr/bin/python3", "-c", script, *map(str, args)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), \
        out.stdout + out.stderr


_SWITCHED = _rows_rank("one-rank-switched", 24) + r"""
first = shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"]))
cds = CachedDataset(Rows(), first, async_puts=False)
make = {"dataloader": DataLoader, "cachedloader": CachedLoader}[sys.argv[1]]
loader = PartitionedLoader(make(cds, batch_size=4, sampler=DistributedSampler(cds, shuffle=False),
                                num_workers=int(sys.argv[2])),
                           window=2, local_world_size=1)
first = cds.cache

def epoch():
    before = loader.counters
    got = [j for _, i in loader for j in i.tolist()]
    assert got == list(range(24)), got
    return {k: v - before[k] for k, v in loader.counters.items()}

def held(cache):
    return [i for i in range(24) if cache.contains(i)]

c = epoch()
assert c["misses"] == 24 and held(first) == list(range(24)), (c, held(first))
# Another cache, empty: every row computed and stored there, none read
# from the first.
cds.cache = shmcache.DatasetCache(session_id=int(os.environ["OTHER_SESSION"]))
c = epoch()
assert (c["local_hits"], c["misses"]) == (0, 24), c
assert held(cds.cache) == list(range(24)), held(cds.cache)
c = epoch()
assert (c["local_hits"], c["misses"]) == (24, 0), c
# Caching off: every row from the source, quietly, none read from a cache.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cds.cache = None
    c = epoch()
assert (c["local_hits"], c["misses"]) == (0, 24), c
said = [str(w.message) for w in caught if issubclass(w.category, shmcache.CacheWarning)]
assert said == [], said
loader.close()
dist.destroy_process_group()
print("ok")
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_follows_its_datasets_cache_when_it_is_switched_or_off(
        server, session, kind, workers):
    """ds.cache = other (or None) between epochs: the next epoch reads and
    stores the dataset's cache of now. The loader kept the cache it was
    made with: after the switch it read every row from the old cache and
    stored nothing in the new; after None it still read the old cache."""
    _one_rank(_SWITCHED, kind, workers, SESSION_ID=str(session),
              OTHER_SESSION=str(server.new_session()))


def _held_loader(dataset):
    """The lines of a rank's script that make `cds`, a CachedDataset over
    `dataset` (a class of the script; named: no identity read, which would
    meet the held row), and `loader`, its PartitionedLoader (batches of 2,
    windows of 2, one rank a node) over the loader kind of argv[1]."""
    return f"""
cds = CachedDataset({dataset}(), shmcache.DatasetCache(
    session_id=int(os.environ["SESSION_ID"])), name="rows", async_puts=False)
make = {{"dataloader": DataLoader, "cachedloader": CachedLoader}}[sys.argv[1]]
loader = PartitionedLoader(make(cds, batch_size=2, sampler=DistributedSampler(cds, shuffle=False)),
                           window=2, local_world_size=1)
"""


_SWITCHED_MID_WINDOW = _rows_rank("one-rank-switched-mid-window", 16) + r"""
import threading
reached, go = threading.Event(), threading.Event()

class HeldAtRow4(Rows):
    # Row 4 (the second window's first) waits until the trainer switched.
    def __getitem__(self, i):
        if i == 4:
            reached.set()
            assert go.wait(60), "the trainer never switched"
        return super().__getitem__(i)

""" + _held_loader("HeldAtRow4") + r"""
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = []
    for k, (_, i) in enumerate(loader):
        got += i.tolist()
        if k == 0:
            assert reached.wait(60), "the second window never started"
            old = cds.cache
            cds.cache = shmcache.DatasetCache(session_id=int(os.environ["OTHER_SESSION"]))
            old.close()     # as CachedDataset allows: at once
            go.set()
assert got == list(range(16)), got
said = [str(w.message) for w in caught if issubclass(w.category, shmcache.CacheWarning)]
assert said == [], said
held = [i for i in range(16) if cds.cache.contains(i)]
assert held == list(range(4, 16)), held
loader.close()
dist.destroy_process_group()
print("ok")
"""


def test_a_window_under_way_when_the_cache_is_switched_stores_in_the_new_one(
        server, session, kind):
    """ds.cache = other while a window is being computed, and the old cache
    closed at once (CachedDataset allows it): the window's rows go to the
    new cache, quietly. They went to the old cache the window began with:
    closed, it warned that it was used after its close, and stored nothing."""
    _one_rank(_SWITCHED_MID_WINDOW, kind, SESSION_ID=str(session),
              OTHER_SESSION=str(server.new_session()))


_SWITCHED_MID_ROUND = _rows_rank("switched-mid-round", 32) + r"""
import time
flag = os.environ["FLAG"]
rank = dist.get_rank()

class HeldAtRow1(Rows):
    # Rank 1's first row waits for the file: its first window's rows, some
    # of node 0's among them, reach rank 0 with the second round, which
    # rank 0 has begun meanwhile.
    def __getitem__(self, i):
        if i == 1:
            deadline = time.monotonic() + 60
            while not os.path.exists(flag):
                assert time.monotonic() < deadline, "rank 0 never switched"
                time.sleep(0.01)
        return super().__getitem__(i)

""" + _held_loader("HeldAtRow1") + r"""
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for k, _ in enumerate(loader):
        if k == 0 and rank == 0:
            deadline = time.monotonic() + 60
            while loader.exchange.rounds < 2:   # the second round began
                assert time.monotonic() < deadline, "the second round never began"
                time.sleep(0.01)
            old = cds.cache
            cds.cache = shmcache.DatasetCache(session_id=int(os.environ["OTHER_SESSION"]))
            old.close()     # as CachedDataset allows: at once
            open(flag, "w").close()
said = [str(w.message) for w in caught if issubclass(w.category, shmcache.CacheWarning)]
assert said == [], said
if rank == 0:
    put = loader.exchange.rows_put_for_others
    assert put > 0, "rank 1 sent no row of node 0's"
    held = sum(cds.cache.contains(i) for i in range(1, 32, 2))
    assert held == put, (held, put)
loader.close()
dist.destroy_process_group()
print("ok")
"""


def test_rows_a_round_under_way_brings_are_stored_in_the_new_cache(
        server, session, tmp_path, kind):
    """Rank 0 sets ds.cache = other while its round waits for rank 1, and
    closes the old cache at once: the rows rank 1 computed for node 0 go to
    the new cache, quietly. They went to the old cache the round began
    with: closed, it warned that it was used after its close and stored
    nothing."""
    script = tmp_path / "rank.py"
    script.write_text(_SWITCHED_MID_ROUND)
    port = str(free_tcp_port())
    ranks = [subprocess.Popen(["/usr/bin/python3", str(script), kind],
                              env=dict(server.env, SESSION_ID=str(server.new_session()),
                                       OTHER_SESSION=str(server.new_session()),
                                       FLAG=str(tmp_path / "switched"), RANK=str(r),
                                       WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port, OMP_NUM_THREADS="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (out, err) in zip(ranks, outs):
        assert p.returncode == 0 and out.strip() == "ok", out + err


# ---- two ranks: a rank gone while another closes its epoch -----------------

_LEFT_EARLY = _rows_rank("left-early", 40) + r'''
cds = CachedDataset(Rows(), shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"])),
                    async_puts=False)
make = {"dataloader": DataLoader, "cachedloader": CachedLoader}[sys.argv[1]]
loader = PartitionedLoader(make(cds, batch_size=4, sampler=DistributedSampler(cds, shuffle=False)),
                           window=1, local_world_size=1)
for x, i in loader:  # loop
    if dist.get_rank() == 1:   # gone before its epoch's end, as SIGKILLed ranks go
        os.kill(os.getpid(), signal.SIGKILL)
    # rank 0: leaves; its exchange thread goes on to the closing rounds
    break  # left
loader.close()
print("ok", flush=True)
# Not a normal exit: torch 1.13's gloo thread may free the failed round's
# numpy-backed tensor while the interpreter finalizes, and abort (rc -6).
os._exit(0)
'''


def test_a_round_that_fails_after_the_loop_left_is_said_once(session, tmp_path, kind):
    """Rank 0 leaves its epoch after a batch, so that nobody takes what its
    exchange thread meets next; rank 1 is killed before the end of the
    epoch. The round that fails (a window's or a closing one, as the kill
    falls) is said once, as a CacheWarning at rank 0's loop or the line
    that left it, under Python's default filters. (A window's round that
    failed once the loop had left was said nowhere.)"""
    script = tmp_path / "rank.py"
    script.write_text(_LEFT_EARLY)
    lines = {k + 1 for k, line in enumerate(_LEFT_EARLY.splitlines())
             if line.endswith(("# loop", "# left"))}
    port = str(free_tcp_port())
    ranks = [subprocess.Popen(["/usr/bin/python3", str(script), kind],
                              env=dict(os.environ, SESSION_ID=str(session), RANK=str(r),
                                       WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port, OMP_NUM_THREADS="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        out, err = ranks[0].communicate(timeout=120)
        ranks[1].wait(timeout=60)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert ranks[1].returncode == -signal.SIGKILL
    assert ranks[0].returncode == 0 and out.strip() == "ok", out + err
    said = re.findall(r"^(.*):(\d+): CacheWarning: (.*)$", err, re.M)
    assert len(said) == 1, err
    ((where, line, message),) = said
    assert where == str(script) and int(line) in lines, err
    assert "exchange round of PartitionedLoader failed after the loop" in message, message
