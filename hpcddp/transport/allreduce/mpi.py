"""The interface every allreduce algorithm has (``Reduction``), and MPI's own.

- ``MPIAllreduce``: MPI's own non-blocking ``Iallreduce`` on the buffer MPI was given.
- ``RingAllreduce`` (``ring.py``): hpcddp's ring of non-blocking point-to-point on the
  tensor behind it, combined by torch kernels: for MPIs whose device ``Iallreduce``
  crashes (Open MPI's libnbc) or whose host ``Iallreduce`` is slow.
- ``NodeAwareAllreduce`` (``node_aware.py``): inside the node, across nodes, inside the
  node again, for several ranks per node on a network slower than shared memory.

All return a request: something with ``Test()`` and ``Wait()``. ``policy.Reductions``
holds them all by name and makes each on first use.
"""

import torch
from mpi4py import MPI

from hpcddp.comm.ops import mpi_op

__all__ = ["MPIAllreduce", "Reduction"]

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
