"""One server per (user, port) on the host, whatever its run dir: the shm
files carry only the user and the port, so a second server there would
adopt the first one's caches and delete them when either stops."""

import os
import subprocess

import numpy as np
import pytest

from conftest import ADMIN, Server, _alive, _segments
from shmcache import DatasetCache


def _second_start(first, tmp_path):
    """`shmcache --start` on first's port with a run dir of its own."""
    (tmp_path / "second").mkdir()
    other = Server(tmp_path / "second")
    other.port = first.port
    other.env["SHMCACHE_PORT"] = str(first.port)
    r = other.admin("--start", "--log_dir", str(other.log_dir), check=False)
    return other, r


def test_a_second_server_on_the_port_with_another_run_dir_is_refused(
        server, session, tmp_path):
    cache = DatasetCache(session_id=session)
    assert all(cache.put(i, (np.full(64, i, dtype=np.int32),)) for i in range(100))
    files = sorted(_segments(server.port))

    other, r = _second_start(server, tmp_path)
    try:
        assert r.returncode != 0
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1, err
        assert (f"already running on port {server.port} (process id {server.pid}, "
                f"run dir {server.run_dir})") in err
    finally:
        if r.returncode == 0:   # the old behaviour: do not let it delete ours
            other.admin("--stop", check=False)

    # The first server and everything it cached are untouched. Its own
    # segments may have grown meanwhile (the store maps its next segment in
    # the background past its high-water mark), so none may have gone.
    assert _alive(server.pid)
    missing = set(files) - set(_segments(server.port))
    assert not missing, missing
    assert server.cache_rows(session)["default"]["mem_cached"] == 100
    again = DatasetCache(session_id=session)
    assert all(int(again.get(i)[0][0]) == i for i in range(100))


def test_the_port_is_free_again_once_the_server_stopped(start_server, tmp_path):
    first = start_server()
    first.admin("--stop")
    other, r = _second_start(first, tmp_path)
    try:
        assert r.returncode == 0, r.stderr
    finally:
        other.pid = None
        other.admin("--stop", check=False)
        other.stop()
    assert not os.path.exists(f"/dev/shm/.shmcache.{os.getuid()}.{first.port}.lock")


def test_a_lock_planted_by_another_user_is_refused_with_the_fix(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to plant a file of another user")
    (tmp_path / "s").mkdir()
    s = Server(tmp_path / "s")
    lock = f"/dev/shm/.shmcache.{os.getuid()}.{s.port}.lock"
    fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.close(fd)
    try:
        os.chown(lock, 65534, 65534)
        r = s.admin("--start", "--log_dir", str(s.log_dir), check=False)
        assert r.returncode != 0
        assert "belongs to uid 65534" in r.stderr and "another port" in r.stderr, r.stderr
        assert os.stat(lock).st_uid == 65534
    finally:
        s.admin("--stop", check=False)
        os.unlink(lock)
