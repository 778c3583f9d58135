"""Where a CachedLoader's batches go: the device= / pin_memory= arguments
checked as DataLoader checks them (batch_device), and CudaStage, the copy
of each batch to a CUDA device on a side stream (data sinking).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from .._user_line import warn

__all__ = ["batch_device", "tree_map", "CudaStage"]


def batch_device(device: Any, pin_memory: Any) -> torch.device | None:
    """The torch.device batches go to (None: stay on the CPU); raises when
    the options need CUDA and there is none."""
    if not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory must be True or False, got {pin_memory!r}")
    dev = None if device is None else torch.device(device)
    if dev is not None and dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(dev)!r} is not supported: use 'cpu' or 'cuda'")
    if not torch.cuda.is_available():
        if pin_memory:
            # As DataLoader: batches in ordinary memory, and what the
            # installed torch's DataLoader warns (1.13: nothing).
            for message, category in _dataloader_pin_warnings():
                warn(message, category)
        if dev is not None and dev.type == "cuda":
            raise RuntimeError(f"CUDA is not available: device={str(dev)!r} cannot "
                               "receive batches; pass device=None or 'cpu'")
    return None if dev is None or dev.type == "cpu" else dev


@functools.lru_cache(maxsize=None)
def _dataloader_pin_warnings() -> tuple[tuple[str, type[Warning]], ...]:
    """The warnings the installed torch's DataLoader gives a pass with
    pin_memory=True where CUDA is not available (torch 1.13 gives none,
    later versions one), found once by starting such a pass. The pass
    draws its base seed from a generator of its own: from torch's global
    one it would move the trainer's seeded stream (shuffle, augmentation)
    off DataLoader's.

    warnings.catch_warnings, not quietly(): these are torch's warnings,
    which quietly() (the package's own warn()) does not reach, and Python
    before 3.14 (context-aware warnings) has no way to catch a warning of
    one thread only. The pass swaps the process's filters for a moment:
    a warning another thread raises in it is taken for DataLoader's."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iter(DataLoader(TensorDataset(torch.zeros(1)), pin_memory=True,
                        generator=torch.Generator()))
    return tuple((str(w.message), w.category) for w in caught)


def tree_map(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """`batch` with fn applied to each tensor in it (dicts, lists, tuples)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(tree_map(fn, v) for v in batch)
    return batch


class CudaStage:
    """Copies batches to a CUDA device on a side stream in the loader's
    threads; the consumer's stream waits for the copy (data sinking)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def stage(self, batch: Any) -> tuple[Any, Any]:
        with torch.cuda.stream(self.stream):
            gpu = tree_map(lambda t: t.to(self.device, non_blocking=True), batch)
            event = torch.cuda.Event()
            event.record(self.stream)
        return gpu, event

    def finish(self, staged: tuple[Any, Any]) -> Any:
        gpu, event = staged
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)

        def keep(t: Any) -> Any:
            t.record_stream(current)
            return t
        return tree_map(keep, gpu)
