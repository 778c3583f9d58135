"""Datasets the tests wrap; a module of its own so spawn workers import it."""

import numpy as np
from torch.utils.data import Dataset, IterableDataset


def sample(i, side=32):
    rng = np.random.default_rng(i)
    img = rng.integers(0, 256, (3, side, side), dtype=np.uint8)
    return img, i % 10


class Normalize:
    """A deterministic transform (its repr is part of the fingerprint)."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, img):
        return img.astype(np.float32) * self.scale

    def __repr__(self):
        return f"Normalize(scale={self.scale})"


class RandomFlip:
    def __call__(self, img):
        return img[..., ::-1] if np.random.rand() < 0.5 else img

    def __repr__(self):
        return "RandomFlip(p=0.5)"


class Images(Dataset):
    """Deterministic decoded images: sample i is (float32 CxHxW, label)."""

    def __init__(self, n, side=32, transform=None, root="synthetic"):
        self.n, self.side, self.transform, self.root = n, side, transform, root

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img, label = sample(i, self.side)
        if self.transform is not None:
            img = self.transform(img)
        return img, label


class Stream(IterableDataset):
    """A streaming source of n samples that counts how often it is read
    (per process)."""

    def __init__(self, n, path="stream"):
        self.n, self.path, self.reads = n, path, 0

    def __iter__(self):
        for i in range(self.n):
            self.reads += 1
            img, label = sample(i, 8)
            yield {"image": img, "label": label}


class GuardedStream(IterableDataset):
    """A streaming source of n samples, sample(i + offset, 8) as dicts
    (another offset: another dataset, of the same class and path), that
    raises once the file `guard` exists: a pass that should read only the
    cache by then proves it did."""

    def __init__(self, n, offset, guard, path="stream"):
        self.n, self.offset, self.guard, self.path = n, offset, guard, path

    def __iter__(self):
        import os
        if os.path.exists(self.guard):
            raise RuntimeError("the source was read after the cache was sealed")
        for i in range(self.n):
            img, _ = sample(i + self.offset, 8)
            yield {"image": img, "label": i + self.offset}


class MiBRows(Dataset):
    """n rows of 1 MiB (uint8, filled with i % 251) and label i: a cache
    capped below n MiB fills."""

    def __init__(self, n):
        self.n, self.root = n, "mib-rows"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(1 << 20, i % 251, dtype=np.uint8), i


class StrLabels(Dataset):
    """Samples with a str label (a file name, say): no column type."""

    def __init__(self, n):
        self.n, self.root = n, "str-labels"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.zeros(2, dtype=np.float32), f"file-{i}"


class CountedImages(Dataset):
    """Images(n) whose every computed sample is logged (one line, the id)
    to the file $PREFILL_COUNTER; ids >= $PREFILL_GATE_AT wait until the
    file $PREFILL_GATE exists. For prefill tests, which count decodes."""

    def __init__(self, n):
        self.n, self.root = n, "counted"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import os
        import time
        gate, at = os.environ.get("PREFILL_GATE"), int(os.environ.get("PREFILL_GATE_AT", -1))
        deadline = time.monotonic() + 60
        while gate and 0 <= at <= i and not os.path.exists(gate) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(os.environ["PREFILL_COUNTER"], "a") as f:
            f.write(f"{i}\n")
        return sample(i, 8)


def counted_images():
    """The MODULE:FACTORY of prefill tests (200 rows)."""
    return CountedImages(200)


def to_array(image):
    """A module:function transform for ImageFolder (PIL image -> uint8 HWC)."""
    return np.asarray(image)
