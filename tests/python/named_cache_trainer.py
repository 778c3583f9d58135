"""A trainer process of the prefill tests: reads the CIFAR-10 directory
argv[1] through CachedDataset(..., name=argv[2]) (session
$SHMCACHE_SESSION_ID) under a DataLoader with two workers, compares every
batch with the same batch collated from the uncached dataset, byte for
byte, and prints one JSON line: {"samples", "identical"}. argv[3], when
given, is the upscale of the transform (another pipeline than prefill's).
A FingerprintMismatchError ends it with its message on stderr, exit 3."""

import json
import sys

import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

import shmcache
from shmcache.cifar10 import Cifar10Bin, Normalize
from shmcache.torch import CachedDataset


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8))


def main(path, name, upscale=2):
    source = Cifar10Bin(path, Normalize(upscale))
    try:
        ds = CachedDataset(Cifar10Bin(path, Normalize(upscale)), name=name)
    except shmcache.FingerprintMismatchError as e:
        print(e, file=sys.stderr)
        return 3
    loader = DataLoader(ds, batch_size=50, num_workers=2)
    n, identical, start = 0, True, 0
    for images, labels in loader:
        want_images, want_labels = default_collate(
            [source[i] for i in range(start, start + len(labels))])
        identical &= same_bytes(images, want_images) and same_bytes(labels, want_labels)
        start += len(labels)
        n += len(labels)
    print(json.dumps({"samples": n, "identical": bool(identical)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])))
