"""NodeAffineSampler without processes: partitions, shuffles, equal lengths,
rotation, and the ranks it reads from the environment."""

import pytest

from shmcache.torch import NodeAffineSampler, node_partition


def epoch_reads(n, nodes, local, epoch, **kw):
    """{(node, local rank): indices read in `epoch`}."""
    out = {}
    for node in range(nodes):
        for k in range(local):
            s = NodeAffineSampler(range(n), num_nodes=nodes, node_rank=node,
                                  local_world_size=local, local_rank=k, **kw)
            s.set_epoch(epoch)
            out[node, k] = list(s)
            assert len(out[node, k]) == len(s)
    return out


@pytest.mark.parametrize("n, nodes, local", [(401, 2, 2), (100, 3, 2), (7, 2, 3)])
def test_partitions_cover_the_dataset_once_and_stay_put(n, nodes, local):
    parts = [set(node_partition(n, nodes, p, seed=3)) for p in range(nodes)]
    assert sum(len(p) for p in parts) == n == len(set().union(*parts))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for epoch in range(3):
        reads = epoch_reads(n, nodes, local, epoch, seed=3)
        lengths = {len(r) for r in reads.values()}
        assert len(lengths) == 1                       # DDP: equal steps everywhere
        for node in range(nodes):
            node_reads = [i for k in range(local) for i in reads[node, k]]
            assert set(node_reads) == parts[node]      # all of it, nothing else


def test_each_epoch_is_shuffled_within_the_node():
    orders = [epoch_reads(400, 2, 2, e)[0, 0] for e in range(3)]
    assert orders[0] != orders[1] != orders[2]
    assert set(orders[0]) | set(epoch_reads(400, 2, 2, 0)[0, 1]) == \
        set(orders[1]) | set(epoch_reads(400, 2, 2, 1)[0, 1])


def test_drop_last_drops_the_tail_and_keeps_lengths_equal():
    reads = epoch_reads(401, 2, 2, 0, drop_last=True)
    assert {len(r) for r in reads.values()} == {100}
    assert len({i for r in reads.values() for i in r}) == 400


def test_unshuffled_partitions_are_contiguous_blocks():
    reads = epoch_reads(8, 2, 2, 0, shuffle=False)
    assert reads[0, 0] == [0, 2] and reads[0, 1] == [1, 3]
    assert reads[1, 0] == [4, 6] and reads[1, 1] == [5, 7]


def test_rotation_moves_every_node_to_the_next_partition_every_k_epochs():
    n, nodes = 300, 3
    parts = [set(node_partition(n, nodes, p)) for p in range(nodes)]
    for epoch in range(7):
        reads = epoch_reads(n, nodes, 1, epoch, rotate_every=2)
        for node in range(nodes):
            assert set(reads[node, 0]) == parts[(node + epoch // 2) % nodes]


def test_ranks_come_from_the_environment(monkeypatch):
    for k, v in dict(RANK=3, WORLD_SIZE=4, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2).items():
        monkeypatch.setenv(k, str(v))
    s = NodeAffineSampler(range(10))
    assert (s.num_nodes, s.node_rank, s.local_world_size, s.local_rank) == (2, 1, 2, 1)


@pytest.mark.parametrize("env, message", [
    (dict(RANK=0, WORLD_SIZE=4, LOCAL_RANK=0), "ranks per node"),
    (dict(RANK=0, WORLD_SIZE=3, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2), "not a multiple"),
    (dict(RANK=0, WORLD_SIZE=4, LOCAL_RANK=0, LOCAL_WORLD_SIZE="two"), "not an integer"),
])
def test_missing_or_bad_environment_is_a_clear_error(monkeypatch, env, message):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID",
              "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    with pytest.raises(ValueError, match=message):
        NodeAffineSampler(range(10))


@pytest.mark.parametrize("kw", [dict(node_rank=2), dict(local_rank=-1),
                                dict(rotate_every=-1), dict(num_nodes=0)])
def test_out_of_range_arguments_are_refused(kw):
    args = dict(num_nodes=2, node_rank=0, local_world_size=2, local_rank=0)
    with pytest.raises(ValueError):
        NodeAffineSampler(range(10), **{**args, **kw})


@pytest.mark.parametrize("kw, name", [
    (dict(num_nodes="2"), "num_nodes"), (dict(node_rank="0"), "node_rank"),
    (dict(local_world_size=2.0), "local_world_size"), (dict(local_rank=True), "local_rank"),
    (dict(rotate_every="1"), "rotate_every"), (dict(seed="x"), "seed"),
])
def test_wrong_types_are_type_errors_naming_the_argument(kw, name):
    args = dict(num_nodes=2, node_rank=0, local_world_size=2, local_rank=0)
    with pytest.raises(TypeError, match=name):
        NodeAffineSampler(range(10), **{**args, **kw})


@pytest.mark.parametrize("args, error, name", [
    ((10, 2, 2), ValueError, "part"), ((10, 2, -1), ValueError, "part"),
    ((10, 0, 0), ValueError, "num_nodes"), ((-1, 2, 0), ValueError, "n"),
    ((10.0, 2, 0), TypeError, "n"), ((10, "2", 0), TypeError, "num_nodes"),
    ((10, 2, 0.0), TypeError, "part"),
])
def test_node_partition_refuses_what_names_no_partition(args, error, name):
    # Partition 2 of 2 nodes, or of 0 nodes, is none: not some other rows.
    for shuffle in (True, False):
        with pytest.raises(error, match=rf"\b{name}\b"):
            node_partition(*args, shuffle=shuffle)


def test_node_partition_seed_is_an_int():
    with pytest.raises(TypeError, match="seed"):
        node_partition(10, 2, 0, seed="x")
