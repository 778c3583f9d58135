"""run_in_child(code): a piece of a test run in a child interpreter that
the test kills on a deadline, for what may hang inside torch where no
test can reach it.

Why: a plain DataLoader whose worker was killed by a signal can hang its
process for good in DataLoader.__del__. Its SIGCHLD handler raises the
worker's report in the main thread at whatever runs there; raised between
a threading.Condition's lock acquire and the return of its __enter__ (the
eval-breaker check after the C acquire), it leaves that lock held, and
when it lands in one of the iterator's own index-queue puts
(multiprocessing.Queue.put's `with self._notempty`), the iterator's
shutdown, at its __del__, puts on that queue again and waits for the lock
forever (CI at 6fb8df5: test_loader_contract's killed-worker test, load
~20). In a child, such a hang fails the test with the child's stacks,
instead of stopping the suite.

The child: `code` (dedented) runs in a fresh `python -c` with this
process's environment (the server fixture's SHMCACHE_PORT and
SHMCACHE_RUN_DIR), tests/python and the built package on sys.path, in a
session of its own; it answers by calling report(obj) (JSON) once.
faulthandler dumps every thread's stack and ends it `grace` s before the
deadline; at the deadline the test kills its process group. A child that
raised, or did not report, fails the test with its stderr (the stacks).
Whatever the child started (workers) is killed with its group when it ends.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

_PREAMBLE = """\
import faulthandler, json, sys
faulthandler.dump_traceback_later({dump_s}, exit=True)
def report(obj):
    print("REPORT " + json.dumps(obj), flush=True)
"""


def run_in_child(code, deadline=180.0, grace=30.0, what="the child"):
    """Runs `code` in a child (see the module); returns what it reported."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] +
        [p for p in sys.path if p.endswith(os.path.join("clients", "python"))])
    source = _PREAMBLE.format(dump_s=max(1.0, deadline - grace)) + textwrap.dedent(code)
    proc = subprocess.Popen([sys.executable, "-c", source], cwd=HERE, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    hung = False
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        hung = True
        _kill_group(proc.pid)
        out, err = proc.communicate()
    finally:
        _kill_group(proc.pid)
    reports = [line[len("REPORT "):] for line in out.splitlines() if line.startswith("REPORT ")]
    if hung or proc.returncode != 0 or len(reports) != 1:
        why = (f"did not end within its deadline of {deadline:g} s (a hang)" if hung else
               f"exited with code {proc.returncode} and {len(reports)} reports")
        if "Timeout (" in err and "Thread 0x" in err:
            why = (f"hung: faulthandler dumped its stacks after {deadline - grace:g} s "
                   f"and ended it")
        raise AssertionError(f"{what} {why}\n--- its stdout:\n{out}\n--- its stderr:\n{err}")
    return json.loads(reports[0])


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
