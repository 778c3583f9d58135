"""Fixtures: a private shmcache daemon per test.

Each `server` runs on its own instance port (chosen from a range derived
from the pid, skipping ports whose segments exist), with a private run dir
and log dir, started by the built admin binary and stopped at teardown.
SHMCACHE_PORT / SHMCACHE_RUN_DIR point at it for the test and for the
processes it starts.

Three run-wide hooks:
- Leak check: after each test (its teardown included, and that of any
  module fixture it was the last user of), nothing of this run that the test
  made may be left: no process under pytest, no shmcached server, no
  /dev/shm/shmcache.* entry, no mount (leak_check.py says what counts as
  ours). A leftover is an error at the test's teardown naming it, and is
  killed or removed so that later tests start clean.
- Deadline: a test that runs past SHMCACHE_TEST_DEADLINE_S (900 s) fails
  with every thread's stack, instead of hanging the suite (deadline.py).
- Shuffle: SHMCACHE_TEST_SEED=N runs the modules, and the tests inside each
  module, in an order drawn from N (scripts/stress-tests.sh sets it).
"""

import contextlib
import fcntl
import glob
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import random

import pytest

import leak_check
# The per-test deadline's hooks (deadline.py says how).
from deadline import (pytest_configure, pytest_runtest_makereport,  # noqa: F401
                      pytest_runtest_protocol, pytest_unconfigure)

# Every server a test starts (shmcache --start reads this) stops by itself
# when this pytest process ends, even killed or crashed before its fixtures
# could stop it. This pytest's own pid, whatever the caller set: the pid of
# scripts/test.sh, or of a pytest that runs this one, outlives it.
os.environ["SHMCACHE_WATCH_PID"] = str(os.getpid())

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SHMCACHE_BUILD_DIR", ROOT / "build"))
ADMIN = BUILD / "clients" / "admin" / "shmcache"
PYTHONPATH = str(BUILD / "clients" / "python")

if PYTHONPATH not in sys.path:
    sys.path.insert(0, PYTHONPATH)

_ports = itertools.count(20000 + (os.getpid() % 1500) * 20)


def wait_for(cond, timeout=20.0, what="condition"):
    """Polls cond() until true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def huge_dir(port, uid=None):
    """Where a root server started without --shm_dir mounts its huge-page
    tmpfs (daemon/huge_tmpfs.h)."""
    return f"/dev/shm/shmcache.{os.getuid() if uid is None else uid}.{port}.huge"


def _segments(port, uid=None):
    """The instance's files in /dev/shm and in its huge-page tmpfs, and that
    mount's directory itself."""
    uid = os.getuid() if uid is None else uid
    return (glob.glob(f"/dev/shm/shmcache.{uid}.{port}.*") +
            glob.glob(f"{huge_dir(port, uid)}/shmcache.{uid}.{port}.*"))


def host_lock(port, uid=None):
    """The lock file that makes an instance one per (user, port) on a host."""
    return f"/dev/shm/.shmcache.{os.getuid() if uid is None else uid}.{port}.lock"


def release_huge_dir(port, uid=None):
    """Unmounts and removes what a killed server's huge-page tmpfs left."""
    d = huge_dir(port, uid)
    if os.path.isdir(d) and not os.path.islink(d):
        if os.path.ismount(d):
            subprocess.run(["umount", "-l", d], capture_output=True)
        try:
            os.rmdir(d)
        except OSError:
            pass


def remove_killed_instance(port, run_dirs_under):
    """Removes what a killed server of `port` whose run dir lies under
    `run_dirs_under` left: its segments, its huge-page tmpfs and its host
    lock file (a stopped server removes its files, the lock last). The port
    is free once that server is gone, and another test run on the host may
    start a server on it before this runs: whatever a live server holds,
    or a lock naming another run dir, is left alone. The host lock is held
    meanwhile, as a starting server would hold it, so that none starts on
    the port in between (one that tries moves on, as to a taken port)."""
    path = host_lock(port)
    made = False
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
            made = True
        except OSError:
            return          # a server is taking the port now
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st, now = os.fstat(fd), os.lstat(path)
        except OSError:
            return          # held by a live server, or replaced: not ours
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            return
        run_dir = "" if made else leak_check.lock_run_dir(fd)
        if run_dir and not leak_check.is_under(run_dir, run_dirs_under):
            return          # another run's killed server: that run removes it
        for f in _segments(port):
            try:
                os.unlink(f)
            except OSError:
                pass
        release_huge_dir(port)
        os.unlink(path)
    finally:
        os.close(fd)


def free_port():
    """An instance port no live server of this user holds, as far as the
    host shows now: no segments and no host lock file. Another test run on
    the host may still take it before our server starts (Server.start
    moves on to the next port then)."""
    for p in _ports:
        if p > 65535:
            break
        if not _segments(p) and not os.path.lexists(host_lock(p)):
            if _owner is not None:
                _owner.ports.add(p)
            return p
    raise RuntimeError("no free instance port")


def free_tcp_port():
    """A TCP port, free now, for a rendezvous that a child process binds
    later (torch.distributed's MASTER_PORT). Drawn below the kernel's
    ephemeral range (ip_local_port_range), so that no connect() or bind(0)
    on the host is handed it in between, as a port from bind(0) could be."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    first = 10000 if low > 11000 else 1024
    rng = random.Random(f"{os.getpid()}-{time.monotonic_ns()}")
    for _ in range(1000):
        port = rng.randrange(first, max(first + 1, low))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free TCP port below the ephemeral range")


class Server:
    def __init__(self, tmp):
        self.port = free_port()
        self.run_dir = tmp / "run"
        self.log_dir = tmp / "log"
        self.run_dir.mkdir()
        self.log_dir.mkdir()
        self.env = dict(os.environ, SHMCACHE_PORT=str(self.port),
                        SHMCACHE_RUN_DIR=str(self.run_dir),
                        PYTHONPATH=PYTHONPATH + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        SHMCACHE_BUILD_DIR=str(BUILD))
        self.pid = None

    def admin(self, *args, check=True):
        r = subprocess.run([str(ADMIN), "-p", str(self.port), *args], env=self.env,
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"shmcache {' '.join(args)} failed: {r.stderr}")
        return r

    def start(self, *args):
        """Starts the server. The port was free when free_port chose it, but
        other test runs on the host pick ports too: when one of theirs took
        it meanwhile, a first start moves on to another port (self.port and
        self.env follow). A restart never moves: it is to adopt what the
        server before it left on this port, so a refusal fails the test."""
        restart = self.pid is not None
        for _ in range(20):
            r = self.admin("--start", "--log_dir", str(self.log_dir), *args, check=False)
            if r.returncode == 0 or restart or "already running on port" not in r.stderr:
                break
            self.port = free_port()
            self.env["SHMCACHE_PORT"] = str(self.port)
        if r.returncode != 0:
            raise AssertionError(f"shmcache --start failed: {r.stderr}")
        self.pid = json.loads(self.admin("--server_info", "--json").stdout)["pid"]

    def new_session(self):
        return int(self.admin("-g").stdout.split()[-1])

    def sessions(self):
        return json.loads(self.admin("--list_sessions", "--json").stdout)

    def cache_rows(self, session):
        """{cache name: mem rows} of a session, as --list_sessions shows."""
        for s in self.sessions():
            if s["session"] == session:
                return {c.get("name", c.get("cache_id")): c for c in s["caches"]}
        return {}

    def kill(self):
        """kill -9 the daemon and wait until it is gone."""
        os.kill(self.pid, signal.SIGKILL)
        wait_for(lambda: not _alive(self.pid), what="daemon exit")

    def stop(self):
        if self.pid and _alive(self.pid):
            self.admin("--stop", check=False)
            try:
                wait_for(lambda: not _alive(self.pid), timeout=10, what="stop")
            except AssertionError:
                self.kill()
        remove_killed_instance(self.port, str(self.run_dir))


@contextlib.contextmanager
def undone_at_end(script, *args):
    """Runs the shell `script` (`args` are its $1...) when the block ends,
    or when this pytest dies in it, SIGKILL included: what a test changes
    on the host (a mount, a cgroup) must not outlive it. A guard of its own
    session (a group kill of pytest spares it) waits for a line on a pipe
    this process holds, or for its end; children forked meanwhile hold it
    too, so after a death the script runs once they have ended too. Start
    it before making the change: the script runs even if nothing was made."""
    guard = subprocess.Popen(["sh", "-c", f"read _; {script}", "sh", *args],
                             stdin=subprocess.PIPE, start_new_session=True)
    try:
        yield
    finally:
        try:
            guard.stdin.write(b"\n")
            guard.stdin.close()
        except OSError:
            pass
        guard.wait(timeout=60)


def continued_after(pid):
    """Whatever stops process `pid` (SIGSTOP) in the block, it runs again
    (SIGCONT) when the block ends, or when this pytest dies in it: a stopped
    server cannot see that the process it watches is gone."""
    return undone_at_end('kill -CONT "$1" 2>/dev/null; exit 0', str(pid))


def stopped(pid):
    """Whether every thread of `pid` is stopped (SIGSTOP takes each in
    turn: kill() returns before a thread running on another CPU has
    stopped, and such a thread could still answer a request)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass
    return bool(states) and all(s == "T" for s in states)


def own_shm_dir(undo, tag):
    """/dev/shm/shmcache-test-<pytest pid>-<tag> (the prefix leak_check
    counts as this run's), made now; removed when the ExitStack `undo`
    closes, or when this pytest dies."""
    d = Path(f"/dev/shm/shmcache-test-{os.getpid()}-{tag}")
    undo.enter_context(undone_at_end('rm -rf "$1"', str(d)))
    d.mkdir()
    return d


def node_server(undo, tmp, node, tag, servers):
    """Starts the server of simulated node `node` of a multi-node test: its
    own /dev/shm dir (`own_shm_dir(undo, f"{tag}{node}")`), its run dir
    tmp/node<node>; appended to `servers` before it starts, so the caller's
    cleanup stops it whatever happens next. Returns (server, a new
    session's id)."""
    shm_dir = own_shm_dir(undo, f"{tag}{node}")
    (tmp / f"node{node}").mkdir()
    s = Server(tmp / f"node{node}")
    s.shm_dir = shm_dir
    servers.append(s)
    s.start("--shm_dir", str(shm_dir))
    return s, s.new_session()



def run_ranks(argv, envs, timeout):
    """Runs `argv` once per env (the ranks of a job, each with its
    RANK...); fails, killing the others, when one fails or when they are
    not all done within `timeout` s. Returns each rank's output (stdout and
    stderr)."""
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for env in envs]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        outputs = [p.communicate()[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} failed (rc {p.returncode}):\n{out}"
    return outputs

# Execs argv[1:] once the kernel will SIGKILL it when the thread that
# forked it ends (PR_SET_PDEATHSIG, kept across exec); exits at once when
# its parent is gone already.
_DIES_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit(137)
os.execv(sys.argv[2], sys.argv[2:])
"""


def inner_pytest(tmp_path, source, **env):
    """Starts a pytest of its own on the test module `source` (with this
    conftest, `env` added to the environment): (its Popen, output piped;
    its base temp dir, short, as a server's socket path must fit in 107
    bytes, for the caller to remove). It is SIGKILLed when this pytest
    dies, however: the inner tests wait to be killed, and an orphan would
    hold its servers and changes for good (they end with it, as the inner
    tests check)."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(source))
    env = dict(os.environ, SHMCACHE_BUILD_DIR=str(BUILD),
               PYTHONPATH=os.pathsep.join([PYTHONPATH, str(ROOT / "tests" / "python")]),
               **env)
    env.pop("SHMCACHE_TEST_SEED", None)
    base = tempfile.mkdtemp(prefix="shmcache-in.")
    inner = subprocess.Popen(
        [sys.executable, "-c", _DIES_WITH_PARENT, str(os.getpid()),
         sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "--basetemp", base + "/b",
         str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return inner, base


def _alive(pid):
    """Whether a thread of `pid` can still run (as the product's
    ProcessGone says): a killed process's leader turns zombie before its
    other threads have exited, and they hold its files and locks."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    return fields["State"].split()[0] not in ("Z", "X") or int(fields["Threads"]) > 1


@pytest.fixture
def start_server(tmp_path, monkeypatch):
    """start_server(*args): starts a server with extra `shmcache --start`
    arguments (e.g. "--memory_cap_mb", "64") and points the test at it."""
    assert ADMIN.exists(), f"build the project first: {ADMIN} is missing"
    servers = []

    def start(*args):
        d = tmp_path / f"server{len(servers)}"
        d.mkdir()
        s = Server(d)
        servers.append(s)
        s.start(*args)
        monkeypatch.setenv("SHMCACHE_PORT", str(s.port))
        monkeypatch.setenv("SHMCACHE_RUN_DIR", str(s.run_dir))
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def server(start_server):
    return start_server()


@pytest.fixture
def session(server):
    return server.new_session()


@pytest.fixture
def spill_server(tmp_path, monkeypatch):
    """A server with a spill dir (its own port and run dir)."""
    (tmp_path / "srv").mkdir()
    (tmp_path / "spill").mkdir()
    s = Server(tmp_path / "srv")
    try:
        s.start("-s", str(tmp_path / "spill"))
    except BaseException:
        s.stop()
        raise
    monkeypatch.setenv("SHMCACHE_PORT", str(s.port))
    monkeypatch.setenv("SHMCACHE_RUN_DIR", str(s.run_dir))
    yield s
    s.stop()



@pytest.fixture
def small_tmpfs_of(tmp_path):
    """small_tmpfs_of(size) mounts a tmpfs of `size` (mount's size=, e.g.
    "24m") at a fresh dir under tmp_path and returns the dir; unmounted
    after the test, or when this pytest dies (the memory its files hold
    would stay taken until someone unmounted it). Skips without root or
    where mounting is refused."""
    made = []
    with contextlib.ExitStack() as unmounts:
        def mount(size):
            if os.geteuid() != 0:
                pytest.skip("needs root to mount a small tmpfs")
            d = tmp_path / f"shm{len(made)}"
            d.mkdir()
            made.append(d)
            unmounts.enter_context(undone_at_end('umount -l "$1" 2>/dev/null', str(d)))
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700",
                                "tmpfs", str(d)], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
            return d

        yield mount

# ---- Shuffled order --------------------------------------------------------

def pytest_report_header(config):
    seed = os.environ.get("SHMCACHE_TEST_SEED")
    return f"shmcache test order: shuffled, SHMCACHE_TEST_SEED={seed}" if seed else None


def pytest_collection_modifyitems(session, config, items):
    """With SHMCACHE_TEST_SEED set, shuffles the modules and the tests in
    each module (a module stays together, so its module-scoped fixtures are
    made once)."""
    seed = os.environ.get("SHMCACHE_TEST_SEED")
    if not seed:
        return
    rng = random.Random(int(seed))
    modules = {}
    for item in items:
        modules.setdefault(item.module.__name__ if item.module else "", []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for g in groups:
        rng.shuffle(g)
    items[:] = [item for g in groups for item in g]


# ---- Leak check ------------------------------------------------------------

_owner = None
_before = pytest.StashKey[dict]()
# Leftovers held by a higher-scoped fixture still in use when the test that
# first showed them ended: {key: (description, fixture defs, test id)}.
_held = {}


def pytest_sessionstart(session):
    global _owner
    base = session.config._tmp_path_factory.getbasetemp()
    _owner = leak_check.Owner([str(base), os.environ.get("SHMCACHE_RUN_DIR", "")],
                              str(ROOT))


def _drop_torch_sigchld_handler():
    """torch's DataLoader installs, once per process, a SIGCHLD handler that
    raises a dead worker's report in the main thread at whatever runs there
    until its loader unregisters the worker. In one pytest process that may
    be the next test, or pytest's own report of a failure (an INTERNALERROR
    that ends the whole suite). Each test starts and leaves with the default
    handler; a DataLoader in the test installs torch's again, as in a
    process of its own."""
    sh = sys.modules.get("torch.utils.data._utils.signal_handling")
    if sh is not None and getattr(sh, "_SIGCHLD_handler_set", False):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sh._SIGCHLD_handler_set = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _drop_torch_sigchld_handler()
    try:
        yield
    finally:
        _drop_torch_sigchld_handler()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_before] = leak_check.snapshot(_owner)
    yield


def _live_wider_fixtures(item):
    """The module/class/session-scoped fixture defs of item still set up
    (pytest's own, like tmp_path_factory, hold nothing of ours)."""
    live = []
    for defs in item._fixtureinfo.name2fixturedefs.values():
        for fd in defs:
            if (fd.scope != "function" and fd.cached_result is not None and
                    not getattr(fd.func, "__module__", "").startswith("_pytest")):
                live.append(fd)
    return live


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    before = item.stash.get(_before, None)
    if before is None:
        return
    after = leak_check.snapshot(_owner)
    new = leak_check.leftovers(before, after)
    leaks = []
    # What a wider fixture held: a leak once that fixture is torn down.
    for key, (desc, fds, who) in list(_held.items()):
        if all(fd.cached_result is None for fd in fds):
            del _held[key]
            if key in after:
                names = ", ".join(sorted(fd.argname for fd in fds))
                leaks.append((key, f"{desc} (made while {who} ran, kept by "
                                   f"fixture {names} after its teardown)"))
    if new:
        live = _live_wider_fixtures(item)
        new = leak_check.still_there(_owner, new)
        for key, desc in new.items():
            if live:
                _held[key] = (desc, live, item.nodeid)
            else:
                leaks.append((key, desc))
    if leaks:
        leak_check.clean_up(dict(leaks))
        raise AssertionError(
            f"{item.nodeid} left behind (now removed):\n" +
            "\n".join(f"  {d}" for _, d in leaks))
