"""The exchange that fetches a row from the node that owns it
(shmcache.torch.partitioned.ownership says which node that is) and hands a
computed row to its owner; PartitionedLoader (loader.py) runs it.

The exchange (RowExchange.round) runs over the job's own torch.distributed
process group: a gloo group of all ranks made for it (CPU tensors; the
job's default group may be NCCL), four all_to_all_single calls per round:

    1. headers, 6 int64 per pair of ranks: ids requested, bytes of rows
       pushed, done flag, cache alive flag, round tag, epoch tag;
    2. request bytes: the requested ids, then the pushed rows (rows the
       sender computed for a row this rank's node owns; put here);
    3. the size of each answer;
    4. the answers: the requested rows read from this node's cache (a miss
       is an empty entry).

Every rank of the group calls round() the same number of times: a rank
that has nothing to ask calls it with done=True and still answers; the
round in which every rank says done (everyone knows it after step 1) is the
last, and it moves no bytes. A round is a torch section (_exit_threads):
each call's wait for the other ranks is taken in slices, between which the
trainer's exit may stop the thread, outside torch. A round that waits for a
rank gone or stuck fails after the exchange's timeout (new_group).

Rows travel in the cache's own row encoding, the columns [(name, dtype
name, array)] that DatasetCache.get_columns returns and put_columns takes
(shmcache.rows): the stored names (a PIL image's mode in its column name),
the row model's dtype names (bfloat16, bytes) and the bytes, so a row from
another node decodes (shmcache.rows.decode) exactly as a local hit does. One
buffer per pair of ranks: a pickled description (ids; per row its columns'
names, dtype names, numpy dtypes and shapes) followed by the arrays' bytes,
each 8-byte aligned.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from time import perf_counter as _now
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from ... import DatasetCache
from ... import rows as row_model
from .._exit_threads import between_slices, torch_section
from .gloo_handles import Kept, handle
from .ownership import RowOwners

__all__ = ["RowExchange", "pack_rows", "unpack_rows"]

_HEADER = 6          # int64 per (sender, receiver) in step 1
_LEN = 8             # bytes of the description's length
_ALIGN = 8           # every array starts at a multiple of this in a buffer
_SLICE = timedelta(milliseconds=50)   # one wait for other ranks, at most (_a2a)


def _contiguous(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    # Not np.ascontiguousarray: it makes a 0-d array 1-d.
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _row_spec(cols: Sequence[row_model.Column], leaves: list[Any]) -> Any:
    """[(name, dtype name, numpy dtype, shape)] of a row's columns; their
    arrays are appended to `leaves`."""
    spec = []
    for name, dtype, a in cols:
        a = _contiguous(np.asarray(a))
        leaves.append(a)
        spec.append((name, dtype, a.dtype.str, a.shape))
    return spec


class _Packed:
    """Rows (columns, or None for a miss) described and sized, to be
    written into a buffer (pack_rows)."""

    def __init__(self, ids: Sequence[int], rows: Sequence[Any]) -> None:
        self.leaves: list[npt.NDArray[Any]] = []
        specs = [None if r is None else _row_spec(r, self.leaves) for r in rows]
        self.meta = pickle.dumps((list(ids), specs), protocol=pickle.HIGHEST_PROTOCOL)
        self.nbytes = _aligned(_LEN + len(self.meta)) + \
            sum(_aligned(x.nbytes) for x in self.leaves)

    def write(self, out: npt.NDArray[np.uint8]) -> None:
        """Writes the rows into out[:self.nbytes] (one copy of each array)."""
        out[:_LEN] = np.array([len(self.meta)], dtype="<u8").view(np.uint8)
        o = _LEN
        out[o:o + len(self.meta)] = np.frombuffer(self.meta, dtype=np.uint8)
        o = _aligned(o + len(self.meta))
        for x in self.leaves:
            n = x.nbytes
            if n:
                out[o:o + n] = x.reshape(-1).view(np.uint8)
            o += _aligned(n)


def pack_rows(ids: Sequence[int], rows: Sequence[Any]) -> npt.NDArray[np.uint8]:
    """One buffer holding rows (columns [(name, dtype name, array)], as
    DatasetCache.get_columns returns them; None: a miss) under their ids."""
    p = _Packed(ids, rows)
    out = np.empty(p.nbytes, dtype=np.uint8)
    p.write(out)
    return out


def unpack_rows(buf: npt.NDArray[np.uint8]) -> tuple[list[int], list[Any]]:
    """(ids, rows) of a pack_rows buffer: each row its columns, as packed
    (None for a miss); the arrays are views into buf."""
    if len(buf) == 0:
        return [], []
    mlen = int(buf[:_LEN].view("<u8")[0])
    ids, specs = pickle.loads(buf[_LEN:_LEN + mlen].tobytes())
    o = _aligned(_LEN + mlen)
    out: list[Any] = []
    for spec in specs:
        if spec is None:
            out.append(None)
            continue
        cols = []
        for name, dtype, np_dtype, shape in spec:
            dt = np.dtype(np_dtype)
            n = dt.itemsize * int(np.prod(shape, dtype=np.int64))
            cols.append((name, dtype, buf[o:o + n].view(dt).reshape(shape)))
            o += _aligned(n)
        out.append(cols)
    return ids, out


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
        w = self.world
        header = torch.zeros(w, _HEADER, dtype=torch.int64)
        push_bufs: dict[int, npt.NDArray[np.uint8]] = {}
        for r, (ids, rows) in pushes.items():
            if ids:
                push_bufs[r] = pack_rows(ids, rows)
        for r in range(w):
            header[r, 0] = len(requests.get(r, ()))
            header[r, 1] = len(push_bufs[r]) if r in push_bufs else 0
        # done only in a round that moves nothing from this rank: then a
        # round where every rank says done moves nothing at all, and every
        # rank knows it from the headers alone.
        header[:, 2] = int(done and not push_bufs and not any(requests.values()))
        header[:, 3] = int(self._alive(cache))
        header[:, 4] = self.rounds
        header[:, 5] = epoch
        got = torch.empty_like(header)
        _a2a(got, header, None, None, self.group, passed)
        if (got[:, 4] != self.rounds).any() or (got[:, 5] != epoch).any():
            raise RuntimeError(
                f"rank {self.rank}: the ranks are out of step (round "
                f"{got[:, 4].tolist()}, epoch {got[:, 5].tolist()}): every rank must "
                "iterate the same epochs of its PartitionedLoader")
        self.dead_nodes = {r // self.local_world_size for r in range(w)
                           if not got[r, 3]}
        all_done = bool(got[:, 2].all())
        if all_done:
            self.seconds += _now() - t0
            return {}, True

        # 2. ids asked, then the pushed rows.
        send_sizes = [int(header[r, 0]) * 8 + int(header[r, 1]) for r in range(w)]
        recv_sizes = [int(got[r, 0]) * 8 + int(got[r, 1]) for r in range(w)]
        # Buffers gloo sends from are torch's own: a numpy-backed tensor's
        # deleter takes the GIL (gloo_handles), and the handle gloo gets
        # shares the storage, which gloo's thread may free.
        send_t = torch.empty(sum(send_sizes), dtype=torch.uint8)
        sendbuf = send_t.numpy()
        o = 0
        for r in range(w):
            ids = requests.get(r, [])
            if ids:
                n = len(ids) * 8
                sendbuf[o:o + n] = np.asarray(ids, dtype=np.int64).view(np.uint8)
                o += n
            if r in push_bufs:
                b = push_bufs[r]
                sendbuf[o:o + len(b)] = b
                o += len(b)
        recvbuf = torch.empty(sum(recv_sizes), dtype=torch.uint8)
        _a2a(recvbuf, send_t, recv_sizes, send_sizes, self.group, passed)
        recv = recvbuf.numpy()

        # Puts first (rows others computed for this node), then answers.
        asked: list[list[int]] = []
        put_ids: list[int] = []
        put_rows: list[Any] = []
        o = 0
        for r in range(w):
            n = int(got[r, 0])
            asked.append(recv[o:o + n * 8].view(np.int64).tolist())
            o += n * 8
            pb = int(got[r, 1])
            if pb:
                ids, rows = unpack_rows(recv[o:o + pb])
                put_ids += ids
                put_rows += rows
            o += pb
        # The cache of now: `cds.cache = other` while the round waited for
        # the other ranks stores their rows and answers from other (the old
        # cache may have been closed at once, as CachedDataset allows).
        cache = self.cache()
        if put_ids and cache is not None:
            # Not strict: a row this cache refuses is the sender's to deliver.
            self.rows_put_for_others += sum(
                cache.put_encoded(put_ids, put_rows, strict=False))
        flat = [i for ids in asked for i in ids]
        # Zero-copy reads: each row is copied once, into the send buffer.
        found = (cache.get_batch_columns(flat, copy=False)
                 if cache is not None and flat else [None] * len(flat))
        answers: list[_Packed | None] = []
        o = 0
        for r in range(w):
            n = len(asked[r])
            if n:
                rows = found[o:o + n]
                self.rows_served += sum(x is not None for x in rows)
                answers.append(_Packed([], rows))
            else:
                answers.append(None)
            o += n
        send = torch.empty(sum(a.nbytes for a in answers if a is not None),
                           dtype=torch.uint8)
        send_np = send.numpy()
        o = 0
        for a in answers:
            if a is not None:
                a.write(send_np[o:o + a.nbytes])
                o += a.nbytes
        del found

        # 3. answer sizes, 4. answers.
        asz = torch.tensor([0 if a is None else a.nbytes for a in answers],
                           dtype=torch.int64)
        rsz = torch.empty_like(asz)
        _a2a(rsz, asz, None, None, self.group, passed)
        out_sizes = rsz.tolist()
        back = torch.empty(sum(out_sizes), dtype=torch.uint8)
        _a2a(back, send, out_sizes, asz.tolist(), self.group, passed)
        self.last_sizes = (asz.tolist(), out_sizes)
        self.bytes_sent += int(send.numel())
        self.bytes_received += int(back.numel())
        b = back.numpy()
        result: dict[int, list[Any]] = {}
        o = 0
        for r in range(w):
            n = out_sizes[r]
            if requests.get(r):
                _, rows = unpack_rows(b[o:o + n])
                result[r] = rows
            o += n
        self.seconds += _now() - t0
        return result, False
