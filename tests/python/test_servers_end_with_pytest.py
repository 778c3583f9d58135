"""A server a test starts ends with the pytest that runs it, even when that
pytest is SIGKILLed before its fixtures can stop it, and even when the test
had stopped the server (SIGSTOP) then. Here a pytest run inside this one
starts the server and is killed; the server must be gone within a bound.
That inner pytest itself ends with the pytest that started it."""

import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import _alive, inner_pytest, remove_killed_instance, wait_for

INNER = '''
import os, signal
from pathlib import Path
from conftest import continued_after

def test_holds_a_server(server):
    with continued_after(server.pid):
        if os.environ["STOP_SERVER"] == "1":
            os.kill(server.pid, signal.SIGSTOP)
        # Whole or not there: the outer test reads it once it exists.
        written = Path(os.environ["SERVER_FILE"] + ".part")
        written.write_text(f"{server.pid} {server.port}")
        written.replace(os.environ["SERVER_FILE"])
        while True:
            signal.pause()      # until killed
'''


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return "gone"


def _ends_with(owner, pid, what):
    """SIGKILLs the Popen `owner`; process `pid` must end within a bound."""
    owner.kill()
    owner.wait(timeout=60)
    wait_for(lambda: not _alive(pid), timeout=30, what=what)


def _killed(owner, pidfd, pid):
    """The clean-up's: SIGKILLs the Popen `owner` and reads what is left of
    its output; then, where `pidfd` was opened (while process `pid` surely
    ran), SIGKILLs `pid` through it if it still runs, waits for its end and
    closes `pidfd`."""
    owner.kill()
    owner.communicate(timeout=60)
    if pidfd is None:
        return
    if _alive(pid):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), what=f"the end of killed process {pid}")
    os.close(pidfd)


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
def test_a_server_ends_with_the_pytest_that_started_it(tmp_path, stopped):
    server_file = tmp_path / "server"
    inner, base = inner_pytest(tmp_path, INNER, SERVER_FILE=str(server_file),
                               STOP_SERVER="1" if stopped else "0")
    pidfd = None
    port = None
    try:
        wait_for(lambda: server_file.exists() or inner.poll() is not None, timeout=120,
                 what="the inner pytest's server")
        assert server_file.exists(), inner.communicate(timeout=60)[0]
        pid, port = map(int, server_file.read_text().split())
        pidfd = os.pidfd_open(pid)      # while it surely runs: the cleanup's
        if stopped:
            wait_for(lambda: _state(pid) == "T", what="the server stopped")
        _ends_with(inner, pid, f"the end of server {pid}, whose pytest was killed")
    finally:
        _killed(inner, pidfd, pid)
        if port is not None:
            remove_killed_instance(port, base)
        shutil.rmtree(base, ignore_errors=True)


# A process that runs an inner pytest, as the tests above do, and waits.
OUTER = '''
import sys, signal
from pathlib import Path
from conftest import inner_pytest
inner, base = inner_pytest(Path(sys.argv[1]), sys.argv[2], STARTED_FILE=sys.argv[3])
print(inner.pid, base, flush=True)
while True:
    signal.pause()      # until killed
'''

WAITS = '''
import os, signal
from pathlib import Path

def test_waits_to_be_killed():
    Path(os.environ["STARTED_FILE"]).touch()
    while True:
        signal.pause()
'''


def test_an_inner_pytest_ends_with_the_pytest_that_started_it(tmp_path):
    """The inner pytest of the tests above waits to be killed: one whose
    outer pytest is SIGKILLed (a CI timeout) must not live on, holding its
    server."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [here, os.environ.get("PYTHONPATH", "")]))
    started = tmp_path / "started"
    (tmp_path / "inner").mkdir()
    outer = subprocess.Popen([sys.executable, "-c", OUTER, str(tmp_path / "inner"), WAITS,
                              str(started)], env=env, stdout=subprocess.PIPE, text=True)
    pidfd = None
    base = None
    try:
        line = outer.stdout.readline()
        assert line, "the outer process printed nothing"
        pid, base = line.split()
        pid = int(pid)
        pidfd = os.pidfd_open(pid)      # while it surely runs: the cleanup's
        wait_for(lambda: started.exists() or not _alive(pid), timeout=120,
                 what="the inner pytest's test")
        assert started.exists(), "the inner pytest ended before its test ran"
        _ends_with(outer, pid, f"the end of inner pytest {pid}, whose outer one was killed")
    finally:
        _killed(outer, pidfd, pid)
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
