"""A PartitionedLoader trainer exits cleanly however it ends, and so does
the rank beside it: rc 0 (or the signal's), no hang, nothing left behind
(conftest's leak check: no process, the miss workers included).

Two ranks on one host (partition_exit_rank.py; gloo, a node each, both on
one server and session: ownership needs no more), each with one miss
worker. Rank 1 trains its whole epoch; rank 0 ends its epoch as the case
says:

- end: both train the whole epoch;
- break: rank 0 breaks out of its loop after a batch;
- kept: rank 0 keeps the pass's iterator (`it = iter(loader); next(it)`)
  and its script ends: the exchange thread is still running when the
  interpreter exits. It aborted the process ("terminate called without an
  active exception": the thread was inside a gloo call, or gloo's thread
  freed a round's tensor, as the interpreter finalized), 10 of 10 runs of
  each loader kind before the exit hook covered the exchange;
- raise: as kept, but the script raises SystemExit(3);
- sigterm: rank 0 is SIGTERMed mid-epoch (the default action): -SIGTERM,
  and rank 1's next round fails with a RuntimeError, not a hang;
- parked: as kept, but rank 1 waits mid-epoch until rank 0 is gone, so
  rank 0's exchange thread can never finish the epoch's closing rounds:
  its exit waits the hook's bound (made 1 s here) and then goes, with the
  thread parked outside torch; rank 1's next round then fails.

And a round whose peer never comes fails after the exchange's timeout:
PartitionedLoader(exchange_timeout=) when given, else the job's (the one
init_process_group was given), not torch's 30 minutes for a new group: a
rank whose peer died is not always told by gloo (a send queued on a
connection whose peer has gone is never failed), so the timeout is what
ends its wait.
"""

import os
import signal
import subprocess
import sys

import pytest

from conftest import free_tcp_port

HERE = os.path.dirname(os.path.abspath(__file__))

# rc of (rank 0, rank 1) per case.
CASES = {"end": (0, 0), "break": (0, 0), "kept": (0, 0), "raise": (3, 0),
         "sigterm": (-signal.SIGTERM, 5), "parked": (0, 5)}


def _ranks(server, session, kind, case, gone_to, **env):
    """Starts rank 0 and rank 1 of partition_exit_rank.py; rank `gone_to`
    gets the read end of a pipe whose write end the other holds (EOF: that
    other rank is gone)."""
    script = os.path.join(HERE, "partition_exit_rank.py")
    gone_r, gone_w = os.pipe()
    env = dict(server.env, SESSION_ID=str(session), WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_tcp_port()),
               OMP_NUM_THREADS="1", GONE_FD=str(gone_r), **env)
    ranks = []
    try:
        for r in (0, 1):
            fd = gone_r if r == gone_to else gone_w
            ranks.append(subprocess.Popen(
                [sys.executable, script, kind, case], env=dict(env, RANK=str(r)),
                pass_fds=(fd,), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
    except BaseException:
        _end(ranks)
        raise
    finally:   # the rank reading sees EOF once the other is gone
        os.close(gone_r)
        os.close(gone_w)
    return ranks


def _end(ranks):
    for p in ranks:
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.mark.parametrize("kind", ["dataloader", "cachedloader"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_rank_exits_cleanly_however_it_ends(server, session, kind, case):
    ranks = _ranks(server, session, kind, case, gone_to=1)
    try:
        if case == "sigterm":
            seen = []
            while not seen or seen[-1] not in ("batch\n", ""):   # "": rank 0 ended
                seen.append(ranks[0].stdout.readline())
            assert seen[-1], "".join(seen)
            ranks[0].send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=120)[0] for p in ranks]
    finally:
        _end(ranks)
    rcs = tuple(p.returncode for p in ranks)
    assert rcs == CASES[case], f"exit statuses {rcs}:\n" + "\n----\n".join(outs)
    assert "terminate called" not in outs[0] + outs[1], outs


@pytest.mark.parametrize("timeouts", [
    {"JOB_TIMEOUT_S": "30"},
    {"JOB_TIMEOUT_S": "3600", "EXCHANGE_TIMEOUT_S": "30"}], ids=["job", "given"])
def test_a_round_whose_peer_never_comes_fails_after_the_exchanges_timeout(
        server, session, timeouts):
    """Rank 0 builds its loader and waits, alive, until rank 1 is gone;
    rank 1's first round fails once the exchange's timeout has passed (30
    s: the job's, or exchange_timeout= under a job's hour): it exits 5. It
    waited torch's 30 minutes for a new group before, and the job's hour
    with exchange_timeout= (the test's wait for it ends first). The job's
    timeout also bounds the ranks' rendezvous, which a loaded host makes
    slow."""
    ranks = _ranks(server, session, "dataloader", "absent", gone_to=0, **timeouts)
    try:
        out1 = ranks[1].communicate(timeout=240)[0]
        out0 = ranks[0].communicate(timeout=120)[0]
    finally:
        _end(ranks)
    assert (ranks[0].returncode, ranks[1].returncode) == (0, 5), out0 + "\n----\n" + out1
    assert "round failed" in out1 and "Timed out" in out1, out1
