"""shmcached@.service: installed by meson, accepted by systemd-analyze
verify, and Type=notify backed by a daemon that notifies readiness once its
socket listens (checked with a NOTIFY_SOCKET of our own, as systemd would
set it)."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess

import pytest

from conftest import ADMIN, BUILD, free_port, _segments

UNIT = BUILD / "daemon" / "systemd" / "shmcached@.service"
DAEMON = BUILD / "daemon" / "shmcached"


def unit_text():
    assert UNIT.exists(), f"{UNIT} is missing: meson did not configure the unit"
    return UNIT.read_text()


def test_meson_installs_the_unit_into_the_systemd_unit_dir():
    r = subprocess.run(["meson", "introspect", str(BUILD), "--installed"],
                       capture_output=True, text=True, check=True)
    installed = json.loads(r.stdout)
    dest = installed.get(str(UNIT))
    assert dest is not None, f"{UNIT} is not installed: {sorted(installed)}"
    assert dest.endswith("/lib/systemd/system/shmcached@.service")


def test_systemd_analyze_verifies_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    # A unit known to be good tells whether verify can run in this container.
    probe = tmp_path / "probe" / "probe.service"
    probe.parent.mkdir()
    probe.write_text("[Service]\nType=oneshot\nExecStart=/bin/true\n")
    r = subprocess.run([analyze, "verify", str(probe)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"systemd-analyze verify cannot run here: {r.stderr.strip()}")

    text = unit_text()
    exec_start = re.search(r"^ExecStart=(\S+)", text, re.M).group(1)
    assert exec_start.endswith("/bin/shmcached")
    # The installed path does not exist in a build tree: point at the build.
    (tmp_path / "shmcached@.service").write_text(text.replace(exec_start, str(DAEMON)))
    r = subprocess.run([analyze, "verify", str(tmp_path / "shmcached@50052.service")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert re.search(r"^ExecStart=\S+ --port=%i --foreground", text, re.M)


def test_notify_unit_gets_readiness_after_the_socket_listens_and_a_stop_notice(tmp_path):
    if "Type=notify" not in unit_text():
        pytest.skip("built without libsystemd: the unit is Type=exec, nothing notifies")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(60)
    port = free_port()
    run_dir = tmp_path / "run"
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"),
               SHMCACHE_RUN_DIR=str(run_dir))
    daemon = subprocess.Popen([str(DAEMON), f"--port={port}", "--foreground",
                               f"--log_dir={tmp_path / 'log'}"], env=env,
                              stderr=subprocess.DEVNULL)
    try:
        ready = notify.recv(4096).decode()
        assert "READY=1" in ready.split("\n") and f"MAINPID={daemon.pid}" in ready
        # Ready means listening: the first request is answered, no retry.
        r = subprocess.run([str(ADMIN), "-p", str(port), "--server_info", "--json"],
                           env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["pid"] == daemon.pid
        daemon.send_signal(signal.SIGTERM)     # what systemctl stop sends
        assert notify.recv(4096).decode() == "STOPPING=1"
        assert daemon.wait(timeout=60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        notify.close()
    assert not (run_dir / f"shmcached-{port}.sock").exists()
    assert _segments(port) == []
