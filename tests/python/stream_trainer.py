"""A trainer process of the streaming tests: CachedIterableDataset over
helpers.GuardedStream(N, OFFSET, GUARD) (session $SHMCACHE_SESSION_ID)
under DataLoader(num_workers=2, multiprocessing_context=CONTEXT), two
passes. Between them it creates DIR/pass1.<OFFSET>.<pid> and waits for
DIR/go. Prints one JSON line per pass: the labels it got, in order, and
whether every image is the source's image for its label.

    stream_trainer.py N OFFSET GUARD DIR CONTEXT
"""

import json
import os
import sys
import time

import numpy as np
from torch.utils.data import DataLoader

from helpers import GuardedStream, sample
from shmcache.torch import CachedIterableDataset


def one_pass(loader):
    labels, same = [], True
    for row in loader:
        label = int(row["label"])
        labels.append(label)
        same &= np.array_equal(row["image"].numpy(), sample(label, 8)[0])
    return {"labels": labels, "images_match": bool(same)}


def main(n, offset, guard, where, context):
    ds = CachedIterableDataset(GuardedStream(n, offset, guard))
    loader = DataLoader(ds, batch_size=None, num_workers=2,
                        multiprocessing_context=context)
    print(json.dumps(one_pass(loader)), flush=True)
    open(os.path.join(where, f"pass1.{offset}.{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(where, "go")):
        if time.monotonic() > deadline:
            return 2
        time.sleep(0.01)
    print(json.dumps(one_pass(loader)), flush=True)
    return 0


if __name__ == "__main__":
    n, offset = int(sys.argv[1]), int(sys.argv[2])
    sys.exit(main(n, offset, sys.argv[3], sys.argv[4], sys.argv[5]))
