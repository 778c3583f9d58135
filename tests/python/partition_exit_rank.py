"""One rank of test_partitioned_exit.py's two-rank job: it ends its epoch
of a PartitionedLoader the way the case says (see the test's module).

    partition_exit_rank.py KIND CASE

KIND: what PartitionedLoader wraps, "dataloader" or "cachedloader" (one
miss worker either way). Rank 1 trains its whole epoch (exit status 5 when
a round fails: rank 0 gone first); with CASE "parked" it first waits until
rank 0 is gone (EOF on the pipe GONE_FD). With CASE "absent" rank 0 builds
its loader and then waits, alive, until rank 1 is gone (EOF on GONE_FD),
never iterating: rank 1's first round waits for a rank that never comes.

The job's timeout (init_process_group's) is $JOB_TIMEOUT_S, 60 s by default;
$EXCHANGE_TIMEOUT_S, when set, is the loader's exchange_timeout= (seconds).
"""

import os
import sys
import time

import numpy as np
from torch.utils.data import DataLoader, DistributedSampler

import shmcache
from shmcache.torch import CachedDataset, CachedLoader, PartitionedLoader
from shmcache.torch import _exit_threads

from rank_job import IndexDataset, join


class Rows(IndexDataset):
    def __getitem__(self, i):
        return np.full(4, i, dtype=np.float32), i


def rank1(loader, case):
    try:
        it = iter(loader)
        next(it)
        if case == "parked":
            os.read(int(os.environ["GONE_FD"]), 1)
        for _ in it:
            time.sleep(0.01)   # a step
    except RuntimeError as e:
        print("round failed:", e, flush=True)
        os._exit(5)
    loader.close()


def rank0(loader, case):
    if case == "absent":
        os.read(int(os.environ["GONE_FD"]), 1)
    elif case == "end":
        for _ in loader:
            pass
    elif case == "break":
        for _ in loader:
            break
    else:
        it = iter(loader)
        next(it)
        print("batch", flush=True)
        globals()["kept"] = it   # to the interpreter's end, as a script's own
        if case == "sigterm":
            time.sleep(600)
        if case == "raise":
            raise SystemExit(3)


def main():
    kind, case = sys.argv[1], sys.argv[2]
    if case == "parked":   # the bound, shorter: the test waits it out
        _exit_threads.EXIT_JOIN_S = 1.0
    join(float(os.environ.get("JOB_TIMEOUT_S", "60")))
    cds = CachedDataset(Rows(400, "exit-ways"),
                        shmcache.DatasetCache(session_id=int(os.environ["SESSION_ID"])),
                        async_puts=False)
    make = {"dataloader": DataLoader, "cachedloader": CachedLoader}[kind]
    given = os.environ.get("EXCHANGE_TIMEOUT_S")
    loader = PartitionedLoader(make(cds, batch_size=4, num_workers=1,
                                    sampler=DistributedSampler(cds, shuffle=False)),
                               window=1, local_world_size=1,
                               exchange_timeout=None if given is None else float(given))
    (rank1 if os.environ["RANK"] == "1" else rank0)(loader, case)
    print("leaves", flush=True)


if __name__ == "__main__":
    main()
