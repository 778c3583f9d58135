"""examples/slurm: prolog.sh, task_prolog.sh and epilog.sh run directly with
the environment slurmd gives them (a fake Slurm: SLURM_JOB_ID, SLURM_JOB_UID,
...). A job's tasks get their node's server and session from the task
prolog; the epilog leaves nothing behind."""

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import (ADMIN, PYTHONPATH, ROOT, free_port, host_lock, huge_dir,
                      release_huge_dir,
                      wait_for, _alive, _segments)

SLURM = ROOT / "examples" / "slurm"
JOB_ID = 4242
TASK = """
import os, warnings, numpy as np, shmcache
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    c = shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"]))
    stored = sum(c.put(i, (np.arange(8) + i,)) for i in range(5))
    print(stored, c.get(3) is not None,
          sum(issubclass(x.category, shmcache.CacheWarning) for x in w))
"""


class FakeJob:
    """One job on one node: its Slurm environment and its scripts."""

    def __init__(self, state_dir, uid=None, start_args="", job_id=JOB_ID, port=None):
        self.uid = os.getuid() if uid is None else uid
        user = pwd.getpwuid(self.uid)
        self.job_id = job_id
        self.port = free_port() if port is None else port
        self.state_dir = Path(state_dir)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SHMCACHE_", "SLURM_"))}
        # SHMCACHE_WATCH_PID (scripts/test.sh) still ties servers to the run.
        if "SHMCACHE_WATCH_PID" in os.environ:
            env["SHMCACHE_WATCH_PID"] = os.environ["SHMCACHE_WATCH_PID"]
        self.env = dict(env, SLURM_JOB_ID=str(job_id), SLURM_JOB_UID=str(self.uid),
                        SLURM_JOB_GID=str(user.pw_gid), SLURM_JOB_USER=user.pw_name,
                        SLURM_NODEID="0", SLURM_CLUSTER_NAME="fake",
                        SHMCACHE_SLURM_STATE=str(self.state_dir),
                        SHMCACHE_SLURM_PORT_BASE=str(self.port - job_id % 20000),
                        SHMCACHE_SLURM_START_ARGS=start_args,
                        SHMCACHE_BIN=str(ADMIN.parent))

    def run(self, script):
        return subprocess.run([str(SLURM / script)], env=self.env,
                              capture_output=True, text=True, timeout=120)

    def as_user(self, argv):
        if self.uid == os.getuid():
            return argv
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}",
                "--clear-groups", "--"] + argv

    def task_env(self):
        """What a task sees: the task prolog's exports over the job's env."""
        r = subprocess.run(self.as_user([str(SLURM / "task_prolog.sh")]), env=self.env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        exports = dict(line[len("export "):].split("=", 1)
                       for line in r.stdout.splitlines())
        return dict(self.env, PYTHONPATH=PYTHONPATH, **exports), exports

    def task(self):
        env, _ = self.task_env()
        r = subprocess.run(self.as_user(["/usr/bin/python3", "-c", TASK]), env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    def server_pid(self, exports):
        r = subprocess.run(self.as_user([str(ADMIN), "-p", exports["SHMCACHE_PORT"],
                                         "--server_info"]),
                           env=dict(self.env, SHMCACHE_RUN_DIR=exports["SHMCACHE_RUN_DIR"]),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split("Process id:")[1].split()[0])

    def leftovers(self):
        """Files the job could leave: state, shared memory."""
        return sorted(os.listdir(self.state_dir)) + _segments(self.port, self.uid)

    def job_dir(self):
        return self.state_dir / f"job{self.job_id}"

    def user_stops_the_server(self, exports):
        """What a job's user can do: stop the job's server early."""
        r = subprocess.run(self.as_user([str(ADMIN), "-p", exports["SHMCACHE_PORT"],
                                         "--stop"]),
                           env=dict(self.env, SHMCACHE_RUN_DIR=exports["SHMCACHE_RUN_DIR"]),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr

    def user_writes(self, path, pid):
        """The job's user writes `pid` into a file of the job's run dir."""
        r = subprocess.run(self.as_user(["sh", "-c", f'echo {pid} >"$1"', "_", str(path)]),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr


@pytest.fixture
def state_dir(tmp_path):
    return tmp_path / "state"


def test_prolog_serves_the_job_and_epilog_leaves_nothing(state_dir):
    job = FakeJob(state_dir)
    r = job.run("prolog.sh")
    assert r.returncode == 0 and "cache server on port" in r.stderr, r.stderr
    _, exports = job.task_env()
    assert exports["SHMCACHE_PORT"] == str(job.port)
    assert int(exports["SESSION_ID"]) > 0
    pid = job.server_pid(exports)

    assert job.task() == ["5", "True", "0"]      # 5 rows stored, a hit, no warning
    assert job.task() == ["0", "True", "0"]      # the next task finds them cached

    r = job.run("epilog.sh")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert not _alive(pid)
    assert job.leftovers() == []


def test_a_server_that_cannot_start_leaves_the_job_running(state_dir):
    job = FakeJob(state_dir, start_args="--memory_cap_ratio 7")
    r = job.run("prolog.sh")
    assert r.returncode == 0, r.stderr           # a failing prolog drains the node
    assert "cannot start the cache server" in r.stderr and "without the cache" in r.stderr
    _, exports = job.task_env()
    assert exports["SESSION_ID"] == "0"
    assert job.task() == ["0", "False", "1"]     # one warning, rows from the source
    assert job.run("epilog.sh").returncode == 0
    assert job.leftovers() == []


def test_epilog_cleans_up_after_a_server_that_died(state_dir):
    job = FakeJob(state_dir)
    assert job.run("prolog.sh").returncode == 0
    _, exports = job.task_env()
    pid = job.server_pid(exports)
    assert job.task()[0] == "5"
    assert [f for f in _segments(job.port, job.uid) if not f.endswith(".huge")]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), what="the server's death")
    r = job.run("epilog.sh")
    assert r.returncode == 0, r.stderr
    assert job.leftovers() == []


def _runnable_by(uid, path):
    """Whether `uid` can read and execute `path` (a checkout under a 0700
    directory is out of other users' reach)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            code = 0 if os.access(path, os.R_OK | os.X_OK) else 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_prolog_as_root_runs_the_server_as_the_job_user():
    if os.geteuid() != 0:
        pytest.skip("needs root: slurmd runs the prolog as root for another user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    nobody = pwd.getpwnam("nobody").pw_uid
    if not all(_runnable_by(nobody, p) for p in (SLURM / "task_prolog.sh", ADMIN)):
        pytest.skip(f"{SLURM} or {ADMIN} is out of reach of uid {nobody} (a parent "
                    "directory is closed to other users)")
    # The job user must reach the state dir: not under pytest's 0700 tmp.
    top = tempfile.mkdtemp(prefix="shmcache-slurm-test.")
    try:
        os.chmod(top, 0o755)
        job = FakeJob(Path(top) / "state", uid=nobody)
        r = job.run("prolog.sh")
        assert r.returncode == 0 and "cache server on port" in r.stderr, r.stderr
        _, exports = job.task_env()
        pid = job.server_pid(exports)
        assert os.stat(f"/proc/{pid}").st_uid == nobody
        assert job.task() == ["5", "True", "0"]
        r = job.run("epilog.sh")
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert not _alive(pid)
        assert job.leftovers() == []
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _nobody_job_possible():
    if os.geteuid() != 0:
        pytest.skip("needs root: slurmd runs the prolog and epilog as root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    nobody = pwd.getpwnam("nobody").pw_uid
    if not all(_runnable_by(nobody, p) for p in (SLURM / "task_prolog.sh", ADMIN)):
        pytest.skip(f"{SLURM} or {ADMIN} is out of reach of uid {nobody}")
    return nobody


@pytest.fixture
def open_top():
    """A directory the job's user can reach (pytest's tmp is 0700)."""
    top = tempfile.mkdtemp(prefix="shmcache-slurm-test.")
    os.chmod(top, 0o755)
    yield Path(top)
    shutil.rmtree(top, ignore_errors=True)


def test_epilog_never_kills_another_users_process_named_in_the_lock_file(open_top):
    nobody = _nobody_job_possible()
    job = FakeJob(open_top / "state", uid=nobody)
    assert job.run("prolog.sh").returncode == 0
    _, exports = job.task_env()
    job.user_stops_the_server(exports)
    # A process of root's named shmcached: what the epilog used to check.
    fake = open_top / "shmcached"
    shutil.copy("/bin/sleep", fake)
    victim = subprocess.Popen([str(fake), "600"])
    try:
        wait_for(lambda: Path(f"/proc/{victim.pid}/comm").read_text().strip()
                 == "shmcached", what="the victim's name")
        job.user_writes(job.job_dir() / f"shmcached-{job.port}.lock", victim.pid)
        r = job.run("epilog.sh")
        assert r.returncode == 0, r.stderr
        assert victim.poll() is None, f"the epilog killed root's process: {r.stderr}"
        assert job.leftovers() == []
    finally:
        victim.kill()
        victim.wait()


def test_epilog_terminates_a_server_that_does_not_answer(open_top):
    """A server that answers no --stop (here an admin that gets no answer:
    a hung server costs the admin's timeouts, a minute) is signalled by the
    epilog, as the job's user (a listed pid that went to another user's
    process meanwhile is refused the signal), and its segments removed."""
    nobody = _nobody_job_possible()
    bin_dir = open_top / "bin"
    bin_dir.mkdir(mode=0o755)
    no_answer = bin_dir / "shmcache"
    no_answer.write_text(
        "#!/bin/sh\n"
        "for a in \"$@\"; do\n"
        "  case $a in --stop|-d) echo 'no answer' >&2; exit 1;; esac\n"
        "done\n"
        f'exec {ADMIN} "$@"\n')
    no_answer.chmod(0o755)
    job = FakeJob(open_top / "state", uid=nobody)
    assert job.run("prolog.sh").returncode == 0
    _, exports = job.task_env()
    pid = job.server_pid(exports)
    assert job.task()[0] == "5"
    job.env["SHMCACHE_BIN"] = str(bin_dir)
    try:
        r = job.run("epilog.sh")
        assert r.returncode == 0, r.stderr
        assert "did not stop (no answer); terminating it" in r.stderr, r.stderr
        assert not _alive(pid)
        assert job.leftovers() == []
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _start_ticks(pid):
    """The start of process `pid` in clock ticks since boot (/proc/PID/stat
    field 22, counted after the ')' that ends its name)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "by-number"])
def test_the_epilogs_signal_reaches_only_the_process_that_was_listed(
        state_dir, tmp_path, pidfd):
    """The epilog signals a server it listed (pid and start) only while the
    pid still names that process: one given the pid since started later,
    and is never signalled, whether the signal goes through a pidfd
    (Python's) or, without one, by number after the same check."""
    job = FakeJob(state_dir)
    env = dict(job.env)
    if not pidfd:      # a python3 without pidfd_open: the check in bash
        (tmp_path / "python3").write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / "python3").chmod(0o755)
        env["PATH"] = f"{tmp_path}:{env['PATH']}"
    listed = subprocess.Popen(["sleep", "600"])
    try:
        start = _start_ticks(listed.pid)
        signal_it = f'source "{SLURM}/common.sh" && signal_server "$1" "$2" TERM'
        r = subprocess.run(["bash", "-c", signal_it, "_", str(listed.pid), str(start - 1)],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, "a process that started later was signalled"
        assert listed.poll() is None, f"signalled: {r.stderr}"
        r = subprocess.run(["bash", "-c", signal_it, "_", str(listed.pid), str(start)],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert listed.wait(timeout=20) == -signal.SIGTERM
    finally:
        listed.kill()
        listed.wait()


def test_epilog_does_not_block_on_a_fifo_in_the_run_dir(state_dir):
    job = FakeJob(state_dir)
    assert job.run("prolog.sh").returncode == 0
    _, exports = job.task_env()
    job.user_stops_the_server(exports)
    lock = job.job_dir() / f"shmcached-{job.port}.lock"
    if lock.exists():
        lock.unlink()
    os.mkfifo(lock)
    r = job.run("epilog.sh")        # used to block reading the FIFO
    assert r.returncode == 0, r.stderr
    assert job.leftovers() == []


def test_prolog_refuses_a_state_dir_others_can_write_and_writes_through_no_link(open_top):
    nobody = _nobody_job_possible()
    state = open_top / "state"
    state.mkdir()
    os.chown(state, nobody, nobody)          # the job's user made it first
    victim = open_top / "root-only"
    victim.write_text("root's\n")
    os.chmod(victim, 0o600)
    job = FakeJob(state, uid=nobody)
    r = subprocess.run(job.as_user(["ln", "-s", str(victim),
                                    str(state / f"job{JOB_ID}.env.tmp")]),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = job.run("prolog.sh")
    assert r.returncode == 0, r.stderr       # never drain the node
    assert f"the state dir {state} is owned by uid {nobody}" in r.stderr, r.stderr
    assert "training goes on without the cache" in r.stderr
    assert victim.read_text() == "root's\n"
    assert victim.stat().st_mode & 0o777 == 0o600
    assert not (state / f"job{JOB_ID}").exists()
    assert _segments(job.port, nobody) == []
    _, exports = job.task_env()              # the tasks read from the source
    assert exports["SESSION_ID"] == "0"


def _epilog_leaves_the_mount_at_the_huge_path(job, owner, mount_options, whose):
    """Points the job's env file at its server's huge-tmpfs path, puts a
    directory of uid `owner` there with a tmpfs mounted on it (with
    `mount_options`; `whose` mount it is, for the message), runs the
    epilog, and checks that the mount is still there."""
    huge = Path(huge_dir(job.port, job.uid))
    env_file = job.state_dir / f"job{job.job_id}.env"
    env_file.write_text("".join(
        f"SHMCACHE_SHM_DIR={huge}\n" if line.startswith("SHMCACHE_SHM_DIR=") else line + "\n"
        for line in env_file.read_text().splitlines()))
    r = subprocess.run(["setpriv", f"--reuid={owner}", f"--regid={owner}", "--clear-groups",
                        "--", "mkdir", "-m", "0755", str(huge)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", mount_options, "theirs", str(huge)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        r = job.run("epilog.sh")
        assert r.returncode == 0, r.stderr
        assert os.path.ismount(huge), f"the epilog unmounted {whose} mount: {r.stderr}"
    finally:
        release_huge_dir(job.port, job.uid)
    assert job.leftovers() == []


def test_epilog_unmounts_nothing_for_a_job_user_who_could_not_have_mounted_it(open_top):
    """The huge-page tmpfs path is in /dev/shm, where the job's user can put
    a directory and, once the epilog has checked it, swap in a link to any
    mount (umount follows links); the shm dir in the env file is what the
    user's server answered. Here the user's server says the huge path and
    the check is passed by a directory of the user's holding a mount of
    root's: what umount reaches after a swap won. A server of a user who is
    not root cannot have mounted anything, so the epilog unmounts nothing."""
    nobody = _nobody_job_possible()
    job = FakeJob(open_top / "state", uid=nobody)
    assert job.run("prolog.sh").returncode == 0
    _, exports = job.task_env()
    job.user_stops_the_server(exports)
    _epilog_leaves_the_mount_at_the_huge_path(job, nobody, "size=1m", "root's")


def test_a_root_jobs_epilog_unmounts_no_directory_another_user_put_there(open_top):
    """A root job's server that used its huge tmpfs removes the directory
    at its clean stop; another user may then put a directory of their own
    at that name in /dev/shm and, once the epilog has checked it (a
    directory, no link), swap in a link to any mount (umount follows
    links). Here that user's directory is a mount point of theirs (a
    tmpfs owned by them, as a FUSE mount of theirs would be), which the
    epilog checked and unmounted: it unmounts only a directory of root's,
    which no one else can rename in sticky /dev/shm. It used to unmount
    it."""
    nobody = _nobody_job_possible()
    job = FakeJob(open_top / "state")       # root's job
    r = job.run("prolog.sh")
    assert r.returncode == 0 and "cache server on port" in r.stderr, r.stderr
    _, exports = job.task_env()
    job.user_stops_the_server(exports)
    _epilog_leaves_the_mount_at_the_huge_path(job, nobody, f"size=1m,uid={nobody},mode=0755",
                                              "another user's")


def test_a_forged_shm_dir_adds_no_line_to_the_env_file_and_the_server_stops(state_dir, tmp_path):
    """The prolog records the shm dir the job's server reports. The job's
    user owns the run dir and can answer on its socket instead (a process of
    another of their jobs on the node); an answer naming two shm dirs, the
    second "SHMCACHE_PORT=1", once put a second port line in root's env
    file, and the epilog, finding no one port there, left the server
    running after the job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    forged = bin_dir / "shmcache"
    forged.write_text(
        "#!/bin/sh\n"
        "for a in \"$@\"; do\n"
        "  [ \"$a\" = --server_info ] && printf '{\\n  \"shm_dir\": \"/dev/shm\",\\n"
        "  \"shm_dir\": \"SHMCACHE_PORT=1\"\\n}\\n' && exit 0\n"
        "done\n"
        f'exec {ADMIN} "$@"\n')
    forged.chmod(0o755)
    job = FakeJob(state_dir)
    job.env["SHMCACHE_BIN"] = str(bin_dir)
    try:
        r = job.run("prolog.sh")
        assert r.returncode == 0 and "cache server on port" in r.stderr, r.stderr
        env_file = job.state_dir / f"job{job.job_id}.env"
        assert [line for line in env_file.read_text().splitlines()
                if line.startswith("SHMCACHE_PORT=")] == [f"SHMCACHE_PORT={job.port}"]
        _, exports = job.task_env()
        assert exports["SHMCACHE_PORT"] == str(job.port)
        pid = job.server_pid(exports)
        r = job.run("epilog.sh")
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert not _alive(pid), "the server outlived the job"
        assert job.leftovers() == []
    finally:
        subprocess.run([str(ADMIN), "-p", str(job.port), "--stop"], capture_output=True,
                       env=dict(job.env, SHMCACHE_RUN_DIR=str(job.job_dir())), timeout=60)


def test_a_state_dir_under_a_directory_others_may_write_is_refused(open_top):
    """Root's own state dir is no better than the directory it is in: where
    the job's user may write that (no sticky bit), they can rename root's
    state dir away and put their own, or a link, at its name between the
    prolog's checks and its writes."""
    shared = open_top / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    state = shared / "state"
    state.mkdir(mode=0o755)
    job = FakeJob(state)
    r = job.run("prolog.sh")
    assert r.returncode == 0, r.stderr       # never drain the node
    assert f"the state dir {state} is under {shared}, which another user" in r.stderr, r.stderr
    assert "training goes on without the cache" in r.stderr
    assert os.listdir(state) == []
    assert _segments(job.port) == []
    _, exports = job.task_env()              # the tasks read from the source
    assert exports["SESSION_ID"] == "0"
    os.chmod(shared, 0o1777)                 # sticky: names there stay their owner's
    try:
        r = job.run("prolog.sh")
        assert r.returncode == 0 and "cache server on port" in r.stderr, r.stderr
    finally:
        r = job.run("epilog.sh")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert job.leftovers() == []


def test_a_state_dir_whose_parent_is_missing_is_refused_saying_so(tmp_path):
    """A state dir under a directory that does not exist cannot be made:
    the scripts say so, not that another user owns or may write the
    missing directory (the ancestry check once read it so, with
    realpath's error line above), and the job runs from the source."""
    state = tmp_path / "missing" / "state"
    job = FakeJob(state)
    for script in ("prolog.sh", "epilog.sh"):
        r = job.run(script)
        assert r.returncode == 0, r.stderr       # never drain the node
        assert f"{state.parent} does not exist" in r.stderr, r.stderr
        assert "another user" not in r.stderr and "realpath" not in r.stderr, r.stderr
    assert not state.parent.exists()
    _, exports = job.task_env()
    assert exports["SESSION_ID"] == "0"


def test_a_state_dir_anyone_can_write_is_refused(state_dir):
    state_dir.mkdir(mode=0o777)
    os.chmod(state_dir, 0o777)
    job = FakeJob(state_dir)
    r = job.run("prolog.sh")
    assert r.returncode == 0
    assert "mode 777" in r.stderr and "0700 or 0755" in r.stderr, r.stderr
    assert os.listdir(state_dir) == []


def test_two_jobs_whose_ids_share_a_port_get_a_server_each(state_dir):
    first = FakeJob(state_dir)
    second = FakeJob(state_dir, job_id=JOB_ID + 20000, port=first.port)
    try:
        assert first.run("prolog.sh").returncode == 0
        r = second.run("prolog.sh")
        assert r.returncode == 0 and "cache server on port" in r.stderr, r.stderr
        _, e1 = first.task_env()
        _, e2 = second.task_env()
        assert e1["SHMCACHE_PORT"] != e2["SHMCACHE_PORT"]
        assert first.task()[0] == "5"
        assert second.task()[0] == "5"       # its own cache, not the first's
        assert second.run("epilog.sh").returncode == 0
        assert first.task() == ["0", "True", "0"]   # the first job keeps its rows
    finally:
        second.run("epilog.sh")
        first.run("epilog.sh")
    assert first.leftovers() == []


def test_a_lock_another_user_put_on_the_jobs_first_port_moves_it_to_the_next(open_top):
    """The job's first port follows from its id, which every user of the
    node sees: another user may create its host lock in /dev/shm first.
    The server refuses a lock that is not its user's, and the prolog took
    that as the end: the job ran without the cache. It goes on to the
    next port, as past a port another job holds."""
    nobody = _nobody_job_possible()
    job = FakeJob(open_top / "state")     # root's job; the other user is nobody
    lock = host_lock(job.port, job.uid)
    r = subprocess.run(["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups",
                        "--", "touch", lock], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        r = job.run("prolog.sh")
        assert r.returncode == 0 and "cannot start" not in r.stderr, r.stderr
        _, exports = job.task_env()
        assert exports["SHMCACHE_PORT"] != str(job.port)
        assert job.task()[0] == "5"
        r = job.run("epilog.sh")
        assert r.returncode == 0 and r.stderr == "", r.stderr
    finally:
        os.unlink(lock)
        job.run("epilog.sh")
    assert job.leftovers() == []


def _mounted(path):
    """Whether a file system is mounted at `path` (the mount table: a bind
    mount of the same file system has its parent's st_dev)."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


@pytest.mark.parametrize("kind", ["bind", "tmpfs"])
def test_epilog_never_enters_a_file_system_mounted_in_the_job_dir(state_dir, tmp_path, kind):
    """The job's user may mount a file system in the job's run dir (FUSE, on
    any directory of theirs; here a bind mount of a directory of the same
    file system, or a tmpfs). The epilog, root, leaves it and says so: rm
    -rf went into the mount and deleted the files there (and a FUSE server
    that does not answer would have hung it). The rest goes."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mount")
    job = FakeJob(state_dir)
    assert job.run("prolog.sh").returncode == 0
    mnt = job.job_dir() / "mnt"
    mnt.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv = (["mount", "--bind", str(elsewhere), str(mnt)] if kind == "bind"
            else ["mount", "-t", "tmpfs", "-o", "size=1m", "theirs", str(mnt)])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"cannot mount here: {r.stderr.strip()}")
    try:
        (mnt / "precious").write_text("keep\n")
        r = job.run("epilog.sh")
        assert r.returncode == 0, r.stderr
        assert (mnt / "precious").exists(), \
            f"the epilog deleted a file in a mount in the job dir: {r.stderr}"
        assert _mounted(mnt)
        assert f"left {job.job_dir()}: a file system is mounted in it ({mnt})" in r.stderr, \
            r.stderr
        assert not (state_dir / f"job{job.job_id}.env").exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)
    if kind == "bind":
        assert (elsewhere / "precious").read_text() == "keep\n"
    shutil.rmtree(job.job_dir())
    assert job.leftovers() == []


def _port_taken(job, out):
    """Whether the prolog's port_taken (common.sh) reads `out`, what
    'shmcache --start' said, as a port that is taken."""
    r = subprocess.run(["bash", "-c", f'source "{SLURM}/common.sh" && port_taken "$1"',
                        "_", out], env=job.env, capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode == 0


def _admin_start(job, port, run_dir, *args):
    return subprocess.run([str(ADMIN), "-p", str(port), "--start", *args],
                          env=dict(job.env, SHMCACHE_RUN_DIR=str(run_dir)),
                          capture_output=True, text=True, timeout=120)


def test_the_prolog_knows_the_admins_words_for_a_taken_port(state_dir, tmp_path):
    """The admin exits 1 for every failed --start: the prolog tells a port
    that is taken (try the next) from any other failure by the admin's
    text, which is common/instance_lock.cc's. Here that text as the admin
    prints it, so that rewording it fails this test, not the prolog on a
    node in silence."""
    job = FakeJob(state_dir)
    assert job.run("prolog.sh").returncode == 0
    other_run_dir = tmp_path / "other-run"
    try:
        # A server of this user on the port, this run dir (the instance
        # lock) and another (the host lock: another job's, as the prolog
        # meets it).
        for run_dir in (job.job_dir(), other_run_dir):
            r = _admin_start(job, job.port, run_dir)
            assert r.returncode != 0 and "already running on port" in r.stderr, r.stderr
            assert _port_taken(job, r.stderr), r.stderr
        # Any other failure is not a taken port.
        r = _admin_start(job, free_port(), other_run_dir, "--memory_cap_ratio", "7")
        assert r.returncode != 0, r.stdout
        assert not _port_taken(job, r.stderr), r.stderr
    finally:
        subprocess.run([str(ADMIN), "-p", str(job.port), "--stop"], capture_output=True,
                       env=dict(job.env, SHMCACHE_RUN_DIR=str(other_run_dir)), timeout=60)
        assert job.run("epilog.sh").returncode == 0
    assert job.leftovers() == []


def test_the_prolog_knows_the_admins_words_for_another_users_lock(state_dir, tmp_path):
    """The same for a host lock file another user created on the port (the
    server refuses a lock that is not its user's)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a lock file of another user's")
    job = FakeJob(state_dir)
    lock = host_lock(job.port, job.uid)
    Path(lock).touch(mode=0o600, exist_ok=False)
    try:
        os.chown(lock, 65534, 65534)
        r = _admin_start(job, job.port, tmp_path / "run")
        assert r.returncode != 0 and "another user created it" in r.stderr, r.stderr
        assert _port_taken(job, r.stderr), r.stderr
    finally:
        os.unlink(lock)
    assert _segments(job.port) == []
