"""`pip install .` from the source tree into a fresh venv (Debian's
meson-python, nothing from a package index) gives a working package and
the `shmcache` / `shmcached` programs on the venv's PATH."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, free_port

PY = "/usr/bin/python3"


def _have(module):
    return subprocess.run([PY, "-c", f"import {module}"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _have("mesonpy") or not _have("ensurepip"),
                    reason="needs Debian's python3-mesonpy and python3-venv")
@pytest.mark.deadline(2400)   # a whole build from source, 1800 s allowed
def test_pip_install_into_a_venv_then_put_and_get(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    # The build dir in the temp dir; -Dtests=false etc. come from pyproject.
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation",
                        "--no-index", f"--config-settings=builddir={tmp_path / 'build'}",
                        str(ROOT)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    for prog in ("shmcache", "shmcached"):
        assert os.access(venv / "bin" / prog, os.X_OK), f"{prog} not in {venv}/bin"

    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SHMCACHE_BUILD_DIR", "SHMCACHE_DAEMON")}
    env.update(PATH=f"{venv / 'bin'}:/usr/bin:/bin", SHMCACHE_PORT=str(port),
               SHMCACHE_RUN_DIR=str(tmp_path / "run"))
    admin = shutil.which("shmcache", path=env["PATH"])
    assert admin == str(venv / "bin" / "shmcache")
    subprocess.run([admin, "--start"], env=env, check=True, capture_output=True, timeout=60)
    try:
        info = json.loads(subprocess.run([admin, "--server_info", "--json"], env=env,
                                         check=True, capture_output=True, text=True).stdout)
        exe = os.readlink(f"/proc/{info['pid']}/exe")
        assert exe == str(venv / "bin" / "shmcached"), exe
        code = (
            "import subprocess, numpy as np, shmcache\n"
            f"assert shmcache.__file__.startswith({str(venv)!r}), shmcache.__file__\n"
            # The subpackages are installed too (each meson.build lists its files).
            "from shmcache.torch import CachedDataset, CachedLoader, PartitionedLoader\n"
            "import shmcache.torch.partitioned.exchange, shmcache.torch._pipeline\n"
            "sid = int(subprocess.run(['shmcache', '-g'], capture_output=True, text=True,"
            " check=True).stdout.split()[-1])\n"
            "c = shmcache.DatasetCache(sid)\n"
            "assert c.put(7, np.arange(10, dtype=np.int64))\n"
            "print(list(c.get(7)))\n")
        r = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env,
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(list(range(10)))
    finally:
        subprocess.run([admin, "--stop"], env=env, capture_output=True, timeout=60)
