"""shmcache: a shared-memory cache for training data, from Python.

    import shmcache
    cache = shmcache.DatasetCache()     # session: $SHMCACHE_SESSION_ID
    row = cache.get(i)                  # None on a miss
    if row is None:
        row = (image, label)            # numpy arrays, tensors or scalars
        cache.put(i, row)

A row is a tuple (or list) of columns, a dict of named columns, or a single
array. Hits come back in the same shape: a tuple, a dict, or an array.

The cache never breaks training: when the daemon disappears, the cache is
full, or the daemon answers an error, the first such event emits one
`CacheWarning` and later calls quietly return misses (`get` -> None) or
drop the row (`put` -> False). A row too large for what is left of the
cache is dropped alone (`put` -> False, one `CacheWarning` naming its size
and the budget); smaller rows go on being cached. Only wrong arguments
raise: TypeError for a wrong type, ValueError for a value out of range,
RuntimeError for a non-local host, and for a session that does not exist
(NotFoundError) or a cache name reused for a different pipeline
(FingerprintMismatchError): the package's errors are RuntimeError
subclasses, as MindSpore raises RuntimeError there.

`with DatasetCache(...) as cache:` closes the cache at the end of the block.

Zero-copy hits (copy=False, and CachedDataset's default in DataLoader
workers) are arrays over the cache's shared memory, read-only: a row never
changes once stored, and each array keeps the cache mapped, so it stays
valid for as long as it lives, after close() or the session's destruction
too (the C++ statement of a view's lifetime: shmcache/row.h). A row the
cache spilled to disk has no shared memory and always comes back as a
copy.

The package: _cache.py holds DatasetCache (with _checks.py, _degrade.py,
_user_line.py, _warned_flag.py and _read_into.py, its argument checks,
degradation rules, where its warnings point, the flag that says one once
over processes, and read_into targets); _client.py Client, the admin API (sessions, server info, stop);
rows.py the row model; stats.py CacheStats; async_put.py the background
writer of CachedDataset; shards.py shards and patches;
prefill.py `python3 -m shmcache.prefill` (cifar10.py its CIFAR-10 reader);
_shmcache the native module (_shmcache.cc, row_model.cc, dlpack_tensor.cc
over libshmcache). The PyTorch side is the shmcache.torch subpackage.
"""

from __future__ import annotations

from . import _shmcache
from ._cache import DatasetCache
from ._checks import SESSION_ENV, session_from_env
from ._client import Client
from ._degrade import CacheWarning
from ._shmcache import (AlreadyExistsError, Error, FingerprintMismatchError,
                        FullError, InvalidArgumentError, NotFoundError,
                        NotSupportedError, PermissionDeniedError, TooLargeError,
                        UnavailableError)
from .rows import LOCAL_HOSTS, MAX_ROW_ID
from .stats import CacheStats

# The library's and tools' version (include/shmcache/version.h, meson.build).
__version__: str = _shmcache.__version__

__all__ = [
    "DatasetCache", "CacheWarning", "CacheStats", "Client", "Error", "NotFoundError",
    "UnavailableError", "FullError", "FingerprintMismatchError",
    "InvalidArgumentError", "AlreadyExistsError", "PermissionDeniedError",
    "NotSupportedError", "TooLargeError", "LOCAL_HOSTS", "MAX_ROW_ID",
    "SESSION_ENV", "session_from_env",
]
