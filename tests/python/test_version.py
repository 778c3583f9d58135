"""`shmcache.__version__`, where a user looks first (bug reports, pip
freeze, `help(shmcache)`), is the version meson.build's project() declares,
the one include/shmcache/version.h states for the library and tools."""

import re
import subprocess
import sys

import shmcache
from conftest import PYTHONPATH, ROOT


def _project_version():
    meson = (ROOT / "meson.build").read_text()
    return re.search(r"project\([^)]*?version\s*:\s*'([^']+)'", meson, re.S).group(1)


def test_version_is_the_projects():
    assert shmcache.__version__ == _project_version()


def test_help_shows_the_version():
    out = subprocess.run(
        [sys.executable, "-c", "import shmcache; help(shmcache)"],
        env={"PYTHONPATH": PYTHONPATH, "PAGER": "cat", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=True).stdout
    assert re.search(r"^VERSION\s*\n\s*" + re.escape(_project_version()), out, re.M), out[-400:]
