"""A trainer (CachedLoader, two DataLoader workers) whose cache server
goes away between two epochs and is started again before a later one:
stopped (`shmcache --stop`, which ends the sessions: a new one is
created, as a user would), or killed (SIGKILL: `--start` adopts the
caches, the session lives on). Training never breaks and every batch is
DataLoader's (checked in restart_trainer.py).
- Stopped: one CacheWarning saying the session is gone and the cache is
  bypassed; the run reads from the source to its end, the new session is
  not one it knows (its rows are cached by the next run, given that id).
- Killed: no warning; hits are served while the server is down, and the
  restarted server takes the rows of the epoch after it (the client's
  connection to the killed one is replaced on its first request).
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import continued_after, stopped, wait_for

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
N = 64   # restart_trainer.py's samples: epochs 0-2 read the first half


def run_trainer(server, session, down, up, tmp_path):
    """Runs restart_trainer.py, calling down() after its epoch 1 and up()
    after its epoch 2; returns its JSON result."""
    env = dict(server.env, PYTHONPATH=HERE + os.pathsep + server.env["PYTHONPATH"])
    err_path = tmp_path / "trainer.err"
    with open(err_path, "w") as err:
        trainer = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "restart_trainer.py"), str(session)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        for k, then in enumerate([None, down, up, None, None]):
            line = trainer.stdout.readline()
            assert line == f"epoch {k}\n", (line, err_path.read_text())
            if then is not None:
                then()
            if k < 4:
                trainer.stdin.write("\n")
                trainer.stdin.flush()
        out = trainer.stdout.read()
        assert trainer.wait(timeout=120) == 0, err_path.read_text()
        return json.loads(out)
    finally:
        trainer.kill()
        trainer.wait()


def test_a_server_stopped_and_started_again_leaves_the_run_on_its_source(server, session,
                                                                        tmp_path):
    again = []

    def restart():
        server.pid = None
        server.start()
        again.append(server.new_session())

    result = run_trainer(server, session, server.stop, restart, tmp_path)
    said = result["warnings"]
    assert len(said) == 1, said
    assert f"session {session}" in said[0] and "shmcache --stop" in said[0], said
    assert "bypassed" in said[0] and "read from the source" in said[0], said
    half = N // 2
    assert result["counts"] == [[0, half], [half, half], None, None, None]
    assert server.cache_rows(again[0]) == {}, "the run put into a session it never knew"


def test_a_server_killed_and_started_again_takes_the_next_epochs_rows(server, session,
                                                                     tmp_path):
    def restart():
        server.start()

    result = run_trainer(server, session, server.kill, restart, tmp_path)
    assert result["warnings"] == []
    half = N // 2
    # Epoch 2 (server down) all hits; epoch 3 puts the second half into the
    # restarted server; epoch 4 finds every row.
    assert result["counts"] == [[0, half], [half, half], [2 * half, half],
                                [3 * half, 2 * half], [5 * half, 2 * half]]
    cached = server.cache_rows(session)
    assert [c["mem_cached"] for c in cached.values()] == [N], cached


# The trainer's put needs a chunk, and the server is killed while it has
# the request (stopped first, so that it reads nothing): the lease may have
# been granted, so it is not asked again of the restarted server.
# The test kills the server once it sees the client wait for the answer; on
# a loaded host that can take longer than the default 5 s request timeout,
# after which the client would take the stopped server for a hung one (a
# case of its own: stopped_daemon_test.cc) and the kill would come too
# late. The cache's connection is made with a timeout no test run reaches,
# before its first request.
PUT_SCRIPT = """
import json, sys, warnings
import numpy as np
from shmcache import CacheWarning, Client, DatasetCache
cache = DatasetCache(int(sys.argv[1]), size_mb=16)
cache._client = Client(timeout_ms=3_600_000)
first = np.full(1 << 20, 7, dtype=np.uint8)
assert cache.put(0, first)
print("put", flush=True)
sys.stdin.readline()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    stored = cache.put(1, np.full(5 << 19, 9, dtype=np.uint8))   # past its chunk
    print("asked", flush=True)
    sys.stdin.readline()
    got = cache.get(0)
    later = cache.put(2, np.full(1000, 3, dtype=np.uint8))
said = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
print(json.dumps({"stored": stored, "later": later, "warnings": said,
                  "hit": got is not None and bool(np.array_equal(got, first)),
                  "miss": cache.get(1) is None}), flush=True)
"""

# The system calls a client waits for an answer in, by machine: poll
# (ppoll on aarch64), then recvmsg (lib/connection.cc).
WAITS = {"x86_64": {"7", "271", "47"}, "aarch64": {"73", "212"}}


def waits_for_an_answer(pid):
    """Whether a thread of `pid` waits for an answer (in poll or recvmsg)."""
    waits = WAITS[os.uname().machine]
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                if f.read().split()[0] in waits:
                    return True
        except (OSError, IndexError):
            pass
    return False


@pytest.mark.skipif(os.uname().machine not in WAITS, reason="system call numbers unknown")
def test_a_put_whose_lease_the_killed_server_had_is_read_from_the_source(server, session,
                                                                          tmp_path):
    script = tmp_path / "put.py"
    script.write_text(PUT_SCRIPT)
    err_path = tmp_path / "put.err"
    with open(err_path, "w") as err:
        p = subprocess.Popen([sys.executable, str(script), str(session)], env=server.env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                             text=True)
    try:
        with continued_after(server.pid):
            assert p.stdout.readline() == "put\n", err_path.read_text()
            os.kill(server.pid, signal.SIGSTOP)
            wait_for(lambda: stopped(server.pid), what="the server stopped")
            p.stdin.write("\n")
            p.stdin.flush()
            wait_for(lambda: waits_for_an_answer(p.pid), what="the lease asked")
            server.kill()
        assert p.stdout.readline() == "asked\n", err_path.read_text()
        server.start()
        p.stdin.write("\n")
        p.stdin.flush()
        out = p.stdout.read()
        assert p.wait(timeout=120) == 0, err_path.read_text()
        result = json.loads(out)
    finally:
        p.kill()
        p.wait()
    assert result["stored"] is False and result["later"] is False, result
    assert result["hit"] and result["miss"], result
    assert len(result["warnings"]) == 1, result
    assert "closed the connection before it answered" in result["warnings"][0], result
    assert "new rows are not cached, cached rows are still served" in \
        result["warnings"][0], result
    rows = server.cache_rows(session)
    assert [c["mem_cached"] for c in rows.values()] == [1], rows
