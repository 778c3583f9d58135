"""The exchange that fetches a row from the node that owns it
(shmcache.torch.partitioned.ownership says which node that is) and hands a
computed row to its owner; PartitionedLoader (loader.py) runs it.

The exchange (RowExchange.round) runs over the job's own torch.distributed
process group: a gloo group of all ranks made for it (CPU tensors; the
job's default group may be NCCL), two all_to_all_single calls per round
once the sizes are known (round_sizes.py):

    1. requests: per pair of ranks a header of 7 int64 (ids requested,
       bytes of rows pushed, done flag, cache alive flag, round tag, epoch
       tag, "a remainder follows"), then the requested ids, as many as the
       pair's room holds;
    1b. only when some rank's header says so: the ids past the rooms, then
       the pushed rows (rows the sender computed for a row this rank's
       node owns; put here);
    2. answers: per pair a head of 2 int64 (the answer's bytes, "a
       remainder follows"), then the answer, the requested rows read from
       this node's cache (a miss is an empty entry) packed (packing.py)
       straight into the send buffer, as much as the pair's room holds;
    2b. only when some rank's head says so: the answers' remainders.

Every rank of the group calls round() the same number of times: a rank
that has nothing to ask calls it with done=True and still answers; the
round in which every rank says done (everyone knows it after step 1) is the
last, and it moves no rows. A round is a torch section (_exit_threads):
each call's wait for the other ranks is taken in slices, between which the
trainer's exit may stop the thread, outside torch. A round that waits for a
rank gone or stuck fails after the exchange's timeout (new_group).

Rows travel in the cache's own row encoding (packing.py), so a row from
another node decodes (shmcache.rows.decode) exactly as a local hit does.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from time import perf_counter as _now
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from ... import DatasetCache
from .._exit_threads import between_slices, torch_section
from .gloo_handles import Kept, handle
from .ownership import RowOwners
from .packing import Packed, pack_rows, unpack_rows
from .round_sizes import PairSizes

__all__ = ["RowExchange", "pack_rows", "unpack_rows"]

_HEADER = 7          # int64 per (sender, receiver) before the ids, step 1
_MORE = 6            # the header's "a remainder follows" (any pair of its sender)
_HEAD = 2            # int64 per (sender, receiver) before the answer, step 2
_SLICE = timedelta(milliseconds=50)   # one wait for other ranks, at most (_a2a)
RECV_KEPT = 2        # step 2's receive buffers kept for reuse (_receive_buffer)


def _a2a(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int] | None,
         in_splits: list[int] | None, group: Any, passed: list[torch.Tensor]) -> None:
    """all_to_all_single, waited for in slices (the round is a torch
    section: _exit_threads): a wait for another rank can last as long as
    that rank's step, and a thread inside torch's wait when the interpreter
    finalizes aborts the process as it returns. gloo gets handles of the
    tensors (gloo_handles), appended to `passed` (see RowExchange.round)."""
    out_h, inp_h = handle(out), handle(inp)
    passed += (out_h, inp_h)
    work = dist.all_to_all_single(out_h, inp_h, out_splits, in_splits, group=group,
                                  async_op=True)
    while True:
        try:
            work.wait(_SLICE)
            return
        except RuntimeError:
            if work.is_completed():   # failed, or done as the slice ended
                work.wait()           # raises the failure
                return
        between_slices()


class RowExchange:
    """One rank's side of the exchange (see the module doc).

    cache: gives this node's DatasetCache (the rows this node owns), or
      None, as it is now: PartitionedLoader's is its dataset's (`ds.cache =
      other` or None is followed from the next round on, and by the puts
      and answers of the round under way).
    owners: the RowOwners every rank uses.
    group: the process group of all ranks the rounds run on (gloo: tensors
      are on the CPU); RowExchange.new_group() makes one, and must be called
      by every rank at the same point, as all of torch.distributed's
      new_group calls.
    local_world_size: ranks per node, ranks numbered node by node (as
      torchrun and srun number them). A rank asks for a remote row the rank
      of the owner node with its own local rank, so the node's ranks share
      the serving.
    """

    def __init__(self, cache: Callable[[], DatasetCache | None], owners: RowOwners,
                 group: Any, local_world_size: int) -> None:
        self.cache = cache
        self.owners = owners
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if local_world_size < 1 or self.world % local_world_size:
            raise ValueError(f"world size {self.world} is not a multiple of "
                             f"{local_world_size} ranks per node")
        self.local_world_size = local_world_size
        self.num_nodes = self.world // local_world_size
        if owners.num_nodes != self.num_nodes:
            raise ValueError(f"the rows are split among {owners.num_nodes} nodes "
                             f"but the job has {self.num_nodes}")
        self.node = self.rank // local_world_size
        self.local_rank = self.rank % local_world_size
        # What the last headers said: nodes whose cache is bypassed.
        self.dead_nodes: set[int] = set()
        self.rounds = 0
        # True once a round failed half-way: the ranks are out of step and
        # no further round may be started.
        self.broken = False
        # Counters (this rank): rows served to others, rows put for others,
        # bytes received in answers, seconds in rounds.
        self.rows_served = 0
        self.rows_put_for_others = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        self.seconds = 0.0
        # Bytes of the answers of the last round that moved any: (sent to
        # each rank, received from each rank); what a bare all_to_all_single
        # of the same bytes moves (benchmarks/multinode_bench.py).
        self.last_sizes: tuple[list[int], list[int]] = ([], [])
        self._held = Kept()   # the last rounds' handles (round())
        self._sizes = PairSizes(self.world)
        # Step 2's send buffer, kept from round to round (grown when short):
        # its pages are faulted in once. gloo is done reading it when the
        # call's wait returns (all_to_all waits for its sends).
        self._send = torch.empty(0, dtype=torch.uint8)
        # Step 2's last receive buffers, the latest first, and the arrays
        # every view of them refers to (_receive_buffer): one is reused
        # once no row of it is held any more.
        self._recv: list[torch.Tensor] = []
        self._recv_np: list[npt.NDArray[np.uint8]] = []

    @staticmethod
    def new_group(timeout: timedelta) -> Any:
        """A gloo group of all ranks for the exchange (collective call),
        with `timeout` (exchange_timeout.py: the user's, else the job's, the
        one init_process_group was given), not torch's 30 minutes for a new
        group: gloo does not always fail a round whose peer has exited
        (seen: a rank whose round began just after its peer's exit waited in
        gloo's waitSend; its Pair::signalException fails the queued writes
        of bound buffers only), so the timeout is what ends that wait, as it
        ends the job's other collectives."""
        return dist.new_group(backend="gloo", timeout=timeout)

    def server_of(self, node: int) -> int:
        """The rank this rank asks for rows of `node`."""
        return node * self.local_world_size + self.local_rank

    @staticmethod
    def _alive(cache: DatasetCache | None) -> bool:
        return cache is not None and not cache.bypassed

    def round(self, requests: dict[int, list[int]],
              pushes: dict[int, tuple[list[int], list[Any]]], done: bool,
              epoch: int) -> tuple[dict[int, list[Any]], bool]:
        if self.broken:
            raise RuntimeError("an earlier exchange round failed; the ranks "
                               "are out of step")
        passed: list[torch.Tensor] = []
        try:
            with torch_section():
                try:
                    return self._round(requests, pushes, done, epoch, passed)
                finally:
                    # gloo's thread lets go of a call's tensors after the
                    # wait for it returns, at times rounds later: the
                    # handles gloo got are kept for the next rounds
                    # (gloo_handles: and at exit for good). Older ones
                    # are let go here, in the section: freeing a tensor
                    # lets the GIL go too.
                    self._held.keep(passed)
        except BaseException:
            self.broken = True
            raise

    def _send_buffer(self, n: int) -> torch.Tensor:
        if self._send.numel() < n:
            self._send = torch.empty(n, dtype=torch.uint8)
        return self._send[:n]

    def _receive_buffer(self, n: int) -> tuple[torch.Tensor, npt.NDArray[np.uint8]]:
        """Step 2's receive buffer of n bytes: one of the last RECV_KEPT
        when it is large enough and nothing refers to it any more, else a
        new one (kept for the next rounds, in place of the oldest). The
        rows a round returns are views of its buffer's array (their base:
        views of views collapse to it), so that array's reference count
        says whether any is still held (by the caller, a batch, a tensor
        made from one). Two are kept: a caller holds a round's rows while
        it calls the next (`answers, _ = ex.round(...)` in a loop). Reuse
        spares gloo's receive the page faults of fresh pages (a 3 MB
        answer: ~800 faults, ~2 us each on a loaded VM)."""
        arrays = self._recv_np
        for k in range(len(arrays)):
            # 2: the list and getrefcount's argument.
            if len(arrays[k]) >= n and sys.getrefcount(arrays[k]) == 2:
                return self._recv[k][:n], arrays[k][:n]
        t = torch.empty(n, dtype=torch.uint8)
        self._recv = [t] + self._recv[:RECV_KEPT - 1]
        self._recv_np = [t.numpy()] + self._recv_np[:RECV_KEPT - 1]
        return t, self._recv_np[0]

    def _round(self, requests: dict[int, list[int]],
               pushes: dict[int, tuple[list[int], list[Any]]], done: bool,
               epoch: int, passed: list[torch.Tensor]) -> tuple[dict[int, list[Any]], bool]:
        """One round: asks rank r for the rows requests[r] (ids its node
        owns), hands rank r the computed rows pushes[r] to put, answers the
        others from this node's cache. Rows are columns (see the module).
        Returns ({rank: rows in the order
        asked, None for a miss}, whether every rank said done: then this
        was the last round of the epoch). `epoch` must be the same on every
        rank (a mismatch raises: ranks iterate different epochs)."""
        t0 = _now()
        cache = self.cache()    # the round's alive flag
        self.rounds += 1
        w, sizes = self.world, self._sizes
        asks = [requests.get(r) or [] for r in range(w)]
        n_ask = [len(a) for a in asks]
        push_bufs = {r: pack_rows(ids, rows) for r, (ids, rows) in pushes.items() if ids}
        n_push = [len(push_bufs[r]) if r in push_bufs else 0 for r in range(w)]

        # 1. headers and the ids the rooms hold.
        room_out, room_in = sizes.ids_out, sizes.ids_in
        more = bool(push_bufs) or any(n > m for n, m in zip(n_ask, room_out))
        # done only in a round that moves nothing from this rank: then a
        # round where every rank says done moves nothing at all, and every
        # rank knows it from the headers alone.
        flags = (int(done and not push_bufs and not any(n_ask)), int(self._alive(cache)),
                 self.rounds, epoch, int(more))
        out_n = [_HEADER + m for m in room_out]
        in_n = [_HEADER + m for m in room_in]
        # Buffers gloo sends from are torch's own: a numpy-backed tensor's
        # deleter takes the GIL (gloo_handles), and the handle gloo gets
        # shares the storage, which gloo's thread may free.
        head_t = torch.zeros(sum(out_n), dtype=torch.int64)
        head = head_t.numpy()
        o = 0
        for r in range(w):
            head[o:o + _HEADER] = (n_ask[r], n_push[r]) + flags
            k = min(n_ask[r], room_out[r])
            if k:
                head[o + _HEADER:o + _HEADER + k] = asks[r][:k]
            o += out_n[r]
        got_t = torch.empty(sum(in_n), dtype=torch.int64)
        _a2a(got_t, head_t, in_n, out_n, self.group, passed)
        got = got_t.numpy()
        starts = np.cumsum([0] + in_n[:-1]).tolist()
        heads = [got[o:o + _HEADER].tolist() for o in starts]
        if any(h[4] != self.rounds or h[5] != epoch for h in heads):
            raise RuntimeError(
                f"rank {self.rank}: the ranks are out of step (round "
                f"{[h[4] for h in heads]}, epoch {[h[5] for h in heads]}): every rank "
                "must iterate the same epochs of its PartitionedLoader")
        self.dead_nodes = {r // self.local_world_size for r in range(w)
                           if not heads[r][3]}
        n_in = [h[0] for h in heads]
        asked = [got[o + _HEADER:o + _HEADER + min(n, m)]
                 for o, n, m in zip(starts, n_in, room_in)]
        sizes.after_requests(n_ask, n_in)
        if all(h[2] for h in heads):
            self.seconds += _now() - t0
            return {}, True

        # 1b. the ids past the rooms, then the pushed rows.
        put_ids: list[int] = []
        put_rows: list[Any] = []
        if any(h[_MORE] for h in heads):
            send_sizes = [8 * max(0, n - m) + p for n, m, p in zip(n_ask, room_out, n_push)]
            recv_sizes = [8 * max(0, n - m) + h[1] for n, m, h in zip(n_in, room_in, heads)]
            send_t = torch.empty(sum(send_sizes), dtype=torch.uint8)
            sendbuf = send_t.numpy()
            o = 0
            for r in range(w):
                if n_ask[r] > room_out[r]:
                    n = (n_ask[r] - room_out[r]) * 8
                    sendbuf[o:o + n] = np.asarray(asks[r][room_out[r]:],
                                                  dtype=np.int64).view(np.uint8)
                    o += n
                if r in push_bufs:
                    sendbuf[o:o + n_push[r]] = push_bufs[r]
                    o += n_push[r]
            recv_t = torch.empty(sum(recv_sizes), dtype=torch.uint8)
            _a2a(recv_t, send_t, recv_sizes, send_sizes, self.group, passed)
            recv = recv_t.numpy()
            o = 0
            for r in range(w):
                n = 8 * max(0, n_in[r] - room_in[r])
                if n:
                    asked[r] = np.concatenate((asked[r], recv[o:o + n].view(np.int64)))
                    o += n
                pb = heads[r][1]
                if pb:
                    ids, rows = unpack_rows(recv[o:o + pb])
                    put_ids += ids
                    put_rows += rows
                o += pb

        # Puts first (rows others computed for this node), then answers.
        # The cache of now: `cds.cache = other` while the round waited for
        # the other ranks stores their rows and answers from other (the old
        # cache may have been closed at once, as CachedDataset allows).
        cache = self.cache()
        if put_ids and cache is not None:
            # Not strict: a row this cache refuses is the sender's to deliver.
            self.rows_put_for_others += sum(
                cache.put_encoded(put_ids, put_rows, strict=False))
        flat = np.concatenate(asked).tolist()
        # Zero-copy reads: each row is copied once, into the send buffer.
        found = (cache.get_batch_columns(flat, copy=False)
                 if cache is not None and flat else [None] * len(flat))
        answers: list[Packed | None] = []
        o = 0
        for r in range(w):
            n = n_in[r]
            if n:
                rows = found[o:o + n]
                self.rows_served += sum(x is not None for x in rows)
                answers.append(Packed([], rows))
            else:
                answers.append(None)
            o += n
        del found

        # 2. answers, as much as the rooms hold.
        sent = [0 if a is None else a.nbytes for a in answers]
        room_out, room_in = sizes.answers_out(n_in), sizes.answers_in(n_ask)
        more = any(b > m for b, m in zip(sent, room_out))
        out_n = [8 * _HEAD + m for m in room_out]
        in_n = [8 * _HEAD + m for m in room_in]
        send = self._send_buffer(sum(out_n))
        send_np = send.numpy()
        rest: list[npt.NDArray[np.uint8] | None] = [None] * w
        o = 0
        for r, a in enumerate(answers):
            send_np[o:o + 8 * _HEAD].view(np.int64)[:] = (sent[r], int(more))
            body = send_np[o + 8 * _HEAD:o + out_n[r]]
            if a is not None and a.nbytes <= len(body):
                a.write(body)
            elif a is not None:   # past the room: the rest goes in 2b
                whole = np.empty(a.nbytes, dtype=np.uint8)
                a.write(whole)
                body[:] = whole[:len(body)]
                rest[r] = whole[len(body):]
            body[sent[r]:] = 0   # the room left over: nothing of old rounds
            o += out_n[r]
        del answers
        back, b = self._receive_buffer(sum(in_n))
        _a2a(back, send, in_n, out_n, self.group, passed)
        starts = np.cumsum([0] + in_n[:-1]).tolist()
        ahead = [b[o:o + 8 * _HEAD].view(np.int64).tolist() for o in starts]
        got_bytes = [h[0] for h in ahead]
        parts = [b[o + 8 * _HEAD:o + 8 * _HEAD + min(g, m)]
                 for o, g, m in zip(starts, got_bytes, room_in)]

        # 2b. the answers' remainders.
        if any(h[1] for h in ahead):
            send_sizes = [0 if x is None else len(x) for x in rest]
            recv_sizes = [max(0, g - m) for g, m in zip(got_bytes, room_in)]
            send_t = torch.empty(sum(send_sizes), dtype=torch.uint8)
            sendbuf = send_t.numpy()
            o = 0
            for x in rest:
                if x is not None:
                    sendbuf[o:o + len(x)] = x
                    o += len(x)
            recv_t = torch.empty(sum(recv_sizes), dtype=torch.uint8)
            _a2a(recv_t, send_t, recv_sizes, send_sizes, self.group, passed)
            recv = recv_t.numpy()
            o = 0
            for r, n in enumerate(recv_sizes):
                if n:
                    # One buffer per answer: its arrays sit 8-aligned.
                    parts[r] = np.concatenate((parts[r], recv[o:o + n]))
                    o += n
        sizes.after_answers(n_in, sent, n_ask, got_bytes)
        self.last_sizes = (sent, got_bytes)
        self.bytes_sent += sum(sent)
        self.bytes_received += sum(got_bytes)
        result: dict[int, list[Any]] = {}
        for r in range(w):
            if n_ask[r]:
                _, rows = unpack_rows(parts[r])
                result[r] = rows
        self.seconds += _now() - t0
        return result, False
