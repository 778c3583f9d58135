"""Rows partitioned over the caches of several nodes (imported through
shmcache.torch): PartitionedLoader and the parts it is made of.

- ownership.py: RowOwners, which node's cache holds each row;
- exchange.py: RowExchange, one round of all_to_all_single that fetches
  rows from their owners and pushes computed rows to them;
- window_rows.py: PartitionedRows, a window's rows from wherever they are;
- feed.py: WindowFeed, the exchange thread of one pass, a BatchSource;
- loader.py: PartitionedLoader.
"""

from __future__ import annotations

from .loader import PartitionedLoader

__all__ = ["PartitionedLoader"]
