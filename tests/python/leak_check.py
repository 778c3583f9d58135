"""What this test run owns on the host, and what a test left behind.

conftest.py takes a snapshot before each test and compares it with one
taken after the test's teardown: anything of ours that appeared and is
still there (a process under pytest, a shmcached server, a /dev/shm file
or directory, a mount) leaked, and is killed or removed so that later
tests do not inherit it.

Other engineers and users run servers and tests on the same host at the
same time, so only what this run made counts:
- processes: descendants of the pytest process;
- servers: shmcached processes that descend from pytest, or whose run, log
  or shm dir lies under one of our roots (pytest's base temp dir, the
  SHMCACHE_RUN_DIR this run was started with), or this tree's shmcached
  serving a port this run handed out and watching no other pid than ours;
- /dev/shm entries and mounts: those of an instance port one of our servers
  serves, or whose host lock names one of our servers' run dirs, or names
  none and this run handed the port out (conftest.free_port); and the
  shmcache-test-<pytest pid>-* directories tests make for --shm_dir. Runs
  on a host share ports: one this run gave back may serve another run's
  server in a later test, which its lock tells.
A snapshot is one /proc scan plus one /dev/shm listing: cheap per test.
"""

import os
import re
import shutil
import signal
import subprocess
import time
from typing import Dict, Iterable, List, Set, Tuple

# Key -> human description. Keys are ("proc", pid, start time),
# ("file", path) or ("mount", path).
Snapshot = Dict[tuple, str]

# Helper processes multiprocessing starts once and keeps for the life of
# the interpreter: not a test's leak.
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker",
                        "multiprocessing.forkserver",
                        "multiprocessing.semaphore_tracker")

_SHM_NAME = re.compile(r"^\.?shmcache\.(\d+)\.(\d+)\.")


def is_under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


class Owner:
    """What identifies this run's things: pytest's pid, root dirs, ports,
    and the run dirs of the servers seen as ours."""

    def __init__(self, roots: Iterable[str], tree: str):
        self.pid = os.getpid()
        self.roots = [os.path.realpath(r) for r in roots if r]
        self.tree = os.path.realpath(tree)
        self.ports: Set[int] = set()
        self.run_dirs: Set[str] = set()

    def under_roots(self, path: str) -> bool:
        return any(is_under(path, r) for r in self.roots)

    def owns_run_dir(self, path: str) -> bool:
        return self.under_roots(path) or os.path.realpath(path) in self.run_dirs


def lock_run_dir(lock) -> str:
    """The run dir that a host lock names (its second line, after the
    holder's identity: common/instance_lock.cc), or "" when it names none
    (yet) or cannot be read. `lock`: its path, or a descriptor open on it."""
    if isinstance(lock, int):
        try:
            text = os.pread(lock, 8192, 0)
        except OSError:
            text = b""
    else:
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            return lock_run_dir(fd)
        finally:
            os.close(fd)
    lines = text.decode(errors="replace").split("\n")
    # A line counts once its newline is written.
    return lines[1] if len(lines) > 2 else ""


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _procs() -> Dict[int, Tuple[int, str, str]]:
    """{pid: (ppid, state, start time)} of every process on the host."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat").decode(errors="replace")
        if not stat:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        # fields[0] is field 3 (state); ppid is field 4, starttime field 22.
        out[int(name)] = (int(fields[1]), fields[0], fields[19])
    return out


def _cmdline(pid: int) -> List[str]:
    return [a.decode(errors="replace") for a in _read(f"/proc/{pid}/cmdline").split(b"\0") if a]


def _environ(pid: int) -> Dict[str, str]:
    env = {}
    for kv in _read(f"/proc/{pid}/environ").split(b"\0"):
        k, sep, v = kv.decode(errors="replace").partition("=")
        if sep:
            env[k] = v
    return env


def _option(cmd: List[str], name: str) -> str:
    """The value of --name=V or --name V in a command line, or ""."""
    for i, a in enumerate(cmd):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}" and i + 1 < len(cmd):
            return cmd[i + 1]
    return ""


def snapshot(owner: Owner) -> Snapshot:
    snap: Snapshot = {}
    procs = _procs()
    children: Dict[int, List[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    descendants: Set[int] = set()
    todo = list(children.get(owner.pid, []))
    while todo:
        p = todo.pop()
        descendants.add(p)
        todo.extend(children.get(p, []))
    shm_dirs: Set[str] = set()
    live_ports: Set[int] = set()
    for pid, (_, state, start) in procs.items():
        if state == "Z":
            continue        # exited; its parent's Popen reaps it
        cmd = _cmdline(pid)
        if not cmd:
            continue        # gone, or a kernel thread
        is_server = os.path.basename(cmd[0]) == "shmcached"
        env = _environ(pid) if is_server else {}
        run_dir = env.get("SHMCACHE_RUN_DIR", "") or _option(cmd, "run_dir")
        if pid in descendants:
            if any(h in " ".join(cmd) for h in _INTERPRETER_HELPERS):
                continue
        elif is_server:
            dirs = [run_dir, _option(cmd, "log_dir"), _option(cmd, "shm_dir")]
            port = _option(cmd, "port")
            # A server in a dir of its own (slurm's tests make theirs with
            # mkdtemp) is ours by its port, when it is this tree's binary
            # and watches no other process than this pytest: another run
            # of this tree may serve a port this run used before.
            watch = _option(cmd, "watch_pid")
            by_port = (port.isdigit() and int(port) in owner.ports and
                       watch in ("", str(owner.pid)) and
                       os.path.realpath(cmd[0]).startswith(owner.tree + os.sep))
            if not by_port and not any(d and owner.under_roots(d) for d in dirs):
                continue
        else:
            continue
        if is_server:
            port = _option(cmd, "port")
            if port.isdigit():
                owner.ports.add(int(port))
                live_ports.add(int(port))
            if run_dir:
                owner.run_dirs.add(os.path.realpath(run_dir))
            if _option(cmd, "shm_dir"):
                shm_dirs.add(os.path.realpath(_option(cmd, "shm_dir")))
        kind = "shmcached server" if is_server else "process"
        snap[("proc", pid, start)] = f"{kind} {pid} ({' '.join(cmd)[:200]})"

    def ours(m) -> bool:
        """Whether the instance of a /dev/shm name `m` matched is ours: one
        of our servers serves its port, or its host lock names a run dir of
        ours, or names none (what a killed server left, the lock removed
        first, or a lock still being written) and we handed out the port.
        Test runs on a host share ports: one we used and gave back may
        serve another run's server since, whose lock names its run dir."""
        port = int(m.group(2))
        if port in live_ports:
            return True
        run_dir = lock_run_dir(f"/dev/shm/.shmcache.{m.group(1)}.{port}.lock")
        return owner.owns_run_dir(run_dir) if run_dir else port in owner.ports

    test_prefix = f"shmcache-test-{owner.pid}-"
    for name in os.listdir("/dev/shm"):
        m = _SHM_NAME.match(name)
        if (m and ours(m)) or name.startswith(test_prefix):
            path = f"/dev/shm/{name}"
            snap[("file", path)] = f"/dev/shm entry {path}"
    for line in _read("/proc/self/mounts").decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        mnt = parts[1].replace("\\040", " ")
        m = _SHM_NAME.match(os.path.basename(mnt))
        if ((m and ours(m)) or
                os.path.basename(mnt).startswith(test_prefix) or
                os.path.realpath(mnt) in shm_dirs):
            snap[("mount", mnt)] = f"mount {mnt}"
    return snap


def leftovers(before: Snapshot, after: Snapshot) -> Snapshot:
    return {k: v for k, v in after.items() if k not in before}


def still_there(owner: Owner, things: Snapshot, grace: float = 5.0) -> Snapshot:
    """Those of `things` that are still there once `grace` seconds passed
    without them going (a process may be on its way out after SIGTERM);
    returns as soon as none is left."""
    deadline = time.monotonic() + grace
    while True:
        now = snapshot(owner)
        left = {k: v for k, v in things.items() if k in now}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _kill_if_same(pid: int, start: str) -> bool:
    """SIGKILLs `pid` while it is the process that started at `start` (what
    the snapshot saw): held by a pidfd before its start is read, and killed
    through it, so that a pid given to another process since (the host is
    shared; pids wrap) is never killed. By number right after the same
    check where there is no pidfd (Linux < 5.3). Whether it was sent."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        fd = -1
    try:
        if _read(f"/proc/{pid}/stat").decode(errors="replace").rsplit(
                ")", 1)[-1].split()[19:20] != [start]:
            return False
        if fd >= 0:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def clean_up(things: Snapshot) -> None:
    """Kills the processes, unmounts the mounts, removes the files."""
    pids = [k[1] for k in things if k[0] == "proc" and _kill_if_same(k[1], k[2])]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        procs = _procs()
        if not any(p in procs and procs[p][1] != "Z" for p in pids):
            break
        time.sleep(0.02)
    for k in things:
        if k[0] == "mount":
            subprocess.run(["umount", "-l", k[1]], capture_output=True)
    for k in things:
        if k[0] == "file":
            path = k[1]
            if os.path.isdir(path) and not os.path.islink(path):
                if not os.path.ismount(path):
                    shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
