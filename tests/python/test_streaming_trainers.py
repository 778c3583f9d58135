"""End to end: CachedIterableDataset shared by separate trainer processes,
each reading through DataLoader workers (fork and spawn) on one session.
The first pass of each gives every sample of its stream once, in order,
whoever builds; the cache is built once per dataset; the second pass reads
only the cache (the source raises by then) in every trainer; and a trainer
of another stream (same class and path, other contents) never gets the
first one's rows."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import wait_for  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "stream_trainer.py")
N = 200


def test_trainers_share_one_build_per_stream_and_read_it_in_later_passes(
        server, session, tmp_path):
    guard = tmp_path / "sealed"
    env = dict(server.env, SHMCACHE_SESSION_ID=str(session),
               PYTHONPATH=HERE + os.pathsep + server.env["PYTHONPATH"])
    runs = [(0, "fork"), (0, "spawn"), (0, "fork"), (1000, "fork"), (1000, "spawn")]
    procs = []
    try:
        for offset, context in runs:
            procs.append(subprocess.Popen(
                [sys.executable, TRAINER, str(N), str(offset), str(guard),
                 str(tmp_path), context],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        wait_for(lambda: len(list(tmp_path.glob("pass1.*"))) == len(runs) or
                 any(p.poll() is not None for p in procs),
                 timeout=240, what="every trainer's first pass")
        guard.touch()                 # the source raises from now on
        (tmp_path / "go").touch()
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for (offset, context), p, (out, err) in zip(runs, procs, outs):
        assert p.returncode == 0, (offset, context, err)
        passes = [json.loads(line) for line in out.splitlines()]
        assert len(passes) == 2, out
        for k, got in enumerate(passes):
            # Every sample of its own stream, once, in order; no other's.
            assert got["labels"] == list(range(offset, offset + N)), (offset, context, k)
            assert got["images_match"], (offset, context, k)
    caches = server.cache_rows(session)
    assert len(caches) == 2, caches          # one cache per stream, not per trainer
    for c in caches.values():
        assert c["mem_cached"] == N + 2      # its rows, a builder and a seal mark
