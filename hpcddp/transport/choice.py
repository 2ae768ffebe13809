"""The reductions of one communicator, by name, and the one each buffer takes.

The one in use (chosen by ``HPCDDP_REDUCE``, switched between steps by the autotuner),
except where another does better for the buffer at hand (``policy.for_buffer``). Each
reduction is made once on first use, kept, and freed with the others.
"""

from typing import Dict

import torch

from hpcddp.transport import policy
from hpcddp.transport.node_aware import NodeAwareAllreduce, NodeGroups
from hpcddp.transport.reductions import MPIAllreduce, Reduction, RingAllreduce

__all__ = ["REDUCTIONS", "Reductions", "make_reduction"]

REDUCTIONS = {cls.name: cls for cls in (MPIAllreduce, RingAllreduce, NodeAwareAllreduce)}


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
        """The reduction for ``tensor`` (``policy.for_buffer``)."""
        current = self.current
        name = policy.for_buffer(
            current.name, tensor.numel() * tensor.element_size(),
            current.slice_bytes, on_device, self.comm.size,
            tensor.dtype in (torch.float16, torch.bfloat16))
        return current if name == current.name else self._get(name)

    def free(self) -> None:
        """Free what the reductions hold (the node-aware allreduce's communicators)."""
        for reduction in self._made.values():
            reduction.free()
        self._made = {}
