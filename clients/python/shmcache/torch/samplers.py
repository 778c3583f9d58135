"""Node-affine sampling for multi-node jobs with one shmcache server per node.

With DistributedSampler(shuffle=True) every node reads a fresh random half
(third, ...) of the dataset each epoch, so each node's cache slowly fills
with most of the dataset and keeps missing. NodeAffineSampler gives each node
a fixed partition of the dataset instead, shuffled within the node every
epoch and split among the node's local ranks: a node's cache holds
dataset/nodes rows, and every epoch after the first is all hits.

    from shmcache.torch import NodeAffineSampler
    sampler = NodeAffineSampler(ds)          # node and ranks from the env://
    for epoch in range(epochs):              # variables torchrun/srun set
        sampler.set_epoch(epoch)
        for batch in DataLoader(ds, batch_size=B, sampler=sampler): ...

rotate_every=K moves every node to the next partition every K epochs, for
more global mixing; each rotation costs one cold epoch (the node's cache
does not hold its new partition yet) and grows the cache by another
dataset/nodes rows until it holds the whole dataset.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler

__all__ = ["NodeAffineSampler", "node_partition"]


def _check_int(name: str, value: object, lo: int | None = None,
               hi: int | None = None) -> None:
    """TypeError unless `value` is an int (numpy's too, not a bool),
    ValueError unless lo <= value < hi; both name the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v}")
    if hi is not None and v >= hi:
        raise ValueError(f"{name} {v} is not in [{lo}, {hi})")


def node_partition(n: int, num_nodes: int, part: int, shuffle: bool = True,
                   seed: int = 0) -> list[int]:
    """Indices of partition `part` of range(n) split into num_nodes parts.

    shuffle: a random split fixed by `seed` (the same on every node), so
    that an ordered dataset (sorted by class, by source) is not cut into
    unlike parts; sizes differ by at most one. Otherwise contiguous blocks.
    TypeError for an argument that is not an int, ValueError for n < 0,
    num_nodes < 1 or a part outside [0, num_nodes).
    """
    _check_int("n", n, 0)
    _check_int("num_nodes", num_nodes, 1)
    _check_int("part", part, 0, num_nodes)
    _check_int("seed", seed)
    if not shuffle:
        return list(range(n * part // num_nodes, n * (part + 1) // num_nodes))
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g)[part::num_nodes].tolist()


def _env_int(names: list[str], what: str) -> int:
    for name in names:
        v = os.environ.get(name)
        if v is not None and v != "":
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"${name}={v!r} is not an integer") from None
    raise ValueError(f"{what} is not known: pass it, or set "
                     f"{' or '.join('$' + n for n in names)} (torchrun and "
                     "srun-style launchers set them)")


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return (_env_int(["RANK", "SLURM_PROCID"], "the global rank"),
            _env_int(["WORLD_SIZE", "SLURM_NTASKS"], "the world size"))


class NodeAffineSampler(Sampler[int]):
    """Each node reads a fixed partition of the dataset; see the module doc.

    num_nodes, node_rank, local_world_size, local_rank: default from the
      environment: LOCAL_WORLD_SIZE and LOCAL_RANK, and the global RANK and
      WORLD_SIZE (from torch.distributed when it is initialized), with
      node_rank = RANK // LOCAL_WORLD_SIZE: ranks numbered node by node, as
      torchrun and srun's block distribution number them. Pass node_rank
      when yours are not.
    shuffle: a random partition (fixed by seed) shuffled again every epoch
      (by seed + epoch, the same on all of a node's ranks); False: contiguous
      blocks in order.
    drop_last: every rank of every node yields the same number of samples
      (DDP needs equal steps); True drops the tail of the larger partitions,
      False (default) pads a node's ranks with rows of its own partition.
    rotate_every: 0 (default) keeps the partition; K > 0 moves each node to
      the next partition every K epochs (one cold epoch per rotation).
    """

    def __init__(self, dataset: Sized, num_nodes: int | None = None,
                 node_rank: int | None = None, local_world_size: int | None = None,
                 local_rank: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, rotate_every: int = 0) -> None:
        if local_world_size is None:
            local_world_size = _env_int(["LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"],
                                        "the number of ranks per node")
        if local_rank is None:
            local_rank = _env_int(["LOCAL_RANK", "SLURM_LOCALID"], "the local rank")
        if num_nodes is None or node_rank is None:
            rank, world = _rank_and_world()
            if local_world_size < 1 or world % local_world_size != 0:
                raise ValueError(f"world size {world} is not a multiple of "
                                 f"{local_world_size} ranks per node")
            if num_nodes is None:
                num_nodes = world // local_world_size
            if node_rank is None:
                node_rank = rank // local_world_size
        _check_int("num_nodes", num_nodes, 1)
        _check_int("local_world_size", local_world_size, 1)
        _check_int("rotate_every", rotate_every, 0)
        _check_int("node_rank", node_rank, 0, num_nodes)
        _check_int("local_rank", local_rank, 0, local_world_size)
        _check_int("seed", seed)
        self.n = len(dataset)
        if self.n < num_nodes:
            raise ValueError(f"{self.n} samples cannot be split among "
                             f"{num_nodes} nodes")
        self.num_nodes, self.node_rank = num_nodes, node_rank
        self.local_world_size, self.local_rank = local_world_size, local_rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rotate_every = rotate_every
        self.epoch = 0
        if drop_last:
            self.num_samples = (self.n // num_nodes) // local_world_size
        else:
            largest = -(-self.n // num_nodes)
            self.num_samples = -(-largest // local_world_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def partition(self, epoch: int | None = None) -> list[int]:
        """The partition this node reads in `epoch` (default: the current)."""
        epoch = self.epoch if epoch is None else epoch
        shift = epoch // self.rotate_every if self.rotate_every else 0
        part = (self.node_rank + shift) % self.num_nodes
        return node_partition(self.n, self.num_nodes, part, self.shuffle, self.seed)

    def __iter__(self) -> Iterator[int]:
        idx = self.partition()
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            idx = [idx[i] for i in torch.randperm(len(idx), generator=g).tolist()]
        total = self.num_samples * self.local_world_size
        while len(idx) < total:            # pad with the node's own rows
            idx += idx[:total - len(idx)]
        return iter(idx[self.local_rank:total:self.local_world_size])

    def __len__(self) -> int:
        return self.num_samples
