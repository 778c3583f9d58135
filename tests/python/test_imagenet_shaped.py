"""A real training script switches to the cache with the 3-line change of
imagenet_shaped/switch.patch (README.md shows it): an ImageFolder of JPEGs
with its PIL transforms passed to CachedDataset unchanged, the session from
$SHMCACHE_SESSION_ID, a DataLoader with pin_memory=True on a CPU."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchvision")
Image = pytest.importorskip("PIL.Image")

HERE = Path(__file__).resolve().parent / "imagenet_shaped"
N = 16


def make_jpegs(root):
    rng = np.random.default_rng(0)
    for k in range(N):
        d = root / f"class{k % 2}"
        d.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (20 + k, 24, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(d / f"img{k}.jpg", quality=90)


def train(script, data, env):
    r = subprocess.run([sys.executable, str(script), str(data), "--epochs", "2"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    epochs = [ln for ln in r.stdout.splitlines() if ln.startswith("epoch")]
    assert [ln.split()[:4] for ln in epochs] == [["epoch", "0", "images", str(N)],
                                                 ["epoch", "1", "images", str(N)]]
    return r


def test_the_switch_is_three_lines_and_caches_every_image_once(server, session, tmp_path):
    patch = (HERE / "switch.patch").read_text()
    changed = [ln for ln in patch.splitlines()
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert len([ln for ln in changed if ln.startswith("+")]) <= 3, patch
    make_jpegs(tmp_path / "train")
    env = dict(server.env, PYTHONPATH=os.environ.get("PYTHONPATH", ""),
               SHMCACHE_SESSION_ID=str(session))
    train(HERE / "train.py", tmp_path / "train", env)      # the script as it is

    work = tmp_path / "cached"
    work.mkdir()
    shutil.copy(HERE / "train.py", work / "train.py")
    subprocess.run(["patch", "-p1", "-i", str(HERE / "switch.patch")], cwd=work,
                   check=True, capture_output=True, timeout=60)
    train(work / "train.py", tmp_path / "train", env)

    caches = [s for s in server.sessions() if s["session"] == session][0]["caches"]
    assert len(caches) == 1, caches
    c = caches[0]
    assert c["mem_cached"] == N                  # every image cached once
    assert c["misses"] == N and c["hits"] == N   # the second epoch all hits
