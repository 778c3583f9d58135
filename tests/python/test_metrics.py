"""`shmcache --metrics` and `--start --metrics_file`: Prometheus text that
Debian's prometheus_client parser accepts, with the values --list_sessions
and --server_info show."""

import json
import os
import subprocess
import warnings

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ADMIN, Server, wait_for
from shmcache import DatasetCache

ROW = (np.zeros(64 * 1024, dtype=np.uint8),)
ODD_NAME = 'odd "name" \\ with\na line feed'


def parse(text):
    """{(family name, sample name): {frozenset(labels): value}}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def cache_labels(port, session, cache):
    return frozenset({"port": str(port), "session": str(session),
                      "cache": cache["name"], "cache_id": str(cache["cache_id"])}.items())


def fill(session, port):
    """Caches with hits and misses, spilled rows read back, refused puts."""
    plain = DatasetCache(session, port=port, name=ODD_NAME)
    for i in range(10):
        plain.put(i, (np.arange(100),))
    for i in range(15):
        plain.get(i)
    spilled = DatasetCache(session, port=port, size_mb=1, spilling=True, name="spilled")
    for i in range(48):
        assert spilled.put(i, ROW)
    for i in range(48):
        assert spilled.get(i) is not None
    return plain, spilled, fill_until_full(session, port)


def fill_until_full(session, port):
    """A 1 MB cache offered 3 MB: (the cache, what each put returned)."""
    full = DatasetCache(session, port=port, size_mb=1, name="full")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stored = [full.put(i, ROW) for i in range(48)]
    return full, stored


def test_metrics_parse_and_match_the_listing(spill_server):
    s = spill_server
    session = s.new_session()
    s.new_session()                      # an empty one counts as a session
    keep = fill(session, s.port)         # open caches: a live connection
    text = s.admin("--metrics").stdout
    m = parse(text)
    info = json.loads(s.admin("--server_info", "--json").stdout)
    (listed,) = [x for x in s.sessions() if x["session"] == session]

    port = frozenset({"port": str(s.port)}.items())
    assert m["shmcache_server_memory_used_bytes"][port] == info["memory_used_bytes"]
    assert m["shmcache_server_memory_cap_bytes"][port] == info["memory_cap_bytes"]
    assert m["shmcache_server_memory_held_bytes"][port] == info["memory_held_bytes"] == 0
    assert m["shmcache_server_sessions"][port] == len(info["sessions"]) == 2
    assert m["shmcache_server_caches"][port] == 3
    assert m["shmcache_server_connections"][port] >= 2   # ours and the admin's
    assert m["shmcache_server_start_time_seconds"][port] == info["start_time_unix"]
    assert 0 <= m["shmcache_server_uptime_seconds"][port] <= info["uptime_seconds"] + 60

    fields = {"shmcache_cache_memory_rows": "mem_cached",
              "shmcache_cache_memory_bytes": "mem_bytes",
              "shmcache_cache_disk_rows": "disk_cached",
              "shmcache_cache_disk_bytes": "disk_bytes",
              "shmcache_cache_hits_total": "hits",
              "shmcache_cache_misses_total": "misses",
              "shmcache_cache_numa_hits_total": "numa_hit",
              "shmcache_cache_puts_full_total": "puts_full",
              "shmcache_cache_spill_reads_total": "spill_reads",
              "shmcache_cache_reserved_bytes": "reserved_bytes",
              "shmcache_cache_budget_bytes": "budget_bytes"}
    assert len(listed["caches"]) == 3
    for c in listed["caches"]:
        labels = cache_labels(s.port, session, c)
        for metric, field in fields.items():
            assert m[metric][labels] == c[field], (c["name"], metric)
        assert m["shmcache_cache_full"][labels] == int(c["full"])

    by_name = {c["name"]: c for c in listed["caches"]}
    assert by_name[ODD_NAME]["hits"] == 10 and by_name[ODD_NAME]["misses"] == 5
    assert by_name["spilled"]["disk_cached"] > 0
    assert by_name["spilled"]["disk_bytes"] >= by_name["spilled"]["disk_cached"] * ROW[0].nbytes
    assert by_name["spilled"]["spill_reads"] == by_name["spilled"]["disk_cached"]
    assert by_name["full"]["puts_full"] > 0
    del keep


def test_every_refused_put_is_counted(server, session):
    full, stored = fill_until_full(session, server.port)
    refused = stored.count(False)
    assert 0 < refused < len(stored)
    assert full.stats()["puts_full"] == refused
    m = parse(server.admin("--metrics").stdout)
    (listed,) = [x for x in server.sessions() if x["session"] == session]
    (c,) = [c for c in listed["caches"] if c["name"] == "full"]
    assert m["shmcache_cache_puts_full_total"][cache_labels(server.port, session, c)] == refused


def test_metrics_without_a_server_fail_with_one_line(server):
    server.stop()
    r = server.admin("--metrics", check=False)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "error" in r.stderr


def test_metrics_file_is_replaced_whole_and_removed_at_stop(tmp_path, start_server):
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    path = textfile_dir / "shmcache.prom"
    s = start_server("--metrics_file", str(path), "--metrics_interval", "1")
    assert path.exists()                 # written before --start returned
    first = os.stat(path).st_ino
    session = s.new_session()
    c = DatasetCache(session, name="rows")
    for i in range(10):
        c.put(i, (np.arange(10),))

    def rows_in_file():
        # Each read must parse whole: a rewrite never shows half a file.
        m = parse(path.read_text())
        return [v for k, v in m.get("shmcache_cache_memory_rows", {}).items()
                if ("cache", "rows") in k]
    assert wait_for(lambda: rows_in_file() == [10], what="10 rows in the file")
    assert os.stat(path).st_ino != first     # renamed over, not rewritten in place
    assert sorted(os.listdir(textfile_dir)) == ["shmcache.prom"]
    s.stop()
    assert os.listdir(textfile_dir) == []


def test_a_link_at_the_metrics_file_path_is_replaced_not_followed(tmp_path, start_server):
    # The textfile dir is often shared (node_exporter's): whoever put a link
    # at the name gets it replaced by the server's own file, 0644 so that
    # node_exporter can read it; what the link pointed to is never written.
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("theirs\n")
    path = textfile_dir / "shmcache.prom"
    path.symlink_to(elsewhere)
    s = start_server("--metrics_file", str(path), "--metrics_interval", "1")
    assert not path.is_symlink() and path.is_file()
    assert os.stat(path).st_mode & 0o7777 == 0o644
    assert os.stat(path).st_uid == os.geteuid()
    assert "shmcache_" in path.read_text()
    assert elsewhere.read_text() == "theirs\n"
    s.stop()
    assert elsewhere.read_text() == "theirs\n"


@pytest.mark.parametrize("args, message", [
    (["--metrics_file", "relative.prom"], "not an absolute path"),
    (["--metrics_file", "/nonexistent-dir/shmcache.prom"], "does not exist"),
    (["--metrics_interval", "0"], "1..3600"),
])
def test_bad_metrics_file_options_fail_the_start(tmp_path, args, message):
    s = Server(tmp_path)
    r = s.admin("--start", *args, check=False)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert s.admin("--server_info", check=False).returncode == 1   # nothing runs


def test_a_metrics_file_name_with_no_room_for_its_temporary_file_fails_the_start(tmp_path):
    s = Server(tmp_path)
    path = tmp_path / ("m" * 250)
    r = s.admin("--start", "--metrics_file", str(path), check=False)
    assert r.returncode == 1, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "metrics file name has 250 bytes" in r.stderr, r.stderr
    assert s.admin("--server_info", check=False).returncode == 1   # nothing runs


def test_memory_held_by_a_reader_of_a_destroyed_session_is_a_metric(server, session):
    c = DatasetCache(session, name="held")
    for i in range(4):
        c.put(i, ROW)
    view = c.get(0, copy=False)          # this process maps the segment
    server.admin("-d", str(session))

    def metric_and_info():
        """The metric and --server_info, read one after the other, once
        they agree: -d returns before the daemon's scan of mapped files
        has settled what stays held (the preparer runs it, every 20 ms
        or later under load), so the two reads may straddle it."""
        held = parse(server.admin("--metrics").stdout)["shmcache_server_memory_held_bytes"]
        info = json.loads(server.admin("--server_info", "--json").stdout)
        (value,) = held.values()
        return (value, info) if value == info["memory_held_bytes"] else None
    value, info = wait_for(metric_and_info, what="the metric and --server_info to agree")
    assert value > 0
    assert info["memory_used_bytes"] >= value
    del view
    c.close()
    del c

    def held_now():
        m = parse(server.admin("--metrics").stdout)
        return list(m["shmcache_server_memory_held_bytes"].values()) == [0]
    wait_for(held_now, what="the held memory released once nothing maps it")


def test_the_admin_does_not_load_the_daemons_store():
    """--metrics must stay a few milliseconds: the admin links the metrics
    text and the --metrics_file check, not the Store and RocksDB (which
    tripled every admin command's start-up)."""
    r = subprocess.run(["readelf", "-d", str(ADMIN)], capture_output=True, text=True,
                       check=True)
    needed = [line for line in r.stdout.splitlines() if "(NEEDED)" in line]
    assert needed and not [n for n in needed if "rocksdb" in n], needed
