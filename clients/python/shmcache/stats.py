"""CacheStats: the counters DatasetCache.stats() returns.

Attributes read as `s.hits`; the object is also a read-only mapping of the
same names (`s["hits"]`, `dict(s)`, `s.as_dict()`, `s.get("mem_rows", 0)`),
as stats() returned a dict before.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["CacheStats"]

# Keys renamed, still read for one release: old -> new.
_OLD_KEYS = {"spilling": "spills_now"}


@dataclasses.dataclass(frozen=True, eq=False)
class CacheStats(Mapping[str, Any]):
    """Counters of one cache, summed over every process that uses it."""

    session_id: int
    cache_id: int
    name: str
    mem_rows: int          # rows held in shared memory
    mem_bytes: int         # their encoded bytes
    disk_rows: int         # rows spilled to disk
    disk_bytes: int        # their encoded bytes
    puts_full: int         # puts refused because the cache was full
    spill_reads: int       # spilled rows read back (listings only; 0 here)
    hits: int
    misses: int
    numa_hits: int         # hits served from the reader's own NUMA node
    reserved_bytes: int    # shared memory reserved for the cache
    budget_bytes: int      # its limit (the server cap when size was 0)
    avg_row_bytes: int     # mem_bytes / mem_rows
    full: bool             # no longer accepts rows
    spills_now: bool = False  # memory budget used up: new rows go to disk
    # CachedDataset.stats(): this process's queued puts (AsyncPutter.stats);
    # None (and not a key of the mapping) without async puts.
    async_puts: dict[str, int] | None = None

    @classmethod
    def from_dict(cls, counters: Mapping[str, Any]) -> CacheStats:
        """From the native module's dict of counters (unknown keys raise
        TypeError: the two are kept in step)."""
        return cls(**counters)

    def with_async_puts(self, async_puts: dict[str, int]) -> CacheStats:
        """A copy that also reports `async_puts`."""
        return dataclasses.replace(self, async_puts=async_puts)

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict (what stats() returned before)."""
        return dict(self)

    @property
    def spilling(self) -> bool:
        """spills_now, by its name in version 0.1 (read for one release more)."""
        warnings.warn("CacheStats.spilling is spills_now; the old name goes "
                      "in the next release", DeprecationWarning, stacklevel=2)
        return self.spills_now

    def __getitem__(self, key: str) -> Any:
        if key in self._keys():
            return getattr(self, key)
        if key in _OLD_KEYS:  # not listed by iteration
            warnings.warn(f"stats()[{key!r}] is stats()[{_OLD_KEYS[key]!r}]; the "
                          "old key goes in the next release", DeprecationWarning,
                          stacklevel=2)
            return getattr(self, _OLD_KEYS[key])
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in self._keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def _keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self)
                     if getattr(self, f.name) is not None)
