"""Which reduction carries an allreduce on one communicator.

The one in use (chosen by ``HPCDDP_REDUCE``, switched between steps by the autotuner),
except where another does better for the buffer at hand: hpcddp's ring for 16-bit floats
in host memory, MPI's own ``Iallreduce`` for a buffer no larger than one of the node-aware
allreduce's slices. Each reduction is made once on first use, kept, and freed with the
others.
"""

from typing import Dict

import torch

from hpcddp.transport.node_aware import NodeAwareAllreduce, NodeGroups
from hpcddp.transport.reductions import REDUCTIONS, Reduction

__all__ = ["Reductions", "make_reduction"]


def make_reduction(name: str, comm, cuda) -> Reduction:
    """The reduction ``name`` on ``comm``. Collective. A group whose nodes hold different
    numbers of its ranks (a torch subgroup, a DDP process_group) cannot run the
    node-aware allreduce; it uses MPI's."""
    if name == "node":
        groups = NodeGroups(comm)
        if groups.why_not() is None:
            return NodeAwareAllreduce(comm, cuda, groups)
        groups.free()
        name = "mpi"
    return REDUCTIONS[name](comm, cuda)


class Reductions:
    """The reductions of one communicator, and the one in use.

    Args:
        comm: the communicator.
        cuda: the CUDA API.
        name: the reduction in use at first (``REDUCTIONS``).
    """

    def __init__(self, comm, cuda, name: str):
        self.comm, self.cuda = comm, cuda
        self._made: Dict[str, Reduction] = {}
        self.use(name)

    def _get(self, name: str) -> Reduction:
        if name not in self._made:
            self._made[name] = make_reduction(name, self.comm, self.cuda)
        return self._made[name]

    def use(self, name: str) -> None:
        """Carry out allreduces started from now on by ``name``; those already started
        finish as they were issued.

        .. warning:: Collective, at the same point on every rank: ranks reducing one
           buffer by different algorithms would wait for each other forever.
        """
        if name not in REDUCTIONS:
            raise ValueError(f"reduction={name!r}; use one of {sorted(REDUCTIONS)}")
        self.current = self._get(name)

    def for_tensor(self, tensor: torch.Tensor, on_device: bool) -> Reduction:
        """The ring for 16-bit floats in host memory; MPI's ``Iallreduce`` for a buffer
        the node-aware allreduce would not cut into slices; else the one in use.

        MPI reduces float16 and bfloat16 in software, element by element: MPICH takes
        68 ms to sum 12 MiB of float16 across 2 ranks, where 24 MiB of float32 take 9 ms.
        The ring sums them with torch's vectorized kernels. The node-aware allreduce's
        three stages cost more than they save on one slice: on 2 nodes x 2 ranks at
        1 Gbit/s, 1 MiB moved 0.35 of the link node-aware and 0.96 by MPI's.
        """
        current = self.current
        if current.name == "node" and \
                tensor.numel() * tensor.element_size() <= current.slice_bytes:
            return self._get("mpi")
        if (current.name == "ring" or on_device or self.comm.size == 1
                or tensor.dtype not in (torch.float16, torch.bfloat16)):
            return current
        return self._get("ring")

    def free(self) -> None:
        """Free what the reductions hold (the node-aware allreduce's communicators)."""
        for reduction in self._made.values():
            free = getattr(reduction, "free", None)
            if free is not None:
                free()
        self._made = {}
