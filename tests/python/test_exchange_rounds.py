"""RowExchange's rounds, two ranks (one per simulated node) on one server:
how many all_to_all_single calls a round makes, and that the rows arrive
whole whichever path they take (round_sizes.py: the ids and answers that
fit the rooms both ranks of a pair derive from the rounds before travel
in two calls; what does not fit, in one more each).

Each rank asks the other for rows of one shared cache (round() serves any
id asked of it), with counts and row sizes that differ between the ranks
and from round to round, so that every path is taken: the first round
(no rooms yet), rounds that fit, more ids than the room, answers larger
than the room, misses, pushed rows, the closing round, an epoch's short
last round and closing round before the next epoch's full one.
"""

import os

from conftest import free_tcp_port, run_ranks

_RANK = r'''
import datetime, os, sys, weakref
import numpy as np
import torch.distributed as dist
import shmcache
from shmcache.torch.partitioned.exchange import RowExchange
from shmcache.torch.partitioned.ownership import RowOwners

dist.init_process_group("gloo", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
peer = 1 - rank
cache = shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"])).named("rounds", "fp")

def row(i):
    # ids < 100: 1,000-byte images; 100..199: 40,000 bytes; a 0-d label.
    return np.full(1000 if i < 100 else 40000, i % 251, dtype=np.uint8), i

if rank == 0:
    ids = list(range(200))
    cache.put_batch(ids, [row(i) for i in ids])
dist.barrier()

calls = []   # per call of the round: the bytes this rank sent
real = dist.all_to_all_single
def counted(out, inp, *args, **kw):
    calls.append(inp.numel() * inp.element_size())
    return real(out, inp, *args, **kw)
dist.all_to_all_single = counted

ex = RowExchange(lambda: cache, RowOwners(1000, 2), RowExchange.new_group(
    datetime.timedelta(seconds=60)), local_world_size=1)

def check(got, ids):
    assert len(got) == len(ids), (len(got), len(ids))
    for i, cols in zip(ids, got):
        if i >= 200 and i < 300:   # never cached: a miss
            assert cols is None, i
            continue
        (_, _, x), (_, _, y) = cols
        want = row(i)[0]
        assert x.shape == want.shape and (x == want).all(), i
        assert int(y) == i and x.ctypes.data % 8 == 0, i

def round_(mine, theirs, pushes=None, tag="", done=False):
    """One round where this rank asks `mine`, the peer `theirs`; the calls
    it made."""
    ids = mine if rank == 0 else theirs
    del calls[:]
    answers, last = ex.round({peer: ids} if ids else {}, pushes or {}, done, 0)
    if ids:
        check(answers[peer], ids)
    else:
        assert answers == {}
    return len(calls), last

# The first round: no rooms yet, everything past them (1, 1b, 2, 2b).
assert round_(list(range(10)), list(range(20, 40))) == (4, False)
# The same counts and sizes: two calls.
assert round_(list(range(40, 50)), list(range(50, 70))) == (2, False)
assert round_(list(range(70, 80)), list(range(0, 20))) == (2, False)
# Rows a round returned that the caller still holds stay whole through
# the next rounds (step 2's receive buffers are reused only once none of
# their rows is held), as do the last round's while the caller makes the
# next (a loop of `answers = ex.round(...)`); once let go, the buffers
# serve the next rounds again: no new one.
held_ids = list(range(20, 30)) if rank == 0 else list(range(30, 50))
held = ex.round({peer: held_ids}, {}, False, 0)[0][peer]
for k in range(3):
    assert round_(list(range(50 + k, 60 + k)), list(range(60, 80))) == (2, False)
    check(held, held_ids)
del held

def buffers():
    return {id(a) for a in ex._recv_np}

answers = None
for k in range(6):
    ids = list(range(k, 10 + k)) if rank == 0 else list(range(60 + k, 80 + k))
    last = answers
    answers = ex.round({peer: ids}, {}, False, 0)[0][peer]
    if last is not None:
        check(last, last_ids)
    last_ids = ids
    if k == 2:
        kept = [weakref.ref(a) for a in ex._recv_np]   # ids stay theirs
        warm = buffers()
assert buffers() == warm
del last, answers
for k in range(4):
    assert round_(list(range(80, 90)), list(range(0, 20))) == (2, False)
assert buffers() == warm and all(r() is not None for r in kept)
# More ids than the room (twice the last round's): one call more (1b).
assert round_(list(range(30)), list(range(30, 50))) == (3, False)
# Rows 40x larger than the pair's last answers: one call more (2b).
assert round_(list(range(100, 110)), list(range(110, 130))) == (3, False)
# Those sizes again, now expected: two calls.
assert round_(list(range(130, 140)), list(range(140, 160))) == (2, False)
# Rows pushed to their owner's rank: put there (1b carries them).
pushed = {peer: ([300 + rank], [[("#0", "uint8", np.full(8, rank, np.uint8)),
                                  ("#1\x1fpy", "int64", np.array(rank))]])}
assert round_(list(range(160, 170)), list(range(170, 190)), pushed) == (3, False)
# The pair's last two answers had rows of one size: step 2's room is
# within 1% of the answer (not 1/16 over: zeros sent).
assert calls[2] < ex.last_sizes[0][peer] * 1.01 + 2048, (calls, ex.last_sizes)
assert cache.contains(300) and cache.contains(301)
assert ex.rows_put_for_others == 1
# Misses (never cached) and hits, as asked: each answer fits (smaller).
assert round_([205, 150, 206], [250, 0, 1, 251]) == (2, False)
# One large row (past the room: 2b), then 40 small ones (more ids than
# the room: 1b): the answers' room is not 40 large rows' (at most four
# times the last answer), and the answers still fit it.
assert round_([199], [198]) == (3, False)
assert round_(list(range(40)), list(range(40, 80))) == (3, False)
assert calls[2] < 5 * 40000, calls   # step 2's bytes: 40 x 1 KB and the room
# An epoch's end: full rounds, a short last one, the closing round (one
# call, nothing asked); the next epoch's first full round still fits the
# rooms: neither the short round nor the closing one shrank them below it.
assert round_(list(range(40)), list(range(40, 80))) == (2, False)
assert round_([1, 2, 3], [4]) == (2, False)
assert round_([], [], done=True) == (1, True)
assert round_(list(range(40, 80)), list(range(40))) == (2, False)
# Nothing asked by anyone, every rank done: one call, the last round.
assert round_([], [], done=True) == (1, True)
print("ok", flush=True)
dist.destroy_process_group()
'''


def test_a_round_is_two_collectives_once_sizes_are_known_and_rows_arrive_whole(
        session):
    port = free_tcp_port()
    outs = run_ranks(["/usr/bin/python3", "-c", _RANK], [
        dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
             MASTER_PORT=str(port), OMP_NUM_THREADS="1", SESSION_ID=str(session))
        for r in range(2)], timeout=120)
    for r, out in enumerate(outs):
        assert out.strip().endswith("ok"), f"rank {r}:\n{out}"
