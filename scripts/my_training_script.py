#!/usr/bin/python3
"""One device of a multi-device training job that shares a shmcache session.

    my_training_script.py --num_devices N --device K --session_id S \
        --dataset_path P [--epochs E] [--batch_size B] [--num_workers W]
    my_training_script.py --generate NUM_SAMPLES --dataset_path P

Reads the CIFAR-10 binary format (data_batch_*.bin: records of 1 label byte
and 3072 image bytes, CHW) with shmcache.cifar10 (which
`python3 -m shmcache.prefill DATASET_PATH` also uses, so a prefilled cache
is hit), applies a deterministic transform (decode, normalize, upscale),
iterates this device's shard (DistributedSampler's partition) through the
cache, and prints "Got <n> samples on device <k>".
Launched by scripts/cache.sh. --generate writes a random CIFAR-10-format
dataset instead.
"""

import argparse
import os
import sys
import time

import numpy as np

from shmcache.cifar10 import RECORD, Cifar10Bin, Normalize


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
