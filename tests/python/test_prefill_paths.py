"""A dataset's path spelled another way (`images/`, `./images`, a symlink,
the absolute path) names the same cache, for prefill and for CachedDataset,
so that a trainer hits what prefill filled and the session holds the data
once; prefill says which cache it filled."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
datasets = pytest.importorskip("torchvision.datasets")

from helpers import Images, sample, to_array  # noqa: E402
from shmcache import DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset, cache_for_dataset, dataset_fingerprint  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
N = 6


def image_folder(root):
    from PIL import Image
    for k in range(N):
        d = root / ("cat", "dog")[k % 2]
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(sample(k)[0].transpose(1, 2, 0)).save(d / f"{k}.png")


def test_every_spelling_of_a_path_has_one_fingerprint(tmp_path, monkeypatch):
    image_folder(tmp_path / "images")
    (tmp_path / "link").symlink_to(tmp_path / "images")
    monkeypatch.chdir(tmp_path)
    spellings = ["images", "images/", "./images", "./images/", "link",
                 str(tmp_path / "images"), str(tmp_path) + "//images/.",
                 tmp_path / "images"]
    fps = {dataset_fingerprint(datasets.ImageFolder(s, transform=to_array))
           for s in spellings}
    assert len(fps) == 1, fps
    assert repr(str(tmp_path / "images")) in fps.pop()
    # A root that names nothing on disk is a label: kept as written, so it
    # does not depend on the working directory.
    a = dataset_fingerprint(Images(4, root="synthetic"))
    monkeypatch.chdir("/")
    assert dataset_fingerprint(Images(4, root="synthetic")) == a
    assert "root='synthetic'" in a


def test_prefill_of_a_relative_path_is_hit_by_a_trainer_on_the_absolute_path(
        server, session, tmp_path):
    image_folder(tmp_path / "images")
    (tmp_path / "link").symlink_to(tmp_path / "images")
    env = dict(server.env, PYTHONPATH=HERE + os.pathsep + server.env["PYTHONPATH"])
    names = []
    for spelling in ("images/", "./images", "link"):
        r = subprocess.run(
            [sys.executable, "-m", "shmcache.prefill", spelling, "--session_id",
             str(session), "-p", str(server.port), "-j", "2",
             "--transform", "helpers:to_array"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        names += re.findall(r"^prefill: filling cache '([^']+)' of session "
                            rf"{session}$", r.stderr, re.M)
        assert r.stderr.splitlines()[-1].endswith(
            f"; cache {names[-1]!r} of session {session}")
    # One cache: the first run stored every row, the others found them.
    assert len(names) == 3 and len(set(names)) == 1
    assert "(0 stored now, 6 already cached)" in r.stderr
    # The trainer, elsewhere, names the folder by its absolute path.
    folder = datasets.ImageFolder(str(Path(tmp_path / "images")), transform=to_array)
    assert cache_for_dataset(folder, DatasetCache(session)).name == names[0]
    ds = CachedDataset(folder, DatasetCache(session))
    for i in range(N):
        ds[i]
    c = ds.stats()
    assert (c["hits"], c["misses"]) == (N, 0)
    # The session holds the data once.
    (cache,) = server.cache_rows(session).values()
    assert cache["mem_cached"] == N
