"""How an allreduce is carried out once its buffer is ready: one class per algorithm.

- ``MPIAllreduce``: MPI's own non-blocking ``Iallreduce`` on the buffer MPI was given.
- ``RingAllreduce``: hpcddp's ring of non-blocking point-to-point (``ring.py``) on the
  tensor behind it, combined by torch kernels: for MPIs whose device ``Iallreduce``
  crashes (Open MPI's libnbc) or whose host ``Iallreduce`` is slow.
- ``NodeAwareAllreduce`` (``node_aware.py``): inside the node, across nodes, inside the
  node again, for several ranks per node on a network slower than shared memory.

All return a request: something with ``Test()`` and ``Wait()``. ``choice.py`` holds them
all by name and makes each on first use.
"""

from typing import Dict

import torch
from mpi4py import MPI

from hpcddp.comm.ops import mpi_op
from hpcddp.transport.ring import Ring, ScratchPool

__all__ = ["MPIAllreduce", "Reduction", "RingAllreduce"]

_TAGS = 1 << 14  # the ring's tags: the top of the tag space, away from users' tags


class Reduction:
    """An allreduce algorithm on one communicator."""

    name = "reduction"
    slice_bytes = 0  # a buffer is reduced in slices of this size (0: whole)

    def __init__(self, comm, cuda=torch.cuda):
        self.comm, self.cuda = comm, cuda

    def start(self, binding, op: str, slot=None):
        """Start reducing ``binding`` (a ``routes.Binding``) in place; return a request."""
        raise NotImplementedError

    def free(self) -> None:
        """Free what it made for itself (communicators). Collective where it made any;
        nothing may be in flight."""


class MPIAllreduce(Reduction):
    """MPI's ``Iallreduce``."""

    name = "mpi"

    def start(self, binding, op, slot=None):
        return self.comm.Iallreduce(MPI.IN_PLACE, binding.buf, op=mpi_op(op, binding.kind))


class RingAllreduce(Reduction):
    """The ring: reduce-scatter then allgather over non-blocking point-to-point.

    Args:
        comm: the communicator; its point-to-point traffic at the top of the tag space is
            the ring's.
        cuda: the CUDA API.
        slice_bytes: each slice of a buffer runs a ring of its own.
    """

    name = "ring"

    def __init__(self, comm, cuda=torch.cuda, slice_bytes: int = 1 << 20):
        super().__init__(comm, cuda)
        self.slice_bytes = slice_bytes
        top = comm.Get_attr(MPI.TAG_UB) or 32767
        self._first_tag = max(0, top - _TAGS)
        self._next = 0
        self._pools: Dict[object, ScratchPool] = {}  # per dtype and device

    def _tag(self, count: int) -> int:
        # Every rank starts rings in the same order, so the same ring gets the same tags.
        if self._next + count > _TAGS:
            self._next = 0
        tag, self._next = self._first_tag + self._next, self._next + count
        return tag

    def _pool_for(self, data: torch.Tensor) -> ScratchPool:
        key = (data.dtype, data.device)
        pool = self._pools.get(key)
        if pool is None:
            chunk = Ring.chunk_elements(self.comm.size, self.slice_bytes, data.element_size())
            pool = self._pools[key] = ScratchPool(chunk, data.dtype, data.device)
        return pool

    def start(self, binding, op, slot=None):
        data = binding.memory.reshape(-1)
        tag = self._tag(Ring.slice_count(data.numel(), self.slice_bytes, data.element_size()))
        ring = Ring(self.comm, data, op, tag, self._pool_for(data), self.slice_bytes,
                    self.cuda)
        ring.Test()  # the first messages go out now
        return ring
