"""A restart that switches huge-page mode (SHMCACHE_HUGE_TMPFS set for one
server of a port and not for the next, as when sudo or a systemd unit drops
the variable): the restarted server finds what the killed one left in the
other place (its huge-page tmpfs or /dev/shm), moves the rows into its own
shm dir with one `Warning:` line of --start saying so, and --stop then
leaves no mount and no file in either place.

Real servers, a real SIGKILL, rows put and read by other processes. The
mounting needs root and shmem transparent huge pages: skipped with the
reason otherwise.
"""

import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import ADMIN, _alive, _segments, huge_dir, wait_for
from shmcache import DatasetCache
from test_page_supply import (KB, PAST_CARVED, assert_bounded, assert_intact, put_all,
                              segment_pages)

ROWS = 2000
ROW_BYTES = 3072

# Puts (argv[1] == "put") or reads back and checks (argv[1] == "get") ROWS
# rows of a session in a process of its own, like a trainer would.
_ROWS_SCRIPT = f"""
import sys
import numpy as np
from shmcache import DatasetCache
mode, session = sys.argv[1], int(sys.argv[2])
cache = DatasetCache(session_id=session, name="switch")
for i in range({ROWS}):
    want = np.full({ROW_BYTES}, i % 251, dtype=np.uint8)
    if mode == "put":
        assert cache.put(i, (want,)), f"put {{i}} refused"
    else:
        got = cache.get(i)
        assert got is not None, f"row {{i}} is not cached"
        assert np.array_equal(got[0], want), f"row {{i}} differs"
cache.close()
"""


def _cannot_mount():
    if os.geteuid() != 0:
        return "mounting a huge-page tmpfs needs root"
    with open("/proc/self/status") as f:
        cap_eff = next(int(l.split()[1], 16) for l in f if l.startswith("CapEff:"))
    if not cap_eff >> 21 & 1:
        return "mounting a huge-page tmpfs needs CAP_SYS_ADMIN, which this root lacks"
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            thp = f.read()
    except OSError:
        return "the kernel has no shmem transparent huge pages"
    if "[deny]" in thp:
        return "shmem huge pages are denied on this host"
    if "[force]" in thp:
        return "/dev/shm pages are huge already: there is no mode to switch"
    return ""


pytestmark = pytest.mark.skipif(bool(_cannot_mount()), reason=_cannot_mount() or "-")


def _mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def _rows(server, mode, session):
    r = subprocess.run([sys.executable, "-c", _ROWS_SCRIPT, mode, str(session)],
                       env=server.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{mode} of the rows failed:\n{r.stderr}"


def _in_huge(port):
    return [f for f in _segments(port) if f.startswith(huge_dir(port) + "/")]


def _in_dev_shm(port):
    return [f for f in _segments(port) if f.startswith("/dev/shm/shmcache.")
            and not f.startswith(huge_dir(port))]


def _start(server, huge, *prefix, args=()):
    """`shmcache --start` on server's port (with `prefix` before the admin,
    e.g. setpriv, and `args` after it), SHMCACHE_HUGE_TMPFS set or not;
    returns its stdout."""
    env = dict(server.env)
    env.pop("SHMCACHE_HUGE_TMPFS", None)
    if huge:
        env["SHMCACHE_HUGE_TMPFS"] = "1"
    r = subprocess.run([*prefix, str(ADMIN), "-p", str(server.port), "--start",
                        "--log_dir", str(server.log_dir), *args],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    server.pid = json.loads(server.admin("--server_info", "--json").stdout)["pid"]
    return r.stdout


def _warnings(out):
    return [line for line in out.splitlines() if line.startswith("Warning:")]


def _stop_and_check_nothing_left(server):
    pid = server.pid
    server.admin("--stop")
    wait_for(lambda: not _alive(pid), timeout=10, what="the server's exit")
    assert _segments(server.port) == []
    assert not _mounted(huge_dir(server.port)), "the huge-page tmpfs is still mounted"
    assert not os.path.lexists(huge_dir(server.port))


@pytest.fixture
def huge_server(start_server, monkeypatch):
    """A root server on its own huge-page tmpfs, with ROWS rows put by
    another process; returns (server, session)."""
    monkeypatch.setenv("SHMCACHE_HUGE_TMPFS", "1")
    s = start_server("--memory_cap_mb", "256")
    monkeypatch.delenv("SHMCACHE_HUGE_TMPFS")
    s.env.pop("SHMCACHE_HUGE_TMPFS", None)
    assert _mounted(huge_dir(s.port))
    session = s.new_session()
    _rows(s, "put", session)
    assert _in_huge(s.port) and not _in_dev_shm(s.port)
    return s, session


def test_huge_then_plain_moves_the_rows_to_dev_shm_and_unmounts(huge_server):
    s, session = huge_server
    s.kill()
    assert _mounted(huge_dir(s.port))  # a killed server leaves its mount

    out = _start(s, huge=False)
    warnings = _warnings(out)
    assert len(warnings) == 1, out
    w = warnings[0]
    assert huge_dir(s.port) in w and "SHMCACHE_HUGE_TMPFS" in w, w
    assert "moved" in w and "unmounted" in w, w
    # The rows are served again, from /dev/shm: nothing of the instance is
    # left in the old mount, which is gone.
    assert s.cache_rows(session)["switch"]["mem_cached"] == ROWS
    assert not _mounted(huge_dir(s.port))
    assert not _in_huge(s.port) and _in_dev_shm(s.port)
    _rows(s, "get", session)
    # New rows go where this server's mode puts them.
    other = s.new_session()
    _rows(s, "put", other)
    assert not _in_huge(s.port)
    _stop_and_check_nothing_left(s)


def test_plain_then_huge_moves_the_rows_into_the_new_mount(start_server):
    s = start_server("--memory_cap_mb", "256")
    assert not _mounted(huge_dir(s.port))
    session = s.new_session()
    _rows(s, "put", session)
    assert _in_dev_shm(s.port)
    s.kill()

    out = _start(s, huge=True)
    warnings = _warnings(out)
    assert len(warnings) == 1, out
    w = warnings[0]
    assert "/dev/shm" in w and "SHMCACHE_HUGE_TMPFS" in w and "moved" in w, w
    assert _mounted(huge_dir(s.port))
    assert s.cache_rows(session)["switch"]["mem_cached"] == ROWS
    assert not _in_dev_shm(s.port) and _in_huge(s.port)
    _rows(s, "get", session)
    _stop_and_check_nothing_left(s)


def test_a_restart_with_shm_dir_dev_shm_also_moves_the_rows(huge_server):
    """--shm_dir /dev/shm (as in a unit's SHMCACHED_OPTS) with the variable
    still set: the port's huge tmpfs is emptied into /dev/shm all the same."""
    s, session = huge_server
    s.kill()
    out = _start(s, True, args=("--shm_dir", "/dev/shm"))
    warnings = _warnings(out)
    assert len(warnings) == 1, out
    assert "its shm dir is given" in warnings[0] and "unmounted" in warnings[0], warnings[0]
    assert s.cache_rows(session)["switch"]["mem_cached"] == ROWS
    assert not _mounted(huge_dir(s.port))
    _rows(s, "get", session)
    _stop_and_check_nothing_left(s)


def test_a_restart_without_a_switch_says_nothing(huge_server):
    s, session = huge_server
    s.kill()
    out = _start(s, huge=True)
    assert _warnings(out) == [], out
    assert s.cache_rows(session)["switch"]["mem_cached"] == ROWS
    _stop_and_check_nothing_left(s)


def test_huge_asked_but_no_mount_possible_now_moves_the_rows_out(huge_server):
    """The earlier mount exists but this server cannot mount or unmount
    (no CAP_SYS_ADMIN, as for a non-root server): the rows still come to
    /dev/shm, and the warning says the empty mount needs root's umount."""
    s, session = huge_server
    s.kill()
    no_admin = ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin"]
    out = _start(s, True, *no_admin)
    warnings = _warnings(out)
    assert len(warnings) == 1, out
    w = warnings[0]
    assert huge_dir(s.port) in w and "moved" in w and f"umount {huge_dir(s.port)}" in w, w
    assert s.cache_rows(session)["switch"]["mem_cached"] == ROWS
    assert not _in_huge(s.port)
    _rows(s, "get", session)
    pid = s.pid
    s.admin("--stop")
    wait_for(lambda: not _alive(pid), timeout=10, what="the server's exit")
    # Only the emptied mount is left (this server may not unmount it), and
    # what the warning asks root to do removes it.
    assert _segments(s.port) == [huge_dir(s.port)]
    assert os.listdir(huge_dir(s.port)) == []
    subprocess.run(["umount", huge_dir(s.port)], check=True)
    os.rmdir(huge_dir(s.port))
    assert not _mounted(huge_dir(s.port))


def test_a_cache_that_does_not_fit_the_new_mount_stays_where_it_was(start_server):
    """The earlier server's rows need more room than the new server's tmpfs
    (sized to its smaller cap) has: the warning says so, and that cache
    stays whole in /dev/shm (it used to be removed from both places, the
    only copy with it), where a start in the earlier mode serves every
    row; nothing is left after --stop."""
    s = start_server("--memory_cap_mb", "256")
    session = s.new_session()
    r = subprocess.run([sys.executable, "-c", f"""
import numpy as np
from shmcache import DatasetCache
cache = DatasetCache(session_id={session}, name="big")
rows = [(np.zeros({ROW_BYTES}, dtype=np.uint8),)] * 1000
for b in range(40):
    assert all(cache.put_batch(range(b * 1000, (b + 1) * 1000), rows))
cache.close()
"""], env=s.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before = {f: os.path.getsize(f) for f in _in_dev_shm(s.port)}
    assert sum(before.values()) > 100 << 20
    s.kill()

    # A 16 MB cap: the tmpfs holds 16 + 64 MB, less than the cache.
    out = _start(s, True, args=("--memory_cap_mb", "16"))
    warnings = _warnings(out)
    assert len(warnings) == 1, out
    assert "left 1 that could not be moved" in warnings[0], warnings[0]
    assert "no room" in warnings[0], warnings[0]
    assert s.cache_rows(session) == {}
    # Untouched where it was, but for the sessions list, which moved.
    assert {f: os.path.getsize(f) for f in _in_dev_shm(s.port)} == {
        f: n for f, n in before.items() if not f.endswith(".sessions")}
    s.admin("--stop")
    wait_for(lambda: not _alive(s.pid), timeout=10, what="the server's exit")

    _start(s, False, args=("--memory_cap_mb", "256"))
    assert s.cache_rows(session)["big"]["mem_cached"] == 40000
    _stop_and_check_nothing_left(s)


def test_a_move_cut_short_by_a_kill_goes_on_at_the_next_start(huge_server):
    """A start killed while moving leaves some files copied into place, the
    originals not yet removed (a copy it was making has no name: it went
    with the process); an older server also left a half-written copy under
    its fixed temporary name: the next start finishes the move, removes
    that stray and serves every row."""
    s, session = huge_server
    s.kill()
    prefix = f"shmcache.{os.getuid()}.{s.port}."
    segs = sorted(f for f in _in_huge(s.port) if ".seg." in f or ".cache." in f)
    assert segs
    # The header was copied into place but not yet removed there.
    header = next(f for f in segs if ".cache." in f)
    with open(header, "rb") as src, open(f"/dev/shm/{os.path.basename(header)}", "wb") as dst:
        dst.write(src.read())
    os.chmod(f"/dev/shm/{os.path.basename(header)}", 0o600)
    # A copy an older server's kill cut short.
    with open(f"/dev/shm/{prefix}moving", "wb") as f:
        f.write(b"\0" * 4096)
    os.chmod(f"/dev/shm/{prefix}moving", 0o600)

    out = _start(s, huge=False)
    assert len(_warnings(out)) == 1, out
    assert s.cache_rows(session)["switch"]["mem_cached"] == ROWS
    assert not os.path.exists(f"/dev/shm/{prefix}moving")
    assert not _mounted(huge_dir(s.port))
    _rows(s, "get", session)
    _stop_and_check_nothing_left(s)


def test_a_switch_moves_a_segments_rows_and_leaves_its_unsupplied_rest_a_hole(start_server):
    """Segments are sparse (pages are supplied a step ahead of the carve
    mark): the move copies each segment's carved part only, so the moved
    segments hold no more pages than the earlier server had supplied (and a
    step ahead of the one this server carves on), and the adopting server
    supplies the rest before it leases it (a writer never touches a hole):
    every row reads back and more puts succeed."""
    s = start_server("--memory_cap_mb", "1024")
    sid = s.new_session()
    size = 150 * KB
    cache = DatasetCache(sid, size_mb=1024, name="sparse")
    # Until the segments' holes (made ahead of need, or past the supply
    # ahead) are more than the step the next server supplies: segments grow
    # with the cache, so this comes by 500 MB of rows.
    rows, holes = 0, 0
    while holes <= 2 * PAST_CARVED and rows < 3600:
        put_all(cache, rows, 200, size)
        rows += 200
        before = segment_pages("/dev/shm", s.port)
        supplied = sum(b for _, b, _ in before)
        holes = sum(os.stat(p).st_size for p, _, _ in before) - supplied
    cache.close()
    assert holes > 2 * PAST_CARVED, f"segments with holes at the kill: {holes >> 20} MB"
    s.kill()

    _start(s, huge=True)
    assert _mounted(huge_dir(s.port)) and not _in_dev_shm(s.port)
    after = assert_bounded(huge_dir(s.port), s.port)
    moved = sum(b for _, b, _ in after)
    # What the earlier server supplied, and at most a step ahead of the one
    # segment per NUMA node this server carves on (supplied before leasing).
    assert moved <= supplied + PAST_CARVED * _numa_nodes(), \
        f"{moved >> 20} MB allocated after the move, {supplied >> 20} MB supplied " \
        f"before it, {(supplied + holes) >> 20} MB of segments"
    cache = DatasetCache(sid, size_mb=1024, name="sparse")
    assert_intact(cache, 0, rows, size)
    put_all(cache, rows, 800, size)           # into the moved segments' holes
    assert_intact(cache, 0, rows + 800, size)
    assert_bounded(huge_dir(s.port), s.port)
    cache.close()
    _stop_and_check_nothing_left(s)


def _numa_nodes():
    return max(1, len(glob.glob("/sys/devices/system/node/node[0-9]*")))
