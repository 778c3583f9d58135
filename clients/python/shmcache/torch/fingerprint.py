"""The cache a dataset gets: its name is a fingerprint of the dataset
(class, length, root/path resolved, the repr of its transforms), of its
contents (shmcache.torch.dataset_identity: its files' sizes and mtimes, or
a few samples) and of the format rows are stored in (shmcache.rows.
ROW_FORMAT), so that two pipelines, two datasets or two package versions
that store a sample differently never share a cache by accident, and a
trainer and `python3 -m shmcache.prefill` over the same dataset find the
same one.

    cache_for_dataset(ImageFolder(root, transform=decode), DatasetCache(S))

A dataset whose transform looks random (torchvision's Random*, ColorJitter,
*Augment*...) is refused unless allow_random=True: caching it would freeze
the first epoch's random choices.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from .. import DatasetCache, FingerprintMismatchError
from ..rows import ROW_FORMAT
from .dataset_identity import UnknownContents, content_identity

__all__ = ["dataset_fingerprint", "cache_for_dataset"]

_RANDOM_TRANSFORM = re.compile(
    r"\b(Random\w*|ColorJitter|\w*Augment\w*|AugMix|GaussianBlur|"
    r"ElasticTransform)\s*\(")


def dataset_fingerprint(dataset: Any) -> str:
    """A stable description of a dataset: its class, length, root/path and
    the repr of its transforms. Two datasets that differ in any of these get
    different caches. A root/path that names an existing file or directory
    counts as its resolved path (absolute, normalized, symlinks followed),
    so `images/`, `./images` and `/data/images` give one cache."""
    parts = [f"{type(dataset).__module__}.{type(dataset).__qualname__}"]
    try:
        parts.append(f"len={len(dataset)}")
    except TypeError:
        pass
    for attr in ("root", "path", "root_dir", "data_dir", "dataset_path", "files"):
        if hasattr(dataset, attr):
            parts.append(f"{attr}={_resolved(getattr(dataset, attr))!r}")
    for attr in ("transform", "target_transform", "transforms"):
        if getattr(dataset, attr, None) is not None:
            parts.append(f"{attr}={_stable_repr(getattr(dataset, attr))}")
    inner = getattr(dataset, "dataset", None)   # Subset and friends
    if isinstance(inner, Dataset) and inner is not dataset:
        parts.append("of=" + dataset_fingerprint(inner))
        if hasattr(dataset, "indices"):
            parts.append("indices=" + hashlib.sha1(
                np.asarray(dataset.indices, dtype=np.int64).tobytes()).hexdigest())
    return "|".join(parts)


def _resolved(value: Any) -> Any:
    """`value` with the paths in it that exist resolved: a str or PathLike
    naming an existing file or directory becomes its realpath; in a
    list/tuple of paths (thousands of files) each entry's directory is
    resolved, once per directory. Anything else is unchanged: a root that is
    only a label ("synthetic") must not depend on the working directory."""
    if type(value) in (list, tuple):
        dirs: dict[str, str | None] = {}
        return type(value)(_resolved_entry(v, dirs) for v in value)
    path = _as_str_path(value)
    if path is not None and os.path.exists(path):
        return os.path.realpath(path)
    return value


def _resolved_entry(value: Any, dirs: dict[str, str | None]) -> Any:
    """One path of a list, its directory resolved through `dirs` (a memo);
    a bare name (no directory) is left as it is."""
    path = _as_str_path(value)
    if path is None:
        return value
    head, tail = os.path.split(path)
    if head not in dirs:
        dirs[head] = os.path.realpath(head) if head and os.path.isdir(head) else None
    real = dirs[head]
    return value if real is None else os.path.join(real, tail)


def _as_str_path(value: Any) -> str | None:
    """The str path of a str or PathLike without NULs, else None."""
    if not isinstance(value, (str, os.PathLike)):
        return None
    path = os.fspath(value)
    return path if isinstance(path, str) and "\0" not in path else None


def _stable_repr(obj: object) -> str:
    """repr without the addresses of default reprs ("<function f at 0x..>"),
    which differ between processes: a trainer and a prefill process must
    compute the same fingerprint."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def cache_for_dataset(dataset: Any, cache: DatasetCache | None = None,
                      name: str | None = None,
                      allow_random: bool = False,
                      bypass_unknown: bool = False) -> DatasetCache:
    """The DatasetCache (not opened) that CachedDataset(dataset, cache, name)
    uses: cache's session and size (default DatasetCache(): the session of
    $SHMCACHE_SESSION_ID). A name given to cache's constructor
    (DatasetCache(name="mnist")) is taken as `name` (ValueError when `name`
    is another); a cache the package named for a dataset (another
    CachedDataset's .cache) brings only its session and size. Without
    `name`, the cache is named by the
    dataset's description (dataset_fingerprint) and its contents
    (shmcache.torch.dataset_identity: its files' sizes and mtimes, or a few
    samples), so two datasets that differ in either never share a cache;
    UnknownContents (a ValueError) when the contents cannot be told (pass
    name=), or, with `bypass_unknown` (CachedDataset's choice: training goes
    on), a cache that is bypassed, with one CacheWarning saying why. With
    `name`, nothing is read: the fingerprint checked at open is the
    description's. Both include ROW_FORMAT: rows that a package of another
    row format stored are another cache's (without `name`, another name;
    with it, a FingerprintMismatchError at open: open_dataset_cache)."""
    if cache is None:
        cache = DatasetCache()
    if not isinstance(cache, DatasetCache):
        raise TypeError(f"cache must be a shmcache.DatasetCache, got "
                        f"{type(cache).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError("name must be a str")
    if not isinstance(allow_random, bool):
        # allow_random="False" from a config file is truthy: it would turn
        # the guard off.
        raise TypeError(f"allow_random must be True or False, got {allow_random!r}")
    if cache.given_name is not None:
        if name is not None and name != cache.given_name:
            raise ValueError(
                f"two names for one cache: name={name!r} and the name of the "
                f"DatasetCache given, {cache.given_name!r}; pass one of them")
        name = cache.given_name
    desc = dataset_fingerprint(dataset)
    if not allow_random and _RANDOM_TRANSFORM.search(desc):
        raise ValueError(
            "the dataset applies a random transform; caching it would freeze "
            "the first epoch's random choices. Cache the deterministic part "
            "and pass the random transforms as transform=..., or pass "
            "allow_random=True")
    unknown = None
    if not name:
        try:
            desc += "|content=" + content_identity(dataset)
        except UnknownContents as e:
            if not bypass_unknown:
                raise
            # No name of it could be trusted not to alias another dataset's.
            unknown, desc = str(e), desc + "|content=unknown"
    desc += f"|rows={ROW_FORMAT}"
    fp = "fp-" + hashlib.sha256(desc.encode()).hexdigest()[:40]
    out = cache.named(name or fp, fp)
    if unknown is not None:
        out.bypass(unknown)
    return out


def open_dataset_cache(cache: DatasetCache) -> DatasetCache:
    """cache.open() of a cache_for_dataset cache (package-internal: what
    CachedDataset, CachedIterableDataset and prefill call). A name that
    holds rows of another fingerprint is refused with what a fingerprint
    covers and what to do."""
    try:
        return cache.open()
    except FingerprintMismatchError as e:
        raise FingerprintMismatchError(
            f"cache {cache.name!r} of session {cache.session_id} holds the rows of "
            f"another dataset (its class, length, root or transforms differ) or "
            f"rows that another shmcache version stored in another row format "
            f"(this one's is {ROW_FORMAT}; they must not be read as its own): "
            f"pass another name= (prefill: --cache_name), or destroy the session "
            f"to refill it "
            f"(`shmcache -d {cache.session_id}`). {e}") from None
