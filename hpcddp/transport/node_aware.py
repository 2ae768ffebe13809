"""A node-aware allreduce: within the node, across nodes, within the node again.

With several ranks on each node, a flat allreduce sends data between nodes from every
rank it pairs across them: a flat ring of ``p`` ranks on ``n`` nodes makes each node send
``2 (p - 1) / p`` of the buffer over its link, recursive doubling a whole buffer per rank.
Here the node's ranks first reduce-scatter the buffer among themselves (shared memory),
each rank then allreduces its ``1/k`` share with the ranks of the same local rank on the
other nodes, and an allgather inside the node gives every rank the whole result. Each
node sends ``2 (n - 1) / n`` of the buffer over its link, the least any allreduce can,
and every rank of the node carries a part of it.

Every stage is one of MPI's non-blocking collectives on a communicator of its own. A
reduction's buffers move through the stages in the order they were started, on every
rank: MPI matches collectives on a communicator by the order they are issued, so a later
buffer never enters a stage before an earlier one has.
"""

from typing import List, Optional

import numpy as np
import torch
from mpi4py import MPI

from hpcddp.comm.ops import mpi_op
from hpcddp.transport.ring import ring_bounds

__all__ = ["NodeLayout", "NodeAwareAllreduce", "node_layout"]


class NodeLayout:
    """How a communicator's ranks sit on nodes, as the node-aware allreduce needs it.

    Attributes:
        local: the ranks of this node (shared memory).
        cross: the ranks of the same local rank on every node.
        nodes: how many nodes; ranks_per_node: the local size on every node, or None
            when nodes hold different numbers of ranks.
    """

    def __init__(self, comm):
        self.local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        sizes = comm.allgather(self.local.size)
        self.cross = comm.Split(color=self.local.rank, key=comm.rank)
        self.nodes = len({r for r in comm.allgather(self.cross.rank if self.local.rank == 0
                                                     else None) if r is not None})
        self.ranks_per_node = sizes[0] if len(set(sizes)) == 1 else None

    def why_not(self) -> Optional[str]:
        """Why the node-aware allreduce cannot run on this layout, or None."""
        if self.ranks_per_node is None:
            return "the nodes hold different numbers of ranks"
        return None

    def free(self) -> None:
        for comm in (self.local, self.cross):
            if comm != MPI.COMM_NULL:
                comm.Free()


def node_layout(comm) -> NodeLayout:
    """The layout of ``comm``'s ranks on nodes. Collective."""
    return NodeLayout(comm)


def _empty(buf, count: int):
    if isinstance(buf, torch.Tensor):
        return torch.empty(count, dtype=buf.dtype, device=buf.device)
    return np.empty(count, dtype=buf.dtype)


class _Chain:
    """One buffer's three stages; a request (``Test``/``Wait``)."""

    def __init__(self, owner: "NodeAwareAllreduce", binding, op: str):
        self.owner = owner
        buf = binding.buf
        mop = mpi_op(op, binding.kind)
        local_size = owner.local_rs.size
        bounds = ring_bounds(len(buf), local_size)
        counts = [b - a for a, b in bounds]
        displs = [a for a, _ in bounds]
        share = _empty(buf, counts[owner.local_rs.rank])
        self.stages = [
            lambda: owner.local_rs.Ireduce_scatter(buf, share, recvcounts=counts, op=mop),
            lambda: owner.cross.Iallreduce(MPI.IN_PLACE, share, op=mop),
            lambda: owner.local_ag.Iallgatherv(share, [buf, (counts, displs)]),
        ]
        self.share = share  # kept alive until the last stage completes
        self.issued = 0
        self.request = None

    @property
    def finished(self) -> bool:
        return self.issued == len(self.stages) and self.request is None

    def advance(self, limit: int) -> None:
        """Issue the next stages whose predecessors have completed, up to stage ``limit``."""
        while True:
            if self.request is not None:
                if not self.request.Test():
                    return
                self.request = None
            if self.issued >= min(limit, len(self.stages)):
                return
            self.request = self.stages[self.issued]()
            self.issued += 1

    def Test(self) -> bool:  # noqa: N802 - the name of MPI's request method
        self.owner.advance()
        return self.finished

    def Wait(self) -> None:  # noqa: N802
        while not self.Test():
            pass


class NodeAwareAllreduce:
    """The node-aware allreduce on ``comm`` (see the module's description). Collective
    to construct.

    Raises:
        ValueError: the layout cannot carry it (``NodeLayout.why_not``).
    """

    name = "node"

    def __init__(self, comm, cuda=torch.cuda, layout: Optional[NodeLayout] = None):
        self.comm, self.cuda = comm, cuda
        layout = layout or node_layout(comm)
        why = layout.why_not()
        if why:
            raise ValueError(f"the node-aware allreduce cannot run here: {why}; "
                             f"use HPCDDP_REDUCE=mpi or ring")
        self.local_rs, self.cross = layout.local, layout.cross
        self.local_ag = layout.local.Dup()
        self._chains: List[_Chain] = []

    def advance(self) -> None:
        """Move every buffer in flight on, earlier buffers first: a buffer issues a stage
        only once every earlier buffer has issued it."""
        ceiling = 3
        for chain in self._chains:
            chain.advance(ceiling)
            ceiling = chain.issued
        self._chains = [c for c in self._chains if not c.finished]

    def free(self) -> None:
        """Free the communicators. Collective; nothing may be in flight."""
        for comm in (self.local_rs, self.cross, self.local_ag):
            comm.Free()

    def start(self, binding, op, slot=None):
        chain = _Chain(self, binding, op)
        self._chains.append(chain)
        self.advance()
        return chain
