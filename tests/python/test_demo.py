"""scripts/demo.sh, README's first command, run as a new user runs it: it
exits 0 and leaves nothing behind (no process, no shared-memory file, no run
dir or log of its servers, no temporary file)."""

import os
import re
import signal
import subprocess

import pytest

from conftest import ROOT, _segments, free_port, host_lock

DEMO = ROOT / "scripts" / "demo.sh"


def _session_processes(sid):
    out = subprocess.run(["ps", "-e", "-o", "pid=,sid="], capture_output=True,
                         text=True, check=True).stdout
    return [int(p) for p, s in (line.split() for line in out.splitlines()) if int(s) == sid]


def test_the_demo_exits_0_and_leaves_nothing_behind(tmp_path):
    build = os.environ.get("SHMCACHE_BUILD_DIR")
    if build and os.path.realpath(build) != os.path.realpath(ROOT / "build"):
        pytest.skip("the demo builds and runs build/; this run tests another build dir")
    port = free_port()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SHMCACHE_") and k not in ("SESSION_ID", "PYTHONPATH")}
    # The demo's own choices, as on a fresh machine: no run dir given.
    env.update(SHMCACHE_PORT=str(port), TMPDIR=str(tmp))
    p = subprocess.Popen(["bash", str(DEMO)], cwd="/", env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, out[-3000:]
    assert "one copy, not 4" in out, out[-3000:]
    logs = re.findall(r"Logs: (\S+)", out)
    assert len(logs) == 2, out[-3000:]            # its two servers
    assert [log for log in logs if os.path.lexists(log)] == []
    assert [d for d in {os.path.dirname(os.path.dirname(log)) for log in logs}
            if os.path.lexists(d)] == []          # their run dirs
    assert _session_processes(p.pid) == []
    assert not _segments(port) and not os.path.lexists(host_lock(port))
    assert sorted(os.listdir(tmp)) == []
