"""PIL images read where the row is: every mode comes back equal, in mode
and pixels, through every read (one row, a batch, a view, a spilled row),
and a batch of a transformed CachedDataset of PIL images, read one by one
(CachedDataset.__getitems__), is what the uncached dataset gives."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from shmcache import DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset  # noqa: E402

# Modes whose pixels PIL widens to 4 bytes (read where they are), and modes
# it may map instead (read through a copy of their own).
MODES = ["RGB", "LA", "YCbCr", "HSV", "L", "RGBA", "I", "F", "1"]


def image(mode, seed, size=(7, 5)):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), np.uint8)) \
        .convert("RGBA" if mode == "LA" else "RGB").convert(mode)


def same(a, b):
    assert isinstance(a, Image.Image) and a.mode == b.mode and a.size == b.size
    assert a.tobytes() == b.tobytes()


def check_every_read(c):
    imgs = {k: image(m, k) for k, m in enumerate(MODES)}
    for k, img in imgs.items():
        assert c.put(k, (img, k))
    for k, img in imgs.items():
        got, label = c.get(k)
        same(got, img)
        assert label == k
        same(c.view(k)[0], img)
    for k, row in zip(imgs, c.get_batch(list(imgs))):
        same(row[0], imgs[k])


def test_every_mode_round_trips_through_every_read(server, session):
    check_every_read(DatasetCache(session))


def test_every_mode_round_trips_from_spilled_rows(spill_server):
    c = DatasetCache(spill_server.new_session(), size_mb=1, spilling=True, name="pil")
    filler = np.zeros(200 << 10, np.uint8)
    for k in range(100, 106):          # fill the 1 MB: the images spill
        c.put(k, filler)
    check_every_read(c)
    st = c.stats()
    assert st["disk_rows"] >= len(MODES), dict(st)


class Pictures(Dataset):
    def __init__(self, n):
        self.n, self.root = n, f"pictures-{n}"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return image("RGB", i, (40, 30)), i


def flip(img):
    """A deterministic transform of a PIL image into a tensor."""
    return torch.from_numpy(np.asarray(img.transpose(Image.FLIP_LEFT_RIGHT)).copy())


def test_batches_of_transformed_pil_rows_are_the_uncached_ones(server, session):
    source = Pictures(20)
    want = list(DataLoader(_Transformed(source), batch_size=4))
    cds = CachedDataset(source, DatasetCache(session), transform=flip)
    for epoch in range(3):            # cold, then warm (one by one after a batch)
        got = list(DataLoader(cds, batch_size=4))
        assert cds.flush(10)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]), epoch
    assert cds._one_by_one and cds.stats()["hits"] == 40


class _Transformed(Dataset):
    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        img, label = self.ds[i]
        return flip(img), label
