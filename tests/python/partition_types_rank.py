"""One rank of test_partitioned.py's column-type job: every column type of
the row model through PartitionedLoader, two nodes x two ranks.

Launched as partition_rank.py is (env:// variables, the node's shmcache
instance and SESSION_ID). Over two datasets, a fixed-shape one (bfloat16,
float16, bool, uint16/32/64 widened, int8, complex, 0-d: CachedLoader reads
it into batch buffers) and one of many layouts (PIL images in every mode the
row model keeps, bytes, and samples it cannot hold: strings, nested tuples
and dicts), it iterates EPOCHS epochs of PartitionedLoader over KIND
("dataloader": DataLoader(CachedDataset), or "cachedloader") with a
collate_fn that keeps the samples, and writes to OUT_DIR/rank<RANK>.json,
per dataset and epoch: each batch's samples as digests, the digests of what
a cache hit of each sample is (the row model's decoding of the sample the
dataset makes; the sample itself where it has no encoding), in
DistributedSampler's order, and the node's cache's misses counter.

    partition_types_rank.py OUT_DIR NUM_SAMPLES EPOCHS BATCH KIND WINDOW
"""

import hashlib
import json
import os
import sys
import warnings

import numpy as np
import torch
from PIL import Image
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

import shmcache
from shmcache import rows
from shmcache.torch import CachedDataset, CachedLoader, PartitionedLoader

from rank_job import IndexDataset, cache_warnings, join, leave

# The PIL modes the row model stores (row_model.cc RoundTrips).
MODES = ["1", "L", "LA", "I", "I;16", "F", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr",
         "LAB", "HSV"]


def _image(mode, seed):
    size = (5, 3)
    n = len(Image.new(mode, size).tobytes())
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    return Image.frombytes(mode, size, data)


class Fixed(IndexDataset):
    """Fixed-shape rows of every array dtype torch reads differently."""

    def __init__(self, n):
        super().__init__(n, "partition-types-fixed")

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return {"bf": torch.tensor([12.5 + i, -0.25 * i, 3.0], dtype=torch.bfloat16),
                "h": rng.standard_normal(2).astype(np.float16),
                "b": rng.integers(0, 2, 4).astype(bool),
                "u16": np.array([65535 - i, i], dtype=np.uint16),
                "u32": np.array([2**32 - 1 - i, i], dtype=np.uint32),
                "u64": np.array([2**63 - 1 - i, i], dtype=np.uint64),
                "i8": np.int8(-i % 128),
                "c": np.array([1j * i], dtype=np.complex64),
                "f": float(i) / 3, "y": i}


class Mixed(IndexDataset):
    """A layout per index: PIL images of each mode, bytes and bfloat16 in a
    tuple, and samples with no column encoding (delivered as made)."""

    def __init__(self, n):
        super().__init__(n, "partition-types-mixed")

    def __getitem__(self, i):
        k = i % 4
        if k == 0:
            return _image(MODES[(i // 4) % len(MODES)], i), i
        if k == 1:
            return {"raw": bytes([i % 256, 0, 255]) * (1 + i % 3),
                    "gray": _image("L", i), "bf": torch.full((2,), i / 4,
                                                              dtype=torch.bfloat16)}
        if k == 2:   # nested: no column encoding
            return (np.full(2, i, dtype=np.int16), (i, {"a": np.arange(i % 5)}))
        return {"s": f"sample-{i}", "x": np.full(3, i, dtype=np.float32)}   # a str


def canon(x):
    """A JSON-able, exact description of a sample: types, dtypes, shapes,
    bytes, PIL modes."""
    if isinstance(x, torch.Tensor):
        t = x.contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        return ["tensor", str(t.dtype), list(t.shape), raw.hex()]
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        a = np.asarray(x)
        return ["ndarray", a.dtype.str, list(a.shape), a.tobytes().hex()]
    if isinstance(x, Image.Image):
        return ["PIL", x.mode, list(x.size), x.tobytes().hex()]
    if isinstance(x, bytes):
        return ["bytes", x.hex()]
    if isinstance(x, dict):
        return ["dict", [[k, canon(v)] for k, v in x.items()]]
    if isinstance(x, (tuple, list)):
        return [type(x).__name__, [canon(v) for v in x]]
    return [type(x).__name__, repr(x)]


def digest(x):
    return hashlib.sha1(json.dumps(canon(x)).encode()).hexdigest()[:20]


def as_hit(sample):
    """What CachedDataset delivers for `sample`, hit or miss."""
    try:
        cols = rows.encode(sample)
    except (TypeError, ValueError):
        return sample
    return rows.decode(cols, torch=True)


def keep(batch):
    return batch


def run(ds, name, kind, epochs, batch, window):
    cache = shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"]))
    cds = CachedDataset(ds, cache, name=name, async_puts=False)
    sampler = DistributedSampler(cds, shuffle=True, seed=1)
    make = {"dataloader": DataLoader, "cachedloader": CachedLoader}[kind]
    loader = PartitionedLoader(make(cds, batch_size=batch, sampler=sampler,
                                    collate_fn=keep), window=window)
    ref_sampler = DistributedSampler(ds, shuffle=True, seed=1)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        ref_sampler.set_epoch(epoch)
        got = [[digest(s) for s in b] for b in loader]
        want = [[digest(as_hit(ds[i])) for i in b]
                for b in BatchSampler(ref_sampler, batch, False)]
        st = cds.stats()
        out.append({"got": got, "want": want, "counters": loader.counters,
                    "cache_misses": None if st is None else st["misses"]})
    loader.close()
    return out


def main():
    out_dir, n, epochs, batch = sys.argv[1], *map(int, sys.argv[2:5])
    kind, window = sys.argv[5], int(sys.argv[6])
    join(60)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = {"fixed": run(Fixed(n), "fixed", kind, epochs, batch, window),
                   "mixed": run(Mixed(n), "mixed", kind, epochs, batch, window)}
    results["warnings"] = cache_warnings(caught)
    leave(out_dir, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
