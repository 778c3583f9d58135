"""The run-wide leak check (conftest.py, leak_check.py): a test that leaves a
process, a server or its /dev/shm files behind errors at teardown, named
with what it left, and the leftovers are gone before the next test."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
import xml.etree.ElementTree as ET

import leak_check
from conftest import (BUILD, PYTHONPATH, ROOT, Server, _alive, _segments, free_port, host_lock,
                      wait_for)

INNER = '''
import subprocess, sys
from conftest import Server, _segments, host_lock
import leak_check

def test_leaks_a_child():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

def test_leaks_a_server(tmp_path):
    s = Server(tmp_path)
    s.start()
    with open(tmp_path / "leaked", "w") as f:
        f.write(f"{s.pid} {s.port}")

def test_after_the_leaks_nothing_is_left(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    pid, port = map(int, next(base.glob("test_leaks_a_server*/leaked")).read_text().split())
    state = leak_check._procs().get(pid, (0, "gone", ""))[1]
    assert state in ("gone", "Z")      # a zombie: init reaps it, or not, later
    assert not _segments(port)
    assert not leak_check.os.path.exists(host_lock(port))

def test_clean(server):
    server.kill()          # the fixture removes what a killed server left
'''


def test_a_test_that_leaks_errors_naming_what_it_left(tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    env = dict(os.environ, SHMCACHE_BUILD_DIR=str(BUILD),
               PYTHONPATH=os.pathsep.join([PYTHONPATH, str(ROOT / "tests" / "python")]),
               SHMCACHE_RUN_DIR=str(tmp_path / "run"))
    env.pop("SHMCACHE_TEST_SEED", None)     # the order above matters
    (tmp_path / "run").mkdir()
    # A short base temp dir: the servers' socket paths must fit in 107 bytes.
    base = tempfile.mkdtemp(prefix="shmcache-lk.")
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest",
                            "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                            "--basetemp", base + "/b", str(tmp_path / "test_inner.py")],
                           cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "4 passed, 2 errors" in out, out
    assert "ERROR at teardown of test_leaks_a_child" in out, out
    assert "test_inner.py::test_leaks_a_child left behind" in out, out
    assert "time.sleep(600)" in out, out
    assert "test_inner.py::test_leaks_a_server left behind" in out, out
    assert "shmcached server" in out and "/dev/shm entry" in out, out
    assert "ERROR at teardown of test_clean" not in out, out


def _gone(pid, within=10.0):
    """Whether process `pid` is dead (gone or a zombie) within `within` s: a
    SIGKILL takes effect when the process is next scheduled."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _cpp_run_check(tmp_path, script):
    """scripts/lib/leak_check_cpp.py --junit around `bash -c script`, as
    scripts/test.sh wraps the C++ suites: (exit status, the JUnit case)."""
    xml = tmp_path / "leftovers.xml"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "lib" / "leak_check_cpp.py"),
                        "--junit", str(xml), "the run left nothing behind", "--",
                        "bash", "-c", script],
                       capture_output=True, text=True, timeout=120)
    case = ET.parse(xml).getroot().find("testcase")
    assert case is not None and case.get("name") == "the run left nothing behind"
    return r.returncode, case, r.stdout


def test_the_cpp_run_check_passes_a_clean_run_with_its_exit_status(tmp_path):
    rc, case, out = _cpp_run_check(tmp_path, "exit 3")
    assert rc == 3, out                       # the suites' own verdicts count elsewhere
    assert case.find("failure") is None, out


def test_the_cpp_run_check_fails_on_a_process_or_shm_dir_left_and_removes_them(tmp_path):
    # Named as tests/support names a C++ test's shm dir under the check
    # (files.h, TaggedPrefix).
    shm = f"/dev/shm/shmcache-test.$SHMCACHE_LEAK_TAG.lkcpp{os.getpid()}"
    pid_file, made = tmp_path / "pid", tmp_path / "made"
    try:
        rc, case, out = _cpp_run_check(
            tmp_path, f"mkdir {shm}; echo {shm} >{made}; "
                      f"sleep 600 >/dev/null 2>&1 & echo $! >{pid_file}; exit 0")
        shm = made.read_text().strip()
        assert rc == 0, out
        failure = case.find("failure")
        assert failure is not None, out
        assert "sleep 600" in failure.get("message") and shm in failure.get("message"), out
        assert not os.path.exists(shm)
        pid = int(pid_file.read_text())
        assert _gone(pid), f"process {pid} still runs"
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_the_cpp_run_check_leaves_another_runs_shm_dirs(tmp_path):
    """Another run on the host (a C++ run under its own check, or one
    without a check) makes its tests' shm dirs while this run's check
    runs, and has no server in them yet (or none any more): they are not
    this run's leftovers. The check used to take every new shmcache-test*
    and shmcache-rel.* dir for its own and removed another run's test
    server's dir before that server started ('shared-memory directory ...
    is not writable: No such file or directory')."""
    others = [f"/dev/shm/shmcache-test.{os.getpid()}{tmp_path.name[-6:]}",
              f"/dev/shm/shmcache-rel.{os.getpid()}{tmp_path.name[-6:]}",
              f"/dev/shm/shmcache-test.0123456789abcdef.{os.getpid()}"]
    try:
        rc, case, out = _cpp_run_check(tmp_path, "mkdir " + " ".join(others))
        assert rc == 0, out
        assert case.find("failure") is None, out
        for d in others:
            assert os.path.isdir(d), f"{d} removed: {out}"
    finally:
        for d in others:
            shutil.rmtree(d, ignore_errors=True)


def test_the_clean_up_kills_no_process_given_a_leftovers_pid_since():
    """A pid the snapshot saw may go to another process before the clean-up
    (the host is shared, and pids wrap): a process whose start is not the
    one the snapshot saw is not killed, nor waited for."""
    import signal
    import leak_check
    p = subprocess.Popen(["sleep", "600"])
    try:
        start = leak_check._procs()[p.pid][2]
        leak_check.clean_up({("proc", p.pid, str(int(start) - 1)): "an ended process"})
        assert p.poll() is None, "a process that started later was killed"
        leak_check.clean_up({("proc", p.pid, start): "the process itself"})
        assert p.wait(timeout=20) == -signal.SIGKILL
    finally:
        p.kill()
        p.wait()


def _cpp_check_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "leak_check_cpp", ROOT / "scripts" / "lib" / "leak_check_cpp.py")
    cpp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpp)
    return cpp


def test_the_cpp_run_check_kills_no_process_given_a_tagged_pid_since():
    """The C++ run's check kills the processes that carry the run's tag; one
    given such a pid since (without the tag) is not killed."""
    import signal
    cpp = _cpp_check_module()
    p = subprocess.Popen(["sleep", "600"], env=dict(os.environ, SHMCACHE_LEAK_TAG="x"))
    try:
        # Until the child has exec'd, its environment is this process's.
        def tagged():
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                return b"SHMCACHE_LEAK_TAG=x" in f.read().split(b"\0")
        wait_for(tagged, what="the child's exec with its tag")
        cpp.kill_if_tagged(p.pid, b"SHMCACHE_LEAK_TAG=y")
        assert p.poll() is None, "a process without the run's tag was killed"
        cpp.kill_if_tagged(p.pid, b"SHMCACHE_LEAK_TAG=x")
        assert p.wait(timeout=20) == -signal.SIGKILL
    finally:
        p.kill()
        p.wait()


def test_the_cpp_run_check_blames_no_test_for_files_another_run_removes_meanwhile(
        tmp_path, monkeypatch):
    """Another run on the host kills a server of its own and removes what
    it left, host lock last, while this run's check looks at the files
    that appeared during its test. The check read the lock after that run
    had removed it, took the files for the test's (no lock naming another
    run's dir) and failed a test that made no server at all
    (protocol_messages_test, 'left behind .shmcache.0.55453.lock', 3 of 82
    tests in a run here beside a pytest run). Here the other run's removal
    comes just as the check reads the lock."""
    cpp = _cpp_check_module()
    port = free_port()
    files = [f"/dev/shm/shmcache.{os.getuid()}.{port}.sessions", host_lock(port)]
    read_lock = cpp.lock_run_dir

    def removed_by_its_run_first(p):
        for f in files:
            if os.path.lexists(f):
                os.unlink(f)
        return read_lock(p)

    monkeypatch.setattr(cpp, "lock_run_dir", removed_by_its_run_first)
    results = tmp_path / "results.jsonl"
    # The other run's server, killed: its files, a lock naming no run dir yet.
    monkeypatch.setattr(sys, "argv", [
        "leak_check_cpp.py", str(results), "a_test", "--",
        "sh", "-c", f": > {files[0]}; echo 1 > {files[1]}"])
    try:
        assert cpp.main() == 0, results.read_text()
        assert json.loads(results.read_text())["result"] == "OK"
    finally:
        for f in files:
            if os.path.lexists(f):
                os.unlink(f)


@contextlib.contextmanager
def _another_runs_server(tmp_path, port, before=None):
    """A server as another test run on the host starts it on `port` (which
    this run used before and handed back): its own run dir, outside this
    run's roots, watching that run's pytest (a process started here stands
    for it; then `before()` runs). Stopped, and the stand-in killed, when
    the block ends."""
    pytest_of_theirs = subprocess.Popen(["sleep", "600"])
    (tmp_path / "theirs").mkdir()
    theirs = Server(tmp_path / "theirs")
    theirs.port = port
    theirs.env.update(SHMCACHE_PORT=str(port), SHMCACHE_WATCH_PID=str(pytest_of_theirs.pid))
    try:
        if before is not None:
            before()
        theirs.start()
        yield theirs
    finally:
        theirs.stop()
        pytest_of_theirs.kill()
        pytest_of_theirs.wait()


def test_a_server_another_run_starts_on_a_port_this_run_used_is_not_this_runs(tmp_path):
    """Test runs on a host hand out the same ports (each walks a range from
    its pid; the C++ tests draw theirs at random): a port this run used and
    gave back may serve another run's server a test later. The check took
    that server and its /dev/shm files for the later test's leftovers,
    failed it, and removed the other run's files and host lock under its
    live server ('... seg ... does not exist', 'session ... was destroyed'
    in the other run; a third server could then start on the port)."""
    (tmp_path / "ours").mkdir()
    owner = leak_check.Owner([str(tmp_path / "ours")], str(ROOT))
    port = free_port()
    owner.ports.add(port)           # this run's, in an earlier test
    snaps = []
    with _another_runs_server(tmp_path, port, lambda: snaps.append(leak_check.snapshot(owner))) \
            as theirs:
        theirs.new_session()
        new = leak_check.leftovers(snaps[0], leak_check.snapshot(owner))
        assert not new, new


def test_what_a_stopped_server_leaves_is_not_another_servers_on_its_port(tmp_path,
                                                                         monkeypatch):
    """Server.stop removes what a killed server left on its port. Once this
    run's server has stopped, the port is free, and another run's server
    may start on it before that clean-up runs: its segments and host lock
    are not this server's to remove."""
    import shmcache
    (tmp_path / "ours").mkdir()
    ours = Server(tmp_path / "ours")
    ours.start()
    ours.admin("--stop")
    wait_for(lambda: not _alive(ours.pid), what="our server's stop")
    with _another_runs_server(tmp_path, ours.port) as theirs:
        session = theirs.new_session()
        files = set(_segments(theirs.port) + [host_lock(theirs.port)])
        ours.stop()                     # the fixture's clean-up, after the stop
        assert all(os.path.exists(f) for f in files), [
            f for f in files if not os.path.exists(f)]
        monkeypatch.setenv("SHMCACHE_PORT", str(theirs.port))
        monkeypatch.setenv("SHMCACHE_RUN_DIR", str(theirs.run_dir))
        with warnings.catch_warnings():
            warnings.simplefilter("error")      # a cache that is gone warns
            cache = shmcache.DatasetCache(session)
            assert cache.put(1, b"x")
            assert cache.get(1) == b"x"
            cache.close()
