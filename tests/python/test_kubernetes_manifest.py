"""examples/kubernetes: the DaemonSet and the training pod parse, and agree
on what docs/operations.md#kubernetes says they share (host IPC and pids, the shm and socket
directories at the same paths, the user, the port). The server's command
line is then run for real, its paths moved under a temporary directory."""

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import ADMIN, BUILD, PYTHONPATH, ROOT, free_port, wait_for

K8S = ROOT / "examples" / "kubernetes"


def load(name):
    docs = list(yaml.safe_load_all((K8S / name).read_text()))
    assert len(docs) == 1
    return docs[0]


def options(argv):
    """{name: value} of --name=value arguments."""
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def host_mounts(pod_spec, container):
    """{mountPath: host path} of a container's hostPath volumes."""
    host = {v["name"]: v["hostPath"]["path"] for v in pod_spec["volumes"] if "hostPath" in v}
    return {m["mountPath"]: host[m["name"]] for m in container["volumeMounts"]
            if m["name"] in host}


@pytest.fixture(scope="module")
def manifests():
    ds, pod = load("shmcache-daemonset.yaml"), load("training-pod.yaml")
    assert ds["apiVersion"] == "apps/v1" and ds["kind"] == "DaemonSet"
    assert pod["apiVersion"] == "v1" and pod["kind"] == "Pod"
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= \
        ds["spec"]["template"]["metadata"]["labels"].items()
    (server,) = spec["containers"]
    (trainer,) = pod["spec"]["containers"]
    return spec, server, pod["spec"], trainer


def test_server_pod_shares_host_ipc_and_pids(manifests):
    spec, server, _, _ = manifests
    assert spec["hostIPC"] is True and spec["hostPID"] is True
    assert server["command"][0] == "shmcached" and "--foreground" in server["command"]


def test_shm_and_socket_dirs_are_the_same_host_dirs_in_both_pods(manifests):
    spec, server, pod_spec, trainer = manifests
    opts = options(server["command"])
    env = {e["name"]: e["value"] for e in server["env"]}
    trainer_env = {e["name"]: e["value"] for e in trainer["env"]}
    server_mounts = host_mounts(spec, server)
    trainer_mounts = host_mounts(pod_spec, trainer)
    # Clients open segments by the path the server reports, and the socket
    # in SHMCACHE_RUN_DIR: both must be the same host dir at the same path.
    for path in (opts["shm_dir"], env["SHMCACHE_RUN_DIR"]):
        assert path in server_mounts, path
        assert trainer_mounts.get(path) == server_mounts[path], path
    assert server_mounts[opts["shm_dir"]].startswith("/dev/shm/")   # memory
    assert trainer_env["SHMCACHE_RUN_DIR"] == env["SHMCACHE_RUN_DIR"]
    assert trainer_env["SHMCACHE_PORT"] == opts["port"]
    assert pod_spec["hostIPC"] is True
    metrics_dir = os.path.dirname(opts["metrics_file"])
    assert server_mounts[metrics_dir] == "/var/lib/node_exporter/textfile_collector"


def test_both_pods_run_as_the_servers_user(manifests):
    spec, _, pod_spec, _ = manifests
    uid = spec["securityContext"]["runAsUser"]
    assert pod_spec["securityContext"]["runAsUser"] == uid
    (init,) = spec["initContainers"]
    assert f"chown {uid}:" in init["command"][-1]


def expect_ready(daemon):
    """Reads the daemon's stderr up to its readiness line ("OK ..."), after
    any NOTE or Warning: lines (a cap above the shm filesystem's room, say);
    else the daemon is killed and the test fails with what it said (read
    before it ended, its stderr would be waited on for good)."""
    said = ""
    while True:
        line = daemon.stderr.readline()
        said += line
        if line.startswith("OK "):
            return
        if not line.startswith(("NOTE ", "Warning: ")):
            break
    daemon.kill()
    daemon.wait(timeout=60)
    pytest.fail(f"no readiness line: {said}{daemon.stderr.read()}")


def test_the_server_command_line_runs_and_the_probe_sees_it(manifests, tmp_path):
    _, server, _, _ = manifests
    port = free_port()
    # The shm dir goes under /dev/shm, as its hostPath does: in memory (a
    # shm dir on a disk is started with a warning before the readiness line).
    shm_parent = tempfile.mkdtemp(prefix="shmcache-k8s-", dir="/dev/shm")
    shm_dir = options(server["command"])["shm_dir"]
    moved = {}
    for m in server["volumeMounts"]:
        parent = shm_parent if m["mountPath"] == shm_dir else tmp_path
        moved[m["mountPath"]] = os.path.join(parent, m["name"])
        os.makedirs(moved[m["mountPath"]], mode=0o700)

    def move(arg):
        for path, to in moved.items():
            arg = arg.replace(path, to)
        return arg.replace(f"--port={options(server['command'])['port']}", f"--port={port}")

    argv = [str(BUILD / "daemon" / "shmcached")] + [move(a) for a in server["command"][1:]]
    # Ends with this pytest however it ends (it writes to pytest's stdout).
    argv.append(f"--watch_pid={os.getpid()}")
    env = dict(os.environ, PYTHONPATH=PYTHONPATH,
               **{e["name"]: move(e["value"]) for e in server["env"]})
    env.pop("NOTIFY_SOCKET", None)
    daemon = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        expect_ready(daemon)
        probe = [str(ADMIN) if a == "shmcache" else a
                 for a in server["readinessProbe"]["exec"]["command"]]
        probe[probe.index("-p") + 1] = str(port)
        r = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        metrics = move(options(server["command"])["metrics_file"])
        assert wait_for(lambda: os.path.exists(metrics), what="the metrics file")
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=60) == 0
        shutil.rmtree(shm_parent, ignore_errors=True)


def _reachable_by(uid, gid, path):
    """Whether uid can read and run `path` (a parent may be closed to it)."""
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                        "--", "test", "-x", str(path)], capture_output=True)
    return r.returncode == 0


def test_the_pod_commands_run_as_the_pods_user_on_root_owned_host_dirs(manifests):
    """What the kubelet does: hostPath dirs created root's (DirectoryOrCreate),
    the init container's command as root, then the server's as runAsUser."""
    spec, server, _, _ = manifests
    if os.geteuid() != 0:
        pytest.skip("needs root: the kubelet creates hostPath dirs as root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    uid = spec["securityContext"]["runAsUser"]
    gid = spec["securityContext"]["runAsGroup"]
    daemon_bin = BUILD / "daemon" / "shmcached"
    if not _reachable_by(uid, gid, daemon_bin):
        pytest.skip(f"{daemon_bin} is out of reach of uid {uid} (a parent directory "
                    "is closed to other users)")
    # Under /dev/shm: the shm dir's hostPath is in memory (one on a disk is
    # started with a warning before the readiness line).
    top = Path(tempfile.mkdtemp(prefix="shmcache-k8s-test.", dir="/dev/shm"))
    os.chmod(top, 0o755)
    daemon = None
    try:
        host = {v["name"]: top / v["name"] for v in spec["volumes"] if "hostPath" in v}
        for d in host.values():
            d.mkdir(mode=0o755)                  # root's, as DirectoryOrCreate

        def moved(arg, container):
            for m in container["volumeMounts"]:
                arg = arg.replace(m["mountPath"], str(host[m["name"]]))
            return arg

        (init,) = spec["initContainers"]
        r = subprocess.run([moved(a, init) for a in init["command"]],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        port = free_port()
        argv = [str(daemon_bin)] + [
            moved(a, server).replace(f"--port={options(server['command'])['port']}",
                                     f"--port={port}")
            for a in server["command"][1:]] + [f"--watch_pid={os.getpid()}"]
        env = {e["name"]: moved(e["value"], server) for e in server["env"]}
        env = dict(PATH=os.environ["PATH"], **env)
        daemon = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"] + argv,
            env=env, stderr=subprocess.PIPE, text=True)
        expect_ready(daemon)
        metrics = moved(options(server["command"])["metrics_file"], server)
        assert wait_for(lambda: os.path.exists(metrics), what="the metrics file")
        assert os.stat(metrics).st_uid == uid
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=60) == 0
        shutil.rmtree(top, ignore_errors=True)
