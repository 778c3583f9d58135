"""Two nodes x two ranks on one host: one shmcache server per simulated node
(own port, own --shm_dir), ranks launched as srun launches them (env://
variables, gloo DDP), each rank using its node's server.

The job (ddp_rank.py) trains with NodeAffineSampler and with
DistributedSampler(shuffle=True), each through the cache and from the
source; the tests below check what each sampler does to the nodes' caches.
"""

import contextlib
import json
from pathlib import Path

import pytest

from conftest import free_tcp_port, node_server, run_ranks

HERE = Path(__file__).resolve().parent
NODES, LOCAL, EPOCHS, N = 2, 2, 4, 401   # 401: partitions of 201 and 200 rows


def _run_ranks(envs, out_dir, timeout=240):
    """Starts one process per env; fails (killing the others) when one fails."""
    run_ranks(["/usr/bin/python3", str(HERE / "ddp_rank.py"), str(out_dir), str(N),
               str(EPOCHS)], envs, timeout)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Runs the 2x2 job once; {rank: results of ddp_rank.py}."""
    tmp = tmp_path_factory.mktemp("multinode")
    master_port = free_tcp_port()
    servers, envs = [], []
    with contextlib.ExitStack() as undo:
        try:
            for node in range(NODES):
                s, session = node_server(undo, tmp, node, "node", servers)
                for local in range(LOCAL):
                    envs.append(dict(
                        s.env, SESSION_ID=str(session), OMP_NUM_THREADS="1",
                        RANK=str(node * LOCAL + local), WORLD_SIZE=str(NODES * LOCAL),
                        LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(LOCAL),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port)))
            _run_ranks(envs, tmp)
            results = {r: json.loads((tmp / f"rank{r}.json").read_text())
                       for r in range(NODES * LOCAL)}
            # What each server shows once the job is gone.
            listed = [{c["name"]: c for c in s.sessions()[0]["caches"]} for s in servers]
            yield results, listed
        finally:
            for s in servers:
                s.stop()


def _node_epochs(results, node, run):
    """Per epoch of `run`: (counters after it on the node's local rank 0,
    the row ids the node's ranks read in it, one entry per read)."""
    ranks = [node * LOCAL + k for k in range(LOCAL)]
    out = []
    for e in range(EPOCHS):
        reads = [i for r in ranks for i in results[r][run][e]["indices"]]
        out.append((results[ranks[0]][run][e]["stats"], reads))
    return out


def _per_epoch(epochs):
    """[(mem_rows, hits, misses)] of each epoch alone."""
    prev = {"hits": 0, "misses": 0}
    out = []
    for st, _ in epochs:
        out.append((st["mem_rows"], st["hits"] - prev["hits"],
                    st["misses"] - prev["misses"]))
        prev = st
    return out


def test_node_affine_each_node_caches_its_half_and_then_only_hits(job):
    results, listed = job
    held = 0
    for node in range(NODES):
        epochs = _node_epochs(results, node, "affine-cache")
        part = set(epochs[0][1])
        assert all(set(reads) == part for _, reads in epochs), "partition moved"
        per = _per_epoch(epochs)
        print(f"node-affine, node {node}: (mem rows, hits, misses) per epoch: {per}")
        assert abs(per[0][0] - N / NODES) <= 1
        assert all(mem == len(part) for mem, _, _ in per)
        assert listed[node]["features-affine"]["mem_cached"] == len(part)
        assert all(misses == 0 for _, _, misses in per[1:])
        assert all(hits == len(epochs[e][1]) for e, (_, hits, _) in enumerate(per) if e)
        held += len(part)
    assert held == N          # the partitions cover the dataset, once


@pytest.mark.parametrize("sampler", ["affine", "global"])
def test_ddp_loss_sums_are_the_same_with_and_without_the_cache(job, sampler):
    results, _ = job
    for rank, res in results.items():
        cached = [e["loss_sum"] for e in res[f"{sampler}-cache"]]
        source = [e["loss_sum"] for e in res[f"{sampler}-source"]]
        assert cached == source, f"rank {rank}"


def test_global_shuffle_fills_each_node_with_most_of_the_dataset(job):
    """DistributedSampler(shuffle=True): each node reads a new random half
    every epoch. Checked against the rows its ranks actually read."""
    results, listed = job
    for node in range(NODES):
        epochs = _node_epochs(results, node, "global-cache")
        seen = set()
        report = []
        for (mem, hits, misses), (_, reads) in zip(_per_epoch(epochs), epochs):
            new = [i for i in reads if i not in seen]
            seen.update(reads)
            assert mem == len(seen)                 # each row held once
            assert len(set(new)) <= misses <= len(new)   # ranks may race on a row
            assert hits + misses == len(reads)
            report.append(f"mem {mem} ({mem / N:.1%}), hit rate {hits / len(reads):.1%}")
        assert listed[node]["features-global"]["mem_cached"] == len(seen)
        print(f"global shuffle, node {node}, per epoch: " + "; ".join(report))
