"""What a test changes on the host besides servers (a small tmpfs it
mounts, a cgroup it makes) is undone when the pytest that runs it is
SIGKILLed before its fixtures can undo it: a tmpfs left mounted keeps the
memory its files hold, a cgroup stays for good. Here a pytest run inside
this one makes the change and is killed; the change must be gone within a
bound. Root only, as the fixtures are."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import inner_pytest, wait_for

INNER = '''
import os, signal
from pathlib import Path
from test_containers import limited_cgroup  # noqa: F401 (a fixture)

def test_holds_a_change(request):
    if os.environ["CHANGE"] == "tmpfs":
        made = request.getfixturevalue("small_tmpfs_of")("8m")
        (made / "held").write_bytes(b"x" * (1 << 20))
    else:
        made = request.getfixturevalue("limited_cgroup")[0]
    # Whole or not there: the outer test reads it once it exists.
    written = Path(os.environ["MADE_FILE"] + ".part")
    written.write_text(str(made))
    written.replace(os.environ["MADE_FILE"])
    while True:
        signal.pause()      # until killed
'''


def _undo(change, made):
    """What the fixture failed to undo, undone here (the test leaves nothing)."""
    if change == "tmpfs":
        if os.path.ismount(made):
            subprocess.run(["umount", "-l", made], capture_output=True)
    elif os.path.isdir(made):
        os.rmdir(made)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount / make a cgroup")
@pytest.mark.parametrize("change", ["tmpfs", "cgroup"])
def test_a_change_is_undone_when_its_pytest_is_killed(tmp_path, change):
    made_file = tmp_path / "made"
    inner, base = inner_pytest(tmp_path, INNER, MADE_FILE=str(made_file), CHANGE=change)
    made = None
    try:
        wait_for(lambda: made_file.exists() or inner.poll() is not None, timeout=120,
                 what="the inner pytest's change")
        out = "" if made_file.exists() else inner.communicate(timeout=60)[0]
        if "skipped" in out:
            pytest.skip(f"the inner test skipped: {out.strip().splitlines()[-1]}")
        assert made_file.exists(), out
        made = made_file.read_text()
        if change == "tmpfs":
            assert os.path.ismount(made)
            gone = lambda: not os.path.ismount(made)   # noqa: E731
        else:
            assert Path(made).is_dir()
            gone = lambda: not os.path.exists(made)    # noqa: E731
        inner.kill()
        inner.wait(timeout=60)
        wait_for(gone, timeout=30, what=f"{made} undone after its pytest was killed")
    finally:
        inner.kill()
        inner.communicate(timeout=60)
        if made is not None:
            _undo(change, made)
        shutil.rmtree(base, ignore_errors=True)
