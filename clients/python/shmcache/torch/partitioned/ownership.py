"""Which node's cache holds each row of a partitioned dataset.

Row i belongs to node RowOwners(n, num_nodes, seed).owner(i), a fixed
function of the index that every rank computes alone: a permutation of
range(n) drawn from `seed` (through a mixing function, so that it is
unrelated to the shuffles of samplers seeded with the same number), dealt
to the nodes in turn. Each node's server caches the rows its node owns, so
the nodes' caches add up.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["RowOwners"]


def _mix(seed: int) -> int:
    """A seed unrelated to `seed` (splitmix64's finalizer), >= 0."""
    z = (seed + 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) >> 1


class RowOwners:
    """Which node owns each row of range(n): a seeded permutation of the
    rows dealt to num_nodes nodes in turn (sizes differ by at most one).
    The same on every rank for the same (n, num_nodes, seed)."""

    def __init__(self, n: int, num_nodes: int, seed: int = 0) -> None:
        if num_nodes < 1 or n < num_nodes:
            raise ValueError(f"{n} rows cannot be split among {num_nodes} nodes")
        self.n, self.num_nodes, self.seed = n, num_nodes, seed
        g = torch.Generator()
        # Not `seed` itself: DistributedSampler(seed=s) shuffles epoch 0 with
        # randperm seeded s, and dealing the same permutation would hand
        # rank r exactly the rows of node r % N in that epoch.
        g.manual_seed(_mix(seed))
        perm = torch.randperm(n, generator=g).numpy()
        self.owners: npt.NDArray[np.int32] = np.empty(n, dtype=np.int32)
        self.owners[perm] = np.arange(n, dtype=np.int32) % num_nodes

    def owner(self, index: int) -> int:
        return int(self.owners[index])

    def owned(self, node: int) -> list[int]:
        """The rows `node` owns, ascending."""
        return np.flatnonzero(self.owners == node).tolist()
