"""The server's memory cap follows where it runs: a small shm filesystem
(Docker's 64 MB /dev/shm) and a cgroup memory limit bound it, `--start`
names the fix, a cache opened larger than the cap is told once at open,
and training goes on from the source when the cache is full. Root only:
the tests mount a tmpfs and create a cgroup (and always remove them)."""

import json
import os
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import Server, undone_at_end
from shmcache import CacheWarning, DatasetCache

MB = 1 << 20
ROW = np.zeros(MB, dtype=np.uint8)

needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to mount a tmpfs / create a cgroup")


def cache_warnings(record):
    return [str(x.message) for x in record if issubclass(x.category, CacheWarning)]


@pytest.fixture
def tmpfs_64m(small_tmpfs_of):
    """A 64 MB tmpfs (Docker's default /dev/shm size), unmounted after."""
    return small_tmpfs_of("64m")


@pytest.fixture
def own_server(tmp_path, monkeypatch):
    """A Server not yet started, stopped at teardown whatever happens (before
    the tmpfs it may use is unmounted: fixtures end in reverse order)."""
    servers = []

    def make():
        d = tmp_path / f"server{len(servers)}"
        d.mkdir()
        s = Server(d)
        servers.append(s)
        monkeypatch.setenv("SHMCACHE_PORT", str(s.port))
        monkeypatch.setenv("SHMCACHE_RUN_DIR", str(s.run_dir))
        return s

    try:
        yield make
    finally:
        for s in servers:
            s.stop()


def start(s, *args, prefix=()):
    """Starts s with `shmcache --start args` (run under `prefix`); the output."""
    r = subprocess.run([*prefix, str(Path(s.env["SHMCACHE_BUILD_DIR"]) / "clients" /
                                     "admin" / "shmcache"),
                        "-p", str(s.port), "--start", "--log_dir", str(s.log_dir), *args],
                       env=s.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    s.pid = json.loads(s.admin("--server_info", "--json").stdout)["pid"]
    return r.stdout


def metric(text, name, bound):
    for line in text.splitlines():
        if line.startswith(f'{name}{{') and f'bound="{bound}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{bound={bound}}} in:\n{text}")


@needs_root
def test_small_shm_filesystem_caps_memory_warns_and_training_goes_on(tmpfs_64m, own_server):
    s = own_server()
    out = start(s, "--shm_dir", str(tmpfs_64m))
    # --start names the bound and the remedy for where it runs.
    (warning,) = [l for l in out.splitlines() if l.startswith("Warning: the shm filesystem")]
    assert str(tmpfs_64m) in warning and "64 MB of room" in warning, warning
    assert "--shm-size=" in warning or "emptyDir" in warning or "--shm_dir" in warning

    info = json.loads(s.admin("--server_info", "--json").stdout)
    assert info["memory_cap_bound"] == "shm_filesystem"
    assert 60 * MB <= info["memory_cap_bytes"] == info["memory_bounds"]["shm_filesystem"] \
        <= 64 * MB
    assert info["memory_bounds"]["physical_memory"] > info["memory_cap_bytes"]
    text = s.admin("--server_info").stdout
    assert "shm_filesystem applies" in text, text
    m = s.admin("--metrics").stdout
    assert metric(m, "shmcache_server_memory_cap_bound_applies", "shm_filesystem") == 1
    assert metric(m, "shmcache_server_memory_cap_bound_applies", "physical_memory") == 0
    assert metric(m, "shmcache_server_memory_cap_bound_bytes", "shm_filesystem") == \
        info["memory_cap_bytes"]

    # A cache asked for 1 GB is told at open, once, with the bound and the fix.
    cache = DatasetCache(s.new_session(), size_mb=1024)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cache.open()
        at_open = cache_warnings(w)
        # An epoch of 100 MB of rows into 64 MB: puts beyond it are refused,
        # what was cached is served, the rest comes from the source.
        stored = [cache.put(i, ROW) for i in range(100)]
        rows = [cache.get(i) for i in range(100)]
    assert len(at_open) == 1, at_open
    msg = at_open[0]
    assert "cache size 1024 MB" in msg and "shm_filesystem" in msg, msg
    assert "--shm-size" in msg and "--shm_dir" in msg, msg
    assert cache_warnings(w) == at_open, "one warning in all"
    assert stored[0] and not stored[-1]
    for i, (ok, row) in enumerate(zip(stored, rows)):
        assert (row is not None) == ok, i
    # The cap, not the filesystem running out mid-epoch, refused the puts.
    log = "".join(p.read_text() for p in s.log_dir.iterdir())
    assert "no room left in the shared-memory filesystem" not in log


def _mount_of(fstype, option=None):
    """(mount root, mount point) of the cgroup hierarchy of `fstype`."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields, rest = head.split(), tail.split()
            if rest and rest[0] == fstype and (
                    option is None or option in rest[2].split(",")):
                return fields[3], fields[4]
    return None


def _memory_cgroup_root():
    """Where a new cgroup with a memory limit goes: (the hierarchy's dir,
    the limit file, version), or a skip with the reason this machine does
    not allow it."""
    v2 = _mount_of("cgroup2")
    if v2:
        root = Path(v2[1])
        controllers = (root / "cgroup.controllers").read_text().split()
        if "memory" in controllers:
            sub = (root / "cgroup.subtree_control")
            if "memory" not in sub.read_text().split():
                try:
                    sub.write_text("+memory")
                except OSError as e:
                    pytest.skip(f"cannot enable the memory controller in {sub}: {e}")
            return root, "memory.max", 2
    v1 = _mount_of("cgroup", "memory")
    if v1:
        return Path(v1[1]), "memory.limit_in_bytes", 1
    pytest.skip("no cgroup hierarchy with the memory controller is mounted "
                "(cgroup v2 without 'memory' in cgroup.controllers, no v1 memory)")


# Removes the cgroup $1 once it is empty, killing what is left in it (the
# server the test started there, before it has seen its pytest gone).
_REMOVE_CGROUP = ('for _ in $(seq 100); do [ -d "$1" ] || exit 0; rmdir "$1" 2>/dev/null && '
                  'exit 0; kill -9 $(cat "$1/cgroup.procs") 2>/dev/null; sleep 0.1; done; '
                  'exit 1')


@pytest.fixture
def limited_cgroup():
    """A new cgroup limited to 256 MB: (its dir, the limit file, version).
    Removed after the test, or when this pytest dies: nothing else would
    ever remove it."""
    root, file, version = _memory_cgroup_root()
    d = root / f"shmcache-test-{os.getpid()}"
    with undone_at_end(_REMOVE_CGROUP, str(d)):
        try:
            d.mkdir()
        except OSError as e:
            pytest.skip(f"cannot create a cgroup v{version} under {root}: {e}")
        (d / file).write_text(str(256 * MB))
        yield d, file, version
    assert not d.exists(), f"cgroup {d} was not removed"


@needs_root
def test_memory_cap_follows_the_cgroup_memory_limit(limited_cgroup, own_server):
    d, file, version = limited_cgroup
    s = own_server()
    # The shell moves itself into the cgroup, then becomes the admin, whose
    # daemon inherits the cgroup.
    start(s, "-r", "0.5",
          prefix=["sh", "-c", f'echo $$ > "{d}/cgroup.procs" && exec "$0" "$@"'])
    with open(f"/proc/{s.pid}/cgroup") as f:
        assert d.name in f.read(), f"cgroup v{version}: the daemon is not in {d}"
    info = json.loads(s.admin("--server_info", "--json").stdout)
    assert info["memory_cap_bound"] == "cgroup", info
    assert info["memory_bounds"]["cgroup_limit"] == 256 * MB
    assert info["memory_cap_bytes"] == info["memory_bounds"]["cgroup"] == 128 * MB
    m = s.admin("--metrics").stdout
    assert metric(m, "shmcache_server_memory_cap_bound_applies", "cgroup") == 1
    assert metric(m, "shmcache_server_memory_cap_bound_bytes", "cgroup") == 128 * MB
    s.stop()
