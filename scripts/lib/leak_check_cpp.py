"""Runs one meson test and checks that it left nothing behind.

    leak_check_cpp.py RESULTS.jsonl NAME -- COMMAND...
    leak_check_cpp.py --junit RESULTS.xml NAME -- COMMAND...

Runs COMMAND with SHMCACHE_LEAK_TAG=<unique> in its environment, which
every process it starts inherits. Afterwards, what counts as left behind:
- a live process carrying that tag (a daemon or child the test forgot);
- a /dev/shm entry of the kinds the tests make (see shm_entries) that
  appeared while the test ran, is still there (two looks 0.1 s apart agree,
  within 5 s: another run may be removing what a server it killed left)
  and is not in use by a server (its port or
  --shm_dir) that is not the test's own, live at the end or seen while the
  test ran, nor of a port whose host lock names a run dir this run's tests
  did not make. The shm dirs the tests make carry the tag in their name
  (tests/support/files.h, TaggedPrefix): another run's, made while this
  one ran and not served yet (or no more), is not taken for a leftover.
Both are reported, then killed or removed. Appends one JSON line
{"name", "result": "OK"|"FAIL", "why"} to RESULTS.jsonl and exits non-zero
when the test failed or leaked. Used by scripts/stress-tests.sh, a test at
a time.

With --junit, COMMAND is a whole run whose cases are counted elsewhere
(scripts/test.sh wraps the C++ suites in it): RESULTS.xml gets one JUnit
case NAME that fails only when something was left behind, and the exit
status is COMMAND's.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET

SHM = "/dev/shm"
_PORT = re.compile(r"^\.?shmcache\.\d+\.(\d+)\.")


def processes():
    """{pid: (state, cmdline list, environ bytes)} of live processes."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[-1].split()[0]
            if state == "Z":
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if cmd:
            out[int(name)] = (state, cmd, env)
    return out


def option(cmd, name):
    for i, a in enumerate(cmd):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}" and i + 1 < len(cmd):
            return cmd[i + 1]
    return ""


# What the C++ tests' daemons make in /dev/shm: instance files and host
# locks (shmcache.<uid>.<port>.*, .shmcache.<uid>.<port>.lock), told from
# other runs' by the servers that use them (see main).
_INSTANCE = re.compile(r"^\.?shmcache\.\d+\.\d+\.")


def shm_entries(tag):
    """The entries of /dev/shm the tests make: instance files and host
    locks, and the temporary shm dirs tests/support makes under this
    check, named shmcache-test.<tag>.* or shmcache-rel.<tag>.*. Other
    shmcache-* entries (a fuzz run's, another run's tests', a Python
    run's) belong to other runs on the host."""
    dirs = re.compile(rf"^shmcache-(test|rel)\.{tag}\.")
    return {n for n in os.listdir(SHM) if _INSTANCE.match(n) or dirs.match(n)}


class OthersServers(threading.Thread):
    """Watches, while the test runs, which instance ports and shm dirs
    servers that are not the test's use: another run on the host may start
    and kill one meanwhile, whose files (a killed server's host lock) stay
    until that run removes them, with no server left to name them at the
    end."""

    def __init__(self, marker):
        super().__init__(daemon=True)
        self.marker, self.ports, self.dirs = marker, set(), set()
        self.done = threading.Event()

    def look(self, procs=None):
        for _, (_, c, env) in (procs if procs is not None else processes()).items():
            if os.path.basename(c[0]) != "shmcached" or self.marker in env.split(b"\0"):
                continue
            if option(c, "port").isdigit():
                self.ports.add(int(option(c, "port")))
            if option(c, "shm_dir"):
                self.dirs.add(os.path.realpath(option(c, "shm_dir")))

    def run(self):
        while not self.done.wait(0.2):
            self.look()


def lock_run_dir(port):
    """The run dir that a host lock of `port` names (its second line), or
    "" when there is no lock or it names none."""
    for n in os.listdir(SHM):
        m = _PORT.match(n)
        if n.startswith(".") and n.endswith(".lock") and m and int(m.group(1)) == port:
            try:
                with open(os.path.join(SHM, n)) as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            if len(lines) > 1:
                return lines[1]
    return ""


def kill_if_tagged(pid, marker):
    """SIGKILLs `pid` while its environment holds `marker` (the run's tag):
    held by a pidfd before the environment is read, and killed through it,
    so that a pid given to another process since the scan (the host is
    shared; pids wrap) is never killed, by root least of all. By number
    right after the same check where there is no pidfd (Linux < 5.3)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:
        fd = -1
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if marker not in f.read().split(b"\0"):
                return
        if fd >= 0:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    finally:
        if fd >= 0:
            os.close(fd)


def made_by_the_tests(run_dir, tag):
    """Whether a server's run dir is one this run's C++ tests made: under
    its SHMCACHE_RUN_DIR (TestServer) or a TestDaemon's
    /tmp/shmcache-reld.<tag>.* dir."""
    roots = [r for r in (os.environ.get("SHMCACHE_RUN_DIR"), f"/tmp/shmcache-reld.{tag}.")
             if r]
    return any(run_dir.startswith(r) for r in roots)


def unexplained_entries(new, others, tag):
    """Those of the /dev/shm entries `new` still there that no server that
    is not the test's explains: its port or shm dir is not one `others`
    saw in use, and its host lock (when there is one) names a run dir of
    this run's tests. One already gone was removed by its owner: another
    run removes what a server it killed left (host lock last), which the
    check once took for the test's leftovers when it read the lock after
    that run had removed it."""
    left = []
    for n in sorted(new):
        m = _PORT.match(n)
        path = os.path.join(SHM, n)
        if not os.path.lexists(path):
            continue
        if (m and int(m.group(1)) in others.ports) or os.path.realpath(path) in others.dirs:
            continue
        # A server gone before anyone saw it: its lock names its run dir.
        owner_dir = lock_run_dir(int(m.group(1))) if m else ""
        if owner_dir and not made_by_the_tests(owner_dir, tag):
            continue
        left.append(path)
    return left


def write_junit(path, name, why):
    suite = ET.Element("testsuite")
    case = ET.SubElement(suite, "testcase", name=name)
    if why:
        ET.SubElement(case, "failure", message="left behind: " + "; ".join(why))
    ET.ElementTree(suite).write(path)


def main():
    args = sys.argv[1:]
    junit = args[0] == "--junit"
    if junit:
        args = args[1:]
    results, name = args[0], args[1]
    cmd = sys.argv[sys.argv.index("--") + 1:]
    tag = uuid.uuid4().hex
    marker = f"SHMCACHE_LEAK_TAG={tag}".encode()
    before = shm_entries(tag)
    others = OthersServers(marker)
    others.look()
    others.start()
    interrupted = False
    try:
        rc = subprocess.call(cmd, env=dict(os.environ, SHMCACHE_LEAK_TAG=tag))
    except KeyboardInterrupt:
        # Ctrl-C: still clean up after the test, then exit as interrupted.
        interrupted, rc = True, 130
    others.done.set()
    others.join()
    # A process may be on its way out, and another run may be removing the
    # files of a server it killed: an entry counts once it is still
    # unexplained in two looks 0.1 s apart, at the latest 5 s on.
    deadline = time.monotonic() + 5
    unexplained = None
    while True:
        procs = processes()
        ours = {p: v for p, v in procs.items() if marker in v[2].split(b"\0")}
        # Servers that are not this test's, live now or seen while it ran.
        others.look(procs)
        now = set(unexplained_entries(shm_entries(tag) - before, others, tag))
        leaked_files = sorted(now if unexplained is None else now & unexplained)
        if not ours and not now or time.monotonic() > deadline:
            break
        unexplained = now
        time.sleep(0.1)
    why = [f"process {p} ({' '.join(v[1])[:200]})" for p, v in ours.items()]
    why += [f"/dev/shm entry {f}" for f in leaked_files]
    for p in ours:
        kill_if_tagged(p, marker)
    for f in leaked_files:
        if os.path.ismount(f):
            subprocess.run(["umount", "-l", f], capture_output=True)
        if os.path.isdir(f) and not os.path.islink(f):
            shutil.rmtree(f, ignore_errors=True)
        else:
            try:
                os.unlink(f)
            except OSError:
                pass
    if why:
        print(f"LEAK: {name} left behind (now removed):\n  " + "\n  ".join(why))
    if junit:
        write_junit(results, name, why)
        return 130 if interrupted else rc
    result = "OK" if rc == 0 and not why else "FAIL"
    reason = (["exit status %d" % rc] if rc else []) + (["leaked: " + "; ".join(why)] if why else [])
    with open(results, "a") as f:
        f.write(json.dumps({"name": name, "result": result, "why": ", ".join(reason)}) + "\n")
    if interrupted:
        return 130
    return 0 if result == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
