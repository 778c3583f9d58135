#!/usr/bin/python3
"""One device of a multi-device training job that shares a shmcache session.

    my_training_script.py --num_devices N --device K --session_id S \
        --dataset_path P [--epochs E] [--batch_size B] [--num_workers W]
    my_training_script.py --generate NUM_SAMPLES --dataset_path P

Reads the CIFAR-10 binary format (data_batch_*.bin: records of 1 label byte
and 3072 image bytes, CHW), applies a deterministic transform (decode,
normalize, upscale), iterates this device's shard (DistributedSampler's
partition) through the cache, and prints "Got <n> samples on device <k>".
Launched by scripts/cache.sh. --generate writes a random CIFAR-10-format
dataset instead.
"""

import argparse
import glob
import os
import sys
import time

import numpy as np

RECORD = 1 + 3 * 32 * 32
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32).reshape(3, 1, 1)


class Cifar10Bin:
    """Map-style dataset over CIFAR-10 binary batches. Sample i is
    (float32 3xSxS normalized image, int64 label)."""

    def __init__(self, root, transform):
        self.root = os.path.abspath(root)
        self.files = sorted(glob.glob(os.path.join(self.root, "data_batch_*.bin")))
        if not self.files:
            raise SystemExit(f"no data_batch_*.bin under {self.root}")
        self.transform = transform
        self._maps = None
        self._sizes = [os.path.getsize(f) // RECORD for f in self.files]
        self._starts = np.cumsum([0] + self._sizes)

    def __len__(self):
        return int(self._starts[-1])

    def __getstate__(self):
        d = self.__dict__.copy()
        d["_maps"] = None
        return d

    def __getitem__(self, i):
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

    def __init__(self, upscale=2):
        self.upscale = upscale

    def __call__(self, image):
        x = (image.astype(np.float32) / 255.0 - MEAN) / STD
        if self.upscale > 1:
            x = x.repeat(self.upscale, axis=1).repeat(self.upscale, axis=2)
        return np.ascontiguousarray(x)

    def __repr__(self):
        return f"Normalize(cifar10_mean_std, upscale={self.upscale})"


def generate(path, n, batches=5, seed=0):
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = -(-n // batches)
    for b in range(batches):
        m = min(per, n - b * per)
        if m <= 0:
            break
        recs = rng.integers(0, 256, (m, RECORD), dtype=np.uint8)
        recs[:, 0] = rng.integers(0, 10, m)
        recs.tofile(os.path.join(path, f"data_batch_{b + 1}.bin"))
    print(f"Generated {n} CIFAR-10 samples in {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num_devices", type=int, default=1)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--session_id", type=int)
    p.add_argument("--dataset_path", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--generate", type=int, metavar="NUM_SAMPLES")
    a = p.parse_args()
    if a.generate is not None:
        generate(a.dataset_path, a.generate)
        return 0
    if a.session_id is None:
        p.error("--session_id is required")
    if not 0 <= a.device < a.num_devices:
        p.error("need 0 <= --device < --num_devices")

    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    import shmcache
    from shmcache.torch import CachedDataset

    torch.set_num_threads(1)
    cache = shmcache.DatasetCache(session_id=a.session_id, port=a.port)
    ds = CachedDataset(Cifar10Bin(a.dataset_path, Normalize()), cache)
    sampler = DistributedSampler(ds, num_replicas=a.num_devices, rank=a.device,
                                 shuffle=False)
    loader = DataLoader(ds, batch_size=a.batch_size, sampler=sampler,
                        num_workers=a.num_workers)
    total = 0
    for e in range(a.epochs):
        sampler.set_epoch(e)
        t0 = time.perf_counter()
        n = 0
        for images, labels in loader:
            n += len(labels)
        total += n
        say(f"device {a.device} epoch {e + 1}: {n} samples in "
            f"{time.perf_counter() - t0:.3f} s")
    say(f"Got {total} samples on device {a.device}")
    return 0


def say(line):
    # One write per line: the devices share a terminal and must not
    # interleave inside a line.
    os.write(sys.stdout.fileno(), (line + "\n").encode())


if __name__ == "__main__":
    sys.exit(main())
