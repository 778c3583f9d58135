"""scripts/cache.sh end to end: N device processes share one session."""

import os
import re
import subprocess

from conftest import ROOT

CACHE_SH = ROOT / "scripts" / "cache.sh"
TRAIN = ROOT / "scripts" / "my_training_script.py"


def test_cache_sh_four_devices_hold_one_copy(server, tmp_path):
    data = tmp_path / "cifar10"
    n = 2000
    subprocess.run(["/usr/bin/python3", str(TRAIN), "--generate", str(n),
                    "--dataset_path", str(data)], check=True, env=server.env,
                   capture_output=True, timeout=60)
    assert len(list(data.glob("data_batch_*.bin"))) == 5

    def run(extra_env):
        r = subprocess.run([str(CACHE_SH), str(data), "4"], env={**server.env, **extra_env},
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        got = dict((int(k), int(v)) for v, k in
                   re.findall(r"^Got (\d+) samples on device (\d+)$", r.stdout, re.M))
        assert got == {0: 500, 1: 500, 2: 500, 3: 500}, r.stdout
        return int(re.search(r"^cache.sh: session (\d+),", r.stdout, re.M).group(1))

    session = run({})
    caches = server.cache_rows(session)
    assert len(caches) == 1
    (c,) = caches.values()
    assert c["mem_cached"] == n           # one copy, not four
    assert c["misses"] == n and c["hits"] == 0

    # Again on the same session: warm, every sample a hit, still one copy.
    assert run({"SESSION_ID": str(session)}) == session
    (c,) = server.cache_rows(session).values()
    assert c["mem_cached"] == n and c["hits"] == n and c["misses"] == n


def test_cache_sh_fails_without_a_server(server, tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    server.stop()
    r = subprocess.run([str(CACHE_SH), str(data), "2"], env=server.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "session" in r.stderr


def test_cache_sh_fails_when_a_device_fails(server, tmp_path):
    data = tmp_path / "empty"      # no data_batch_*.bin: every device exits 1
    data.mkdir()
    r = subprocess.run([str(CACHE_SH), str(data), "2"], env=server.env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "device 0 failed" in r.stderr and "device 1 failed" in r.stderr


def test_cache_sh_usage_errors(tmp_path):
    assert subprocess.run([str(CACHE_SH)], capture_output=True).returncode != 0
    r = subprocess.run([str(CACHE_SH), str(tmp_path), "zero"], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "NUM_DEVICES" in r.stderr


def test_cache_sh_refuses_a_session_id_that_is_no_number_before_any_device(tmp_path):
    """Once one traceback or usage text per device; now one line naming the
    value and the fix, and no device is started."""
    for bad in ("abc", "-1", "1 2", "4294967296", "99999999999"):
        r = subprocess.run([str(CACHE_SH), str(tmp_path), "3"],
                           env=dict(os.environ, SESSION_ID=bad),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (bad, r.stderr)
        assert r.stderr == ("cache.sh: SESSION_ID must be a session id from 'shmcache -g' "
                            f"(a number in 0..4294967295), got '{bad}'; unset it to create "
                            "a session\n"), (bad, r.stderr)
        assert r.stdout == "", (bad, r.stdout)


def test_cache_sh_refuses_a_session_the_server_does_not_hold_before_any_device(server,
                                                                               tmp_path):
    """A destroyed (or mistyped) session: once a NotFoundError traceback per
    device; now one line naming the session and the fix, and no device is
    started. What the server holds is untouched."""
    kept = server.new_session()
    gone = server.new_session()
    server.admin("-d", str(gone))
    r = subprocess.run([str(CACHE_SH), str(tmp_path), "3"],
                       env=dict(server.env, SESSION_ID=str(gone)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr == (f"cache.sh: session {gone} does not exist on the cache server "
                        f"(port {server.port}); list them with 'shmcache --list_sessions', "
                        "or unset SESSION_ID to create one\n"), r.stderr
    assert r.stdout == ""
    assert [s["session"] for s in server.sessions()] == [kept]


def test_cache_sh_leaves_a_session_listing_it_cannot_read_to_the_devices(server, tmp_path):
    """Only a session missing from the listing is refused: a listing the
    check cannot parse (another version's shape, a wrapper's output) once
    read as "does not exist" and stopped the run, where the devices would
    have trained (from the source at worst)."""
    session = server.new_session()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "shmcache"
    fake.write_text("#!/bin/sh\necho 'sessions: not json'\n")
    fake.chmod(0o755)
    data = tmp_path / "data"
    data.mkdir()
    env = dict(server.env, SESSION_ID=str(session),
               PATH=f"{fake_bin}:{server.env.get('PATH', os.environ['PATH'])}")
    r = subprocess.run([str(CACHE_SH), str(data), "1"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert "does not exist on the cache server" not in r.stderr, r.stderr
    assert r.stdout.startswith(f"cache.sh: session {session}, 1 devices"), \
        r.stdout + r.stderr
