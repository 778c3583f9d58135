"""Shards and patches.

Shards: `shard_indices(n, num_shards, shard_id)` gives the sample indices of
one device, the same partition as torch's DistributedSampler (padding by
wrapping around, or dropping the tail with drop_last).

Patches (distributed training on huge images): each image is cut into P
patches (SlicePatches-style) and cached once as a row with one column per
patch, "patch_0" .. "patch_{P-1}". Device k reads only column "patch_k":
the bytes of the other patches are never copied (with `copy=False` not even
that patch's bytes are copied).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from . import DatasetCache

__all__ = ["shard_indices", "slice_patches", "patch_column", "put_patches",
           "get_patch"]


def shard_indices(n: int, num_shards: int, shard_id: int, shuffle: bool = False,
                  seed: int = 0, epoch: int = 0, drop_last: bool = False) -> list[int]:
    """Indices of shard `shard_id` of `num_shards` over range(n), exactly as
    torch.utils.data.DistributedSampler(num_replicas=num_shards,
    rank=shard_id, shuffle=..., seed=..., drop_last=...) after
    set_epoch(epoch) yields them."""
    for name, v in (("n", n), ("num_shards", num_shards), ("shard_id", shard_id)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int")
    if n < 0 or num_shards < 1:
        raise ValueError("need n >= 0 and num_shards >= 1")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be in [0, {num_shards})")
    if drop_last and n % num_shards != 0:
        per = math.ceil((n - num_shards) / num_shards)
    else:
        per = math.ceil(n / num_shards)
    total = per * num_shards
    if shuffle:
        import torch
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    if not drop_last:
        pad = total - len(indices)
        if pad > 0 and indices:
            reps = math.ceil(pad / len(indices))
            indices += (indices * reps)[:pad]
    else:
        indices = indices[:total]
    return indices[shard_id:total:num_shards]


def slice_patches(image: Any, num_height: int = 1, num_width: int = 1,
                  fill_value: Any = 0) -> list[npt.NDArray[Any]]:
    """Cuts an HxW[xC] image into num_height*num_width patches, row-major,
    padding the bottom/right with fill_value so that every patch has the
    same shape (MindSpore SlicePatches with SliceMode.PAD)."""
    for name, n in (("num_height", num_height), ("num_width", num_width)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(n).__name__}")
        if n < 1:
            raise ValueError(f"{name} must be at least 1, got {n}")
    a = np.asarray(image)
    if a.ndim < 2:
        raise ValueError("an image has at least two dimensions")
    h, w = a.shape[:2]
    ph, pw = math.ceil(h / num_height), math.ceil(w / num_width)
    if ph * num_height != h or pw * num_width != w:
        padded = np.full((ph * num_height, pw * num_width) + a.shape[2:],
                         fill_value, dtype=a.dtype)
        padded[:h, :w] = a
        a = padded
    return [np.ascontiguousarray(a[i * ph:(i + 1) * ph, j * pw:(j + 1) * pw])
            for i in range(num_height) for j in range(num_width)]


def patch_column(k: int) -> str:
    return f"patch_{k}"


def put_patches(cache: DatasetCache, row_id: int, patches: list[Any],
                **extra: Any) -> bool:
    """Caches one image's patches as one row (plus optional extra columns,
    e.g. label=...). Returns what DatasetCache.put returns."""
    row = {patch_column(k): p for k, p in enumerate(patches)}
    row.update(extra)
    return cache.put(row_id, row)


def get_patch(cache: DatasetCache, row_id: int, k: int, copy: bool = True) -> Any:
    """Patch k of row `row_id` (only its bytes are read), or None on a miss."""
    return cache.get(row_id, columns=patch_column(k), copy=copy)
