"""End to end: `python3 -m shmcache.prefill DIR --cache_name NAME`, then a
trainer in another process opens CachedDataset(..., name=NAME): every row
is a hit (nothing computed again) and byte-identical to the source's. A
trainer whose pipeline differs (another transform, another dataset, rows of
another row format) is refused with FingerprintMismatchError, never served
the prefilled rows; prefill over a name that holds another dataset's rows
is refused likewise, one line, exit 1."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import ROOT  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = ROOT / "scripts" / "my_training_script.py"
TRAINER = os.path.join(HERE, "named_cache_trainer.py")
N = 300


def generate(server, path, seed_rows=N):
    subprocess.run([sys.executable, str(TRAIN), "--generate", str(seed_rows),
                    "--dataset_path", str(path)], env=server.env, check=True,
                   capture_output=True, timeout=120)


def prefill(server, session, path, name, prelude=None):
    """prefill, as its user runs it; `prelude` (Python) runs first in its
    process (an older package's row format)."""
    args = [str(path), "--session_id", str(session), "-j", "2", "--cache_name", name]
    if prelude is None:
        cmd = [sys.executable, "-m", "shmcache.prefill", *args]
    else:
        cmd = [sys.executable, "-c",
               f"{prelude}\nimport sys\nfrom shmcache.prefill import main\n"
               f"sys.exit(main(sys.argv[1:]))", *args]
    return subprocess.run(cmd, env=server.env, capture_output=True, text=True,
                          timeout=300)


def train(server, session, path, name, *extra):
    r = subprocess.run([sys.executable, TRAINER, str(path), name, *map(str, extra)],
                       env=dict(server.env, SHMCACHE_SESSION_ID=str(session)),
                       capture_output=True, text=True, timeout=300)
    return r


def counts(server, session, name):
    c = server.cache_rows(session)[name]
    return c["mem_cached"], c["hits"], c["misses"]


def test_a_named_prefill_is_read_whole_by_a_trainer_in_another_process(
        server, session, tmp_path):
    data = tmp_path / "cifar"
    generate(server, data)
    r = prefill(server, session, data, "train")
    assert r.returncode == 0, r.stderr
    assert f"cache 'train' of session {session}" in r.stderr.splitlines()[-1]
    assert counts(server, session, "train") == (N, 0, 0)

    t = train(server, session, data, "train")
    assert t.returncode == 0, t.stderr
    assert json.loads(t.stdout) == {"samples": N, "identical": True}
    assert "CacheWarning" not in t.stderr, t.stderr
    # Every row read from the cache, none computed and put again.
    assert counts(server, session, "train") == (N, N, 0)


def test_another_pipeline_under_the_name_is_refused_never_served(server, session,
                                                                 tmp_path):
    data, other = tmp_path / "cifar", tmp_path / "other"
    generate(server, data)
    generate(server, other, N // 2)
    assert prefill(server, session, data, "train").returncode == 0

    # Another transform (the upscale is in Normalize's repr).
    t = train(server, session, data, "train", 3)
    assert t.returncode == 3, t.stdout + t.stderr
    assert "holds the rows of another dataset" in t.stderr
    assert "pass another name=" in t.stderr
    # Another dataset under the same name.
    t = train(server, session, other, "train")
    assert t.returncode == 3, t.stdout + t.stderr
    assert "holds the rows of another dataset" in t.stderr
    # Prefill of another dataset into the name: refused, one line.
    r = prefill(server, session, other, "train")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("prefill: ") and "another dataset" in r.stderr
    # None of them read or added a row.
    assert counts(server, session, "train") == (N, 0, 0)


def test_rows_of_another_row_format_are_refused_under_the_name(server, session,
                                                               tmp_path):
    """An older package (row format 1) prefilled the name: this one's
    trainer refuses it and says why, rather than read its rows as its own."""
    data = tmp_path / "cifar"
    generate(server, data)
    r = prefill(server, session, data, "train",
                prelude="import shmcache.torch.fingerprint as f; f.ROW_FORMAT = 1")
    assert r.returncode == 0, r.stderr
    t = train(server, session, data, "train")
    assert t.returncode == 3, t.stdout + t.stderr
    assert "another row format" in t.stderr
    assert counts(server, session, "train") == (N, 0, 0)
