"""Page-locked host memory: the one allocator behind gradient staging and loader batches.

A copy between the GPU and pageable memory goes through a driver bounce buffer and
blocks the host; from page-locked ("pinned") memory ``cudaMemcpyAsync`` runs on a
stream and overlaps with compute. Pinning maps and locks every page, which costs far
more than the copy it enables, so hpcddp pins a buffer once and keeps it: the reducer
holds one ``HostBuffer`` per bucket that only grows, and the loader's ``BufferPool``
hands out pinned arrays again once their last copy to the device has completed.
"""

import numpy as np
import torch

__all__ = ["pinned_empty", "pinned_array", "HostBuffer"]


def pinned_empty(nbytes: int) -> torch.Tensor:
    """Allocate ``nbytes`` of page-locked host memory as a uint8 tensor.

    Raises:
        RuntimeError: CUDA is not available, so memory cannot be pinned.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("pinned host memory needs CUDA, which torch cannot find here; "
                           "staging and device batches apply to CUDA devices only")
    return torch.empty(int(nbytes), dtype=torch.uint8, pin_memory=True)


def pinned_array(shape, dtype) -> np.ndarray:
    """A NumPy array of ``shape`` and ``dtype`` over freshly pinned memory.

    The array keeps the pinned tensor alive through its ``base``.
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return pinned_empty(count * dtype.itemsize).numpy().view(dtype).reshape(shape)


class HostBuffer:
    """A host buffer that is allocated on first use and only ever grows.

    Args:
        pinned: page-lock the memory (for asynchronous copies to and from a GPU).

    Example::

        staging = HostBuffer(pinned=True)
        host = staging.get(bucket.numel(), bucket.dtype)   # no allocation after the first
        host.copy_(bucket, non_blocking=True)
    """

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self._storage = None
        self.allocations = 0  # times memory was (re)allocated, for inspection

    @property
    def capacity(self) -> int:
        """Bytes held now."""
        return 0 if self._storage is None else self._storage.numel()

    def get(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Return a 1-D tensor of ``numel`` elements of ``dtype`` over this buffer.

        The contents are whatever was there before. Growing drops the old memory, so a
        tensor returned earlier must not be in use by a pending copy when a larger one is
        asked for; the reducer asks for a bucket's size once per bucket layout.
        """
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = numel * itemsize
        if nbytes > self.capacity:
            # Lazily, because the bucket sizes are known only once the buckets are laid
            # out, and again after the rebuild that follows the first iteration.
            self._storage = (pinned_empty(nbytes) if self.pinned
                             else torch.empty(nbytes, dtype=torch.uint8))
            self.allocations += 1
        return self._storage[:nbytes].view(dtype)
