"""Batch buffers reused once the training loop has let go of them.

A fresh 16 MiB array costs page faults and the kernel zeroing every page, which halved
the loader's read rate in measurements here. Buffers are handed out as tensors
(``torch.from_numpy`` keeps a reference to the array); once every tensor and view of a
batch is gone, only the pool refers to the array and it is filled again. A batch the
caller keeps is never overwritten: the pool allocates another buffer instead.

For batches bound for a GPU the pool allocates pinned memory (``hpcddp.transport.pinned``), and
the loader holds each batch until its asynchronous copy to the device has completed.
"""

import sys
import threading
from typing import Callable, Dict, List, Tuple

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """Arrays by (shape, dtype), reused when nothing outside the pool references them.

    Args:
        limit: arrays kept per shape and dtype; beyond it, arrays are not pooled.
        allocate: makes an array from ``(shape, dtype)``; ``hpcddp.transport.pinned.pinned_array``
            for page-locked memory.
    """

    def __init__(self, limit: int = 8, allocate: Callable[..., np.ndarray] = np.empty):
        self.limit = limit
        self._allocate = allocate
        self._arrays: Dict[Tuple[tuple, str], List[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.allocated = 0  # arrays created, for inspection

    def get(self, shape, dtype) -> np.ndarray:
        key = (tuple(shape), np.dtype(dtype).str)
        with self._lock:
            arrays = self._arrays.setdefault(key, [])
            for i in range(len(arrays)):
                # Two references: the list's and getrefcount's argument (CPython).
                if sys.getrefcount(arrays[i]) == 2:
                    return arrays[i]
            array = self._allocate(shape, dtype)
            self.allocated += 1
            if len(arrays) < self.limit:
                arrays.append(array)
            return array
