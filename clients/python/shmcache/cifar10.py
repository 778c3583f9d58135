"""The CIFAR-10 binary dataset of the cache.sh workflow: the training script
(scripts/my_training_script.py) and `python3 -m shmcache.prefill` read it
with these classes, so both compute the same cache fingerprint.

Binary format: data_batch_*.bin files of records of 1 label byte and 3072
image bytes (CHW, 32x32x3).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Cifar10Bin", "Normalize", "RECORD", "is_cifar10_dir"]

RECORD = 1 + 3 * 32 * 32
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32).reshape(3, 1, 1)


def _batch_files(root):
    return sorted(glob.glob(os.path.join(root, "data_batch_*.bin")))


def is_cifar10_dir(path: str) -> bool:
    """True when `path` is a directory holding data_batch_*.bin files."""
    return os.path.isdir(path) and bool(_batch_files(path))


class Cifar10Bin:
    """Map-style dataset over CIFAR-10 binary batches. Sample i is
    (float32 3xSxS normalized image, int64 label)."""

    def __init__(self, root: str, transform: Callable[[npt.NDArray[np.uint8]], Any]) -> None:
        self.root = os.path.abspath(root)
        self.files = _batch_files(self.root)
        if not self.files:
            raise SystemExit(f"no data_batch_*.bin under {self.root}")
        self.transform = transform
        self._maps: list[np.memmap[Any, np.dtype[np.uint8]]] | None = None
        self._sizes = [os.path.getsize(f) // RECORD for f in self.files]
        self._starts = np.cumsum([0] + self._sizes)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getstate__(self):
        d = self.__dict__.copy()
        d["_maps"] = None
        return d

    def __getitem__(self, i: int) -> tuple[Any, np.int64]:
        if self._maps is None:
            self._maps = [np.memmap(f, dtype=np.uint8, mode="r") for f in self.files]
        f = int(np.searchsorted(self._starts, i, side="right")) - 1
        rec = self._maps[f][(i - self._starts[f]) * RECORD:][:RECORD]
        label = np.int64(rec[0])
        image = np.asarray(rec[1:]).reshape(3, 32, 32)
        return self.transform(image), label


class Normalize:
    """Deterministic: scale to [0,1], normalize per channel, upscale by an
    integer factor (nearest). Its repr is part of the cache fingerprint."""

    def __init__(self, upscale: int = 2) -> None:
        self.upscale = upscale

    def __call__(self, image: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        x = (image.astype(np.float32) / 255.0 - MEAN) / STD
        if self.upscale > 1:
            x = x.repeat(self.upscale, axis=1).repeat(self.upscale, axis=2)
        return np.ascontiguousarray(x)

    def __repr__(self) -> str:
        return f"Normalize(cifar10_mean_std, upscale={self.upscale})"
